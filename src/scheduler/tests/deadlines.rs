//! `spec.activeDeadlineSeconds`, on a paused clock: past it, queued nodes are cancelled,
//! a build that says it may be stopped is stopped, the Job is Failed with reason
//! `DeadlineExceeded`, and its tail Reconcile still runs — after whatever it follows.

use hive_api::job::{Edge, JobNode, JobNodeKind, JobNodeState, JobPhase, JobTemplate};
use hive_api::JobSpec;

use super::*;
use JobNodeKind::*;

fn with_deadline(mut spec: JobSpec, seconds: u64) -> JobSpec {
    spec.active_deadline_seconds = Some(seconds);
    spec
}

fn rebuild(agent: &str) -> JobSpec {
    let mut nodes = chain(agent, &[Prebuild, StopForUpdate, Swap]);
    nodes.push(JobNode::new("reconcile", Reconcile, Some(agent)).after("2", Edge::AfterAny));
    job(JobTemplate::Rebuild, nodes)
}

#[tokio::test(start_paused = true)]
async fn past_its_deadline_a_build_is_stopped_the_rest_cancelled_and_the_reconcile_runs() {
    let mut h = Harness::slots(1);
    assert_eq!(h.submit("r", with_deadline(rebuild("a"), 30)).await, names(&[("r", "0")]));
    h.interruptible("r", "0");
    h.submit("next", job(JobTemplate::Rebuild, chain("b", &[Prebuild]))).await;
    assert_eq!(h.advance(29).await, vec![], "nothing happens before the deadline");
    assert_eq!(h.phase("r").await, JobPhase::Running);
    // Past it: the build is stopped (its slot goes to the next build), Stop and Swap
    // are cancelled, and the tail Reconcile runs.
    assert_eq!(h.advance(2).await, names(&[("r", "reconcile"), ("next", "0")]));
    assert!(!h.is_running("r", "0"), "the stopped build's task was dropped");
    let snap = h.sched.snapshot("r").await.unwrap();
    let states: Vec<JobNodeState> = snap.nodes.iter().map(|n| n.state).collect();
    use JobNodeState::*;
    assert_eq!(states, [Failed, Cancelled, Cancelled, Running]);
    assert_eq!(snap.nodes[0].error.as_deref(), Some("stopped: the Job ran past its deadline"));
    assert_eq!(snap.nodes[1].error.as_deref(), Some("cancelled: the Job ran past its deadline"));
    assert_eq!(snap.phase, JobPhase::Failed);
    assert_eq!(snap.reason.as_deref(), Some("DeadlineExceeded"));
    assert!(snap.finished_at.is_none(), "settled only once the Reconcile ends");
    h.ok("r", "reconcile").await;
    let snap = h.sched.snapshot("r").await.unwrap();
    assert_eq!((snap.phase, snap.reason.as_deref()), (JobPhase::Failed, Some("DeadlineExceeded")));
    assert!(snap.finished_at.is_some());
    assert_eq!(
        snap.message.as_deref(),
        Some("the Job ran past its deadline of 30s (spec.activeDeadlineSeconds)")
    );
    assert!(h.sched.leased_agents().is_empty(), "its lease was released when it settled");
}

#[tokio::test(start_paused = true)]
async fn a_node_that_cannot_be_stopped_ends_before_the_reconcile_runs() {
    let mut h = Harness::slots(1);
    let restart =
        job(JobTemplate::Restart, chain("a", &[SetWanted, Signal, Drain, StopForUpdate, Reconcile]));
    h.submit("r", with_deadline(restart, 10)).await;
    assert_eq!(h.ok("r", "0").await, names(&[("r", "1")]));
    // The Signal does not say it may be stopped: it runs on; nothing after it starts.
    assert_eq!(h.advance(11).await, vec![]);
    assert!(h.is_running("r", "1"));
    assert_eq!(h.phase("r").await, JobPhase::Failed);
    assert_eq!(h.state("r", "2").await, JobNodeState::Queued);
    // Once it ends, Drain and StopForUpdate are cancelled and the Reconcile runs.
    assert_eq!(h.ok("r", "1").await, names(&[("r", "4")]));
    assert_eq!(h.state("r", "2").await, JobNodeState::Cancelled);
    assert_eq!(h.state("r", "3").await, JobNodeState::Cancelled);
    h.ok("r", "4").await;
    let snap = h.sched.snapshot("r").await.unwrap();
    assert_eq!((snap.phase, snap.reason.as_deref()), (JobPhase::Failed, Some("DeadlineExceeded")));
    assert!(snap.finished_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_queued_job_past_its_deadline_waits_for_the_lease_only_to_reconcile() {
    let mut h = Harness::slots(1);
    h.submit("holder", job(JobTemplate::Stop, chain("a", &[SetWanted]))).await;
    let stop = job(JobTemplate::Stop, chain("a", &[SetWanted, Signal, Reconcile]));
    assert_eq!(h.submit("late", with_deadline(stop, 5)).await, vec![]);
    assert_eq!(h.advance(6).await, vec![]);
    assert_eq!(h.state("late", "0").await, JobNodeState::Cancelled);
    assert_eq!(h.state("late", "1").await, JobNodeState::Cancelled);
    assert_eq!(h.state("late", "2").await, JobNodeState::Queued);
    assert_eq!(h.ok("holder", "0").await, names(&[("late", "2")]));
    h.ok("late", "2").await;
    assert_eq!(h.phase("late").await, JobPhase::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_job_that_ends_in_time_is_untouched_by_its_deadline() {
    let mut h = Harness::slots(1);
    h.submit("j", with_deadline(job(JobTemplate::Stop, chain("a", &[SetWanted, Reconcile])), 10)).await;
    h.ok("j", "0").await;
    h.ok("j", "1").await;
    h.advance(20).await;
    let snap = h.sched.snapshot("j").await.unwrap();
    assert_eq!((snap.phase, snap.reason), (JobPhase::Done, None));
    // A cancelled Job stays Cancelled too.
    h.submit("holder", job(JobTemplate::Stop, chain("b", &[SetWanted]))).await;
    h.submit("c", with_deadline(job(JobTemplate::Stop, chain("b", &[SetWanted])), 10)).await;
    h.sched.cancel("c").await.unwrap();
    h.advance(20).await;
    assert_eq!(h.phase("c").await, JobPhase::Cancelled);
}
