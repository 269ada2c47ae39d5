//! `/agents` (every agent: its status word, wanted vs observed, applied rev, conditions,
//! current Job, its node) and `/agents/{name}` (where it stands, its last exit, where it
//! runs, conditions, generations, live output, power buttons, its Jobs
//! and Events, its spec as YAML, Kill and Delete with a confirmation; a 404 page when
//! the API has no such agent).

use axum::extract::Path;
use axum::response::Response;

use super::section;
use crate::dashboard::html::Markup;
use crate::dashboard::{layout, Existence, Viewer};

/// The power verbs the agent page offers, as (Job template, button label, hint).
const POWER: [(&str, &str, &str); 4] = [
    ("Start", "Start", "wanted Up, then start"),
    ("Stop", "Stop", "wanted Down, then a graceful stop"),
    ("Restart", "Restart", "stop, then start"),
    ("Rebuild", "Rebuild", "fetch the config rev, rebuild, swap"),
];

/// `GET /agents`.
pub async fn list(viewer: Viewer) -> Response {
    layout::page(&viewer, "agents", "/agents", "Agents", |m| {
        m.open("div", &[("class", "toolbar")]);
        m.void(
            "input",
            &[("id", "filter"), ("type", "search"), ("placeholder", "Filter by name or status…")],
        );
        m.elem("span", &[("id", "agents-count"), ("class", "muted")], "");
        m.close("div");
        m.open("table", &[("class", "rows"), ("id", "agents-table")]);
        m.open("thead", &[]).open("tr", &[]);
        for col in
            ["Agent", "Status", "Wanted", "Observed", "Applied rev", "Conditions", "Job", "Node", "Age"]
        {
            m.elem("th", &[], col);
        }
        m.close("tr").close("thead");
        m.open("tbody", &[("id", "agents-rows")]).close("tbody");
        m.close("table");
        m.elem(
            "p",
            &[("id", "agents-empty"), ("class", "empty"), ("hidden", "")],
            "No agents yet. Apply one with kubectl apply -f manifests/agent.yaml.",
        );
    })
}

/// `GET /agents/{name}`.
pub async fn one(viewer: Viewer, Path(name): Path<String>) -> Response {
    let path = format!("/apis/hive.dev/v1/agents/{}", super::segment(&name));
    if viewer.exists(&path).await == Existence::Missing {
        return layout::not_found(&viewer, "/agents", "Agent", &name, ("/agents", "← All agents"));
    }
    let title = format!("Agent {name}");
    layout::page(&viewer, "agent", "/agents", &title, |m| {
        m.open("div", &[("id", "agent"), ("data-agent", &name)]);
        m.open("div", &[("class", "summary"), ("id", "agent-summary")])
            .elem("p", &[("class", "muted")], "Loading…")
            .close("div");
        // How it last ended, right under where it stands (filled, and shown, when it has
        // ended on its own): the why of a failing agent, above the fold.
        m.open("div", &[("id", "agent-last-exit"), ("class", "last-exit"), ("hidden", "")]).close("div");
        if viewer.can_write() {
            m.open("div", &[("class", "actions"), ("id", "power")]);
            for (template, label, hint) in POWER {
                m.elem("button", &[("type", "button"), ("data-template", template), ("title", hint)], label);
            }
            m.void(
                "input",
                &[("id", "power-reason"), ("type", "text"), ("placeholder", "Reason (optional)")],
            );
            m.close("div");
            m.open("div", &[("id", "power-job"), ("class", "job-slot")]).close("div");
            danger(m);
        }
        m.open("div", &[("class", "grid two")]);
        section(m, "Conditions", "agent-conditions", "card");
        section(m, "Generations", "agent-generations", "card");
        m.close("div");
        m.open("section", &[("class", "card")]);
        m.open("h2", &[])
            .text("Output ")
            .elem("span", &[("class", "muted small"), ("id", "agent-log-state")], "")
            .close("h2");
        m.elem("pre", &[("id", "agent-log"), ("class", "log")], "");
        m.close("section");
        section(m, "Jobs", "agent-jobs", "card");
        section(m, "Events", "agent-events", "card");
        m.open("section", &[("class", "card")]);
        m.elem("h2", &[], "Spec (YAML)");
        m.elem("pre", &[("id", "agent-yaml"), ("class", "yaml")], "Loading…");
        m.close("section");
        m.close("div");
    })
}

/// Kill and Delete, each behind one confirmation that names what it will do. Buttons
/// start disabled; the script enables them once it knows the agent exists.
fn danger(m: &mut Markup) {
    m.open("div", &[("class", "actions"), ("id", "agent-danger")]);
    m.elem(
        "button",
        &[("type", "button"), ("id", "agent-kill"), ("class", "danger"), ("disabled", "")],
        "Kill…",
    );
    m.elem(
        "button",
        &[("type", "button"), ("id", "agent-delete"), ("class", "danger"), ("disabled", "")],
        "Delete…",
    );
    m.open("div", &[("id", "agent-confirm"), ("class", "confirm"), ("hidden", "")]);
    m.elem("p", &[("id", "agent-confirm-question")], "");
    m.elem("button", &[("type", "button"), ("id", "agent-confirm-yes"), ("class", "danger")], "Yes");
    m.elem("button", &[("type", "button"), ("id", "agent-confirm-no")], "Cancel");
    m.close("div");
    m.elem("p", &[("id", "agent-danger-result"), ("class", "result"), ("role", "status")], "");
    m.close("div");
}
