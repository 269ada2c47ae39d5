//! `/`: the overview — counts by state, what is failing, the queue, pending approvals,
//! fleet readiness and provider states, and the most recent Events.

use axum::response::Response;

use super::section;
use crate::dashboard::{layout, Viewer};

/// `GET /`.
pub async fn page(viewer: Viewer) -> Response {
    layout::page(&viewer, "overview", "/", "Overview", |m| {
        m.open("div", &[("class", "grid")]);
        section(m, "Agents", "ov-agents", "card");
        section(m, "Failing or crash-looping", "ov-failing", "card");
        section(m, "Jobs running and queued", "ov-jobs", "card");
        section(m, "Pending approvals", "ov-approvals", "card");
        section(m, "Fleet", "ov-fleet", "card");
        section(m, "Providers", "ov-providers", "card");
        m.close("div");
        section(m, "Recent events", "ov-events", "card wide");
    })
}
