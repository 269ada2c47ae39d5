//! `/hive/v1/tokens`: creating and listing bearer tokens (admin only). The plaintext
//! token appears in exactly one response: the one that creates it.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::body::{self, MediaType};
use super::error::{ApiError, ApiResult};
use super::routes::{self, ApiRouter};
use super::AppState;
use crate::auth::{self, Role, Verb};

/// The routes: tokens are admin's, listing them too; whoami is anyone's.
pub fn router() -> ApiRouter {
    ApiRouter::new()
        .route("/hive/v1/tokens", routes::get(Verb::Admin, list).post(Verb::Admin, create))
        .route("/hive/v1/tokens/{name}", routes::delete(Verb::Admin, revoke))
        .route("/hive/v1/whoami", routes::get(Verb::Read, whoami))
}

/// `GET /hive/v1/whoami`: the caller's token name, role, and bound agent (any role).
async fn whoami(axum::Extension(principal): axum::Extension<auth::Principal>) -> Json<serde_json::Value> {
    let mut body = json!({"name": principal.name, "role": principal.role});
    if let Some(agent) = principal.agent {
        body["agent"] = json!(agent);
    }
    Json(body)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateToken {
    name: String,
    role: String,
    /// For role `agent`: the agent the token is bound to.
    #[serde(default)]
    agent: Option<String>,
}

async fn create(State(state): State<AppState>, headers: HeaderMap, body: Body) -> ApiResult<Response> {
    let bytes = body::read(body).await?;
    let value = body::parse_object(MediaType::of(&headers), &bytes)?.value;
    let request: CreateToken = body::decode(&value, "invalid token request").map_err(|e| {
        ApiError::BadRequest(format!(
            "{e}; expected {{\"name\": NAME, \"role\": ROLE, \"agent\": AGENT (role agent only)}}"
        ))
    })?;
    let role: Role =
        request.role.parse().map_err(|e: auth::ParseRoleError| ApiError::BadRequest(format!("role: {e}")))?;
    let tokens = state.tokens.clone();
    let name = request.name.clone();
    let agent = request.agent.clone();
    let token = tokio::task::spawn_blocking(move || tokens.create_bound(&name, role, agent.as_deref()))
        .await
        .map_err(|e| ApiError::Internal(e.into()))?
        .map_err(token_error)?;
    tracing::info!(name = request.name, %role, "token created");
    Ok((
        StatusCode::CREATED,
        Json(json!({"name": request.name, "role": role, "agent": request.agent, "token": token})),
    )
        .into_response())
}

fn token_error(err: auth::Error) -> ApiError {
    match err {
        auth::Error::Io { .. } | auth::Error::Corrupt { .. } | auth::Error::Invalid { .. } => {
            ApiError::Internal(anyhow::Error::new(err))
        }
        auth::Error::Duplicate(name) => ApiError::AlreadyExists { plural: "tokens".into(), name },
        auth::Error::NotFound(name) => ApiError::NotFound { plural: "tokens".into(), name },
        other => ApiError::BadRequest(other.to_string()),
    }
}

async fn list(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({"items": state.tokens.list()}))
}

async fn revoke(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Response> {
    let tokens = state.tokens.clone();
    let target = name.clone();
    tokio::task::spawn_blocking(move || tokens.revoke(&target))
        .await
        .map_err(|e| ApiError::Internal(e.into()))?
        .map_err(token_error)?;
    Ok(Json(json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name, "kind": "tokens"}}))
        .into_response())
}
