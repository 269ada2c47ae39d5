//! The raw cost of one durable redb commit, for `hive bench`: the floor under every
//! acknowledged write, since the commit thread finishes each batch with one such commit.
//! It lives here because only the store opens a redb database.

use std::path::Path;
use std::time::{Duration, Instant};

use redb::{Database, Durability};

use super::error::{Error, Result};
use super::tables::REVISIONS;

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

fn commits(db: &Database, n: usize) -> Result<Vec<Duration>> {
    let value = vec![b'x'; ROW_BYTES];
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        let mut txn = db.begin_write().map_err(Error::db)?;
        txn.set_durability(Durability::Immediate);
        {
            let mut revisions = txn.open_table(REVISIONS).map_err(Error::db)?;
            revisions.insert(i as u64, value.as_slice()).map_err(Error::db)?;
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
}
