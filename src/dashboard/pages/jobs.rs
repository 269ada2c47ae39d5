//! `/jobs`: the queue as cards (roll-up, template, agents, node chain, links, times,
//! reason, cancel) and a build-log panel following the running node; a filter by
//! template, agent and phase and pages of the history, both in the page's URL
//! (`/jobs?template=Restart&agent=alpha&phase=Failed&page=2`) so a view can be linked.

use axum::response::Response;

use crate::dashboard::{layout, Viewer};

/// `GET /jobs`.
pub async fn page(viewer: Viewer) -> Response {
    layout::page(&viewer, "jobs", "/jobs", "Jobs", |m| {
        m.open("div", &[("class", "jobs-layout")]);
        m.open("div", &[("class", "jobs-main")]);
        filter(m);
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
        m.open("nav", &[("id", "jobs-pages"), ("class", "pager"), ("aria-label", "History pages")])
            .close("nav");
        m.close("div");
        super::log_panel(m, "Build log ");
        m.close("div");
    })
}

/// The filter form. `assets/jobs_filter.js` fills the choices from the Jobs it sees,
/// reads and writes the URL's query, and hides what does not match; without
/// JavaScript the form still submits the same query.
fn filter(m: &mut crate::dashboard::html::Markup) {
    m.open("form", &[("id", "jobs-filter"), ("class", "filters"), ("method", "get"), ("action", "/jobs")]);
    let choices = [
        ("template", "jobs-filter-template", "Template"),
        ("agent", "jobs-filter-agent", "Agent"),
        ("phase", "jobs-filter-phase", "Phase"),
    ];
    for (name, id, label) in choices {
        m.open("label", &[]).text(label).text(" ");
        m.open("select", &[("name", name), ("id", id)]);
        m.elem("option", &[("value", "")], "any");
        m.close("select").close("label");
    }
    m.elem("span", &[("id", "jobs-filter-count"), ("class", "muted small"), ("role", "status")], "");
    m.close("form");
}
