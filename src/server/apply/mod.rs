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

use std::collections::BTreeSet;
use std::fmt;

use hive_api::meta::{ManagedFieldsEntry, StatusCause, API_VERSION};
use hive_api::Time;
use serde_json::{Map, Value};

/// Metadata the server owns: never in a field set, never taken from an applied
/// configuration.
pub(crate) const SERVER_OWNED_METADATA: [&str; 8] = [
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

mod fields;
#[cfg(test)]
mod tests;

pub use fields::{FieldPath, FieldSet, FieldsV1Error};

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
/// An object's `metadata.managedFields` entries, when it has a list of them.
fn managed_entries(object: &Value) -> Option<&Vec<Value>> {
    match object.pointer("/metadata/managedFields") {
        Some(Value::Array(entries)) => Some(entries),
        _ => None,
    }
}

fn load_owners(object: &Value) -> Vec<Owner> {
    let Some(entries) = managed_entries(object) else {
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

/// The owners an update's own `managedFields` name, when it has some and every entry
/// decodes as kube-apiserver decodes them — a manager, the operation `Apply` or
/// `Update`, fields of type `FieldsV1` that parse — else `None`, and the stored ones
/// stand.
fn written_owners(object: &Value) -> Option<Vec<Owner>> {
    let entries = managed_entries(object)?;
    let decodes = |e: &Value| {
        serde_json::from_value::<ManagedFieldsEntry>(e.clone()).ok().is_some_and(|entry| {
            !entry.manager.is_empty()
                && matches!(entry.operation.as_str(), "Apply" | "Update")
                && entry.fields_type.as_deref() == Some("FieldsV1")
                && entry.fields_v1.as_ref().is_some_and(|f| FieldSet::from_fields_v1(f).is_ok())
        })
    };
    (!entries.is_empty() && entries.iter().all(decodes)).then(|| load_owners(object))
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

/// What [`record_update`] records for a new object, in one walk of it: one entry, for
/// `manager`, owning every field (none when there is no field to own).
fn record_create(object: &mut Value, manager: &str, subresource: Option<&str>, now: Time) {
    let Some(fields_v1) = FieldSet::fields_v1_of_object(object) else {
        store_owners(object, Vec::new());
        return;
    };
    let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or(API_VERSION);
    let entry = ManagedFieldsEntry {
        manager: manager.to_string(),
        operation: Operation::Update.as_str().to_string(),
        api_version: Some(api_version.to_string()),
        subresource: subresource.map(str::to_string),
        time: Some(now),
        fields_type: Some("FieldsV1".to_string()),
        fields_v1: Some(fields_v1),
    };
    set_managed_fields(object, vec![entry_value(entry)]);
}

/// An entry as JSON, its `fieldsV1` trie moved in rather than serialized: serializing
/// the entry whole would copy the trie node by node, on every write.
fn entry_value(mut entry: ManagedFieldsEntry) -> Value {
    let (fields_v1, subresource) = (entry.fields_v1.take(), entry.subresource.take());
    let mut value = serde_json::to_value(entry).expect("a managed fields entry serializes");
    if let Some(map) = value.as_object_mut() {
        // In the order of the struct's fields, as serializing it whole writes them.
        if let Some(fields_v1) = fields_v1 {
            map.insert("fieldsV1".into(), fields_v1);
        }
        if let Some(subresource) = subresource {
            map.insert("subresource".into(), Value::String(subresource));
        }
    }
    value
}

/// Writes the owners into `metadata.managedFields`, dropping those left owning nothing.
fn store_owners(object: &mut Value, owners: Vec<Owner>) {
    let entries: Vec<Value> = owners
        .into_iter()
        .filter(|o| !o.fields.is_empty())
        .map(|mut o| {
            o.entry.fields_type = Some("FieldsV1".to_string());
            o.entry.fields_v1 = Some(o.fields.to_fields_v1());
            entry_value(o.entry)
        })
        .collect();
    set_managed_fields(object, entries);
}

/// Sets `metadata.managedFields` to `entries`, or removes it when there are none.
fn set_managed_fields(object: &mut Value, entries: Vec<Value>) {
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
/// several, one `conflicts with <manager>:` line per manager followed by `- <field>` lines,
/// at most [`MAX_CAUSES`](hive_api::validation::MAX_CAUSES) of them and a line counting
/// the rest.
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [only] = conflicts {
        return format!("Apply failed with 1 conflict: {only}");
    }
    let mut sorted: Vec<&Conflict> = conflicts.iter().collect();
    sorted.sort();
    let max = hive_api::validation::MAX_CAUSES;
    let listed = if sorted.len() <= max + 1 { sorted.len() } else { max };
    let mut lines = Vec::new();
    let mut current = None;
    for c in &sorted[..listed] {
        let who = c.manager_description();
        if current.as_ref() != Some(&who) {
            lines.push(format!("conflicts with {who}:"));
            current = Some(who);
        }
        lines.push(format!("- {}", c.field));
    }
    if listed < sorted.len() {
        lines.push(format!("- … and {} more conflicts, not listed", sorted.len() - listed));
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
    let Some(before) = old else {
        // A create: its manager owns every field, and nobody else anything.
        record_create(new, manager, subresource, now);
        return;
    };
    let after_set = FieldSet::of_object(new);
    let changed: FieldSet = after_set.iter().filter(|p| p.get(before) != p.get(new)).cloned().collect();
    let disowned: Vec<FieldPath> = FieldSet::of_object(before)
        .iter()
        .filter(|p| !after_set.contains(p) && p.get(before) != p.get(new))
        .cloned()
        .collect();

    // Ownership as the client wrote it, when it wrote any (kubectl's migration from
    // client-side to server-side apply replaces managedFields with a JSON patch), else
    // as stored: kube-apiserver takes an update's managedFields when they are non-empty
    // and decode, so a client that leaves them out or sends them back cannot lose them.
    let mut owners = match subresource {
        None => written_owners(new).unwrap_or_else(|| load_owners(before)),
        Some(_) => load_owners(before),
    };
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
