//! The page shell every dashboard page shares: head (CSP-friendly: only our own
//! assets), the navigation, who is signed in, the live-stream indicator and sign-out.

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;

use super::html::Markup;
use super::Viewer;

/// The navigation entries, in order: (path, label).
const NAV: [(&str, &str); 8] = [
    ("/", "Overview"),
    ("/agents", "Agents"),
    ("/jobs", "Jobs"),
    ("/approvals", "Approvals"),
    ("/events", "Events"),
    ("/fleet", "Fleet"),
    ("/provision", "Provision"),
    ("/status", "Status"),
];

/// Our scripts, in the order they run.
const SCRIPTS: [&str; 12] = [
    "/assets/app.js",
    "/assets/logs.js",
    "/assets/charts.js",
    "/assets/yaml.js",
    "/assets/tables.js",
    "/assets/events.js",
    "/assets/detail.js",
    "/assets/pages.js",
    "/assets/dag.js",
    "/assets/fleet.js",
    "/assets/jobs_filter.js",
    "/assets/metrics.js",
];

/// Security headers for every dashboard HTML response: scripts, styles and connections
/// only from this origin, never framed, never cached.
pub fn html_response(body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    response
}

/// `<head>` and the opening of `<body>`: shared by the signed-in shell and `/login`.
pub fn head(m: &mut Markup, title: &str, csrf: Option<&str>) {
    m.buf_doctype();
    m.open("html", &[("lang", "en")]).open("head", &[]);
    m.void("meta", &[("charset", "utf-8")]);
    m.void("meta", &[("name", "viewport"), ("content", "width=device-width, initial-scale=1")]);
    if let Some(csrf) = csrf {
        m.void("meta", &[("name", "csrf-token"), ("content", csrf)]);
    }
    m.elem("title", &[], &format!("{title} · hive"));
    m.void("link", &[("rel", "stylesheet"), ("href", "/assets/app.css")]);
    m.void("link", &[("rel", "stylesheet"), ("href", "/assets/views.css")]);
    m.void("link", &[("rel", "stylesheet"), ("href", "/assets/theme.css")]);
    m.close("head");
}

/// A whole signed-in page: `page` names the page for the JavaScript, `active` the
/// navigation entry, `body` writes the page's own content into `<main>`.
pub fn page(
    viewer: &Viewer,
    page: &str,
    active: &str,
    title: &str,
    body: impl FnOnce(&mut Markup),
) -> Response {
    let principal = &viewer.session.principal;
    let mut m = Markup::new();
    head(&mut m, title, Some(&viewer.session.csrf));
    let role = principal.role.as_str();
    m.open(
        "body",
        &[
            ("data-page", page),
            ("data-role", role),
            ("data-can-write", if viewer.can_write() { "true" } else { "false" }),
            ("data-can-admin", if viewer.can_admin() { "true" } else { "false" }),
        ],
    );
    m.open("header", &[("class", "top")]);
    m.open("a", &[("class", "brand"), ("href", "/")]).text("⬡ hive").close("a");
    m.open("nav", &[]);
    for (href, label) in NAV {
        let current = if href == active { "page" } else { "" };
        m.open("a", &[("href", href), if current.is_empty() { ("", "") } else { ("aria-current", current) }])
            .text(label)
            .close("a");
    }
    m.close("nav");
    m.open("div", &[("class", "who")]);
    m.elem("span", &[("id", "live"), ("class", "live down"), ("title", "live updates")], "○ connecting");
    m.open("span", &[("class", "user")])
        .text(&principal.name)
        .text(" ")
        .elem("span", &[("class", "role")], role)
        .close("span");
    m.open("form", &[("method", "post"), ("action", "/logout")]);
    m.void("input", &[("type", "hidden"), ("name", "csrf"), ("value", &viewer.session.csrf)]);
    m.elem("button", &[("type", "submit"), ("class", "link")], "Sign out");
    m.close("form").close("div").close("header");
    m.open("main", &[]);
    m.elem("h1", &[], title);
    m.open("noscript", &[])
        .elem("p", &[("class", "error")], "The dashboard needs JavaScript for its live views.")
        .close("noscript");
    body(&mut m);
    m.close("main");
    // In this order: each file builds on `hive` from app.js, logs.js defines the log view
    // (`hive.tail`) the pages use, and pages.js uses the agent page's parts from detail.js.
    for script in SCRIPTS {
        m.open("script", &[("src", script), ("defer", "")]).close("script");
    }
    m.close("body").close("html");
    html_response(m.finish())
}

/// The page for an object the API says does not exist: HTTP 404, what was asked for, a
/// way back, and none of the object page's controls or live views.
pub fn not_found(viewer: &Viewer, active: &str, kind: &str, name: &str, back: (&str, &str)) -> Response {
    let title = format!("{kind} {name} not found");
    let mut response = page(viewer, "not-found", active, &title, |m| {
        m.open("section", &[("class", "card"), ("id", "not-found")]);
        m.open("p", &[])
            .text(&format!("There is no {} named ", kind.to_lowercase()))
            .elem("code", &[], name)
            .text(": it was never created, or it has been deleted.")
            .close("p");
        m.open("p", &[]).elem("a", &[("href", back.0)], back.1).close("p");
        m.close("section");
    });
    *response.status_mut() = axum::http::StatusCode::NOT_FOUND;
    response
}
