//! Unit tests of server-side apply and field ownership.

use super::*;
use proptest::prelude::*;
use serde_json::json;

/// `at(n)` is n seconds after 2027-01-15T08:00:00Z.
fn at(secs: i64) -> Time {
    Time::from_unix(1_800_000_000 + secs).unwrap()
}

/// A manifest for the agent `a1`, with `body` (spec, labels, …) merged in.
fn manifest(body: Value) -> Value {
    let mut manifest = json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "a1"}});
    merge(&mut manifest, &body);
    manifest
}

/// Who owns what, in entry order: `manager Operation[/subresource]: .a .b | …`.
fn owners(object: &Value) -> String {
    let entries: Vec<String> = load_owners(object)
        .iter()
        .map(|o| {
            let fields: Vec<String> = o.fields.iter().map(ToString::to_string).collect();
            let sub = o.entry.subresource.as_deref().map(|s| format!("/{s}")).unwrap_or_default();
            format!("{} {}{sub}: {}", o.entry.manager, o.entry.operation, fields.join(" "))
        })
        .collect();
    entries.join(" | ")
}

fn without_managed_fields(object: &Value) -> Value {
    let mut object = object.clone();
    object["metadata"].as_object_mut().unwrap().shift_remove("managedFields");
    object
}

/// RFC 7386 merge patch, as `kubectl edit`, `label` and `patch --type merge` send.
fn merge_patch(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.shift_remove(&k);
                } else {
                    merge_patch(t.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p,
    }
}

/// One object and a clock, written to as the server would: applies and updates.
struct World {
    object: Option<Value>,
    clock: i64,
}

impl World {
    fn new() -> World {
        World { object: None, clock: 0 }
    }

    fn object(&self) -> &Value {
        self.object.as_ref().expect("the object exists")
    }

    /// Applies `body` as `manager`; a conflict comes back as the Status message.
    fn apply(&mut self, manager: &str, body: Value) -> Result<(), String> {
        self.apply_with(manager, body, false)
    }

    fn force(&mut self, manager: &str, body: Value) {
        self.apply_with(manager, body, true).expect("force never conflicts");
    }

    fn apply_with(&mut self, manager: &str, body: Value, force: bool) -> Result<(), String> {
        self.clock += 1;
        let result = apply(self.object.as_ref(), &manifest(body), manager, force, at(self.clock));
        self.object = Some(result.map_err(|c| conflict_message(&c))?);
        Ok(())
    }

    /// A merge patch by `manager`, recorded as an `Update`.
    fn update(&mut self, manager: &str, subresource: Option<&str>, patch: Value) {
        self.clock += 1;
        let old = self.object.clone();
        let mut new = old.clone().unwrap_or_else(|| manifest(json!({})));
        merge_patch(&mut new, patch);
        record_update(old.as_ref(), &mut new, manager, subresource, at(self.clock));
        self.object = Some(new);
    }

    /// The object (without managed fields) is `manifest(body)`, owned as `owned`.
    #[track_caller]
    fn check(&self, body: Value, owned: &str) {
        assert_eq!(without_managed_fields(self.object()), manifest(body));
        assert_eq!(owners(self.object()), owned);
    }
}

#[test]
fn apply_creates_the_object() {
    let applied = manifest(json!({
        "metadata": {"labels": {"app": "web"}, "uid": "ignored", "resourceVersion": "7"},
        "spec": {"wanted": "Up", "resources": {"cpuQuota": "200%"}, "tools": ["git", "nix"]},
        "status": {"observedGeneration": 9},
    }));
    let created = apply(None, &applied, "kubectl", false, at(0)).unwrap();
    let expected = json!({
        "apiVersion": "hive.dev/v1",
        "kind": "Agent",
        "metadata": {
            "name": "a1",
            "labels": {"app": "web"},
            "managedFields": [{
                "manager": "kubectl",
                "operation": "Apply",
                "apiVersion": "hive.dev/v1",
                "time": "2027-01-15T08:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {"f:resources": {"f:cpuQuota": {}}, "f:tools": {}, "f:wanted": {}},
                },
            }],
        },
        "spec": {"wanted": "Up", "resources": {"cpuQuota": "200%"}, "tools": ["git", "nix"]},
    });
    assert_eq!(created, expected);
}

#[test]
fn reapplying_the_same_manifest_changes_nothing() {
    let mut w = World::new();
    let body = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"wanted": "Up"}});
    w.apply("kubectl", body.clone()).unwrap();
    let first = w.object().clone();
    w.apply("kubectl", body).unwrap();
    assert_eq!(w.object(), &first, "identical, managedFields time included");

    w.apply("kubectl", json!({"metadata": {"labels": {"app": "web"}}, "spec": {"wanted": "Offline"}}))
        .unwrap();
    assert_eq!(w.object()["metadata"]["managedFields"][0]["time"], json!("2027-01-15T08:00:03Z"));
}

#[test]
fn fields_dropped_from_the_manifest_are_removed() {
    let mut w = World::new();
    w.apply(
        "kubectl",
        json!({
            "metadata": {"labels": {"app": "web", "tier": "gold"}},
            "spec": {"wanted": "Up", "resources": {"cpuQuota": "200%", "memoryMax": "4G"}},
        }),
    )
    .unwrap();
    w.apply(
        "kubectl",
        json!({"metadata": {"labels": {"tier": "gold"}}, "spec": {"wanted": "Up", "resources": {"cpuQuota": "200%"}}}),
    )
    .unwrap();
    w.check(
        json!({"metadata": {"labels": {"tier": "gold"}}, "spec": {"wanted": "Up", "resources": {"cpuQuota": "200%"}}}),
        "kubectl Apply: .metadata.labels.tier .spec.resources.cpuQuota .spec.wanted",
    );
    // Maps left empty go too, but never `metadata` or `spec` themselves.
    w.apply("kubectl", json!({"spec": {"wanted": "Up"}})).unwrap();
    w.check(json!({"spec": {"wanted": "Up"}}), "kubectl Apply: .spec.wanted");
    w.apply("kubectl", json!({"spec": {"wanted": null}})).unwrap();
    w.check(json!({"spec": {}}), "");
}

#[test]
fn equal_values_are_shared_and_kept_while_anyone_owns_them() {
    let mut w = World::new();
    w.apply("alice", json!({"spec": {"wanted": "Up"}})).unwrap();
    w.apply("bob", json!({"spec": {"wanted": "Up", "rev": "abc"}})).unwrap();
    w.check(
        json!({"spec": {"wanted": "Up", "rev": "abc"}}),
        "alice Apply: .spec.wanted | bob Apply: .spec.rev .spec.wanted",
    );
    w.apply("alice", json!({})).unwrap();
    w.check(json!({"spec": {"wanted": "Up", "rev": "abc"}}), "bob Apply: .spec.rev .spec.wanted");
    w.apply("bob", json!({"spec": {"rev": "abc"}})).unwrap();
    w.check(json!({"spec": {"rev": "abc"}}), "bob Apply: .spec.rev");
}

#[test]
fn a_different_value_conflicts_with_another_applier_until_forced() {
    let mut w = World::new();
    w.apply("hive-controller", json!({"spec": {"wanted": "Up", "rev": "abc"}})).unwrap();
    let before = w.object().clone();
    let err = w.apply("kubectl", json!({"spec": {"wanted": "Offline"}})).unwrap_err();
    assert_eq!(err, r#"Apply failed with 1 conflict: conflict with "hive-controller": .spec.wanted"#);
    assert_eq!(w.object(), &before, "a conflict changes nothing");

    w.force("kubectl", json!({"spec": {"wanted": "Offline"}}));
    w.check(
        json!({"spec": {"wanted": "Offline", "rev": "abc"}}),
        "hive-controller Apply: .spec.rev | kubectl Apply: .spec.wanted",
    );
    // The previous owner now conflicts in turn.
    let err = w.apply("hive-controller", json!({"spec": {"wanted": "Up", "rev": "abc"}})).unwrap_err();
    assert_eq!(err, r#"Apply failed with 1 conflict: conflict with "kubectl": .spec.wanted"#);
}

#[test]
fn fields_changed_by_an_update_conflict_with_a_later_apply() {
    let mut w = World::new();
    w.apply("kubectl", json!({"spec": {"wanted": "Up", "resources": {"cpuQuota": "200%"}}})).unwrap();
    w.update("kubectl-edit", None, json!({"spec": {"wanted": "Offline"}}));
    w.check(
        json!({"spec": {"wanted": "Offline", "resources": {"cpuQuota": "200%"}}}),
        "kubectl Apply: .spec.resources.cpuQuota | kubectl-edit Update: .spec.wanted",
    );
    let body = json!({"spec": {"wanted": "Up", "resources": {"cpuQuota": "200%"}}});
    let err = w.apply("kubectl", body.clone()).unwrap_err();
    assert_eq!(
        err,
        r#"Apply failed with 1 conflict: conflict with "kubectl-edit" using hive.dev/v1: .spec.wanted"#
    );
    // Agreeing with the edit shares the field; forcing takes it.
    w.apply("kubectl", json!({"spec": {"wanted": "Offline", "resources": {"cpuQuota": "200%"}}})).unwrap();
    assert_eq!(
        owners(w.object()),
        "kubectl Apply: .spec.resources.cpuQuota .spec.wanted | kubectl-edit Update: .spec.wanted"
    );
    w.force("kubectl", body);
    w.check(
        json!({"spec": {"wanted": "Up", "resources": {"cpuQuota": "200%"}}}),
        "kubectl Apply: .spec.resources.cpuQuota .spec.wanted",
    );
}

#[test]
fn a_manager_never_conflicts_with_its_own_updates() {
    let mut w = World::new();
    w.update("hive", None, json!({"spec": {"wanted": "Up"}}));
    w.apply("hive", json!({"spec": {"wanted": "Offline"}})).unwrap();
    w.check(json!({"spec": {"wanted": "Offline"}}), "hive Apply: .spec.wanted");
}

#[test]
fn several_conflicts_are_listed_per_manager() {
    let mut w = World::new();
    w.apply("alice", json!({"spec": {"x": 1, "y": 1}})).unwrap();
    w.update("kubectl-edit", None, json!({"spec": {"z": 1}}));
    let err = w.apply("bob", json!({"spec": {"x": 2, "y": 2, "z": 2}})).unwrap_err();
    let expected = [
        "Apply failed with 3 conflicts: conflicts with \"alice\":",
        "- .spec.x",
        "- .spec.y",
        "conflicts with \"kubectl-edit\" using hive.dev/v1:",
        "- .spec.z",
    ];
    assert_eq!(err, expected.join("\n"));
}

#[test]
fn apply_never_touches_status() {
    let mut w = World::new();
    w.apply("kubectl", json!({"spec": {"wanted": "Up"}})).unwrap();
    w.update("hive-controller", Some("status"), json!({"status": {"observedGeneration": 1}}));
    w.apply("kubectl", json!({"spec": {"wanted": "Offline"}, "status": {"observedGeneration": 5}})).unwrap();
    w.apply("kubectl", json!({"spec": {"rev": "abc"}})).unwrap();
    w.check(
        json!({"spec": {"rev": "abc"}, "status": {"observedGeneration": 1}}),
        "kubectl Apply: .spec.rev | hive-controller Update/status: .status.observedGeneration",
    );
}

/// Applying a leaf over fields another manager owns, where the shapes differ: each
/// row is (the other manager's manifest, this manager's manifest, the conflicts).
#[test]
fn conflicts_between_nested_fields() {
    let table = [
        (json!({"x": 1}), json!({"x": 1}), ""),
        (json!({"x": 1}), json!({"x": 2}), ".spec.x"),
        (json!({"x": 5}), json!({"x": {"y": 1}}), ".spec.x"),
        (json!({"x": {}}), json!({"x": {"y": 1}}), ""),
        (json!({"x": {"y": 1}}), json!({"x": {}}), ""),
        (json!({"x": {"y": 1}}), json!({"x": {"z": 1}}), ""),
        (json!({"x": {"y": 1, "z": 1}}), json!({"x": 3}), ".spec.x.y .spec.x.z"),
        (json!({"x": [1, 2]}), json!({"x": [1, 2]}), ""),
        (json!({"x": [1, 2]}), json!({"x": [2, 1]}), ".spec.x"),
        (json!({"x": [{"name": "a"}]}), json!({"x": [{"name": "a", "v": 1}]}), ".spec.x"),
        (json!({"x": null, "y": 1}), json!({"x": 1, "y": 2}), ".spec.y"),
    ];
    for (theirs, ours, expected) in table {
        let live = apply(None, &manifest(json!({"spec": theirs})), "other", false, at(0)).unwrap();
        let conflicts = match apply(Some(&live), &manifest(json!({"spec": ours})), "me", false, at(1)) {
            Ok(_) => Vec::new(),
            Err(conflicts) => conflicts.into_iter().map(|c| c.field).collect(),
        };
        assert_eq!(conflicts.join(" "), expected, "theirs {theirs}, ours {ours}");
    }
}

#[test]
fn update_owns_what_it_changed() {
    let mut w = World::new();
    // Create (POST): everything in the body is owned by the creator.
    w.update(
        "kubectl-create",
        None,
        json!({"metadata": {"labels": {"app": "web"}}, "spec": {"wanted": "Up"}}),
    );
    assert_eq!(owners(w.object()), "kubectl-create Update: .metadata.labels.app .spec.wanted");
    // A write that changes nothing leaves managedFields alone, times included; what a
    // client sends as managedFields is ignored when it does not decode (no FieldsV1).
    let before = w.object().clone();
    let mut same = before.clone();
    same["metadata"]["managedFields"] = json!([{"manager": "forged", "operation": "Apply"}]);
    record_update(Some(&before), &mut same, "kubectl-replace", None, at(99));
    assert_eq!(same, before);
    // Entries that decode are taken as written, as kubectl's migration from client-side
    // to server-side apply writes them; the status subresource never takes them.
    let mut migrated = before.clone();
    let written = json!([{"manager": "kubectl", "operation": "Apply", "apiVersion": "hive.dev/v1",
        "time": "2027-01-15T08:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:wanted": {}}}}]);
    migrated["metadata"]["managedFields"] = written.clone();
    let mut on_status = migrated.clone();
    record_update(Some(&before), &mut migrated, "kubectl", None, at(99));
    assert_eq!(owners(&migrated), "kubectl Apply: .metadata.labels.app .spec.wanted");
    record_update(Some(&before), &mut on_status, "kubectl", Some("status"), at(99));
    assert_eq!(owners(&on_status), "kubectl-create Update: .metadata.labels.app .spec.wanted");
    // Changed and removed fields move; new ones are added; the rest stay.
    w.update("kubectl-label", None, json!({"metadata": {"labels": {"app": "db", "tier": "gold"}}}));
    w.update("kubectl-edit", None, json!({"spec": {"wanted": null, "rev": "abc"}}));
    assert_eq!(
        owners(w.object()),
        "kubectl-label Update: .metadata.labels.app .metadata.labels.tier | kubectl-edit Update: .spec.rev"
    );
    assert_eq!(w.object()["metadata"]["managedFields"][1]["time"], json!("2027-01-15T08:00:03Z"));
}

#[test]
fn conflict_causes_name_the_fields() {
    let conflicts = [Conflict {
        manager: "kubectl-edit".into(),
        operation: Operation::Update,
        api_version: "hive.dev/v1".into(),
        field: ".spec.wanted".into(),
    }];
    let causes = serde_json::to_value(conflict_causes(&conflicts)).unwrap();
    let expected = json!([{
        "reason": "FieldManagerConflict",
        "message": "conflict with \"kubectl-edit\" using hive.dev/v1",
        "field": ".spec.wanted",
    }]);
    assert_eq!(causes, expected);
}

/// Each row is an object and the `FieldsV1` of its fields; both directions hold.
#[test]
fn fields_v1_round_trip() {
    let table = [
        (json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "a1"}}), json!({})),
        (
            json!({"metadata": {"name": "a1", "uid": "u", "generation": 2, "labels": {"hive.dev/tier": "gold"}}}),
            json!({"f:metadata": {"f:labels": {"f:hive.dev/tier": {}}}}),
        ),
        (
            json!({"spec": {"wanted": "Up", "resources": {"cpuQuota": "1", "memoryMax": "2G"}, "tools": ["a"]}}),
            json!({"f:spec": {"f:resources": {"f:cpuQuota": {}, "f:memoryMax": {}}, "f:tools": {}, "f:wanted": {}}}),
        ),
        (json!({"spec": {"empty": {}, "none": null}}), json!({"f:spec": {"f:empty": {}, "f:none": {}}})),
    ];
    for (object, fields_v1) in table {
        let set = FieldSet::of_object(&object);
        assert_eq!(set.to_fields_v1(), fields_v1, "{object}");
        assert_eq!(FieldSet::from_fields_v1(&fields_v1).unwrap(), set, "{fields_v1}");
    }
    // A map owned as a leaf and as a parent of other leaves is marked with ".".
    let set: FieldSet =
        [FieldPath::new(["spec", "res"]), FieldPath::new(["spec", "res", "cpu"])].into_iter().collect();
    let fields_v1 = json!({"f:spec": {"f:res": {".": {}, "f:cpu": {}}}});
    assert_eq!(set.to_fields_v1(), fields_v1);
    assert_eq!(FieldSet::from_fields_v1(&fields_v1).unwrap(), set);
}

#[test]
fn fields_v1_errors() {
    let table = [
        (json!({"f:spec": {"f:x": 1}}), r#"fieldsV1 node at ".spec.x" is not an object"#),
        (
            json!({"f:spec": {"k:{\"name\":\"a\"}": {}}}),
            r#"fieldsV1 element "k:{\"name\":\"a\"}" at ".spec" is not supported"#,
        ),
    ];
    for (fields_v1, message) in table {
        assert_eq!(FieldSet::from_fields_v1(&fields_v1).unwrap_err().to_string(), message);
    }
}

/// Small JSON maps: a few keys, scalars, lists and nested maps.
fn json_map() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (0..4i64).prop_map(Value::from),
        "[a-c]{0,2}".prop_map(Value::from),
        proptest::collection::vec((0..3i64).prop_map(Value::from), 0..3).prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        proptest::collection::btree_map("[a-d]", inner, 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    })
    .prop_map(|v| if v.is_object() { v } else { json!({"v": v}) })
}

/// JSON maps like [`json_map`]'s, with keys in the order they were made (unsorted).
fn unsorted_map() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        (0..4i64).prop_map(Value::from),
        Just(json!({})),
        Just(json!([1, {"a": 2}])),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        proptest::collection::vec(("[a-e]|uid|name|kind|managedFields", inner), 0..5)
            .prop_map(|entries| Value::Object(entries.into_iter().collect()))
    })
    .prop_map(|v| if v.is_object() { v } else { json!({"v": v}) })
}

proptest! {
    /// A create's ownership in one walk is exactly the set of its leaves as a trie, keys
    /// sorted (compared as text: map equality ignores order).
    #[test]
    fn a_creates_fields_v1_in_one_walk_is_its_leaves_as_a_trie(
        metadata in unsorted_map(),
        spec in unsorted_map(),
        top in unsorted_map(),
    ) {
        let mut object = top;
        let map = object.as_object_mut().unwrap();
        map.insert("metadata".into(), metadata);
        map.insert("spec".into(), spec);
        map.insert("apiVersion".into(), json!("hive.dev/v1"));
        let set = FieldSet::of_object(&object);
        let expected = (!set.is_empty()).then(|| set.to_fields_v1().to_string());
        prop_assert_eq!(FieldSet::fields_v1_of_object(&object).map(|v| v.to_string()), expected);
    }

    #[test]
    fn field_sets_survive_fields_v1(spec in json_map()) {
        let set = FieldSet::of_object(&json!({"spec": spec}));
        prop_assert_eq!(FieldSet::from_fields_v1(&set.to_fields_v1()).unwrap(), set);
    }

    #[test]
    fn apply_sets_every_field_and_is_idempotent(first in json_map(), second in json_map()) {
        let created = apply(None, &manifest(json!({"spec": first})), "a", false, at(0)).unwrap();
        let applied = manifest(json!({"spec": second}));
        let merged = apply(Some(&created), &applied, "a", false, at(1)).unwrap();
        let config = applied_config(&applied);
        for path in FieldSet::of_object(&config).iter() {
            prop_assert_eq!(path.get(&merged), path.get(&config), "{}", path);
        }
        let again = apply(Some(&merged), &applied, "a", false, at(2)).unwrap();
        prop_assert_eq!(again, merged);
    }
}

#[test]
fn an_entry_moved_into_json_reads_as_the_entry_serialized_whole() {
    let full = ManagedFieldsEntry {
        manager: "kubectl".into(),
        operation: "Update".into(),
        api_version: Some("hive.dev/v1".into()),
        time: Some(at(7)),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(json!({"f:spec": {"f:config": {"f:rev": {}}}, "f:metadata": {}})),
        subresource: Some("status".into()),
    };
    let sparse = ManagedFieldsEntry { manager: "m".into(), ..Default::default() };
    let no_subresource = ManagedFieldsEntry { subresource: None, ..full.clone() };
    let no_fields = ManagedFieldsEntry { fields_v1: None, ..full.clone() };
    for entry in [full, sparse, no_subresource, no_fields] {
        let whole = serde_json::to_string(&entry).unwrap();
        // Key order matters: it is the stored JSON's.
        assert_eq!(serde_json::to_string(&entry_value(entry)).unwrap(), whole);
    }
}
