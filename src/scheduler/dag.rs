//! The in-memory state of one DAG: node states, which deps are still unsatisfied,
//! cancel-downstream, the roll-up, and which agent leases the DAG still needs.
//!
//! Everything here is O(1) or O(edges touched) per transition: each node counts its
//! unsatisfied deps, and the DAG counts nodes per state, so a 10,000-node chain never
//! rescans itself.

use std::collections::HashMap;
use std::sync::Arc;

use hive_api::job::{
    Edge, JobNodeKind, JobNodeState, JobNodeStatus, JobPhase, RetryPolicy, REASON_DEADLINE_EXCEEDED,
};
use hive_api::{JobSpec, Time};

mod failures;

use super::executor::{actions, Actions};
use super::log::NodeLog;
use super::snapshot::JobSnapshot;

/// Node states in a fixed order, to index `Dag::counts`.
const STATES: [JobNodeState; 5] = [
    JobNodeState::Queued,
    JobNodeState::Running,
    JobNodeState::Done,
    JobNodeState::Failed,
    JobNodeState::Cancelled,
];

fn slot(state: JobNodeState) -> usize {
    match state {
        JobNodeState::Queued => 0,
        JobNodeState::Running => 1,
        JobNodeState::Done => 2,
        JobNodeState::Failed => 3,
        JobNodeState::Cancelled => 4,
    }
}

/// The error of a node cancelled because its Job ran past its deadline.
const DEADLINE_CANCEL: &str = "cancelled: the Job ran past its deadline";
/// The error of a running build the engine stopped because its Job ran past its deadline.
pub(super) const DEADLINE_STOP: &str = "stopped: the Job ran past its deadline";

/// One node's live state.
#[derive(Debug)]
pub(super) struct NodeSlot {
    pub(super) state: JobNodeState,
    /// Deps not yet satisfied; the node is dep-ready at zero.
    waiting: u32,
    pub(super) step: Option<String>,
    started_at: Option<Time>,
    finished_at: Option<Time>,
    pub(super) error: Option<String>,
    /// Created when the node starts or someone asks for its log, whichever is first.
    pub(super) log: Option<Arc<NodeLog>>,
    /// While it runs: how to stop it, and whether its executor says it may be stopped
    /// now (a build, not a meta commit).
    pub(super) run: Option<RunHandle>,
    /// Tries started, from 1 once the node runs.
    pub(super) attempt: u32,
    /// While a failed node waits to retry: when it runs again.
    pub(super) retry_at: Option<Time>,
    dirty: bool,
}

/// How the engine stops a running node at its Job's deadline.
#[derive(Debug)]
pub(super) struct RunHandle {
    pub(super) abort: tokio::task::AbortHandle,
    pub(super) interruptible: Arc<std::sync::atomic::AtomicBool>,
}

/// How a node ended, as the engine reports it to [`Dag::finish`].
pub(super) enum Ending {
    /// Succeeded, with an optional final step label.
    Done(Option<String>),
    /// Failed with this message.
    Failed(String),
}

/// One submitted DAG.
#[derive(Debug)]
pub(super) struct Dag {
    /// Submit order; lower wins among competing ready nodes of the same rank.
    pub(super) seq: u64,
    /// Where the DAG's ready nodes compete: lower first. Its submit time less its
    /// priority times the aging step (see `Engine::rank`), so priority orders and age
    /// catches up.
    pub(super) rank: i128,
    /// When the DAG runs out of time (`spec.activeDeadlineSeconds`).
    pub(super) deadline: Option<tokio::time::Instant>,
    /// Set once the deadline passed before the DAG was terminal: the Job is Failed.
    deadline_exceeded: bool,
    /// Nodes waiting for a retry (queued again after a failed try).
    retrying: u32,
    pub(super) name: Arc<str>,
    pub(super) spec: Arc<JobSpec>,
    /// Each node's action, parsed once, here, when the scheduler takes the Job.
    pub(super) actions: Actions,
    pub(super) nodes: Vec<NodeSlot>,
    /// The host whose build slot each heavy node takes: `None` for the daemon's.
    pub(super) build_host: Vec<Option<Arc<str>>>,
    /// `dependents[i]`: nodes that depend on node `i`, with the edge.
    dependents: Vec<Vec<(u32, Edge)>>,
    counts: [u32; 5],
    submitted_at: Time,
    started_at: Option<Time>,
    finished_at: Option<Time>,
    /// Why the Job ended other than by a node's failure (its deadline, a cancel).
    message: Option<String>,
    /// The nodes that failed, in the order they did: the message names each.
    failed: Vec<u32>,
    pub(super) children: Vec<String>,
    /// Per agent, the lease-taking nodes still queued: the leases this DAG may yet take.
    pending_lease: HashMap<String, u32>,
    /// Agents whose lease this DAG holds, until it is terminal.
    pub(super) held: Vec<String>,
    /// Nodes changed since the last update (each listed once, see `NodeSlot::dirty`).
    dirty_nodes: Vec<u32>,
    /// Whether the DAG has anything to publish; `complete` asks for every node.
    dirty: bool,
    complete: bool,
}

impl Dag {
    /// A DAG whose nodes are all queued. `spec` must have passed validation (unique
    /// ids, deps resolve, no cycles).
    #[cfg(test)]
    pub(super) fn new(seq: u64, name: Arc<str>, spec: Arc<JobSpec>, now: Time) -> Dag {
        Dag::ranked(seq, i128::from(seq), None, name, spec, now)
    }

    /// [`Dag::new`] competing at `rank`, with a deadline.
    pub(super) fn ranked(
        seq: u64,
        rank: i128,
        deadline: Option<tokio::time::Instant>,
        name: Arc<str>,
        spec: Arc<JobSpec>,
        now: Time,
    ) -> Dag {
        let n = spec.nodes.len();
        let index: HashMap<&str, u32> =
            spec.nodes.iter().enumerate().map(|(i, node)| (node.id.as_str(), i as u32)).collect();
        let mut dependents: Vec<Vec<(u32, Edge)>> = vec![Vec::new(); n];
        let mut nodes = Vec::with_capacity(n);
        let mut pending_lease: HashMap<String, u32> = HashMap::new();
        for (i, node) in spec.nodes.iter().enumerate() {
            for dep in &node.deps {
                dependents[index[dep.node.as_str()] as usize].push((i as u32, dep.edge));
            }
            if let (true, Some(agent)) = (node.kind.takes_lease(), &node.agent) {
                *pending_lease.entry(agent.clone()).or_default() += 1;
            }
            nodes.push(NodeSlot {
                state: JobNodeState::Queued,
                waiting: node.deps.len() as u32,
                step: None,
                started_at: None,
                finished_at: None,
                error: None,
                log: None,
                run: None,
                attempt: 0,
                retry_at: None,
                dirty: false,
            });
        }
        Dag {
            seq,
            rank,
            deadline,
            deadline_exceeded: false,
            retrying: 0,
            name,
            actions: actions(&spec),
            build_host: vec![None; n],
            spec,
            nodes,
            dependents,
            counts: [n as u32, 0, 0, 0, 0],
            submitted_at: now,
            started_at: None,
            finished_at: None,
            message: None,
            failed: Vec::new(),
            children: Vec::new(),
            pending_lease,
            held: Vec::new(),
            dirty_nodes: Vec::new(),
            dirty: true,
            complete: true,
        }
    }

    /// Nodes with no deps: dep-ready as soon as the DAG is submitted.
    pub(super) fn roots(&self) -> impl Iterator<Item = u32> + '_ {
        self.nodes.iter().enumerate().filter(|(_, n)| n.waiting == 0).map(|(i, _)| i as u32)
    }

    /// The agent whose lease node `i` takes, if it takes one.
    pub(super) fn lease_of(&self, i: u32) -> Option<&str> {
        let node = &self.spec.nodes[i as usize];
        if node.kind.takes_lease() {
            node.agent.as_deref()
        } else {
            None
        }
    }

    /// Whether node `i` holds a build slot while it runs.
    pub(super) fn is_heavy(&self, i: u32) -> bool {
        self.spec.nodes[i as usize].kind.is_heavy()
    }

    /// Agents this DAG may still take the lease of and does not hold.
    pub(super) fn needs(&self) -> impl Iterator<Item = &str> + '_ {
        self.pending_lease
            .iter()
            .filter(|(agent, &count)| count > 0 && !self.held.iter().any(|h| h == *agent))
            .map(|(agent, _)| agent.as_str())
    }

    /// Whether this DAG may still take `agent`'s lease and does not hold it.
    pub(super) fn needs_agent(&self, agent: &str) -> bool {
        self.pending_lease.get(agent).is_some_and(|&c| c > 0) && !self.holds(agent)
    }

    /// Whether this DAG holds `agent`'s lease.
    pub(super) fn holds(&self, agent: &str) -> bool {
        self.held.iter().any(|h| h == agent)
    }

    fn set_state(&mut self, i: u32, state: JobNodeState) {
        let node = &mut self.nodes[i as usize];
        self.counts[slot(node.state)] -= 1;
        self.counts[slot(state)] += 1;
        if (node.state == JobNodeState::Queued) != (state == JobNodeState::Queued) {
            if let Some(agent) = self.spec.nodes[i as usize].agent.as_deref() {
                if let Some(count) = self.pending_lease.get_mut(agent) {
                    if self.spec.nodes[i as usize].kind.takes_lease() {
                        // Leaving the queue, or back in it to retry.
                        if state == JobNodeState::Queued {
                            *count += 1;
                        } else {
                            *count -= 1;
                        }
                    }
                }
            }
        }
        node.state = state;
        self.mark(i);
    }

    fn mark(&mut self, i: u32) {
        let node = &mut self.nodes[i as usize];
        if !node.dirty {
            node.dirty = true;
            self.dirty_nodes.push(i);
        }
        self.dirty = true;
    }

    /// Marks the Job-level fields changed (children, message).
    pub(super) fn touch(&mut self) {
        self.dirty = true;
    }

    /// Node `i` starts running with `log` as its build log.
    pub(super) fn start(&mut self, i: u32, now: Time, log: Arc<NodeLog>) {
        self.set_state(i, JobNodeState::Running);
        let node = &mut self.nodes[i as usize];
        node.started_at = Some(now);
        node.log = Some(log);
        node.attempt += 1;
        if node.retry_at.take().is_some() {
            self.retrying -= 1;
        }
        self.started_at.get_or_insert(now);
    }

    /// When node `i` started running, if it has.
    pub(super) fn node_started_at(&self, i: u32) -> Option<Time> {
        self.nodes[i as usize].started_at
    }

    /// Sets node `i`'s step label.
    pub(super) fn set_step(&mut self, i: u32, label: String) {
        if self.nodes[i as usize].state == JobNodeState::Running {
            self.nodes[i as usize].step = Some(label);
            self.mark(i);
        }
    }

    /// Node `i` ended. Dependents whose deps are now all satisfied are pushed to
    /// `ready`; AfterOk dependents of a failed node are cancelled, transitively.
    pub(super) fn finish(&mut self, i: u32, ending: Ending, now: Time, ready: &mut Vec<u32>) {
        let state = match ending {
            Ending::Done(step) => {
                if step.is_some() {
                    self.nodes[i as usize].step = step;
                }
                JobNodeState::Done
            }
            Ending::Failed(error) => {
                self.failed.push(i);
                self.nodes[i as usize].error = Some(error);
                JobNodeState::Failed
            }
        };
        self.set_state(i, state);
        let node = &mut self.nodes[i as usize];
        node.finished_at = Some(now);
        node.run = None;
        if let Some(log) = &node.log {
            log.close();
        }
        self.settle(i, now, ready);
    }

    /// How node `i` retries, if it does ([`JobNode::retry_policy`](hive_api::job::JobNode::retry_policy)).
    pub(super) fn retry_policy(&self, i: u32) -> Option<RetryPolicy> {
        self.spec.nodes[i as usize].retry_policy(self.spec.retry.as_ref())
    }

    /// Running node `i` failed with `error` and will run again at `at`: it is queued
    /// again (not dep-ready until the engine's retry timer puts it back), its error
    /// kept, its log open.
    pub(super) fn retry(&mut self, i: u32, error: String, at: Time) {
        self.set_state(i, JobNodeState::Queued);
        let node = &mut self.nodes[i as usize];
        node.error = Some(error);
        node.retry_at = Some(at);
        node.run = None;
        self.retrying += 1;
    }

    /// Whether the deadline passed.
    pub(super) fn deadline_exceeded(&self) -> bool {
        self.deadline_exceeded
    }

    /// Whether node `i` is running.
    pub(super) fn is_running(&self, i: u32) -> bool {
        self.nodes[i as usize].state == JobNodeState::Running
    }

    /// The Job ran past its deadline: it is Failed (`DeadlineExceeded`). Every queued
    /// node that is dep-ready is cancelled, but a Reconcile, which still converges its
    /// agent; from now on each queued node is decided once all its deps are terminal,
    /// whatever their outcome — a Reconcile then runs, any other node is cancelled — so
    /// a Reconcile never runs beside a node it follows. Pushes the Reconciles that became
    /// ready to `ready`; returns the running nodes the engine should stop (those whose
    /// executor says they may be: a build).
    pub(super) fn exceed_deadline(&mut self, now: Time, ready: &mut Vec<u32>) -> Vec<u32> {
        self.deadline_exceeded = true;
        let seconds = self.spec.active_deadline_seconds.unwrap_or_default();
        self.message =
            Some(format!("the Job ran past its deadline of {seconds}s (spec.activeDeadlineSeconds)"));
        self.dirty = true;
        let mut stop = Vec::new();
        for i in 0..self.nodes.len() as u32 {
            let node = &self.nodes[i as usize];
            match node.state {
                JobNodeState::Queued if node.waiting == 0 && !self.is_reconcile(i) => {
                    self.cancel_node(i, DEADLINE_CANCEL.to_string(), now);
                    self.settle(i, now, ready);
                }
                JobNodeState::Running => {
                    let stoppable = node
                        .run
                        .as_ref()
                        .is_some_and(|run| run.interruptible.load(std::sync::atomic::Ordering::Acquire));
                    if stoppable {
                        stop.push(i);
                    }
                }
                _ => {}
            }
        }
        stop
    }

    fn is_reconcile(&self, i: u32) -> bool {
        self.spec.nodes[i as usize].kind == JobNodeKind::Reconcile
    }

    /// Propagates the terminal state of node `i` to its dependents.
    fn settle(&mut self, i: u32, now: Time, ready: &mut Vec<u32>) {
        let mut stack = vec![i];
        while let Some(i) = stack.pop() {
            let ok = self.nodes[i as usize].state == JobNodeState::Done;
            for k in 0..self.dependents[i as usize].len() {
                let (d, edge) = self.dependents[i as usize][k];
                if self.nodes[d as usize].state != JobNodeState::Queued {
                    continue;
                }
                if self.deadline_exceeded {
                    let node = &mut self.nodes[d as usize];
                    node.waiting -= 1;
                    if node.waiting > 0 {
                        continue;
                    }
                    if self.is_reconcile(d) {
                        ready.push(d);
                    } else {
                        self.cancel_node(d, DEADLINE_CANCEL.to_string(), now);
                        stack.push(d);
                    }
                } else if ok || edge == Edge::AfterAny {
                    let node = &mut self.nodes[d as usize];
                    node.waiting -= 1;
                    if node.waiting == 0 {
                        ready.push(d);
                    }
                } else {
                    let why = match self.nodes[i as usize].state {
                        JobNodeState::Failed => "failed",
                        _ => "was cancelled",
                    };
                    let error = format!("cancelled: dep {} {why}", self.spec.nodes[i as usize].id);
                    self.cancel_node(d, error, now);
                    stack.push(d);
                }
            }
        }
    }

    fn cancel_node(&mut self, i: u32, error: String, now: Time) {
        self.set_state(i, JobNodeState::Cancelled);
        let node = &mut self.nodes[i as usize];
        if node.retry_at.take().is_some() {
            self.retrying -= 1;
        }
        node.error = Some(error);
        node.finished_at = Some(now);
        if let Some(log) = &node.log {
            log.close();
        }
    }

    /// Cancels every node (the DAG must be fully queued).
    pub(super) fn cancel_all(&mut self, reason: &str, now: Time) {
        for i in 0..self.nodes.len() as u32 {
            if self.nodes[i as usize].state == JobNodeState::Queued {
                self.cancel_node(i, reason.to_string(), now);
            }
        }
        self.message = Some(reason.to_string());
    }

    /// The roll-up phase: `Failed` once the deadline passed; `Running` while a node that
    /// failed waits to retry.
    pub(super) fn phase(&self) -> JobPhase {
        if self.deadline_exceeded {
            return JobPhase::Failed;
        }
        if self.retrying > 0 && self.counts[1] == 0 && self.counts[3] == 0 {
            return JobPhase::Running; // it ran, and waits to retry
        }
        JobPhase::roll_up(STATES.iter().zip(self.counts).filter(|(_, c)| *c > 0).map(|(s, _)| *s))
    }

    /// True when no node has started (and none was cancelled).
    pub(super) fn is_fully_queued(&self) -> bool {
        self.counts[0] as usize == self.nodes.len()
    }

    /// Whether a cancel may stop the DAG: none of its nodes has started, or none runs
    /// and some failed node waits to retry (a cancel stops the retries).
    pub(super) fn is_cancellable(&self) -> bool {
        self.is_fully_queued() || (self.counts[1] == 0 && self.retrying > 0)
    }

    /// True when every node is terminal.
    pub(super) fn is_terminal(&self) -> bool {
        self.counts[0] == 0 && self.counts[1] == 0
    }

    /// Whether [`Dag::set_finished`] ran.
    pub(super) fn is_finished(&self) -> bool {
        self.finished_at.is_some()
    }

    /// Records when the DAG became terminal.
    pub(super) fn set_finished(&mut self, now: Time) {
        self.finished_at = Some(now);
        self.dirty = true;
    }

    /// The Job's message: why it ended (its deadline, a cancel), then every failed node
    /// with its error ([`failures::message`]); `None` while neither happened.
    pub(super) fn message(&self) -> Option<String> {
        let failed: Vec<(&str, &str)> = self
            .failed
            .iter()
            .map(|&i| {
                let error = self.nodes[i as usize].error.as_deref().unwrap_or_default();
                (self.spec.nodes[i as usize].id.as_str(), error)
            })
            // A build the deadline stopped: the deadline already says why.
            .filter(|(_, error)| *error != DEADLINE_STOP)
            .collect();
        match (self.message.as_deref(), failures::message(&failed)) {
            (Some(why), Some(failures)) => Some(format!("{why}; {failures}")),
            (why, failures) => failures.or(why.map(str::to_string)),
        }
    }

    fn node_status(&self, i: usize) -> JobNodeStatus {
        let node = &self.nodes[i];
        let id = &self.spec.nodes[i].id;
        JobNodeStatus {
            id: id.clone(),
            state: node.state,
            step: node.step.clone(),
            started_at: node.started_at,
            finished_at: node.finished_at,
            error: node.error.clone(),
            attempt: (node.attempt > 0).then_some(node.attempt),
            retry_at: node.retry_at,
            log_ref: node.log.as_ref().map(|_| format!("{}/{id}", self.name)),
        }
    }

    fn header(&self, nodes: Vec<JobNodeStatus>, complete: bool) -> JobSnapshot {
        JobSnapshot {
            name: self.name.to_string(),
            template: self.spec.template,
            parent: self.spec.parent.clone(),
            phase: self.phase(),
            submitted_at: Some(self.submitted_at),
            started_at: self.started_at,
            finished_at: self.finished_at,
            message: self.message(),
            reason: self.deadline_exceeded.then(|| REASON_DEADLINE_EXCEEDED.to_string()),
            children: self.children.clone(),
            nodes,
            complete,
        }
    }

    /// Every node's status.
    pub(super) fn snapshot(&self) -> JobSnapshot {
        self.header((0..self.nodes.len()).map(|i| self.node_status(i)).collect(), true)
    }

    /// What changed since the last call, if anything.
    pub(super) fn take_update(&mut self) -> Option<JobSnapshot> {
        if !self.dirty {
            return None;
        }
        let snapshot = if self.complete {
            self.snapshot()
        } else {
            let nodes = self.dirty_nodes.iter().map(|&i| self.node_status(i as usize)).collect();
            self.header(nodes, false)
        };
        for i in std::mem::take(&mut self.dirty_nodes) {
            self.nodes[i as usize].dirty = false;
        }
        self.dirty = false;
        self.complete = false;
        Some(snapshot)
    }

    /// The node with this id.
    pub(super) fn node_index(&self, id: &str) -> Option<u32> {
        self.spec.nodes.iter().position(|n| n.id == id).map(|i| i as u32)
    }
}

#[cfg(test)]
mod tests {
    use hive_api::job::{JobNode, JobNodeKind};

    use super::*;

    fn now() -> Time {
        Time::from_unix(0).unwrap()
    }

    fn dag(nodes: Vec<JobNode>) -> Dag {
        Dag::new(1, "j".into(), Arc::new(JobSpec { nodes, ..Default::default() }), now())
    }

    fn states(dag: &Dag) -> Vec<JobNodeState> {
        dag.nodes.iter().map(|n| n.state).collect()
    }

    #[test]
    fn a_failed_swap_cancels_after_ok_and_readies_after_any() {
        use JobNodeKind::*;
        let mut d = dag(vec![
            JobNode::new("swap", Swap, Some("a")),
            JobNode::new("reconcile", Reconcile, Some("a")).after("swap", Edge::AfterAny),
            JobNode::new("after", Signal, Some("a")).after("swap", Edge::AfterOk),
            JobNode::new("after2", Drain, Some("a")).after("after", Edge::AfterOk),
        ]);
        assert_eq!(d.roots().collect::<Vec<_>>(), [0]);
        d.start(0, now(), NodeLog::new(16));
        assert_eq!(d.phase(), JobPhase::Running);
        let mut ready = Vec::new();
        d.finish(0, Ending::Failed("boom".into()), now(), &mut ready);
        assert_eq!(ready, [1]);
        use JobNodeState::*;
        assert_eq!(states(&d), [Failed, Queued, Cancelled, Cancelled]);
        assert_eq!(d.nodes[3].error.as_deref(), Some("cancelled: dep after was cancelled"));
        assert_eq!(d.phase(), JobPhase::Failed, "failed as soon as a node failed");
        assert!(d.needs_agent("a"));
        d.start(1, now(), NodeLog::new(16));
        assert!(!d.needs_agent("a"));
        d.finish(1, Ending::Done(None), now(), &mut ready);
        assert!(d.is_terminal());
        assert_eq!(d.phase(), JobPhase::Failed);
        assert_eq!(d.message().as_deref(), Some("node swap failed: boom"));
    }

    /// Regression (issue 32): the message named the first failed node only, so a
    /// Restart whose two agents failed read as if one had.
    #[test]
    fn the_message_names_every_failed_node() {
        use JobNodeKind::*;
        let mut d = dag(vec![
            JobNode::new("a/reconcile", Reconcile, Some("a")),
            JobNode::new("b/reconcile", Reconcile, Some("b")),
            JobNode::new("c/reconcile", Reconcile, Some("c")),
        ]);
        let mut ready = Vec::new();
        for i in 0..3 {
            d.start(i, now(), NodeLog::new(16));
        }
        d.finish(1, Ending::Failed("exit code 3".into()), now(), &mut ready);
        assert_eq!(d.message().as_deref(), Some("node b/reconcile failed: exit code 3"));
        d.finish(0, Ending::Done(None), now(), &mut ready);
        d.finish(2, Ending::Failed("no such program".into()), now(), &mut ready);
        let want = "2 nodes failed: b/reconcile: exit code 3; c/reconcile: no such program";
        assert_eq!(d.message().as_deref(), Some(want));
        assert_eq!(d.snapshot().message.as_deref(), Some(want));
    }

    #[test]
    fn a_failed_swap_rolls_up_failed_while_its_after_any_reconcile_runs() {
        use JobNodeKind::*;
        let mut d = dag(vec![
            JobNode::new("prebuild", Prebuild, Some("a")),
            JobNode::new("swap", Swap, Some("a")).after("prebuild", Edge::AfterOk),
            JobNode::new("reconcile", Reconcile, Some("a")).after("swap", Edge::AfterAny),
        ]);
        let mut ready = Vec::new();
        d.start(0, now(), NodeLog::new(16));
        d.finish(0, Ending::Done(None), now(), &mut ready);
        d.start(1, now(), NodeLog::new(16));
        d.finish(1, Ending::Failed("swap failed".into()), now(), &mut ready);
        assert_eq!(ready, [1, 2]);
        d.start(2, now(), NodeLog::new(16));
        assert_eq!(d.nodes[2].state, JobNodeState::Running);
        assert_eq!(d.phase(), JobPhase::Failed, "the document's roll-up: Failed if any node failed");
        assert!(!d.is_terminal(), "the Reconcile still runs");
        let snapshot = d.snapshot();
        assert_eq!(snapshot.phase, JobPhase::Failed);
        assert!(snapshot.finished_at.is_none(), "not settled while the Reconcile runs");
        d.finish(2, Ending::Done(None), now(), &mut ready);
        assert!(d.is_terminal());
        assert_eq!(d.phase(), JobPhase::Failed);
    }

    #[test]
    fn updates_are_complete_first_then_deltas() {
        let mut d = dag(vec![
            JobNode::new("a", JobNodeKind::Reconcile, Some("x")),
            JobNode::new("b", JobNodeKind::Reconcile, Some("x")).after("a", Edge::AfterOk),
        ]);
        let first = d.take_update().unwrap();
        assert!(first.complete);
        assert_eq!(first.nodes.len(), 2);
        assert!(d.take_update().is_none());
        d.start(0, now(), NodeLog::new(16));
        d.set_step(0, "working".into());
        let delta = d.take_update().unwrap();
        assert!(!delta.complete);
        assert_eq!(delta.nodes.len(), 1);
        assert_eq!(delta.nodes[0].step.as_deref(), Some("working"));
        assert_eq!(delta.nodes[0].log_ref.as_deref(), Some("j/a"));
    }
}
