//! `/status`: the daemon's key numbers, live — read from the API's `/metrics` with the
//! signed-in session every few seconds and parsed in the browser (`assets/metrics.js`).
//! A route of its own, so the API's `/metrics` stays the scrape target.

use axum::response::Response;

use super::section;
use crate::dashboard::{layout, Viewer};

/// `GET /status`.
pub async fn page(viewer: Viewer) -> Response {
    layout::page(&viewer, "status", "/status", "Status", |m| {
        m.open("p", &[("class", "muted small")])
            .text("The daemon's own metrics, read from ")
            .elem("a", &[("href", "/metrics")], "/metrics")
            .text(" every 5 s; rates and latencies are over the last interval. ")
            .elem("span", &[("id", "metrics-state")], "")
            .close("p");
        m.open("div", &[("class", "grid metrics-grid")]);
        section(m, "API", "mx-api", "card");
        section(m, "Store", "mx-store", "card");
        section(m, "Scheduler", "mx-scheduler", "card");
        section(m, "Fleet and agents", "mx-fleet", "card");
        m.close("div");
    })
}
