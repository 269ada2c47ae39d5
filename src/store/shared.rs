//! What the store's handles, its commit thread and its checkpointer share: the cache,
//! the settings, the revision readers wait for, why writes fail while they do, and the
//! hooks tests fail them with.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::config::StoreConfig;
use super::error::Result;
use super::state::State;
use super::watch::{History, StoreEvent, Woken};

/// What the store handles and the commit thread share.
pub(super) struct Shared {
    pub state: RwLock<State>,
    pub config: StoreConfig,
    /// The revision of the last committed write, for readers that wait for one.
    pub revision: tokio::sync::watch::Sender<u64>,
    /// Why writes fail, while they do, by the part that failed: see [`Part`].
    health: std::sync::Mutex<Health>,
    /// The task that gives the watches the wakes a batch owes them (see [`Shared::hand`]);
    /// `None` when the store was opened outside a runtime.
    fanout: Option<tokio::sync::mpsc::UnboundedSender<Woken>>,
    /// Tests set this to make the next batch's log append fail.
    #[cfg(test)]
    pub fail_next_append: std::sync::atomic::AtomicBool,
    /// Tests set this to make every append, checkpoint and recovery fail with ENOSPC: a
    /// full disk until they clear it.
    #[cfg(test)]
    pub disk_full: std::sync::atomic::AtomicBool,
    /// Tests set this to make the commit thread dawdle after answering a failed batch,
    /// as a busy machine may deschedule it there.
    #[cfg(test)]
    pub dawdle_after_failure: std::sync::atomic::AtomicBool,
    /// Tests set this to stop the store as a crash would: the checkpointer skips its last
    /// checkpoint, so what it had not written is in the log alone.
    #[cfg(test)]
    pub crash_on_stop: std::sync::atomic::AtomicBool,
}

impl Shared {
    pub fn new(state: State, config: StoreConfig) -> Shared {
        Shared {
            revision: tokio::sync::watch::Sender::new(state.revision),
            health: std::sync::Mutex::new(Health::default()),
            fanout: fanout(),
            state: RwLock::new(state),
            config,
            #[cfg(test)]
            fail_next_append: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            disk_full: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            dawdle_after_failure: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            crash_on_stop: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The cache for reading. The cache is only changed in small steps after a durable
    /// commit, so a panic elsewhere while holding the lock leaves it usable.
    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why writes fail right now, if they do.
    pub fn unhealthy(&self) -> Option<String> {
        let health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        health.log.clone().or_else(|| health.checkpoint.clone())
    }

    /// Why `part` failed, while it does.
    pub fn health_of(&self, part: Part) -> Option<String> {
        let health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        match part {
            Part::Log => health.log.clone(),
            Part::Checkpoint => health.checkpoint.clone(),
        }
    }

    /// Records why `part` fails, or (`None`) that it works again.
    pub fn set_health(&self, part: Part, why: Option<String>) {
        let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        match part {
            Part::Log => health.log = why,
            Part::Checkpoint => health.checkpoint = why,
        }
    }

    /// Gives the wakes a batch owes its watches (`State::take_woken`), from one task of
    /// the runtime the store was opened on: woken from a worker, the watches' tasks
    /// queue on that worker and run one after another, where woken from the commit
    /// thread they would go through the runtime's shared queue as they came. Without
    /// that task (no runtime, or it has ended) they are woken here.
    pub fn hand(&self, woken: Woken) {
        if woken.is_empty() {
            return;
        }
        if let Some(fanout) = &self.fanout {
            if let Err(returned) = fanout.send(woken) {
                returned.0.wake();
            }
            return;
        }
        woken.wake();
    }

    /// The cache for writing (the commit thread, and watch registration).
    pub fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Starts the task that gives the watches their wakes, on the runtime of the caller, if
/// it has one. Each message is one batch's wakes; a batch is sent once the write lock is
/// released, so a message waits at most for the task's next turn.
fn fanout() -> Option<tokio::sync::mpsc::UnboundedSender<Woken>> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let (sender, mut batches) = tokio::sync::mpsc::unbounded_channel::<Woken>();
    runtime.spawn(async move {
        while let Some(woken) = batches.recv().await {
            woken.wake();
        }
    });
    Some(sender)
}

impl History for Shared {
    fn retained(&self, kind: &str, cursor: u64, end: u64, max: usize) -> Result<(Vec<StoreEvent>, u64)> {
        self.read().retained(kind, cursor, end, max)
    }
}

/// The two parts of the store that can fail a write, each with its own recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Part {
    /// An append to the write-ahead log failed: the log starts over once redb holds
    /// everything it acknowledged.
    Log,
    /// A checkpoint failed (redb closed the file): the next one reopens it.
    Checkpoint,
}

#[derive(Default)]
struct Health {
    log: Option<String>,
    checkpoint: Option<String>,
}
