//! `/events`: every core Event, live, newest first, with a filter by the involved
//! object's kind and name, type, reason and age, kept in the page's URL
//! (`/events?kind=Agent&object=crashy&type=Warning&reason=BackOff&since=1h`) so a view
//! can be linked. `assets/events.js` fills it from the one watched list of Events.

use axum::response::Response;

use crate::dashboard::html::Markup;
use crate::dashboard::{layout, Viewer};

/// The ages the `since` filter offers: (query value, label). The first is no bound.
pub const SINCE: [(&str, &str); 6] = [
    ("", "any time"),
    ("5m", "5 minutes"),
    ("15m", "15 minutes"),
    ("1h", "1 hour"),
    ("6h", "6 hours"),
    ("24h", "24 hours"),
];

/// `GET /events`.
pub async fn page(viewer: Viewer) -> Response {
    layout::page(&viewer, "events", "/events", "Events", |m| {
        filter(m);
        m.open("div", &[("id", "events-list")]).elem("p", &[("class", "muted")], "Loading…").close("div");
    })
}

/// The filter form. The script fills the kind and reason choices from the Events it
/// sees and reads and writes the URL's query; without JavaScript the form still submits
/// the same query.
fn filter(m: &mut Markup) {
    m.open(
        "form",
        &[("id", "events-filter"), ("class", "filters"), ("method", "get"), ("action", "/events")],
    );
    select(m, "Kind", "kind", "events-filter-kind", &[("", "any")]);
    m.open("label", &[]).text("Object ");
    m.void(
        "input",
        &[
            ("type", "search"),
            ("name", "object"),
            ("id", "events-filter-object"),
            ("placeholder", "name, or kind/name"),
            ("autocomplete", "off"),
        ],
    );
    m.close("label");
    select(
        m,
        "Type",
        "type",
        "events-filter-type",
        &[("", "any"), ("Normal", "Normal"), ("Warning", "Warning")],
    );
    select(m, "Reason", "reason", "events-filter-reason", &[("", "any")]);
    select(m, "Since", "since", "events-filter-since", &SINCE);
    m.elem("span", &[("id", "events-filter-count"), ("class", "muted small"), ("role", "status")], "");
    m.close("form");
}

fn select(m: &mut Markup, label: &str, name: &'static str, id: &'static str, options: &[(&str, &str)]) {
    m.open("label", &[]).text(label).text(" ");
    m.open("select", &[("name", name), ("id", id)]);
    for (value, text) in options {
        m.elem("option", &[("value", value)], text);
    }
    m.close("select").close("label");
}
