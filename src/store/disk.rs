//! The redb side of the store: creating, opening and validating the database file,
//! bringing it up to date with the write-ahead log, loading it into memory, and writing
//! the log's entries as one durable transaction (the checkpointer's).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, DatabaseError, Durability, ReadableTable};

use super::chunk::Chunks;
use super::entry::Entry;
use super::error::{Error, Result};
use super::state::State;
use super::tables::{v1, CHUNKS, META, META_COMPACTED, META_REVISION, META_SCHEMA, SCHEMA_VERSION};
use super::wal::{self, Wal};

/// Opens the database at `path`, creating it when there is no file, applies what its
/// write-ahead log holds beyond it, loads it, and starts the log over under new
/// generations (files of at most `wal_bytes` each). Anything unreadable is `Corrupt`:
/// the store never starts empty over existing data, nor without acknowledged writes.
pub(super) fn open(path: &Path, wal_bytes: u64) -> Result<(Database, Wal, State)> {
    let exists = path.try_exists().map_err(|source| Error::Io { path: path.to_owned(), source })?;
    if !exists {
        // A log without its database belongs to nothing (the database is created before
        // any log is written): start both afresh.
        wal::remove(path)?;
        create(path, 0)?;
    }
    let mut db = open_file(path)?;
    if super::upgrade::to_current(&db, path, schema(&db, path)?)? {
        db = rewrite(db, path)?;
    }
    let (revision, _) = counters(&db, path)?;
    let recovered = wal::recover(path, revision)?;
    if !recovered.entries.is_empty() {
        let entries = recovered
            .entries
            .iter()
            .map(|bytes| Entry::decode(bytes).map_err(|why| Error::corrupt(path, why)))
            .collect::<Result<Vec<_>>>()?;
        let replayed = write_entries(&db, &entries).map_err(|e| Error::corrupt(path, e))?;
        tracing::info!(
            path = %path.display(),
            entries = entries.len(),
            from = revision,
            to = replayed.unwrap_or(revision),
            "state database brought up to date from its write-ahead log"
        );
    }
    if schema(&db, path)? != SCHEMA_VERSION {
        return Err(Error::corrupt(path, "the file was not upgraded to this build's schema"));
    }
    let (revision, compacted) = counters(&db, path)?;
    let state = super::load::load(&db, path, revision, compacted)?;
    let wal = Wal::start(path, recovered.generation + 1, wal_bytes)?;
    Ok((db, wal, state))
}

/// The revision and compacted counters of the file.
fn counters(db: &Database, path: &Path) -> Result<(u64, u64)> {
    let corrupt = |e: redb::Error| Error::corrupt(path, e);
    let read = db.begin_read().map_err(|e| corrupt(e.into()))?;
    let meta = read.open_table(META).map_err(|e| corrupt(e.into()))?;
    let counter = |key: &str| -> Result<Option<u64>> {
        Ok(meta.get(key).map_err(|e| corrupt(e.into()))?.map(|v| v.value()))
    };
    match (counter(META_REVISION)?, counter(META_COMPACTED)?) {
        (Some(revision), Some(compacted)) => Ok((revision, compacted)),
        _ => Err(Error::corrupt(path, "the revision counters are missing")),
    }
}

/// Opens the redb file at `path`: `Locked` when another store has it, `Corrupt` when
/// redb refuses it. redb validates headers and checksums and repairs after an unclean
/// shutdown; a panic inside it on a damaged file must not take the daemon down
/// unexplained.
/// redb's page cache. The store reads the file only when it opens it (every read after
/// that is served from memory), so the cache serves the write path alone: the pages a
/// batch's inserts walk. redb's default of 1 GiB would keep every page that loading
/// read, which is the whole file.
const CACHE_BYTES: usize = 16 << 20;

/// How the store opens a database file.
fn builder() -> redb::Builder {
    let mut builder = Database::builder();
    builder.set_cache_size(CACHE_BYTES);
    builder
}

fn open_file(path: &Path) -> Result<Database> {
    match std::panic::catch_unwind(|| builder().open(path)) {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(DatabaseError::DatabaseAlreadyOpen)) => Err(Error::Locked { path: path.to_owned() }),
        Ok(Err(e)) => Err(Error::corrupt(path, e)),
        Err(_) => Err(Error::corrupt(path, "the database engine panicked while opening the file")),
    }
}

/// Writes an upgraded file again, into a new file renamed over it: the upgrade wrote
/// every revision again inside the old file, which redb never shortens (a file of schema
/// 4 at a million Agents stayed 1.6 GB long, 861 MiB on disk, where one written by this
/// build holds them in 64 MiB). redb's own `compact` gave back most of it (249 MiB) but
/// left the chunks scattered, and a start on a cold page cache then took 4 s instead of
/// 2. The copy holds the same rows in key order, as a file this build filled does; it is
/// synced before the rename, so a crash leaves the one file or the other, both whole and
/// the same to the log. When the copy fails the file is opened again as it is (upgraded,
/// not shortened) and the start goes on.
fn rewrite(db: Database, path: &Path) -> Result<Database> {
    let length = |path: &Path| fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let (before, started) = (length(path), std::time::Instant::now());
    let copied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        replace_atomically(path, ".rewriting", |fresh| copy_rows(&db, fresh))
    }));
    drop(db);
    match copied {
        Ok(Ok(())) => tracing::info!(
            path = %path.display(),
            before_bytes = before,
            after_bytes = length(path),
            took_ms = started.elapsed().as_millis() as u64,
            "state database written again after its upgrade"
        ),
        Ok(Err(e)) => {
            tracing::warn!(path = %path.display(), error = %e, "could not write the state database again after its upgrade; it keeps its length")
        }
        Err(_) => {
            tracing::warn!(path = %path.display(), "the database engine panicked writing the state database again after its upgrade; it keeps its length")
        }
    }
    open_file(path)
}

/// Copies every row of the store's tables from `from` into `to`, in one transaction.
fn copy_rows(from: &Database, to: &Database) -> Result<()> {
    let read = from.begin_read().map_err(Error::db)?;
    let mut txn = to.begin_write().map_err(Error::db)?;
    txn.set_durability(Durability::Immediate);
    {
        let source = read.open_table(META).map_err(Error::db)?;
        let mut meta = txn.open_table(META).map_err(Error::db)?;
        for row in source.iter().map_err(Error::db)? {
            let (key, value) = row.map_err(Error::db)?;
            meta.insert(key.value(), value.value()).map_err(Error::db)?;
        }
        let source = read.open_table(CHUNKS).map_err(Error::db)?;
        let mut chunks = txn.open_table(CHUNKS).map_err(Error::db)?;
        for row in source.iter().map_err(Error::db)? {
            let (key, value) = row.map_err(Error::db)?;
            chunks.insert(key.value(), value.value()).map_err(Error::db)?;
        }
    }
    txn.commit().map_err(Error::db)
}

/// Builds a new database under `path` + `suffix` with `fill`, then renames it over
/// `path` and syncs the directory: a crash never leaves a half-written file at `path`.
/// A file left under the temporary name by an earlier crash is removed first.
fn replace_atomically(path: &Path, suffix: &str, fill: impl FnOnce(&Database) -> Result<()>) -> Result<()> {
    let io_err = |path: &Path| {
        let path = path.to_owned();
        move |source: io::Error| Error::Io { path, source }
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(suffix);
    let tmp = PathBuf::from(tmp);
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&tmp)(e)),
        _ => {}
    }
    let file =
        fs::OpenOptions::new().read(true).write(true).create_new(true).open(&tmp).map_err(io_err(&tmp))?;
    let db = Database::builder().create_file(file).map_err(Error::db)?;
    if let Err(e) = fill(&db) {
        drop(db);
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    drop(db);
    fs::rename(&tmp, path).map_err(io_err(path))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}

/// Creates an empty store at `path` atomically: it is built under a temporary name and
/// renamed into place, so a crash never leaves a half-initialized file at `path`. Its
/// first write gets revision `floor + 1`, and watches from `floor` or below are expired.
fn create(path: &Path, floor: u64) -> Result<()> {
    replace_atomically(path, ".creating", |db| {
        let mut txn = db.begin_write().map_err(Error::db)?;
        txn.set_durability(Durability::Immediate);
        {
            txn.open_table(CHUNKS).map_err(Error::db)?;
            let mut meta = txn.open_table(META).map_err(Error::db)?;
            meta.insert(META_SCHEMA, SCHEMA_VERSION).map_err(Error::db)?;
            meta.insert(META_REVISION, floor).map_err(Error::db)?;
            meta.insert(META_COMPACTED, floor).map_err(Error::db)?;
        }
        txn.commit().map_err(Error::db)
    })
}

/// The file's schema version: this build's, or one it upgrades from.
fn schema(db: &Database, path: &Path) -> Result<u64> {
    let corrupt = |e: redb::Error| Error::corrupt(path, e);
    let read = db.begin_read().map_err(|e| corrupt(e.into()))?;
    let meta = read.open_table(META).map_err(|e| corrupt(e.into()))?;
    match meta.get(META_SCHEMA).map_err(|e| corrupt(e.into()))?.map(|v| v.value()) {
        Some(version) if (v1::SCHEMA_VERSION..=SCHEMA_VERSION).contains(&version) => Ok(version),
        Some(other) => Err(Error::corrupt(
            path,
            format!(
                "unknown schema version {other} (this build reads versions {} to {SCHEMA_VERSION})",
                v1::SCHEMA_VERSION
            ),
        )),
        None => Err(Error::corrupt(path, "no schema version: not a hive state database")),
    }
}

/// Free space a file system needs before a store whose writes failed takes writes on it
/// again: room for the largest objects the API takes (3 MiB), with their events. A small
/// write can land in space the files already have, so one going through does not prove
/// much.
const REOPEN_FREE_BYTES: u64 = 8 << 20;

/// `DiskFull` unless the file system holding `path` has [`REOPEN_FREE_BYTES`] free.
pub(super) fn has_room(path: &Path) -> Result<()> {
    match rustix::fs::statvfs(path) {
        Ok(fs) if fs.f_bavail.saturating_mul(fs.f_frsize) < REOPEN_FREE_BYTES => {
            Err(Error::DiskFull { path: path.to_owned() })
        }
        _ => Ok(()),
    }
}

/// Reopens the database after a failed transaction and proves it takes writes again:
/// the file system [`has_room`], the file's revision is `revision` (what the last
/// checkpoint made durable: the failed one is not in it, as redb's atomic commit
/// promises) and a small durable write goes through. A full disk is `DiskFull`;
/// anything else `Unavailable`, with why.
pub(super) fn reopen(path: &Path, revision: u64) -> Result<Database> {
    has_room(path)?;
    let unavailable = |message: String| Error::Unavailable { message };
    let failed = |e: redb::Error| {
        if super::error::is_disk_full(&e) {
            Error::DiskFull { path: path.to_owned() }
        } else {
            unavailable(format!("reopening it after a failed write: {e}"))
        }
    };
    let opened = std::panic::catch_unwind(|| builder().open(path));
    let db = match opened {
        Ok(Ok(db)) => db,
        Ok(Err(e)) => return Err(failed(e.into())),
        Err(_) => return Err(unavailable("the database engine panicked while reopening the file".into())),
    };
    let on_disk = {
        let read = db.begin_read().map_err(|e| failed(e.into()))?;
        let meta = read.open_table(META).map_err(|e| failed(e.into()))?;
        let value = meta.get(META_REVISION).map_err(|e| failed(e.into()))?;
        value.map(|v| v.value())
    };
    if on_disk != Some(revision) {
        return Err(unavailable(format!(
            "the file is at revision {on_disk:?} but the store served {revision}: restart the daemon to load it"
        )));
    }
    let mut txn = db.begin_write().map_err(|e| failed(e.into()))?;
    txn.set_durability(Durability::Immediate);
    {
        let mut meta = txn.open_table(META).map_err(|e| failed(e.into()))?;
        meta.insert(META_REVISION, revision).map_err(|e| failed(e.into()))?;
    }
    txn.commit().map_err(|e| failed(e.into()))?;
    Ok(db)
}

/// Writes log entries, in order, in one transaction with immediate durability, and
/// returns the revision the file is at afterwards (`None` for no entries). When this
/// returns Ok, they survive a crash. The error is shared because every writer waiting
/// on the checkpoint receives it.
pub(super) fn write_entries(db: &Database, entries: &[Entry<'_>]) -> Result<Option<u64>, Arc<redb::Error>> {
    let Some(last) = entries.last() else { return Ok(None) };
    let mut txn = db.begin_write().map_err(shared)?;
    txn.set_durability(Durability::Immediate);
    {
        let mut table = txn.open_table(CHUNKS).map_err(shared)?;
        let mut chunks = Chunks::new(&mut table);
        for entry in entries {
            for (revision, row) in entry.rows() {
                chunks.append(revision, row).map_err(shared)?;
            }
            for revision in entry.garbage() {
                chunks.remove(revision).map_err(shared)?;
            }
        }
        chunks.flush().map_err(shared)?;
        drop(chunks);
        let mut meta = txn.open_table(META).map_err(shared)?;
        meta.insert(META_REVISION, last.last).map_err(shared)?;
        meta.insert(META_COMPACTED, last.compacted).map_err(shared)?;
    }
    txn.commit().map_err(shared)?;
    Ok(Some(last.last))
}

fn shared(e: impl Into<redb::Error>) -> Arc<redb::Error> {
    Arc::new(e.into())
}

/// Replaces the database file at `path` (and nothing else) with an empty store whose
/// revisions continue above the old file's: a client resuming a watch from an old
/// revision gets 410 and lists again, never a silent stream. Returns that floor.
///
/// The floor is the old file's revision when it can still be read. A file redb cannot
/// open gives the clock's microseconds since 1970 instead: every revision is one
/// committed event, and no store commits a million events a second, so no file created
/// since 1970 can have reached it. No file: nothing to continue, an empty store at 0.
pub(super) fn reset(path: &Path, now: chrono::DateTime<chrono::Utc>) -> Result<u64> {
    let exists = path.try_exists().map_err(|source| Error::Io { path: path.to_owned(), source })?;
    if !exists {
        return Ok(0);
    }
    let floor = match old_revision(path) {
        // The log may hold acknowledged writes beyond the file.
        Ok(revision) => wal::last_revision(path, revision),
        Err(e @ Error::Locked { .. }) => return Err(e),
        Err(e) => {
            let floor = u64::try_from(now.timestamp_micros()).unwrap_or(0);
            tracing::warn!(error = %e, floor, "the old state cannot be read; revisions continue above the clock");
            floor
        }
    };
    wal::remove(path)?;
    fs::remove_file(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
    create(path, floor)?;
    Ok(floor)
}

/// The revision counter of the store at `path`, read without loading it.
fn old_revision(path: &Path) -> Result<u64> {
    let db = open_file(path)?;
    let corrupt = |e: redb::Error| Error::corrupt(path, e);
    let read = db.begin_read().map_err(|e| corrupt(e.into()))?;
    let meta = read.open_table(META).map_err(|e| corrupt(e.into()))?;
    let revision = meta.get(META_REVISION).map_err(|e| corrupt(e.into()))?;
    revision.map(|v| v.value()).ok_or_else(|| Error::corrupt(path, "the revision counter is missing"))
}
