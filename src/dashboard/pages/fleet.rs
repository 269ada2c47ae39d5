//! `/fleet` (read-only, Myelin's root view): every Node with phase, provider, provider
//! reference, runtime facts, errors and orphans flagged; live telemetry charts; and an
//! explorer over one node's telemetry channels.

use axum::response::Response;

use crate::dashboard::{layout, Viewer};

/// `GET /fleet`.
pub async fn page(viewer: Viewer) -> Response {
    layout::page(&viewer, "fleet", "/fleet", "Fleet", |m| {
        m.elem("p", &[("id", "fleet-summary"), ("class", "muted")], "");
        m.open("table", &[("class", "rows"), ("id", "nodes-table")]);
        m.open("thead", &[]).open("tr", &[]);
        for col in
            ["Node", "Phase", "Provider", "Provider ref", "Runtime", "CPU", "Memory", "GPU", "Error", "Age"]
        {
            m.elem("th", &[], col);
        }
        m.close("tr").close("thead");
        m.open("tbody", &[("id", "nodes-rows")]).close("tbody");
        m.close("table");
        m.elem(
            "p",
            &[("id", "nodes-empty"), ("class", "empty"), ("hidden", "")],
            "No nodes. Operators provision them on the Provision page.",
        );
        m.open("section", &[("class", "card"), ("id", "explorer")]);
        m.elem("h2", &[], "Telemetry explorer");
        m.open("div", &[("class", "toolbar")]);
        m.open("label", &[])
            .text("Node ")
            .open("select", &[("id", "explorer-node")])
            .close("select")
            .close("label");
        m.close("div");
        m.elem("p", &[("id", "explorer-status"), ("class", "muted")], "Pick a node to list its channels.");
        m.open("div", &[("class", "explorer-body")]);
        m.open("ul", &[("id", "explorer-channels"), ("class", "channels")]).close("ul");
        m.open("div", &[("id", "explorer-chart"), ("class", "chart big")]).close("div");
        m.close("div");
        m.close("section");
    })
}
