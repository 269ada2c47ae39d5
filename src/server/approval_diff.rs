//! `GET /hive/v1/approvals/{name}/diff`: what an `ApplyCommit` or `MergeConfigPr`
//! approval would change — the commits and the per-file stat from the target agent's
//! applied commit to the requested one (the reviewed commit, or the pull request's head
//! when none was given). Read-only; any role. The config repository is fetched into the
//! daemon's mirror first, so the answer is current (concurrent askers share a fetch:
//! `meta::resolve`); a failure names the agent and its repository, never a path of the
//! daemon's.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hive_api::agent::Agent;
use hive_api::approval::{Approval, ApprovalKind};
use serde_json::json;

use super::error::{ApiError, ApiResult};
use super::routes::{self, ApiRouter};
use super::AppState;
use crate::auth::Verb;

/// The routes.
pub fn router() -> ApiRouter {
    ApiRouter::new().route("/hive/v1/approvals/{name}/diff", routes::get(Verb::Read, diff))
}

fn decode<T: serde::de::DeserializeOwned>(value: &serde_json::Value) -> ApiResult<T> {
    serde_json::from_value(value.clone()).map_err(|e| ApiError::Internal(e.into()))
}

async fn diff(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Response> {
    let jobs = state.job_service("this server runs no engine, so it has no config mirrors")?;
    let object = state
        .store
        .get("approvals", &name)
        .ok_or_else(|| ApiError::NotFound { plural: "approvals".into(), name: name.clone() })?;
    let approval: Approval = decode(&object.value())?;
    let payload = &approval.spec.payload;
    let head = match approval.spec.kind {
        ApprovalKind::ApplyCommit => payload.commit.clone(),
        ApprovalKind::MergeConfigPr => {
            payload.commit.clone().or_else(|| payload.pull_request.as_deref().map(crate::executor::pr_ref))
        }
        other => {
            return Err(ApiError::BadRequest(format!(
                "approval {name:?} is a {} approval: only ApplyCommit and MergeConfigPr change a config \
                 repository",
                other.as_str()
            )))
        }
    };
    let head = head.ok_or_else(|| ApiError::BadRequest(format!("approval {name:?} names no commit")))?;
    let target = approval.spec.target.clone().unwrap_or_default();
    let agent_object = state
        .store
        .get("agents", &target)
        .ok_or_else(|| ApiError::NotFound { plural: "agents".into(), name: target.clone() })?;
    let agent: Agent = decode(&agent_object.value())?;
    let Some(base) = agent.status.applied_rev.clone() else {
        return Ok(Json(json!({"approval": name, "agent": target, "head": head, "base": null,
            "message": format!("agent {target:?} has no applied commit yet: everything would be new")}))
        .into_response());
    };
    let (head_sha, summary) = jobs.diff(agent, base.clone(), head).await.map_err(|e| match e {
        crate::jobs::service::Error::Compare(message) => {
            ApiError::Conflict { plural: "approvals".into(), name: name.clone(), message }
        }
        other => super::jobs::job_error(other),
    })?;
    let mut body = serde_json::to_value(&summary).map_err(|e| ApiError::Internal(e.into()))?;
    body["approval"] = json!(name);
    body["agent"] = json!(target);
    body["base"] = json!(base);
    body["head"] = json!(head_sha);
    Ok(Json(body).into_response())
}
