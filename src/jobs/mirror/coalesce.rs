//! What the Jobs mirror has yet to write, per Job, and when (no IO here). The
//! scheduler's updates of one Job merge into one pending status, O(nodes in the update)
//! each. It is due at once when a reader waits on what changed — the Job's first
//! status, a new phase, settling — and otherwise one interval after the Job's last
//! write, an interval that grows with what that write cost: the object's size over
//! [`WRITE_RATE`], at most [`MAX_STALENESS`].
//!
//! Why: the store keeps whole objects, so every status write of a Job costs its whole
//! size (1.2 MB for 5,000 nodes), in the write-ahead log, the event log and every
//! watcher. Written once per scheduler turn, an N-node chain wrote N statuses of up to
//! N nodes each: 10.6 GB for 5,000 nodes (issue 28). Coalesced, a Job's node changes
//! cost the store at most `WRITE_RATE` bytes a second, so a chain's bytes grow with its
//! running time, which is linear in its length; a small Job's interval is a few
//! milliseconds, so it reads as it did.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use hive_api::job::{JobNodeStatus, JobPhase};
use indexmap::IndexMap;
use tokio::time::Instant;

use crate::scheduler::JobSnapshot;

/// Bytes of one Job's object the mirror writes per second at most, beside the writes it
/// makes at once.
pub const WRITE_RATE: usize = 256 * 1024;

/// The longest a node change waits to be written, whatever the Job's size.
pub const MAX_STALENESS: Duration = Duration::from_secs(5);

/// How long a Job whose status write failed waits before the mirror tries again.
pub(super) const RETRY: Duration = Duration::from_secs(1);

/// The wait after a write that left the Job's object `bytes` long, before the next
/// write of its node changes.
pub(super) fn interval(bytes: usize) -> Duration {
    Duration::from_secs_f64(bytes as f64 / WRITE_RATE as f64).min(MAX_STALENESS)
}

/// The Job as the mirror last wrote it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Written {
    /// When the write ended.
    pub(super) at: Instant,
    /// The object's size after it.
    pub(super) bytes: usize,
    /// The phase it wrote.
    pub(super) phase: JobPhase,
    /// Whether it wrote `finishedAt`.
    pub(super) finished: bool,
}

/// When a pending status with this `phase` and `finished` is due, after `written`
/// (`None`: nothing was written of this Job yet). At once when a reader waits on it;
/// else one [`interval`] after the last write.
pub(super) fn due(written: Option<&Written>, phase: JobPhase, finished: bool, now: Instant) -> Instant {
    match written {
        Some(w) if w.phase == phase && w.finished == finished => w.at + interval(w.bytes),
        _ => now,
    }
}

/// A status not yet written: the latest Job-level fields, and every node changed since
/// the last write (all of them when the Job's first, complete snapshot is among them).
#[derive(Debug)]
struct Pending {
    /// The latest snapshot's Job-level fields; its `nodes` are kept in `nodes`.
    header: JobSnapshot,
    nodes: IndexMap<String, JobNodeStatus>,
}

impl Pending {
    fn new(mut snapshot: JobSnapshot) -> Pending {
        let nodes = std::mem::take(&mut snapshot.nodes).into_iter().map(|n| (n.id.clone(), n)).collect();
        Pending { header: snapshot, nodes }
    }

    /// `later` merged over this: its Job-level fields win, its nodes replace theirs by
    /// id (a complete `later` replaces everything).
    fn merge(&mut self, mut later: JobSnapshot) {
        if later.complete {
            *self = Pending::new(later);
            return;
        }
        for node in std::mem::take(&mut later.nodes) {
            self.nodes.insert(node.id.clone(), node);
        }
        later.complete = self.header.complete;
        self.header = later;
    }

    fn into_snapshot(self) -> JobSnapshot {
        JobSnapshot { nodes: self.nodes.into_values().collect(), ..self.header }
    }
}

/// One Job's entry: what was written, what is pending, and when it is due.
#[derive(Debug, Default)]
struct Entry {
    written: Option<Written>,
    pending: Option<Pending>,
    due: Option<Instant>,
}

/// Every Job the mirror has something to write of, or wrote and has not seen settle.
#[derive(Debug, Default)]
pub(super) struct Coalescer {
    jobs: HashMap<String, Entry>,
    /// Each pending status once, by when it is due.
    schedule: BTreeSet<(Instant, String)>,
}

impl Coalescer {
    /// Merges one update of Job `snapshot.name` received at `now`.
    pub(super) fn merge(&mut self, snapshot: JobSnapshot, now: Instant) {
        let name = snapshot.name.clone();
        let entry = self.jobs.entry(name.clone()).or_default();
        match &mut entry.pending {
            Some(pending) => pending.merge(snapshot),
            None => entry.pending = Some(Pending::new(snapshot)),
        }
        let header = &entry.pending.as_ref().expect("just set").header;
        let due = due(entry.written.as_ref(), header.phase, header.finished_at.is_some(), now);
        // Due earlier than planned (a new phase): move it; never later.
        if entry.due.is_none_or(|planned| due < planned) {
            if let Some(planned) = entry.due.replace(due) {
                self.schedule.remove(&(planned, name.clone()));
            }
            self.schedule.insert((due, name));
        }
    }

    /// Forgets Job `name` (removed, or gone from the store): nothing pending of it is
    /// written.
    pub(super) fn forget(&mut self, name: &str) {
        if let Some(Entry { due: Some(due), .. }) = self.jobs.remove(name) {
            self.schedule.remove(&(due, name.to_string()));
        }
    }

    /// When the earliest pending status is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.schedule.first().map(|(due, _)| *due)
    }

    /// Takes the pending statuses due by `now` (every one when `now` is `None`), the
    /// earliest first.
    pub(super) fn take_due(&mut self, now: Option<Instant>) -> Vec<JobSnapshot> {
        let mut taken = Vec::new();
        while let Some((due, _)) = self.schedule.first() {
            if now.is_some_and(|now| *due > now) {
                break;
            }
            let (_, name) = self.schedule.pop_first().expect("not empty");
            let entry = self.jobs.get_mut(&name).expect("a scheduled Job has an entry");
            entry.due = None;
            taken.extend(entry.pending.take().map(Pending::into_snapshot));
        }
        taken
    }

    /// `snapshot` was written, the write ending at `at` with the object `bytes` long.
    /// A Job that settled is forgotten: the scheduler sends nothing more of it.
    pub(super) fn written(&mut self, snapshot: &JobSnapshot, at: Instant, bytes: usize) {
        let finished = snapshot.finished_at.is_some();
        let Some(entry) = self.jobs.get_mut(&snapshot.name) else { return };
        if finished && entry.pending.is_none() {
            self.jobs.remove(&snapshot.name);
            return;
        }
        entry.written = Some(Written { at, bytes, phase: snapshot.phase, finished });
    }

    /// `snapshot` could not be written at `now`: pending again, under anything merged
    /// since, and tried again after [`RETRY`].
    pub(super) fn failed(&mut self, snapshot: JobSnapshot, now: Instant) {
        let name = snapshot.name.clone();
        let entry = self.jobs.entry(name.clone()).or_default();
        let mut pending = Pending::new(snapshot);
        if let Some(later) = entry.pending.take() {
            pending.merge(later.into_snapshot());
        }
        entry.pending = Some(pending);
        if let Some(planned) = entry.due.take() {
            self.schedule.remove(&(planned, name.clone()));
        }
        entry.due = Some(now + RETRY);
        self.schedule.insert((now + RETRY, name));
    }
}

#[cfg(test)]
mod tests {
    use hive_api::job::{JobNodeState, JobTemplate};

    use super::*;

    fn node(id: &str, state: JobNodeState) -> JobNodeStatus {
        JobNodeStatus { id: id.into(), state, ..Default::default() }
    }

    fn snapshot(phase: JobPhase, nodes: Vec<JobNodeStatus>, complete: bool) -> JobSnapshot {
        JobSnapshot {
            name: "j".into(),
            template: JobTemplate::Reconcile,
            parent: None,
            phase,
            submitted_at: None,
            started_at: None,
            finished_at: None,
            message: None,
            reason: None,
            children: vec![],
            nodes,
            complete,
        }
    }

    #[test]
    fn the_interval_grows_with_the_size_up_to_the_bound() {
        assert_eq!(interval(0), Duration::ZERO);
        assert_eq!(interval(WRITE_RATE / 4), Duration::from_millis(250));
        assert_eq!(interval(2_048), Duration::from_nanos(7_812_500));
        assert_eq!(interval(WRITE_RATE * 100), MAX_STALENESS);
    }

    #[test]
    fn what_is_due_at_once_and_what_waits() {
        use JobPhase::*;
        let now = Instant::now();
        let written = |phase, finished| Written { at: now, bytes: WRITE_RATE, phase, finished };
        let later = now + Duration::from_secs(1);
        let cases = [
            ("the first status", None, Running, false, now),
            ("node changes, same phase", Some(written(Running, false)), Running, false, later),
            ("a new phase", Some(written(Queued, false)), Running, false, now),
            ("the first failure", Some(written(Running, false)), Failed, false, now),
            ("settling", Some(written(Failed, false)), Failed, true, now),
        ];
        for (case, written, phase, finished, want) in cases {
            assert_eq!(due(written.as_ref(), phase, finished, now), want, "{case}");
        }
    }

    #[test]
    fn deltas_merge_by_node_id_in_first_seen_order() {
        use JobNodeState::*;
        let now = Instant::now();
        let mut c = Coalescer::default();
        let all = vec![node("a", Queued), node("b", Queued), node("c", Queued)];
        c.merge(snapshot(JobPhase::Running, all, true), now);
        c.merge(snapshot(JobPhase::Running, vec![node("b", Running)], false), now);
        c.merge(snapshot(JobPhase::Running, vec![node("b", Done), node("a", Done)], false), now);
        let taken = c.take_due(Some(now));
        assert_eq!(taken.len(), 1);
        assert!(taken[0].complete, "still the complete first status");
        assert_eq!(taken[0].nodes, [node("a", Done), node("b", Done), node("c", Queued)]);
        assert_eq!(c.next_due(), None);
    }

    #[test]
    fn node_changes_wait_an_interval_and_a_new_phase_does_not() {
        use JobNodeState::*;
        let now = Instant::now();
        let mut c = Coalescer::default();
        c.merge(snapshot(JobPhase::Running, vec![node("a", Running)], true), now);
        let first = c.take_due(Some(now)).pop().unwrap();
        c.written(&first, now, WRITE_RATE);
        c.merge(snapshot(JobPhase::Running, vec![node("a", Done)], false), now);
        assert_eq!(c.next_due(), Some(now + Duration::from_secs(1)));
        assert!(c.take_due(Some(now)).is_empty());
        c.merge(snapshot(JobPhase::Failed, vec![node("b", Failed)], false), now);
        assert_eq!(c.next_due(), Some(now), "a new phase is written at once");
        let both = c.take_due(Some(now)).pop().unwrap();
        assert_eq!(both.nodes, [node("a", Done), node("b", Failed)]);
    }

    #[test]
    fn a_failed_write_is_retried_under_later_changes() {
        use JobNodeState::*;
        let now = Instant::now();
        let mut c = Coalescer::default();
        c.merge(snapshot(JobPhase::Running, vec![node("a", Running), node("b", Queued)], true), now);
        let lost = c.take_due(Some(now)).pop().unwrap();
        c.merge(snapshot(JobPhase::Running, vec![node("a", Done)], false), now);
        c.failed(lost, now);
        assert_eq!(c.next_due(), Some(now + RETRY));
        let retried = c.take_due(None).pop().unwrap();
        assert!(retried.complete);
        assert_eq!(retried.nodes, [node("a", Done), node("b", Queued)]);
    }

    #[test]
    fn a_settled_job_is_forgotten_once_written() {
        let now = Instant::now();
        let mut c = Coalescer::default();
        let mut settled = snapshot(JobPhase::Done, vec![], true);
        settled.finished_at = Some(hive_api::Time::from_unix(0).unwrap());
        c.merge(settled, now);
        let written = c.take_due(Some(now)).pop().unwrap();
        c.written(&written, now, 10);
        assert!(c.jobs.is_empty());
        c.merge(snapshot(JobPhase::Running, vec![], true), now);
        assert_eq!(c.next_due(), Some(now), "a new Job of that name starts afresh");
    }
}
