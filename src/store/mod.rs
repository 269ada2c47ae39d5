//! The versioned object store on redb (or on etcd, see [`etcd`]): group commit, event
//! log, watch cache.
//!
//! Objects are kind-agnostic JSON (the server types and validates them first), keyed by
//! plural resource name and object name. Every committed write gets the next value of
//! one global revision, which becomes the object's `metadata.resourceVersion` and the
//! revision of the event it produces. Writers hand mutations to one commit thread that
//! batches everything pending into one durable transaction; reads and watches are
//! served from memory.
//!
//! Architecture Invariant: this module is the only code in hive that opens the
//! database, and a write is acknowledged only after its transaction is durable; the
//! in-memory cache and watchers never see a change the file does not have.

pub mod bench;
mod checkpoint;
mod chunk;
mod commit;
mod config;
mod disk;
mod entry;
mod error;
pub mod etcd;
mod load;
mod mutation;
mod object;
mod record;
mod shared;
mod state;
mod tables;
mod upgrade;
mod wal;
mod watch;

#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{mpsc, oneshot};

pub use config::{Clock, StoreConfig};
pub use error::{Error, Result};
pub use mutation::{GroupLimit, Mutation, Outcome, Subresource};
pub use object::Obj;
pub use watch::{Encoded, EventType, Group, StoreEvent, Watch};

use checkpoint::Checkpointer;
use commit::{Log, Request};
use shared::Shared;
pub use state::Page;
use state::State;

/// How many write requests may wait for the commit thread before writers wait too.
const REQUEST_QUEUE: usize = 4096;

/// Handle to an open store. Cheap to clone; all clones share one database, cache and
/// commit thread.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    writer: Writer,
}

/// Where writes go: the embedded database's commit thread, or etcd.
enum Writer {
    Embedded {
        /// Taken by `shutdown`; once every sender is gone the commit thread drains and stops.
        requests: Mutex<Option<mpsc::Sender<Request>>>,
        /// Becomes true when the commit thread has stopped and closed the database.
        stopped: tokio::sync::watch::Receiver<bool>,
    },
    Etcd(Arc<etcd::Backend>),
}

/// Counters for benchmarks and diagnostics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreStats {
    /// Objects currently stored.
    pub objects: usize,
    /// Events retained for watches.
    pub events: usize,
    /// About how much memory the retained events hold (what `retention_bytes` bounds).
    pub event_bytes: usize,
    /// Revision of the last committed write.
    pub revision: u64,
    /// Events at or below this revision have been dropped by retention.
    pub compacted: u64,
}

impl Store {
    /// Opens (or creates) the database at `config.path`, loads it into memory and
    /// starts the commit thread. Blocks on file IO. A file that is unreadable, not a
    /// hive store, or of an unknown schema version is `Error::Corrupt`.
    pub fn open(config: StoreConfig) -> Result<Store> {
        let (db, wal, state) = disk::open(&config.path, config.wal_bytes)?;
        let revision = state.revision;
        let shared = Arc::new(Shared::new(state, config));
        let log = Log::new(wal, Checkpointer::start(shared.clone(), db, revision)?);
        let (requests, queue) = mpsc::channel(REQUEST_QUEUE);
        let (stopped_tx, stopped) = tokio::sync::watch::channel(false);
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("hive-store-commit".into())
            .spawn(move || commit::run(thread_shared, log, queue, stopped_tx))
            .map_err(Error::Thread)?;
        let writer = Writer::Embedded { requests: Mutex::new(Some(requests)), stopped };
        Ok(Store { inner: Arc::new(Inner { shared, writer }) })
    }

    /// Opens the store on the etcd cluster `etcd`: loads every object under its prefix
    /// and follows every later write (see [`etcd`]). `config.path` is not used.
    pub async fn open_etcd(config: StoreConfig, etcd: &etcd::EtcdConfig) -> Result<Store> {
        let (backend, shared) = etcd::Backend::open(etcd, config).await?;
        Ok(Store { inner: Arc::new(Inner { shared, writer: Writer::Etcd(backend) }) })
    }

    /// The etcd backend, when the store is on etcd: for leader election and fencing.
    pub fn etcd(&self) -> Option<&Arc<etcd::Backend>> {
        match &self.inner.writer {
            Writer::Etcd(backend) => Some(backend),
            Writer::Embedded { .. } => None,
        }
    }

    /// Replaces the database file at `path` (and nothing else) with an empty store whose
    /// revisions continue above the old one's, and returns that floor (0 when there was
    /// no file). For `hive serve --reset-state`; the store must not be open. `clock`
    /// gives the floor when the old file is unreadable (see `disk::reset`).
    pub fn reset(path: &Path, clock: &Clock) -> Result<u64> {
        disk::reset(path, clock.now())
    }

    /// Commits one mutation and returns what it did once it is durable. With `dry_run`
    /// the outcome (or error) is computed against the current state, with the revision
    /// the write would get if committed now, and nothing is written, revised or sent to
    /// watchers. Dropping the future after the mutation was queued does not cancel it.
    pub async fn commit(&self, mutation: Mutation, dry_run: bool) -> Result<Outcome> {
        let mut outcomes = self.commit_all(vec![mutation], dry_run).await?;
        Ok(outcomes.pop().expect("one outcome per mutation"))
    }

    /// Commits several mutations atomically: all of them in one transaction with
    /// consecutive revisions, each seeing the effects of the ones before it, or none of
    /// them if any fails (the first error is returned). For writes that must land
    /// together, such as an intent change and the Job it causes.
    pub async fn commit_all(&self, mutations: Vec<Mutation>, dry_run: bool) -> Result<Vec<Outcome>> {
        if mutations.is_empty() {
            return Ok(Vec::new());
        }
        if dry_run {
            let state = self.inner.shared.read();
            if state.closed {
                return Err(Error::Closed);
            }
            let now = self.inner.shared.config.clock.now();
            let lookup = |kind: &str, name: &str| state.get(kind, name);
            let planned = mutation::plan(&lookup, mutations, state.revision + 1, now)?;
            return Ok(planned.into_iter().map(|applied| applied.outcome).collect());
        }
        let requests = match &self.inner.writer {
            Writer::Etcd(backend) => return backend.commit(mutations).await,
            Writer::Embedded { requests, .. } => requests,
        };
        let requests = requests.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let requests = requests.ok_or(Error::Closed)?;
        let (reply, answer) = oneshot::channel();
        requests.send(Request { mutations, reply }).await.map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    /// How much one [`Store::commit_all`] may hold: `None` on the embedded store, which
    /// takes a transaction of any size; etcd's request limits on etcd
    /// ([`etcd::GROUP_LIMIT`]). A writer of more than fits splits its writes into groups
    /// and says what holds them together between groups (see `fleet::intents`).
    pub fn group_limit(&self) -> Option<GroupLimit> {
        match &self.inner.writer {
            Writer::Etcd(_) => Some(etcd::GROUP_LIMIT),
            Writer::Embedded { .. } => None,
        }
    }

    /// The current object `name` of `kind` (its JSON, as committed).
    pub fn get(&self, kind: &str, name: &str) -> Option<Obj> {
        self.inner.shared.read().get(kind, name)
    }

    /// The object `kind`/`name` as of now, not older than any write acknowledged before
    /// this call began, through whichever replica (what a client's GET needs to be
    /// linearizable). On the embedded store that is the cache; on etcd a quorum read of
    /// the key, as kube-apiserver's GET without a resourceVersion (another replica's
    /// write may not have reached this one's cache yet).
    pub async fn get_consistent(&self, kind: &str, name: &str) -> Result<Option<Obj>> {
        match &self.inner.writer {
            Writer::Etcd(backend) => backend.get_consistent(kind, name).await,
            Writer::Embedded { .. } => Ok(self.get(kind, name)),
        }
    }

    /// Waits until the cache holds every write acknowledged before this call began,
    /// through whichever replica: then a list or a watch served from it is as recent as
    /// a read of the durable copy. The embedded store's cache is that copy's; on etcd see
    /// `Backend::sync`.
    pub async fn sync(&self) -> Result<()> {
        match &self.inner.writer {
            Writer::Etcd(backend) => backend.sync().await,
            Writer::Embedded { .. } => Ok(()),
        }
    }

    /// Every object of `kind`, sorted by name, and the revision they are current at.
    pub fn list(&self, kind: &str) -> (u64, Vec<Obj>) {
        let state = self.inner.shared.read();
        (state.revision, state.list(kind))
    }

    /// The objects of `kind` named after `after` (every one for `None`), sorted by name,
    /// each with its name, and the revision they are current at: a page of a list.
    pub fn list_after(&self, kind: &str, after: Option<&str>) -> (u64, Vec<(Arc<str>, Obj)>) {
        let state = self.inner.shared.read();
        (state.revision, state.list_after(kind, after))
    }

    /// Up to `limit` objects of `kind` named after `after`, sorted by name, at one
    /// revision: a page of a list (see [`state::State::page`]).
    pub fn page(&self, kind: &str, after: Option<&str>, limit: Option<usize>) -> Page {
        self.inner.shared.read().page(kind, after, limit)
    }

    /// Up to `limit` objects of `kind` named after `after` that `keep` selects, sorted by
    /// name: a page of a selected list. It looks at objects only until it is full and
    /// one more matched, so its cost is what it returns and what it passes over, not
    /// the size of the kind; and it holds the cache's lock over at most `per_lock`
    /// objects at a time, so writes wait on it no longer than that.
    ///
    /// The page is at the revision of its first look. An object changed after that and
    /// looked at later is in it as changed: a watch from the page's revision replays
    /// the change (what a watcher sees after any list), and misses none.
    pub fn page_selected(
        &self,
        kind: &str,
        after: Option<&str>,
        limit: Option<usize>,
        per_lock: usize,
        mut keep: impl FnMut(&str, &Obj) -> bool,
    ) -> Page {
        let limit = limit.unwrap_or(usize::MAX);
        let mut page = Page { revision: self.inner.shared.read().revision, ..Page::default() };
        let mut from = after.map(Arc::<str>::from);
        loop {
            let state = self.inner.shared.read();
            match state.select(kind, from.as_deref(), limit, per_lock, &mut keep, &mut page) {
                Some(looked_at) => from = Some(looked_at),
                None => return page,
            }
        }
    }

    /// The current time on the store's clock: what every in-daemon writer stamps
    /// conditions, timestamps and events with, so tests can move it.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.inner.shared.config.clock.now()
    }

    /// The revision of the last committed write.
    pub fn revision(&self) -> u64 {
        self.inner.shared.read().revision
    }

    /// Waits until the store has committed `revision`, at most `timeout`; true when it
    /// has. For reads that name a revision newer than any committed yet.
    pub async fn wait_for_revision(&self, revision: u64, timeout: std::time::Duration) -> bool {
        let mut committed = self.inner.shared.revision.subscribe();
        let reached = async move { committed.wait_for(|current| *current >= revision).await.is_ok() };
        matches!(tokio::time::timeout(timeout, reached).await, Ok(true))
    }

    /// Every event of `kind` with a revision above `after`: the retained ones, then live
    /// ones. `Error::Expired` if retention already dropped some of them; `Error::Closed`
    /// after shutdown.
    ///
    /// On etcd, where one transaction's writes share a revision, the events *at*
    /// `after` come again too: a watcher cut off in the middle of them misses none.
    pub fn watch(&self, kind: &str, after: u64) -> Result<Watch> {
        self.watch_grouped(kind, after, None)
    }

    /// [`Store::watch`] in `group`: each event is handed to the watchers of a kind group
    /// by group, so watches of one group are woken one after another. The server groups
    /// the watches of one HTTP/2 connection: their tasks then tend to run on one worker
    /// before the connection's next write, and their frames leave in one write rather
    /// than one write for each worker that ran some of them (docs/benchmarks.md). The
    /// group also counts the watches still owing lines for what they were handed, which
    /// the connection waits on before it writes ([`Group`]).
    pub fn watch_grouped(&self, kind: &str, after: u64, group: Option<Arc<Group>>) -> Result<Watch> {
        let config = &self.inner.shared.config;
        let limits = (config.watch_buffer, config.watch_buffer_bytes);
        let mut state = self.inner.shared.write();
        let after = match &self.inner.writer {
            Writer::Etcd(_) if after > state.compacted => after - 1,
            _ => after,
        };
        state.watch(self.inner.shared.clone(), kind, after, limits, group)
    }

    /// Whether writes work: `Err(why)` from a failed transaction until the database has
    /// been reopened and took a write again. A failing store is retried by
    /// [`Store::probe`] and by every write.
    pub fn health(&self) -> std::result::Result<(), String> {
        if let Writer::Etcd(backend) = &self.inner.writer {
            return backend.health().map_or(Ok(()), Err);
        }
        match self.inner.shared.unhealthy() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Asks the commit thread to reopen a database whose writes failed (it does so
    /// before any batch) and reports the store's health afterwards. Writes nothing when
    /// the store is healthy.
    pub async fn probe(&self) -> std::result::Result<(), String> {
        if self.health().is_ok() {
            return Ok(());
        }
        let Writer::Embedded { requests, .. } = &self.inner.writer else { return self.health() };
        let requests = requests.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(requests) = requests else { return Err(Error::Closed.to_string()) };
        let (reply, answer) = oneshot::channel();
        requests
            .send(Request { mutations: Vec::new(), reply })
            .await
            .map_err(|_| Error::Closed.to_string())?;
        let _ = answer.await;
        self.health()
    }

    /// Counters: objects, retained events, revision, compacted revision.
    pub fn stats(&self) -> StoreStats {
        let state: &State = &self.inner.shared.read();
        StoreStats {
            objects: state.object_count(),
            events: state.log.len(),
            event_bytes: state.log_bytes,
            revision: state.revision,
            compacted: state.compacted,
        }
    }

    /// Whether [`Store::shutdown`] began: writes are refused with `Error::Closed` from then
    /// on, so a part still winding down can tell the daemon's stop from a failure.
    pub fn is_shut_down(&self) -> bool {
        match &self.inner.writer {
            Writer::Embedded { requests, .. } => {
                requests.lock().unwrap_or_else(PoisonError::into_inner).is_none()
            }
            Writer::Etcd(backend) => backend.is_shut_down(),
        }
    }

    /// Stops accepting writes, waits until every queued write is committed and the
    /// database is closed, and ends all watches. Other clones see `Error::Closed`.
    pub async fn shutdown(&self) {
        match &self.inner.writer {
            Writer::Embedded { requests, stopped } => {
                drop(requests.lock().unwrap_or_else(PoisonError::into_inner).take());
                let mut stopped = stopped.clone();
                // An error means the thread is gone already, which is what we wait for.
                let _ = stopped.wait_for(|stopped| *stopped).await;
            }
            Writer::Etcd(backend) => backend.shutdown().await,
        }
    }
}
