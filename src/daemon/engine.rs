//! The engine the daemon runs behind the API: the process runtime, the meta repo, the
//! scheduler with the runtime executor, the Jobs mirror, crash-watch, and the boot
//! reconcile (the config path's sweep, then the power path). The server reaches it
//! through [`Engine`] to submit, cancel and follow Jobs.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use hive_api::agent::Agent;
use hive_api::job::{Job, JobSource, JobTemplate};
use tokio::sync::mpsc;

use crate::client::Api;
use crate::daemon::crashwatch::{Backoff, CrashWatch, Leases, Restart};
use crate::executor::{Deploy, RuntimeExecutor};
use crate::meta::applied::Markers;
use crate::runtime::nixos::{NixosConfig, NixosRuntime};
use crate::runtime::process::{ProcessConfig, ProcessRuntime};
use crate::runtime::{Change, Runtime};
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerHandle};
use crate::store::Store;
use crate::submit::{self, DagRequest, LiveState, Request};

/// The hive base input's rev when none is configured: this build's version.
pub const DEFAULT_HIVE_REV: &str = concat!("hive-", env!("CARGO_PKG_VERSION"));
/// The hive base flake the meta flake renders as its `hive` input.
pub const DEFAULT_HIVE_URL: &str = "github:hive-dev/hive";

/// Settings of the engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// How many heavy nodes (builds, swaps, creates) run at once.
    pub build_slots: usize,
    /// The hive base input's rev this daemon runs; a change marks every agent stale and
    /// the boot sweep rebuilds the wanted-up ones against it.
    pub hive_rev: String,
    /// The hive base flake's URL.
    pub hive_url: String,
    /// The process runtime's settings (limits defaults, cgroup root).
    pub process: Option<ProcessConfig>,
    /// Run agents as NixOS containers with these settings instead of as processes.
    pub nixos: Option<NixosConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            build_slots: 1,
            hive_rev: DEFAULT_HIVE_REV.into(),
            hive_url: DEFAULT_HIVE_URL.into(),
            process: None,
            nixos: None,
        }
    }
}

/// The driver that runs this host's agents (`hive serve --runtime`).
#[derive(Clone)]
pub enum Driver {
    /// Supervised local processes (the embedded default).
    Process(Arc<ProcessRuntime>),
    /// NixOS containers.
    Nixos(Arc<NixosRuntime>),
}

impl Driver {
    /// The driver behind the `Runtime` trait.
    pub fn runtime(&self) -> Arc<dyn Runtime> {
        match self {
            Driver::Process(p) => p.clone(),
            Driver::Nixos(n) => n.clone(),
        }
    }

    /// Whether the agent has a built, installed generation (a process agent's `current`
    /// link; a container's `/etc/nixos-containers/<c>.conf`, which `create` writes).
    pub fn installed(&self, agent: &str) -> bool {
        match self {
            Driver::Process(p) => p.agent_dir(agent).join("current").exists(),
            Driver::Nixos(n) => crate::runtime::nixos::container_name(agent)
                .map(|c| n.conf_path(&c).exists())
                .unwrap_or(false),
        }
    }

    /// The agent's output files, oldest first, and the live one (process agents; a
    /// container's output is in its journal).
    pub fn log_files(&self, agent: &str) -> (Vec<std::path::PathBuf>, Option<std::path::PathBuf>) {
        match self {
            Driver::Process(p) => {
                (p.log_files(agent), Some(p.agent_dir(agent).join("logs").join("agent.log")))
            }
            Driver::Nixos(_) => (Vec::new(), None),
        }
    }
}

/// The running engine.
pub struct Engine {
    /// The object store.
    pub store: Store,
    /// The scheduler.
    pub scheduler: SchedulerHandle,
    /// The driver running this host's agents.
    pub driver: Driver,
    /// The same driver, as the `Runtime` trait.
    pub runtime: Arc<dyn Runtime>,
    /// Which agents run, as the driver last reported (the container view; process
    /// agents are read from the driver directly).
    view: Arc<std::sync::RwLock<HashMap<String, bool>>>,
    /// The meta repo, resolver and applied-rev markers.
    pub deploy: Deploy,
}

impl Leases for SchedulerHandle {
    fn is_leased(&self, agent: &str) -> bool {
        self.leased_agents().contains(agent)
    }
}

impl LiveState for Engine {
    fn is_running(&self, agent: &str) -> bool {
        match &self.driver {
            Driver::Process(p) => p.snapshot().iter().any(|o| o.agent == agent && o.running()),
            Driver::Nixos(_) => {
                self.view.read().unwrap_or_else(|e| e.into_inner()).get(agent).copied().unwrap_or(false)
            }
        }
    }

    fn built_against_old_base(&self, agent: &str) -> bool {
        self.deploy.markers.read(agent).is_some_and(|m| m.hive != self.deploy.hive_rev)
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
}

impl Engine {
    /// The typed client of Agents over the engine's store.
    pub fn agents(&self) -> Api<Agent> {
        Api::new(&self.store)
    }

    /// Starts the engine on `state_dir/agents`: kills processes a crashed daemon left,
    /// marks Jobs it left unfinished `Interrupted`, starts the scheduler, the mirror and
    /// crash-watch, and submits the boot reconcile.
    pub async fn start(store: Store, state_dir: &Path, config: EngineConfig) -> anyhow::Result<Arc<Engine>> {
        let driver = match &config.nixos {
            Some(nixos) => Driver::Nixos(Arc::new(NixosRuntime::new(nixos.clone()))),
            None => {
                let process =
                    config.process.clone().unwrap_or_else(|| ProcessConfig::new(state_dir.join("agents")));
                Driver::Process(Arc::new(ProcessRuntime::new(process)))
            }
        };
        let runtime = driver.runtime();
        let meta = crate::meta::Meta::open(crate::meta::MetaConfig {
            dir: state_dir.join("meta"),
            hive_url: config.hive_url.clone(),
            hive_rev: config.hive_rev.clone(),
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nThe meta repo was not changed; repair it or move it aside."))?;
        let deploy = Deploy {
            meta,
            resolver: crate::meta::resolve::Resolver::new(state_dir.join("mirrors")),
            markers: Markers::new(state_dir.join("applied")),
            hive_rev: config.hive_rev.clone(),
        };
        if let Driver::Process(process) = &driver {
            for (agent, pid) in process.kill_orphans() {
                tracing::warn!(agent, pid, "stopped a process a previous daemon left running");
            }
        }
        let interrupted = crate::daemon::jobs_mirror::mark_interrupted(&store).await?;
        if !interrupted.is_empty() {
            tracing::warn!(jobs = ?interrupted, "marked Jobs of a previous run interrupted");
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(crate::daemon::jobs_mirror::run(store.clone(), rx));
        let executor = RuntimeExecutor::new(store.clone(), runtime.clone(), deploy.clone());
        let scheduler = Scheduler::start(
            executor,
            tx,
            SchedulerConfig { build_slots: config.build_slots.max(1), ..Default::default() },
        );
        let engine = Arc::new(Engine {
            store: store.clone(),
            scheduler: scheduler.clone(),
            driver: driver.clone(),
            runtime: runtime.clone(),
            view: Default::default(),
            deploy,
        });
        if let Driver::Nixos(nixos) = &driver {
            engine.watch_containers(nixos.clone()).await;
        }

        let weak = Arc::downgrade(&engine);
        let restart: Restart = Arc::new(move |agent: String| {
            let weak = weak.clone();
            Box::pin(async move {
                let Some(engine) = weak.upgrade() else { return };
                let reason = Some("restart after a crash".to_string());
                if let Err(err) = engine
                    .submit(JobTemplate::Reconcile, vec![agent.clone()], JobSource::Controller, reason)
                    .await
                {
                    tracing::warn!(agent, error = %err, "could not submit the crash restart");
                }
            })
        });
        let watch = CrashWatch::new(store.clone(), Arc::new(scheduler), restart, Backoff::default());
        tokio::spawn(watch.run(runtime.subscribe()));
        let swept = engine.boot_sweep().await;
        engine.boot_reconcile(&swept).await;
        Ok(engine)
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
        self.deploy.resolver.forget(agent);
    }

    /// Creates a new agent with its Spawn Job (one transaction) and schedules the Job.
    pub async fn spawn_new(&self, agent: &Agent, request: &Request) -> Result<Job, SubmitError> {
        let job = submit::spawn_new(&self.store, agent, request).await?;
        self.schedule(&job).await?;
        Ok(job)
    }

    /// The container view: subscribes to the driver's changes, asks systemd once about
    /// every agent, then keeps the view current from the events and a periodic rescan
    /// (which publishes containers that went down unasked, for crash-watch).
    async fn watch_containers(self: &Arc<Self>, nixos: Arc<NixosRuntime>) {
        let mut events = self.runtime.subscribe();
        let view = self.view.clone();
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(event) => {
                        let mut view = view.write().unwrap_or_else(|e| e.into_inner());
                        match event.change {
                            Change::Started { .. } => {
                                view.insert(event.agent, true);
                            }
                            Change::Exited(_) => {
                                view.insert(event.agent, false);
                            }
                            Change::Destroyed => {
                                view.remove(&event.agent);
                            }
                            Change::Swapped(_) => {}
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        for agent in self.agents().list().1 {
            match self.runtime.is_running(&agent).await {
                Ok(running) => {
                    self.view
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(agent.metadata.name.clone(), running);
                }
                Err(err) => {
                    tracing::warn!(agent = agent.metadata.name, error = %err, "container state unknown")
                }
            }
        }
        let every = nixos.config().rescan_interval.max(std::time::Duration::from_millis(100));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                nixos.rescan().await;
            }
        });
    }

    /// `preBuildAgentTemplates`: builds every agent the meta flake knows, one after the
    /// other, without touching the running containers, so their closures are in the
    /// store before anything needs them. Failures are logged, never fatal.
    pub async fn prebuild_templates(&self) {
        for agent in self.agents().list().1 {
            let name = agent.metadata.name.clone();
            let Some(locked) = self.deploy.meta.locked(&name).await else { continue };
            let mut pinned = agent.clone();
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
        self.schedule(&job).await?;
        Ok(job)
    }

    /// Builds a template Job with the submit layer and hands it to the scheduler.
    pub async fn submit(
        &self,
        template: JobTemplate,
        agents: Vec<String>,
        source: JobSource,
        reason: Option<String>,
    ) -> Result<Job, SubmitError> {
        self.submit_request(&Request { template, agents, source, reason, name: None }).await
    }

    /// [`Engine::submit`] with every field of the request, e.g. a chosen Job name.
    pub async fn submit_request(&self, request: &Request) -> Result<Job, SubmitError> {
        let request = request.clone();
        let job = submit::submit(&self.store, self, &request).await?;
        self.schedule(&job).await?;
        Ok(job)
    }

    /// Hands a stored Job to the scheduler.
    pub async fn schedule(&self, job: &Job) -> Result<(), crate::scheduler::Error> {
        self.scheduler.submit(job.metadata.name.clone(), job.spec.clone()).await
    }

    /// Stops the scheduler and every agent process (a process cannot be adopted by the
    /// next daemon; the next start's boot reconcile brings wanted-up agents back).
    /// Containers are systemd units that outlive the daemon: they keep running.
    pub async fn shutdown(&self) {
        self.scheduler.shutdown().await;
        if !matches!(self.driver, Driver::Process(_)) {
            return;
        }
        for agent in self.agents().list().1 {
            if self.is_running(&agent.metadata.name) {
                if let Err(err) = self.runtime.stop(&agent).await {
                    tracing::warn!(agent = agent.metadata.name, error = %err, "could not stop the agent at shutdown");
                }
            }
        }
    }
}
