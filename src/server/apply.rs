//! Server-side apply and field ownership: which field manager owns which fields of an
//! object (`metadata.managedFields`), merging an applied configuration into the live
//! object, conflicts between managers, and the ownership that plain writes (POST, PUT,
//! merge and JSON patches) take. Pure functions over whole objects as JSON; no IO.
//!
//! This is Kubernetes server-side apply, simplified where hive does not need the rest:
//!
//! - Maps merge key by key, recursively. **Every list is atomic**: a leaf owned, compared
//!   and replaced whole. hive's lists (permissions, job nodes, finalizers, conditions) each
//!   have one writer, and atomic lists keep `FieldsV1` to `f:` and `.` elements (no `k:`,
//!   `v:` or `i:` keys).
//! - A field set holds leaves: scalars, lists, `null`s and empty maps. A non-empty map is
//!   owned through its leaves; a map that is a leaf of one manager and the parent of
//!   another manager's leaves is written `".": {}` in `FieldsV1`, as upstream does.
//! - A manager is identified by (name, operation, subresource). Entries of the same name
//!   never conflict with each other; a changed value simply moves ownership.
//! - `apiVersion`, `kind`, `status` and server-owned metadata (`name`, `uid`,
//!   `resourceVersion`, …) are never part of an applied configuration.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Bound;

use hive_api::meta::{ManagedFieldsEntry, StatusCause, API_VERSION};
use hive_api::Time;
use serde_json::{Map, Value};

/// Metadata the server owns: never in a field set, never taken from an applied
/// configuration.
const SERVER_OWNED_METADATA: [&str; 8] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "managedFields",
];

/// How a manager wrote its fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    /// Server-side apply (`PATCH` with `application/apply-patch+yaml`).
    Apply,
    /// Any other write: create, replace, merge or JSON patch.
    Update,
}

impl Operation {
    /// The `managedFields[].operation` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

// ---------------------------------------------------------------------------------------
// Field paths and sets
// ---------------------------------------------------------------------------------------

/// The path to one field, as map keys from the object's root: `["spec", "wanted"]`.
/// Displays in kubectl's dotted form, `.spec.wanted`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldPath(Vec<String>);

impl FieldPath {
    /// A path from its map keys.
    pub fn new<S: Into<String>>(segments: impl IntoIterator<Item = S>) -> FieldPath {
        FieldPath(segments.into_iter().map(Into::into).collect())
    }

    /// The map keys from the root.
    pub fn segments(&self) -> &[String] {
        &self.0
    }

    /// The value at this path, if every step is a map holding the next key.
    pub fn get<'a>(&self, object: &'a Value) -> Option<&'a Value> {
        self.0.iter().try_fold(object, |v, key| v.as_object()?.get(key))
    }

    /// The strict ancestors, from the shortest (`.spec`) to the parent.
    fn ancestors(&self) -> impl Iterator<Item = FieldPath> + '_ {
        (1..self.0.len()).map(|n| FieldPath(self.0[..n].to_vec()))
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|key| write!(f, ".{key}"))
    }
}

/// A set of fields of one object, as a manager owns them: leaf paths (see the module
/// docs for what a leaf is), convertible to and from the Kubernetes `FieldsV1` trie
/// (`{"f:spec":{"f:wanted":{}}}`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet(BTreeSet<FieldPath>);

/// Why a `FieldsV1` document could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldsV1Error {
    /// A trie node is not a JSON object.
    #[error("fieldsV1 node at {path:?} is not an object")]
    NotAnObject {
        /// Dotted path of the node (empty for the root).
        path: String,
    },
    /// A key other than `f:<name>` or `.`; hive lists are atomic, so `k:`, `v:` and `i:`
    /// elements never occur.
    #[error("fieldsV1 element {element:?} at {path:?} is not supported")]
    UnsupportedElement {
        /// Dotted path of the node holding the key.
        path: String,
        /// The key.
        element: String,
    },
}

impl FieldSet {
    /// The empty set.
    pub fn new() -> FieldSet {
        FieldSet::default()
    }

    /// Every leaf of `object`, leaving out `apiVersion`, `kind` and server-owned metadata.
    pub fn of_object(object: &Value) -> FieldSet {
        fn walk(value: &Value, path: &mut Vec<String>, out: &mut BTreeSet<FieldPath>) {
            match value {
                Value::Object(map) if !map.is_empty() || path.is_empty() => {
                    for (key, child) in map {
                        let excluded = match path.as_slice() {
                            [] => key == "apiVersion" || key == "kind",
                            [m] => m == "metadata" && SERVER_OWNED_METADATA.contains(&key.as_str()),
                            _ => false,
                        };
                        if !excluded {
                            path.push(key.clone());
                            walk(child, path, out);
                            path.pop();
                        }
                    }
                }
                _ if path.is_empty() => {}
                _ => {
                    out.insert(FieldPath(path.clone()));
                }
            }
        }
        let mut out = BTreeSet::new();
        walk(object, &mut Vec::new(), &mut out);
        FieldSet(out)
    }

    /// Reads a `FieldsV1` trie.
    pub fn from_fields_v1(fields: &Value) -> Result<FieldSet, FieldsV1Error> {
        fn walk(
            node: &Value,
            path: &mut Vec<String>,
            out: &mut BTreeSet<FieldPath>,
        ) -> Result<(), FieldsV1Error> {
            let here = |path: &[String]| FieldPath(path.to_vec());
            let Some(map) = node.as_object() else {
                return Err(FieldsV1Error::NotAnObject { path: here(path).to_string() });
            };
            if map.is_empty() && !path.is_empty() {
                out.insert(here(path));
            }
            for (key, child) in map {
                if key == "." {
                    if !path.is_empty() {
                        out.insert(here(path));
                    }
                } else if let Some(name) = key.strip_prefix("f:") {
                    path.push(name.to_string());
                    walk(child, path, out)?;
                    path.pop();
                } else {
                    let path = here(path).to_string();
                    return Err(FieldsV1Error::UnsupportedElement { path, element: key.clone() });
                }
            }
            Ok(())
        }
        let mut out = BTreeSet::new();
        walk(fields, &mut Vec::new(), &mut out)?;
        Ok(FieldSet(out))
    }

    /// Writes the set as a `FieldsV1` trie, keys sorted.
    pub fn to_fields_v1(&self) -> Value {
        #[derive(Default)]
        struct Node<'a> {
            member: bool,
            children: BTreeMap<&'a str, Node<'a>>,
        }
        fn render(node: &Node<'_>) -> Value {
            let mut map = Map::new();
            if node.member && !node.children.is_empty() {
                map.insert(".".to_string(), Value::Object(Map::new()));
            }
            for (key, child) in &node.children {
                map.insert(format!("f:{key}"), render(child));
            }
            Value::Object(map)
        }
        let mut root = Node::default();
        for path in &self.0 {
            let node = path.0.iter().fold(&mut root, |node, key| node.children.entry(key).or_default());
            node.member = true;
        }
        render(&root)
    }

    /// Whether the set holds exactly this path.
    pub fn contains(&self, path: &FieldPath) -> bool {
        self.0.contains(path)
    }

    /// Adds a path; returns whether it was new.
    pub fn insert(&mut self, path: FieldPath) -> bool {
        self.0.insert(path)
    }

    /// Removes a path; returns whether it was there.
    pub fn remove(&mut self, path: &FieldPath) -> bool {
        self.0.remove(path)
    }

    /// The paths, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &FieldPath> {
        self.0.iter()
    }

    /// How many paths the set holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when the set holds no path.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The paths strictly below `path`. Sorted order keeps them together, right after it.
    fn descendants<'a>(&'a self, path: &'a FieldPath) -> impl Iterator<Item = &'a FieldPath> + 'a {
        self.0.range((Bound::Excluded(path), Bound::Unbounded)).take_while(move |p| p.0.starts_with(&path.0))
    }

    /// Whether the set holds `path` or anything below it.
    fn covers(&self, path: &FieldPath) -> bool {
        self.contains(path) || self.descendants(path).next().is_some()
    }

    /// Drops the paths that no longer exist in `object`: nobody owns a missing field.
    fn retain_present(&mut self, object: &Value) {
        self.0.retain(|p| p.get(object).is_some());
    }
}

impl FromIterator<FieldPath> for FieldSet {
    fn from_iter<I: IntoIterator<Item = FieldPath>>(iter: I) -> FieldSet {
        FieldSet(iter.into_iter().collect())
    }
}

// ---------------------------------------------------------------------------------------
// Managed fields
// ---------------------------------------------------------------------------------------

/// One `managedFields` entry with its fields parsed, and the fields as loaded, so a write
/// can tell whether ownership changed.
struct Owner {
    entry: ManagedFieldsEntry,
    fields: FieldSet,
    loaded: Option<FieldSet>,
}

impl Owner {
    fn is(&self, manager: &str, operation: Operation, subresource: Option<&str>) -> bool {
        self.entry.manager == manager
            && self.entry.operation == operation.as_str()
            && self.entry.subresource.as_deref().filter(|s| !s.is_empty()) == subresource
    }

    fn operation(&self) -> Operation {
        if self.entry.operation == "Apply" {
            Operation::Apply
        } else {
            Operation::Update
        }
    }
}

/// The owners recorded in `object`, each pruned to the fields that exist. Entries that do
/// not parse own nothing (the server writes them all, so this does not happen).
fn load_owners(object: &Value) -> Vec<Owner> {
    let Some(Value::Array(entries)) = object.pointer("/metadata/managedFields") else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|e| serde_json::from_value::<ManagedFieldsEntry>(e.clone()).ok())
        .map(|entry| {
            let mut fields =
                entry.fields_v1.as_ref().and_then(|f| FieldSet::from_fields_v1(f).ok()).unwrap_or_default();
            fields.retain_present(object);
            Owner { loaded: Some(fields.clone()), entry, fields }
        })
        .collect()
}

/// The index of the entry for (manager, operation, subresource), added if missing.
fn owner_index(
    owners: &mut Vec<Owner>,
    object: &Value,
    manager: &str,
    operation: Operation,
    subresource: Option<&str>,
) -> usize {
    if let Some(i) = owners.iter().position(|o| o.is(manager, operation, subresource)) {
        return i;
    }
    let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or(API_VERSION);
    owners.push(Owner {
        entry: ManagedFieldsEntry {
            manager: manager.to_string(),
            operation: operation.as_str().to_string(),
            api_version: Some(api_version.to_string()),
            subresource: subresource.map(str::to_string),
            ..ManagedFieldsEntry::default()
        },
        fields: FieldSet::new(),
        loaded: None,
    });
    owners.len() - 1
}

/// Writes the owners into `metadata.managedFields`, dropping those left owning nothing.
fn store_owners(object: &mut Value, owners: Vec<Owner>) {
    let entries: Vec<Value> = owners
        .into_iter()
        .filter(|o| !o.fields.is_empty())
        .map(|mut o| {
            o.entry.fields_type = Some("FieldsV1".to_string());
            o.entry.fields_v1 = Some(o.fields.to_fields_v1());
            serde_json::to_value(o.entry).expect("a managed fields entry serializes")
        })
        .collect();
    let Some(root) = object.as_object_mut() else { return };
    let metadata = root.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    let Some(metadata) = metadata.as_object_mut() else { return };
    if entries.is_empty() {
        metadata.shift_remove("managedFields");
    } else {
        metadata.insert("managedFields".to_string(), Value::Array(entries));
    }
}

/// Equal apart from `metadata.managedFields`.
fn same_content(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.shift_remove("managedFields");
        }
        v
    };
    strip(a) == strip(b)
}

// ---------------------------------------------------------------------------------------
// Apply
// ---------------------------------------------------------------------------------------

/// A field another manager owns with a different value than the one applied.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Conflict {
    /// The other manager's name.
    pub manager: String,
    /// How the other manager wrote the field.
    pub operation: Operation,
    /// The API version the other manager wrote with.
    pub api_version: String,
    /// The contested field in kubectl's dotted form, e.g. `.spec.wanted`.
    pub field: String,
}

impl Conflict {
    /// The manager as the apiserver names it in conflict messages: `"hive-controller"`
    /// for an applier, `"kubectl-edit" using hive.dev/v1` for an updater.
    pub fn manager_description(&self) -> String {
        match self.operation {
            Operation::Apply => format!("{:?}", self.manager),
            Operation::Update => format!("{:?} using {}", self.manager, self.api_version),
        }
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conflict with {}: {}", self.manager_description(), self.field)
    }
}

/// The `Status.message` of a 409 apply conflict, worded as the apiserver does so kubectl
/// prints it (and its `--force-conflicts` advice) well:
/// `Apply failed with 1 conflict: conflict with "hive-controller": .spec.wanted`, or for
/// several, one `conflicts with <manager>:` line per manager followed by `- <field>` lines.
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [only] = conflicts {
        return format!("Apply failed with 1 conflict: {only}");
    }
    let mut sorted: Vec<&Conflict> = conflicts.iter().collect();
    sorted.sort();
    let mut lines = Vec::new();
    let mut current = None;
    for c in sorted {
        let who = c.manager_description();
        if current.as_ref() != Some(&who) {
            lines.push(format!("conflicts with {who}:"));
            current = Some(who);
        }
        lines.push(format!("- {}", c.field));
    }
    format!("Apply failed with {} conflicts: {}", conflicts.len(), lines.join("\n"))
}

/// The `Status.details.causes` of a 409 apply conflict: one `FieldManagerConflict` per
/// conflict, naming the field.
pub fn conflict_causes(conflicts: &[Conflict]) -> Vec<StatusCause> {
    conflicts
        .iter()
        .map(|c| StatusCause {
            reason: "FieldManagerConflict".to_string(),
            message: format!("conflict with {}", c.manager_description()),
            field: c.field.clone(),
        })
        .collect()
}

/// Server-side apply of `applied` (a whole manifest) by `manager` to `live` (absent:
/// the object is created from the manifest). Returns the merged object, with
/// `metadata.managedFields` updated, or every conflict when `force` is false.
///
/// - The manifest's fields are set on the object; maps merge, lists are replaced.
/// - A field this manager listed in its previous apply and lists no longer is removed
///   from the object, unless another manager owns it (or something below it).
/// - A field owned by another manager with a different value is a conflict; with
///   `force`, ownership moves to this manager instead. Equal values are shared.
/// - `status`, `apiVersion`, `kind` and server-owned metadata of the manifest are
///   ignored; the live object's are kept. A `null` means "not listed".
/// - When nothing changes — neither the object nor anyone's fields — the result equals
///   `live` exactly, timestamps included, so the server can skip the write and report the
///   object unchanged. Otherwise this manager's entry gets the time `now`.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    now: Time,
) -> Result<Value, Vec<Conflict>> {
    let config = applied_config(applied);
    let config_set = FieldSet::of_object(&config);
    let mut merged = live.cloned().unwrap_or_else(|| skeleton(applied));
    let mut owners = live.map(load_owners).unwrap_or_default();
    let mine = owner_index(&mut owners, &merged, manager, Operation::Apply, None);
    let previous = std::mem::take(&mut owners[mine].fields);

    // Ownership contested by this apply: conflicts, or with `force` (or between entries
    // of the same manager) a transfer.
    let mut contested = Vec::new();
    let mut conflicts = BTreeSet::new();
    for (i, owner) in owners.iter().enumerate().filter(|(i, _)| *i != mine) {
        for path in config_set.iter() {
            for field in contested_fields(&owner.fields, path, &merged, &config) {
                if owner.entry.manager != manager {
                    conflicts.insert(Conflict {
                        manager: owner.entry.manager.clone(),
                        operation: owner.operation(),
                        api_version: owner
                            .entry
                            .api_version
                            .clone()
                            .unwrap_or_else(|| API_VERSION.to_string()),
                        field: field.to_string(),
                    });
                }
                contested.push((i, field));
            }
        }
    }
    if !force && !conflicts.is_empty() {
        return Err(conflicts.into_iter().collect());
    }
    for (i, field) in contested {
        owners[i].fields.remove(&field);
    }

    // Fields this manager gave up, unless someone else still owns them or the manifest
    // still has fields below them.
    for field in previous.iter().filter(|f| !config_set.covers(f)) {
        if owners.iter().enumerate().any(|(i, o)| i != mine && o.fields.covers(field)) {
            continue;
        }
        let owned_leaf =
            |p: &FieldPath| config_set.contains(p) || owners.iter().any(|o| o.fields.contains(p));
        remove_field(&mut merged, field, owned_leaf);
    }

    merge(&mut merged, &config);
    owners[mine].fields = config_set;
    for owner in &mut owners {
        owner.fields.retain_present(&merged);
    }

    if let Some(live) = live {
        if same_content(live, &merged)
            && owners.iter().all(|o| o.loaded.as_ref().unwrap_or(&FieldSet::new()) == &o.fields)
        {
            return Ok(live.clone());
        }
    }
    owners[mine].entry.time = Some(now);
    store_owners(&mut merged, owners);
    Ok(merged)
}

/// The fields of `owner` that applying `config`'s leaf at `path` to `live` would change:
/// the leaf itself when its value differs, an owned ancestor that is not a map (the
/// manifest turns it into one), or owned fields below `path` that a non-map value would
/// replace.
fn contested_fields(owner: &FieldSet, path: &FieldPath, live: &Value, config: &Value) -> Vec<FieldPath> {
    let wanted = path.get(config);
    let is_map = |v: Option<&Value>| v.is_some_and(Value::is_object);
    let mut out = Vec::new();
    if owner.contains(path) {
        let current = path.get(live);
        if current != wanted && !(is_map(current) && is_map(wanted)) {
            out.push(path.clone());
        }
    }
    out.extend(path.ancestors().filter(|a| owner.contains(a) && !is_map(a.get(live))));
    if !is_map(wanted) {
        out.extend(owner.descendants(path).cloned());
    }
    out
}

/// The manifest as it is applied: without `apiVersion`, `kind`, `status`, server-owned
/// metadata, and `null`s (a map left empty by removing them goes too).
fn applied_config(applied: &Value) -> Value {
    fn strip_nulls(map: &mut Map<String, Value>) {
        map.retain(|_, v| match v {
            Value::Null => false,
            Value::Object(m) if !m.is_empty() => {
                strip_nulls(m);
                !m.is_empty()
            }
            _ => true,
        });
    }
    let mut config = applied.as_object().cloned().unwrap_or_default();
    for key in ["apiVersion", "kind", "status"] {
        config.shift_remove(key);
    }
    if let Some(Value::Object(metadata)) = config.get_mut("metadata") {
        for key in SERVER_OWNED_METADATA {
            metadata.shift_remove(key);
        }
        if metadata.is_empty() {
            config.shift_remove("metadata");
        }
    }
    strip_nulls(&mut config);
    Value::Object(config)
}

/// The object an apply creates before the manifest is merged in: type and name only.
fn skeleton(applied: &Value) -> Value {
    let mut object = Map::new();
    for key in ["apiVersion", "kind"] {
        if let Some(v) = applied.get(key) {
            object.insert(key.to_string(), v.clone());
        }
    }
    let mut metadata = Map::new();
    if let Some(name) = applied.pointer("/metadata/name") {
        metadata.insert("name".to_string(), name.clone());
    }
    object.insert("metadata".to_string(), Value::Object(metadata));
    Value::Object(object)
}

/// Sets every field of `config` on `target`: maps merge recursively, anything else
/// (lists included) replaces.
fn merge(target: &mut Value, config: &Value) {
    match (target, config) {
        (Value::Object(target), Value::Object(config)) => {
            for (key, value) in config {
                match target.get_mut(key) {
                    Some(existing) if existing.is_object() && value.is_object() => merge(existing, value),
                    _ => {
                        target.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (target, config) => *target = config.clone(),
    }
}

/// Removes the field at `path`, then the maps it leaves empty — unless `owned_leaf` says
/// someone owns such a map as a leaf. Top-level fields (`spec`, `metadata`) stay.
fn remove_field(object: &mut Value, path: &FieldPath, owned_leaf: impl Fn(&FieldPath) -> bool) {
    fn parent_map<'a>(object: &'a mut Value, keys: &[String]) -> Option<&'a mut Map<String, Value>> {
        keys.iter().try_fold(object, |v, key| v.as_object_mut()?.get_mut(key))?.as_object_mut()
    }
    let keys = path.segments();
    let Some((last, parent)) = keys.split_last() else { return };
    if let Some(map) = parent_map(object, parent) {
        map.shift_remove(last);
    }
    for depth in (2..keys.len()).rev() {
        let ancestor = FieldPath(keys[..depth].to_vec());
        let emptied = ancestor.get(object).and_then(Value::as_object).is_some_and(Map::is_empty);
        if !emptied || owned_leaf(&ancestor) {
            break;
        }
        if let Some(map) = parent_map(object, &keys[..depth - 1]) {
            map.shift_remove(&keys[depth - 1]);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Updates
// ---------------------------------------------------------------------------------------

/// Records the ownership a non-apply write takes: every leaf that differs between `old`
/// (absent on create) and `new` becomes owned by (`manager`, `Update`, `subresource`)
/// and is taken from every other entry, so that a later apply by someone else conflicts
/// on it. Fields the write removed or turned into something else are owned by nobody.
/// `new`'s `metadata.managedFields` is replaced (what a client sends there is ignored);
/// a write that changes nothing leaves the entries, times included, as they were.
/// The server passes a default manager name (e.g. `unknown`) when the request has none.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    now: Time,
) {
    let none = Value::Null;
    let before = old.unwrap_or(&none);
    let after_set = FieldSet::of_object(new);
    let changed: FieldSet = after_set.iter().filter(|p| p.get(before) != p.get(new)).cloned().collect();
    let disowned: Vec<FieldPath> = FieldSet::of_object(before)
        .iter()
        .filter(|p| !after_set.contains(p) && p.get(before) != p.get(new))
        .cloned()
        .collect();

    let mut owners = old.map(load_owners).unwrap_or_default();
    for owner in &mut owners {
        for field in changed.iter().chain(&disowned) {
            owner.fields.remove(field);
        }
        owner.fields.retain_present(new);
    }
    if !changed.is_empty() {
        let i = owner_index(&mut owners, new, manager, Operation::Update, subresource);
        owners[i].fields.0.extend(changed.0);
        owners[i].entry.time = Some(now);
    }
    store_owners(new, owners);
}

#[cfg(test)]
mod tests {
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
        w.apply("kubectl", json!({"spec": {"wanted": "Offline", "resources": {"cpuQuota": "200%"}}}))
            .unwrap();
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
        w.apply("kubectl", json!({"spec": {"wanted": "Offline"}, "status": {"observedGeneration": 5}}))
            .unwrap();
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
        // client sends as managedFields is ignored.
        let before = w.object().clone();
        let mut same = before.clone();
        same["metadata"]["managedFields"] = json!([{"manager": "forged", "operation": "Apply"}]);
        record_update(Some(&before), &mut same, "kubectl-replace", None, at(99));
        assert_eq!(same, before);
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

    proptest! {
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
}
