//! The Agent controller's IO: it gathers each agent's facts (store, runtime, Jobs in
//! flight), asks [`hive_controllers::agent::decide`] for the next step, and applies it —
//! submitting Jobs through the engine (the only producer of Jobs is the submit layer),
//! managing the finalizer, and keeping `status` (observedGeneration, conditions Ready
//! and Converged) true so that `kubectl wait --for=condition=Ready agent/x` works.
//!
//! It owns its Jobs: beside the Agents it watches the Jobs into an index by agent
//! ([`agent_jobs`]), so a reconcile reads only the Jobs of its agent, and every change
//! of a Job wakes the agents that Job stands for ([`hive_controllers::agent::touches`];
//! a boot sweep or meta-update wakes them all), so a reconcile waiting on a Job runs
//! again when the Job settles, with no polling.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hive_api::agent::{
    Agent, AgentStatus, Power, Wanted, CONDITION_BUILDING, CONDITION_CONVERGED, CONDITION_NODE_LOST,
    CONDITION_PLACED, CONDITION_READY, REASON_BUILD_FAILED, REASON_START_FAILED, REASON_STOP_FAILED,
};
use hive_api::job::{Job, JobPhase, JobSource, JobTemplate};
use hive_api::meta::{set_condition, Condition, ConditionStatus, Time};
use hive_controllers::agent::{decide, touches, Decision, Facts, Submit, Touches};
use hive_controllers::{Action, Config, Controller, Target};

use crate::client::events::EventType;
use crate::client::{self, Api};
use crate::daemon::agent_jobs::{self, AgentJobs};
use crate::jobs::Engine;
use crate::runtime::{Change, Unanswerable};
use crate::submit::LiveState;

pub use hive_api::names::AGENT_FINALIZER as FINALIZER;

/// Shared by every reconcile.
pub struct Context {
    engine: Arc<Engine>,
    /// The Jobs of each agent.
    jobs: AgentJobs,
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
    Submit(#[from] crate::jobs::SubmitError),
    /// The runtime failed to remove the agent.
    #[error(transparent)]
    Runtime(#[from] crate::runtime::Error),
}

/// Runs the controller until the process ends.
pub fn spawn(engine: Arc<Engine>) {
    let client = Api::<Agent>::new(&engine.store);
    let controller =
        Controller::new(client, Config::default()).observed_by(engine.controller_metrics.clone());
    let (agents, queue) = (controller.store(), controller.queue());
    let wake = move |job: &Job| match touches(&job.spec) {
        Touches::All => agents.list().iter().for_each(|a| queue.add(a.metadata.name.clone())),
        Touches::Agents(names) => names.into_iter().for_each(|name| queue.add(name)),
    };
    let jobs = agent_jobs::spawn(engine.store.clone(), wake);
    // A placed agent's node lost or back: its observed state changed outside any Job.
    let (mut changes, queue) = (engine.runtime.subscribe(), controller.queue());
    tokio::spawn(async move {
        loop {
            match changes.recv().await {
                Ok(event) => {
                    if matches!(event.change, Change::NodeLost { .. } | Change::NodeBack { .. }) {
                        queue.add(event.agent);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    let ctx = Arc::new(Context { engine, jobs, reconciles: Mutex::new(HashMap::new()) });
    tokio::spawn(controller.run(
        reconcile,
        |target: &Target<Agent>, err: &Error, ctx: &Context| {
            if ctx.engine.store.is_shut_down() {
                tracing::debug!(agent = target.name(), error = %err, "agent reconcile failed: the daemon is stopping");
                return Action::backoff();
            }
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

/// Of `jobs` (those that touch `agent`, see [`touches`]: a boot sweep or meta-update
/// counts for the agents it will rebuild), the unfinished ones, and when the earliest of
/// those counted only by the handoff grace stops counting. "Unfinished" is the
/// scheduler's word, not the stored status: a Job object written by hand (say, `kubectl
/// apply` of a Job manifest) never ran and must not block the agent forever.
async fn in_flight(
    engine: &Engine,
    jobs: &[Arc<Job>],
    agent: &str,
) -> (Vec<(String, JobTemplate)>, Option<Duration>) {
    // Settled, not a terminal phase: a Failed Job may still run its AfterAny Reconcile.
    let names = jobs.iter().map(|job| job.metadata.name.clone()).collect();
    let scheduled = engine.scheduler.settled(names).await.unwrap_or_default();
    unfinished(jobs, &scheduled, engine.store.now(), agent)
}

/// [`in_flight`] over given Jobs and the scheduler's phases.
fn unfinished(
    jobs: &[impl Borrow<Job>],
    scheduled: &HashMap<String, bool>,
    now: chrono::DateTime<chrono::Utc>,
    agent: &str,
) -> (Vec<(String, JobTemplate)>, Option<Duration>) {
    let mut recheck: Option<Duration> = None;
    let touching = jobs
        .iter()
        .map(Borrow::borrow)
        .filter(|job: &&Job| touches(&job.spec).contains(agent))
        .filter(|job| match scheduled.get(&job.metadata.name) {
            // Until the stored status says so too: what the controller decides next
            // reads the outcome (which node failed) from the stored Job.
            Some(settled) => !settled || !job.status.settled(),
            None => {
                let unstarted = job.status.phase.is_none();
                let age = job.metadata.creation_timestamp.as_ref().map(|t| now - t.0);
                let counts = unstarted && age.is_some_and(|age| age < HANDOFF_GRACE);
                if let Some(left) = age.filter(|_| counts).and_then(|age| (HANDOFF_GRACE - age).to_std().ok())
                {
                    recheck = Some(recheck.map_or(left, |r| r.min(left)));
                }
                counts
            }
        })
        .map(|job| (job.metadata.name.clone(), job.spec.template))
        .collect();
    (touching, recheck)
}

/// The newest finished Job on `agent`, when it failed at its Reconcile node (the start),
/// e.g. a Spawn whose command dies at once.
fn last_start_failed(jobs: &[impl Borrow<Job>], agent: &str) -> Option<String> {
    let revision = |job: &Job| job.metadata.resource_version.as_deref().and_then(|rv| rv.parse::<u64>().ok());
    let newest = jobs
        .iter()
        .map(Borrow::borrow)
        .filter(|job: &&Job| job.status.settled())
        .filter(|job| job.spec.nodes.iter().any(|n| n.agent.as_deref() == Some(agent)))
        .max_by_key(|job| revision(job));
    newest
        .filter(|job| {
            job.status.phase == Some(JobPhase::Failed)
                && !matches!(job.spec.template, JobTemplate::Stop | JobTemplate::Kill)
                && job.spec.nodes.iter().any(|node| {
                    node.agent.as_deref() == Some(agent)
                        && node.kind == hive_api::job::JobNodeKind::Reconcile
                        && job
                            .status
                            .nodes
                            .iter()
                            .any(|s| s.id == node.id && s.state == hive_api::job::JobNodeState::Failed)
                })
        })
        .map(|job| job.metadata.name.clone())
}

/// Why the newest finished Job that built `agent` (its Create or Prebuild node ran to
/// an end) failed at that build, as "Job NAME failed to build it: ERROR"; `None` when it
/// built (or no such Job is left in the history).
fn last_build_failure(jobs: &[impl Borrow<Job>], agent: &str) -> Option<String> {
    use hive_api::job::{JobNodeKind, JobNodeState};
    let revision = |job: &Job| job.metadata.resource_version.as_deref().and_then(|rv| rv.parse::<u64>().ok());
    let build_nodes = |job: &Job| -> Vec<String> {
        let builds = job.spec.nodes.iter().filter(|n| n.agent.as_deref() == Some(agent));
        builds
            .filter(|n| matches!(n.kind, JobNodeKind::Create | JobNodeKind::Prebuild))
            .map(|n| n.id.clone())
            .collect()
    };
    let ended = |job: &Job| {
        let ids = build_nodes(job);
        let ran = |state: JobNodeState| matches!(state, JobNodeState::Done | JobNodeState::Failed);
        job.status.nodes.iter().any(|n| ids.contains(&n.id) && ran(n.state))
    };
    let newest = jobs
        .iter()
        .map(Borrow::borrow)
        .filter(|job: &&Job| job.status.settled() && ended(job))
        .max_by_key(|job| revision(job))?;
    let ids = build_nodes(newest);
    let failed =
        newest.status.nodes.iter().find(|n| ids.contains(&n.id) && n.state == JobNodeState::Failed)?;
    let error = failed.error.as_deref().unwrap_or("no error recorded");
    Some(format!("Job {} failed to build it: {error}", newest.metadata.name))
}

/// Whether `agent` is installed on another host than its placement names now: its
/// `status.node` (where its spawn or last move put it) differs, and it was built there
/// (an applied-rev marker; a spawn that never built anything moves nothing).
fn moved(engine: &Engine, agent: &Agent) -> bool {
    agent.status.node.as_deref() != agent.spec.node()
        && engine.deploy.markers.read(&agent.metadata.name).is_some()
}

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
    if let Some(action) = placement(engine, &agent, generation).await? {
        return Ok(action);
    }
    let stored_jobs = ctx.jobs.of(&name).await;
    let (jobs, recheck) = in_flight(engine, &stored_jobs, &name).await;
    let start_failure = last_start_failed(&stored_jobs, &name);
    let start_failed = start_failure.is_some();
    let build_failure = last_build_failure(&stored_jobs, &name);
    let building = jobs
        .iter()
        .find(|(_, template)| {
            matches!(template, JobTemplate::Spawn | JobTemplate::Rebuild | JobTemplate::Move)
        })
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
        start_failed,
        moved: moved(engine, &agent),
        build_failure: build_failure.clone(),
    };
    let failure = build_failure.as_deref();
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
                .patch_status(&name, |status| {
                    building_condition(status, now, generation, building.as_ref(), failure)
                })
                .await?;
            // The Job's changes wake this agent again; only a stored Job the scheduler
            // has not taken yet needs a second look when its handoff grace ends.
            Ok(recheck.map_or(Action::await_change(), Action::requeue))
        }
        Decision::Submit(op) => {
            let permissions_changed = op == Submit::Rebuild && engine.permissions_changed(&agent).await;
            let (template, reason) = match op {
                Submit::Rebuild if permissions_changed => {
                    (JobTemplate::PermChange, "its permissions changed")
                }
                Submit::Spawn => (op.template(), "the agent was created"),
                Submit::Rebuild => (op.template(), "its config, runtime settings or resources changed"),
                Submit::Start => (op.template(), "wanted Up, but it is stopped"),
                Submit::Stop => (op.template(), "wanted Offline, but it runs"),
                Submit::Move => (op.template(), "its placement changed"),
            };
            let job = engine
                .submit(template, vec![name.clone()], JobSource::Controller, Some(reason.into()))
                .await?;
            let job_name = job.metadata.name;
            if op.is_power() {
                ctx.reconciles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.clone(), (generation, job_name.clone()));
            }
            let print = facts.fingerprint.clone();
            let message = format!("{reason}: Job {job_name}");
            agents
                .patch_status(&name, |status| {
                    if op.builds_config() {
                        status.config_fingerprint = Some(print.clone());
                    }
                    status.active_job = Some(job_name.clone());
                    status.observed_generation = Some(generation);
                    conditions(status, now, generation, ConditionStatus::False, "Converging", &message, None);
                    if matches!(op, Submit::Spawn | Submit::Rebuild | Submit::Move) {
                        // Building from this write on: an old build's failure is not the
                        // news any more.
                        let job = (job_name.clone(), template);
                        building_condition(status, now, generation, Some(&job), None);
                    }
                })
                .await?;
            // The Job's changes (and this status write) wake the agent again.
            Ok(Action::await_change())
        }
        Decision::CrashLoop => {
            // Said once: the crash is in `Crashed` and `status.lastExit`; a start that
            // never ran (no crash) in its Job's node error.
            let (reason, message) = if facts.crashed {
                (
                    "CrashLoopBackOff",
                    "crash-looping: crash-watch restarts it after a backoff (see Crashed)".into(),
                )
            } else {
                let why = match &start_failure {
                    Some(job) => format!("the start in Job {job} failed"),
                    None => "the last start failed".into(),
                };
                (REASON_START_FAILED, format!("{why}; run a power verb or change the spec to try again"))
            };
            agents
                .patch_status(&name, |status| {
                    status.observed_generation = Some(generation);
                    status.active_job = None;
                    conditions(
                        status,
                        now,
                        generation,
                        ConditionStatus::False,
                        reason,
                        &message,
                        Some(ConditionStatus::False),
                    );
                    building_condition(status, now, generation, None, failure);
                })
                .await?;
            Ok(Action::await_change())
        }
        Decision::Converged => {
            let ready = if facts.wanted_up { ConditionStatus::True } else { ConditionStatus::False };
            let why = if facts.wanted_up { "running the wanted config" } else { "stopped, as wanted" };
            agents
                .patch_status(&name, |status| {
                    status.observed_generation = Some(generation);
                    status.active_job = None;
                    conditions(status, now, generation, ConditionStatus::True, "Converged", why, Some(ready));
                    building_condition(status, now, generation, None, failure);
                })
                .await?;
            Ok(Action::await_change())
        }
        Decision::Blocked(message) => {
            let reason = if !facts.installed {
                REASON_BUILD_FAILED
            } else if facts.wanted_up {
                REASON_START_FAILED
            } else {
                REASON_STOP_FAILED
            };
            agents
                .patch_status(&name, |status| {
                    status.observed_generation = Some(generation);
                    conditions(
                        status,
                        now,
                        generation,
                        ConditionStatus::False,
                        reason,
                        &message,
                        Some(ConditionStatus::False),
                    );
                    building_condition(status, now, generation, None, failure);
                })
                .await?;
            Ok(Action::await_change())
        }
    }
}

/// Sets `Building`: True while a Spawn or Rebuild Job works on the agent; else False,
/// with reason `BuildFailed` and the error when its newest build failed (`failure`,
/// from [`last_build_failure`]), `Built` when it did not.
fn building_condition(
    status: &mut AgentStatus,
    now: Time,
    generation: i64,
    job: Option<&(String, JobTemplate)>,
    failure: Option<&str>,
) {
    let (state, reason, message) = match (job, failure) {
        (Some((name, template)), _) => {
            (ConditionStatus::True, template.as_str().to_string(), format!("Job {name} is building it"))
        }
        (None, Some(why)) => (ConditionStatus::False, REASON_BUILD_FAILED.to_string(), why.to_string()),
        (None, None) => (ConditionStatus::False, "Built".to_string(), "no build under way".to_string()),
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

/// How often an agent waiting for its node looks again (a Node's change does not wake
/// the Agent controller).
const PLACEMENT_RECHECK: Duration = Duration::from_secs(2);

/// For an agent placed on a fleet node: whether the node's runtime can answer for it
/// (`Placed` True), else the agent waits — `Placed` False with what it waits for,
/// nothing submitted, looked at again shortly — and `Some` is what to do instead of a
/// decision. An agent that was on its node when the node went away (killed, stopped,
/// unreachable) is observed `Lost`, with `NodeLost` True and an Event, and is not moved
/// or restarted anywhere: a new placement or a power verb is the operator's answer. A
/// placed agent being deleted whose node cannot be reached loses its finalizer: there
/// is nothing the daemon can clean up there.
async fn placement(engine: &Engine, agent: &Agent, generation: i64) -> Result<Option<Action>, Error> {
    let name = &agent.metadata.name;
    let now = Time(engine.store.now());
    let lost_true = |a: &Agent| {
        a.status.condition(CONDITION_NODE_LOST).is_some_and(|c| c.status == ConditionStatus::True)
    };
    let Some(node) = agent.spec.node() else {
        // Lost on a node, and now placed on the daemon's host: the operator moved it.
        if lost_true(agent) {
            let message = "moved to the daemon's host";
            let cleared =
                condition(CONDITION_NODE_LOST, ConditionStatus::False, "Moved", message, generation);
            engine
                .agents()
                .patch_status(name, |status| {
                    set_condition(&mut status.conditions, cleared.clone(), now);
                })
                .await?;
            record(engine, agent, EventType::Normal, "Moved", message).await;
        }
        return Ok(None);
    };
    let answer = engine.runtime.answerable(agent);
    if answer.is_err() && agent.metadata.deletion_timestamp.is_some() {
        tracing::warn!(
            agent = &**name,
            node,
            "deleting an agent whose node cannot be reached; nothing on the node was cleaned up"
        );
        engine.forget(name).await;
        engine.agents().patch(name, |a| a.metadata.finalizers.retain(|f| f != FINALIZER)).await?;
        return Ok(Some(Action::await_change()));
    }
    let cond = |type_: &str, status: ConditionStatus, reason: &str, message: &str| {
        condition(type_, status, reason, message, generation)
    };
    let was_lost = lost_true(agent);
    match &answer {
        Ok(()) => {
            let placed =
                cond(CONDITION_PLACED, ConditionStatus::True, "NodeRunning", &format!("runs on node {node}"));
            let current = agent.status.condition(CONDITION_PLACED);
            if current.is_some_and(|c| c.status == placed.status && c.message == placed.message) && !was_lost
            {
                return Ok(None);
            }
            let running = engine.runtime.running_now(name);
            // Lost on another node, and now placed here: the operator moved it.
            let moved = agent
                .status
                .condition(CONDITION_NODE_LOST)
                .is_some_and(|c| !c.message.starts_with(&format!("node {node} ")));
            let (reason, back) = if moved {
                ("Moved", format!("moved to node {node}"))
            } else {
                ("NodeBack", format!("node {node} is reachable again"))
            };
            engine
                .agents()
                .patch_status(name, |status| {
                    set_condition(&mut status.conditions, placed.clone(), now);
                    if was_lost {
                        let cleared = cond(CONDITION_NODE_LOST, ConditionStatus::False, reason, &back);
                        set_condition(&mut status.conditions, cleared, now);
                        status.power = Some(if running { Power::Running } else { Power::Stopped });
                    }
                })
                .await?;
            if was_lost {
                let message = format!("{back}; the agent {}", if running { "runs" } else { "is stopped" });
                record(engine, agent, EventType::Normal, reason, &message).await;
            }
            Ok(None)
        }
        Err(why) => {
            // Lost only when it was there (it has an observed power) and its node is gone
            // or stopped answering; a node not reached yet since the daemon started (its
            // worker survived the restart) is waited for, and nothing is concluded.
            let was_there =
                (agent.status.power.is_some() || was_lost) && matches!(why, Unanswerable::Lost(_));
            let message = if was_there {
                format!("node {node} is lost: {why}")
            } else {
                format!("waiting for node {node}: {why}")
            };
            let unchanged = agent.status.condition(CONDITION_PLACED).is_some_and(|c| c.message == message);
            if !unchanged {
                engine
                    .agents()
                    .patch_status(name, |status| {
                        let reason = if was_there { "NodeLost" } else { "WaitingForNode" };
                        set_condition(
                            &mut status.conditions,
                            cond(CONDITION_PLACED, ConditionStatus::False, reason, &message),
                            now,
                        );
                        if was_there {
                            set_condition(
                                &mut status.conditions,
                                cond(CONDITION_NODE_LOST, ConditionStatus::True, "NodeLost", &message),
                                now,
                            );
                            status.power = Some(Power::Lost);
                            status.active_job = None;
                        }
                        conditions(
                            status,
                            now,
                            generation,
                            ConditionStatus::False,
                            reason,
                            &message,
                            Some(ConditionStatus::False),
                        );
                    })
                    .await?;
                if was_there && !was_lost {
                    record(
                        engine,
                        agent,
                        EventType::Warning,
                        "NodeLost",
                        &format!("{message}; the agent is not moved"),
                    )
                    .await;
                }
            }
            Ok(Some(Action::requeue(PLACEMENT_RECHECK)))
        }
    }
}

/// Records an Event about `agent`; a failure is logged, never the reconcile's error.
async fn record(engine: &Engine, agent: &Agent, type_: EventType, reason: &str, message: &str) {
    let recorder = crate::client::events::Recorder::new(engine.store.clone(), "hive-agent-controller");
    if let Err(error) = recorder.record(agent, type_, reason, message).await {
        tracing::warn!(agent = agent.metadata.name, %error, reason, "the agent's Event was not recorded");
    }
}

/// A condition of the agent's `generation`.
fn condition(
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    generation: i64,
) -> Condition {
    Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message: message.into(),
        observed_generation: Some(generation),
        ..Default::default()
    }
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
    let cond = |type_: &str, status: ConditionStatus, reason: &str, message: &str| {
        condition(type_, status, reason, message, generation)
    };
    set_condition(&mut status.conditions, cond(CONDITION_CONVERGED, converged, reason, message), now);
    if let Some(ready) = ready {
        // Not ready because something failed: the same reason, so it reads at a glance.
        let failed = [REASON_BUILD_FAILED, REASON_START_FAILED, REASON_STOP_FAILED, "CrashLoopBackOff"];
        let reason = match ready {
            ConditionStatus::True => "Running",
            _ if converged == ConditionStatus::False && failed.contains(&reason) => reason,
            _ => "NotRunning",
        };
        set_condition(&mut status.conditions, cond(CONDITION_READY, ready, reason, message), now);
    }
}

#[cfg(test)]
mod tests {
    use hive_api::job::{JobNode, JobNodeKind, JobNodeState, JobNodeStatus, JobSpec};
    use hive_api::meta::Time;

    use super::*;

    fn job(name: &str, spec: JobSpec, created: chrono::DateTime<chrono::Utc>) -> Job {
        let mut job = Job::new(name, spec);
        job.metadata.creation_timestamp = Some(Time(created));
        job
    }

    #[test]
    fn a_running_boot_sweep_holds_up_every_agent_until_it_settles() {
        let now = crate::host::now();
        // The sweep's one node is a MetaLock naming no agent; its fan-out lists only `a`.
        let sweep = JobSpec {
            template: JobTemplate::BootSweep,
            agents: vec!["a".into()],
            nodes: crate::submit::shapes::meta_lock(&["hive".into()], Some(&["a".into()]), true),
            ..Default::default()
        };
        let stop = JobSpec {
            template: JobTemplate::Stop,
            agents: vec!["c".into()],
            nodes: vec![JobNode::new("c/set-wanted".to_string(), JobNodeKind::SetWanted, Some("c"))],
            ..Default::default()
        };
        let jobs = vec![job("bootsweep-1", sweep, now), job("stop-1", stop, now)];
        let running: HashMap<String, bool> =
            [("bootsweep-1".to_string(), false), ("stop-1".to_string(), false)].into();
        for agent in ["a", "b"] {
            let (held, recheck) = unfinished(&jobs, &running, now, agent);
            assert_eq!(held, vec![("bootsweep-1".to_string(), JobTemplate::BootSweep)], "{agent}");
            assert_eq!(recheck, None, "a scheduled Job wakes the agent when it settles");
        }
        assert_eq!(unfinished(&jobs, &running, now, "c").0.len(), 2);
        let settled: HashMap<String, bool> = [("bootsweep-1".to_string(), true)].into();
        assert_eq!(unfinished(&jobs[..1], &settled, now, "b").0.len(), 1, "until its stored status says so");
        let mut done = jobs[0].clone();
        done.status.phase = Some(JobPhase::Done);
        assert!(unfinished(std::slice::from_ref(&done), &settled, now, "b").0.is_empty());
        // A stored Job the scheduler has not taken yet counts for its handoff grace only.
        let (held, recheck) = unfinished(&jobs[..1], &HashMap::new(), now, "b");
        assert_eq!(held.len(), 1);
        assert_eq!(recheck, Some(Duration::from_secs(10)));
        let later = now + chrono::Duration::seconds(11);
        assert!(unfinished(&jobs[..1], &HashMap::new(), later, "b").0.is_empty());
    }

    /// A settled Job at resourceVersion `rv` whose nodes for agent `a` ended in `states`.
    fn ended(name: &str, rv: u64, template: JobTemplate, states: &[(JobNodeKind, JobNodeState)]) -> Job {
        let nodes =
            states.iter().map(|(kind, _)| JobNode::new(format!("a/{kind:?}"), *kind, Some("a"))).collect();
        let mut job =
            Job::new(name, JobSpec { template, agents: vec!["a".into()], nodes, ..Default::default() });
        job.metadata.resource_version = Some(rv.to_string());
        let failed = states.iter().any(|(_, state)| *state == JobNodeState::Failed);
        job.status.phase = Some(if failed { JobPhase::Failed } else { JobPhase::Done });
        job.status.finished_at = Some(Time(crate::host::now()));
        job.status.nodes = states
            .iter()
            .map(|(kind, state)| JobNodeStatus {
                id: format!("a/{kind:?}"),
                state: *state,
                error: (*state == JobNodeState::Failed).then(|| format!("{kind:?} broke")),
                ..Default::default()
            })
            .collect();
        job
    }

    #[test]
    fn the_newest_build_that_ran_says_whether_the_build_failed() {
        use JobNodeKind::{Create, Prebuild, Reconcile, SetWanted, Swap, WriteDropin};
        use JobNodeState::{Cancelled, Done, Failed};
        let spawn_failed =
            ended("spawn-1", 10, JobTemplate::Spawn, &[(Create, Failed), (WriteDropin, Cancelled)]);
        let spawned = ended(
            "spawn-2",
            12,
            JobTemplate::Spawn,
            &[(Create, Done), (WriteDropin, Done), (Reconcile, Done)],
        );
        let rebuild_failed = ended(
            "rebuild-1",
            20,
            JobTemplate::Rebuild,
            &[(Prebuild, Failed), (Swap, Cancelled), (Reconcile, Done)],
        );
        let rebuild_cancelled = ended("rebuild-2", 30, JobTemplate::Rebuild, &[(Prebuild, Cancelled)]);
        let stop = ended("stop-1", 40, JobTemplate::Stop, &[(SetWanted, Done), (Reconcile, Done)]);
        let mut running = ended("rebuild-3", 50, JobTemplate::Rebuild, &[(Prebuild, Done)]);
        running.status.phase = Some(JobPhase::Running);
        running.status.finished_at = None;
        let failure = |name: &str, kind: &str| Some(format!("Job {name} failed to build it: {kind} broke"));
        let cases: Vec<(&str, Vec<&Job>, Option<String>)> = vec![
            ("no Jobs", vec![], None),
            ("a failed spawn", vec![&spawn_failed], failure("spawn-1", "Create")),
            ("a later spawn built it", vec![&spawn_failed, &spawned], None),
            ("a failed rebuild", vec![&spawned, &rebuild_failed], failure("rebuild-1", "Prebuild")),
            (
                "a cancelled build never ran; a stop builds nothing; an unsettled Job does not count",
                vec![&spawned, &rebuild_failed, &rebuild_cancelled, &stop, &running],
                failure("rebuild-1", "Prebuild"),
            ),
        ];
        for (what, jobs, want) in cases {
            let jobs: Vec<Job> = jobs.into_iter().cloned().collect();
            assert_eq!(last_build_failure(&jobs, "a"), want, "{what}");
            assert_eq!(last_build_failure(&jobs, "b"), None, "{what}: another agent's");
        }
    }
}
