//! The runtime executor: what each scheduler node does to a real agent, through the
//! [`Runtime`] driver, and to the meta repo (`meta.rs`: lock registration, MetaLock,
//! WritePermFile, ApprovalDeploy).

mod meta;
pub(crate) use meta::pr_ref;

pub(crate) use meta::locked_inputs;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::client::Api;
use crate::runtime::{BuildLog, Drain, Generation, Limits, Runtime};
use crate::scheduler::{Executor, NodeContext, NodeError, NodeOutcome, NodeRun};
use crate::store::Store;
use hive_api::agent::{Agent, Wanted};
use hive_api::job::JobNodeKind;

/// What the executor deploys through: the meta repo, the rev resolver, the applied-rev
/// markers, and the hive base rev this daemon locks.
#[derive(Clone)]
pub struct Deploy {
    /// The meta repo.
    pub meta: crate::meta::Meta,
    /// Resolves config revs to commits.
    pub resolver: crate::meta::resolve::Resolver,
    /// Applied-rev markers.
    pub markers: crate::meta::applied::Markers,
    /// The hive base input's current rev (what a boot sweep bumps the lock to).
    pub hive_rev: String,
}

/// Runs nodes against a runtime driver, reading agents from the store.
pub struct RuntimeExecutor {
    store: Store,
    agents: Api<Agent>,
    recorder: crate::client::events::Recorder,
    runtime: Arc<dyn Runtime>,
    deploy: Deploy,
    /// The generation each DAG's Prebuild produced for an agent, keyed by (Job, agent),
    /// for that same DAG's Swap: two rebuilds of one agent whose Prebuilds (lease-exempt)
    /// interleave each deploy their own build.
    prebuilt: Mutex<HashMap<(String, String), Generation>>,
}

impl RuntimeExecutor {
    /// An executor over `runtime`, deploying through `deploy`.
    pub fn new(store: Store, runtime: Arc<dyn Runtime>, deploy: Deploy) -> RuntimeExecutor {
        let recorder = crate::client::events::Recorder::new(store.clone(), "hive-scheduler");
        RuntimeExecutor {
            agents: Api::new(&store),
            store,
            recorder,
            runtime,
            deploy,
            prebuilt: Mutex::new(HashMap::new()),
        }
    }

    /// Applies the agent's limits and records whether the host enforces them in its
    /// `LimitsEnforced` condition.
    async fn write_limits(&self, agent: &Agent) -> Result<Limits, NodeError> {
        use hive_api::meta::{set_condition, Condition, ConditionStatus, Time};
        let limits = self.runtime.write_limits(agent).await.map_err(failed)?;
        let (status, reason) = if limits.enforced {
            (ConditionStatus::True, "Enforced")
        } else {
            (ConditionStatus::False, "NotEnforced")
        };
        let condition = Condition {
            type_: hive_api::agent::CONDITION_LIMITS_ENFORCED.into(),
            status,
            reason: reason.into(),
            message: format!("cpu {} memory {}: {}", limits.cpu_quota, limits.memory_max, limits.message),
            observed_generation: agent.metadata.generation,
            ..Default::default()
        };
        let name = agent.metadata.name.as_str();
        let now = Time(self.store.now());
        let result = self.agents.patch_status(name, |status| {
            set_condition(&mut status.conditions, condition.clone(), now);
        });
        if let Err(err) = result.await {
            tracing::warn!(agent = name, error = %err, "LimitsEnforced condition not written");
        }
        if !limits.enforced {
            let message = format!("limits not enforced: {}", limits.message);
            let _ = self
                .recorder
                .record(agent, crate::client::events::EventType::Warning, "LimitsNotEnforced", &message)
                .await;
        }
        Ok(limits)
    }

    fn agent(&self, name: &str) -> Result<Agent, NodeError> {
        self.agents.get_existing(name).map_err(failed)
    }

    /// SetWanted writes nothing: the intent was written with the Job, in one
    /// transaction, when it was submitted or claimed (`submit`, `job_intake::claim`).
    /// Writing it again when the node finally runs would overwrite whatever a client
    /// wrote since — the last writer wins, whoever it is. The node reports the intent
    /// the rest of its chain converges to.
    fn set_wanted(&self, name: &str, wanted: Wanted) -> Result<String, NodeError> {
        let current = self.agent(name)?.spec.wanted;
        Ok(if current == wanted {
            format!("wanted {wanted:?}")
        } else {
            format!("wanted {current:?}, written after this Job; converging to it")
        })
    }

    /// Whether a client wrote another `wanted` for `agent` after this Job was submitted:
    /// the intent its own SetWanted carries differs from the agent's now. Then the
    /// Job's quiescing steps (Signal, Drain) have nothing to do and its Reconcile
    /// converges to the newer intent.
    fn superseded(node: &NodeRun, agent: &Agent) -> Option<Wanted> {
        let name = agent.metadata.name.as_str();
        let intended = node
            .spec
            .nodes
            .iter()
            .rev()
            .filter(|n| n.kind == JobNodeKind::SetWanted && n.agent.as_deref() == Some(name))
            .find_map(|n| crate::submit::shapes::wanted_param(&n.params).ok())?;
        (intended != agent.spec.wanted).then_some(agent.spec.wanted)
    }
}

/// Streams build output into the node's log, a line at a time.
struct NodeLines<'a>(&'a NodeContext);

impl BuildLog for NodeLines<'_> {
    fn line(&self, line: &str) {
        self.0.log(line.as_bytes());
        self.0.log(b"\n");
    }
}

/// A quiescing step with nothing to do: a client wrote `wanted` after the Job.
fn skipped(ctx: &NodeContext, wanted: Wanted) -> NodeOutcome {
    let step = format!("skipped: wanted {wanted:?} was written after this Job");
    ctx.set_step(step.clone());
    NodeOutcome { step: Some(step) }
}

fn failed(err: impl std::fmt::Display) -> NodeError {
    NodeError::Failed(err.to_string())
}

impl Executor for RuntimeExecutor {
    async fn run(&self, node: NodeRun) -> Result<NodeOutcome, NodeError> {
        let kind = node.kind();
        let agent = node.agent().map(str::to_string);
        let job = node.job.clone();
        let result = self.execute(node).await;
        // Lifecycle outcomes become Events on the agent, as kubectl describe shows them.
        if let Some(stored) = agent.as_deref().and_then(|a| self.agents.get(a).ok().flatten()) {
            use crate::client::events::EventType::{Normal, Warning};
            let outcome = match (&result, kind) {
                (Ok(_), JobNodeKind::Create) => {
                    Some((Normal, "Spawned", format!("first generation created by Job {job}")))
                }
                (Ok(o), JobNodeKind::Prebuild) => Some((Normal, "Built", o.step.clone().unwrap_or_default())),
                (Err(e), _) => Some((Warning, "Failed", format!("{kind:?} in Job {job} failed: {e}"))),
                _ => None,
            };
            if let Some((type_, reason, message)) = outcome {
                if let Err(err) = self.recorder.record(&stored, type_, reason, &message).await {
                    tracing::warn!(error = %err, reason, "event not recorded");
                }
            }
        }
        result
    }
}

impl RuntimeExecutor {
    async fn execute(&self, node: NodeRun) -> Result<NodeOutcome, NodeError> {
        let kind = node.kind();
        if kind == JobNodeKind::MetaLock {
            let step = self.meta_lock(&node).await?;
            node.ctx.set_step(step.clone());
            return Ok(NodeOutcome { step: Some(step) });
        }
        let name = node
            .agent()
            .ok_or_else(|| failed(format!("{kind:?} node {} names no agent", node.id())))?
            .to_string();
        let ctx = &node.ctx;
        let log = NodeLines(ctx);
        let step = match kind {
            JobNodeKind::SetWanted => {
                let wanted = crate::submit::shapes::wanted_param(node.params()).map_err(failed)?;
                self.set_wanted(&name, wanted)?
            }
            JobNodeKind::Reconcile => {
                let agent = self.agent(&name)?;
                let running = self.runtime.is_running(&agent).await.map_err(failed)?;
                let kill = node.params().get("kill").and_then(|v| v.as_bool()).unwrap_or(false);
                match (agent.spec.wanted, running) {
                    (Wanted::Up, false) => {
                        ctx.set_step("starting");
                        let started = self.runtime.start(&agent).await.map_err(failed)?;
                        if let Some(first) = started.recovered_from {
                            log.line(&format!(
                                "the first start failed ({first}); a clean cold start succeeded"
                            ));
                        }
                        format!("started (pid {})", started.pid)
                    }
                    (Wanted::Offline, true) if kill => {
                        ctx.set_step("killing");
                        self.runtime.kill(&agent).await.map_err(failed)?;
                        "killed".into()
                    }
                    (Wanted::Offline, true) => {
                        ctx.set_step("stopping");
                        self.runtime.stop(&agent).await.map_err(failed)?;
                        "stopped".into()
                    }
                    (Wanted::Up, true) => "already running".into(),
                    (Wanted::Offline, false) => "already stopped".into(),
                }
            }
            JobNodeKind::StopForUpdate => {
                let agent = self.agent(&name)?;
                ctx.set_step("stopping for the update");
                self.runtime.stop_for_update(&agent).await.map_err(failed)?;
                "stopped for the update".into()
            }
            JobNodeKind::Prebuild => {
                let agent = self.agent(&name)?;
                let relock = node.params().get("relock").and_then(|v| v.as_bool()).unwrap_or(true);
                ctx.set_step(if relock { "locking the config rev" } else { "reading the meta lock" });
                // The gate is held only for the lock; the long build runs without it.
                let sha = self.lock_for_build(&agent, relock, &log).await?;
                let mut pinned = agent.clone();
                pinned.spec.config.rev = Some(sha);
                ctx.set_step("building");
                let generation = self.runtime.prebuild(&pinned, &log).await.map_err(failed)?;
                let step = format!("built generation {}", generation.id);
                let key = (node.job.to_string(), name.clone());
                self.prebuilt.lock().unwrap_or_else(|e| e.into_inner()).insert(key, generation);
                step
            }
            JobNodeKind::Swap => {
                let agent = self.agent(&name)?;
                let key = (node.job.to_string(), name.clone());
                let generation =
                    self.prebuilt.lock().unwrap_or_else(|e| e.into_inner()).remove(&key).ok_or_else(
                        || {
                            failed(format!(
                                "no prebuilt generation for agent {name:?} in Job {}: a Prebuild of this \
                             Job must run first",
                                node.job
                            ))
                        },
                    )?;
                // The drop-in is rewritten on every swap, so limit changes take effect
                // with the next lifecycle op.
                self.write_limits(&agent).await?;
                ctx.set_step(format!("swapping to {}", generation.id));
                self.runtime.swap(&agent, &generation).await.map_err(failed)?;
                self.mark_applied(&name, &generation.rev).await;
                format!("now on generation {}", generation.id)
            }
            JobNodeKind::Create => {
                let agent = self.agent(&name)?;
                ctx.set_step("registering in the meta flake");
                let sha = self.lock_for_build(&agent, true, &log).await?;
                let mut pinned = agent.clone();
                pinned.spec.config.rev = Some(sha);
                ctx.set_step("creating");
                let generation = self.runtime.create(&pinned, &log).await.map_err(failed)?;
                self.mark_applied(&name, &generation.rev).await;
                if !agent.spec.permissions.tool_groups.is_empty()
                    || !agent.spec.permissions.capabilities.is_empty()
                {
                    self.write_perm_file(&name).await?;
                }
                format!("created generation {}", generation.id)
            }
            JobNodeKind::WritePermFile => {
                ctx.set_step("committing permissions");
                self.write_perm_file(&name).await?
            }
            JobNodeKind::ApprovalDeploy => self.approval_deploy(&node, &name).await?,
            JobNodeKind::WriteDropin => {
                let agent = self.agent(&name)?;
                let limits = self.write_limits(&agent).await?;
                format!(
                    "limits cpu {} memory {} {}",
                    limits.cpu_quota,
                    limits.memory_max,
                    if limits.enforced { "enforced" } else { "NOT enforced" }
                )
            }
            JobNodeKind::Signal => {
                let agent = self.agent(&name)?;
                if let Some(wanted) = Self::superseded(&node, &agent) {
                    return Ok(skipped(ctx, wanted));
                }
                let kick = self.runtime.signal(&agent).await.map_err(failed)?;
                format!("fence set; {kick}")
            }
            JobNodeKind::Drain => {
                let agent = self.agent(&name)?;
                if let Some(wanted) = Self::superseded(&node, &agent) {
                    return Ok(skipped(ctx, wanted));
                }
                ctx.set_step("waiting for the harness to clear the fence");
                match self.runtime.drain(&agent).await.map_err(failed)? {
                    Drain::Drained => "drained".into(),
                    Drain::TimedOut => "drain timed out; stopping anyway".into(),
                }
            }
            // Handled above (it names no agent); the same call if it ever gets here.
            JobNodeKind::MetaLock => self.meta_lock(&node).await?,
        };
        ctx.set_step(step.clone());
        Ok(NodeOutcome { step: Some(step) })
    }
}

#[cfg(test)]
mod tests {
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
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{template:?} did not finish: {}",
                    job["status"]
                );
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
            let agent = json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name}, "spec": spec});
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
            tokio::spawn(crate::daemon::jobs_mirror::run(store.clone(), rx));
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
    async fn run_node(
        executor: &RuntimeExecutor,
        job: &str,
        spec: &Arc<hive_api::JobSpec>,
        id: &str,
    ) -> String {
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
}
