//! Jobs through the Job service (`jobs::service`): `POST …/jobs` parsed and named here,
//! then decided and taken there (a template Job through the submit layer, a custom DAG
//! with explicit nodes validated and stored as it is; the answer is the claimed Job — any
//! other write path stores the Job and the intake's controller takes it);
//! `POST …/jobs/{name}/cancel`, and the followable logs of a Job's nodes and of an
//! agent's process.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hive_api::Job;
use serde::Deserialize;
use serde_json::json;
use tokio_stream::wrappers::ReceiverStream;

use super::body::{self, MediaType};
use super::error::{ApiError, ApiResult};
use super::params::Params;
use super::routes::{self, ApiRouter};
use super::AppState;
use crate::auth::Verb;
use crate::client;
use crate::jobs::service::Error;
use crate::jobs::{JobService, PostedJob};
use crate::runtime::LogStream;

/// The routes.
pub fn router() -> ApiRouter {
    ApiRouter::new()
        .route("/apis/hive.dev/v1/jobs/{name}/cancel", routes::post(Verb::Write, cancel))
        .route("/apis/hive.dev/v1/jobs/{name}/log", routes::get(Verb::Read, job_log))
        .route("/apis/hive.dev/v1/agents/{name}/log", routes::get(Verb::Read, agent_log))
}

fn service(state: &AppState) -> ApiResult<Arc<dyn JobService>> {
    state.job_service("this server runs no scheduler")
}

/// Maps a refusal of the Job service onto the API's errors.
pub fn job_error(err: Error) -> ApiError {
    match err {
        Error::Invalid { name, errors } => ApiError::Invalid { kind: "Job".into(), name, errors },
        Error::Admit(err) => err.into(),
        Error::BadRequest(message) | Error::Compare(message) => ApiError::BadRequest(message),
        Error::NotFound { plural, name } => ApiError::NotFound { plural: plural.into(), name },
        Error::AlreadyExists { name } => ApiError::AlreadyExists { plural: "jobs".into(), name },
        Error::Conflict { name, message } => ApiError::Conflict { plural: "jobs".into(), name, message },
        Error::Store(err) => err.into(),
        Error::Client(err) => err.into(),
        Error::Internal(err) => ApiError::Internal(err),
    }
}

/// `POST /apis/hive.dev/v1/jobs` when the daemon runs a scheduler: the body parsed and
/// named here, decided and taken by the Job service (`jobs::post`).
pub async fn create(state: AppState, headers: HeaderMap, uri: Uri, body: Body) -> ApiResult<Response> {
    let service = service(&state)?;
    let params = Params::from_uri(&uri)?;
    let bytes = body::read(body).await?;
    let body::Parsed { mut value, duplicates } = body::parse_object(MediaType::of(&headers), &bytes)?;
    let validation = params.field_validation()?;
    let prefix = super::generate_name::prefix_of("Job", &value)?;
    let dry_run = params.dry_run()?;
    let renames = match &prefix {
        Some(prefix) => {
            super::generate_name::name_it(&mut value, prefix);
            (1..super::generate_name::TRIES).map(|_| super::generate_name::new_name(prefix)).collect()
        }
        None => Vec::new(),
    };
    let posted = service
        .post(PostedJob { object: value, duplicates, validation, dry_run, renames })
        .await
        .map_err(job_error)?;
    let value = serde_json::to_value(&posted.job).map_err(|e| ApiError::Internal(e.into()))?;
    Ok(super::resources::json_response(StatusCode::CREATED, &value, &posted.warnings))
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
    let cancelled_names = match state.local_jobs()? {
        Some(jobs) => jobs.cancel(name.clone(), options.children).await,
        None => crate::jobs::cancel::cancel_waiting(&state.store, &name).await,
    }
    .map_err(job_error)?;
    let job = state
        .store
        .get("jobs", &name)
        .ok_or(ApiError::NotFound { plural: "jobs".into(), name: name.clone() })?;
    if cancelled_names.is_empty() {
        let phase = client::decode::<Job>(&job)?.status.phase.unwrap_or(hive_api::job::JobPhase::Queued);
        return Err(job_error(crate::scheduler::Error::NotCancellable { name, phase }.into()));
    }
    Ok((StatusCode::OK, axum::Json(json!({"job": job.value(), "cancelled": cancelled_names})))
        .into_response())
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

fn text_stream(rx: LogStream) -> Response {
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
    let jobs = service(&state)?;
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
    let rx = jobs.job_log(name, node, query.follow()?).await.map_err(job_error)?;
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
    let jobs = service(&state)?;
    if state.store.get("agents", &name).is_none() {
        return Err(ApiError::NotFound { plural: "agents".into(), name });
    }
    let options = LogQuery::from_uri(&uri)?.options(crate::host::now())?;
    let rx = jobs.agent_log(name, options).await.map_err(job_error)?;
    Ok(text_stream(rx))
}
