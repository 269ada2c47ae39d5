//! Leadership of a daemon whose store is on etcd. Every replica serves the API from the
//! moment it starts; each campaigns for leadership beside it, and the elected one fences
//! every write of its store with its epoch, then starts what only the leader runs (the
//! scheduler, the controllers, the fleet — see `daemon::run`). A leader exits the moment
//! its leadership ends, as kube's components do, so that nothing it still holds in
//! memory acts beside the new leader; a replica that never led keeps serving. A daemon
//! stopped on purpose resigns, and the next leader need not wait for the lease to run out.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::server::forward::Leader;
use crate::store::etcd::lease::{ElectionConfig, Fence, Leadership};
use crate::store::etcd::Backend;
use crate::store::Store;

/// The exit status of a daemon whose leadership ended (EX_TEMPFAIL: run it again, and
/// it serves as a replica that does not lead).
const LOST: i32 = 75;

/// What the leader key holds: who leads and where its API is.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Holder {
    /// The replica's name (host and API address).
    name: String,
    /// Its API's URL, where other replicas forward what only the leader runs.
    url: String,
    /// Its process, for an operator reading the key.
    pid: u32,
}

/// This replica's name: its host and API address.
pub fn name(listen: SocketAddr) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let host = if host.is_empty() { "localhost" } else { host };
    format!("{host}/{listen}")
}

/// This replica's campaign: kept until the daemon stops.
pub struct Campaign {
    backend: std::sync::Arc<Backend>,
    stop: tokio::sync::watch::Sender<bool>,
    election: tokio::task::JoinHandle<()>,
    state: tokio::sync::watch::Receiver<Leadership>,
    leader: tokio::sync::watch::Receiver<Leader>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Campaign {
    /// Starts campaigning as replica `name`, whose API is at `url`.
    pub fn start(store: &Store, name: String, url: String) -> Campaign {
        let backend = store.etcd().expect("leadership is for a store on etcd").clone();
        let holder = Holder { name, url, pid: std::process::id() };
        let identity = serde_json::to_string(&holder).expect("a holder serializes");
        let election = backend.election(ElectionConfig::new(identity));
        let state = election.subscribe();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move { election.run(stopped).await });
        let (leader_tx, leader) = tokio::sync::watch::channel(Leader::Unknown);
        let mut following = state.clone();
        let follower = tokio::spawn(async move {
            let mut said = None;
            loop {
                let now = following.borrow_and_update().clone();
                let seen = match &now {
                    Leadership::Leader(_) => Leader::Me,
                    Leadership::Follower(Some(value)) => match serde_json::from_str::<Holder>(value) {
                        Ok(holder) => Leader::Other { name: holder.name, url: holder.url },
                        Err(_) => Leader::Unknown,
                    },
                    Leadership::Follower(None) => Leader::Unknown,
                };
                if let Leader::Other { name, url } = &seen {
                    if said.as_ref() != Some(name) {
                        tracing::info!(leader = %name, %url, "another replica leads");
                        crate::host::output::say(format_args!(
                            "hive: following; the leader is {name} ({url})"
                        ));
                        said = Some(name.clone());
                    }
                }
                leader_tx.send_replace(seen);
                if following.changed().await.is_err() {
                    return;
                }
            }
        });
        Campaign { backend, stop, election: task, state, leader, tasks: vec![follower] }
    }

    /// Who leads, as this replica follows it.
    pub fn leader(&self) -> tokio::sync::watch::Receiver<Leader> {
        self.leader.clone()
    }

    /// Waits until this replica is elected, then fences its store with the epoch and
    /// watches the leadership: when it ends, the process exits. Returns the epoch.
    pub async fn elected(&mut self) -> anyhow::Result<u64> {
        let fence = loop {
            if let Leadership::Leader(fence) = self.state.borrow_and_update().clone() {
                break fence;
            }
            if self.state.changed().await.is_err() {
                anyhow::bail!("the leader election stopped before this replica was elected");
            }
        };
        tracing::info!(epoch = fence.epoch, "elected leader: starting what only the leader runs");
        self.backend.set_fence(Some(fence.clone()));
        self.tasks.push(tokio::spawn(watchdog(self.state.clone(), fence.clone())));
        self.tasks.push(tokio::spawn(compact(self.backend.clone())));
        Ok(fence.epoch)
    }

    /// Gives the leadership up, or stops campaigning (the daemon is stopping): the next
    /// leader starts at once.
    pub async fn resign(self) {
        for task in &self.tasks {
            task.abort();
        }
        let _ = self.stop.send(true);
        let _ = self.election.await;
    }
}

/// Exits the process when the leadership of `fence` ends.
async fn watchdog(mut state: tokio::sync::watch::Receiver<Leadership>, fence: Fence) {
    loop {
        if state.changed().await.is_err() || *state.borrow() != Leadership::Leader(fence.clone()) {
            tracing::error!(epoch = fence.epoch, "leadership lost: exiting so that only the new leader acts");
            // Give the log line a moment to reach its file; then go at once.
            tokio::time::sleep(Duration::from_millis(50)).await;
            std::process::exit(LOST);
        }
    }
}

/// How often the leader compacts etcd's history (kube-apiserver: every 5 minutes).
const COMPACT_EVERY: Duration = Duration::from_secs(60);

/// Keeps etcd's history as long as the event log's retention, and no longer.
async fn compact(backend: std::sync::Arc<Backend>) {
    let mut every = tokio::time::interval(COMPACT_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        match backend.compact().await {
            Ok(Some(revision)) => tracing::debug!(revision, "compacted etcd's history"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot compact etcd's history; trying again later"),
        }
    }
}
