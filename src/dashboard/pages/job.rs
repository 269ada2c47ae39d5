//! `/jobs/{name}`: one Job — its card (roll-up, times, message, cancel) and its DAG (one
//! lane per agent, every edge as the spec has it, AfterAny edges marked) live, the log
//! pane of the node that runs (or one clicked), and its Events; a 404 page when the API
//! has no such Job.

use axum::extract::Path;
use axum::response::Response;

use super::section;
use crate::dashboard::{layout, Existence, Viewer};

/// `GET /jobs/{name}`.
pub async fn page(viewer: Viewer, Path(name): Path<String>) -> Response {
    let path = format!("/apis/hive.dev/v1/jobs/{}", super::segment(&name));
    if viewer.exists(&path).await == Existence::Missing {
        return layout::not_found(&viewer, "/jobs", "Job", &name, ("/jobs", "← All Jobs"));
    }
    let title = format!("Job {name}");
    layout::page(&viewer, "job", "/jobs", &title, |m| {
        m.open("div", &[("id", "job"), ("data-job", &name)]);
        m.open("div", &[("id", "job-card")]).elem("p", &[("class", "muted")], "Loading…").close("div");
        m.open("div", &[("class", "jobs-layout")]);
        m.open("section", &[("class", "card jobs-main")]);
        m.elem("h2", &[], "Graph");
        m.elem(
            "p",
            &[("class", "muted small")],
            "One lane per agent; arrows are the Job's edges, dashed ones AfterAny (run whatever the \
             dependency's outcome). Click a node for its log.",
        );
        m.open("div", &[("id", "job-dag")]).elem("p", &[("class", "muted")], "Loading…").close("div");
        m.close("section");
        super::log_panel(m, "Log ");
        m.close("div");
        section(m, "Events", "job-events", "card");
        m.close("div");
    })
}
