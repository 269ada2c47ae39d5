//! Leadership of a daemon whose store is on etcd: it campaigns before it starts anything
//! that acts (the engine, the controllers, the fleet, the API), fences every write of
//! its store with its epoch once elected, and exits the moment its leadership ends —
//! as kube's components do — so that nothing it still holds in memory acts beside the
//! new leader. A daemon stopped on purpose resigns, and the next leader need not wait
//! for the lease to run out.

use std::net::SocketAddr;
use std::time::Duration;

use crate::store::etcd::lease::{Election, ElectionConfig, Leadership};
use crate::store::Store;

/// The exit status of a daemon whose leadership ended (EX_TEMPFAIL: run it again, and
/// it waits as a standby).
const LOST: i32 = 75;

/// This replica's leadership: kept until the daemon stops.
pub struct Lead {
    stop: tokio::sync::watch::Sender<bool>,
    election: tokio::task::JoinHandle<()>,
    watchdog: tokio::task::JoinHandle<()>,
    compactor: tokio::task::JoinHandle<()>,
}

/// Who this replica is, as the leader key says: host, API address and process.
pub fn identity(listen: SocketAddr) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    format!("{} {listen} pid {}", if host.is_empty() { "localhost" } else { host }, std::process::id())
}

/// Campaigns until this replica leads (saying who does meanwhile), then fences the
/// store with its epoch and watches the leadership.
pub async fn lead(store: &Store, identity: String) -> anyhow::Result<Lead> {
    let backend = store.etcd().expect("leadership is for a store on etcd").clone();
    let election = Election::new(
        backend.gateway().clone(),
        backend.internal_key("leader"),
        ElectionConfig::new(identity),
    );
    let mut state = election.subscribe();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move { election.run(stopped).await });
    let mut said = None;
    let fence = loop {
        match state.borrow_and_update().clone() {
            Leadership::Leader(fence) => break fence,
            Leadership::Follower(holder) => {
                if holder.is_some() && holder != said {
                    let who = holder.as_deref().unwrap_or_default();
                    tracing::info!(leader = who, "standing by: another replica leads");
                    crate::host::output::say(format_args!("hive: standing by; the leader is {who}"));
                    said = holder;
                }
            }
        }
        if state.changed().await.is_err() {
            anyhow::bail!("the leader election stopped before this replica was elected");
        }
    };
    tracing::info!(epoch = fence.epoch, "elected leader: starting");
    crate::host::output::say(format_args!("hive: leading (epoch {})", fence.epoch));
    backend.set_fence(Some(fence.clone()));
    let watchdog = tokio::spawn(async move {
        loop {
            if state.changed().await.is_err() || *state.borrow() != Leadership::Leader(fence.clone()) {
                tracing::error!(
                    epoch = fence.epoch,
                    "leadership lost: exiting so that only the new leader acts"
                );
                // Give the log line a moment to reach its file; then go at once.
                tokio::time::sleep(Duration::from_millis(50)).await;
                std::process::exit(LOST);
            }
        }
    });
    let compactor = tokio::spawn(compact(backend));
    Ok(Lead { stop, election: task, watchdog, compactor })
}

/// How often the leader compacts etcd's history (kube-apiserver: every 5 minutes).
const COMPACT_EVERY: Duration = Duration::from_secs(60);

/// Keeps etcd's history as long as the event log's retention, and no longer.
async fn compact(backend: std::sync::Arc<crate::store::etcd::Backend>) {
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

impl Lead {
    /// Gives the leadership up (the daemon is stopping): the next leader starts at once.
    pub async fn resign(self) {
        self.watchdog.abort();
        self.compactor.abort();
        let _ = self.stop.send(true);
        let _ = self.election.await;
    }
}
