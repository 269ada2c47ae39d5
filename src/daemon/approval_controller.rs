//! The Approval controller's IO: it marks new approvals Pending, records denials, and
//! for an approved one submits the Job that carries it out — a single-node
//! ApprovalDeploy DAG for `ApplyCommit` / `MergeConfigPr`, the ordinary spawn shape for
//! `Spawn` (the agent and its Job written together), a MetaUpdate for
//! `UpdateMetaInputs` — then resolves the approval exactly once when that Job settles
//! (`Deployed` or `Failed`; a Job cancelled while queued fails it). Who decided and when
//! come from the server-set annotations (see `server::admission`).

use std::sync::Arc;
use std::time::Duration;

use hive_api::agent::{Agent, Wanted};
use hive_api::approval::{Approval, ApprovalKind, ApprovalPhase};
use hive_api::job::{Job, JobPhase, JobSource, JobTemplate};
use hive_api::names::{DECIDED_AT, DECIDED_BY};
use hive_controllers::approval::{decide, Decision, Facts};
use hive_controllers::{Action, Config, Controller, Target};

use crate::client::events::EventType;
use crate::client::{self, Api};
use crate::jobs::Engine;
use crate::submit::{DagRequest, Request};

/// How often a deploying approval looks at its Job anyway (a Job change wakes it at
/// once through the Jobs watch; this is the backstop).
const POLL: Duration = Duration::from_secs(2);

/// Why a reconcile failed (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store refused a write.
    #[error(transparent)]
    Client(#[from] client::Error),
}

/// Shared by every reconcile.
pub struct Context {
    engine: Arc<Engine>,
    recorder: crate::client::events::Recorder,
}

/// Runs the controller until the process ends.
pub fn spawn(engine: Arc<Engine>) {
    let client = Api::<Approval>::new(&engine.store);
    let controller =
        Controller::new(client, Config::default()).observed_by(engine.controller_metrics.clone());
    let recorder = crate::client::events::Recorder::new(engine.store.clone(), "hive-approvals");
    let ctx = Arc::new(Context { engine, recorder });
    tokio::spawn(wake_on_jobs(ctx.clone(), controller.queue()));
    tokio::spawn(controller.run(
        reconcile,
        |target: &Target<Approval>, err: &Error, ctx: &Context| {
            if ctx.engine.store.is_shut_down() {
                tracing::debug!(approval = target.name(), error = %err, "approval reconcile failed: the daemon is stopping");
                return Action::backoff();
            }
            tracing::warn!(approval = target.name(), error = %err, "approval reconcile failed; backing off");
            Action::backoff()
        },
        ctx,
        std::future::pending::<()>(),
    ));
}

/// Wakes an approval whenever the Job carrying it out changes, and records the outcome
/// on the approval the moment its Job settles, from the Job the event carries: the
/// approval's outcome never depends on the Job still being stored afterwards (a settled
/// Job falls out of the scheduler's history, and its object is deleted, after five more
/// of its template).
async fn wake_on_jobs(ctx: Arc<Context>, queue: hive_controllers::WorkQueue) {
    let store = ctx.engine.store.clone();
    loop {
        let mut watch = match store.watch("jobs", store.revision()) {
            Ok(watch) => watch,
            Err(crate::store::Error::Closed) => return,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        while let Some(event) = watch.next().await {
            let Ok(event) = event else { break };
            let Ok(job) = client::decode::<Job>(&event.object) else { continue };
            let Some(approval) = job.spec.approval.clone() else { continue };
            if job.status.settled() {
                if let Err(err) = resolve_settled(&ctx, &approval, &job).await {
                    tracing::warn!(approval, job = job.metadata.name, error = %err, "outcome not recorded yet");
                }
            }
            queue.add(&approval);
        }
        if store.watch("jobs", store.revision()).is_err_and(|e| matches!(e, crate::store::Error::Closed)) {
            return;
        }
    }
}

/// The name of the Job an approval submits: fixed for this approval object, so a
/// reconcile repeated after a crash finds the Job instead of submitting a second one,
/// and distinct for every object of the same name (its uid is part of it), so an
/// approval deleted and created again never adopts the Job of the one before.
/// `approval-NAME-UID8`, with NAME shortened to keep it a DNS-1123 label.
pub fn job_name(approval: &Approval) -> String {
    let uid: String = approval
        .metadata
        .uid
        .as_deref()
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .take(8)
        .collect();
    let suffix = if uid.is_empty() { String::new() } else { format!("-{uid}") };
    let mut head = format!("approval-{}", approval.metadata.name);
    head.truncate(hive_api::validation::MAX_NAME_LEN - suffix.len());
    let head = head.trim_end_matches('-');
    format!("{head}{suffix}")
}

/// What the controller decides from: the approval, and the Job carrying it out as read
/// (`None` when it is not stored). A Job counts as settled only once every node is
/// terminal: a Failed one whose Reconcile still runs is still running.
fn facts(approval: &Approval, job: Option<&Job>) -> Facts {
    let job_phase = job.map(|j| match j.status.phase {
        Some(phase) if j.status.settled() => phase,
        Some(phase) if phase.is_terminal() => JobPhase::Running,
        phase => phase.unwrap_or(JobPhase::Queued),
    });
    let job_error = job
        .and_then(|j| j.status.nodes.iter().find_map(|n| Some(format!("{}: {}", n.id, n.error.as_deref()?))));
    Facts {
        decision: approval.spec.decision.state,
        phase: approval.status.phase,
        job: approval.status.job.clone(),
        job_phase,
        job_error,
    }
}

/// Records the outcome of `job`, which settled, on `approval` when that is the Job
/// carrying it out (exactly once, as every resolution).
async fn resolve_settled(ctx: &Context, approval: &str, job: &Job) -> Result<(), Error> {
    let Some(stored) = Api::<Approval>::new(&ctx.engine.store).get(approval)? else { return Ok(()) };
    if stored.status.job.as_deref() != Some(job.metadata.name.as_str()) {
        return Ok(()); // not (yet) recorded as this approval's Job: the reconcile adopts it
    }
    if let Decision::Resolve { phase, message } = decide(&facts(&stored, Some(job))) {
        resolve(ctx, &stored, phase, &message).await?;
    }
    Ok(())
}

/// Writes the terminal `phase` once, with its Event.
async fn resolve(
    ctx: &Context,
    approval: &Approval,
    phase: ApprovalPhase,
    message: &str,
) -> Result<(), Error> {
    let job = approval.status.job.clone();
    if set_phase(ctx, approval, phase, Some(message.to_string()), job.as_deref()).await? {
        let type_ = if phase == ApprovalPhase::Deployed { EventType::Normal } else { EventType::Warning };
        event(ctx, &approval.metadata.name, type_, phase.as_str(), message).await;
    }
    Ok(())
}

async fn reconcile(target: Target<Approval>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Target::Present(approval) = target else { return Ok(Action::await_change()) };
    let name = approval.metadata.name.clone();
    let jobs = Api::<Job>::new(&ctx.engine.store);
    let job = approval.status.job.as_deref().and_then(|job| jobs.get(job).ok().flatten());
    match decide(&facts(&approval, job.as_ref())) {
        Decision::Nothing => Ok(Action::await_change()),
        Decision::Wait => Ok(Action::requeue(POLL)),
        Decision::MarkPending => {
            set_phase(&ctx, &approval, ApprovalPhase::Pending, None, None).await?;
            Ok(Action::await_change())
        }
        Decision::Deny => {
            let reason = approval.spec.decision.reason.clone().unwrap_or_else(|| "denied".into());
            if set_phase(&ctx, &approval, ApprovalPhase::Denied, Some(reason.clone()), None).await? {
                event(
                    &ctx,
                    &name,
                    EventType::Normal,
                    "Denied",
                    &format!("denied by {}: {reason}", decider(&approval)),
                )
                .await;
            }
            Ok(Action::await_change())
        }
        Decision::Submit => {
            let job = job_name(&approval);
            // The name is this approval object's own: a Job of that name was submitted
            // for it before a crash, and is adopted.
            let submitted =
                if jobs.get(&job)?.is_some() { Ok(()) } else { submit(&ctx.engine, &approval, &job).await };
            match submitted {
                Ok(()) => {
                    let message = format!("approved by {}; Job {job}", decider(&approval));
                    if set_phase(&ctx, &approval, ApprovalPhase::Deploying, Some(message.clone()), Some(&job))
                        .await?
                    {
                        event(&ctx, &name, EventType::Normal, "Deploying", &message).await;
                    }
                    Ok(Action::requeue(POLL))
                }
                Err(why) => {
                    if set_phase(&ctx, &approval, ApprovalPhase::Failed, Some(why.clone()), None).await? {
                        event(&ctx, &name, EventType::Warning, "Failed", &why).await;
                    }
                    Ok(Action::await_change())
                }
            }
        }
        Decision::Resolve { phase, message } => {
            resolve(&ctx, &approval, phase, &message).await?;
            Ok(Action::await_change())
        }
    }
}

fn decider(approval: &Approval) -> String {
    approval.metadata.annotations.get(DECIDED_BY).cloned().unwrap_or_else(|| "unknown".into())
}

/// Submits the Job carrying out an approved change. `Err` is why it cannot run (the
/// approval then fails; nothing was written).
async fn submit(engine: &Engine, approval: &Approval, job: &str) -> Result<(), String> {
    let name = approval.metadata.name.as_str();
    let target = approval.spec.target.clone().unwrap_or_default();
    // The Job's reason is one line: the summary's first line, shortened.
    let summary = approval.spec.summary.as_deref().and_then(|s| s.lines().next()).unwrap_or_default();
    let summary = if summary.is_empty() { approval.spec.kind.as_str() } else { summary };
    let short: String = summary.chars().take(200).collect();
    let ellipsis = if short.len() < summary.len() { "…" } else { "" };
    let reason = Some(format!("approval {name}: {short}{ellipsis}"));
    let result = match approval.spec.kind {
        ApprovalKind::ApplyCommit | ApprovalKind::MergeConfigPr => {
            let request = DagRequest {
                template: JobTemplate::ApprovalDeploy,
                nodes: crate::submit::shapes::approval_deploy(&target, name),
                source: JobSource::Controller,
                reason,
                name: Some(job.to_string()),
                approval: Some(name.to_string()),
                agents: vec![target.clone()],
                ..Default::default()
            };
            engine.submit_dag(&request).await
        }
        ApprovalKind::UpdateMetaInputs => {
            let inputs = approval.spec.payload.inputs.clone();
            let request = DagRequest {
                template: JobTemplate::MetaUpdate,
                nodes: crate::submit::shapes::meta_lock(&inputs, None, false),
                source: JobSource::Controller,
                reason,
                name: Some(job.to_string()),
                approval: Some(name.to_string()),
                inputs,
                ..Default::default()
            };
            engine.submit_dag(&request).await
        }
        ApprovalKind::Spawn => {
            let Some(spec) = approval.spec.payload.agent.clone() else {
                return Err("the Spawn approval carries no agent spec".into());
            };
            if engine.agents().get(&target).map_err(|e| e.to_string())?.is_some() {
                return Err(format!("agents.hive.dev {target:?} already exists"));
            }
            let mut agent = Agent::new(target.clone(), spec);
            agent.spec.wanted = Wanted::Up; // wanted Up at approval
            agent.metadata.annotations.insert(hive_api::names::APPROVAL.into(), name.into());
            let request = Request {
                template: JobTemplate::Spawn,
                agents: vec![target.clone()],
                source: JobSource::Controller,
                reason,
                name: Some(job.to_string()),
                scheduling: Default::default(),
            };
            engine.spawn_new(&agent, &request).await
        }
    };
    let submitted = result.map_err(|e| e.to_string())?;
    // The Job records which approval it resolves.
    if submitted.spec.approval.is_none() {
        let jobs = Api::<Job>::new(&engine.store);
        if let Err(err) = jobs.patch(job, |j| j.spec.approval = Some(name.to_string())).await {
            tracing::warn!(approval = name, job, error = %err, "the Job does not record its approval");
        }
    }
    Ok(())
}

/// Writes `phase` (and the decider, message, Job) unless the approval is already
/// resolved: the exactly-once guard holds on every retry of the write too. Returns
/// whether it changed anything.
async fn set_phase(
    ctx: &Context,
    approval: &Approval,
    phase: ApprovalPhase,
    message: Option<String>,
    job: Option<&str>,
) -> Result<bool, Error> {
    let decided_by = approval.metadata.annotations.get(DECIDED_BY).cloned();
    let decided_at = approval
        .metadata
        .annotations
        .get(DECIDED_AT)
        .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .map(|at| hive_api::Time(at.with_timezone(&chrono::Utc)));
    let generation = approval.metadata.generation;
    let approvals = Api::<Approval>::new(&ctx.engine.store);
    let result = approvals
        .patch_status(&approval.metadata.name, |status| {
            if status.phase.is_some_and(ApprovalPhase::is_terminal) {
                return;
            }
            status.phase = Some(phase);
            if let Some(m) = &message {
                status.message = Some(m.clone());
            }
            if let Some(j) = job {
                status.job = Some(j.to_string());
            }
            if let Some(by) = &decided_by {
                status.decided_by = Some(by.clone());
            }
            if let Some(at) = decided_at {
                status.decided_at = Some(at);
            }
            if let Some(g) = generation {
                status.observed_generation = Some(g);
            }
        })
        .await?;
    Ok(result.stored())
}

async fn event(ctx: &Context, name: &str, type_: EventType, reason: &str, message: &str) {
    let Ok(Some(approval)) = Api::<Approval>::new(&ctx.engine.store).get(name) else { return };
    if let Err(err) = ctx.recorder.record(&approval, type_, reason, message).await {
        tracing::warn!(approval = name, error = %err, "approval event not recorded");
    }
}

#[cfg(test)]
mod tests {
    use hive_api::approval::{ApprovalPayload, ApprovalSpec, Decision as Choice, DecisionState};
    use hive_api::job::{JobNode, JobNodeKind, JobNodeState, JobNodeStatus, JobSpec};

    use super::*;
    use crate::store::{Store, StoreConfig};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_settled_job_resolves_its_approval_even_once_the_job_object_is_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(tmp.path().join("hive.redb"))).unwrap();
        let config = crate::jobs::EngineConfig { hive_rev: "test".into(), ..Default::default() };
        let engine = crate::daemon::start_engine(store.clone(), tmp.path(), config).await.unwrap();
        let recorder = crate::client::events::Recorder::new(store.clone(), "hive-approvals");
        let ctx = Context { engine, recorder };
        let approvals = Api::<Approval>::new(&store);
        let spec = ApprovalSpec {
            kind: ApprovalKind::ApplyCommit,
            target: Some("alpha".into()),
            payload: ApprovalPayload { commit: Some("v2".into()), ..Default::default() },
            decision: Choice { state: DecisionState::Approved, reason: None },
            ..Default::default()
        };
        let created = approvals.create(&Approval::new("a", spec)).await.unwrap();
        let job_of_a = job_name(&created);
        approvals
            .patch_status("a", |s| {
                s.phase = Some(ApprovalPhase::Deploying);
                s.job = Some(job_of_a.clone());
            })
            .await
            .unwrap();

        // The Job as its settling event carries it; the store no longer has it (it fell
        // out of the history). From the store alone the approval would fail.
        let mut job = Job::new(
            job_of_a.clone(),
            JobSpec {
                template: JobTemplate::ApprovalDeploy,
                approval: Some("a".into()),
                nodes: vec![JobNode::new(
                    "alpha/approval-deploy",
                    JobNodeKind::ApprovalDeploy,
                    Some("alpha"),
                )],
                ..Default::default()
            },
        );
        job.status.phase = Some(JobPhase::Done);
        job.status.finished_at = Some(hive_api::Time(store.now()));
        job.status.nodes = vec![JobNodeStatus {
            id: "alpha/approval-deploy".into(),
            state: JobNodeState::Done,
            ..Default::default()
        }];
        let stored = approvals.get_existing("a").unwrap();
        assert!(matches!(
            decide(&facts(&stored, None)),
            Decision::Resolve { phase: ApprovalPhase::Failed, .. }
        ));
        resolve_settled(&ctx, "a", &job).await.unwrap();
        let resolved = approvals.get_existing("a").unwrap();
        assert_eq!(resolved.status.phase, Some(ApprovalPhase::Deployed), "{:?}", resolved.status);

        // Resolved once: a later look at the missing Job changes nothing.
        let decided = decide(&facts(&resolved, None));
        assert_eq!(decided, Decision::Nothing);
    }

    #[test]
    fn a_failed_job_whose_reconcile_still_runs_is_not_settled_for_the_approval() {
        let approval = Approval::new(
            "a",
            ApprovalSpec {
                decision: Choice { state: DecisionState::Approved, reason: None },
                ..Default::default()
            },
        );
        let mut approval = approval;
        approval.status.phase = Some(ApprovalPhase::Deploying);
        approval.status.job = Some("j".into());
        let mut job = Job::new("j", JobSpec::default());
        job.status.phase = Some(JobPhase::Failed);
        job.status.nodes = vec![
            JobNodeStatus { id: "swap".into(), state: JobNodeState::Failed, ..Default::default() },
            JobNodeStatus { id: "reconcile".into(), state: JobNodeState::Running, ..Default::default() },
        ];
        assert_eq!(decide(&facts(&approval, Some(&job))), Decision::Wait);
        job.status.nodes[1].state = JobNodeState::Done;
        assert!(matches!(
            decide(&facts(&approval, Some(&job))),
            Decision::Resolve { phase: ApprovalPhase::Failed, .. }
        ));
    }
}
