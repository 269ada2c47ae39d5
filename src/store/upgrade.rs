//! Upgrading a file of an earlier schema to this build's, in one durable transaction
//! when the store opens it: a crash during the upgrade leaves the old file as it was.
//! Versions 1 to 4 all end with [`into_chunks`], version 1 after its tables were
//! rewritten as version 3's.

use std::borrow::Cow;
use std::path::Path;

use redb::{Database, Durability, ReadableTable, TableDefinition, WriteTransaction};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::chunk::{self, Chunks};
use super::error::{Error, Result};
use super::record::Record;
use super::tables::{v1, v3, v4, CHUNKS, META, META_SCHEMA, SCHEMA_VERSION};
use super::watch::EventType;

/// One version-1 event, borrowed from its row.
#[derive(Deserialize)]
struct EventV1<'a> {
    #[serde(rename = "type", borrow)]
    type_: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    time: i64,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// The part of a version-1 object the upgrade reads: its resourceVersion.
#[derive(Deserialize)]
struct Versioned<'a> {
    #[serde(borrow)]
    metadata: Option<VersionOnly<'a>>,
}

#[derive(Deserialize)]
struct VersionOnly<'a> {
    #[serde(rename = "resourceVersion", borrow)]
    resource_version: Option<Cow<'a, str>>,
}

/// Brings a file of schema `version` to this build's, in place: version 1's tables are
/// rewritten ([`from_v1`]); versions 2 and 3 have one row per revision, and version 4
/// chunks not compressed, packed into compressed chunks ([`repack`]). Version 2 had no
/// write-ahead log: an older build must not open the file once its newest writes may be
/// in the log alone (it would lose them), and the version this writes says so. Whether
/// the file was upgraded.
pub(super) fn to_current(db: &Database, path: &Path, version: u64) -> Result<bool> {
    match version {
        SCHEMA_VERSION => return Ok(false),
        v1::SCHEMA_VERSION => from_v1(db, path)?,
        _ => repack(db, path, version)?,
    }
    Ok(true)
}

/// Packs the rows of a file of schema 2 or 3, or the chunks of one of schema 4, into
/// compressed chunks.
fn repack(db: &Database, path: &Path, version: u64) -> Result<()> {
    let corrupt = |e: redb::Error| Error::corrupt(path, e);
    let mut txn = db.begin_write().map_err(|e| corrupt(e.into()))?;
    txn.set_durability(Durability::Immediate);
    let moved = match version {
        v4::SCHEMA_VERSION => into_chunks(&txn, path, v4::CHUNKS, Rows::Chunks)?,
        _ => into_chunks(&txn, path, v3::REVISIONS, Rows::Revisions)?,
    };
    txn.commit().map_err(|e| corrupt(e.into()))?;
    tracing::info!(path = %path.display(), revisions = moved, "state database upgraded from schema {version} to {SCHEMA_VERSION}");
    Ok(())
}

/// What the rows of a table an upgrade reads are.
enum Rows {
    /// One revision each (version 3's `revisions`).
    Revisions,
    /// A chunk of revisions each, not compressed (version 4's `chunks`).
    Chunks,
}

/// Moves every revision of the old table `from` into `CHUNKS`, in order, drops that
/// table and marks the file as this build's; the number of revisions moved.
fn into_chunks(
    txn: &WriteTransaction,
    path: &Path,
    from: TableDefinition<u64, &[u8]>,
    rows: Rows,
) -> Result<u64> {
    let corrupt = |e: redb::Error| Error::corrupt(path, e);
    let mut moved = 0;
    {
        let old = txn.open_table(from).map_err(|e| corrupt(e.into()))?;
        let mut table = txn.open_table(CHUNKS).map_err(|e| corrupt(e.into()))?;
        let mut chunks = Chunks::new(&mut table);
        for row in old.iter().map_err(|e| corrupt(e.into()))? {
            let (key, row) = row.map_err(|e| corrupt(e.into()))?;
            let (key, row) = (key.value(), row.value());
            let revisions = match rows {
                Rows::Revisions => vec![(key, row)],
                Rows::Chunks => chunk::records(key, row).map_err(|why| Error::corrupt(path, why))?,
            };
            for (revision, row) in revisions {
                chunks.append(revision, row).map_err(|e| corrupt(e.into()))?;
                moved += 1;
            }
        }
        chunks.flush().map_err(|e| corrupt(e.into()))?;
        let mut meta = txn.open_table(META).map_err(|e| corrupt(e.into()))?;
        meta.insert(META_SCHEMA, SCHEMA_VERSION).map_err(|e| corrupt(e.into()))?;
    }
    txn.delete_table(from).map_err(|e| corrupt(e.into()))?;
    Ok(moved)
}

/// Version 1 kept each object in `objects` and a second copy in every retained event in
/// `events`. Each retained event becomes its revision's row; an object whose event
/// retention had dropped gets a row of its own at its resourceVersion.
fn from_v1(db: &Database, path: &Path) -> Result<()> {
    let corrupt = |e: redb::Error| Error::corrupt(path, e);
    let mut txn = db.begin_write().map_err(|e| corrupt(e.into()))?;
    txn.set_durability(Durability::Immediate);
    let (mut events_moved, mut objects_moved) = (0u64, 0u64);
    {
        let events = txn.open_table(v1::EVENTS).map_err(|e| corrupt(e.into()))?;
        let objects = txn.open_table(v1::OBJECTS).map_err(|e| corrupt(e.into()))?;
        let mut revisions = txn.open_table(v3::REVISIONS).map_err(|e| corrupt(e.into()))?;
        for entry in events.iter().map_err(|e| corrupt(e.into()))? {
            let (revision, row) = entry.map_err(|e| corrupt(e.into()))?;
            let revision = revision.value();
            let event: EventV1 = serde_json::from_slice(row.value())
                .map_err(|e| Error::corrupt(path, format!("event {revision}: {e}")))?;
            let Some(type_) = EventType::parse(&event.type_) else {
                return Err(Error::corrupt(path, format!("event {revision} has type {:?}", event.type_)));
            };
            let record = Record {
                type_,
                time_ms: event.time,
                kind: &event.kind,
                object: event.object.get().as_bytes(),
            };
            revisions.insert(revision, record.encode().as_slice()).map_err(|e| corrupt(e.into()))?;
            events_moved += 1;
        }
        for entry in objects.iter().map_err(|e| corrupt(e.into()))? {
            let (key, json) = entry.map_err(|e| corrupt(e.into()))?;
            let (key, json) = (key.value(), json.value());
            let Some((kind, _)) = key.split_once('/') else {
                return Err(Error::corrupt(path, format!("object key {key:?} is not kind/name")));
            };
            let versioned: Versioned = serde_json::from_slice(json)
                .map_err(|e| Error::corrupt(path, format!("object {key}: {e}")))?;
            let revision = versioned
                .metadata
                .and_then(|m| m.resource_version)
                .and_then(|rv| rv.parse::<u64>().ok())
                .ok_or_else(|| {
                    Error::corrupt(path, format!("object {key} has no numeric resourceVersion"))
                })?;
            let retained = revisions.get(revision).map_err(|e| corrupt(e.into()))?.is_some();
            if !retained {
                // Retention dropped its event: only the object itself says what it is.
                let record = Record { type_: EventType::Modified, time_ms: 0, kind, object: json };
                revisions.insert(revision, record.encode().as_slice()).map_err(|e| corrupt(e.into()))?;
            }
            objects_moved += 1;
        }
    }
    txn.delete_table(v1::EVENTS).map_err(|e| corrupt(e.into()))?;
    txn.delete_table(v1::OBJECTS).map_err(|e| corrupt(e.into()))?;
    into_chunks(&txn, path, v3::REVISIONS, Rows::Revisions)?;
    txn.commit().map_err(|e| corrupt(e.into()))?;
    tracing::info!(
        path = %path.display(),
        objects = objects_moved,
        events = events_moved,
        "state database upgraded from schema {} to {SCHEMA_VERSION}",
        v1::SCHEMA_VERSION
    );
    Ok(())
}
