//! `/nodes/{name}`: one fleet Node — its phase and conditions, what it reported about
//! itself, the agents placed on it, its telemetry (the Fleet page's explorer, for this
//! node alone) and its Events; a 404 page when the API has no such node.

use axum::extract::Path;
use axum::response::Response;

use super::section;
use crate::dashboard::{layout, Existence, Viewer};

/// `GET /nodes/{name}`.
pub async fn page(viewer: Viewer, Path(name): Path<String>) -> Response {
    let path = format!("/apis/hive.dev/v1/nodes/{}", super::segment(&name));
    if viewer.exists(&path).await == Existence::Missing {
        return layout::not_found(&viewer, "/fleet", "Node", &name, ("/fleet", "← The fleet"));
    }
    let title = format!("Node {name}");
    layout::page(&viewer, "node", "/fleet", &title, |m| {
        m.open("div", &[("id", "node"), ("data-node", &name)]);
        m.open("div", &[("class", "summary"), ("id", "node-summary")])
            .elem("p", &[("class", "muted")], "Loading…")
            .close("div");
        m.open("div", &[("class", "grid two")]);
        section(m, "Conditions", "node-conditions", "card");
        section(m, "Reported", "node-facts", "card");
        m.close("div");
        section(m, "Agents", "node-agents", "card");
        m.open("section", &[("class", "card"), ("id", "explorer")]);
        m.elem("h2", &[], "Telemetry");
        // The explorer follows the node chosen here; this page offers only its own.
        m.open("select", &[("id", "explorer-node"), ("hidden", "")])
            .elem("option", &[("value", &name)], &name)
            .close("select");
        m.elem("p", &[("id", "explorer-status"), ("class", "muted")], "Loading…");
        m.open("div", &[("class", "explorer-body")]);
        m.open("ul", &[("id", "explorer-channels"), ("class", "channels")]).close("ul");
        m.open("div", &[("id", "explorer-chart"), ("class", "chart big")]).close("div");
        m.close("div");
        m.close("section");
        section(m, "Events", "node-events", "card");
        m.close("div");
    })
}
