//! The core group's one resource: `Event`, at `/api/v1/events`, so `kubectl describe`
//! shows an object's history (it asks `/api/v1/events` with `involvedObject` field
//! selectors). Events are cluster-scoped like every hive object; the namespaced path
//! that namespaced clients use serves the same events.

use crate::auth::{Principal, Verb};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use hive_api::event::EVENT_KIND;
use serde_json::{json, Value};

use super::error::ApiResult;
use super::routes::{self, ApiRouter};
use super::{discovery, resources, AppState};
use crate::store::Subresource;

/// The routes of `/api` and `/api/v1`: reads for any role, changes for operators.
pub fn router() -> ApiRouter {
    ApiRouter::new()
        .route("/api", routes::get(Verb::Read, versions))
        .route("/api/v1", routes::get(Verb::Read, resource_list))
        .route("/api/v1/events", routes::get(Verb::Read, list).post(Verb::Write, create))
        .route(
            "/api/v1/events/{name}",
            routes::get(Verb::Read, read)
                .put(Verb::Write, replace)
                .patch(Verb::Write, patch)
                .delete(Verb::Write, delete),
        )
        .route("/api/v1/namespaces/{namespace}/events", routes::get(Verb::Read, list_namespaced))
}

/// `GET /api`: aggregated discovery of the core group's `v1` when asked for (kubectl
/// 1.32 asks it first, like `/apis`), else the legacy `APIVersions`.
async fn versions(headers: HeaderMap) -> Response {
    if discovery::wants_aggregated(&headers) {
        return discovery::aggregated(vec![discovery::group_discovery("", "v1", &core_resources())]);
    }
    discovery::vary_accept(
        Json(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
        }))
        .into_response(),
    )
}

/// The core group's resources: events only.
fn core_resources() -> Vec<discovery::Resource> {
    vec![discovery::Resource {
        plural: "events",
        singular: "event",
        kind: "Event",
        short_names: &["ev"],
        categories: &[],
        verbs: discovery::VERBS,
        subresources: Vec::new(),
    }]
}

async fn resource_list() -> Json<Value> {
    Json(discovery::legacy_resource_list("v1", &core_resources()))
}

async fn list(State(state): State<AppState>, headers: HeaderMap, uri: Uri) -> ApiResult<Response> {
    resources::list(state, &EVENT_KIND, headers, uri).await
}

async fn list_namespaced(
    State(state): State<AppState>,
    Path(_namespace): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> ApiResult<Response> {
    resources::list(state, &EVENT_KIND, headers, uri).await
}

async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    resources::create(state, &EVENT_KIND, &principal, headers, uri, body).await
}

async fn read(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> ApiResult<Response> {
    resources::get(state, &EVENT_KIND, name, headers, uri).await
}

async fn replace(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    resources::replace(state, &EVENT_KIND, &principal, name, Subresource::Main, headers, uri, body).await
}

async fn patch(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    resources::patch(state, &EVENT_KIND, &principal, name, Subresource::Main, headers, uri, body).await
}

async fn delete(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    resources::delete(state, &EVENT_KIND, name, headers, uri, body).await
}
