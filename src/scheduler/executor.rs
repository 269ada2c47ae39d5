//! The seam between the scheduler and whatever runs a node: the [`Executor`] trait and
//! what a node run carries ([`NodeRun`], [`NodeContext`]).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use hive_api::job::{JobNode, JobNodeKind, JobSource, JobTemplate, NodeAction};
use hive_api::validation::summary;
use hive_api::{Job, JobSpec};

use super::error::{Error, NodeError, Result};
use super::log::NodeLog;

/// Longest step label kept, in bytes; longer labels are cut at a character boundary.
const MAX_STEP_LEN: usize = 256;

/// Runs one node's primitive. The real implementation dispatches on
/// [`NodeRun::action`] to the runtime driver; tests use scripted executors.
///
/// The scheduler calls `run` on its own tokio task per node, so a slow node never
/// blocks scheduling; a panic inside `run` fails the node ([`NodeError::Panicked`]).
pub trait Executor: Send + Sync + 'static {
    /// Runs the node to completion. Progress goes through `node.ctx`.
    fn run(&self, node: NodeRun) -> impl Future<Output = Result<NodeOutcome, NodeError>> + Send;
}

/// What a node finished with, when it succeeded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeOutcome {
    /// Final step label to show (e.g. `noop: already running`); `None` keeps the last
    /// label the executor set.
    pub step: Option<String>,
}

/// Each node's typed action, in node order, parsed once when the scheduler took the
/// Job; a node whose params do not parse (a Job stored before they were checked) holds
/// why, naming its fields (`spec.nodes[3].params.relok: …`).
pub type Actions = Arc<[Result<NodeAction, String>]>;

/// Parses the action of every node of `spec` ([`JobNode::action`]).
pub(super) fn actions(spec: &JobSpec) -> Actions {
    let parse = |(i, node): (usize, &JobNode)| {
        node.action().map_err(|err| summary(&err.at(&format!("spec.nodes[{i}]"))))
    };
    spec.nodes.iter().enumerate().map(parse).collect()
}

/// One node to run: which Job and node, the spec it came from, its typed action, and
/// its context.
#[derive(Debug)]
pub struct NodeRun {
    /// The Job's name.
    pub job: Arc<str>,
    /// The Job's spec, shared (not copied) with the scheduler.
    pub spec: Arc<JobSpec>,
    /// The action of each node of `spec`, shared with the scheduler.
    pub actions: Actions,
    /// Index of the node in `spec.nodes`.
    pub index: usize,
    /// Step label, build log and fan-out for this node.
    pub ctx: NodeContext,
    /// Which try this is, from 1.
    pub attempt: u32,
    /// How many tries the node may have (1 when it does not retry).
    pub attempts: u32,
    /// On a retry, why the try before failed.
    pub retry_of: Option<String>,
}

impl NodeRun {
    /// The node's spec.
    pub fn node(&self) -> &JobNode {
        &self.spec.nodes[self.index]
    }

    /// The node's id.
    pub fn id(&self) -> &str {
        &self.node().id
    }

    /// The primitive to run.
    pub fn kind(&self) -> JobNodeKind {
        self.node().kind
    }

    /// The agent the node acts on (`None` only for `MetaLock`).
    pub fn agent(&self) -> Option<&str> {
        self.node().agent.as_deref()
    }

    /// What the node does, its params typed; a node whose params do not parse fails
    /// with why.
    pub fn action(&self) -> Result<&NodeAction, NodeError> {
        match &self.actions[self.index] {
            Ok(action) => Ok(action),
            Err(why) => Err(NodeError::Failed(format!("the node's params do not parse: {why}"))),
        }
    }

    /// The Job's template.
    pub fn template(&self) -> JobTemplate {
        self.spec.template
    }

    /// Node `index` of `spec` in Job `job`, outside any scheduler: its steps go nowhere,
    /// its log is kept, its fan-out is dropped. For tests that drive an executor node by
    /// node in an order of their choosing.
    #[cfg(test)]
    pub(crate) fn detached(job: &str, spec: Arc<JobSpec>, index: usize) -> NodeRun {
        let job: Arc<str> = job.into();
        let ctx = NodeContext {
            job: job.clone(),
            log: NodeLog::new(64 * 1024),
            steps: StepSink(Arc::new(|_| {})),
            fan_out: Arc::new(Mutex::new(Vec::new())),
            interruptible: Arc::default(),
        };
        NodeRun { job, actions: actions(&spec), spec, index, ctx, attempt: 1, attempts: 1, retry_of: None }
    }
}

/// The handle through which an executor reports progress on its node: the step label,
/// the build log, and child Jobs to fan out. Cheap to clone.
#[derive(Debug, Clone)]
pub struct NodeContext {
    pub(super) job: Arc<str>,
    pub(super) log: Arc<NodeLog>,
    pub(super) steps: StepSink,
    pub(super) fan_out: Arc<Mutex<Vec<JobSpec>>>,
    pub(super) interruptible: Arc<AtomicBool>,
}

/// Where a node's step labels go: the scheduler hands each node one that reports to it,
/// so an executor never needs to know the scheduler's inbox.
#[derive(Clone)]
pub(super) struct StepSink(pub(super) Arc<dyn Fn(String) + Send + Sync>);

impl std::fmt::Debug for StepSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StepSink")
    }
}

impl NodeContext {
    /// Sets the node's step label (e.g. `building toplevel`), shown in the Job's status
    /// and the CLI's progress line. Labels over 256 bytes are cut.
    pub fn set_step(&self, label: impl Into<String>) {
        let mut label = label.into();
        truncate(&mut label, MAX_STEP_LEN);
        (self.steps.0)(label);
    }

    /// Says whether the node may be stopped now, should its Job run past its deadline
    /// (`spec.activeDeadlineSeconds`): the scheduler then drops the node's future, which
    /// kills its build subprocess. Set it only around work that leaves nothing
    /// half-written when cut off — a build into a new generation — never around a meta
    /// commit or a change to the running agent. Off when a node starts.
    pub fn set_interruptible(&self, interruptible: bool) {
        self.interruptible.store(interruptible, Ordering::Release);
    }

    /// Appends to the node's build log (bounded; the oldest bytes are dropped first).
    pub fn log(&self, data: &[u8]) {
        self.log.append(data);
    }

    /// The node's build log, e.g. to hand to a child process's output pump.
    pub fn build_log(&self) -> &Arc<NodeLog> {
        &self.log
    }

    /// Appends a child Job to be submitted when this node **succeeds** (a failed node
    /// fans out nothing, so there is nothing to cancel). The child gets
    /// `spec.parent` = this Job and `spec.source` = `FanOut`, and a name derived from
    /// the parent's. It is validated now, so a bad child fails here, not later.
    pub fn fan_out(&self, mut spec: JobSpec) -> Result<()> {
        spec.parent = Some(self.job.to_string());
        spec.source = JobSource::FanOut;
        let errors = hive_api::resource::validate(&Job::new(self.job.to_string(), spec.clone()));
        if !errors.is_empty() {
            return Err(Error::Invalid { name: format!("fan-out of {}", self.job), errors });
        }
        self.fan_out.lock().unwrap_or_else(PoisonError::into_inner).push(spec);
        Ok(())
    }
}

fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_labels_are_cut_on_a_char_boundary() {
        let mut label = "é".repeat(200);
        truncate(&mut label, MAX_STEP_LEN);
        assert_eq!(label.len(), MAX_STEP_LEN);
        let mut label = format!("a{}", "é".repeat(200));
        truncate(&mut label, MAX_STEP_LEN);
        assert_eq!(label.len(), MAX_STEP_LEN - 1);
    }
}
