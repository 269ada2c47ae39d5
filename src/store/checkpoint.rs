//! The checkpointer: a thread that owns the redb file and applies the write-ahead log's
//! entries to it, many in one durable transaction, so that the log's files can be used
//! again. Writers never wait for it: a write is durable once its log record is synced
//! (`wal.rs`); the checkpointer runs beside the commit thread, as etcd's backend commits
//! its batches beside the WAL.
//!
//! It checkpoints when the entries waiting for it reach `checkpoint_bytes`, when the
//! oldest has waited `checkpoint_interval`, when the commit thread asks (it needs a log
//! file back, or has an entry too large for the log, or recovers from a failure) and
//! when the store shuts down. A failed transaction closes the database (redb refuses
//! every later one after an I/O error); the entries stay queued and the next checkpoint
//! reopens the file first, as the commit thread reopened it before the log existed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Instant;

use redb::Database;

use super::commit::Shared;
use super::disk;
use super::entry::Entry;
use super::error::{Error, Result};
use super::wal::RECORD_HEAD;

/// What the commit thread hands the checkpointer.
///
/// Entries come as log records: the record head's `RECORD_HEAD` bytes, then the entry.
enum Work {
    /// A record the log holds, synced: for the next checkpoint.
    Logged(Vec<u8>),
    /// Checkpoint now, with `direct` after the queued records (one the log does not
    /// hold, written here instead), and answer with the revision redb then has. When it
    /// fails, `direct` is dropped and the queued records stay.
    Now { direct: Option<Vec<u8>>, reply: mpsc::Sender<Result<u64>> },
}

/// The commit thread's handle on the checkpointer.
pub(super) struct Checkpointer {
    work: Option<mpsc::Sender<Work>>,
    thread: Option<JoinHandle<()>>,
    /// The revision redb holds durably.
    durable: Arc<AtomicU64>,
}

impl Checkpointer {
    /// Starts the thread on `db`, which holds revision `revision` durably.
    pub fn start(shared: Arc<Shared>, db: Database, revision: u64) -> Result<Checkpointer> {
        let (work, queue) = mpsc::channel();
        let durable = Arc::new(AtomicU64::new(revision));
        let thread_durable = durable.clone();
        let thread = std::thread::Builder::new()
            .name("hive-store-checkpoint".into())
            .spawn(move || {
                let mut state = State {
                    shared,
                    db: Some(db),
                    durable: thread_durable,
                    queued: Vec::new(),
                    queued_bytes: 0,
                    failed_at: None,
                };
                state.run(&queue);
            })
            .map_err(Error::Thread)?;
        Ok(Checkpointer { work: Some(work), thread: Some(thread), durable })
    }

    /// The revision redb holds durably.
    pub fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// Queues a record the log holds. False when the checkpointer is gone (it panicked):
    /// the entry is durable in the log, but will not reach redb before a restart.
    pub fn logged(&self, entry: Vec<u8>) -> bool {
        self.work.as_ref().is_some_and(|work| work.send(Work::Logged(entry)).is_ok())
    }

    /// Checkpoints every queued record, then `direct` (a record the log does not hold),
    /// and waits for it: the revision redb then holds, or why it failed.
    pub fn now(&self, direct: Option<Vec<u8>>) -> Result<u64> {
        let (reply, answer) = mpsc::channel();
        let gone = || Error::Unavailable { message: "the store's checkpointer has stopped".into() };
        let work = self.work.as_ref().ok_or_else(gone)?;
        work.send(Work::Now { direct, reply }).map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }

    /// Lets the thread checkpoint what is queued and close the database, and waits for it.
    pub fn stop(&mut self) {
        drop(self.work.take());
        if let Some(thread) = self.thread.take() {
            // A panic there was logged by the panic hook; the log keeps every entry.
            let _ = thread.join();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread's own state.
struct State {
    shared: Arc<Shared>,
    /// `None` after a failed transaction, until it is reopened.
    db: Option<Database>,
    durable: Arc<AtomicU64>,
    /// Entries not in redb yet, in log order, and when the oldest was queued.
    queued: Vec<(Instant, Vec<u8>)>,
    queued_bytes: usize,
    /// When the last checkpoint failed: the next try waits an interval after it.
    failed_at: Option<Instant>,
}

impl State {
    fn run(&mut self, queue: &mpsc::Receiver<Work>) {
        loop {
            let work = match self.next_checkpoint() {
                None => match queue.recv() {
                    Ok(work) => work,
                    Err(_) => break,
                },
                Some(at) => match queue.recv_timeout(at.saturating_duration_since(Instant::now())) {
                    Ok(work) => work,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        self.quietly();
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                },
            };
            match work {
                Work::Logged(entry) => {
                    self.queued_bytes += entry.len();
                    self.queued.push((Instant::now(), entry));
                    if self.queued_bytes >= self.shared.config.checkpoint_bytes && self.failed_at.is_none() {
                        self.quietly();
                    }
                }
                Work::Now { direct, reply } => {
                    let _ = reply.send(self.checkpoint(direct));
                }
            }
        }
        // Shutting down: everything queued goes to redb, so the next start replays nothing.
        #[cfg(test)]
        if self.shared.crash_on_stop.load(Ordering::SeqCst) {
            return;
        }
        self.quietly();
        drop(self.db.take());
    }

    /// When the next checkpoint is due: an interval after the oldest queued record was
    /// queued, and after the last failure. `None` with nothing queued.
    fn next_checkpoint(&self) -> Option<Instant> {
        let interval = self.shared.config.checkpoint_interval;
        let (queued, _) = self.queued.first()?;
        let due = *queued + interval;
        Some(self.failed_at.map_or(due, |failed| due.max(failed + interval)))
    }

    /// A checkpoint nobody waits for; a failure is logged and marks the store unhealthy.
    fn quietly(&mut self) {
        let _ = self.checkpoint(None);
    }

    /// Applies every queued entry and then `direct` in one durable transaction.
    fn checkpoint(&mut self, direct: Option<Vec<u8>>) -> Result<u64> {
        if self.queued.is_empty() && direct.is_none() && self.db.is_some() {
            return Ok(self.durable.load(Ordering::Acquire));
        }
        let started = Instant::now();
        let path: PathBuf = self.shared.config.path.clone();
        let result = self.write(direct.as_deref());
        match result {
            Ok(revision) => {
                self.failed_at = None;
                let entries = self.queued.len() + usize::from(direct.is_some());
                self.queued.clear();
                self.queued_bytes = 0;
                self.durable.store(revision, Ordering::Release);
                let metrics = &self.shared.config.metrics;
                metrics.checkpoint_duration.observe(crate::metrics::seconds(started.elapsed()));
                metrics.checkpoint_entries.observe(entries as f64);
                if self.shared.health_of(super::commit::Part::Checkpoint).is_some() {
                    tracing::info!(revision, "state database checkpointed again: writes work");
                    self.shared.set_health(super::commit::Part::Checkpoint, None);
                }
                Ok(revision)
            }
            Err(error) => {
                self.failed_at = Some(Instant::now());
                let why = error.to_string();
                if self.shared.health_of(super::commit::Part::Checkpoint).as_deref() != Some(why.as_str()) {
                    tracing::error!(
                        error = %error,
                        cause = %error.cause(),
                        path = %path.display(),
                        queued = self.queued.len(),
                        "store checkpoint failed; the write-ahead log keeps every acknowledged write"
                    );
                }
                self.shared.set_health(super::commit::Part::Checkpoint, Some(why));
                Err(error)
            }
        }
    }

    /// The transaction itself, reopening the database first when the last one failed.
    fn write(&mut self, direct: Option<&[u8]>) -> Result<u64> {
        let path = &self.shared.config.path;
        #[cfg(test)]
        if self.shared.disk_full.load(Ordering::SeqCst) {
            drop(self.db.take());
            return Err(Error::DiskFull { path: path.clone() });
        }
        let db = match self.db.take() {
            Some(db) => db,
            None => disk::reopen(path, self.durable.load(Ordering::Acquire))?,
        };
        let records = self.queued.iter().map(|(_, record)| record.as_slice()).chain(direct);
        let decoded = records.map(|record| {
            // The commit thread encoded these; one that does not decode is a bug there, and
            // must not reach the file.
            let entry = record.get(RECORD_HEAD..).unwrap_or_default();
            Entry::decode(entry)
                .map_err(|why| Error::Unavailable { message: format!("a log entry is malformed: {why}") })
        });
        let decoded: Result<Vec<Entry<'_>>> = decoded.collect();
        let written = decoded
            .and_then(|entries| disk::write_entries(&db, &entries).map_err(|e| Error::from_commit(path, e)));
        match written {
            Ok(revision) => {
                self.db = Some(db);
                Ok(revision.unwrap_or(self.durable.load(Ordering::Acquire)))
            }
            // The database is dropped: redb refuses every transaction after an I/O error.
            Err(e) => Err(e),
        }
    }
}
