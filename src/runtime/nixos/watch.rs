//! What the driver believes of each container beyond what systemd says, and the rescan
//! that compares the two: a container is watched from the moment the driver starts it or
//! sees it running, until a requested stop; a watched container that systemd reports down
//! went down unrequested, which is published as `Exited { requested: false }` (the crash
//! signal of the daemon's crash-watch). A start, stop or kill marks its container busy,
//! and every change bumps an epoch, so a `systemctl show` that raced with one of them is
//! never mistaken for a crash.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, Weak};

use chrono::{DateTime, Utc};

use super::{Container, Inner, NixosRuntime, UnitState};
use crate::runtime::{Change, Exit, Generation, RuntimeEvent};

/// What the driver knows of one agent's container beyond what systemd says.
#[derive(Default)]
pub(super) struct Slot {
    /// Believed running: the rescan reports it when systemd says otherwise.
    pub(super) watched: bool,
    /// A start, stop or kill of this driver is under way; the rescan and adoption leave
    /// the container alone meanwhile.
    pub(super) busy: bool,
    /// Bumped on every change of the two above, so a rescan whose `systemctl show`
    /// raced with a lifecycle operation drops its finding.
    pub(super) epoch: u64,
    /// The last generation this driver created or swapped in.
    pub(super) generation: Option<Generation>,
    /// The last start or exit the driver saw.
    pub(super) since: Option<DateTime<Utc>>,
    pub(super) last_exit: Option<Exit>,
}

/// Marks a container busy while it lives (see [`Slot::busy`]).
pub(super) struct Busy<'a> {
    inner: &'a Inner,
    agent: String,
}

impl Busy<'_> {
    /// The container is known down; the rescan has nothing to report of it.
    pub(super) fn not_running(&self) {
        self.inner.slots().entry(self.agent.clone()).or_default().watched = false;
    }

    /// The operation left the container running.
    pub(super) fn running(&self, at: DateTime<Utc>) {
        let mut slots = self.inner.slots();
        let slot = slots.entry(self.agent.clone()).or_default();
        slot.watched = true;
        slot.since = Some(at);
    }

    /// The operation stopped the container.
    pub(super) fn stopped(&self, exit: &Exit) {
        let mut slots = self.inner.slots();
        let slot = slots.entry(self.agent.clone()).or_default();
        slot.watched = false;
        slot.since = Some(exit.at);
        slot.last_exit = Some(exit.clone());
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut slots = self.inner.slots();
        let slot = slots.entry(self.agent.clone()).or_default();
        slot.busy = false;
        slot.epoch += 1;
    }
}

impl Inner {
    pub(super) fn slots(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn begin(&self, c: &Container) -> Busy<'_> {
        let mut slots = self.slots();
        let slot = slots.entry(c.agent.clone()).or_default();
        slot.busy = true;
        slot.epoch += 1;
        Busy { inner: self, agent: c.agent.clone() }
    }

    pub(super) fn epoch(&self, agent: &str) -> u64 {
        self.slots().get(agent).map_or(0, |slot| slot.epoch)
    }

    pub(super) fn publish(&self, agent: &str, change: Change, at: DateTime<Utc>) {
        let _ = self.events.send(RuntimeEvent { agent: agent.into(), change, at });
    }
}

impl NixosRuntime {
    /// One rescan round: asks systemd about every container the driver believes
    /// running and publishes `Exited { requested: false }` for each that is not.
    pub async fn rescan(&self) {
        let watched: Vec<(String, u64)> = {
            let slots = self.inner.slots();
            slots
                .iter()
                .filter(|(_, s)| s.watched && !s.busy)
                .map(|(agent, s)| (agent.clone(), s.epoch))
                .collect()
        };
        for (agent, epoch) in watched {
            let Ok(c) = Container::new(&agent) else { continue };
            match self.unit_state(&c).await {
                Ok(state) => self.noticed(&c, epoch, &state),
                Err(error) => tracing::warn!(agent, %error, "rescan cannot read the container's state"),
            }
        }
    }

    /// Takes in what systemd said of `c` (asked when the slot's epoch was `epoch`): a
    /// running container the driver did not know of is watched from now on; a watched
    /// one that is not running went down without a request, which is published.
    pub(super) fn noticed(&self, c: &Container, epoch: u64, state: &UnitState) {
        let exit = {
            let mut slots = self.inner.slots();
            let slot = slots.entry(c.agent.clone()).or_default();
            if slot.busy || slot.epoch != epoch || slot.watched == state.running() {
                return;
            }
            slot.epoch += 1;
            slot.watched = state.running();
            if state.running() {
                slot.since = state.active_enter.or(slot.since);
                None
            } else {
                let exit = Exit {
                    code: None,
                    signal: None,
                    at: crate::host::now(),
                    requested: false,
                    stderr: Vec::new(),
                };
                slot.since = Some(exit.at);
                slot.last_exit = Some(exit.clone());
                Some(exit)
            }
        };
        match exit {
            None => self.ensure_rescan(),
            Some(exit) => {
                let state = &state.active_state;
                let (agent, container) = (&c.agent, &c.name);
                tracing::warn!(agent, container, %state, "container went down unrequested");
                self.inner.publish(&c.agent, Change::Exited(exit.clone()), exit.at);
            }
        }
    }

    /// Watches a container found running (see [`NixosRuntime::noticed`]).
    pub(super) fn adopt(&self, c: &Container) {
        {
            let mut slots = self.inner.slots();
            let slot = slots.entry(c.agent.clone()).or_default();
            if slot.busy || slot.watched {
                return;
            }
            slot.watched = true;
            slot.epoch += 1;
        }
        self.ensure_rescan();
    }

    /// Spawns the rescan task once, on the current tokio runtime.
    pub(super) fn ensure_rescan(&self) {
        if self.inner.rescan.swap(true, Ordering::SeqCst) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(rescan_task(Arc::downgrade(&self.inner)));
            }
            Err(_) => self.inner.rescan.store(false, Ordering::SeqCst),
        }
    }
}

/// The rescan task: a round every interval, for as long as the runtime lives.
async fn rescan_task(inner: Weak<Inner>) {
    loop {
        let Some(interval) = inner.upgrade().map(|inner| inner.config.rescan_interval) else { return };
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else { return };
        NixosRuntime { inner }.rescan().await;
    }
}
