//! What the scheduler publishes: per-Job snapshots that map onto `hive_api::JobStatus`,
//! and the batched updates the daemon mirrors into the store.

use std::collections::HashMap;
use std::sync::Arc;

use hive_api::job::{JobNodeStatus, JobPhase, JobTemplate};
use hive_api::{JobSpec, JobStatus, Time};

/// The observed state of one Job, as the scheduler holds it.
///
/// In a [`JobUpdate::Changed`] only the nodes that changed since the previous update are
/// listed (`complete == false`), so a long chain costs O(1) per transition, not O(nodes);
/// [`JobSnapshot::apply_to`] merges such a delta into a stored status. Snapshots read
/// through [`SchedulerHandle::snapshot`](super::SchedulerHandle::snapshot) and the first
/// update of every Job are complete.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSnapshot {
    /// The Job's name.
    pub name: String,
    /// The Job's template (history is kept per template).
    pub template: JobTemplate,
    /// The Job that fanned this one out, if any.
    pub parent: Option<String>,
    /// Roll-up of the node states ([`JobPhase::roll_up`]).
    pub phase: JobPhase,
    /// When the scheduler accepted the Job.
    pub submitted_at: Option<Time>,
    /// When its first node started.
    pub started_at: Option<Time>,
    /// When it became terminal.
    pub finished_at: Option<Time>,
    /// Why it failed or was cancelled.
    pub message: Option<String>,
    /// Why it ended, machine-readable (`DeadlineExceeded`), when the nodes do not say.
    pub reason: Option<String>,
    /// Names of the child Jobs it fanned out.
    pub children: Vec<String>,
    /// Node states: all of them in spec order when `complete`, else only changed ones.
    pub nodes: Vec<JobNodeStatus>,
    /// Whether `nodes` lists every node.
    pub complete: bool,
}

impl JobSnapshot {
    /// Writes this snapshot into `status`: the Job-level fields are replaced, and the
    /// nodes are replaced (complete snapshot) or merged by id (delta).
    pub fn apply_to(&self, status: &mut JobStatus) {
        status.phase = Some(self.phase);
        status.submitted_at = self.submitted_at;
        status.started_at = self.started_at;
        status.finished_at = self.finished_at;
        status.message.clone_from(&self.message);
        status.reason.clone_from(&self.reason);
        status.children.clone_from(&self.children);
        if self.complete {
            status.nodes.clone_from(&self.nodes);
            return;
        }
        let index: HashMap<&str, usize> =
            status.nodes.iter().enumerate().map(|(i, n)| (n.id.as_str(), i)).collect();
        let mut appended = Vec::new();
        let mut replace = Vec::new();
        for node in &self.nodes {
            match index.get(node.id.as_str()) {
                Some(&i) => replace.push((i, node.clone())),
                None => appended.push(node.clone()),
            }
        }
        for (i, node) in replace {
            status.nodes[i] = node;
        }
        status.nodes.extend(appended);
    }

    /// This snapshot as a fresh `JobStatus` (only the listed nodes when a delta).
    pub fn to_status(&self) -> JobStatus {
        let mut status = JobStatus::default();
        self.apply_to(&mut status);
        status
    }
}

/// One change the daemon mirrors into the store. A batch (one call of
/// [`JobSink::publish`]) holds every change of one scheduler turn, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum JobUpdate {
    /// The scheduler created this Job itself (a fan-out child): the daemon creates its
    /// Job object. A `Changed` for it follows in the same batch.
    Created {
        /// The child's name.
        name: String,
        /// Its spec (`parent` and `source: FanOut` set).
        spec: Arc<JobSpec>,
    },
    /// The Job's status changed.
    Changed(JobSnapshot),
    /// The Job fell out of history (more than the kept number of terminal Jobs of its
    /// template): the daemon deletes its Job object.
    Removed {
        /// The Job's name.
        name: String,
    },
}

/// Where the scheduler publishes Job changes, batched per scheduler turn. Called from
/// the scheduler task, so it must not block: hand the batch to another task.
pub trait JobSink: Send + Sync + 'static {
    /// Receives every change of one scheduler turn.
    fn publish(&self, updates: Vec<JobUpdate>);
}

/// A sink that drops every update (benchmarks, tests that only read snapshots).
#[derive(Debug, Clone, Copy, Default)]
pub struct NullSink;

impl JobSink for NullSink {
    fn publish(&self, _updates: Vec<JobUpdate>) {}
}

/// Forwards each batch into an unbounded channel; the daemon's mirror task (or a test)
/// reads the other end.
impl JobSink for tokio::sync::mpsc::UnboundedSender<Vec<JobUpdate>> {
    fn publish(&self, updates: Vec<JobUpdate>) {
        // A closed receiver means nobody mirrors any more (shutdown); nothing to do.
        let _ = self.send(updates);
    }
}

#[cfg(test)]
mod tests {
    use hive_api::job::JobNodeState;

    use super::*;

    fn node(id: &str, state: JobNodeState) -> JobNodeStatus {
        JobNodeStatus { id: id.into(), state, ..Default::default() }
    }

    #[test]
    fn a_delta_merges_by_node_id() {
        let mut snap = JobSnapshot {
            name: "j".into(),
            template: JobTemplate::Rebuild,
            parent: None,
            phase: JobPhase::Queued,
            submitted_at: None,
            started_at: None,
            finished_at: None,
            message: None,
            reason: None,
            children: vec![],
            nodes: vec![node("a", JobNodeState::Queued), node("b", JobNodeState::Queued)],
            complete: true,
        };
        let mut status = snap.to_status();
        snap.phase = JobPhase::Running;
        snap.complete = false;
        snap.nodes = vec![node("b", JobNodeState::Running)];
        snap.apply_to(&mut status);
        assert_eq!(status.phase, Some(JobPhase::Running));
        assert_eq!(status.nodes, vec![node("a", JobNodeState::Queued), node("b", JobNodeState::Running)]);
    }
}
