//! The commit thread: it drains pending write requests into one batch, plans each
//! against the cache plus the batch's earlier effects, appends every successful change
//! to the write-ahead log as one synced record, and only then updates the cache, feeds
//! watchers and answers the writers (group commit). The checkpointer takes the record
//! to redb later (`checkpoint.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::checkpoint::Checkpointer;
use super::config::StoreConfig;
use super::disk;
use super::entry::BatchWrite;
use super::error::{Error, Result};
use super::mutation::{plan, Change, Mutation, Outcome};
use super::shared::{Part, Shared};
use super::state::State;
use super::tables::object_key;
use super::wal::{Wal, RECORD_HEAD};
use super::watch::EventType;
use super::Obj;

/// One writer's all-or-nothing group of mutations and where its answer goes.
pub(super) struct Request {
    pub mutations: Vec<Mutation>,
    pub reply: oneshot::Sender<Result<Vec<Outcome>>>,
}

/// Runs the commit thread until every request sender is gone and the queue is drained.
///
/// A failed append or checkpoint makes the store unhealthy ([`Shared::unhealthy`] says
/// why). The next batch recovers first ([`Log::recover`]); until that works (space is
/// freed on a full disk, say) every request is refused at once. Nothing acknowledged is
/// lost and nothing half-applied: a batch is in the log, the cache and the watchers
/// entirely or not at all.
pub(super) fn run(
    shared: Arc<Shared>,
    log: Log,
    mut requests: mpsc::Receiver<Request>,
    stopped: tokio::sync::watch::Sender<bool>,
) {
    let mut exit = Exit { shared, log, stopped };
    let max_batch = exit.shared.config.max_batch.max(1);
    let mut last = Last { writers: 0, answered: std::time::Instant::now(), took: Duration::ZERO };
    while let Some(first) = requests.blocking_recv() {
        let mut batch = vec![first];
        take_queued(&mut requests, &mut batch, max_batch);
        gather(&mut requests, &mut batch, max_batch, &last);
        if exit.shared.unhealthy().is_some() {
            if let Err(e) = exit.log.recover(&exit.shared) {
                tracing::warn!(
                    error = %e,
                    path = %exit.shared.config.path.display(),
                    "state database still unusable; refusing writes"
                );
                for request in batch {
                    let _ = request.reply.send(Err(e.again()));
                }
                continue;
            }
        }
        let (started, size) = (std::time::Instant::now(), batch.len());
        commit_batch(&exit.shared, &mut exit.log, batch);
        let answered = std::time::Instant::now();
        last = Last { writers: size, answered, took: answered - started };
        let metrics = &exit.shared.config.metrics;
        metrics.commit_duration.observe(crate::metrics::seconds(last.took));
        metrics.batch_size.observe(size as f64);
    }
}

/// The batch before: how many writers it answered, when, and how long it took.
struct Last {
    writers: usize,
    answered: std::time::Instant,
    took: Duration,
}

/// The longest a batch waits for more writers (see [`gather`]).
const GATHER_MAX: Duration = Duration::from_micros(400);

/// How often a gathering batch looks for more writers.
const GATHER_POLL: Duration = Duration::from_micros(40);

/// Moves every queued request into `batch`, up to `max_batch`.
fn take_queued(requests: &mut mpsc::Receiver<Request>, batch: &mut Vec<Request>, max_batch: usize) {
    while batch.len() < max_batch {
        match requests.try_recv() {
            Ok(request) => batch.push(request),
            Err(_) => break,
        }
    }
}

/// Group commit under load: the writers the last batch answered write again a moment
/// later, each once its answer reached it. A batch started the instant the first of them
/// is back would commit alone and leave the rest to wait a whole commit (batches then
/// alternate, one large, one small). So while writers are coming back — the first arrived
/// within one commit's time of the last answers — the batch waits for as many writers as
/// the last one had, for at most a quarter of the last commit's time (and `GATHER_MAX`).
/// A lone writer never waits: its last batch had one writer, and it is here.
fn gather(requests: &mut mpsc::Receiver<Request>, batch: &mut Vec<Request>, max_batch: usize, last: &Last) {
    let want = last.writers.min(max_batch);
    if batch.len() >= want || last.answered.elapsed() > last.took {
        return;
    }
    let deadline = std::time::Instant::now() + (last.took / 4).min(GATHER_MAX);
    while batch.len() < want && std::time::Instant::now() < deadline {
        std::thread::sleep(GATHER_POLL);
        take_queued(requests, batch, max_batch);
    }
}

/// Lets the checkpointer write everything logged and close the database, ends every
/// watch and tells `shutdown` — also if the thread panics.
struct Exit {
    shared: Arc<Shared>,
    log: Log,
    stopped: tokio::sync::watch::Sender<bool>,
}

impl Drop for Exit {
    fn drop(&mut self) {
        // Release the file lock first, so whoever awaited shutdown can reopen it.
        self.log.checkpointer.stop();
        if self.log.broken {
            // Whatever a failed append left must not be read at the next start; redb has
            // everything else (unless the last checkpoint failed too: then it stays).
            if self.log.checkpointer.durable() == self.shared.read().revision {
                let _ = self.log.wal.reset();
            }
        }
        self.shared.write().close();
        let _ = self.stopped.send(true);
    }
}

/// Where the commit thread writes: the write-ahead log, and the checkpointer that takes
/// its entries to redb.
pub(super) struct Log {
    pub wal: Wal,
    pub checkpointer: Checkpointer,
    /// Set when an append failed: what the log's files hold past their last good record
    /// is unknown until it starts over.
    broken: bool,
}

impl Log {
    pub fn new(wal: Wal, checkpointer: Checkpointer) -> Log {
        Log { wal, checkpointer, broken: false }
    }

    /// Makes one batch's entry durable: appended to the log and synced, or, when it is
    /// larger than a log file, checkpointed to redb with everything before it. `record`
    /// is the record head's room followed by the entry, whose last revision is `last`.
    /// A failure marks the store unhealthy before it returns.
    fn write(&mut self, shared: &Shared, mut record: Vec<u8>, last: u64) -> Result<()> {
        let len = record.len() - RECORD_HEAD;
        if len > self.wal.max_entry() {
            // Too large for the log: written to redb at once, after every entry logged
            // before it, and the log starts over past it (its files must not skip it).
            self.checkpointer.now(Some(record))?;
            return self.reset(shared);
        }
        if !self.wal.fits(len) {
            if self.wal.inactive_last() > self.checkpointer.durable() {
                self.checkpointer.now(None)?;
            }
            self.wal.switch().map_err(|e| self.failed(shared, e))?;
        }
        if let Err(e) = self.append(shared, &mut record, last) {
            if let Err((path, e)) = self.wal.discard_failed() {
                tracing::warn!(path = %path.display(), error = %e, "cannot undo a failed write-ahead log append");
            }
            return Err(self.failed(shared, e));
        }
        if !self.checkpointer.logged(record) {
            // Durable in the log, so the write stands; redb gets it at the next start.
            shared.set_health(Part::Checkpoint, Some("the store's checkpointer has stopped".into()));
        }
        Ok(())
    }

    /// The append; tests can make it fail.
    fn append(
        &mut self,
        shared: &Shared,
        record: &mut [u8],
        last: u64,
    ) -> Result<(), (std::path::PathBuf, std::io::Error)> {
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering::SeqCst;
            let path = || shared.config.path.clone();
            if shared.disk_full.load(SeqCst) {
                return Err((path(), std::io::Error::from_raw_os_error(28)));
            }
            // The worst case: the record reaches the file, but its sync reports an error.
            self.wal.fail_sync = shared.fail_next_append.swap(false, SeqCst);
        }
        #[cfg(not(test))]
        let _ = shared;
        self.wal.append(record, last)
    }

    /// A failed append or switch: the log is broken until it starts over, and the store
    /// unhealthy before any writer hears of it.
    fn failed(&mut self, shared: &Shared, (path, source): (std::path::PathBuf, std::io::Error)) -> Error {
        self.broken = true;
        let error = Error::from_log(path, source);
        tracing::error!(error = %error, cause = %error.cause(), "write-ahead log append failed");
        shared.set_health(Part::Log, Some(error.to_string()));
        error
    }

    /// Starts the log over under new generations; redb holds everything it had.
    fn reset(&mut self, shared: &Shared) -> Result<()> {
        self.wal.reset().map_err(|e| self.failed(shared, e))?;
        self.broken = false;
        Ok(())
    }

    /// Makes a store whose append or checkpoint failed take writes again: the disk has
    /// room, every logged entry is in redb (reopening it if a checkpoint failed), and a
    /// broken log starts over. Marks the store healthy when it worked.
    pub fn recover(&mut self, shared: &Shared) -> Result<()> {
        #[cfg(test)]
        if shared.disk_full.load(std::sync::atomic::Ordering::SeqCst) {
            let full = Error::DiskFull { path: shared.config.path.clone() };
            shared.set_health(Part::Log, Some(full.to_string()));
            return Err(full);
        }
        if self.broken {
            disk::has_room(&shared.config.path)?;
        }
        self.checkpointer.now(None)?;
        if self.broken {
            self.reset(shared)?;
        }
        if shared.health_of(Part::Log).is_some() {
            tracing::info!(path = %shared.config.path.display(), "write-ahead log started over: writes work again");
            shared.set_health(Part::Log, None);
        }
        Ok(())
    }
}

/// Plans, logs and publishes one batch, then answers every request in it. If the log
/// write fails, every request gets the error and the cache stays as it was.
pub(super) fn commit_batch(shared: &Shared, log: &mut Log, batch: Vec<Request>) {
    let now = shared.config.clock.now();
    let time_ms = now.timestamp_millis();
    let mut replies = Vec::with_capacity(batch.len());
    let mut changes: Vec<Change> = Vec::new();
    {
        let state = shared.read();
        // Objects as the batch's earlier writes left them; `None` = deleted.
        let mut written: HashMap<String, Option<Obj>> = HashMap::new();
        for request in batch {
            let next_revision = state.revision + changes.len() as u64 + 1;
            let lookup = |kind: &str, name: &str| match written.get(&object_key(kind, name)) {
                Some(object) => object.clone(),
                None => state.get(kind, name),
            };
            let result = plan(&lookup, request.mutations, next_revision, now).map(|planned| {
                let mut outcomes = Vec::with_capacity(planned.len());
                for applied in planned {
                    if let Some(change) = applied.change {
                        let object = (change.type_ != EventType::Deleted).then(|| change.object.clone());
                        written.insert(object_key(change.kind, &change.name), object);
                        changes.push(change);
                    }
                    outcomes.push(applied.outcome);
                }
                outcomes
            });
            replies.push((request.reply, result));
        }
    }

    if let Some(last) = changes.last() {
        let last = last.revision;
        // Only this thread changes the log, so it is as the plan saw it.
        let (compacted, stored, garbage) = {
            let state = shared.read();
            let compacted = compacted_after(&state, &shared.config, &changes, time_ms);
            let (stored, garbage) = rows(&state, &changes, compacted);
            (compacted, stored, garbage)
        };
        let batch = BatchWrite { changes: &changes, stored: &stored, garbage: &garbage, time_ms, compacted };
        let mut record = vec![0; RECORD_HEAD];
        super::entry::encode_into(&batch, &mut record);
        if let Err(error) = log.write(shared, record, last) {
            tracing::error!(
                error = %error,
                cause = %error.cause(),
                path = %shared.config.path.display(),
                writers = replies.len(),
                "store commit failed"
            );
            for (reply, _) in replies {
                let _ = reply.send(Err(error.again()));
            }
            #[cfg(test)]
            if shared.dawdle_after_failure.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            return;
        }
        let (revision, woken) = {
            let mut state = shared.write();
            for change in &changes {
                state.apply(change, time_ms);
            }
            state.compact(compacted);
            (state.revision, state.take_woken())
        };
        shared.hand(woken);
        shared.revision.send_replace(revision);
    }
    for (reply, result) in replies {
        // A writer that gave up waiting still had its write applied; nobody to tell.
        let _ = reply.send(result);
    }
}

/// Which of the batch's revisions get a row, and which stored rows the batch makes
/// garbage, once retention is at `compacted`. A revision's row lives while the revision
/// is retained or is its object's current one (`tables::REVISIONS`).
fn rows(state: &State, changes: &[Change], compacted: u64) -> (Vec<bool>, Vec<u64>) {
    let superseded: std::collections::HashSet<u64> = changes.iter().filter_map(|c| c.supersedes).collect();
    let stored = changes
        .iter()
        .map(|c| {
            c.revision > compacted || (c.type_ != EventType::Deleted && !superseded.contains(&c.revision))
        })
        .collect();
    // Objects' current revisions that retention had passed, replaced or deleted now...
    let mut garbage: Vec<u64> = superseded.iter().copied().filter(|&r| r <= state.compacted).collect();
    // ...and the retained revisions retention passes now that no object is at any more.
    let passed = usize::try_from(compacted.saturating_sub(state.compacted)).unwrap_or(usize::MAX);
    for entry in state.log.iter().take(passed) {
        if !entry.current || superseded.contains(&entry.event.revision) {
            garbage.push(entry.event.revision);
        }
    }
    garbage.sort_unstable();
    (stored, garbage)
}

/// The compacted revision once `new` events are appended at `time_ms`: keep at most
/// `retention_events`, none older than `retention_age`, and no more than
/// `retention_bytes` of them (the oldest go first, possibly some of `new` itself).
pub(super) fn compacted_after(state: &State, config: &StoreConfig, new: &[Change], time_ms: i64) -> u64 {
    let total = state.log.len() + new.len();
    let mut dropped = total.saturating_sub(config.retention_events);
    let max_age_ms = i64::try_from(config.retention_age.as_millis()).unwrap_or(i64::MAX);
    let cutoff = time_ms.saturating_sub(max_age_ms);
    // The batch's own events are stamped `time_ms`, never before the cutoff.
    while dropped < state.log.len() && state.log[dropped].time_ms < cutoff {
        dropped += 1;
    }
    let cost = |i: usize| match i.checked_sub(state.log.len()) {
        None => state.log[i].event.cost,
        Some(j) => new[j].cost,
    };
    let mut bytes = state.log_bytes + new.iter().map(|c| c.cost).sum::<usize>();
    bytes -= (0..dropped.min(total)).map(cost).sum::<usize>();
    while dropped < total && bytes > config.retention_bytes {
        bytes -= cost(dropped);
        dropped += 1;
    }
    state.compacted + dropped as u64
}
