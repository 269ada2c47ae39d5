//! `/jobs`: the queue as cards (roll-up, template, agents, node chain, links, times,
//! reason, cancel) and a build-log panel following the running node.

use axum::response::Response;

use crate::dashboard::{layout, Viewer};

/// `GET /jobs`.
pub async fn page(viewer: Viewer) -> Response {
    layout::page(&viewer, "jobs", "/jobs", "Jobs", |m| {
        m.open("div", &[("class", "jobs-layout")]);
        m.open("div", &[("class", "jobs-main")]);
        m.elem("h2", &[], "Active");
        m.open("div", &[("id", "jobs-active"), ("class", "cards")]).close("div");
        m.elem(
            "p",
            &[("id", "jobs-active-empty"), ("class", "empty"), ("hidden", "")],
            "Nothing queued or running.",
        );
        m.elem("h2", &[], "History");
        m.open("div", &[("id", "jobs-history"), ("class", "cards")]).close("div");
        m.elem(
            "p",
            &[("id", "jobs-history-empty"), ("class", "empty"), ("hidden", "")],
            "No finished Jobs kept.",
        );
        m.close("div");
        m.open("aside", &[("class", "log-panel card")]);
        m.open("h2", &[])
            .text("Build log ")
            .elem("span", &[("id", "job-log-title"), ("class", "muted small")], "")
            .close("h2");
        m.elem(
            "p",
            &[("id", "job-log-hint"), ("class", "muted")],
            "Follows the running node; click a node to pin it.",
        );
        m.elem("pre", &[("id", "job-log"), ("class", "log")], "");
        m.close("aside");
        m.close("div");
    })
}
