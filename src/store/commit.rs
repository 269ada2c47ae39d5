//! The commit thread: it drains pending write requests into one batch, plans each
//! against the cache plus the batch's earlier effects, writes every successful change
//! in one durable redb transaction, and only then updates the cache, feeds watchers
//! and answers the writers (group commit).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use redb::Database;
use tokio::sync::{mpsc, oneshot};

use super::config::StoreConfig;
use super::disk::{self, BatchWrite};
use super::error::{Error, Result};
use super::mutation::{plan, Change, Mutation, Outcome};
use super::state::State;
use super::tables::object_key;
use super::watch::{EventType, History, StoreEvent};
use super::Obj;

/// What the store handles and the commit thread share.
pub(super) struct Shared {
    pub state: RwLock<State>,
    pub config: StoreConfig,
    /// The revision of the last committed write, for readers that wait for one.
    pub revision: tokio::sync::watch::Sender<u64>,
    /// Why writes fail, while they do: set when a transaction fails (the database is
    /// closed then, see [`run`]), cleared once it is reopened and a write went through.
    pub unhealthy: std::sync::Mutex<Option<String>>,
    /// Tests set this to make the next batch's redb commit fail.
    #[cfg(test)]
    pub fail_next_commit: std::sync::atomic::AtomicBool,
    /// Tests set this to make every commit, and every reopen, fail with ENOSPC: a full
    /// disk until they clear it.
    #[cfg(test)]
    pub disk_full: std::sync::atomic::AtomicBool,
    /// Tests set this to make the commit thread dawdle after answering a failed batch,
    /// as a busy machine may deschedule it there.
    #[cfg(test)]
    pub dawdle_after_failure: std::sync::atomic::AtomicBool,
}

impl Shared {
    pub fn new(state: State, config: StoreConfig) -> Shared {
        Shared {
            revision: tokio::sync::watch::Sender::new(state.revision),
            unhealthy: std::sync::Mutex::new(None),
            state: RwLock::new(state),
            config,
            #[cfg(test)]
            fail_next_commit: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            disk_full: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            dawdle_after_failure: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The cache for reading. The cache is only changed in small steps after a durable
    /// commit, so a panic elsewhere while holding the lock leaves it usable.
    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why writes fail right now, if they do.
    pub fn unhealthy(&self) -> Option<String> {
        self.unhealthy.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn set_unhealthy(&self, why: Option<String>) {
        *self.unhealthy.lock().unwrap_or_else(PoisonError::into_inner) = why;
    }

    /// The cache for writing (the commit thread, and watch registration).
    pub fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl History for Shared {
    fn retained(&self, kind: &str, cursor: u64, end: u64, max: usize) -> Result<(Vec<StoreEvent>, u64)> {
        self.read().retained(kind, cursor, end, max)
    }
}

/// One writer's all-or-nothing group of mutations and where its answer goes.
pub(super) struct Request {
    pub mutations: Vec<Mutation>,
    pub reply: oneshot::Sender<Result<Vec<Outcome>>>,
}

/// Runs the commit thread until every request sender is gone and the queue is drained.
///
/// A failed transaction closes the database: redb refuses every later one after an
/// I/O error ("re-open the database"), and the file itself is as the last successful
/// commit left it. The next batch reopens it first and proves a write goes through; until
/// that works (space is freed on a full disk, say) every request is refused at once, and
/// [`Shared::unhealthy`] says why. Nothing acknowledged is lost and nothing half-applied:
/// a batch is in the file, the cache and the watchers entirely or not at all.
pub(super) fn run(
    shared: Arc<Shared>,
    db: Database,
    mut requests: mpsc::Receiver<Request>,
    stopped: tokio::sync::watch::Sender<bool>,
) {
    let mut exit = Exit { shared, db: Some(db), stopped };
    let max_batch = exit.shared.config.max_batch.max(1);
    let mut last = Last { writers: 0, answered: std::time::Instant::now(), took: Duration::ZERO };
    while let Some(first) = requests.blocking_recv() {
        let mut batch = vec![first];
        take_queued(&mut requests, &mut batch, max_batch);
        gather(&mut requests, &mut batch, max_batch, &last);
        if exit.db.is_none() {
            let revision = exit.shared.read().revision;
            #[cfg(test)]
            if exit.shared.disk_full.load(std::sync::atomic::Ordering::SeqCst) {
                let full = Error::DiskFull { path: exit.shared.config.path.clone() };
                exit.shared.set_unhealthy(Some(full.to_string()));
                for request in batch {
                    let _ = request.reply.send(Err(full.again()));
                }
                continue;
            }
            match disk::reopen(&exit.shared.config.path, revision) {
                Ok(db) => {
                    tracing::info!(revision, "state database reopened: writes work again");
                    exit.shared.set_unhealthy(None);
                    exit.db = Some(db);
                }
                Err(e) => {
                    let why = format!("{e}");
                    tracing::warn!(
                        error = %why,
                        path = %exit.shared.config.path.display(),
                        "state database still unusable; refusing writes"
                    );
                    exit.shared.set_unhealthy(Some(why));
                    for request in batch {
                        let _ = request.reply.send(Err(e.again()));
                    }
                    continue;
                }
            }
        }
        let Some(db) = &exit.db else { continue };
        let (started, size) = (std::time::Instant::now(), batch.len());
        let committed = commit_batch(&exit.shared, db, batch);
        let answered = std::time::Instant::now();
        last = Last { writers: size, answered, took: answered - started };
        let metrics = &exit.shared.config.metrics;
        metrics.commit_duration.observe(crate::metrics::seconds(last.took));
        metrics.batch_size.observe(size as f64);
        if committed.is_err() {
            // `commit_batch` marked the store unhealthy; the next batch reopens the file.
            drop(exit.db.take());
        }
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

/// Closes the database, ends every watch and tells `shutdown` — also if the thread
/// panics.
struct Exit {
    shared: Arc<Shared>,
    db: Option<Database>,
    stopped: tokio::sync::watch::Sender<bool>,
}

impl Drop for Exit {
    fn drop(&mut self) {
        // Release the file lock first, so whoever awaited shutdown can reopen it.
        drop(self.db.take());
        self.shared.write().close();
        let _ = self.stopped.send(true);
    }
}

/// Plans, writes and publishes one batch, then answers every request in it. If the
/// transaction fails, every request gets the error, the cache stays as it was, and the
/// error's text is returned: the database must be reopened before the next batch.
pub(super) fn commit_batch(shared: &Shared, db: &Database, batch: Vec<Request>) -> Result<(), String> {
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

    if !changes.is_empty() {
        // Only this thread changes the log, so it is as the plan saw it.
        let (compacted, stored, garbage) = {
            let state = shared.read();
            let compacted = compacted_after(&state, &shared.config, &changes, time_ms);
            let (stored, garbage) = rows(&state, &changes, compacted);
            (compacted, stored, garbage)
        };
        let batch = BatchWrite { changes: &changes, stored: &stored, garbage: &garbage, time_ms, compacted };
        if let Err(e) = write(shared, db, &batch) {
            let error = Error::from_commit(&shared.config.path, e);
            tracing::error!(
                error = %error,
                cause = %error.cause(),
                path = %shared.config.path.display(),
                writers = replies.len(),
                "store commit failed"
            );
            let why = format!("{error}");
            // Unhealthy before any writer hears of it: a probe sent the moment a client
            // got its error must not find the store healthy.
            shared.set_unhealthy(Some(why.clone()));
            for (reply, _) in replies {
                let _ = reply.send(Err(error.again()));
            }
            #[cfg(test)]
            if shared.dawdle_after_failure.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            return Err(why);
        }
        let revision = {
            let mut state = shared.write();
            for change in &changes {
                state.apply(change, time_ms);
            }
            state.compact(compacted);
            state.revision
        };
        shared.revision.send_replace(revision);
    }
    for (reply, result) in replies {
        // A writer that gave up waiting still had its write applied; nobody to tell.
        let _ = reply.send(result);
    }
    Ok(())
}

/// The batch's transaction; tests can make it fail.
fn write(shared: &Shared, db: &Database, batch: &BatchWrite<'_>) -> Result<(), Arc<redb::Error>> {
    #[cfg(test)]
    {
        if shared.disk_full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Arc::new(redb::Error::Io(std::io::Error::from_raw_os_error(28))));
        }
        if shared.fail_next_commit.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Err(Arc::new(redb::Error::Io(std::io::Error::other("injected commit failure"))));
        }
    }
    #[cfg(not(test))]
    let _ = shared;
    disk::write_batch(db, batch)
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
fn compacted_after(state: &State, config: &StoreConfig, new: &[Change], time_ms: i64) -> u64 {
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
