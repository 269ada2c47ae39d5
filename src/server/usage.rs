//! `GET /hive/v1/agents/usage`: what each agent uses now — CPU over a short window and
//! resident memory of its process tree — as `hive top` shows it (kubectl's `top pods`
//! reads metrics-server's answer the same way). Read-only; any role. Measured by the
//! `JobService` (the runtime's pids, the host's `/proc`).

use std::time::Duration;

use axum::extract::State;
use axum::http::Uri;
use axum::Json;
use hive_api::usage::AgentUsageList;
use hive_api::Agent;

use super::error::{ApiError, ApiResult};
use super::routes::{self, ApiRouter};
use super::AppState;
use crate::auth::Verb;

/// The window CPU is measured over, unless the request asks for another.
const WINDOW: Duration = Duration::from_secs(1);
/// The longest window a request may ask for.
const MAX_WINDOW_MS: u64 = 10_000;

/// The routes.
pub fn router() -> ApiRouter {
    ApiRouter::new().route("/hive/v1/agents/usage", routes::get(Verb::Read, usage))
}

/// `?windowMs=N`: how long to measure CPU over (100 … 10,000 ms).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageQuery {
    window_ms: Option<u64>,
}

async fn usage(State(state): State<AppState>, uri: Uri) -> ApiResult<Json<AgentUsageList>> {
    let query = axum::extract::Query::<UsageQuery>::try_from_uri(&uri)
        .map(|q| q.0)
        .map_err(|e| ApiError::BadRequest(format!("invalid query: {}", e.body_text())))?;
    let jobs = state.job_service("this server runs no engine, so it runs no agents to measure")?;
    let window = match query.window_ms {
        None => WINDOW,
        Some(ms @ 100..=MAX_WINDOW_MS) => Duration::from_millis(ms),
        Some(ms) => {
            return Err(ApiError::BadRequest(format!(
                "windowMs: {ms} is out of bounds (100 to {MAX_WINDOW_MS} milliseconds)"
            )))
        }
    };
    let (_, agents) = crate::client::Api::<Agent>::new(&state.store).list();
    let answer = jobs.agent_usage(agents, window).await.map_err(super::jobs::job_error)?;
    Ok(Json(answer))
}
