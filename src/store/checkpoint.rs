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
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use redb::Database;

use super::disk;
use super::entry::Entry;
use super::error::{Error, Result};
use super::shared::{Part, Shared};
use super::wal::RECORD_HEAD;

/// What the commit thread hands the checkpointer, under one lock. A record does not
/// wake the checkpointer unless it sleeps with no checkpoint due (nothing queued) or the
/// records reach `checkpoint_bytes`: under load it wakes about once an interval, not once
/// a batch.
///
/// Records are log records: the record head's `RECORD_HEAD` bytes, then the entry.
#[derive(Default)]
struct Inbox {
    /// Records the log holds, synced, not taken yet, and when the first of them came.
    records: Vec<Vec<u8>>,
    bytes: usize,
    since: Option<Instant>,
    /// A checkpoint asked for now.
    now: Option<Asked>,
    /// The commit thread is done: checkpoint what is queued, close the database, stop.
    closed: bool,
    /// The checkpointer sleeps with no checkpoint due: the next record must wake it.
    idle: bool,
    /// The checkpointer's thread has ended (it panicked, or it stopped).
    gone: bool,
}

/// A checkpoint the commit thread waits for.
struct Asked {
    /// A record the log does not hold, written after the queued ones (dropped if the
    /// checkpoint fails).
    direct: Option<Vec<u8>>,
    /// Where the revision redb then holds, or why it failed, goes.
    reply: mpsc::Sender<Result<u64>>,
}

struct Mailbox {
    inbox: Mutex<Inbox>,
    wake: Condvar,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The commit thread's handle on the checkpointer.
pub(super) struct Checkpointer {
    mailbox: Arc<Mailbox>,
    thread: Option<JoinHandle<()>>,
    /// The revision redb holds durably.
    durable: Arc<AtomicU64>,
    /// `checkpoint_bytes`: queued records that wake the checkpointer.
    wake_at_bytes: usize,
}

impl Checkpointer {
    /// Starts the thread on `db`, which holds revision `revision` durably.
    pub fn start(shared: Arc<Shared>, db: Database, revision: u64) -> Result<Checkpointer> {
        let mailbox = Arc::new(Mailbox { inbox: Mutex::new(Inbox::default()), wake: Condvar::new() });
        let durable = Arc::new(AtomicU64::new(revision));
        let wake_at_bytes = shared.config.checkpoint_bytes;
        let (thread_mailbox, thread_durable) = (mailbox.clone(), durable.clone());
        let thread = std::thread::Builder::new()
            .name("hive-store-checkpoint".into())
            .spawn(move || {
                let _gone = Gone(thread_mailbox.clone());
                let mut state = State {
                    shared,
                    db: Some(db),
                    durable: thread_durable,
                    queued: Vec::new(),
                    queued_bytes: 0,
                    since: None,
                    failed_at: None,
                };
                state.run(&thread_mailbox);
            })
            .map_err(Error::Thread)?;
        Ok(Checkpointer { mailbox, thread: Some(thread), durable, wake_at_bytes })
    }

    /// The revision redb holds durably.
    pub fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// Queues a record the log holds. False when the checkpointer is gone (it panicked):
    /// the record is durable in the log, but will not reach redb before a restart.
    pub fn logged(&self, record: Vec<u8>) -> bool {
        let mut inbox = self.mailbox.lock();
        if inbox.gone {
            return false;
        }
        if inbox.records.is_empty() {
            inbox.since = Some(Instant::now());
        }
        inbox.bytes += record.len();
        inbox.records.push(record);
        if inbox.idle || inbox.bytes >= self.wake_at_bytes {
            inbox.idle = false;
            self.mailbox.wake.notify_one();
        }
        true
    }

    /// Checkpoints every queued record, then `direct` (a record the log does not hold),
    /// and waits for it: the revision redb then holds, or why it failed.
    pub fn now(&self, direct: Option<Vec<u8>>) -> Result<u64> {
        let gone = || Error::Unavailable { message: "the store's checkpointer has stopped".into() };
        let (reply, answer) = mpsc::channel();
        {
            let mut inbox = self.mailbox.lock();
            if inbox.gone {
                return Err(gone());
            }
            inbox.now = Some(Asked { direct, reply });
            self.mailbox.wake.notify_one();
        }
        answer.recv().map_err(|_| gone())?
    }

    /// Lets the thread checkpoint what is queued and close the database, and waits for it.
    pub fn stop(&mut self) {
        self.mailbox.lock().closed = true;
        self.mailbox.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // A panic there was logged by the panic hook; the log keeps every record.
            let _ = thread.join();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Marks the mailbox when the thread ends, however it ends, and drops a request for a
/// checkpoint it will not make (its asker then hears that the checkpointer stopped).
struct Gone(Arc<Mailbox>);

impl Drop for Gone {
    fn drop(&mut self) {
        let mut inbox = self.0.lock();
        inbox.gone = true;
        drop(inbox.now.take());
    }
}

/// What the thread does next.
enum Next {
    /// A checkpoint someone waits for.
    Now(Asked),
    /// A checkpoint that is due (by time or size).
    Due,
    /// The last checkpoint, then stop.
    Close,
}

/// The thread's own state.
struct State {
    shared: Arc<Shared>,
    /// `None` after a failed transaction, until it is reopened.
    db: Option<Database>,
    durable: Arc<AtomicU64>,
    /// Records not in redb yet, in log order, and when the oldest was queued.
    queued: Vec<Vec<u8>>,
    queued_bytes: usize,
    since: Option<Instant>,
    /// When the last checkpoint failed: the next try waits an interval after it.
    failed_at: Option<Instant>,
}

impl State {
    fn run(&mut self, mailbox: &Mailbox) {
        loop {
            match self.wait(mailbox) {
                Next::Now(Asked { direct, reply }) => {
                    let _ = reply.send(self.checkpoint(direct));
                }
                Next::Due => self.quietly(),
                Next::Close => break,
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

    /// Takes what the commit thread queued and sleeps until there is something to do.
    fn wait(&mut self, mailbox: &Mailbox) -> Next {
        let mut inbox = mailbox.lock();
        loop {
            if !inbox.records.is_empty() {
                self.since = self.since.or(inbox.since.take());
                self.queued_bytes += std::mem::take(&mut inbox.bytes);
                self.queued.append(&mut inbox.records);
            }
            if let Some(asked) = inbox.now.take() {
                return Next::Now(asked);
            }
            if inbox.closed {
                return Next::Close;
            }
            if self.queued_bytes >= self.shared.config.checkpoint_bytes && self.failed_at.is_none() {
                return Next::Due;
            }
            inbox.idle = false;
            inbox = match self.next_checkpoint() {
                None => {
                    inbox.idle = true;
                    mailbox.wake.wait(inbox).unwrap_or_else(PoisonError::into_inner)
                }
                Some(at) => {
                    let wait = at.saturating_duration_since(Instant::now());
                    if wait.is_zero() {
                        return Next::Due;
                    }
                    mailbox.wake.wait_timeout(inbox, wait).unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
    }

    /// When the next checkpoint is due: an interval after the oldest queued record was
    /// queued, and after the last failure. `None` with nothing queued.
    fn next_checkpoint(&self) -> Option<Instant> {
        let interval = self.shared.config.checkpoint_interval;
        let due = self.since? + interval;
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
                self.since = None;
                self.durable.store(revision, Ordering::Release);
                let metrics = &self.shared.config.metrics;
                metrics.checkpoint_duration.observe(crate::metrics::seconds(started.elapsed()));
                metrics.checkpoint_entries.observe(entries as f64);
                if self.shared.health_of(Part::Checkpoint).is_some() {
                    tracing::info!(revision, "state database checkpointed again: writes work");
                    self.shared.set_health(Part::Checkpoint, None);
                }
                Ok(revision)
            }
            Err(error) => {
                self.failed_at = Some(Instant::now());
                let why = error.to_string();
                if self.shared.health_of(Part::Checkpoint).as_deref() != Some(why.as_str()) {
                    tracing::error!(
                        error = %error,
                        cause = %error.cause(),
                        path = %path.display(),
                        queued = self.queued.len(),
                        "store checkpoint failed; the write-ahead log keeps every acknowledged write"
                    );
                }
                self.shared.set_health(Part::Checkpoint, Some(why));
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
        let records = self.queued.iter().map(Vec::as_slice).chain(direct);
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
