use std::time::Duration;

use hive_api::job::{Edge, JobNode, JobSource, JobTemplate};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::*;
use crate::runtime::process::{ProcessConfig, ProcessRuntime};
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerHandle};
use crate::store::{Mutation, StoreConfig, Subresource};
use crate::submit::{self, LiveState, Request};

const RUN_SH: &str = r#"trap 'rm -f "$HIVE_FENCE"' USR1
trap 'exit 0' TERM
echo VERSION > "$OUT"
while true; do sleep 0.1; done
"#;

struct Live(Arc<ProcessRuntime>);

impl LiveState for Live {
    fn is_running(&self, agent: &str) -> bool {
        self.0.snapshot().iter().any(|o| o.agent == agent && o.running())
    }
}

struct World {
    store: Store,
    runtime: Arc<ProcessRuntime>,
    scheduler: SchedulerHandle,
}

impl World {
    async fn run(&self, template: JobTemplate) -> (String, Value) {
        let request = Request {
            template,
            agents: vec!["alpha".into()],
            source: JobSource::Cli,
            reason: None,
            name: None,
            scheduling: Default::default(),
        };
        let job = submit::submit(&self.store, &Live(self.runtime.clone()), &request).await.unwrap();
        let name = job.metadata.name.clone();
        self.scheduler.submit(name.clone(), job.spec).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let job = self.store.get("jobs", &name).unwrap().value();
            let phase = job["status"]["phase"].as_str().unwrap_or("Queued").to_string();
            if !matches!(phase.as_str(), "Queued" | "Running") {
                return (phase, job["status"].clone());
            }
            assert!(tokio::time::Instant::now() < deadline, "{template:?} did not finish: {}", job["status"]);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn running(&self) -> bool {
        Live(self.runtime.clone()).is_running("alpha")
    }
}

/// A meta repo, mirrors and markers under `dir`, as the engine wires them.
async fn test_deploy(dir: &std::path::Path) -> Deploy {
    Deploy {
        meta: crate::meta::Meta::open(crate::meta::MetaConfig {
            dir: dir.join("meta"),
            hive_url: "github:hive-dev/hive".into(),
            hive_rev: "test".into(),
            journal: None,
        })
        .await
        .unwrap(),
        resolver: crate::meta::resolve::Resolver::new(dir.join("mirrors")),
        markers: crate::meta::applied::Markers::new(dir.join("applied")),
        hive_rev: "test".into(),
    }
}

/// The inputs kept for the other agents are the stored agents the lock pins, at their
/// locked revs (`rev: None`), sorted, without the one being changed: a pinned agent that
/// is no longer stored is dropped, a stored one the lock does not know is not added,
/// and one stored in a shape this build cannot decode keeps its input (registering
/// another agent used to decode every Agent and drop that one from the meta flake).
#[tokio::test]
async fn locked_inputs_are_the_stored_agents_the_lock_pins_but_one() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(tmp.path().join("hive.redb"))).unwrap();
    for name in ["a", "b", "c", "odd", "unlocked"] {
        let spec = if name == "odd" {
            json!({"config": {"repo": 7}})
        } else {
            json!({"config": {"repo": format!("/srv/agents/{name}")}})
        };
        let agent =
            json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name}, "spec": spec});
        store.commit(Mutation::Create { kind: "agents", object: agent }, false).await.unwrap();
    }
    assert!(Api::<Agent>::new(&store).get("odd").is_err(), "the premise: odd does not decode");
    let deploy = test_deploy(tmp.path()).await;
    let gate = deploy.meta.gate().await;
    let pinned = |name: &str, rev: &str| crate::meta::AgentInput {
        name: name.into(),
        url: format!("/srv/agents/{name}"),
        rev: Some(rev.repeat(40)),
    };
    let pins =
        [pinned("a", "1"), pinned("b", "2"), pinned("c", "3"), pinned("gone", "4"), pinned("odd", "5")];
    deploy.meta.sync_agents(&gate, &pins).await.unwrap();
    drop(gate);

    let inputs = locked_inputs(&store, &deploy.meta, "b").await;
    let kept: Vec<(&str, &str, Option<&str>)> =
        inputs.iter().map(|i| (i.name.as_str(), i.url.as_str(), i.rev.as_deref())).collect();
    assert_eq!(
        kept,
        [("a", "/srv/agents/a", None), ("c", "/srv/agents/c", None), ("odd", "/srv/agents/odd", None)]
    );
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_stop_start_and_rebuild_a_real_agent() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let tmp = tempfile::tempdir().unwrap();
        let repo = crate::runtime::process::testing::config_repo(tmp.path(), RUN_SH);
        let marker = tmp.path().join("marker");
        let store = Store::open(StoreConfig::new(tmp.path().join("hive.redb"))).unwrap();
        let agent = json!({
            "apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "alpha"},
            "spec": {"wanted": "Up", "config": {"repo": repo.display().to_string(), "rev": "v1"},
                     "runtime": {"type": "process", "gracefulStopSeconds": 5,
                                 "process": {"command": ["sh", "run.sh"], "env": {"OUT": marker.display().to_string()}}}}
        });
        store.commit(Mutation::Create { kind: "agents", object: agent }, false).await.unwrap();
        let mut config = ProcessConfig::new(tmp.path().join("agents"));
        config.start_grace = Duration::from_millis(300);
        // Never touch the host's real cgroups from a test.
        config.cgroup_root = tmp.path().join("no-cgroupfs");
        let runtime = Arc::new(ProcessRuntime::new(config));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(crate::jobs::mirror::run(store.clone(), rx));
        let deploy = test_deploy(tmp.path()).await;
        let executor = RuntimeExecutor::new(store.clone(), runtime.clone(), deploy.clone());
        let scheduler = Scheduler::start(executor, tx, SchedulerConfig::default());
        let world = World { store: store.clone(), runtime, scheduler };
        let read_marker = || std::fs::read_to_string(&marker).unwrap_or_default().trim().to_string();

        let (phase, status) = world.run(JobTemplate::Spawn).await;
        assert_eq!(phase, "Done", "{status}");
        assert!(world.running());
        eventually("v1 marker", || read_marker() == "v1").await;

        // A graceful stop: Signal → Drain (the harness clears the fence) → Reconcile.
        let (phase, status) = world.run(JobTemplate::Stop).await;
        assert_eq!(phase, "Done", "{status}");
        let steps: Vec<&str> = status["nodes"].as_array().unwrap().iter().filter_map(|n| n["step"].as_str()).collect();
        assert!(steps.contains(&"drained"), "{steps:?}");
        assert!(!world.running());
        assert_eq!(store.get("agents", "alpha").unwrap().value()["spec"]["wanted"], "Offline");

        let (phase, _) = world.run(JobTemplate::Start).await;
        assert_eq!(phase, "Done");
        assert!(world.running());

        // A new rev: prebuild while v1 serves, stop for the update, swap, start.
        let mut agent = store.get("agents", "alpha").unwrap().value();
        agent["spec"]["config"]["rev"] = json!("v2");
        store.commit(Mutation::Update { kind: "agents", object: agent, subresource: Subresource::Main }, false).await.unwrap();
        std::fs::remove_file(&marker).unwrap();
        let (phase, status) = world.run(JobTemplate::Rebuild).await;
        assert_eq!(phase, "Done", "{status}");
        eventually("v2 marker", || read_marker() == "v2").await;
        assert!(world.running());

        // The meta repo locked each build, and the marker records the running rev.
        let v2 = deploy.meta.locked("alpha").await.expect("alpha is in the meta lock").rev;
        assert_eq!(deploy.markers.read("alpha").unwrap().rev, v2);
        let trail = deploy.meta.log(Some("alpha"), 10).await.unwrap();
        assert!(trail.len() >= 2, "spawn registration and the v2 relock: {trail:?}");
        let ops: Vec<&str> = trail.iter().map(|e| e.op.as_str()).collect();
        assert_eq!(ops[0], "relock", "a rebuild relocks the agent it had registered: {ops:?}");
        assert_eq!(ops.last(), Some(&"sync"), "the spawn registered it: {ops:?}");

        let (phase, _) = world.run(JobTemplate::Kill).await;
        assert_eq!(phase, "Done");
        assert!(!world.running());
        world.scheduler.shutdown().await;
    })
    .await
    .expect("the end-to-end run took longer than 90 s");
}

/// Runs node `id` of `spec` as Job `job` would, outside a scheduler.
async fn run_node(executor: &RuntimeExecutor, job: &str, spec: &Arc<hive_api::JobSpec>, id: &str) -> String {
    let index = spec.nodes.iter().position(|n| n.id == id).unwrap();
    let node = NodeRun::detached(job, spec.clone(), index);
    match executor.run(node).await {
        Ok(outcome) => outcome.step.unwrap_or_default(),
        Err(err) => panic!("{job}/{id}: {err}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_rebuilds_of_one_agent_each_swap_their_own_build() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let tmp = tempfile::tempdir().unwrap();
        let repo = crate::runtime::process::testing::config_repo(tmp.path(), RUN_SH);
        let git = |args: &[&str]| crate::runtime::process::testing::git(&repo, args);
        std::fs::write(repo.join("run.sh"), RUN_SH.replace("VERSION", "v3")).unwrap();
        git(&["commit", "--quiet", "-am", "v3"]);
        git(&["tag", "v3"]);
        let (v2, v3) = (git(&["rev-parse", "v2"]), git(&["rev-parse", "v3"]));
        let store = Store::open(StoreConfig::new(tmp.path().join("hive.redb"))).unwrap();
        let agent = json!({
            "apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "alpha"},
            "spec": {"wanted": "Offline", "config": {"repo": repo.display().to_string(), "rev": "v1"},
                     "runtime": {"type": "process", "process": {"command": ["sh", "run.sh"]}}}
        });
        store.commit(Mutation::Create { kind: "agents", object: agent }, false).await.unwrap();
        let mut config = ProcessConfig::new(tmp.path().join("agents"));
        config.cgroup_root = tmp.path().join("no-cgroupfs");
        let runtime = Arc::new(ProcessRuntime::new(config));
        let deploy = test_deploy(tmp.path()).await;
        let executor = RuntimeExecutor::new(store.clone(), runtime.clone(), deploy.clone());
        let set_rev = |rev: &str| {
            let mut agent = store.get("agents", "alpha").unwrap().value();
            agent["spec"]["config"]["rev"] = json!(rev);
            store.commit(
                Mutation::Update { kind: "agents", object: agent, subresource: Subresource::Main },
                false,
            )
        };
        let spawn = Arc::new(hive_api::JobSpec {
            nodes: vec![JobNode::new("create", JobNodeKind::Create, Some("alpha"))],
            ..Default::default()
        });
        run_node(&executor, "spawn", &spawn, "create").await;
        let rebuild = Arc::new(hive_api::JobSpec {
            template: JobTemplate::Rebuild,
            nodes: vec![
                JobNode::new("prebuild", JobNodeKind::Prebuild, Some("alpha")),
                JobNode::new("stop-for-update", JobNodeKind::StopForUpdate, Some("alpha"))
                    .after("prebuild", Edge::AfterOk),
                JobNode::new("swap", JobNodeKind::Swap, Some("alpha"))
                    .after("stop-for-update", Edge::AfterOk),
            ],
            ..Default::default()
        });
        let current = || async {
            let agent = Api::<Agent>::new(&store).get_existing("alpha").unwrap();
            runtime.observed(&agent).unwrap().generation.unwrap().rev
        };

        // Job a builds v2; before it swaps, Job b (lease-exempt Prebuild) builds v3.
        set_rev("v2").await.unwrap();
        run_node(&executor, "a", &rebuild, "prebuild").await;
        set_rev("v3").await.unwrap();
        run_node(&executor, "b", &rebuild, "prebuild").await;
        run_node(&executor, "a", &rebuild, "stop-for-update").await;
        run_node(&executor, "a", &rebuild, "swap").await;
        assert_eq!(current().await, v2, "Job a's Swap deploys Job a's build");
        assert_eq!(deploy.markers.read("alpha").unwrap().rev, v2);
        run_node(&executor, "b", &rebuild, "stop-for-update").await;
        run_node(&executor, "b", &rebuild, "swap").await;
        assert_eq!(current().await, v3, "Job b's Swap deploys Job b's build");
        assert_eq!(deploy.markers.read("alpha").unwrap().rev, v3);
    })
    .await
    .expect("the interleaved rebuilds took longer than 90 s");
}

/// A Job stored before its params were checked (here a misspelt `force` on a SetWanted,
/// written straight to the store, as an earlier hive admitted it) is still claimed, run
/// and settled: the node whose params do not parse fails, naming the field, its
/// dependents are cancelled, and the rest of the DAG runs. Nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_job_whose_params_do_not_parse_fails_that_node_naming_the_field() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(tmp.path().join("hive.redb"))).unwrap();
        let agent = json!({
            "apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "alpha"},
            "spec": {"wanted": "Offline", "config": {"repo": "/nowhere"},
                     "runtime": {"type": "process", "process": {"command": ["sh", "run.sh"]}}}
        });
        store.commit(Mutation::Create { kind: "agents", object: agent }, false).await.unwrap();
        let job = json!({
            "apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "old"},
            "spec": {"template": "Reconcile", "nodes": [
                {"id": "w", "kind": "SetWanted", "agent": "alpha", "params": {"wanted": "Offline", "force": true}},
                {"id": "r", "kind": "Reconcile", "agent": "alpha", "deps": [{"node": "w"}]},
                {"id": "other", "kind": "Reconcile", "agent": "alpha"}
            ]}
        });
        store.commit(Mutation::Create { kind: "jobs", object: job }, false).await.unwrap();

        let mut config = ProcessConfig::new(tmp.path().join("agents"));
        config.cgroup_root = tmp.path().join("no-cgroupfs");
        let runtime = Arc::new(ProcessRuntime::new(config));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(crate::jobs::mirror::run(store.clone(), rx));
        let executor = RuntimeExecutor::new(store.clone(), runtime.clone(), test_deploy(tmp.path()).await);
        let scheduler = Scheduler::start(executor, tx, SchedulerConfig::default());
        let taken = crate::jobs::intake::take(&store, &Live(runtime), &scheduler, "run-1", "old").await;
        assert!(matches!(taken, Ok(crate::jobs::intake::Taken::Scheduled(_))), "{taken:?}");

        let jobs = Api::<hive_api::Job>::new(&store);
        let job = loop {
            let job = jobs.get_existing("old").unwrap();
            if job.status.settled() {
                break job;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let node = |id: &str| job.status.node(id).cloned().unwrap_or_default();
        assert_eq!(job.status.phase, Some(hive_api::job::JobPhase::Failed), "{:?}", job.status);
        assert_eq!(node("w").state, hive_api::job::JobNodeState::Failed);
        assert_eq!(
            node("w").error.as_deref(),
            Some("the node's params do not parse: spec.nodes[0].params.force: Unsupported value: \"force\" (SetWanted takes: wanted)")
        );
        assert_eq!(node("r").state, hive_api::job::JobNodeState::Cancelled);
        assert_eq!(node("other").state, hive_api::job::JobNodeState::Done, "{:?}", node("other"));
        scheduler.shutdown().await;
    })
    .await
    .expect("the Job took longer than 60 s to settle");
}
