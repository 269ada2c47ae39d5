//! `GET /hive/v1/audit`: the deploy audit trail — the meta repo's git log, newest
//! first, optionally only one agent's commits (`?agent=NAME`, `?limit=N`, default 50,
//! at most 1000). Read-only; any role.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::error::{ApiError, ApiResult};
use super::routes::{self, ApiRouter};
use super::AppState;
use crate::auth::Verb;

/// The routes.
pub fn router() -> ApiRouter {
    ApiRouter::new().route("/hive/v1/audit", routes::get(Verb::Read, audit))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    agent: Option<String>,
    limit: Option<usize>,
}

async fn audit(
    State(state): State<AppState>,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let Query(query) =
        query.map_err(|e| ApiError::BadRequest(format!("audit: {e}; expected ?agent=NAME&limit=N")))?;
    let jobs = state.job_service("this server runs no engine, so it has no meta repo")?;
    let limit = query.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit: {limit} is out of range 1..=1000")));
    }
    if let Some(agent) = &query.agent {
        hive_api::validation::dns1123_label(agent)
            .map_err(|why| ApiError::BadRequest(format!("agent {agent:?}: {why}")))?;
    }
    let entries = jobs.audit(query.agent, limit).await.map_err(super::jobs::job_error)?;
    let items: Vec<_> = entries
        .into_iter()
        .map(|e| {
            json!({"commit": e.commit, "time": e.time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true), "op": e.op,
                   "agents": e.agents, "subject": e.subject, "body": e.body, "tags": e.tags})
        })
        .collect();
    Ok(Json(json!({"kind": "AuditLog", "apiVersion": "hive.dev/v1", "items": items})).into_response())
}
