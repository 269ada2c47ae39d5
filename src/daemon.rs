//! The engine the daemon runs behind the API: the process runtime, the scheduler with
//! the runtime executor, the Jobs mirror, crash-watch, and the boot reconcile. The
//! server reaches it through [`Engine`] to submit, cancel and follow Jobs.

use std::path::Path;
use std::sync::Arc;

use hive_api::agent::{Agent, Wanted};
use hive_api::job::{JobSource, JobTemplate};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::crashwatch::{Backoff, CrashWatch, Leases, Restart};
use crate::executor::RuntimeExecutor;
use crate::runtime::process::{ProcessConfig, ProcessRuntime};
use crate::runtime::Runtime;
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerHandle};
use crate::store::Store;
use crate::submit::{self, LiveState, Request};

/// Settings of the engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// How many heavy nodes (builds, swaps, creates) run at once.
    pub build_slots: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { build_slots: 1 }
    }
}

/// The running engine.
pub struct Engine {
    /// The object store.
    pub store: Store,
    /// The scheduler.
    pub scheduler: SchedulerHandle,
    /// The process runtime (the embedded default driver).
    pub runtime: Arc<ProcessRuntime>,
}

/// Whether agents run, as the runtime observes them.
struct Observed(Arc<ProcessRuntime>);

impl LiveState for Observed {
    fn is_running(&self, agent: &str) -> bool {
        self.0.snapshot().iter().any(|o| o.agent == agent && o.running())
    }
}

impl Leases for SchedulerHandle {
    fn is_leased(&self, agent: &str) -> bool {
        self.leased_agents().contains(agent)
    }
}

impl LiveState for Engine {
    fn is_running(&self, agent: &str) -> bool {
        Observed(self.runtime.clone()).is_running(agent)
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
    /// Starts the engine on `state_dir/agents`: kills processes a crashed daemon left,
    /// marks Jobs it left unfinished `Interrupted`, starts the scheduler, the mirror and
    /// crash-watch, and submits the boot reconcile.
    pub async fn start(store: Store, state_dir: &Path, config: EngineConfig) -> anyhow::Result<Arc<Engine>> {
        let runtime = Arc::new(ProcessRuntime::new(ProcessConfig::new(state_dir.join("agents"))));
        for (agent, pid) in runtime.kill_orphans() {
            tracing::warn!(agent, pid, "stopped a process a previous daemon left running");
        }
        let interrupted = crate::jobs_mirror::mark_interrupted(&store).await?;
        if !interrupted.is_empty() {
            tracing::warn!(jobs = ?interrupted, "marked Jobs of a previous run interrupted");
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(crate::jobs_mirror::run(store.clone(), rx));
        let executor = RuntimeExecutor::new(store.clone(), runtime.clone() as Arc<dyn Runtime>);
        let scheduler = Scheduler::start(
            executor,
            tx,
            SchedulerConfig { build_slots: config.build_slots.max(1), ..Default::default() },
        );
        let engine =
            Arc::new(Engine { store: store.clone(), scheduler: scheduler.clone(), runtime: runtime.clone() });

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
        engine.boot_reconcile().await;
        Ok(engine)
    }

    /// Builds a template Job with the submit layer and hands it to the scheduler.
    pub async fn submit(
        &self,
        template: JobTemplate,
        agents: Vec<String>,
        source: JobSource,
        reason: Option<String>,
    ) -> Result<crate::store::Obj, SubmitError> {
        self.submit_request(&Request { template, agents, source, reason, name: None }).await
    }

    /// [`Engine::submit`] with every field of the request, e.g. a chosen Job name.
    pub async fn submit_request(&self, request: &Request) -> Result<crate::store::Obj, SubmitError> {
        let request = request.clone();
        let job = submit::submit(&self.store, self, &request).await?;
        self.schedule(&job).await?;
        Ok(job)
    }

    /// Hands a stored Job to the scheduler.
    pub async fn schedule(&self, job: &Value) -> Result<(), crate::scheduler::Error> {
        let name = job["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let spec =
            serde_json::from_value(job["spec"].clone()).map_err(|e| crate::scheduler::Error::Invalid {
                name: name.clone(),
                errors: vec![hive_api::validation::ValidationError::new(
                    "spec",
                    hive_api::validation::Reason::Invalid,
                    e.to_string(),
                )],
            })?;
        self.scheduler.submit(name, spec).await
    }

    /// Stops the scheduler and every agent process (a process cannot be adopted by the
    /// next daemon; the next start's boot reconcile brings wanted-up agents back).
    pub async fn shutdown(&self) {
        self.scheduler.shutdown().await;
        let (_, agents) = self.store.list("agents");
        for stored in agents {
            let Ok(agent) = <Agent as serde::Deserialize>::deserialize(stored.as_ref()) else { continue };
            if self.is_running(&agent.metadata.name) {
                if let Err(err) = self.runtime.stop(&agent).await {
                    tracing::warn!(agent = agent.metadata.name, error = %err, "could not stop the agent at shutdown");
                }
            }
        }
    }

    /// The boot reconcile's power path: every agent whose observed power drifted from
    /// its wanted power gets a plain Reconcile Job (source `Boot`).
    async fn boot_reconcile(&self) {
        let (_, agents) = self.store.list("agents");
        for stored in agents {
            let Ok(agent) = <Agent as serde::Deserialize>::deserialize(stored.as_ref()) else { continue };
            let name = agent.metadata.name.clone();
            let running = self.is_running(&name);
            let drifted = match agent.spec.wanted {
                Wanted::Up => !running,
                Wanted::Offline => running,
            };
            let installed = self.runtime.agent_dir(&name).join("current").exists();
            if drifted && installed {
                let reason = Some("boot: observed power differs from wanted".to_string());
                if let Err(err) =
                    self.submit(JobTemplate::Reconcile, vec![name.clone()], JobSource::Boot, reason).await
                {
                    tracing::warn!(agent = name, error = %err, "boot reconcile not submitted");
                }
            }
        }
    }
}
