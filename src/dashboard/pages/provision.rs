//! `/provision` (operators): provider readiness, the ConfigureProvider form (admin; the
//! key field is write-only), offer search and selection, Provision under a command id
//! minted when the page is rendered (a double submit or a retry names the same
//! FleetCommand, so it runs once), Kill with a confirmation, and recent commands.
//!
//! Every form is `method="post"` and its submit button is rendered `disabled` until the
//! JavaScript has attached its handler: a native submit (script not loaded yet, or
//! blocked) would otherwise put the ConfigureProvider key into the URL; as a POST to this
//! GET-only page it is refused (405) with the fields in the body, never in a URL.

use axum::response::Response;
use ring::rand::{SecureRandom, SystemRandom};

use super::section;
use crate::dashboard::html::Markup;
use crate::dashboard::{layout, Viewer};

/// A fresh FleetCommand name such as `provision-3f9a0c1d2e`: a DNS label, random enough
/// that two rendered forms never share one.
pub fn command_id(verb: &str) -> String {
    let mut bytes = [0u8; 5];
    if SystemRandom::new().fill(&mut bytes).is_err() {
        // Never expected; the time still makes a distinct id.
        let nanos = crate::host::now().timestamp_nanos_opt().unwrap_or_default();
        bytes.copy_from_slice(&nanos.to_le_bytes()[..5]);
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{verb}-{hex}")
}

fn labelled_input(m: &mut Markup, label: &str, attrs: &[(&'static str, &str)]) {
    m.open("label", &[]).text(label).void("input", attrs).close("label");
}

/// `GET /provision`.
pub async fn page(viewer: Viewer) -> Response {
    layout::page(&viewer, "provision", "/provision", "Provision", |m| {
        if !viewer.can_write() {
            m.elem(
                "p",
                &[("class", "notice")],
                "Read-only: provisioning and killing nodes needs an operator token.",
            );
        }
        m.open("div", &[("class", "grid two")]);
        section(m, "Providers", "providers", "card");
        if viewer.can_admin() {
            m.open("section", &[("class", "card")]);
            m.elem("h2", &[], "Configure a provider");
            m.open(
                "form",
                &[("id", "configure-form"), ("class", "stack"), ("method", "post"), ("autocomplete", "off")],
            );
            m.open("label", &[])
                .text("Provider ")
                .open("select", &[("name", "provider"), ("id", "configure-provider"), ("required", "")])
                .close("select")
                .close("label");
            labelled_input(
                m,
                "API key ",
                &[
                    ("name", "apiKey"),
                    ("type", "password"),
                    ("autocomplete", "new-password"),
                    ("placeholder", "write-only: a stored key is never shown"),
                ],
            );
            labelled_input(
                m,
                "Base URL (optional) ",
                &[("name", "baseUrl"), ("type", "url"), ("placeholder", "https://console.vast.ai")],
            );
            m.elem("button", &[("type", "submit"), ("class", "primary"), ("disabled", "")], "Configure");
            m.elem("p", &[("id", "configure-result"), ("class", "result"), ("role", "status")], "");
            m.close("form").close("section");
        }
        m.close("div");
        if viewer.can_write() {
            m.open("section", &[("class", "card")]);
            m.elem("h2", &[], "Offers");
            m.open("form", &[("id", "offers-form"), ("class", "inline"), ("method", "post")]);
            m.open("label", &[])
                .text("Provider ")
                .open("select", &[("name", "provider"), ("id", "offers-provider")])
                .close("select")
                .close("label");
            labelled_input(
                m,
                "GPU ",
                &[("name", "gpu"), ("type", "text"), ("placeholder", "RTX 4090"), ("size", "12")],
            );
            labelled_input(
                m,
                "GPUs ",
                &[("name", "numGpus"), ("type", "number"), ("min", "1"), ("size", "3")],
            );
            labelled_input(
                m,
                "Max $/h ",
                &[("name", "maxPrice"), ("type", "number"), ("step", "0.01"), ("min", "0"), ("size", "5")],
            );
            labelled_input(
                m,
                "Min GPU RAM (GB) ",
                &[("name", "minGpuRamGb"), ("type", "number"), ("min", "1")],
            );
            labelled_input(
                m,
                "Countries ",
                &[("name", "geo"), ("type", "text"), ("placeholder", "US,DE"), ("size", "8")],
            );
            m.elem("button", &[("type", "submit"), ("disabled", "")], "Search offers");
            m.close("form");
            m.open("div", &[("id", "offers")])
                .elem(
                    "p",
                    &[("class", "muted")],
                    "Search to list offers; providers without offers (process) need none.",
                )
                .close("div");
            m.close("section");

            m.open("div", &[("class", "grid two")]);
            let provision_id = command_id("provision");
            m.open("section", &[("class", "card")]);
            m.elem("h2", &[], "Provision");
            m.open(
                "form",
                &[
                    ("id", "provision-form"),
                    ("class", "stack"),
                    ("data-command", &provision_id),
                    ("method", "post"),
                ],
            );
            m.open("label", &[])
                .text("Provider ")
                .open("select", &[("name", "provider"), ("id", "provision-provider"), ("required", "")])
                .close("select")
                .close("label");
            labelled_input(
                m,
                "Count ",
                &[("name", "count"), ("type", "number"), ("min", "1"), ("value", "1"), ("required", "")],
            );
            m.open("p", &[("class", "muted small")])
                .text("Command id ")
                .elem("code", &[("id", "provision-command")], &provision_id)
                .text(" — submitting twice provisions once.")
                .close("p");
            m.elem("p", &[("id", "provision-selected"), ("class", "muted small")], "No offers selected.");
            m.elem("button", &[("type", "submit"), ("class", "primary"), ("disabled", "")], "Provision");
            m.elem("p", &[("id", "provision-result"), ("class", "result"), ("role", "status")], "");
            m.close("form").close("section");

            let kill_id = command_id("kill");
            m.open("section", &[("class", "card")]);
            m.elem("h2", &[], "Kill a node");
            m.open(
                "form",
                &[("id", "kill-form"), ("class", "stack"), ("method", "post"), ("data-command", &kill_id)],
            );
            m.open("label", &[])
                .text("Node ")
                .open("select", &[("name", "node"), ("id", "kill-node"), ("required", "")])
                .close("select")
                .close("label");
            m.elem("button", &[("type", "submit"), ("class", "danger"), ("disabled", "")], "Kill…");
            m.open("div", &[("id", "kill-confirm"), ("class", "confirm"), ("hidden", "")]);
            m.elem("p", &[("id", "kill-question")], "");
            m.elem("button", &[("type", "button"), ("id", "kill-yes"), ("class", "danger")], "Yes, kill it");
            m.elem("button", &[("type", "button"), ("id", "kill-no")], "Cancel");
            m.close("div");
            m.elem("p", &[("id", "kill-result"), ("class", "result"), ("role", "status")], "");
            m.close("form").close("section");
            m.close("div");
        }
        m.open("section", &[("class", "card")]);
        m.elem("h2", &[], "Recent commands");
        m.open("table", &[("class", "rows")]);
        m.open("thead", &[]).open("tr", &[]);
        for col in ["Command", "Action", "Phase", "Nodes", "Error", "Started", "Finished"] {
            m.elem("th", &[], col);
        }
        m.close("tr").close("thead");
        m.open("tbody", &[("id", "commands-rows")]).close("tbody");
        m.close("table");
        m.elem(
            "p",
            &[("id", "commands-empty"), ("class", "empty"), ("hidden", "")],
            "No fleet commands yet.",
        );
        m.close("section");
    })
}
