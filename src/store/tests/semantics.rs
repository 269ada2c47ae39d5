//! One test per write rule: create, update, status, delete with finalizers, the
//! preconditions, unchanged writes, dry runs and atomic groups.

use serde_json::{json, Value};

use super::super::{Error, EventType, Mutation, Outcome, Store, Subresource};
use super::{agent, config, create, delete, owned, rv, update, update_status, TestClock};

fn store(clock: &TestClock) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), clock)).unwrap();
    (dir, store)
}

#[tokio::test]
async fn create_sets_server_fields_and_clears_client_ones() {
    let clock = TestClock::new();
    let (_dir, store) = store(&clock);
    let mut object = agent("a1", "Up");
    object["metadata"]["namespace"] = json!("default");
    object["metadata"]["deletionTimestamp"] = json!("2020-01-01T00:00:00Z");
    object["metadata"]["uid"] = json!("client-uid");
    object["metadata"]["labels"] = json!({"app": "x"});

    let outcome = store.commit(create(object), false).await.unwrap();
    let Outcome::Created(created) = &outcome else { panic!("{outcome:?}") };
    let meta = &created.value()["metadata"];
    assert_eq!(meta["resourceVersion"], "1");
    assert_eq!(meta["generation"], 1);
    assert_eq!(meta["creationTimestamp"], "2026-01-01T00:00:00Z");
    assert!(uuid::Uuid::parse_str(meta["uid"].as_str().unwrap()).is_ok());
    assert_ne!(meta["uid"], "client-uid");
    assert!(meta.get("namespace").is_none() && meta.get("deletionTimestamp").is_none());
    assert_eq!(meta["labels"], json!({"app": "x"}));
    assert_eq!(store.revision(), 1);
    assert_eq!(store.get("agents", "a1").as_ref(), Some(created));
    assert_eq!(store.list("agents"), (1, vec![created.clone()]));
}

#[tokio::test]
async fn create_of_an_existing_name_is_already_exists() {
    let (_dir, store) = store(&TestClock::new());
    store.commit(create(agent("a1", "Up")), false).await.unwrap();
    let err = store.commit(create(agent("a1", "Offline")), false).await.unwrap_err();
    assert!(matches!(&err, Error::AlreadyExists { kind, name } if kind == "agents" && name == "a1"));
    assert_eq!(err.to_string(), r#"agents.hive.dev "a1" already exists"#);
    assert_eq!(store.revision(), 1);
}

#[tokio::test]
async fn object_without_a_name_is_invalid() {
    let (_dir, store) = store(&TestClock::new());
    let err = store.commit(create(json!({"spec": {}})), false).await.unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
    let err = store.commit(create(json!("text")), false).await.unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
    assert_eq!(store.revision(), 0);
}

#[tokio::test]
async fn update_keeps_server_fields_and_status_and_bumps_generation_on_spec_only() {
    let clock = TestClock::new();
    let (_dir, store) = store(&clock);
    let created = owned(&store.commit(create(agent("a1", "Up")), false).await.unwrap());
    let mut with_status = created.clone();
    with_status["status"] = json!({"power": "Up"});
    store.commit(update_status(with_status), false).await.unwrap();
    clock.advance(std::time::Duration::from_secs(30));

    // A label change: new revision, same generation.
    let mut labelled = created.clone();
    labelled["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    labelled["metadata"]["labels"] = json!({"tier": "gold"});
    labelled["metadata"]["uid"] = Value::Null;
    labelled["metadata"]["creationTimestamp"] = json!("1999-01-01T00:00:00Z");
    labelled["metadata"]["generation"] = json!(42);
    labelled["status"] = json!({"power": "Offline"});
    let Outcome::Updated(after_label) = store.commit(update(labelled), false).await.unwrap() else {
        panic!()
    };
    assert_eq!(rv(&after_label), 3);
    assert_eq!(after_label.value()["metadata"]["generation"], 1);
    assert_eq!(after_label.value()["metadata"]["labels"], json!({"tier": "gold"}));
    assert_eq!(after_label.value()["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(
        after_label.value()["metadata"]["creationTimestamp"],
        created["metadata"]["creationTimestamp"]
    );
    assert_eq!(
        after_label.value()["status"],
        json!({"power": "Up"}),
        "status is written through Status only"
    );

    // A spec change: generation + 1, and labels the writer left out are gone.
    let mut respec = after_label.value();
    respec["spec"]["wanted"] = json!("Offline");
    respec["metadata"].as_object_mut().unwrap().remove("labels");
    let Outcome::Updated(after_spec) = store.commit(update(respec), false).await.unwrap() else { panic!() };
    assert_eq!(rv(&after_spec), 4);
    assert_eq!(after_spec.value()["metadata"]["generation"], 2);
    assert!(after_spec.value()["metadata"].get("labels").is_none());
    assert_eq!(after_spec.value()["spec"], json!({"wanted": "Offline"}));
}

#[tokio::test]
async fn update_that_changes_nothing_is_unchanged_without_revision_or_event() {
    let (_dir, store) = store(&TestClock::new());
    let created = store.commit(create(agent("a1", "Up")), false).await.unwrap().into_object();
    let mut watch = store.watch("agents", 1).unwrap();
    let outcome = store.commit(update(created.value()), false).await.unwrap();
    assert_eq!(outcome, Outcome::Unchanged(created.clone()));
    // Also without a resourceVersion, and for a status write of the same status.
    let mut no_rv = created.value();
    no_rv["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    assert!(matches!(store.commit(update(no_rv), false).await.unwrap(), Outcome::Unchanged(_)));
    assert!(matches!(
        store.commit(update_status(created.value()), false).await.unwrap(),
        Outcome::Unchanged(_)
    ));
    assert_eq!(store.revision(), 1);
    // The next event the watch sees is the next real write.
    store.commit(create(agent("a2", "Up")), false).await.unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap().revision, 2);
}

#[tokio::test]
async fn stale_resource_version_is_a_conflict_with_the_kubernetes_message() {
    let (_dir, store) = store(&TestClock::new());
    let v1 = owned(&store.commit(create(agent("a1", "Up")), false).await.unwrap());
    let mut v2 = v1.clone();
    v2["spec"]["wanted"] = json!("Offline");
    store.commit(update(v2), false).await.unwrap();

    let mut stale = v1.clone();
    stale["spec"]["wanted"] = json!("Up again");
    for m in [update(stale.clone()), update_status(stale)] {
        let err = store.commit(m, false).await.unwrap_err();
        assert!(matches!(&err, Error::Conflict { kind, name, .. } if kind == "agents" && name == "a1"));
        assert_eq!(
            err.to_string(),
            "Operation cannot be fulfilled on agents.hive.dev \"a1\": the object has been modified; \
             please apply your changes to the latest version and try again"
        );
    }
    let mut wrong_uid = v1.clone();
    wrong_uid["metadata"]["uid"] = json!("0000");
    wrong_uid["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    let err = store.commit(update(wrong_uid), false).await.unwrap_err();
    assert!(err.to_string().contains("Precondition failed: UID in precondition: 0000"), "{err}");
    assert_eq!(store.revision(), 2);
}

#[tokio::test]
async fn update_or_delete_of_a_missing_object_is_not_found() {
    let (_dir, store) = store(&TestClock::new());
    for m in [update(agent("nope", "Up")), update_status(agent("nope", "Up")), delete("nope")] {
        let err = store.commit(m, false).await.unwrap_err();
        assert!(matches!(&err, Error::NotFound { kind, name } if kind == "agents" && name == "nope"));
        assert_eq!(err.to_string(), r#"agents.hive.dev "nope" not found"#);
    }
}

#[tokio::test]
async fn status_update_takes_only_status_and_keeps_generation() {
    let (_dir, store) = store(&TestClock::new());
    let created = owned(&store.commit(create(agent("a1", "Up")), false).await.unwrap());
    let mut incoming = created.clone();
    incoming["spec"]["wanted"] = json!("Offline");
    incoming["metadata"]["labels"] = json!({"ignored": "yes"});
    incoming["status"] = json!({"observedGeneration": 1, "power": "Up"});
    let Outcome::Updated(updated) = store.commit(update_status(incoming), false).await.unwrap() else {
        panic!()
    };
    assert_eq!(rv(&updated), 2);
    assert_eq!(updated.value()["status"], json!({"observedGeneration": 1, "power": "Up"}));
    assert_eq!(updated.value()["spec"], created["spec"]);
    assert_eq!(updated.value()["metadata"]["generation"], 1);
    assert!(updated.value()["metadata"].get("labels").is_none());
}

#[tokio::test]
async fn delete_without_finalizers_removes_with_a_new_revision() {
    let (_dir, store) = store(&TestClock::new());
    store.commit(create(agent("a1", "Up")), false).await.unwrap();
    let mut watch = store.watch("agents", 1).unwrap();
    let Outcome::Deleted(last) = store.commit(delete("a1"), false).await.unwrap() else { panic!() };
    assert_eq!(rv(&last), 2);
    assert_eq!(last.value()["spec"], json!({"wanted": "Up"}));
    assert!(store.get("agents", "a1").is_none());
    let event = watch.next().await.unwrap().unwrap();
    assert_eq!((event.revision, event.type_, event.object), (2, EventType::Deleted, last));
}

#[tokio::test]
async fn delete_with_finalizers_marks_once_and_the_last_finalizer_removes() {
    let clock = TestClock::new();
    let (_dir, store) = store(&clock);
    let mut object = agent("a1", "Up");
    object["metadata"]["finalizers"] = json!(["hive.dev/runtime"]);
    store.commit(create(object), false).await.unwrap();
    let mut watch = store.watch("agents", 1).unwrap();
    clock.advance(std::time::Duration::from_secs(5));

    let Outcome::Deleting(marked) = store.commit(delete("a1"), false).await.unwrap() else { panic!() };
    assert_eq!(rv(&marked), 2);
    assert_eq!(marked.value()["metadata"]["deletionTimestamp"], "2026-01-01T00:00:05Z");
    let event = watch.next().await.unwrap().unwrap();
    assert_eq!((event.revision, event.type_), (2, EventType::Modified));

    // Deleting again changes nothing, not even the timestamp.
    clock.advance(std::time::Duration::from_secs(5));
    let again = store.commit(delete("a1"), false).await.unwrap();
    assert_eq!(again, Outcome::Deleting(marked.clone()));
    assert_eq!(store.revision(), 2);

    // An update cannot clear deletionTimestamp; dropping the last finalizer deletes.
    let mut keep = marked.value();
    keep["metadata"].as_object_mut().unwrap().remove("deletionTimestamp");
    keep["spec"]["wanted"] = json!("Offline");
    let Outcome::Updated(kept) = store.commit(update(keep), false).await.unwrap() else { panic!() };
    assert_eq!(kept.value()["metadata"]["deletionTimestamp"], "2026-01-01T00:00:05Z");
    let mut done = kept.value();
    done["metadata"]["finalizers"] = json!([]);
    let Outcome::Deleted(last) = store.commit(update(done), false).await.unwrap() else { panic!() };
    assert_eq!(rv(&last), 4);
    assert!(store.get("agents", "a1").is_none());
    assert_eq!(watch.next().await.unwrap().unwrap().type_, EventType::Modified);
    let event = watch.next().await.unwrap().unwrap();
    assert_eq!((event.revision, event.type_), (4, EventType::Deleted));
}

#[tokio::test]
async fn delete_preconditions_are_checked() {
    let (_dir, store) = store(&TestClock::new());
    let created = store.commit(create(agent("a1", "Up")), false).await.unwrap().into_object();
    let uid = created.value()["metadata"]["uid"].as_str().unwrap().to_owned();
    let with = |uid: Option<&str>, rv: Option<&str>| Mutation::Delete {
        kind: "agents",
        name: "a1".into(),
        uid: uid.map(Into::into),
        resource_version: rv.map(Into::into),
    };
    let err = store.commit(with(Some("other"), None), false).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "Operation cannot be fulfilled on agents.hive.dev \"a1\": Precondition failed: \
             UID in precondition: other, UID in object meta: {uid}"
        )
    );
    let err = store.commit(with(Some(&uid), Some("7")), false).await.unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    assert!(store.get("agents", "a1").is_some());
    let ok = store.commit(with(Some(&uid), Some("1")), false).await.unwrap();
    assert!(matches!(ok, Outcome::Deleted(_)));
}

#[tokio::test]
async fn dry_run_computes_the_outcome_and_changes_nothing() {
    let (dir, store) = store(&TestClock::new());
    let mut watch = store.watch("agents", 0).unwrap();
    let Outcome::Created(would) = store.commit(create(agent("a1", "Up")), true).await.unwrap() else {
        panic!()
    };
    assert_eq!(rv(&would), 1);
    assert_eq!(store.revision(), 0);
    assert!(store.get("agents", "a1").is_none());

    let created = owned(&store.commit(create(agent("a1", "Up")), false).await.unwrap());
    let err = store.commit(create(agent("a1", "Up")), true).await.unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }));
    let mut respec = created.clone();
    respec["spec"]["wanted"] = json!("Offline");
    let Outcome::Updated(would) = store.commit(update(respec), true).await.unwrap() else { panic!() };
    assert_eq!((rv(&would), would.value()["metadata"]["generation"].as_i64()), (2, Some(2)));
    let mut stale = created.clone();
    stale["metadata"]["resourceVersion"] = json!("9");
    assert!(matches!(store.commit(update(stale), true).await, Err(Error::Conflict { .. })));
    assert!(matches!(store.commit(delete("a1"), true).await.unwrap(), Outcome::Deleted(_)));

    assert_eq!(store.revision(), 1);
    assert_eq!(store.get("agents", "a1").unwrap().value(), created);
    assert_eq!(watch.next().await.unwrap().unwrap().revision, 1);
    store.shutdown().await;
    assert!(watch.next().await.is_none(), "no event from any dry run");
    let reopened = Store::open(config(dir.path(), &TestClock::new())).unwrap();
    assert_eq!(reopened.revision(), 1);
    assert_eq!(reopened.get("agents", "a1").unwrap().value(), created);
}

#[tokio::test]
async fn commit_all_is_atomic_and_each_mutation_sees_the_previous_ones() {
    let (_dir, store) = store(&TestClock::new());
    let mut respec = agent("a1", "Offline");
    respec["metadata"]["resourceVersion"] = json!("1");
    let outcomes = store
        .commit_all(vec![create(agent("a1", "Up")), update(respec), create(agent("a2", "Up"))], false)
        .await
        .unwrap();
    let revisions: Vec<u64> = outcomes.iter().map(|o| rv(o.object())).collect();
    assert_eq!(revisions, [1, 2, 3]);
    assert_eq!(store.get("agents", "a1").unwrap().value()["metadata"]["generation"], 2);

    // One failure anywhere: nothing of the group is written.
    let err = store
        .commit_all(vec![create(agent("a3", "Up")), create(agent("a1", "Up"))], false)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }));
    assert!(store.get("agents", "a3").is_none());
    assert_eq!(store.revision(), 3);
    assert!(store.commit_all(vec![], false).await.unwrap().is_empty());
}

#[tokio::test]
async fn kinds_are_separate() {
    let (_dir, store) = store(&TestClock::new());
    store.commit(create(agent("x", "Up")), false).await.unwrap();
    let job = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "x"}, "spec": {}});
    store.commit(Mutation::Create { kind: "jobs", object: job }, false).await.unwrap();
    assert_eq!(store.list("agents").1.len(), 1);
    assert_eq!(store.list("jobs").1[0].value()["kind"], "Job");
    assert_eq!(store.list("approvals"), (2, vec![]));
    let err = store
        .commit(
            Mutation::Update { kind: "jobs", object: agent("y", "Up"), subresource: Subresource::Main },
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), r#"jobs.hive.dev "y" not found"#);
}
