//! The engine the daemon runs behind the API: the process runtime, the meta repo, the
//! scheduler with the runtime executor, the Jobs mirror and the Job intake. The daemon
//! wires crash-watch and the boot reconcile around it. Every Job reaches the scheduler
//! through the intake's one `take` (`intake.rs`): the ones the engine submits itself, the
//! ones POST stores, and the ones any other write path stores.

use std::path::Path;
use std::sync::Arc;

use hive_api::agent::Agent;
use hive_api::job::{Job, JobSource, JobTemplate};
use tokio::sync::mpsc;

use crate::client::Api;
use crate::executor::{Deploy, RuntimeExecutor};
use crate::jobs::intake::{self, Taken};
use crate::meta::applied::Markers;
use crate::runtime::nixos::{NixosConfig, NixosRuntime};
use crate::runtime::process::{ProcessConfig, ProcessRuntime};
use crate::runtime::Runtime;
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerHandle};
use crate::store::Store;
use crate::submit::{self, DagRequest, LiveState, Request};

/// The hive base input's rev when none is configured: the git commit this binary was
/// built from (`build.rs`), empty when the build did not know it (then `hive serve`
/// asks for `--hive-rev`).
pub const DEFAULT_HIVE_REV: &str = env!("HIVE_GIT_REV");
/// Where the hive base flake comes from when `--hive-flake` is not given.
pub const UPSTREAM_HIVE_URL: &str = "github:hive-dev/hive";
/// The hive base flake the meta flake renders as its `hive` input when none is
/// configured: this repository's checkout the binary was built from (`build.rs`; its
/// root `flake.nix` provides `lib.agentSystem`), else [`UPSTREAM_HIVE_URL`].
pub const DEFAULT_HIVE_URL: &str =
    if env!("HIVE_FLAKE").is_empty() { UPSTREAM_HIVE_URL } else { env!("HIVE_FLAKE") };

/// Settings of the engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// How many heavy nodes (builds, swaps, creates) run at once.
    pub build_slots: usize,
    /// Retries of the builds in Jobs the submit layer builds from templates.
    pub build_retries: u32,
    /// How long a terminal Job without `spec.ttlSecondsAfterFinished` is kept after it
    /// finished (`--job-history-max-age`); `None`: no bound by age, only the history's
    /// 5 per template.
    pub job_history_max_age: Option<std::time::Duration>,
    /// The hive base input's rev this daemon runs; a change marks every agent stale and
    /// the boot sweep rebuilds the wanted-up ones against it.
    pub hive_rev: String,
    /// The hive base flake's URL.
    pub hive_url: String,
    /// The process runtime's settings (limits defaults, cgroup root).
    pub process: Option<ProcessConfig>,
    /// Run agents as NixOS containers with these settings instead of as processes.
    pub nixos: Option<NixosConfig>,
    /// Where the scheduler records node durations, lease waits and build-slot use.
    pub metrics: crate::metrics::SchedulerMetrics,
    /// Where the controllers the engine runs (Agent, Approval, the Job intake) record
    /// their reconcile runs.
    pub controllers: Arc<crate::metrics::ControllerMetrics>,
    /// The runtimes of fleet nodes, for agents placed on them (`spec.placement`).
    pub remotes: Option<Arc<dyn crate::runtime::placed::Remotes>>,
    /// Where the meta repo's commits are recorded beyond this host (replicas on etcd).
    pub meta_journal: Option<Arc<dyn crate::meta::Journal>>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            build_slots: 1,
            build_retries: 0,
            job_history_max_age: None,
            hive_rev: DEFAULT_HIVE_REV.into(),
            hive_url: DEFAULT_HIVE_URL.into(),
            process: None,
            nixos: None,
            metrics: crate::metrics::SchedulerMetrics::default(),
            controllers: Arc::default(),
            remotes: None,
            meta_journal: None,
        }
    }
}

/// The running engine.
pub struct Engine {
    /// The object store.
    pub store: Store,
    /// The scheduler.
    pub scheduler: SchedulerHandle,
    /// The runtime running this host's agents (`hive serve --runtime`).
    pub runtime: Arc<dyn Runtime>,
    /// The meta repo, resolver and applied-rev markers.
    pub deploy: Deploy,
    /// This daemon run's name, unique per start: what its claims on Jobs say.
    pub run: String,
    /// Where its controllers record their reconcile runs.
    pub controller_metrics: Arc<crate::metrics::ControllerMetrics>,
    /// Retries of the builds in Jobs built from templates (`--build-retries`).
    pub build_retries: u32,
}

impl LiveState for Engine {
    fn is_running(&self, agent: &str) -> bool {
        self.runtime.running_now(agent)
    }

    fn is_stale<'a>(&'a self, agent: &'a str) -> futures_util::future::BoxFuture<'a, bool> {
        Box::pin(async move { !self.is_fresh(agent).await })
    }

    fn build_retries(&self) -> u32 {
        self.build_retries
    }
}

/// Why a submit through the engine failed.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The submit layer refused (nothing was written).
    #[error(transparent)]
    Submit(#[from] submit::Error),
    /// The Job was written but the scheduler refused it (it is marked failed).
    #[error(transparent)]
    Scheduler(#[from] crate::scheduler::Error),
    /// The Job was written but could not be claimed or handed over for now.
    #[error(transparent)]
    Intake(#[from] intake::Error),
}

impl Engine {
    /// The typed client of Agents over the engine's store.
    pub fn agents(&self) -> Api<Agent> {
        Api::new(&self.store)
    }

    /// Starts the engine on `state_dir/agents`: kills processes a crashed daemon left,
    /// marks Jobs it left unfinished `Interrupted`, starts the scheduler, the mirror and
    /// the expiry of finished Jobs.
    /// The daemon then starts crash-watch, submits the boot reconcile and starts the
    /// intake ([`Engine::start_intake`]).
    pub async fn start(store: Store, state_dir: &Path, config: EngineConfig) -> anyhow::Result<Arc<Engine>> {
        let local: Arc<dyn Runtime> = match &config.nixos {
            Some(nixos) => Arc::new(NixosRuntime::new(nixos.clone())),
            None => {
                let process =
                    config.process.clone().unwrap_or_else(|| ProcessConfig::new(state_dir.join("agents")));
                Arc::new(ProcessRuntime::new(process))
            }
        };
        let runtime: Arc<dyn Runtime> = match &config.remotes {
            Some(remotes) => Arc::new(crate::runtime::placed::Placed::new(local, remotes.clone())),
            None => local,
        };
        let meta = crate::meta::Meta::open(crate::meta::MetaConfig {
            dir: state_dir.join("meta"),
            hive_url: config.hive_url.clone(),
            hive_rev: config.hive_rev.clone(),
            journal: config.meta_journal.clone(),
        })
        .await
        .map_err(|e| match e {
            // Not this host's repo: etcd, or what the journal there holds.
            crate::meta::Error::Journal { .. } => anyhow::anyhow!("{e}"),
            e => anyhow::anyhow!(
                "{e}\nhive puts back only what a power cut can tear (empty files, the objects of a last, \
                 unacknowledged step); this is not that, so the meta repo was left as it is: repair it or \
                 move it aside."
            ),
        })?;
        if !meta.repairs().is_empty() {
            record_meta_repairs(&store, meta.dir(), meta.repairs()).await;
        }
        let deploy = Deploy {
            meta,
            resolver: crate::meta::resolve::Resolver::new(state_dir.join("mirrors")),
            markers: Markers::new(state_dir.join("applied")),
            hive_rev: config.hive_rev.clone(),
        };
        // Listed only if the runtime asks: decoding every stored Agent is most of a cold
        // start with many of them.
        let agents = Api::<Agent>::new(&store);
        runtime.attach(&move || agents.list().1).await;
        let interrupted = crate::jobs::mirror::mark_interrupted(&store).await?;
        if !interrupted.is_empty() {
            tracing::warn!(jobs = ?interrupted, "marked Jobs of a previous run interrupted");
        }
        // The history of 5 terminal Jobs per template begins with what earlier runs left.
        let settled = crate::jobs::mirror::settled(&store);
        let run = format!("run-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(crate::jobs::mirror::run_claimed(store.clone(), rx, run.clone()));
        let executor = RuntimeExecutor::new(store.clone(), runtime.clone(), deploy.clone());
        let scheduler = Scheduler::start_after(
            executor,
            tx,
            SchedulerConfig {
                build_slots: config.build_slots.max(1),
                metrics: config.metrics.clone(),
                // An agent placed on a fleet node builds there, on the node's slots.
                build_hosts: config.remotes.clone().map_or_else(Default::default, |remotes| {
                    crate::scheduler::BuildHosts::new(move |agent| {
                        let node = remotes.placement(agent)?;
                        let slots = remotes.build_slots(&node);
                        Some((node, slots))
                    })
                }),
                ..Default::default()
            },
            settled,
        );
        // Besides the history's bound by count, terminal Jobs age out by their TTL or
        // the max age, counted from the finish times in the store.
        crate::jobs::expiry::spawn(store.clone(), config.job_history_max_age);
        let engine = Arc::new(Engine {
            store: store.clone(),
            scheduler: scheduler.clone(),
            runtime: runtime.clone(),
            deploy,
            run,
            controller_metrics: config.controllers.clone(),
            build_retries: config.build_retries,
        });

        Ok(engine)
    }

    /// Starts the Job intake's controller: Jobs written while no daemon ran, and from now
    /// on every Job any write path stores, are taken by it. The daemon starts it after
    /// the boot reconcile.
    pub fn start_intake(self: &Arc<Self>) {
        intake::spawn(
            self.store.clone(),
            self.clone(),
            self.scheduler.clone(),
            self.run.clone(),
            self.controller_metrics.clone(),
        );
    }

    /// Whether `agent` is fresh in the coordinator document's sense: its applied-rev
    /// marker records the commit the meta lock pins for it and the hive base the daemon
    /// runs. No marker (never built, or a torn file) is stale. The boot sweep and a start
    /// of a stopped agent (the submit layer's stale upgrade) both ask this, so a branch
    /// name in `spec.config.rev` is never compared with the commit it resolved to.
    pub async fn is_fresh(&self, agent: &str) -> bool {
        let Some(marker) = self.deploy.markers.read(agent) else { return false };
        let locked = self.deploy.meta.locked(agent).await.map(|l| l.rev);
        marker.hive == self.deploy.hive_rev && locked.is_none_or(|l| l == marker.rev)
    }

    /// Whether the agent's `spec.permissions` differ from the permission files the meta
    /// repo holds for it (what its last WritePermFile committed).
    pub async fn permissions_changed(&self, agent: &Agent) -> bool {
        let permissions = &agent.spec.permissions;
        !self
            .deploy
            .meta
            .permissions_match(&agent.metadata.name, &permissions.tool_groups, &permissions.capabilities)
            .await
    }

    /// Forgets a destroyed agent: its meta flake input and lock entry (one commit), its
    /// applied-rev marker and its resolver mirror.
    pub async fn forget(&self, agent: &str) {
        let meta = &self.deploy.meta;
        if meta.locked(agent).await.is_some() {
            let gate = meta.gate().await;
            let inputs = crate::executor::locked_inputs(&self.store, meta, agent).await;
            if let Err(err) = meta.sync_agents(&gate, &inputs).await {
                tracing::warn!(agent, error = %err, "could not remove the agent from the meta flake");
            }
        }
        self.deploy.markers.remove(agent);
        self.deploy.resolver.forget(agent).await;
    }

    /// Creates a new agent with its Spawn Job (one transaction) and schedules the Job.
    pub async fn spawn_new(&self, agent: &Agent, request: &Request) -> Result<Job, SubmitError> {
        let job = submit::spawn_new(&self.store, agent, request).await?;
        self.take(&job.metadata.name).await
    }

    /// `preBuildAgentTemplates`: builds every agent the meta flake knows, one after the
    /// other, without touching the running containers, so their closures are in the
    /// store before anything needs them. Failures are logged, never fatal.
    pub async fn prebuild_templates(&self) {
        for (name, locked) in self.deploy.meta.locked_agents().await {
            let mut pinned = match self.agents().get(&name) {
                Ok(Some(agent)) => agent,
                Ok(None) => continue,
                Err(err) => {
                    tracing::warn!(agent = name, error = %err, "template prebuild skipped: the agent does not decode");
                    continue;
                }
            };
            pinned.spec.config.rev = Some(locked.rev);
            let log = |line: &str| tracing::debug!(agent = name.as_str(), "{line}");
            match self.runtime.prebuild(&pinned, &log).await {
                Ok(generation) => {
                    tracing::info!(agent = name, generation = generation.id, "template prebuilt")
                }
                Err(err) => tracing::warn!(agent = name, error = %err, "template prebuild failed"),
            }
        }
    }

    /// Builds a shaped DAG's Job and hands it to the scheduler.
    pub async fn submit_dag(&self, request: &DagRequest) -> Result<Job, SubmitError> {
        let job = submit::submit_dag(&self.store, request).await?;
        self.take(&job.metadata.name).await
    }

    /// Builds a template Job with the submit layer and hands it to the scheduler.
    pub async fn submit(
        &self,
        template: JobTemplate,
        agents: Vec<String>,
        source: JobSource,
        reason: Option<String>,
    ) -> Result<Job, SubmitError> {
        let scheduling = Default::default();
        self.submit_request(&Request { template, agents, source, reason, name: None, scheduling }).await
    }

    /// [`Engine::submit`] with every field of the request, e.g. a chosen Job name.
    pub async fn submit_request(&self, request: &Request) -> Result<Job, SubmitError> {
        let request = request.clone();
        let job = submit::submit(&self.store, self, &request).await?;
        self.take(&job.metadata.name).await
    }

    /// Takes stored Job `name` to the scheduler through the intake: claims it for this
    /// run (expanding a template Job) and schedules it, unless another claimer won —
    /// then the Job is returned as that claimer left it. A Job that cannot run is marked
    /// `Failed` and its refusal returned.
    pub async fn take(&self, name: &str) -> Result<Job, SubmitError> {
        match intake::take(&self.store, self, &self.scheduler, &self.run, name).await? {
            Taken::Scheduled(job) | Taken::Elsewhere(job) | Taken::Waiting(job) => Ok(job),
            Taken::Failed { why: intake::Refusal::Expand(err), .. } => Err(err.into()),
            Taken::Failed { why: intake::Refusal::Schedule(err), .. } => Err(err.into()),
        }
    }

    /// Stops the scheduler and every agent process (a process cannot be adopted by the
    /// next daemon; the next start's boot reconcile brings wanted-up agents back).
    /// Containers are systemd units that outlive the daemon: they keep running.
    pub async fn shutdown(&self) {
        self.scheduler.shutdown().await;
        if self.runtime.agents_outlive_daemon() {
            return;
        }
        // Names first: only the running agents are decoded (a daemon holding 100,000
        // Agents spent seconds decoding them all before it could exit).
        for name in self.agents().names() {
            if !self.is_running(&name) {
                continue;
            }
            let agent = match self.agents().get(&name) {
                Ok(Some(agent)) => agent,
                Ok(None) => continue,
                Err(err) => {
                    tracing::warn!(agent = &*name, error = %err, "could not read the agent to stop it at shutdown");
                    continue;
                }
            };
            if agent.spec.node().is_some() {
                // Its node's worker owns it: a container or rented machine keeps it
                // running for the next daemon; a local worker stops it as it ends.
                continue;
            }
            if let Err(err) = self.runtime.stop(&agent).await {
                tracing::warn!(agent = &*name, error = %err, "could not stop the agent at shutdown");
            }
        }
    }
}

/// Logs what opening the meta repo put back and records it as one Warning Event about the
/// meta repo (`kubectl get events` shows it), so an operator sees that a power cut or a
/// crash undid a step nobody had been told had happened.
async fn record_meta_repairs(store: &Store, dir: &Path, repairs: &[String]) {
    for repair in repairs {
        tracing::warn!(dir = %dir.display(), repair = %repair, "meta repo repaired at start");
    }
    let recorder = crate::client::events::Recorder::new(store.clone(), "hive");
    let about = hive_api::event::ObjectReference {
        kind: "MetaRepo".into(),
        name: "meta".into(),
        ..Default::default()
    };
    let message = format!("repaired at start: {}", repairs.join("; "));
    let recorded = recorder
        .record_about(about, crate::client::events::EventType::Warning, "MetaRepoRepaired", &message)
        .await;
    if let Err(error) = recorded {
        tracing::warn!(%error, "the meta repo's repair was not recorded as an Event");
    }
}
