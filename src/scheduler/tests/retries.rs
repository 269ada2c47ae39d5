//! Retries with backoff, on a paused clock: a failed node of a kind that may retry runs
//! again after its backoff, up to its limit; the build slot is free meanwhile; a cancel
//! or the Job's deadline stops the retries; other kinds never retry.

use hive_api::job::{Backoff, JobNode, JobNodeKind, JobNodeState, JobPhase, JobTemplate, Retry};

use super::*;
use JobNodeKind::*;

fn retry(limit: u32, initial: &str, max: &str) -> Retry {
    Retry {
        limit,
        backoff: Some(Backoff { initial: Some(initial.into()), max: Some(max.into()), factor: Some(2.0) }),
    }
}

fn build_then_stop(agent: &str, retry: Retry) -> Vec<JobNode> {
    let mut nodes = chain(agent, &[Prebuild, StopForUpdate]);
    nodes[0].retry = Some(retry);
    nodes
}

async fn node(h: &Harness, job: &str, id: &str) -> hive_api::job::JobNodeStatus {
    let snap = h.sched.snapshot(job).await.unwrap();
    snap.nodes.into_iter().find(|n| n.id == id).unwrap()
}

fn fail(why: &str) -> Finish {
    Finish::Fail(why.into())
}

#[tokio::test(start_paused = true)]
async fn a_failed_build_runs_again_after_a_growing_backoff_until_it_succeeds() {
    let mut h = Harness::slots(1);
    h.submit("r", job(JobTemplate::Rebuild, build_then_stop("a", retry(3, "10s", "25s")))).await;
    assert_eq!(node(&h, "r", "0").await.attempt, Some(1));
    // Backoffs 10 s, 20 s, then 25 s (40 s capped at max).
    for (attempt, wait) in [(1, 10), (2, 20), (3, 25)] {
        assert_eq!(h.finish("r", "0", fail("fetch failed")).await, vec![]);
        let waiting = node(&h, "r", "0").await;
        assert_eq!(waiting.state, JobNodeState::Queued, "waits to retry");
        assert_eq!(waiting.error, Some(format!("attempt {attempt} failed: fetch failed")));
        assert!(waiting.retry_at.is_some());
        assert_eq!(h.phase("r").await, JobPhase::Running);
        assert_eq!(h.advance(wait - 1).await, vec![], "attempt {}: not before its backoff", attempt + 1);
        assert_eq!(h.advance(1).await, names(&[("r", "0")]));
        let running = node(&h, "r", "0").await;
        assert_eq!((running.attempt, running.retry_at), (Some(attempt + 1), None));
    }
    assert_eq!(h.ok("r", "0").await, names(&[("r", "1")]));
    h.ok("r", "1").await;
    assert_eq!(h.phase("r").await, JobPhase::Done);
    let (log, _) = h.sched.log("r", "0").await.unwrap();
    let log = String::from_utf8(log).unwrap();
    assert!(log.contains("hive: attempt 1 of 4 failed: fetch failed; the next in 10s"), "{log}");
    assert!(log.contains("hive: attempt 4 of 4"), "{log}");
}

#[tokio::test(start_paused = true)]
async fn past_its_limit_a_node_fails_and_cancels_what_follows() {
    let mut h = Harness::slots(1);
    h.submit("r", job(JobTemplate::Rebuild, build_then_stop("a", retry(1, "1s", "1s")))).await;
    h.finish("r", "0", fail("one")).await;
    assert_eq!(h.advance(1).await, names(&[("r", "0")]));
    h.finish("r", "0", fail("two")).await;
    assert_eq!(h.state("r", "0").await, JobNodeState::Failed);
    assert_eq!(h.state("r", "1").await, JobNodeState::Cancelled);
    assert_eq!(node(&h, "r", "0").await.error.as_deref(), Some("two"));
    assert!(h.sched.snapshot("r").await.unwrap().finished_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn the_build_slot_is_free_during_a_backoff_and_taken_again_as_any_node_takes_it() {
    let mut h = Harness::slots(1);
    h.submit("r", job(JobTemplate::Rebuild, build_then_stop("a", retry(2, "5s", "5s")))).await;
    h.submit("other", job(JobTemplate::Rebuild, chain("b", &[Prebuild]))).await;
    assert_eq!(h.finish("r", "0", fail("x")).await, names(&[("other", "0")]));
    assert_eq!(h.advance(5).await, vec![], "the retry waits for the slot");
    assert_eq!(h.ok("other", "0").await, names(&[("r", "0")]));
}

#[tokio::test(start_paused = true)]
async fn a_cancel_or_the_deadline_stops_the_retries() {
    let mut h = Harness::slots(1);
    h.submit("c", job(JobTemplate::Rebuild, build_then_stop("a", retry(5, "10s", "10s")))).await;
    h.finish("c", "0", fail("x")).await;
    h.sched.cancel("c").await.expect("a Job only waiting for a retry can be cancelled");
    assert_eq!(h.advance(60).await, vec![]);
    assert_eq!(h.phase("c").await, JobPhase::Cancelled);
    assert_eq!(h.state("c", "0").await, JobNodeState::Cancelled);

    let mut spec = job(JobTemplate::Rebuild, build_then_stop("b", retry(5, "10s", "10s")));
    spec.active_deadline_seconds = Some(15);
    h.submit("d", spec).await;
    h.finish("d", "0", fail("x")).await;
    assert_eq!(h.advance(10).await, names(&[("d", "0")]));
    h.finish("d", "0", fail("y")).await;
    assert_eq!(h.advance(60).await, vec![], "past the deadline: no more tries");
    assert_eq!(h.state("d", "0").await, JobNodeState::Cancelled);
    assert_eq!(h.phase("d").await, JobPhase::Failed);
}

#[tokio::test(start_paused = true)]
async fn only_kinds_that_may_retry_do_and_the_jobs_default_applies_to_them() {
    let mut h = Harness::slots(2);
    let nodes = vec![JobNode::new("signal", Signal, Some("a")), JobNode::new("build", Prebuild, Some("b"))];
    let mut spec = job(JobTemplate::Rebuild, nodes);
    spec.retry = Some(retry(1, "1s", "1s"));
    h.submit("j", spec).await;
    h.finish("j", "signal", fail("x")).await;
    assert_eq!(h.state("j", "signal").await, JobNodeState::Failed, "a Signal never retries");
    h.finish("j", "build", fail("x")).await;
    assert_eq!(h.state("j", "build").await, JobNodeState::Queued, "the Job's default retries the build");
    assert_eq!(h.advance(1).await, names(&[("j", "build")]));
}
