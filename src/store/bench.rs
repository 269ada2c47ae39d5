//! The raw costs under the store's writes, for `hive bench`: one synced append to the
//! write-ahead log (the floor under every acknowledged write: the commit thread ends
//! each batch with one) and one durable redb commit (what the checkpointer pays per
//! checkpoint, for many batches). They live here because only the store opens its files.

use std::path::Path;
use std::time::{Duration, Instant};

use redb::{Database, Durability};

use super::error::{Error, Result};
use super::tables::CHUNKS;
use super::wal::{self, Wal, RECORD_HEAD};

/// Bytes in each row written: about one stored Agent (JSON with `managedFields`).
const ROW_BYTES: usize = 1024;

/// The file created inside `dir`.
const FILE_NAME: &str = "raw-commit-bench.redb";

/// Creates a fresh redb file in `dir` (which must exist and not hold one already), then
/// runs `n` write transactions of one row each with `Durability::Immediate` — the
/// setting the commit thread uses — and returns how long each took, from `begin_write`
/// to the end of `commit`. The file is removed afterwards (also on error); `dir` is not.
///
/// It uses the `revisions` table layout of a real store, but a separate file: hive's own
/// database is never opened here.
pub fn raw_commit_latencies(dir: &Path, n: usize) -> Result<Vec<Duration>> {
    let path = dir.join(FILE_NAME);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|source| Error::Io { path: path.clone(), source })?;
    let result = Database::builder().create_file(file).map_err(Error::db).and_then(|db| commits(&db, n));
    // Best effort: the caller's temporary directory is removed afterwards anyway.
    let _ = std::fs::remove_file(&path);
    result
}

/// The database name the append bench's log files are named after, inside `dir`.
const APPEND_NAME: &str = "raw-append-bench.redb";

/// Starts a write-ahead log in `dir` (named after a database that is never created) and
/// appends `n` records of one 1 KiB entry each, synced as the commit thread syncs them;
/// returns how long each took. The log's files are removed afterwards (also on error).
pub fn raw_append_latencies(dir: &Path, n: usize) -> Result<Vec<Duration>> {
    let db = dir.join(APPEND_NAME);
    let result = Wal::start(&db, 1, 16 << 20).and_then(|mut wal| {
        let mut latencies = Vec::with_capacity(n);
        let mut record = vec![b'x'; RECORD_HEAD + ROW_BYTES];
        for i in 0..n {
            if !wal.fits(ROW_BYTES) {
                wal.switch().map_err(|(path, source)| Error::Io { path, source })?;
            }
            let started = Instant::now();
            wal.append(&mut record, i as u64 + 1).map_err(|(path, source)| Error::Io { path, source })?;
            latencies.push(started.elapsed());
        }
        Ok(latencies)
    });
    // Best effort, as above.
    let _ = wal::remove(&db);
    result
}

fn commits(db: &Database, n: usize) -> Result<Vec<Duration>> {
    let value = vec![b'x'; ROW_BYTES];
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        let mut txn = db.begin_write().map_err(Error::db)?;
        txn.set_durability(Durability::Immediate);
        {
            let mut chunks = txn.open_table(CHUNKS).map_err(Error::db)?;
            chunks.insert(i as u64, value.as_slice()).map_err(Error::db)?;
        }
        txn.commit().map_err(Error::db)?;
        latencies.push(started.elapsed());
    }
    Ok(latencies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_one_latency_per_commit_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let latencies = raw_commit_latencies(dir.path(), 3).unwrap();
        assert_eq!(latencies.len(), 3);
        assert!(!dir.path().join(FILE_NAME).exists());
    }

    #[test]
    fn measures_one_latency_per_append_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let latencies = raw_append_latencies(dir.path(), 3).unwrap();
        assert_eq!(latencies.len(), 3);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the log's files are removed");
    }
}
