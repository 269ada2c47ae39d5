//! `/jobs/{name}`: one Job — its card (roll-up, node chain, times, cancel) live, and
//! its Events; a 404 page when the API has no such Job.

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
        section(m, "Events", "job-events", "card");
        m.close("div");
    })
}
