//! The Agent controller's IO: it gathers each agent's facts (store, runtime, Jobs in
//! flight), asks [`hive_controllers::agent::decide`] for the next step, and applies it —
//! submitting Jobs through the engine (the only producer of Jobs is the submit layer),
//! managing the finalizer, and keeping `status` (observedGeneration, conditions Ready
//! and Converged) true so that `kubectl wait --for=condition=Ready agent/x` works.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hive_api::agent::{Agent, Wanted, CONDITION_CONVERGED, CONDITION_READY};
use hive_api::job::{JobPhase, JobSource, JobTemplate};
use hive_api::meta::{set_condition, Condition, ConditionStatus, Time};
use hive_controllers::agent::{decide, Decision, Facts, Submit};
use hive_controllers::{Action, Config, Controller, Target};
use serde_json::{json, Value};

use crate::daemon::Engine;
use crate::local_client::LocalClient;
use crate::store::{self, Subresource};
use crate::submit::LiveState;
use crate::update::update;

/// The finalizer that makes a delete wait until the agent is stopped and removed.
pub const FINALIZER: &str = "hive.dev/agent-runtime";

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
    Store(#[from] store::Error),
    /// The engine refused a submit.
    #[error(transparent)]
    Submit(#[from] crate::daemon::SubmitError),
    /// The runtime failed to remove the agent.
    #[error(transparent)]
    Runtime(#[from] crate::runtime::Error),
}

/// Runs the controller until the process ends.
pub fn spawn(engine: Arc<Engine>) {
    let client = LocalClient::<Agent>::new(engine.store.clone());
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

/// A stable fingerprint of what a build depends on: `spec.config`, `spec.runtime`,
/// `spec.resources` (the drop-in a swap rewrites) and `spec.permissions` (a change is
/// the perm-change shape: WritePermFile, then a rebuild).
pub fn fingerprint(agent: &Agent) -> String {
    let text = json!({"config": agent.spec.config, "runtime": agent.spec.runtime,
                      "resources": agent.spec.resources, "permissions": agent.spec.permissions})
    .to_string();
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref()[..12].iter().map(|b| format!("{b:02x}")).collect()
}

/// A stored Job the scheduler does not know yet counts as in flight for this long: the
/// submit layer writes the Job, then hands it to the scheduler.
const HANDOFF_GRACE: chrono::Duration = chrono::Duration::seconds(10);

/// The unfinished Jobs that touch `agent`: (name, template). "Unfinished" is the
/// scheduler's word, not the stored status: a Job object written by hand (say,
/// `kubectl apply` of a Job manifest) never ran and must not block the agent forever.
async fn in_flight(engine: &Engine, agent: &str) -> Vec<(String, String)> {
    let scheduled: std::collections::HashMap<String, JobPhase> = match engine.scheduler.list().await {
        Ok(jobs) => jobs.into_iter().map(|j| (j.name, j.phase)).collect(),
        Err(_) => Default::default(),
    };
    let now = chrono::Utc::now();
    let (_, jobs) = engine.store.list("jobs");
    jobs.iter()
        .filter(|job| {
            job["spec"]["nodes"].as_array().is_some_and(|nodes| nodes.iter().any(|n| n["agent"] == agent))
        })
        .filter(|job| {
            let name = job["metadata"]["name"].as_str().unwrap_or_default();
            match scheduled.get(name) {
                Some(phase) => !phase.is_terminal(),
                None => {
                    let unstarted = job["status"]["phase"].is_null();
                    let created = job["metadata"]["creationTimestamp"]
                        .as_str()
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
                    unstarted && created.is_some_and(|t| now - t.with_timezone(&chrono::Utc) < HANDOFF_GRACE)
                }
            }
        })
        .map(|job| {
            let name = job["metadata"]["name"].as_str().unwrap_or_default().to_string();
            (name, job["spec"]["template"].as_str().unwrap_or_default().to_string())
        })
        .collect()
}

/// The condition saying whether a spawn or rebuild is under way.
const CONDITION_BUILDING: &str = "Building";

async fn reconcile(target: Target<Agent>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Target::Present(agent) = target else { return Ok(Action::await_change()) };
    let engine = &ctx.engine;
    let name = agent.metadata.name.clone();
    let generation = agent.metadata.generation.unwrap_or(1);
    let failed_reconcile_generation = {
        let last = ctx.reconciles.lock().unwrap_or_else(|e| e.into_inner()).get(&name).cloned();
        last.and_then(|(generation, job)| {
            let phase = engine
                .store
                .get("jobs", &job)
                .and_then(|j| j["status"]["phase"].as_str().map(str::to_string));
            (phase.as_deref() == Some("Failed")).then_some(generation)
        })
    };
    let jobs = in_flight(engine, &name).await;
    let building = jobs.iter().find(|(_, template)| template == "Spawn" || template == "Rebuild").cloned();
    let facts = Facts {
        deleting: agent.metadata.deletion_timestamp.is_some(),
        has_finalizer: agent.metadata.finalizers.iter().any(|f| f == FINALIZER),
        installed: engine.driver.installed(&name),
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
    match decide(&facts) {
        Decision::AddFinalizer => {
            edit_object(engine, &name, |o| {
                let finalizers = o["metadata"]["finalizers"].as_array().cloned().unwrap_or_default();
                let mut finalizers: Vec<Value> = finalizers;
                finalizers.push(json!(FINALIZER));
                o["metadata"]["finalizers"] = Value::Array(finalizers);
            })
            .await?;
            Ok(Action::await_change())
        }
        Decision::Destroy => {
            engine.runtime.destroy(&agent).await?;
            engine.forget(&name).await;
            edit_object(engine, &name, |o| {
                if let Some(list) = o["metadata"]["finalizers"].as_array_mut() {
                    list.retain(|f| f != FINALIZER);
                }
            })
            .await?;
            Ok(Action::await_change())
        }
        Decision::Wait => {
            write_status(engine, &name, |status, now| {
                building_condition(status, now, generation, building.as_ref())
            })
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
            let job_name = job["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if op == Submit::Reconcile {
                ctx.reconciles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.clone(), (generation, job_name.clone()));
            }
            let print = facts.fingerprint.clone();
            write_status(engine, &name, |status, now| {
                if op != Submit::Reconcile {
                    status["configFingerprint"] = json!(print);
                }
                status["activeJob"] = json!(job_name);
                status["observedGeneration"] = json!(generation);
                conditions(
                    status,
                    now,
                    generation,
                    ConditionStatus::False,
                    "Converging",
                    &format!("{reason}: Job {job_name}"),
                    None,
                );
            })
            .await?;
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Decision::Converged => {
            let ready = if facts.wanted_up { ConditionStatus::True } else { ConditionStatus::False };
            let why = if facts.wanted_up { "running the wanted config" } else { "stopped, as wanted" };
            write_status(engine, &name, |status, now| {
                status["observedGeneration"] = json!(generation);
                if let Some(map) = status.as_object_mut() {
                    map.remove("activeJob");
                }
                conditions(status, now, generation, ConditionStatus::True, "Converged", why, Some(ready));
                building_condition(status, now, generation, None);
            })
            .await?;
            Ok(Action::await_change())
        }
        Decision::Blocked(message) => {
            write_status(engine, &name, |status, now| {
                status["observedGeneration"] = json!(generation);
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
fn building_condition(status: &mut Value, now: Time, generation: i64, job: Option<&(String, String)>) {
    let mut list: Vec<Condition> = serde_json::from_value(status["conditions"].take()).unwrap_or_default();
    let (state, reason, message) = match job {
        Some((name, template)) => {
            (ConditionStatus::True, template.clone(), format!("Job {name} is building it"))
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
    set_condition(&mut list, condition, now);
    status["conditions"] = serde_json::to_value(list).unwrap_or_default();
}

/// Sets `Converged` (and `Ready` when given) in `status.conditions`.
fn conditions(
    status: &mut Value,
    now: Time,
    generation: i64,
    converged: ConditionStatus,
    reason: &str,
    message: &str,
    ready: Option<ConditionStatus>,
) {
    let mut list: Vec<Condition> = serde_json::from_value(status["conditions"].take()).unwrap_or_default();
    let cond = |type_: &str, status: ConditionStatus, reason: &str, message: &str| Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message: message.into(),
        observed_generation: Some(generation),
        ..Default::default()
    };
    set_condition(&mut list, cond(CONDITION_CONVERGED, converged, reason, message), now);
    if let Some(ready) = ready {
        let reason = if ready == ConditionStatus::True { "Running" } else { "NotRunning" };
        set_condition(&mut list, cond(CONDITION_READY, ready, reason, message), now);
    }
    status["conditions"] = serde_json::to_value(list).unwrap_or_default();
}

/// Applies `change` to the agent's metadata or spec through the main resource.
async fn edit_object(engine: &Engine, name: &str, change: impl FnMut(&mut Value)) -> Result<(), Error> {
    update(&engine.store, "agents", name, Subresource::Main, change).await?;
    Ok(())
}

/// Applies `change` to the agent's status; a write that changes nothing is not stored.
async fn write_status(engine: &Engine, name: &str, change: impl Fn(&mut Value, Time)) -> Result<(), Error> {
    let now = Time(chrono::Utc::now());
    update(&engine.store, "agents", name, Subresource::Status, |object| change(&mut object["status"], now))
        .await?;
    Ok(())
}
