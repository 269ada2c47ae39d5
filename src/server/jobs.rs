//! Jobs through the engine: `POST …/jobs` with a template and agents reaches the submit
//! layer (a custom DAG with explicit nodes is validated and stored as it is), then the
//! intake's `take` claims and schedules the stored Job and the answer is the claimed Job
//! (any other write path stores the Job and the intake's controller takes it);
//! `POST …/jobs/{name}/cancel`, and the followable logs of a Job's nodes and of an
//! agent's process.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hive_api::agent::Wanted;
use hive_api::validation::{Reason, ValidationError};
use hive_api::Job;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::body::{self, MediaType};
use super::error::{ApiError, ApiResult};
use super::params::Params;
use super::routes::{self, ApiRouter};
use super::AppState;
use crate::auth::Verb;
use crate::client::{self, Api};
use crate::daemon::engine::{Engine, SubmitError};
use crate::daemon::job_intake;
use crate::scheduler;

/// The routes.
pub fn router() -> ApiRouter {
    ApiRouter::new()
        .route("/apis/hive.dev/v1/jobs/{name}/cancel", routes::post(Verb::Write, cancel))
        .route("/apis/hive.dev/v1/jobs/{name}/log", routes::get(Verb::Read, job_log))
        .route("/apis/hive.dev/v1/agents/{name}/log", routes::get(Verb::Read, agent_log))
}

fn engine(state: &AppState) -> ApiResult<Arc<Engine>> {
    state.engine.clone().ok_or_else(|| ApiError::BadRequest("this server runs no scheduler".into()))
}

fn invalid(name: &str, field: &str, message: impl Into<String>) -> ApiError {
    ApiError::Invalid {
        kind: "Job".into(),
        name: name.into(),
        errors: vec![ValidationError::new(field, Reason::Invalid, message)],
    }
}

/// Maps a scheduler refusal onto the API's errors.
pub fn scheduler_error(err: scheduler::Error) -> ApiError {
    match err {
        scheduler::Error::Invalid { name, errors } => ApiError::Invalid { kind: "Job".into(), name, errors },
        scheduler::Error::AlreadyExists { name } => ApiError::AlreadyExists { plural: "jobs".into(), name },
        scheduler::Error::NotFound { name } => ApiError::NotFound { plural: "jobs".into(), name },
        scheduler::Error::NodeNotFound { job, node } => {
            ApiError::BadRequest(format!("node: job {job:?} has no node {node:?}"))
        }
        scheduler::Error::NotCancellable { name, phase } => ApiError::Conflict {
            plural: "jobs".into(),
            name: name.clone(),
            message: format!(
                "job {name:?} is {phase:?}: only a Job none of whose nodes has started can be cancelled"
            ),
        },
        other => ApiError::Internal(anyhow::Error::new(other)),
    }
}

fn submit_error(err: SubmitError) -> ApiError {
    use crate::submit::Error as E;
    match err {
        SubmitError::Submit(E::UnknownAgent(name)) => ApiError::NotFound { plural: "agents".into(), name },
        SubmitError::Submit(E::NoAgents) => invalid("", "spec.agents", "name at least one agent"),
        SubmitError::Submit(E::NotAgentTemplate(t)) => {
            invalid("", "spec.template", format!("{t:?} is not built from agents; give spec.nodes instead"))
        }
        SubmitError::Submit(E::Store(err)) => err.into(),
        SubmitError::Submit(E::Client(err)) => err.into(),
        SubmitError::Submit(other) => ApiError::Internal(anyhow::Error::new(other)),
        SubmitError::Scheduler(err) => scheduler_error(err),
        SubmitError::Intake(err) => intake_error(err),
    }
}

fn intake_error(err: job_intake::Error) -> ApiError {
    match err {
        job_intake::Error::Gone(name) => ApiError::NotFound { plural: "jobs".into(), name },
        job_intake::Error::Client(err) => err.into(),
        job_intake::Error::Store(err) => err.into(),
        job_intake::Error::Scheduler(err) => scheduler_error(err),
        other => ApiError::Internal(anyhow::Error::new(other)),
    }
}

/// `POST /apis/hive.dev/v1/jobs` when the daemon runs a scheduler.
pub async fn create(state: AppState, headers: HeaderMap, uri: Uri, body: Body) -> ApiResult<Response> {
    let engine = engine(&state)?;
    let params = Params::from_uri(&uri)?;
    let bytes = body::read(body).await?;
    let body::Parsed { value, duplicates } = body::parse_object(MediaType::of(&headers), &bytes)?;
    let validation = params.field_validation()?;
    let prefix = super::generate_name::prefix_of("Job", &value)?;
    let has_nodes =
        value.pointer("/spec/nodes").and_then(serde_json::Value::as_array).is_some_and(|n| !n.is_empty());
    if !has_nodes {
        if params.dry_run()? {
            return Err(ApiError::BadRequest("dryRun is not supported for template Jobs".into()));
        }
        // One typed decode names every malformed or unknown field, as for any Job.
        let (job, unknown) = hive_api::resource::decode::<hive_api::Job>(&value).map_err(|e| {
            let field = if e.field.is_empty() { "spec".to_string() } else { e.field };
            invalid("", &field, e.message)
        })?;
        let strict = validation == super::params::FieldValidation::Strict;
        if strict && (!unknown.is_empty() || !duplicates.is_empty()) {
            return Err(hive_api::AdmitError::Strict { kind: "Job", duplicates, fields: unknown }.into());
        }
        let warnings = if validation == super::params::FieldValidation::Warn {
            duplicates.warnings()
        } else {
            Vec::new()
        };
        let scheduling = job.spec.scheduling();
        let (template, agents, source, reason) =
            (job.spec.template, job.spec.agents, job.spec.source, job.spec.reason);
        let name = Some(job.metadata.name).filter(|n| !n.is_empty());
        if let Some(name) = &name {
            if let Err(why) = hive_api::validation::dns1123_label(name) {
                return Err(invalid(name, "metadata.name", format!("{name:?}: {why}")));
            }
        }
        let mut request = crate::submit::Request { template, agents, source, reason, name, scheduling };
        let mut tried = 1;
        loop {
            if let Some(prefix) = &prefix {
                request.name = Some(super::generate_name::new_name(prefix));
            }
            match engine.submit_request(&request).await.map_err(submit_error) {
                Err(ApiError::AlreadyExists { .. })
                    if prefix.is_some() && tried < super::generate_name::TRIES =>
                {
                    tried += 1
                }
                submitted => return created(&submitted?, &warnings),
            }
        }
    }
    // A custom DAG: validated like any Job, stored, then scheduled.
    let mut value = value;
    if let Some(prefix) = &prefix {
        super::generate_name::name_it(&mut value, prefix);
    }
    let admitted = hive_api::admit_body(&hive_api::KindInfo::of::<Job>(), value, &duplicates, validation)?;
    let mut job: Job = crate::client::decode_value(&admitted.object)?;
    job.status = Default::default();
    let dry_run = params.dry_run()?;
    let jobs = Api::<Job>::new(&state.store);
    let mut tried = 1;
    let job = loop {
        match jobs.create_opts(&job, dry_run).await.map_err(ApiError::from) {
            Err(ApiError::AlreadyExists { .. })
                if prefix.is_some() && tried < super::generate_name::TRIES =>
            {
                tried += 1;
                job.metadata.name = super::generate_name::new_name(prefix.as_deref().unwrap_or_default());
            }
            stored => break stored?,
        }
    };
    if dry_run {
        return created(&job, &admitted.warnings);
    }
    let job = engine.take(&job.metadata.name).await.map_err(submit_error)?;
    created(&job, &admitted.warnings)
}

/// 201 and the Job, with the body's warnings.
fn created(job: &Job, warnings: &[String]) -> ApiResult<Response> {
    let value = serde_json::to_value(job).map_err(|e| ApiError::Internal(e.into()))?;
    Ok(super::resources::json_response(StatusCode::CREATED, &value, warnings))
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelOptions {
    #[serde(default)]
    children: bool,
}

/// `POST /apis/hive.dev/v1/jobs/{name}/cancel`: only while fully queued, whatever wrote
/// the Job. A cancelled power Job reverts its agents' intent to what they are observed
/// doing: a cancel means "don't do it", not "do it later". A Job no scheduler has
/// claimed yet is cancelled in the store (it never wrote an intent).
async fn cancel(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let bytes = body::read(body).await?;
    let options: CancelOptions = if bytes.iter().all(u8::is_ascii_whitespace) {
        CancelOptions::default()
    } else {
        let value = body::parse_object(MediaType::of(&headers), &bytes)?.value;
        body::decode(&value, "invalid cancel options")
            .map_err(|e| ApiError::BadRequest(format!("{e}; expected {{\"children\": BOOL}}")))?
    };
    // Either the scheduler has the Job, or it is still waiting for a claim; a claim may
    // land between the two looks, so look again (a cancel of the waiting Job is a write
    // conditional on its version: it never cancels one a scheduler took meanwhile).
    let mut cancelled_names = Vec::new();
    for _ in 0..3 {
        if let Some(engine) = &state.engine {
            let asked = if options.children {
                engine.scheduler.cancel_children(&name).await
            } else {
                engine.scheduler.cancel(&name).await.map(|c| vec![c])
            };
            match asked {
                Ok(cancelled) => {
                    for job in &cancelled {
                        if crate::submit::shapes::intent(job.template).is_some() {
                            for agent in &job.agents {
                                revert_intent(engine, agent).await?;
                            }
                        }
                    }
                    cancelled_names = cancelled.into_iter().map(|c| c.name).collect();
                    break;
                }
                Err(crate::scheduler::Error::NotFound { .. }) => {}
                Err(err) => return Err(scheduler_error(err)),
            }
        }
        match job_intake::cancel_unclaimed(&state.store, &name).await.map_err(intake_error)? {
            Some(cancelled) => {
                if let Some(engine) = &state.engine {
                    engine.scheduler.settled_elsewhere(vec![job_intake::settled(&cancelled)]);
                }
                cancelled_names = vec![name.clone()];
                break;
            }
            None if state.engine.is_none() => break,
            // Claimed: the scheduler has it, or is about to.
            None => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    let job = state
        .store
        .get("jobs", &name)
        .ok_or(ApiError::NotFound { plural: "jobs".into(), name: name.clone() })?;
    if cancelled_names.is_empty() {
        let phase = client::decode::<Job>(&job)?.status.phase.unwrap_or(hive_api::job::JobPhase::Queued);
        return Err(scheduler_error(crate::scheduler::Error::NotCancellable { name, phase }));
    }
    Ok((StatusCode::OK, axum::Json(json!({"job": job.value(), "cancelled": cancelled_names})))
        .into_response())
}

async fn revert_intent(engine: &Engine, agent: &str) -> ApiResult<()> {
    use crate::submit::LiveState;
    let observed = if engine.is_running(agent) { Wanted::Up } else { Wanted::Offline };
    match engine.agents().patch(agent, |a| a.spec.wanted = observed).await {
        Ok(_) => Ok(()),
        Err(err) if err.is_not_found() => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// The query of the log routes, as kubectl's pod-log parameters. Every parameter the
/// request carries is checked, whichever route reads it, and a bad value is a 400 naming
/// the parameter.
#[derive(Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct LogQuery {
    /// A Job's node, e.g. `alpha/prebuild` (the Job log route only).
    node: Option<String>,
    /// `true`: keep the response open and send what is written next.
    follow: Option<String>,
    /// Only the last this many lines of what was written so far.
    tail: Option<String>,
    /// Only lines written in the last this many seconds (a positive integer).
    since_seconds: Option<String>,
    /// Only lines written at or after this time (RFC 3339).
    since_time: Option<String>,
    /// `true`: prefix each line with the time it was written (RFC 3339, nanoseconds).
    timestamps: Option<String>,
    /// `true`: the agent's run before the current one (its lines only, never followed).
    previous: Option<String>,
}

fn log_flag(name: &str, value: &Option<String>) -> ApiResult<bool> {
    match value.as_deref() {
        None | Some("") | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => {
            Err(ApiError::BadRequest(format!("{name}: invalid boolean {other:?}; use true or false")))
        }
    }
}

impl LogQuery {
    fn from_uri(uri: &Uri) -> ApiResult<LogQuery> {
        let query = axum::extract::Query::<LogQuery>::try_from_uri(uri)
            .map(|q| q.0)
            .map_err(|e| ApiError::BadRequest(format!("invalid query: {}", e.body_text())))?;
        query.options(crate::host::now())?;
        Ok(query)
    }

    fn follow(&self) -> ApiResult<bool> {
        log_flag("follow", &self.follow)
    }

    /// The runtime's options, with `sinceSeconds` counted back from `now`.
    fn options(&self, now: chrono::DateTime<chrono::Utc>) -> ApiResult<crate::runtime::LogOptions> {
        let tail = match self.tail.as_deref() {
            None | Some("") => None,
            Some(n) => Some(n.parse::<usize>().map_err(|_| {
                ApiError::BadRequest(format!("tail: invalid count {n:?}; expected a non-negative integer"))
            })?),
        };
        let since_seconds = match self.since_seconds.as_deref() {
            None | Some("") => None,
            Some(n) => match n.parse::<i64>() {
                Ok(secs) if secs > 0 => Some(secs),
                _ => {
                    return Err(ApiError::BadRequest(format!(
                        "sinceSeconds: invalid value {n:?}; expected a positive integer"
                    )))
                }
            },
        };
        let since_time = match self.since_time.as_deref() {
            None | Some("") => None,
            Some(t) => Some(chrono::DateTime::parse_from_rfc3339(t).map(|t| t.to_utc()).map_err(|_| {
                ApiError::BadRequest(format!(
                    "sinceTime: invalid time {t:?}; expected RFC 3339, e.g. 2026-12-01T17:00:00Z"
                ))
            })?),
        };
        let since = match (since_seconds, since_time) {
            (Some(_), Some(_)) => {
                return Err(ApiError::BadRequest(
                    "sinceSeconds, sinceTime: at most one of them may be given".into(),
                ))
            }
            (Some(secs), None) => Some(
                chrono::TimeDelta::try_seconds(secs)
                    .and_then(|ago| now.checked_sub_signed(ago))
                    .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC),
            ),
            (None, since) => since,
        };
        Ok(crate::runtime::LogOptions {
            follow: self.follow()?,
            tail,
            since,
            timestamps: log_flag("timestamps", &self.timestamps)?,
            previous: log_flag("previous", &self.previous)?,
        })
    }
}

fn text_stream(rx: mpsc::Receiver<Bytes>) -> Response {
    let body = Body::from_stream(futures_util::StreamExt::map(
        ReceiverStream::new(rx),
        Ok::<_, std::convert::Infallible>,
    ));
    let mut response = (StatusCode::OK, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// `GET /apis/hive.dev/v1/jobs/{name}/log?node=ID&follow=true`.
async fn job_log(State(state): State<AppState>, Path(name): Path<String>, uri: Uri) -> ApiResult<Response> {
    let engine = engine(&state)?;
    let query = LogQuery::from_uri(&uri)?;
    let Some(node) = query.node.clone().filter(|n| !n.is_empty()) else {
        return Err(ApiError::BadRequest("node: required, e.g. ?node=alpha/prebuild".into()));
    };
    let options = query.options(crate::host::now())?;
    let agent_only = [
        ("tail", options.tail.is_some()),
        ("sinceSeconds, sinceTime", options.since.is_some()),
        ("timestamps", options.timestamps),
        ("previous", options.previous),
    ];
    if let Some((name, _)) = agent_only.iter().find(|(_, given)| *given) {
        return Err(ApiError::BadRequest(format!(
            "{name}: applies to agent logs; a node's build log is sent whole, without times"
        )));
    }
    let (so_far, follower) = engine.scheduler.log(&name, &node).await.map_err(scheduler_error)?;
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let follow = query.follow()?;
    tokio::spawn(async move {
        if tx.send(Bytes::from(so_far)).await.is_err() {
            return;
        }
        if let (true, Some(mut follower)) = (follow, follower) {
            while let Some(chunk) = follower.recv().await {
                if tx.send(chunk).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(text_stream(rx))
}

/// `GET /apis/hive.dev/v1/agents/{name}/log`: the agent process's stdout and stderr,
/// oldest rotated file first, as kubectl's pod log: `follow`, `tail`, `sinceSeconds` or
/// `sinceTime`, `timestamps`, `previous`. Without them the answer is the agent's plain
/// lines, as before lines carried their time.
#[utoipa::path(get, path = "/apis/hive.dev/v1/agents/{name}/log", tag = "hive.dev/v1",
    params(("name" = String, Path, description = "The agent's name"), LogQuery),
    responses(
        (status = 200, description = "The agent's output, one line per line it printed", content_type = "text/plain", body = String),
        (status = 400, description = "A bad parameter (named in the message), no previous run, or a runtime that keeps no output (it says where it is)", body = hive_api::meta::Status),
        (status = 401, description = "No token, or one the daemon does not know", body = hive_api::meta::Status),
        (status = 403, description = "The token's role does not allow the request", body = hive_api::meta::Status),
        (status = 404, description = "No such agent", body = hive_api::meta::Status),
    ))]
pub async fn agent_log(
    State(state): State<AppState>,
    Path(name): Path<String>,
    uri: Uri,
) -> ApiResult<Response> {
    let engine = engine(&state)?;
    if state.store.get("agents", &name).is_none() {
        return Err(ApiError::NotFound { plural: "agents".into(), name });
    }
    let options = LogQuery::from_uri(&uri)?.options(crate::host::now())?;
    let rx = engine.runtime.logs(&name, options).await.map_err(|e| match e {
        crate::runtime::Error::LogsElsewhere { .. } | crate::runtime::Error::NoPreviousRun { .. } => {
            ApiError::BadRequest(e.to_string())
        }
        other => ApiError::Internal(anyhow::Error::new(other)),
    })?;
    Ok(text_stream(rx))
}
