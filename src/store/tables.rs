//! Every redb table the store uses, and the keys of its `meta` table. Nothing else in
//! hive names a table.
//!
//! Each revision is stored once, as etcd's MVCC store keeps it: `CHUNKS` holds the
//! object as that revision wrote it, and the objects are what the revisions leave,
//! rebuilt in memory when the store opens (etcd rebuilds its key index the same way). A
//! revision stays while it is retained in the event log or is its object's current one;
//! a create appends one revision and writes nothing else. Consecutive revisions share a
//! row of about a page (`chunk.rs`), so that redb's leaves are full.

use redb::TableDefinition;

/// first revision → a chunk of revisions, compressed (`chunk.rs`), each what it wrote
/// (`record.rs`): every revision `compacted + 1 ..= revision` (the retained event log),
/// and below that only those that are still an object's current one.
pub(super) const CHUNKS: TableDefinition<u64, &[u8]> = TableDefinition::new("lz4_chunks");

/// Store-wide counters, keyed by the `META_*` names below.
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Layout version of the tables above; bump it when their encoding changes.
pub(super) const META_SCHEMA: &str = "schema";
/// The revision of the last committed mutation.
pub(super) const META_REVISION: &str = "revision";
/// Every event with a revision at or below this one has been dropped by retention.
pub(super) const META_COMPACTED: &str = "compacted";

/// The only schema version this build writes; files of versions 1 to 4 are upgraded on
/// open. Version 5 compresses version 4's chunks. Version 4 packs version 3's rows into
/// chunks. Version 3 has version 2's tables; it says that the file may be behind its
/// write-ahead log (`wal.rs`), which a build of version 2 would not read.
pub(super) const SCHEMA_VERSION: u64 = 5;

/// The key of one object (in the commit thread's view of a batch).
pub(super) fn object_key(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}

/// Schema version 4: chunks as version 5's, but not compressed. Read once, when such a
/// file is upgraded.
pub(super) mod v4 {
    use redb::TableDefinition;

    /// first revision → the records of a chunk (`chunk.rs`), as they are.
    pub const CHUNKS: TableDefinition<u64, &[u8]> = TableDefinition::new("chunks");
    /// The version these tables are.
    pub const SCHEMA_VERSION: u64 = 4;
}

/// Schema versions 2 and 3: one row per revision. Read once, when such a file is
/// upgraded (and written by the upgrade of a version-1 file on its way).
pub(super) mod v3 {
    use redb::TableDefinition;

    /// revision → what it wrote (`record.rs`).
    pub const REVISIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("revisions");
}

/// Schema version 1: each object's JSON in `OBJECTS`, and each retained event with its
/// own copy of the object in `EVENTS`. Read once, when such a file is upgraded.
pub(super) mod v1 {
    use redb::TableDefinition;

    /// `"<plural>/<name>"` → the object as JSON.
    pub const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
    /// revision → JSON `{type, kind, time, object}`, the revisions `compacted + 1 ..= revision`.
    pub const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
    /// The version these tables are.
    pub const SCHEMA_VERSION: u64 = 1;
}
