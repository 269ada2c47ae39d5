//! `spec.priority`, on a paused clock: ready nodes competing for a build slot or a lease
//! go higher priority first, submit order within a priority, and a waiting Job gains a
//! point per aging step (a minute), so a low priority never starves.

use hive_api::job::{JobNodeKind, JobTemplate};
use hive_api::JobSpec;

use super::*;
use JobNodeKind::*;

fn at(priority: i32, spec: JobSpec) -> JobSpec {
    JobSpec { priority, ..spec }
}

fn build(agent: &str) -> JobSpec {
    job(JobTemplate::Rebuild, chain(agent, &[Prebuild]))
}

#[tokio::test(start_paused = true)]
async fn a_build_slot_goes_to_the_highest_priority_then_in_submit_order() {
    let mut h = Harness::slots(1);
    h.submit("busy", build("z")).await;
    h.submit("first", build("a")).await;
    h.submit("second", build("b")).await;
    h.submit("urgent", at(10, build("c"))).await;
    h.submit("sweep", at(-10, build("d"))).await;
    h.submit("third", build("e")).await;
    assert_eq!(h.ok("busy", "0").await, names(&[("urgent", "0")]));
    assert_eq!(h.ok("urgent", "0").await, names(&[("first", "0")]));
    assert_eq!(h.ok("first", "0").await, names(&[("second", "0")]));
    assert_eq!(h.ok("second", "0").await, names(&[("third", "0")]));
    assert_eq!(h.ok("third", "0").await, names(&[("sweep", "0")]));
}

#[tokio::test(start_paused = true)]
async fn a_lease_goes_to_the_highest_priority_waiter() {
    let mut h = Harness::slots(1);
    h.submit("holder", job(JobTemplate::Stop, chain("a", &[SetWanted]))).await;
    h.submit("low", job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await;
    h.submit("high", at(1, job(JobTemplate::Restart, chain("a", &[SetWanted])))).await;
    assert_eq!(h.ok("holder", "0").await, names(&[("high", "0")]));
    assert_eq!(h.ok("high", "0").await, names(&[("low", "0")]));
}

#[tokio::test(start_paused = true)]
async fn age_lifts_a_waiting_job_one_point_a_minute() {
    let mut h = Harness::slots(1);
    h.submit("busy", build("z")).await;
    h.submit("sweep", at(-10, build("a"))).await;
    // Ten minutes less a second later, a new priority-0 Job still goes first …
    h.advance(599).await;
    h.submit("before", build("b")).await;
    // … but from ten minutes on, the sweep has caught up with new ones, and is ahead of
    // them (submitted earlier, equal rank: submit order).
    h.advance(1).await;
    h.submit("after", build("c")).await;
    assert_eq!(h.ok("busy", "0").await, names(&[("before", "0")]));
    assert_eq!(h.ok("before", "0").await, names(&[("sweep", "0")]));
    assert_eq!(h.ok("sweep", "0").await, names(&[("after", "0")]));
}

#[tokio::test(start_paused = true)]
async fn fan_out_children_inherit_their_parents_priority() {
    let mut h = Harness::slots(1);
    h.submit("busy", build("z")).await;
    h.submit("sweep", at(-10, job(JobTemplate::BootSweep, chain("m", &[Signal])))).await;
    h.finish("sweep", "0", Finish::FanOut(vec![build("a")])).await;
    h.submit("op", build("b")).await;
    let child = h.sched.list().await.unwrap().into_iter().find(|j| j.parent.as_deref() == Some("sweep"));
    let child = child.expect("the sweep fanned out a child").name;
    assert_eq!(h.ok("busy", "0").await, names(&[("op", "0")]));
    assert_eq!(h.ok("op", "0").await, names(&[(child.as_str(), "0")]));
}
