//! The Jobs mirror: the scheduler owns every DAG in memory; Job objects in the store
//! are its durable mirror for clients. This task writes the scheduler's updates into
//! Job `status`, creates the Job objects of fan-out children (claimed by the run whose
//! scheduler made them), and deletes Jobs that fell out of history. A Job's updates
//! coalesce into one pending status, written at once when a reader waits on it (its
//! first status, a new phase, settling) and otherwise at most once per interval that
//! grows with the Job's size (`coalesce`): a node's transition costs the store O(1)
//! bytes, not a rewrite of every node. At daemon start, Jobs a previous run claimed
//! and left non-terminal are marked `Interrupted`: the boot reconcile re-derives the
//! work, and no claimed Job is ever run twice. Unclaimed Jobs (written while no daemon
//! ran) are left for the intake, which runs them. The terminal Jobs earlier runs left
//! ([`settled`], Interrupted ones included) begin the scheduler's history, so at most 5
//! per template stay stored across restarts too.

use hive_api::job::{Job, JobClaim, JobPhase, JobStatus};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::client::{self, Api};
use crate::scheduler::{JobSnapshot, JobUpdate, SettledJob};
use crate::store::{self, Store};

mod coalesce;

use coalesce::Coalescer;

pub use coalesce::{MAX_STALENESS, WRITE_RATE};

/// Batches taken from the channel at most before what is due is written, so a flood of
/// updates never holds a due status back.
const DRAIN: usize = 1024;

/// Applies batches of scheduler updates until the scheduler drops its sender, then
/// writes what is pending; fan-out children are written unclaimed (for a scheduler with
/// no intake beside it).
pub async fn run(store: Store, updates: mpsc::UnboundedReceiver<Vec<JobUpdate>>) {
    mirror(store, updates, None).await
}

/// [`run`] for the scheduler of daemon run `run`: the children it fans out are written
/// claimed by that run, so no intake takes them a second time.
pub async fn run_claimed(store: Store, updates: mpsc::UnboundedReceiver<Vec<JobUpdate>>, run: String) {
    mirror(store, updates, Some(run)).await
}

async fn mirror(store: Store, mut updates: mpsc::UnboundedReceiver<Vec<JobUpdate>>, run: Option<String>) {
    let mirror = Mirror { jobs: Api::<Job>::new(&store), run };
    let mut pending = Coalescer::default();
    loop {
        let next_due = pending.next_due();
        let batch = tokio::select! {
            batch = updates.recv() => batch,
            () = sleep_until(next_due) => {
                for snapshot in pending.take_due(Some(Instant::now())) {
                    mirror.write(&mut pending, snapshot).await;
                }
                continue;
            }
        };
        let Some(batch) = batch else { break };
        mirror.take(&mut pending, batch).await;
        for _ in 1..DRAIN {
            let Ok(batch) = updates.try_recv() else { break };
            mirror.take(&mut pending, batch).await;
        }
        for snapshot in pending.take_due(Some(Instant::now())) {
            mirror.write(&mut pending, snapshot).await;
        }
    }
    // The scheduler is gone (shutdown): what is pending is written once, not retried.
    for snapshot in pending.take_due(None) {
        mirror.write(&mut pending, snapshot).await;
    }
}

/// Sleeps until `due`, or forever when nothing is due.
async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// The mirror's writer: the Jobs it writes and the daemon run it writes for.
struct Mirror {
    jobs: Api<Job>,
    run: Option<String>,
}

impl Mirror {
    /// Takes one batch in order: a creation and a removal are written at once (a
    /// removed Job's pending status is dropped), a status change is merged into the
    /// Job's pending status.
    async fn take(&self, pending: &mut Coalescer, batch: Vec<JobUpdate>) {
        for update in batch {
            let result = match update {
                JobUpdate::Created { name, spec } => {
                    let mut child = Job::new(name, (*spec).clone());
                    child.status.claim = self.run.as_ref().map(|run| JobClaim {
                        run: run.clone(),
                        at: hive_api::Time(self.jobs.store().now()),
                    });
                    match self.jobs.create(&child).await {
                        Err(client::Error::Store(store::Error::AlreadyExists { .. })) => Ok(()),
                        other => other.map(drop),
                    }
                }
                JobUpdate::Changed(snapshot) => {
                    pending.merge(snapshot, Instant::now());
                    Ok(())
                }
                JobUpdate::Removed { name } => {
                    pending.forget(&name);
                    self.jobs.delete(&name).await.map(drop)
                }
            };
            match result {
                Ok(()) => {}
                // The daemon is stopping: the next start marks unfinished Jobs interrupted.
                Err(err) if err.is_shut_down() => tracing::debug!(error = %err, "the Jobs mirror stops"),
                Err(err) => tracing::warn!(error = %err, "the Jobs mirror could not write an update"),
            }
        }
    }

    /// Writes one Job's pending status. Only the object this run claimed mirrors its
    /// DAG: a Job deleted while it ran and created again under its name waits,
    /// unclaimed, for the old DAG to settle, and must not show that DAG's progress.
    async fn write(&self, pending: &mut Coalescer, snapshot: JobSnapshot) {
        let run = self.run.as_deref();
        let ours = |status: &JobStatus| match (run, &status.claim) {
            (Some(run), Some(claim)) => claim.run == run,
            (Some(_), None) => false,
            (None, _) => true,
        };
        let written = self.jobs.patch_status(&snapshot.name, |status| {
            if ours(status) {
                snapshot.apply_to(status)
            }
        });
        match written.await {
            Ok(_) => {
                let bytes = self.jobs.get_raw(&snapshot.name).map_or(0, |o| o.len());
                pending.written(&snapshot, Instant::now(), bytes);
            }
            Err(err) if err.is_not_found() => pending.forget(&snapshot.name),
            Err(err) if err.is_shut_down() => {
                tracing::debug!(error = %err, job = %snapshot.name, "the Jobs mirror stops");
            }
            Err(err) => {
                tracing::warn!(error = %err, job = %snapshot.name, "the Jobs mirror could not write a status");
                pending.failed(snapshot, Instant::now());
            }
        }
    }
}

/// Marks every Job a previous run claimed and left unfinished as `Interrupted`, naming
/// why; a Job without a claim but with a phase (mirrored by a daemon from before claims)
/// too. Jobs still waiting for an intake are left alone. Returns the names marked.
///
/// With one daemon per store, every claim at boot is an earlier run's. (A daemon that
/// shares its store with others would mark only its own runs' Jobs.)
pub async fn mark_interrupted(store: &Store) -> client::Result<Vec<String>> {
    let jobs = Api::<Job>::new(store);
    let now = hive_api::Time(store.now());
    let mut marked = Vec::new();
    for job in jobs.list().1 {
        if job.status.settled() || (job.status.claim.is_none() && job.status.phase.is_none()) {
            continue;
        }
        let name = job.metadata.name;
        let result = jobs
            .patch_status(&name, |status| {
                status.phase = Some(JobPhase::Interrupted);
                status.message = Some(
                    "the daemon stopped before this Job finished; the boot reconcile re-derives its work"
                        .into(),
                );
                status.finished_at = Some(now);
            })
            .await;
        match result {
            Ok(_) => marked.push(name),
            Err(err) if err.is_not_found() => {}
            Err(err) => return Err(err),
        }
    }
    Ok(marked)
}

/// The terminal Jobs in the store, oldest first: by when they settled, then by
/// resourceVersion (Jobs interrupted at one start share their `finishedAt`). At daemon
/// start these are what earlier runs left, for the scheduler's history
/// ([`Scheduler::start_after`](crate::scheduler::Scheduler::start_after)).
pub fn settled(store: &Store) -> Vec<SettledJob> {
    let revision = |job: &Job| job.metadata.resource_version.as_deref().and_then(|rv| rv.parse::<u64>().ok());
    let mut settled: Vec<Job> =
        Api::<Job>::new(store).list().1.into_iter().filter(|j| j.status.settled()).collect();
    settled.sort_by_cached_key(|job| (job.status.finished_at, revision(job)));
    settled
        .into_iter()
        .map(|job| SettledJob { name: job.metadata.name, template: job.spec.template })
        .collect()
}

#[cfg(test)]
mod tests {
    const KIND: &str = "jobs";

    use std::collections::HashSet;
    use std::time::Duration;

    use hive_api::job::{JobSource, JobTemplate};
    use serde_json::Value;

    use serde_json::json;

    use super::*;
    use crate::scheduler::{Executor, NodeError, NodeOutcome, NodeRun, Scheduler, SchedulerConfig};
    use crate::store::Mutation;
    use crate::store::StoreConfig;
    use crate::submit::{self, LiveState, Request};

    /// Succeeds every node, except Reconcile of agent `bad`.
    struct Scripted;

    impl Executor for Scripted {
        async fn run(&self, node: NodeRun) -> Result<NodeOutcome, NodeError> {
            node.ctx.set_step("working");
            node.ctx.log(b"did the thing\n");
            if node.agent() == Some("bad") && node.id().ends_with("/reconcile") {
                return Err(NodeError::Failed("the agent did not come up".into()));
            }
            Ok(NodeOutcome::default())
        }
    }

    struct NothingRuns;

    impl LiveState for NothingRuns {
        fn is_running(&self, _: &str) -> bool {
            false
        }
    }

    fn agent(name: &str) -> Value {
        json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
               "spec": {"wanted": "Offline", "config": {"repo": "r"}, "runtime": {"type": "process", "process": {"command": ["x"]}}}})
    }

    async fn phase_of(store: &Store, job: &str) -> Option<String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let phase =
                store.get(KIND, job).and_then(|j| j.value()["status"]["phase"].as_str().map(str::to_string));
            if phase.as_deref().is_some_and(|p| !matches!(p, "Queued" | "Running"))
                || tokio::time::Instant::now() > deadline
            {
                return phase;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn submitted_jobs_run_and_their_status_lands_in_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        for name in ["good", "bad"] {
            store.commit(Mutation::Create { kind: "agents", object: agent(name) }, false).await.unwrap();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let mirror = tokio::spawn(run(store.clone(), rx));
        let scheduler = Scheduler::start(Scripted, tx, SchedulerConfig::default());

        let mut names = Vec::new();
        for agent in ["good", "bad"] {
            let request = Request {
                template: JobTemplate::Start,
                agents: vec![agent.into()],
                source: JobSource::Cli,
                reason: None,
                name: None,
                scheduling: Default::default(),
            };
            let job = submit::submit(&store, &NothingRuns, &request).await.unwrap();
            let name = job.metadata.name.clone();
            scheduler.submit(name.clone(), job.spec).await.unwrap();
            names.push(name);
        }
        assert_eq!(phase_of(&store, &names[0]).await.as_deref(), Some("Done"));
        assert_eq!(phase_of(&store, &names[1]).await.as_deref(), Some("Failed"));
        let failed = store.get(KIND, &names[1]).unwrap().value();
        let nodes = failed["status"]["nodes"].as_array().unwrap();
        let states: HashSet<(&str, &str)> =
            nodes.iter().map(|n| (n["id"].as_str().unwrap(), n["state"].as_str().unwrap())).collect();
        assert!(states.contains(&("bad/set-wanted", "Done")), "{states:?}");
        assert!(states.contains(&("bad/reconcile", "Failed")), "{states:?}");
        assert!(nodes.iter().any(|n| n["error"].as_str().is_some_and(|e| e.contains("did not come up"))));

        scheduler.shutdown().await;
        drop(scheduler);
        let _ = tokio::time::timeout(Duration::from_secs(5), mirror).await;
    }

    /// Succeeds every node once its pace of (paused) time has passed.
    struct Paced(Duration);

    impl Executor for Paced {
        async fn run(&self, _node: NodeRun) -> Result<NodeOutcome, NodeError> {
            tokio::time::sleep(self.0).await;
            Ok(NodeOutcome::default())
        }
    }

    // Regression (issue 28, item 4): the mirror rewrote a Job's whole status once per
    // scheduler turn, so an N-node chain wrote N statuses of up to N nodes: O(N²) bytes
    // (10.6 GB for 5,000 nodes). Now its bytes are linear in N: a few whole statuses at
    // once (the first, settling) and node changes at most `WRITE_RATE` a second.
    #[tokio::test(start_paused = true)]
    async fn a_chain_job_costs_the_store_bytes_linear_in_its_length() {
        use hive_api::job::{Edge, JobNode, JobNodeKind};
        const NODES: usize = 400;
        const PACE: Duration = Duration::from_millis(1);
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            retention_bytes: 4 << 30,
            watch_buffer_bytes: 4 << 30,
            ..StoreConfig::new(dir.path().join("hive.redb"))
        };
        let store = Store::open(config).unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let mirror = tokio::spawn(run(store.clone(), rx));
        let scheduler = Scheduler::start(Paced(PACE), tx, SchedulerConfig::default());
        let nodes = (0..NODES)
            .map(|i| {
                let node = JobNode::new(format!("n{i}"), JobNodeKind::Reconcile, Some("a"));
                if i == 0 {
                    node
                } else {
                    node.after(format!("n{}", i - 1), Edge::AfterOk)
                }
            })
            .collect();
        let spec = hive_api::JobSpec { template: JobTemplate::Reconcile, nodes, ..Default::default() };
        let created = Api::<Job>::new(&store).create(&Job::new("chain", spec.clone())).await.unwrap();
        let from = created.metadata.resource_version.unwrap().parse::<u64>().unwrap();
        let mut watch = store.watch(KIND, from).unwrap();
        scheduler.submit("chain", spec).await.unwrap();

        // Every status write of the Job, until the one that settles it.
        let (mut writes, mut bytes) = (0, 0);
        let last = loop {
            let event = watch.next().await.unwrap().unwrap();
            writes += 1;
            bytes += event.object.len();
            let job: Job = event.object.decode().unwrap();
            if job.status.finished_at.is_some() {
                break job;
            }
        };
        assert_eq!(last.status.phase, Some(JobPhase::Done));
        assert_eq!(last.status.nodes.len(), NODES, "every node's state at the end");
        assert!(last.status.nodes.iter().all(|n| n.state == hive_api::job::JobNodeState::Done));
        let size = store.get(KIND, "chain").unwrap().len();
        // Linear: a bounded number of whole statuses, whatever the chain's length. Before,
        // 401 writes of up to 84 KB, 26 MB in all (314 times the Job); now the first
        // status and the settled one, and at a pace of 1 ms a node `WRITE_RATE` allows
        // about one more whole status.
        assert!(bytes <= 8 * size, "{writes} status writes, {bytes} bytes for a {size}-byte Job");
        scheduler.shutdown().await;
        drop(scheduler);
        let _ = tokio::time::timeout(Duration::from_secs(5), mirror).await;
    }

    #[tokio::test]
    async fn jobs_left_running_are_marked_interrupted_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let claim = json!({"run": "run-0", "at": "2026-01-01T00:00:00Z"});
        let cases = [
            ("a", json!({"phase": "Running", "claim": claim})),
            ("b", json!({"phase": "Done", "claim": claim})),
            ("c", json!({"claim": claim})),
            ("d", json!({})),
            ("e", json!({"phase": "Queued"})),
        ];
        for (name, status) in cases {
            let job = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": name},
                                 "spec": {"template": "Reconcile", "nodes": [{"id": "a/reconcile", "kind": "Reconcile", "agent": "a"}]}, "status": status});
            store.commit(Mutation::Create { kind: KIND, object: job }, false).await.unwrap();
        }
        let marked = mark_interrupted(&store).await.unwrap();
        assert_eq!(marked, ["a", "c", "e"], "claimed (or mirrored) and unfinished");
        // The history of the next run begins with every terminal Job, the Interrupted
        // ones (marked last, so newest) included; the one waiting for an intake is not.
        let names: Vec<String> = settled(&store).into_iter().map(|j| j.name).collect();
        assert_eq!(names, ["b", "a", "c", "e"]);
        assert_eq!(store.get(KIND, "a").unwrap().value()["status"]["phase"], "Interrupted");
        assert_eq!(store.get(KIND, "b").unwrap().value()["status"]["phase"], "Done");
        assert!(
            store.get(KIND, "d").unwrap().value()["status"].get("phase").is_none(),
            "left for the intake"
        );
    }
}
