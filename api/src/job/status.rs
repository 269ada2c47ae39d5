//! What is observed of a Job: its roll-up phase, each node's state, and the claim that
//! took it to a scheduler.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::meta::Time;

/// What is observed of a Job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    /// Roll-up of the node states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobPhase>,
    /// Per-node state, keyed by node id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<JobNodeStatus>,
    /// When the scheduler accepted the Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_at: Option<Time>,
    /// When the first node started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the Job settled: every node terminal (a `Failed` Job may still run an
    /// AfterAny node until then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Human-readable summary, e.g. why the Job failed or was interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Why the Job ended as it did, machine-readable, when the nodes alone do not say:
    /// `DeadlineExceeded` once it ran past `spec.activeDeadlineSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Names of the child Jobs this one fanned out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
    /// Which daemon run took the Job to its scheduler. Set exactly once, by a write
    /// conditional on the resourceVersion it read, so no two runs (a restart, a second
    /// daemon) ever run one Job. Absent while the Job waits for an intake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<JobClaim>,
}

/// The claim of a Job by one daemon run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobClaim {
    /// The claiming daemon run, unique per start of a daemon.
    pub run: String,
    /// When it claimed the Job.
    pub at: Time,
}

impl JobStatus {
    /// Whether the Job still waits for an intake to take it: unclaimed and not settled
    /// (a Job cancelled before any claim is settled, and never taken).
    pub fn waiting(&self) -> bool {
        self.claim.is_none() && !self.phase.is_some_and(JobPhase::is_terminal)
    }

    /// The status of the node with the given id, if reported.
    pub fn node(&self, id: &str) -> Option<&JobNodeStatus> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Whether the Job will not change any more: its phase is terminal and, for a
    /// `Failed` Job (failed as soon as one node failed), every node is terminal too
    /// (`finishedAt` is set then, or every reported node is terminal).
    pub fn settled(&self) -> bool {
        match self.phase {
            None => false,
            Some(JobPhase::Failed) => {
                self.finished_at.is_some() || self.nodes.iter().all(|n| n.state.is_terminal())
            }
            Some(phase) => phase.is_terminal(),
        }
    }
}

/// Roll-up state of a Job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum JobPhase {
    /// No node has started.
    Queued,
    /// Some node has started and some node is not terminal.
    Running,
    /// Every node succeeded.
    Done,
    /// At least one node failed. An AfterAny node (the Reconcile after a failed Swap) may
    /// still run; `finishedAt` is set once every node is terminal.
    Failed,
    /// Every node is terminal, none failed, at least one was cancelled.
    Cancelled,
    /// The daemon restarted while the Job was unfinished; the boot reconcile re-derives
    /// the work.
    Interrupted,
}

impl JobPhase {
    /// The serialized name, e.g. `Running`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobPhase::Queued => "Queued",
            JobPhase::Running => "Running",
            JobPhase::Done => "Done",
            JobPhase::Failed => "Failed",
            JobPhase::Cancelled => "Cancelled",
            JobPhase::Interrupted => "Interrupted",
        }
    }

    /// True once the phase will not change any more. A `Failed` Job may still have nodes
    /// running: [`JobStatus::settled`] says when the Job itself is over.
    pub fn is_terminal(self) -> bool {
        !matches!(self, JobPhase::Queued | JobPhase::Running)
    }

    /// The roll-up of node states, as the coordinator document has it: `Failed` as soon
    /// as any node failed (even while an AfterAny Reconcile still runs after a failed
    /// Swap; leases are held until every node is terminal), else `Running` while some
    /// node started and some is not terminal, else `Queued`, `Cancelled` if any was
    /// cancelled, else `Done`.
    pub fn roll_up(states: impl IntoIterator<Item = JobNodeState>) -> JobPhase {
        let (mut any, mut pending, mut started, mut failed, mut cancelled) =
            (false, false, false, false, false);
        for state in states {
            any = true;
            match state {
                JobNodeState::Queued => pending = true,
                JobNodeState::Running => (pending, started) = (true, true),
                JobNodeState::Done => started = true,
                JobNodeState::Failed => (started, failed) = (true, true),
                JobNodeState::Cancelled => cancelled = true,
            }
        }
        match () {
            _ if !any => JobPhase::Done,
            _ if failed => JobPhase::Failed,
            _ if pending && started => JobPhase::Running,
            _ if pending => JobPhase::Queued,
            _ if cancelled => JobPhase::Cancelled,
            _ => JobPhase::Done,
        }
    }
}

/// What is observed of one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobNodeStatus {
    /// The node's `id` in `spec.nodes`.
    pub id: String,
    /// Where the node is in its life.
    #[serde(default)]
    pub state: JobNodeState,
    /// Label of the step the node is on, e.g. `building toplevel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// When the node started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the node became terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Why the node failed (or which dep cancelled it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Which try this is (or was the last), from 1, once the node has started. Above 1
    /// only for a node that retried (`spec.nodes[i].retry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// When a failed node that retries runs again: it waits, `Queued`, until then, its
    /// last try's error in `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Time>,
    /// Reference to the node's build log, which `hive logs -f` follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_ref: Option<String>,
}

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum JobNodeState {
    /// Waiting for its deps and resources.
    #[default]
    Queued,
    /// Executing.
    Running,
    /// Succeeded.
    Done,
    /// Ran and failed.
    Failed,
    /// Never ran: an AfterOk dep failed or was cancelled, or the Job was cancelled while
    /// queued. Distinct from `Failed`.
    Cancelled,
}

impl JobNodeState {
    /// The serialized name, e.g. `Done`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobNodeState::Queued => "Queued",
            JobNodeState::Running => "Running",
            JobNodeState::Done => "Done",
            JobNodeState::Failed => "Failed",
            JobNodeState::Cancelled => "Cancelled",
        }
    }

    /// True once the node will not change any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobNodeState::Done | JobNodeState::Failed | JobNodeState::Cancelled)
    }
}
