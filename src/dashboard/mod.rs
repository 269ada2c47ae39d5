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
use crate::server::local_api::LocalApi;
use crate::server::request_id::RequestId;
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
        .route("/jobs/{name}", get(pages::job::page))
        .route("/nodes/{name}", get(pages::node::page))
        .route("/approvals", get(pages::approvals::page))
        .route("/events", get(pages::events::page))
        .route("/fleet", get(pages::fleet::page))
        .route("/provision", get(pages::provision::page))
        .route("/status", get(pages::status::page))
        .route("/assets/{file}", get(asset))
}

/// Who is looking at a page, and what the page may offer them.
pub struct Viewer {
    /// The signed-in session.
    pub session: SignedIn,
    /// What the page shell needs to ask the API as this viewer.
    ask: Asker,
}

/// The page request's cookie, sessions and id, and the in-process API they are shown to.
struct Asker {
    api: Option<LocalApi>,
    headers: axum::http::HeaderMap,
    sessions: Sessions,
    id: Option<RequestId>,
}

/// Whether an object exists, as the API answered the viewer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existence {
    /// 200: it does.
    Found,
    /// 404: it does not.
    Missing,
    /// Anything else (refused, failed): the page renders, and its script shows what the
    /// API says.
    Unknown,
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

    /// Asks the public API, as this viewer, whether the object at `path` (an API path
    /// such as `/apis/hive.dev/v1/agents/NAME`) exists. The shell never reads the store.
    pub async fn exists(&self, path: &str) -> Existence {
        let Some(api) = &self.ask.api else { return Existence::Unknown };
        match api.status_of(path, &self.ask.headers, &self.ask.sessions, self.ask.id.as_ref()).await {
            StatusCode::OK => Existence::Found,
            StatusCode::NOT_FOUND => Existence::Missing,
            _ => Existence::Unknown,
        }
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
        let Some(session) = sessions.current(&state.tokens, &parts.headers).await else {
            return Err(Redirect::to("/login"));
        };
        let ask = Asker {
            api: parts.extensions.get::<LocalApi>().cloned(),
            headers: parts.headers.clone(),
            sessions: sessions.clone(),
            id: parts.extensions.get::<RequestId>().cloned(),
        };
        Ok(Viewer { session, ask })
    }
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every embedded asset: (file name, body, content type).
const ASSETS: [(&str, &str, &str); 15] = [
    ("app.js", include_str!("assets/app.js"), JS),
    ("logs.js", include_str!("assets/logs.js"), JS),
    ("charts.js", include_str!("assets/charts.js"), JS),
    ("yaml.js", include_str!("assets/yaml.js"), JS),
    ("tables.js", include_str!("assets/tables.js"), JS),
    ("events.js", include_str!("assets/events.js"), JS),
    ("detail.js", include_str!("assets/detail.js"), JS),
    ("pages.js", include_str!("assets/pages.js"), JS),
    ("dag.js", include_str!("assets/dag.js"), JS),
    ("fleet.js", include_str!("assets/fleet.js"), JS),
    ("jobs_filter.js", include_str!("assets/jobs_filter.js"), JS),
    ("metrics.js", include_str!("assets/metrics.js"), JS),
    ("app.css", include_str!("assets/app.css"), CSS),
    ("views.css", include_str!("assets/views.css"), CSS),
    ("theme.css", include_str!("assets/theme.css"), CSS),
];

/// `GET /assets/{file}`: the embedded JavaScript and CSS.
async fn asset(Path(file): Path<String>) -> Response {
    let Some((_, body, kind)) = ASSETS.iter().find(|(name, _, _)| *name == file) else {
        return (StatusCode::NOT_FOUND, "no such asset").into_response();
    };
    let mut response = Response::new(Body::from(*body));
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
    crate::host::output::say(format_args!("hive: dashboard https://{local}/"));
    Ok(Some(tokio::spawn(async move {
        if let Err(err) =
            crate::server::serve::serve_tls(listener, tls, app, connections, std::future::pending::<()>())
                .await
        {
            tracing::error!(error = %err, "the dashboard listener failed");
        }
    })))
}
