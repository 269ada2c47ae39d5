//! What a write asks for (`Mutation`), what it did (`Outcome`), and the rules that turn
//! one into the other. Pure: no IO, no locks, so the commit thread and dry runs share it.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use super::error::{Error, Result};
use super::watch::{event_cost, EventType};
use super::Obj;

/// Which part of an object an update writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subresource {
    /// The object itself: metadata the user owns and `spec`; `status` is kept.
    Main,
    /// The `/status` subresource: only `status` is taken from the incoming object.
    Status,
}

/// One write. `kind` is the plural resource name (`agents`), which is also how errors
/// and event records name the kind.
#[derive(Clone, Debug)]
pub enum Mutation {
    /// Create an object; fails with `AlreadyExists` if the name is taken.
    Create {
        /// Plural resource name.
        kind: &'static str,
        /// The full object (`apiVersion`, `kind`, `metadata.name`, `spec`, …).
        object: Value,
    },
    /// Replace the user-owned part (`Main`) or the `status` of an existing object.
    /// A non-empty `metadata.resourceVersion` (and `metadata.uid`) in `object` is a
    /// precondition: it must equal the stored one, or the write is a `Conflict`.
    Update {
        /// Plural resource name.
        kind: &'static str,
        /// The full object as the writer wants it.
        object: Value,
        /// Which part is written.
        subresource: Subresource,
    },
    /// Delete an object, or mark it for deletion while finalizers remain.
    Delete {
        /// Plural resource name.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Precondition: the object's uid must be this one.
        uid: Option<String>,
        /// Precondition: the object's resourceVersion must be this one.
        resource_version: Option<String>,
    },
}

impl Mutation {
    /// The plural resource name this mutation writes.
    pub fn kind(&self) -> &'static str {
        match self {
            Mutation::Create { kind, .. } | Mutation::Update { kind, .. } | Mutation::Delete { kind, .. } => {
                kind
            }
        }
    }

    /// About how many bytes the write sends to the store: its object's JSON (a delete's
    /// name). What [`GroupLimit::bytes`] counts.
    pub fn size(&self) -> usize {
        match self {
            Mutation::Create { object, .. } | Mutation::Update { object, .. } => {
                serde_json::to_vec(object).map_or(0, |json| json.len())
            }
            Mutation::Delete { name, .. } => name.len(),
        }
    }

    /// The object name this mutation writes.
    pub(super) fn name(&self) -> Result<String> {
        match self {
            Mutation::Create { kind, object } | Mutation::Update { kind, object, .. } => {
                match object.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str) {
                    Some(name) if !name.is_empty() => Ok(name.to_owned()),
                    _ => Err(Error::Invalid {
                        kind: (*kind).to_owned(),
                        message: "metadata.name must be a non-empty string".into(),
                    }),
                }
            }
            Mutation::Delete { name, .. } => Ok(name.clone()),
        }
    }
}

/// What a committed (or dry-run) mutation did. Every variant carries the resulting
/// object; its `metadata.resourceVersion` is the revision of the write.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The object was created.
    Created(Obj),
    /// The object was changed.
    Updated(Obj),
    /// The update changed nothing: no new revision, no event; the current object.
    Unchanged(Obj),
    /// Finalizers are pending: `deletionTimestamp` is set and the object stays until the
    /// last finalizer is removed. A repeated delete returns the object as it is.
    Deleting(Obj),
    /// The object is gone; this is its last state, carrying the deletion's revision.
    Deleted(Obj),
}

impl Outcome {
    /// The resulting object, whatever happened.
    pub fn object(&self) -> &Obj {
        match self {
            Outcome::Created(o)
            | Outcome::Updated(o)
            | Outcome::Unchanged(o)
            | Outcome::Deleting(o)
            | Outcome::Deleted(o) => o,
        }
    }

    /// Consumes the outcome, returning the resulting object.
    pub fn into_object(self) -> Obj {
        match self {
            Outcome::Created(o)
            | Outcome::Updated(o)
            | Outcome::Unchanged(o)
            | Outcome::Deleting(o)
            | Outcome::Deleted(o) => o,
        }
    }
}

/// How much one transaction ([`super::Store::commit_all`]) may hold, on a store that
/// bounds it (etcd: `--max-txn-ops` and `--max-request-bytes`). A write over it is
/// refused whole (`Error::TooLarge`); a writer of more splits it into groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupLimit {
    /// The most mutations one transaction may hold.
    pub writes: usize,
    /// The most bytes ([`Mutation::size`], summed) one transaction may hold.
    pub bytes: usize,
}

impl GroupLimit {
    /// Whether one transaction takes `writes` mutations of `bytes` bytes in all.
    pub fn admits(&self, writes: usize, bytes: usize) -> bool {
        writes <= self.writes && bytes <= self.bytes
    }
}

/// A planned write: the new state of one object at one revision.
#[derive(Clone, Debug)]
pub(super) struct Change {
    pub kind: &'static str,
    pub name: String,
    pub revision: u64,
    /// `Deleted` removes the object; the others store it.
    pub type_: EventType,
    /// Encoded when planned, then shared by redb, the cache and watchers.
    pub object: Obj,
    /// The event's `cost`.
    pub cost: usize,
    /// The revision of the object this change replaces or deletes (none for a create):
    /// the one whose stored copy is garbage once retention has passed it.
    pub supersedes: Option<u64>,
}

impl Change {
    fn new(kind: &'static str, name: &str, revision: u64, type_: EventType, object: Obj) -> Change {
        let cost = event_cost(object.len());
        Change { kind, name: name.to_owned(), revision, type_, object, cost, supersedes: None }
    }
}

/// One mutation's planned result: what to answer and, unless nothing changes, what to
/// write.
#[derive(Debug)]
pub(super) struct Applied {
    pub outcome: Outcome,
    pub change: Option<Change>,
}

/// Plans `mutations` as one all-or-nothing group on top of the objects `lookup` sees.
/// Each mutation sees the effects of the earlier ones; each write takes the next
/// revision starting at `next_revision`. The first failure fails the whole group.
pub(super) fn plan(
    lookup: &dyn Fn(&str, &str) -> Option<Obj>,
    mutations: Vec<Mutation>,
    next_revision: u64,
    now: DateTime<Utc>,
) -> Result<Vec<Applied>> {
    let mut written: HashMap<(&'static str, String), Option<Obj>> = HashMap::new();
    let mut revision = next_revision;
    let mut planned = Vec::with_capacity(mutations.len());
    for mutation in mutations {
        let kind = mutation.kind();
        let name = mutation.name()?;
        let current = match written.get(&(kind, name.clone())) {
            Some(state) => state.clone(),
            None => lookup(kind, &name),
        };
        let supersedes = current.as_ref().map(Obj::revision);
        let mut applied = apply(current, mutation, &name, revision, now)?;
        if let Some(change) = &mut applied.change {
            change.supersedes = supersedes;
            let state = (change.type_ != EventType::Deleted).then(|| change.object.clone());
            written.insert((kind, name), state);
            revision += 1;
        }
        planned.push(applied);
    }
    Ok(planned)
}

/// Applies one mutation to the current state of its object.
fn apply(
    current: Option<Obj>,
    mutation: Mutation,
    name: &str,
    revision: u64,
    now: DateTime<Utc>,
) -> Result<Applied> {
    match mutation {
        Mutation::Create { kind, object } => create(kind, name, current, object, revision, now),
        Mutation::Update { kind, object, subresource } => {
            let stored = current.ok_or_else(|| not_found(kind, name))?;
            let current = stored.value();
            check_preconditions(
                kind,
                name,
                &current,
                meta_str(&object, "uid"),
                meta_str(&object, "resourceVersion"),
            )?;
            let updated = match subresource {
                Subresource::Main => update_main(&current, object),
                Subresource::Status => update_status(current.clone(), object),
            };
            if updated == current {
                return Ok(Applied { outcome: Outcome::Unchanged(stored), change: None });
            }
            Ok(finish_update(kind, name, updated, revision))
        }
        Mutation::Delete { kind, name: _, uid, resource_version } => {
            let stored = current.ok_or_else(|| not_found(kind, name))?;
            let current = stored.value();
            check_preconditions(kind, name, &current, uid.as_deref(), resource_version.as_deref())?;
            delete(kind, name, stored, current, revision, now)
        }
    }
}

fn create(
    kind: &'static str,
    name: &str,
    current: Option<Obj>,
    mut object: Value,
    revision: u64,
    now: DateTime<Utc>,
) -> Result<Applied> {
    if current.is_some() {
        return Err(Error::AlreadyExists { kind: kind.to_owned(), name: name.to_owned() });
    }
    let meta = metadata_mut(&mut object);
    meta.insert("uid".into(), Value::String(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), timestamp(now));
    meta.insert("generation".into(), Value::from(1));
    meta.insert("resourceVersion".into(), Value::String(revision.to_string()));
    meta.remove("deletionTimestamp");
    // hive's kinds are cluster-scoped; a core Event keeps the namespace a recorder wrote
    // it into.
    if kind != hive_api::event::EVENT_KIND.plural {
        meta.remove("namespace");
    }
    let object = Obj::encode(&object, revision);
    Ok(Applied {
        outcome: Outcome::Created(object.clone()),
        change: Some(Change::new(kind, name, revision, EventType::Added, object)),
    })
}

/// The incoming object with everything the server owns taken from `current`: identity
/// and lifecycle metadata, `apiVersion`/`kind`, and `status` (which only the status
/// subresource writes). `generation` bumps when anything outside metadata and status
/// changed — for hive kinds that is exactly `spec`.
fn update_main(current: &Value, mut incoming: Value) -> Value {
    // The namespace an object was created in is its own for good, as in Kubernetes.
    const SERVER_OWNED: [&str; 7] = [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "generation",
        "resourceVersion",
    ];
    let Some(body) = incoming.as_object_mut() else { return current.clone() };
    for field in ["apiVersion", "kind", "status"] {
        copy_field(current.as_object(), body, field);
    }
    let meta = metadata_mut(&mut incoming);
    for field in SERVER_OWNED {
        copy_field(current.get("metadata").and_then(Value::as_object), meta, field);
    }
    if !same_desired_state(current, &incoming) {
        let generation = current.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
        metadata_mut(&mut incoming).insert("generation".into(), Value::from(generation + 1));
    }
    incoming
}

/// `current` with the incoming `status` (or none, if the incoming object has none).
fn update_status(mut current: Value, mut incoming: Value) -> Value {
    if let Some(body) = current.as_object_mut() {
        match incoming.as_object_mut().and_then(|i| i.remove("status")) {
            Some(status) => body.insert("status".into(), status),
            None => body.remove("status"),
        };
    }
    current
}

/// Stamps the update's revision; an update that leaves a deleting object without
/// finalizers removes it.
fn finish_update(kind: &'static str, name: &str, mut updated: Value, revision: u64) -> Applied {
    metadata_mut(&mut updated).insert("resourceVersion".into(), Value::String(revision.to_string()));
    let deleting = updated.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null());
    let gone = deleting && finalizers_empty(&updated);
    let object = Obj::encode(&updated, revision);
    let (outcome, type_) = if gone {
        (Outcome::Deleted(object.clone()), EventType::Deleted)
    } else {
        (Outcome::Updated(object.clone()), EventType::Modified)
    };
    Applied { outcome, change: Some(Change::new(kind, name, revision, type_, object)) }
}

/// Deletes `stored` (parsed: `current`), or marks it for deletion while finalizers
/// remain.
fn delete(
    kind: &'static str,
    name: &str,
    stored: Obj,
    mut current: Value,
    revision: u64,
    now: DateTime<Utc>,
) -> Result<Applied> {
    let (outcome, type_) = if finalizers_empty(&current) {
        metadata_mut(&mut current).insert("resourceVersion".into(), Value::String(revision.to_string()));
        (Outcome::Deleted(Obj::encode(&current, revision)), EventType::Deleted)
    } else if current.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
        // Already marked: Kubernetes answers with the object and writes nothing.
        return Ok(Applied { outcome: Outcome::Deleting(stored), change: None });
    } else {
        let meta = metadata_mut(&mut current);
        meta.insert("deletionTimestamp".into(), timestamp(now));
        meta.insert("resourceVersion".into(), Value::String(revision.to_string()));
        (Outcome::Deleting(Obj::encode(&current, revision)), EventType::Modified)
    };
    let object = outcome.object().clone();
    Ok(Applied { outcome, change: Some(Change::new(kind, name, revision, type_, object)) })
}

/// The uid and resourceVersion preconditions shared by update and delete; empty values
/// count as absent.
fn check_preconditions(
    kind: &str,
    name: &str,
    current: &Value,
    uid: Option<&str>,
    resource_version: Option<&str>,
) -> Result<()> {
    let current_uid = meta_str(current, "uid").unwrap_or_default();
    if let Some(uid) = uid.filter(|u| !u.is_empty()) {
        if uid != current_uid {
            let reason =
                format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {current_uid}");
            return Err(Error::conflict(kind, name, &reason));
        }
    }
    if let Some(rv) = resource_version.filter(|rv| !rv.is_empty()) {
        if rv != meta_str(current, "resourceVersion").unwrap_or_default() {
            return Err(Error::conflict(
                kind,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
    }
    Ok(())
}

/// True when the two objects agree on everything outside `metadata` and `status`.
fn same_desired_state(a: &Value, b: &Value) -> bool {
    let desired = |v: &Value| -> Vec<(String, Value)> {
        let mut fields: Vec<(String, Value)> = v
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.as_str() != "metadata" && k.as_str() != "status")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        fields.sort_by(|x, y| x.0.cmp(&y.0));
        fields
    };
    desired(a) == desired(b)
}

fn finalizers_empty(object: &Value) -> bool {
    object.pointer("/metadata/finalizers").and_then(Value::as_array).is_none_or(Vec::is_empty)
}

fn copy_field(from: Option<&Map<String, Value>>, to: &mut Map<String, Value>, field: &str) {
    match from.and_then(|f| f.get(field)) {
        Some(value) => to.insert(field.to_owned(), value.clone()),
        None => to.remove(field),
    };
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

/// `object.metadata` as a map, creating it (and replacing a non-object) if needed.
/// Mutations are checked for a `metadata.name` before they are applied, so in practice
/// this only ever finds the map.
pub(super) fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = Value::Object(Map::new());
    }
    let Value::Object(body) = object else { unreachable!("object was just made a map") };
    let meta = body.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    let Value::Object(meta) = meta else { unreachable!("metadata was just made a map") };
    meta
}

fn not_found(kind: &str, name: &str) -> Error {
    Error::NotFound { kind: kind.to_owned(), name: name.to_owned() }
}

fn timestamp(now: DateTime<Utc>) -> Value {
    serde_json::to_value(hive_api::Time(now)).unwrap_or(Value::Null)
}
