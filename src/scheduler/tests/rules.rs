//! One test per scheduler rule, each a small scripted scenario.

use hive_api::job::{Edge, JobNode, JobNodeKind, JobNodeState, JobPhase, JobTemplate};
use hive_api::validation::Reason;

use super::*;
use crate::scheduler::Error;
use JobNodeKind::*;

#[tokio::test]
async fn a_node_waits_for_its_deps() {
    let mut h = Harness::slots(1);
    let started = h.submit("j", job(JobTemplate::Stop, chain("a", &[SetWanted, Signal, Reconcile]))).await;
    assert_eq!(started, names(&[("j", "0")]));
    assert_eq!(h.phase("j").await, JobPhase::Running);
    assert_eq!(h.ok("j", "0").await, names(&[("j", "1")]));
    assert_eq!(h.ok("j", "1").await, names(&[("j", "2")]));
    assert_eq!(h.ok("j", "2").await, vec![]);
    assert_eq!(h.phase("j").await, JobPhase::Done);
}

#[tokio::test]
async fn a_failed_dep_cancels_after_ok_dependents_transitively() {
    let mut h = Harness::slots(1);
    let mut nodes = chain("a", &[SetWanted, Signal, Drain]);
    nodes.push(JobNode::new("other", Reconcile, Some("b")));
    h.submit("j", job(JobTemplate::Stop, nodes)).await;
    assert_eq!(h.finish("j", "0", Finish::Fail("disk full".into())).await, vec![]);
    assert_eq!(h.state("j", "1").await, JobNodeState::Cancelled);
    assert_eq!(h.state("j", "2").await, JobNodeState::Cancelled);
    let snap = h.sched.snapshot("j").await.unwrap();
    assert_eq!(snap.nodes[0].error.as_deref(), Some("disk full"));
    assert_eq!(snap.nodes[1].error.as_deref(), Some("cancelled: dep 0 failed"));
    assert_eq!(snap.nodes[2].error.as_deref(), Some("cancelled: dep 1 was cancelled"));
    // The independent subgraph still runs: the Job is Failed already (the document's
    // roll-up) but settles only when every node is terminal.
    assert_eq!(snap.phase, JobPhase::Failed);
    assert!(snap.finished_at.is_none());
    h.ok("j", "other").await;
    assert_eq!(h.phase("j").await, JobPhase::Failed);
    assert!(h.sched.snapshot("j").await.unwrap().finished_at.is_some());
}

fn rebuild(agent: &str) -> JobSpec {
    let mut nodes = chain(agent, &[Prebuild, StopForUpdate, Swap]);
    nodes.push(JobNode::new("reconcile", Reconcile, Some(agent)).after("2", Edge::AfterAny));
    job(JobTemplate::Rebuild, nodes)
}

#[tokio::test]
async fn reconcile_after_swap_runs_either_way() {
    for swap_fails in [false, true] {
        let mut h = Harness::slots(1);
        h.submit("r", rebuild("a")).await;
        h.ok("r", "0").await;
        h.ok("r", "1").await;
        let how = if swap_fails { Finish::Fail("swap failed".into()) } else { Finish::Ok };
        assert_eq!(h.finish("r", "2", how).await, names(&[("r", "reconcile")]));
        // While the Reconcile runs: Failed at once after a failed Swap, else Running.
        let running = h.sched.snapshot("r").await.unwrap();
        let want = if swap_fails { JobPhase::Failed } else { JobPhase::Running };
        assert_eq!(running.phase, want, "roll-up while the AfterAny Reconcile runs");
        assert!(running.finished_at.is_none(), "not settled while the Reconcile runs");
        h.ok("r", "reconcile").await;
        let want = if swap_fails { JobPhase::Failed } else { JobPhase::Done };
        assert_eq!(h.phase("r").await, want);
        assert_eq!(h.state("r", "reconcile").await, JobNodeState::Done);
    }
}

#[tokio::test]
async fn heavy_nodes_never_exceed_build_slots() {
    let mut h = Harness::slots(2);
    for (i, agent) in ["a", "b", "c"].iter().enumerate() {
        h.submit(&format!("p{i}"), job(JobTemplate::Rebuild, chain(agent, &[Prebuild]))).await;
    }
    assert_eq!(h.running_names(), ["p0/0", "p1/0"]);
    // A cheap node needs no slot.
    assert_eq!(
        h.submit("cheap", job(JobTemplate::Stop, chain("d", &[Signal]))).await,
        names(&[("cheap", "0")])
    );
    assert_eq!(h.ok("p1", "0").await, names(&[("p2", "0")]));
}

#[tokio::test]
async fn builds_of_placed_agents_take_their_nodes_slots_not_the_daemons() {
    // Agents n1a, n1b, n1c build on node-1 (2 slots), n2a on node-2 (1 slot); the
    // rest on the daemon's host (1 slot).
    let hosts = crate::scheduler::BuildHosts::new(|agent| match agent {
        a if a.starts_with("n1") => Some(("node-1".into(), 2)),
        a if a.starts_with("n2") => Some(("node-2".into(), 1)),
        _ => None,
    });
    let mut h =
        Harness::new(SchedulerConfig { build_slots: 1, build_hosts: hosts, ..SchedulerConfig::default() });
    for agent in ["local1", "n1a", "n1b", "n1c", "n2a", "local2"] {
        h.submit(agent, job(JobTemplate::Rebuild, chain(agent, &[Prebuild]))).await;
    }
    // One local build (the daemon's slot), two on node-1, one on node-2.
    assert_eq!(h.running_names(), ["local1/0", "n1a/0", "n1b/0", "n2a/0"]);
    // A node's slot freed starts that node's next build only.
    assert_eq!(h.ok("n1a", "0").await, names(&[("n1c", "0")]));
    assert_eq!(h.ok("n2a", "0").await, vec![]);
    assert_eq!(h.ok("local1", "0").await, names(&[("local2", "0")]));
}

#[tokio::test]
async fn the_lease_is_held_until_the_dag_is_terminal() {
    let mut h = Harness::slots(1);
    // Signal(a) takes the lease; the DAG keeps it through its exempt Prebuild.
    h.submit("one", job(JobTemplate::Rebuild, chain("a", &[Signal, Prebuild]))).await;
    assert!(h.sched.leased_agents().contains("a"));
    assert_eq!(h.submit("two", job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await, vec![]);
    assert_eq!(h.ok("one", "0").await, names(&[("one", "1")]));
    assert!(h.sched.leased_agents().contains("a"));
    assert!(!h.is_running("two", "0"));
    assert_eq!(h.ok("one", "1").await, names(&[("two", "0")]));
    h.ok("two", "0").await;
    assert!(h.sched.leased_agents().is_empty());
}

#[tokio::test]
async fn lease_exempt_nodes_run_under_another_dags_lease() {
    let mut h = Harness::slots(1);
    h.submit("stop", job(JobTemplate::Stop, chain("a", &[SetWanted]))).await;
    // The rebuild's Prebuild runs while the stop holds a; its StopForUpdate waits.
    assert_eq!(h.submit("rebuild", rebuild("a")).await, names(&[("rebuild", "0")]));
    assert_eq!(h.ok("rebuild", "0").await, vec![]);
    assert_eq!(h.state("rebuild", "1").await, JobNodeState::Queued);
    assert_eq!(h.ok("stop", "0").await, names(&[("rebuild", "1")]));
}

#[tokio::test]
async fn a_dag_spanning_agents_holds_one_lease_per_agent() {
    let mut h = Harness::slots(1);
    let mut nodes = chain("a", &[SetWanted, Reconcile]);
    nodes.push(JobNode::new("b-wanted", SetWanted, Some("b")));
    let started = h.submit("stop", job(JobTemplate::Stop, nodes)).await;
    assert_eq!(started, names(&[("stop", "0"), ("stop", "b-wanted")]));
    let leased = h.sched.leased_agents();
    assert!(leased.contains("a") && leased.contains("b"), "{leased:?}");
    assert_eq!(h.submit("other", job(JobTemplate::Reconcile, chain("b", &[Reconcile]))).await, vec![]);
    // b's own subgraph is done, but the DAG still runs on a: b stays leased.
    h.ok("stop", "b-wanted").await;
    assert!(!h.is_running("other", "0"));
    h.ok("stop", "0").await;
    assert_eq!(h.ok("stop", "1").await, names(&[("other", "0")]));
}

#[tokio::test]
async fn submit_order_wins_for_slots_and_leases() {
    let mut h = Harness::slots(1);
    h.submit("busy", job(JobTemplate::Rebuild, chain("z", &[Prebuild]))).await;
    for i in 1..=3 {
        h.submit(&format!("p{i}"), job(JobTemplate::Rebuild, chain(&format!("x{i}"), &[Prebuild]))).await;
    }
    assert_eq!(h.ok("busy", "0").await, names(&[("p1", "0")]));
    assert_eq!(h.ok("p1", "0").await, names(&[("p2", "0")]));
    assert_eq!(h.ok("p2", "0").await, names(&[("p3", "0")]));

    h.submit("hold", job(JobTemplate::Stop, chain("a", &[SetWanted]))).await;
    h.submit("l1", job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await;
    h.submit("l2", job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await;
    assert_eq!(h.ok("hold", "0").await, names(&[("l1", "0")]));
    assert_eq!(h.ok("l1", "0").await, names(&[("l2", "0")]));
}

#[tokio::test]
async fn a_slot_waiter_keeps_its_lease_from_later_dags() {
    let mut h = Harness::slots(1);
    h.submit("build", job(JobTemplate::Rebuild, chain("x", &[Prebuild]))).await;
    // swap(a) could take a's lease but waits for the slot; a later cheap Reconcile(a)
    // must not jump in and take the lease.
    assert_eq!(h.submit("swap", job(JobTemplate::Rebuild, chain("a", &[Swap]))).await, vec![]);
    assert_eq!(h.submit("late", job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await, vec![]);
    assert_eq!(h.ok("build", "0").await, names(&[("swap", "0")]));
    assert_eq!(h.ok("swap", "0").await, names(&[("late", "0")]));
}

#[tokio::test]
async fn crossed_multi_agent_dags_do_not_deadlock() {
    let mut h = Harness::slots(2);
    // one: takes y at once, and x after its Prebuild of x.
    let mut nodes = chain("x", &[Prebuild, StopForUpdate]);
    nodes.push(JobNode::new("y", Signal, Some("y")));
    h.submit("one", job(JobTemplate::Rebuild, nodes)).await;
    // two: wants x and y at once. Giving it x would leave each waiting for the other.
    let two = vec![JobNode::new("x", SetWanted, Some("x")), JobNode::new("y", SetWanted, Some("y"))];
    assert_eq!(h.submit("two", job(JobTemplate::Stop, two)).await, vec![]);
    assert_eq!(h.ok("one", "0").await, names(&[("one", "1")]));
    h.ok("one", "y").await;
    let started = h.ok("one", "1").await;
    assert_eq!(started, names(&[("two", "x"), ("two", "y")]));
    h.ok("two", "x").await;
    h.ok("two", "y").await;
    assert_eq!(h.phase("two").await, JobPhase::Done);
}

/// Regression: leases granted earlier in the same pass were invisible to the deadlock
/// check, so two DAGs released at once each took one of the other's agents.
#[tokio::test]
async fn leases_taken_in_one_pass_count_for_the_deadlock_check() {
    let mut h = Harness::slots(1);
    let hold = vec![JobNode::new("b", SetWanted, Some("b")), JobNode::new("c", SetWanted, Some("c"))];
    h.submit("hold", job(JobTemplate::Stop, hold)).await;
    // first: c, then b. second: b and c at once. Both wait for hold.
    let first = vec![
        JobNode::new("c", SetWanted, Some("c")),
        JobNode::new("b", SetWanted, Some("b")).after("c", Edge::AfterOk),
    ];
    assert_eq!(h.submit("first", job(JobTemplate::Stop, first)).await, vec![]);
    let second = vec![JobNode::new("b", SetWanted, Some("b")), JobNode::new("c", SetWanted, Some("c"))];
    assert_eq!(h.submit("second", job(JobTemplate::Stop, second)).await, vec![]);
    h.ok("hold", "b").await;
    // When hold ends, first takes c; second must not take b in the same pass.
    assert_eq!(h.ok("hold", "c").await, names(&[("first", "c")]));
    assert_eq!(h.ok("first", "c").await, names(&[("first", "b")]));
    assert_eq!(h.ok("first", "b").await, names(&[("second", "b"), ("second", "c")]));
}

#[tokio::test]
async fn cancel_applies_only_to_fully_queued_dags() {
    let mut h = Harness::slots(1);
    h.submit("running", job(JobTemplate::Stop, chain("a", &[SetWanted, Reconcile]))).await;
    h.submit("queued", job(JobTemplate::Start, chain("a", &[SetWanted, Reconcile]))).await;
    let err = h.sched.cancel("running").await.unwrap_err();
    assert!(matches!(err, Error::NotCancellable { phase: JobPhase::Running, .. }), "{err}");
    assert!(err.to_string().contains("only a job whose nodes are all still queued"), "{err}");
    let cancelled = h.sched.cancel("queued").await.unwrap();
    assert_eq!(cancelled.agents, ["a"]);
    assert_eq!(cancelled.template, JobTemplate::Start);
    assert_eq!(cancelled.spec.nodes.len(), 2);
    assert_eq!(h.phase("queued").await, JobPhase::Cancelled);
    assert_eq!(h.state("queued", "1").await, JobNodeState::Cancelled);
    assert!(matches!(h.sched.cancel("queued").await, Err(Error::NotCancellable { .. })));
    assert!(matches!(h.sched.cancel("nope").await, Err(Error::NotFound { .. })));
    // The lease frees for nobody: the cancelled DAG never runs.
    h.ok("running", "0").await;
    assert_eq!(h.ok("running", "1").await, vec![]);
}

#[tokio::test]
async fn fan_out_appends_children_and_cancel_children_stops_queued_ones() {
    let mut h = Harness::slots(1);
    h.submit("hold", job(JobTemplate::Stop, chain("b", &[SetWanted]))).await;
    h.submit("meta", job(JobTemplate::MetaUpdate, vec![JobNode::new("lock", MetaLock, None)])).await;
    let children = vec![rebuild("a"), job(JobTemplate::Reconcile, chain("b", &[Reconcile]))];
    let started = h.finish("meta", "lock", Finish::FanOut(children)).await;
    assert_eq!(started, names(&[("meta-1", "0")]));
    let parent = h.sched.snapshot("meta").await.unwrap();
    assert_eq!(parent.children, ["meta-1", "meta-2"]);
    assert_eq!(parent.phase, JobPhase::Done);
    let child = h.sched.snapshot("meta-2").await.unwrap();
    assert_eq!(child.parent.as_deref(), Some("meta"));
    let cancelled = h.sched.cancel_children("meta").await.unwrap();
    assert_eq!(cancelled.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["meta-2"]);
    assert_eq!(h.phase("meta-1").await, JobPhase::Running);
    assert_eq!(h.phase("meta-2").await, JobPhase::Cancelled);

    // A node that fails fans out nothing.
    h.submit("meta2", job(JobTemplate::MetaUpdate, vec![JobNode::new("lock", MetaLock, None)])).await;
    h.ok("meta-1", "0").await;
    let how = Finish::Fail("bump failed".into());
    // The scripted Fail arm does not fan out; check no child appears.
    h.finish("meta2", "lock", how).await;
    assert!(h.sched.snapshot("meta2").await.unwrap().children.is_empty());
}

#[tokio::test]
async fn history_keeps_five_terminal_dags_per_template() {
    let mut h = Harness::slots(1);
    for i in 0..7 {
        let name = format!("r{i}");
        h.submit(&name, job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await;
        h.ok(&name, "0").await;
    }
    h.submit("s", job(JobTemplate::Stop, chain("b", &[SetWanted]))).await;
    h.ok("s", "0").await;
    let kept: Vec<String> = h.sched.list().await.unwrap().into_iter().map(|j| j.name).collect();
    assert_eq!(kept, ["r2", "r3", "r4", "r5", "r6", "s"]);
    let mut removed = Vec::new();
    while let Ok(batch) = h.updates.try_recv() {
        for update in batch {
            if let JobUpdate::Removed { name } = update {
                removed.push(name);
            }
        }
    }
    assert_eq!(removed, ["r0", "r1"]);
    assert!(matches!(h.sched.snapshot("r0").await, Err(Error::NotFound { .. })));
}

// Issue 26, item 5: the history began empty at every daemon start, so the Jobs of
// earlier runs were never pruned.
#[tokio::test]
async fn history_begins_with_the_terminal_jobs_an_earlier_run_left() {
    let old = |name: &str, template| SettledJob { name: name.into(), template };
    let mut settled: Vec<SettledJob> =
        (0..7).map(|i| old(&format!("old{i}"), JobTemplate::Reconcile)).collect();
    settled.push(old("old-stop", JobTemplate::Stop));
    let mut h = Harness::after(SchedulerConfig::default(), settled);
    // At once, before anything runs: the oldest past five per template.
    h.settle(&[]).await;
    assert_eq!(h.removed(), ["old0", "old1"]);
    // This run's Jobs push the earlier run's out, oldest first.
    h.submit("r", job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await;
    h.ok("r", "0").await;
    assert_eq!(h.removed(), ["old2"]);
    // A Job written again under a kept name is the new Job: it is not pruned as the
    // old one, and counts as this run's.
    h.submit("old3", job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await;
    h.ok("old3", "0").await;
    assert_eq!(h.removed(), Vec::<String>::new());
    h.submit("r2", job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await;
    h.ok("r2", "0").await;
    assert_eq!(h.removed(), ["old4"]);
    assert_eq!(h.phase("old3").await, JobPhase::Done);
}

#[tokio::test]
async fn updates_are_batched_per_turn() {
    let mut h = Harness::slots(1);
    h.submit("j", job(JobTemplate::Stop, chain("a", &[SetWanted, Reconcile]))).await;
    let mut batches = Vec::new();
    while let Ok(batch) = h.updates.try_recv() {
        batches.push(batch);
    }
    // Submit and the start of the root land in one turn: one complete snapshot.
    let [first] = &batches[..] else { panic!("{batches:?}") };
    let [JobUpdate::Changed(snap)] = &first[..] else { panic!("{first:?}") };
    assert!(snap.complete);
    assert_eq!(snap.phase, JobPhase::Running);
    h.ok("j", "0").await;
    let batch = h.updates.try_recv().unwrap();
    let [JobUpdate::Changed(delta)] = &batch[..] else { panic!("{batch:?}") };
    assert!(!delta.complete);
    let states: Vec<_> = delta.nodes.iter().map(|n| (n.id.as_str(), n.state)).collect();
    assert_eq!(states, [("0", JobNodeState::Done), ("1", JobNodeState::Running)]);
}

#[tokio::test]
async fn step_labels_and_build_logs_follow_a_running_node() {
    let mut h = Harness::new(SchedulerConfig { log_limit: 64, ..SchedulerConfig::default() });
    h.submit("b", job(JobTemplate::Rebuild, chain("a", &[Prebuild]))).await;
    let ctx = h.running[0].ctx.clone();
    ctx.set_step("building toplevel");
    ctx.log(b"line 1\n");
    let (so_far, follower) = h.sched.log("b", "0").await.unwrap();
    assert_eq!(so_far, b"line 1\n");
    let mut follower = follower.expect("node is running");
    ctx.log(b"line 2\n");
    assert_eq!(follower.recv().await.unwrap(), &b"line 2\n"[..]);
    h.settle(&[]).await;
    let snap = h.sched.snapshot("b").await.unwrap();
    assert_eq!(snap.nodes[0].step.as_deref(), Some("building toplevel"));
    assert_eq!(snap.nodes[0].log_ref.as_deref(), Some("b/0"));
    h.ok("b", "0").await;
    assert!(follower.recv().await.is_none());
    let (all, done) = h.sched.log("b", "0").await.unwrap();
    assert_eq!(all, b"line 1\nline 2\n");
    assert!(done.is_none());
    assert!(matches!(h.sched.log("b", "zz").await, Err(Error::NodeNotFound { .. })));
}

#[tokio::test]
async fn invalid_jobs_are_rejected_with_field_paths() {
    let h = Harness::slots(1);
    let cyclic = vec![
        JobNode::new("a", Reconcile, Some("x")).after("b", Edge::AfterOk),
        JobNode::new("b", Reconcile, Some("x")).after("a", Edge::AfterOk),
        JobNode::new("c", Reconcile, Some("x")).after("zz", Edge::AfterOk),
    ];
    let Err(Error::Invalid { errors, .. }) = h.sched.submit("bad", job(JobTemplate::Reconcile, cyclic)).await
    else {
        panic!("accepted a cycle")
    };
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["spec.nodes[2].deps[0]", "spec.nodes[0].deps[0]"],
        "the dangling dep, then the cycle once"
    );
    assert!(errors.iter().all(|e| e.reason == Reason::Invalid));
    let ok = job(JobTemplate::Reconcile, chain("x", &[Reconcile]));
    assert!(matches!(h.sched.submit("Bad_Name", ok.clone()).await, Err(Error::Invalid { .. })));
    h.sched.submit("good", ok.clone()).await.unwrap();
    assert!(matches!(h.sched.submit("good", ok).await, Err(Error::AlreadyExists { .. })));
}

#[tokio::test]
async fn a_panicking_executor_fails_its_node() {
    let mut h = Harness::slots(1);
    h.submit("p", job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await;
    h.finish("p", "0", Finish::Panic).await;
    let snap = h.sched.snapshot("p").await.unwrap();
    assert_eq!(snap.phase, JobPhase::Failed);
    assert!(snap.nodes[0].error.as_deref().unwrap().contains("panicked"), "{:?}", snap.nodes[0]);
}

#[tokio::test]
async fn a_shut_down_scheduler_answers_stopped() {
    let h = Harness::slots(1);
    h.sched.shutdown().await;
    assert!(matches!(h.sched.list().await, Err(Error::Stopped)));
}

/// A Job deleted and created again is submitted under its old name: a settled DAG of that
/// name gives way (silently — a removal would delete the new object) and leaves the
/// history; a queued or running one does not.
#[tokio::test]
async fn a_settled_name_is_taken_by_a_new_job_and_an_unsettled_one_is_not() {
    let mut h = Harness::slots(1);
    h.submit("look", job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await;
    assert!(h.sched.holds_unsettled("look").await.unwrap());
    let again = h.sched.submit("look", job(JobTemplate::Reconcile, chain("a", &[Reconcile]))).await;
    assert!(matches!(again, Err(Error::AlreadyExists { .. })), "{again:?}");
    h.ok("look", "0").await;
    assert!(!h.sched.holds_unsettled("look").await.unwrap());
    while h.updates.try_recv().is_ok() {}

    h.submit("look", job(JobTemplate::Reconcile, chain("b", &[Reconcile]))).await;
    let snapshot = h.sched.snapshot("look").await.unwrap();
    assert_ne!(snapshot.phase, JobPhase::Done, "the new Job, not the settled one");
    h.ok("look", "0").await;
    let kept: Vec<String> = h.sched.list().await.unwrap().into_iter().map(|j| j.name).collect();
    assert_eq!(kept, ["look"], "one Job of that name in the history");
    while let Ok(batch) = h.updates.try_recv() {
        assert!(!batch.iter().any(|u| matches!(u, JobUpdate::Removed { .. })), "nothing was removed");
    }
}
