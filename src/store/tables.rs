//! Every redb table the store uses, and the keys of its `meta` table. Nothing else in
//! hive names a table.

use redb::TableDefinition;

/// Current objects: `"<plural>/<name>"` → the object as JSON.
pub(super) const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");

/// The retained event log: revision → JSON `{type, kind, time, object}` (see `disk::EventRecord`).
/// Holds exactly the revisions `compacted + 1 ..= revision`.
pub(super) const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");

/// Store-wide counters, keyed by the `META_*` names below.
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Layout version of the tables above; bump it when their encoding changes.
pub(super) const META_SCHEMA: &str = "schema";
/// The revision of the last committed mutation.
pub(super) const META_REVISION: &str = "revision";
/// Every event with a revision at or below this one has been dropped by retention.
pub(super) const META_COMPACTED: &str = "compacted";

/// The only schema version this build understands.
pub(super) const SCHEMA_VERSION: u64 = 1;

/// The `OBJECTS` key of one object.
pub(super) fn object_key(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}
