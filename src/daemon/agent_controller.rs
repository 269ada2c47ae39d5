//! The Agent controller's IO: it gathers each agent's facts (store, runtime, Jobs in
//! flight), asks [`hive_controllers::agent::decide`] for the next step, and applies it —
//! submitting Jobs through the engine (the only producer of Jobs is the submit layer),
//! managing the finalizer, and keeping `status` (observedGeneration, conditions Ready
//! and Converged) true so that `kubectl wait --for=condition=Ready agent/x` works.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hive_api::agent::{Agent, AgentStatus, Wanted, CONDITION_CONVERGED, CONDITION_READY};
use hive_api::job::{Job, JobPhase, JobSource, JobTemplate};
use hive_api::meta::{set_condition, Condition, ConditionStatus, Time};
use hive_controllers::agent::{decide, Decision, Facts, Submit};
use hive_controllers::{Action, Config, Controller, Target};

use crate::client::{self, Api};
use crate::daemon::Engine;
use crate::submit::LiveState;

pub use hive_api::names::AGENT_FINALIZER as FINALIZER;

/// Shared by every reconcile.
pub struct Context {
    engine: Arc<Engine>,
    /// The last power convergence the controller submitted per agent: (generation, Job).
    reconciles: Mutex<HashMap<String, (i64, String)>>,
}

/// Why a reconcile failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store refused a write.
    #[error(transparent)]
    Client(#[from] client::Error),
    /// The engine refused a submit.
    #[error(transparent)]
    Submit(#[from] crate::daemon::SubmitError),
    /// The runtime failed to remove the agent.
    #[error(transparent)]
    Runtime(#[from] crate::runtime::Error),
}

/// Runs the controller until the process ends.
pub fn spawn(engine: Arc<Engine>) {
    let client = Api::<Agent>::new(&engine.store);
    let controller = Controller::new(client, Config::default());
    let ctx = Arc::new(Context { engine, reconciles: Mutex::new(HashMap::new()) });
    tokio::spawn(controller.run(
        reconcile,
        |target: &Target<Agent>, err: &Error, _ctx: &Context| {
            tracing::warn!(agent = target.name(), error = %err, "agent reconcile failed; backing off");
            Action::backoff()
        },
        ctx,
        std::future::pending::<()>(),
    ));
}

pub use hive_api::agent::fingerprint;

/// A stored Job the scheduler does not know yet counts as in flight for this long: the
/// submit layer writes the Job, then hands it to the scheduler.
const HANDOFF_GRACE: chrono::Duration = chrono::Duration::seconds(10);

/// The unfinished Jobs that touch `agent`: (name, template). "Unfinished" is the
/// scheduler's word, not the stored status: a Job object written by hand (say,
/// `kubectl apply` of a Job manifest) never ran and must not block the agent forever.
async fn in_flight(engine: &Engine, agent: &str) -> Vec<(String, JobTemplate)> {
    let scheduled: std::collections::HashMap<String, JobPhase> = match engine.scheduler.list().await {
        Ok(jobs) => jobs.into_iter().map(|j| (j.name, j.phase)).collect(),
        Err(_) => Default::default(),
    };
    let now = engine.store.now();
    Api::<Job>::new(&engine.store)
        .list()
        .1
        .into_iter()
        .filter(|job| job.spec.nodes.iter().any(|n| n.agent.as_deref() == Some(agent)))
        .filter(|job| match scheduled.get(&job.metadata.name) {
            Some(phase) => !phase.is_terminal(),
            None => {
                let unstarted = job.status.phase.is_none();
                let created = job.metadata.creation_timestamp;
                unstarted && created.is_some_and(|t| now - t.0 < HANDOFF_GRACE)
            }
        })
        .map(|job| (job.metadata.name, job.spec.template))
        .collect()
}

/// The condition saying whether a spawn or rebuild is under way.
const CONDITION_BUILDING: &str = "Building";

async fn reconcile(target: Target<Agent>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Target::Present(agent) = target else { return Ok(Action::await_change()) };
    let engine = &ctx.engine;
    let agents = engine.agents();
    let name = agent.metadata.name.clone();
    let generation = agent.metadata.generation.unwrap_or(1);
    let failed_reconcile_generation = {
        let last = ctx.reconciles.lock().unwrap_or_else(|e| e.into_inner()).get(&name).cloned();
        last.and_then(|(generation, job)| {
            let phase = Api::<Job>::new(&engine.store).get(&job).ok().flatten().and_then(|j| j.status.phase);
            (phase == Some(JobPhase::Failed)).then_some(generation)
        })
    };
    let jobs = in_flight(engine, &name).await;
    let building = jobs
        .iter()
        .find(|(_, template)| matches!(template, JobTemplate::Spawn | JobTemplate::Rebuild))
        .cloned();
    let facts = Facts {
        deleting: agent.metadata.deletion_timestamp.is_some(),
        has_finalizer: agent.metadata.finalizers.iter().any(|f| f == FINALIZER),
        installed: engine.runtime.installed(&name),
        running: engine.is_running(&name),
        in_flight: !jobs.is_empty(),
        wanted_up: agent.spec.wanted == Wanted::Up,
        fingerprint: fingerprint(&agent),
        submitted_fingerprint: agent.status.config_fingerprint.clone(),
        generation,
        failed_reconcile_generation,
        crashed: agent
            .status
            .condition(hive_api::agent::CONDITION_CRASHED)
            .is_some_and(|c| c.status == ConditionStatus::True),
    };
    let now = Time(engine.store.now());
    match decide(&facts) {
        Decision::AddFinalizer => {
            agents
                .patch(&name, |a| {
                    if !a.metadata.finalizers.iter().any(|f| f == FINALIZER) {
                        a.metadata.finalizers.push(FINALIZER.into());
                    }
                })
                .await?;
            Ok(Action::await_change())
        }
        Decision::Destroy => {
            engine.runtime.destroy(&agent).await?;
            engine.forget(&name).await;
            agents.patch(&name, |a| a.metadata.finalizers.retain(|f| f != FINALIZER)).await?;
            Ok(Action::await_change())
        }
        Decision::Wait => {
            agents
                .patch_status(&name, |status| building_condition(status, now, generation, building.as_ref()))
                .await?;
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Decision::Submit(op) => {
            let permissions_changed = op == Submit::Rebuild && engine.permissions_changed(&agent).await;
            let (template, reason) = match op {
                Submit::Spawn => (JobTemplate::Spawn, "the agent was created"),
                Submit::Rebuild if permissions_changed => {
                    (JobTemplate::PermChange, "its permissions changed")
                }
                Submit::Rebuild => {
                    (JobTemplate::Rebuild, "its config, runtime settings or resources changed")
                }
                Submit::Reconcile => (JobTemplate::Reconcile, "observed power differs from wanted"),
            };
            let job = engine
                .submit(template, vec![name.clone()], JobSource::Controller, Some(reason.into()))
                .await?;
            let job_name = job.metadata.name;
            if op == Submit::Reconcile {
                ctx.reconciles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.clone(), (generation, job_name.clone()));
            }
            let print = facts.fingerprint.clone();
            let message = format!("{reason}: Job {job_name}");
            agents
                .patch_status(&name, |status| {
                    if op != Submit::Reconcile {
                        status.config_fingerprint = Some(print.clone());
                    }
                    status.active_job = Some(job_name.clone());
                    status.observed_generation = Some(generation);
                    conditions(status, now, generation, ConditionStatus::False, "Converging", &message, None);
                })
                .await?;
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Decision::Converged => {
            let ready = if facts.wanted_up { ConditionStatus::True } else { ConditionStatus::False };
            let why = if facts.wanted_up { "running the wanted config" } else { "stopped, as wanted" };
            agents
                .patch_status(&name, |status| {
                    status.observed_generation = Some(generation);
                    status.active_job = None;
                    conditions(status, now, generation, ConditionStatus::True, "Converged", why, Some(ready));
                    building_condition(status, now, generation, None);
                })
                .await?;
            Ok(Action::await_change())
        }
        Decision::Blocked(message) => {
            agents
                .patch_status(&name, |status| {
                    status.observed_generation = Some(generation);
                    conditions(
                        status,
                        now,
                        generation,
                        ConditionStatus::False,
                        "JobFailed",
                        &message,
                        Some(ConditionStatus::False),
                    );
                })
                .await?;
            Ok(Action::await_change())
        }
    }
}

/// Sets `Building`: True while a Spawn or Rebuild Job works on the agent.
fn building_condition(
    status: &mut AgentStatus,
    now: Time,
    generation: i64,
    job: Option<&(String, JobTemplate)>,
) {
    let (state, reason, message) = match job {
        Some((name, template)) => {
            (ConditionStatus::True, template.as_str().to_string(), format!("Job {name} is building it"))
        }
        None => (ConditionStatus::False, "Built".to_string(), "no build under way".to_string()),
    };
    let condition = Condition {
        type_: CONDITION_BUILDING.into(),
        status: state,
        reason,
        message,
        observed_generation: Some(generation),
        ..Default::default()
    };
    set_condition(&mut status.conditions, condition, now);
}

/// Sets `Converged` (and `Ready` when given) in `status.conditions`.
fn conditions(
    status: &mut AgentStatus,
    now: Time,
    generation: i64,
    converged: ConditionStatus,
    reason: &str,
    message: &str,
    ready: Option<ConditionStatus>,
) {
    let cond = |type_: &str, status: ConditionStatus, reason: &str, message: &str| Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message: message.into(),
        observed_generation: Some(generation),
        ..Default::default()
    };
    set_condition(&mut status.conditions, cond(CONDITION_CONVERGED, converged, reason, message), now);
    if let Some(ready) = ready {
        let reason = if ready == ConditionStatus::True { "Running" } else { "NotRunning" };
        set_condition(&mut status.conditions, cond(CONDITION_READY, ready, reason, message), now);
    }
}
