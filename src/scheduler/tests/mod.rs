//! Scheduler tests through the public handle, with a scripted executor: every node run
//! is handed to the test, which decides when and how it ends. No timers, no sleeps —
//! the harness waits for the scheduler to go quiet by asking it.

use hive_api::job::{Edge, JobNode, JobNodeKind, JobNodeState, JobPhase, JobTemplate};
use hive_api::JobSpec;
use tokio::sync::{mpsc, oneshot};

use super::{
    Executor, JobUpdate, NodeContext, NodeError, NodeOutcome, NodeRun, Scheduler, SchedulerConfig,
    SchedulerHandle, SettledJob,
};

mod deadlines;
mod priorities;
mod props;
mod retries;
mod rules;

/// How a scripted node ends.
#[derive(Debug)]
pub(super) enum Finish {
    Ok,
    Fail(String),
    /// Succeeds after fanning out these children.
    FanOut(Vec<JobSpec>),
    Panic,
}

/// A node the scheduler started, waiting for the test to end it.
pub(super) struct Started {
    pub(super) job: String,
    pub(super) node: String,
    pub(super) ctx: NodeContext,
    done: oneshot::Sender<Finish>,
}

struct Scripted(mpsc::UnboundedSender<Started>);

impl Executor for Scripted {
    async fn run(&self, node: NodeRun) -> Result<NodeOutcome, NodeError> {
        let (done, rx) = oneshot::channel();
        let started =
            Started { job: node.job.to_string(), node: node.id().to_string(), ctx: node.ctx.clone(), done };
        let _ = self.0.send(started);
        match rx.await {
            Ok(Finish::Ok) => Ok(NodeOutcome::default()),
            Ok(Finish::Fail(message)) => Err(NodeError::Failed(message)),
            Ok(Finish::FanOut(children)) => {
                for child in children {
                    node.ctx.fan_out(child).expect("valid child");
                }
                Ok(NodeOutcome { step: Some("fanned out".into()) })
            }
            Ok(Finish::Panic) => panic!("scripted panic"),
            Err(_) => Err(NodeError::failed("test dropped the node")),
        }
    }
}

/// The scheduler under test, the nodes it is running, and its published updates.
pub(super) struct Harness {
    pub(super) sched: SchedulerHandle,
    started: mpsc::UnboundedReceiver<Started>,
    pub(super) updates: mpsc::UnboundedReceiver<Vec<JobUpdate>>,
    /// Started nodes the test has not ended yet, in start order.
    pub(super) running: Vec<Started>,
}

impl Harness {
    pub(super) fn new(config: SchedulerConfig) -> Harness {
        Harness::after(config, Vec::new())
    }

    /// A scheduler whose history begins with `settled` (an earlier run's Jobs).
    pub(super) fn after(config: SchedulerConfig, settled: Vec<SettledJob>) -> Harness {
        let (tx, started) = mpsc::unbounded_channel();
        let (sink, updates) = mpsc::unbounded_channel();
        let sched = Scheduler::start_after(Scripted(tx), sink, config, settled);
        Harness { sched, started, updates, running: Vec::new() }
    }

    /// The names reported removed since the last look.
    pub(super) fn removed(&mut self) -> Vec<String> {
        let mut removed = Vec::new();
        while let Ok(batch) = self.updates.try_recv() {
            for update in batch {
                if let JobUpdate::Removed { name } = update {
                    removed.push(name);
                }
            }
        }
        removed
    }

    pub(super) fn slots(slots: usize) -> Harness {
        Harness::new(SchedulerConfig { build_slots: slots, ..SchedulerConfig::default() })
    }

    /// Submits and waits until the scheduler is quiet; returns the nodes started.
    pub(super) async fn submit(&mut self, name: &str, spec: JobSpec) -> Vec<(String, String)> {
        self.sched.submit(name, spec).await.expect("valid job");
        self.settle(&[]).await
    }

    /// Waits until the scheduler's pass starts nothing more, every node it marked
    /// running has reached the executor and every node in `ended` is reported
    /// terminal. Returns the newly started nodes as (job, node).
    pub(super) async fn settle(&mut self, ended: &[(String, String)]) -> Vec<(String, String)> {
        let mut new = Vec::new();
        let mut last: Option<Vec<(String, String)>> = None;
        for _ in 0..1_000_000 {
            while let Ok(started) = self.started.try_recv() {
                new.push((started.job.clone(), started.node.clone()));
                self.running.push(started);
            }
            // A node the scheduler stopped (its Job's deadline) dropped its end.
            self.running.retain(|s| !s.done.is_closed());
            let list = self.sched.list().await.expect("scheduler up");
            let running: Vec<(String, String)> = list
                .iter()
                .flat_map(|j| j.nodes.iter().map(move |n| (j, n)))
                .filter(|(_, n)| n.state == JobNodeState::Running)
                .map(|(j, n)| (j.name.clone(), n.id.clone()))
                .collect();
            let ended_done = ended.iter().all(|(job, node)| {
                list.iter().find(|j| &j.name == job).is_none_or(|j| {
                    // Ended: terminal, or failed and waiting to retry.
                    j.nodes.iter().any(|n| &n.id == node && (n.state.is_terminal() || n.retry_at.is_some()))
                })
            });
            // The list is answered before its own turn's pass, and one pass need not
            // be the last to start something: a grant in it can turn an earlier DAG's
            // reserved lease into a deadlock refusal in the next pass, which then gives
            // that lease to a later DAG. Quiet means one pass started nothing — two
            // lists in a row show the same running nodes — so each start is seen in the
            // step that caused it, with the states it was decided on.
            let quiet = last.as_ref() == Some(&running);
            if quiet && running.len() == self.running.len() && ended_done {
                return new;
            }
            last = Some(running);
            tokio::task::yield_now().await;
        }
        panic!("the scheduler did not settle");
    }

    /// Ends running node `job/node` and waits; returns the nodes started as a result.
    pub(super) async fn finish(&mut self, job: &str, node: &str, how: Finish) -> Vec<(String, String)> {
        let at =
            self.running.iter().position(|s| s.job == job && s.node == node).unwrap_or_else(|| {
                panic!("{job}/{node} is not running; running: {:?}", self.running_names())
            });
        let started = self.running.remove(at);
        let _ = started.done.send(how);
        self.settle(&[(job.to_string(), node.to_string())]).await
    }

    pub(super) async fn ok(&mut self, job: &str, node: &str) -> Vec<(String, String)> {
        self.finish(job, node, Finish::Ok).await
    }

    pub(super) fn running_names(&self) -> Vec<String> {
        self.running.iter().map(|s| format!("{}/{}", s.job, s.node)).collect()
    }

    pub(super) fn is_running(&self, job: &str, node: &str) -> bool {
        self.running.iter().any(|s| s.job == job && s.node == node)
    }

    pub(super) async fn state(&self, job: &str, node: &str) -> JobNodeState {
        let snap = self.sched.snapshot(job).await.expect("job exists");
        snap.nodes.iter().find(|n| n.id == node).expect("node exists").state
    }

    /// Lets running node `job/node` be stopped at its Job's deadline, as a build does.
    pub(super) fn interruptible(&self, job: &str, node: &str) {
        let started = self.running.iter().find(|s| s.job == job && s.node == node).expect("running");
        started.ctx.set_interruptible(true);
    }

    /// Moves the paused clock on by `seconds` and waits until the scheduler is quiet;
    /// returns the nodes started as a result.
    pub(super) async fn advance(&mut self, seconds: u64) -> Vec<(String, String)> {
        tokio::time::advance(std::time::Duration::from_secs(seconds)).await;
        self.settle(&[]).await
    }

    pub(super) async fn phase(&self, job: &str) -> JobPhase {
        self.sched.snapshot(job).await.expect("job exists").phase
    }
}

/// Shorthand: `names(&[("j", "n")])`.
pub(super) fn names(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(j, n)| (j.to_string(), n.to_string())).collect()
}

/// A Job of `template` with these nodes.
pub(super) fn job(template: JobTemplate, nodes: Vec<JobNode>) -> JobSpec {
    JobSpec { template, nodes, ..Default::default() }
}

/// A chain of nodes of the given kinds on one agent, ids `0`, `1`, … with AfterOk
/// edges.
pub(super) fn chain(agent: &str, kinds: &[JobNodeKind]) -> Vec<JobNode> {
    kinds
        .iter()
        .enumerate()
        .map(|(i, &kind)| {
            let node = JobNode::new(i.to_string(), kind, Some(agent));
            if i == 0 {
                node
            } else {
                node.after((i - 1).to_string(), Edge::AfterOk)
            }
        })
        .collect()
}
