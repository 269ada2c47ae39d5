//! The web dashboard, built into the daemon: server-rendered pages (a small escaping
//! HTML builder, no template engine) with our own JavaScript and CSS embedded in the
//! binary. Pages are shells; their live data comes from the public REST API (list +
//! watch, logs, Jobs, patches) called by the browser with the session cookie, so the
//! dashboard has no side door into the store and the API's roles and errors apply.

mod html;
mod layout;
mod pages;
#[cfg(test)]
mod tests;

use axum::body::Body;
use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use crate::auth::Verb;
use crate::server::AppState;

pub use crate::auth::sessions::{CookieAuth, Sessions, SignedIn, COOKIE, CSRF_HEADER, SESSION_TTL};

/// The dashboard's routes: pages, sign-in and sign-out, and the embedded assets. They
/// sit outside the bearer layer: a page without a session redirects to `/login`.
/// Needs a [`Sessions`] extension (the API's `authenticate` reads the same one).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(pages::overview::page))
        .route("/login", get(pages::login::form).post(pages::login::submit))
        .route("/logout", axum::routing::post(pages::login::sign_out))
        .route("/agents", get(pages::agents::list))
        .route("/agents/{name}", get(pages::agents::one))
        .route("/jobs", get(pages::jobs::page))
        .route("/approvals", get(pages::approvals::page))
        .route("/fleet", get(pages::fleet::page))
        .route("/provision", get(pages::provision::page))
        .route("/status", get(pages::status::page))
        .route("/assets/{file}", get(asset))
}

/// Who is looking at a page, and what the page may offer them.
pub struct Viewer {
    /// The signed-in session.
    pub session: SignedIn,
}

impl Viewer {
    /// Whether mutation controls (power, cancel, approve, provision, kill) are rendered.
    pub fn can_write(&self) -> bool {
        self.session.principal.allows(Verb::Write)
    }

    /// Whether admin controls (ConfigureProvider) are rendered.
    pub fn can_admin(&self) -> bool {
        self.session.principal.allows(Verb::Admin)
    }
}

/// A page request's signed-in viewer: taken from the session cookie, or the request is
/// answered with a redirect to `/login`. Every page handler takes one as its argument.
impl axum::extract::FromRequestParts<AppState> for Viewer {
    type Rejection = Redirect;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let sessions = parts.extensions.get::<Sessions>().ok_or_else(|| Redirect::to("/login"))?;
        match sessions.current(&state.tokens, &parts.headers) {
            Some(session) => Ok(Viewer { session }),
            None => Err(Redirect::to("/login")),
        }
    }
}

const APP_JS: &str = include_str!("assets/app.js");
const PAGES_JS: &str = include_str!("assets/pages.js");
const FLEET_JS: &str = include_str!("assets/fleet.js");
const LOGS_JS: &str = include_str!("assets/logs.js");
const CHARTS_JS: &str = include_str!("assets/charts.js");
const JOBS_FILTER_JS: &str = include_str!("assets/jobs_filter.js");
const METRICS_JS: &str = include_str!("assets/metrics.js");
const VIEWS_CSS: &str = include_str!("assets/views.css");
const APP_CSS: &str = include_str!("assets/app.css");

/// `GET /assets/{file}`: the embedded JavaScript and CSS.
async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "app.js" => (APP_JS, "text/javascript; charset=utf-8"),
        "pages.js" => (PAGES_JS, "text/javascript; charset=utf-8"),
        "fleet.js" => (FLEET_JS, "text/javascript; charset=utf-8"),
        "logs.js" => (LOGS_JS, "text/javascript; charset=utf-8"),
        "charts.js" => (CHARTS_JS, "text/javascript; charset=utf-8"),
        "jobs_filter.js" => (JOBS_FILTER_JS, "text/javascript; charset=utf-8"),
        "metrics.js" => (METRICS_JS, "text/javascript; charset=utf-8"),
        "views.css" => (VIEWS_CSS, "text/css; charset=utf-8"),
        "app.css" => (APP_CSS, "text/css; charset=utf-8"),
        _ => return (StatusCode::NOT_FOUND, "no such asset").into_response(),
    };
    let mut response = Response::new(Body::from(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    // Assets change only with the binary; revalidation is cheap and never stale.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // `X-Content-Type-Options: nosniff` comes from the app's layer, on every response.
    response
}

/// Parses `--dashboard-listen`: `ADDR:PORT`, or a bare port meaning `127.0.0.1:PORT`.
pub fn parse_listen(value: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = value.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    value.parse().map_err(|_| format!("{value:?} is neither ADDR:PORT nor a port"))
}

/// Serves `app` (dashboard and API alike: the pages call the API on their own origin)
/// on the extra `--dashboard-listen` address with the same TLS, its connections counted
/// with the API listener's, in a task the caller aborts at shutdown.
pub async fn serve_extra(
    listen: Option<std::net::SocketAddr>,
    tls: std::sync::Arc<rustls::ServerConfig>,
    app: Router,
    connections: crate::server::serve::Connections,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    use anyhow::Context as _;
    let Some(listen) = listen else { return Ok(None) };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen} (--dashboard-listen)"))?;
    let local = listener.local_addr()?;
    println!("hive: dashboard https://{local}/");
    Ok(Some(tokio::spawn(async move {
        if let Err(err) =
            crate::server::serve::serve_tls(listener, tls, app, connections, std::future::pending::<()>())
                .await
        {
            tracing::error!(error = %err, "the dashboard listener failed");
        }
    })))
}
