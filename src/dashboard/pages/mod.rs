//! One file per dashboard page: each renders its shell (headings, role-gated controls,
//! forms, the containers the JavaScript fills from the API).

pub mod agents;
pub mod approvals;
pub mod events;
pub mod fleet;
pub mod job;
pub mod jobs;
pub mod login;
pub mod node;
pub mod overview;
pub mod provision;
pub mod status;

use super::html::Markup;

/// The value of `name` in an `application/x-www-form-urlencoded` body.
pub(crate) fn form_field(body: &[u8], name: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    text.split('&').filter_map(|pair| pair.split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| {
        let spaced = v.replace('+', " ");
        percent_encoding::percent_decode_str(&spaced).decode_utf8_lossy().into_owned()
    })
}

/// A titled section with an id the JavaScript fills, and a placeholder until it does.
pub(crate) fn section(m: &mut Markup, title: &str, id: &'static str, class: &'static str) {
    m.open("section", &[("class", class)]);
    m.elem("h2", &[], title);
    m.open("div", &[("id", id)]).elem("p", &[("class", "muted")], "Loading…").close("div");
    m.close("section");
}

/// The log pane beside a Job's nodes (`assets` fill `#job-log` with the followed or
/// pinned node's log), titled `title`.
pub(crate) fn log_panel(m: &mut Markup, title: &str) {
    m.open("aside", &[("class", "log-panel card")]);
    m.open("h2", &[])
        .text(title)
        .elem("span", &[("id", "job-log-title"), ("class", "muted small")], "")
        .close("h2");
    m.elem(
        "p",
        &[("id", "job-log-hint"), ("class", "muted")],
        "Follows the running node; click a node to pin it.",
    );
    m.elem("pre", &[("id", "job-log"), ("class", "log")], "");
    m.close("aside");
}

/// `name` as one path segment of an API URL: percent-encoded, so a name that is not a
/// DNS label (a hand-typed URL) asks for that name and nothing else.
pub(crate) fn segment(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string()
}
