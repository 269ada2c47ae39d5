//! The job-DAG scheduler: one tokio task owns every submitted DAG in memory and runs
//! its nodes through an [`Executor`] as their deps and resources allow, publishing
//! status changes to a [`JobSink`] (the daemon mirrors them into the store's Job
//! objects).
//!
//! Semantics (the coordinator document's "Scheduler semantics" and "Cancel, history"):
//!
//! - A node is **ready** when it is queued, every dep is satisfied, and its resources
//!   are free. Deps are intra-DAG. `AfterOk` needs the dep to succeed; a failed or
//!   cancelled dep cancels the dependent (state `Cancelled`, not `Failed`), transitively.
//!   `AfterAny` runs once the dep is terminal either way (Swap → Reconcile).
//! - **Build slots** ([`SchedulerConfig::build_slots`], default 1) are held by heavy
//!   nodes ([`JobNodeKind::is_heavy`](hive_api::job::JobNodeKind::is_heavy)) while
//!   they run.
//! - The **per-agent lease** is exclusive across all DAGs: a DAG takes an agent's lease
//!   at its first node of that agent that
//!   [`takes_lease`](hive_api::job::JobNodeKind::takes_lease), and holds it until the
//!   DAG is terminal. Prebuild, MetaLock and WritePermFile are exempt and run while
//!   another DAG holds the lease. A DAG spanning agents holds one lease per agent.
//! - **Priority, then FIFO**: among ready nodes competing for a resource, the DAG of the
//!   lowest rank wins — its submit time less `spec.priority` aging steps
//!   ([`SchedulerConfig::aging`], a minute): higher priority first, submit order within
//!   a priority (all at 0: the document's FIFO), and a waiting DAG catches up one point
//!   per step, so none starves. See `engine::Engine::pass` for how a slot-waiting node
//!   keeps its lease from being taken by a later DAG.
//! - **Retries**: a failed node whose kind may retry
//!   ([`JobNodeKind::retry_safe`](hive_api::job::JobNodeKind::retry_safe)) and has tries
//!   left ([`JobNode::retry_policy`](hive_api::job::JobNode::retry_policy)) is queued
//!   again, its slot freed, and a timer makes it ready after its backoff; its attempt is
//!   in its status and log. A cancel or the deadline stops the retries.
//! - **Deadline** (`spec.activeDeadlineSeconds`): past it the DAG is Failed
//!   (`DeadlineExceeded`); its dep-ready queued nodes are cancelled, later ones decided as
//!   their deps end (a Reconcile runs, anything else is cancelled), and a running node
//!   whose executor marked itself interruptible ([`NodeContext::set_interruptible`], a
//!   build) is stopped: its task is dropped, which kills its subprocess.
//! - **No lease deadlock**: a lease grant that could close a cycle of DAGs each holding
//!   a lease the next one needs is deferred (see `resources::would_deadlock`). The
//!   coordinator document does not spell this out, but its multi-agent DAGs (a rebuild
//!   of `x, y` against a stop of `x, y`) can otherwise wait on each other forever.
//! - **Cancel** applies only while every node of a DAG is queued, or none runs and a
//!   failed node waits for its retry;
//!   [`SchedulerHandle::cancel_children`] cancels a parent's still-queued children. The
//!   result carries the cancelled spec and agents so the submit layer can revert
//!   `spec.wanted` of a cancelled power DAG.
//! - **Fan-out**: a node's executor may append child DAGs
//!   ([`NodeContext::fan_out`]); they are submitted when the node succeeds.
//! - **Roll-up** is [`JobPhase::roll_up`](hive_api::job::JobPhase::roll_up), the
//!   document's: `Failed` as soon as any node failed (even while a failed Swap's
//!   AfterAny Reconcile still runs), else Running / Queued / Cancelled / Done. A DAG is
//!   **settled** once every node is terminal: its `finished_at` is set then, its leases
//!   are released and it enters history ([`JobStatus::settled`](hive_api::job::JobStatus::settled)).
//! - **Prebuilt generations** belong to their DAG: the executor keys what a Prebuild
//!   built by (Job, agent), so when two rebuilds of one agent interleave (Prebuild takes
//!   no lease), each Swap deploys its own DAG's build.
//! - **History**: the [`SchedulerConfig::history_per_template`] (5) most recent
//!   terminal DAGs per template are kept; older ones are dropped and reported as
//!   [`JobUpdate::Removed`]. The history begins with the terminal Jobs earlier daemon
//!   runs left ([`Scheduler::start_after`]), so the bound holds across restarts. Jobs
//!   also age out of the store by their TTL (`jobs::expiry`), which the scheduler does
//!   not know of: removing one already deleted is a no-op.
//! - Each node has a **step label** and a bounded **build log** that can be followed
//!   while it runs ([`SchedulerHandle::log`]).
//! - The **transient guard**: [`SchedulerHandle::leased_agents`] is the set of agents
//!   whose lease some DAG holds; their state changes are expected, not crashes.
//!
//! The queue is in memory only, by design: after a restart the daemon marks unfinished
//! Jobs interrupted and the boot reconcile re-derives the work.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use hive_api::job::JobTemplate;
use hive_api::JobSpec;
use tokio::sync::{mpsc, oneshot, watch};

mod dag;
mod engine;
mod error;
mod executor;
mod history;
mod log;
mod resources;
mod snapshot;

pub mod bench;
#[cfg(test)]
mod tests;

pub use error::{Error, NodeError, Result};
pub use executor::{Actions, Executor, NodeContext, NodeOutcome, NodeRun};
pub use log::{LogFollower, NodeLog};
pub use resources::LeasedAgents;
pub use snapshot::{JobSink, JobSnapshot, JobUpdate, NullSink};

use engine::{Engine, Msg};
use resources::Resources;

/// How long a waiting Job takes to gain one point of priority.
pub const DEFAULT_AGING: std::time::Duration = std::time::Duration::from_secs(60);

/// Tunables of the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// How many heavy nodes may run at once (`buildSlots`); at least 1.
    pub build_slots: usize,
    /// Bytes of build log kept per node; older bytes are dropped with a marker.
    pub log_limit: usize,
    /// Terminal Jobs kept per template.
    pub history_per_template: usize,
    /// Where node durations, lease waits and build-slot use are recorded.
    pub metrics: crate::metrics::SchedulerMetrics,
    /// Which host builds an agent, when not the daemon's: an agent placed on a fleet node
    /// builds there, on that node's slots instead of `build_slots`.
    pub build_hosts: BuildHosts,
    /// How long a waiting Job takes to gain one point of `spec.priority` (the aging
    /// that keeps a low priority from starving): a minute.
    pub aging: std::time::Duration,
}

/// Where the heavy nodes of an agent run, when not on the daemon's host: the host's name
/// and how many build slots it has. Asked once per heavy node, when its Job is taken
/// (a move's Job is submitted after the placement edit, so its Create builds on the new
/// host).
#[derive(Clone, Default)]
pub struct BuildHosts(Option<Arc<HostOf>>);

/// The host that builds an agent and its build slots; `None` for the daemon's host.
type HostOf = dyn Fn(&str) -> Option<(String, usize)> + Send + Sync;

impl BuildHosts {
    /// Hosts as `host_of` says, per agent.
    pub fn new(host_of: impl Fn(&str) -> Option<(String, usize)> + Send + Sync + 'static) -> BuildHosts {
        BuildHosts(Some(Arc::new(host_of)))
    }

    /// The host that builds `agent` and its slots; `None` for the daemon's host.
    pub(crate) fn of(&self, agent: &str) -> Option<(String, usize)> {
        self.0.as_ref().and_then(|host_of| host_of(agent))
    }
}

impl std::fmt::Debug for BuildHosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "BuildHosts(..)" } else { "BuildHosts(daemon only)" })
    }
}

impl PartialEq for BuildHosts {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

impl Eq for BuildHosts {}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            build_slots: 1,
            log_limit: 1 << 20,
            history_per_template: 5,
            metrics: crate::metrics::SchedulerMetrics::default(),
            build_hosts: BuildHosts::default(),
            aging: DEFAULT_AGING,
        }
    }
}

/// A Job cancelled while fully queued: what the caller needs to undo its intent
/// (a cancelled power DAG reverts `spec.wanted` of its agents to the observed state).
#[derive(Debug, Clone, PartialEq)]
pub struct CancelledJob {
    /// The Job's name.
    pub name: String,
    /// Its template (`Start`, `Stop` … are power DAGs).
    pub template: JobTemplate,
    /// Its spec as submitted.
    pub spec: Arc<JobSpec>,
    /// The agents its nodes act on, each once, in node order.
    pub agents: Vec<String>,
}

impl CancelledJob {
    fn of(name: &str, spec: &Arc<JobSpec>) -> CancelledJob {
        let mut agents: Vec<String> = Vec::new();
        for agent in spec.nodes.iter().filter_map(|n| n.agent.as_ref()) {
            if !agents.contains(agent) {
                agents.push(agent.clone());
            }
        }
        CancelledJob { name: name.to_string(), template: spec.template, spec: spec.clone(), agents }
    }
}

/// Starts the scheduler task.
#[derive(Debug)]
pub struct Scheduler;

impl Scheduler {
    /// Spawns the scheduler task on the current tokio runtime and returns its handle.
    /// The task ends at [`SchedulerHandle::shutdown`], or once every handle is dropped
    /// and no node is running.
    pub fn start<E: Executor, S: JobSink>(executor: E, sink: S, config: SchedulerConfig) -> SchedulerHandle {
        Scheduler::start_after(executor, sink, config, Vec::new())
    }

    /// [`Scheduler::start`] after an earlier daemon run: the history begins with
    /// `settled`, the terminal Jobs that run left in the store, oldest first. Those past
    /// the kept number per template are reported [`JobUpdate::Removed`] at once, before
    /// any other update; the rest fall out as this run's Jobs settle.
    pub fn start_after<E: Executor, S: JobSink>(
        executor: E,
        sink: S,
        config: SchedulerConfig,
        settled: Vec<SettledJob>,
    ) -> SchedulerHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let (resources, leased) = Resources::new(config.build_slots);
        config.metrics.build_slots.set(config.build_slots as i64);
        let mut engine = Engine::new(executor, sink, config, tx.downgrade(), resources);
        engine.adopt(settled);
        tokio::spawn(engine.run(rx));
        SchedulerHandle { tx, leased }
    }
}

/// A terminal Job an earlier daemon run left in the store: where the history of
/// [`Scheduler::start_after`] begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettledJob {
    /// The Job's name.
    pub name: String,
    /// Its template: the history is kept per template.
    pub template: JobTemplate,
}

/// A cheap-to-clone handle to the scheduler task.
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    tx: mpsc::UnboundedSender<Msg>,
    leased: watch::Receiver<LeasedAgents>,
}

impl SchedulerHandle {
    async fn ask<T>(&self, msg: impl FnOnce(oneshot::Sender<T>) -> Msg) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(msg(reply)).map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)
    }

    /// Validates the DAG (names, unique node ids, agents where needed, deps that
    /// resolve, no cycles — the Job kind's own validation but the params) and enqueues
    /// it under `name`. Validation runs on the caller's task, not the scheduler's. Each
    /// node's params are parsed when it is taken ([`NodeRun::action`]): a node whose
    /// params do not parse — in a Job stored before they were checked — fails alone,
    /// naming why, and the Job settles as any other.
    pub async fn submit(&self, name: impl Into<String>, spec: JobSpec) -> Result<()> {
        let name = name.into();
        let mut errors = hive_api::validation::Errors::default();
        hive_api::validation::name(&mut errors, "metadata.name", &name);
        spec.validate_graph(&mut errors);
        if !errors.is_empty() {
            return Err(Error::Invalid { name, errors: errors.0 });
        }
        self.ask(|reply| Msg::Submit { name, spec: Box::new(spec), reply }).await?
    }

    /// Cancels a Job none of whose nodes has started ([`Error::NotCancellable`]
    /// otherwise).
    pub async fn cancel(&self, name: &str) -> Result<CancelledJob> {
        let name = name.to_string();
        self.ask(|reply| Msg::Cancel { name, reply }).await?
    }

    /// Cancels the still fully queued children (fan-outs) of Job `name`; children that
    /// already started are left alone. Returns those cancelled.
    pub async fn cancel_children(&self, name: &str) -> Result<Vec<CancelledJob>> {
        let name = name.to_string();
        self.ask(|reply| Msg::CancelChildren { name, reply }).await?
    }

    /// The complete status of Job `name` (queued, running or in history).
    pub async fn snapshot(&self, name: &str) -> Result<JobSnapshot> {
        let name = name.to_string();
        self.ask(|reply| Msg::Snapshot { name, reply }).await?
    }

    /// Whether a Job named `name` is queued or running (not settled): a new Job of that
    /// name waits until it settles.
    pub async fn holds_unsettled(&self, name: &str) -> Result<bool> {
        Ok(self.settled(vec![name.to_string()]).await?.get(name) == Some(&false))
    }

    /// Of the Jobs `names`, those the scheduler holds (queued, running, history), each
    /// with whether it has settled (every node terminal): what a controller asks about
    /// the few Jobs of its object, without a snapshot of every DAG.
    pub async fn settled(&self, names: Vec<String>) -> Result<HashMap<String, bool>> {
        self.ask(|reply| Msg::Settled { names, reply }).await
    }

    /// Counts Jobs that settled without reaching this scheduler (refused by the intake,
    /// cancelled before a claim) in the history of their template, so the bound of terminal
    /// Jobs per template holds for them too: the oldest past it are removed.
    pub fn settled_elsewhere(&self, jobs: Vec<SettledJob>) {
        let _ = self.tx.send(Msg::Adopt { jobs });
    }

    /// Every Job the scheduler holds (queued, running, history), in submit order.
    pub async fn list(&self) -> Result<Vec<JobSnapshot>> {
        self.ask(|reply| Msg::List { reply }).await
    }

    /// Node `node` of Job `job`'s build log so far, and a follower of later appends
    /// (`None` once the node is terminal). Works for a queued node too: its follower
    /// starts receiving when the node runs.
    pub async fn log(&self, job: &str, node: &str) -> Result<(Vec<u8>, Option<LogFollower>)> {
        let (job, node) = (job.to_string(), node.to_string());
        let log = self.ask(|reply| Msg::Log { job, node, reply }).await??;
        Ok(log.read())
    }

    /// Agents whose lease some DAG holds right now.
    pub fn leased_agents(&self) -> HashSet<String> {
        (**self.leased.borrow()).clone()
    }

    /// A receiver that follows [`SchedulerHandle::leased_agents`] as it changes.
    pub fn watch_leased_agents(&self) -> watch::Receiver<LeasedAgents> {
        self.leased.clone()
    }

    /// Stops the scheduler task, abandoning running nodes (their Jobs are left
    /// non-terminal, to be marked interrupted at the next start). Idempotent.
    pub async fn shutdown(&self) {
        let _ = self.ask(|reply| Msg::Shutdown { reply }).await;
    }
}
