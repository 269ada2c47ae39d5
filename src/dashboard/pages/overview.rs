//! `/`: the overview — counts by state, what is failing, the queue, pending approvals,
//! fleet readiness and provider states.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;

use super::section;
use crate::dashboard::{layout, viewer, Sessions};
use crate::server::AppState;

/// `GET /`.
pub async fn page(
    State(state): State<AppState>,
    Extension(sessions): Extension<Sessions>,
    headers: HeaderMap,
) -> Response {
    let viewer = match viewer(&state, &sessions, &headers) {
        Ok(v) => v,
        Err(redirect) => return redirect.into_response(),
    };
    layout::page(&viewer, "overview", "/", "Overview", |m| {
        m.open("div", &[("class", "grid")]);
        section(m, "Agents", "ov-agents", "card");
        section(m, "Failing or crash-looping", "ov-failing", "card");
        section(m, "Jobs running and queued", "ov-jobs", "card");
        section(m, "Pending approvals", "ov-approvals", "card");
        section(m, "Fleet", "ov-fleet", "card");
        section(m, "Providers", "ov-providers", "card");
        m.close("div");
    })
}
