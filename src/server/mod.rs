//! The HTTP API: Kubernetes wire conventions over the store — discovery, OpenAPI,
//! CRUD with patches and server-side apply, `/status`, watch, Table output — behind
//! bearer-token auth, served over TLS.

pub mod admission;
pub mod apply;
pub mod approval_diff;
pub mod audit;
pub mod body;
pub mod discovery;
pub mod error;
pub mod events;
pub mod jobs;
pub mod kinds;
pub mod openapi;
pub mod params;
pub mod resources;
pub mod selectors;
pub mod serve;
pub mod streams;
pub mod table;
pub mod tls;
pub mod tokens;
pub mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::auth::{Principal, TokenStore, Verb};
use crate::store::Store;
use error::ApiError;

/// Tunables of the HTTP layer.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK.
    pub bookmark_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig { bookmark_interval: Duration::from_secs(10) }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The object store.
    pub store: Store,
    /// Bearer tokens and their roles.
    pub tokens: TokenStore,
    /// Tunables.
    pub config: Arc<ServerConfig>,
    /// The rendered OpenAPI document (computed once).
    pub openapi_json: Arc<String>,
    /// Its content hash, for the discovery URL.
    pub openapi_hash: Arc<str>,
    /// The scheduler and runtime behind Jobs, when the daemon runs them.
    pub engine: Option<Arc<crate::daemon::engine::Engine>>,
    /// The fleet (providers, offers, telemetry), when the daemon runs it.
    pub fleet: Option<Arc<crate::fleet::Fleet>>,
}

impl AppState {
    /// Builds the state, rendering the OpenAPI document once.
    pub fn new(store: Store, tokens: TokenStore, config: ServerConfig) -> AppState {
        let (json, hash) = openapi::rendered();
        AppState {
            store,
            tokens,
            config: Arc::new(config),
            openapi_json: Arc::new(json),
            openapi_hash: Arc::from(hash),
            engine: None,
            fleet: None,
        }
    }

    /// The same state with the engine that runs Jobs.
    pub fn with_engine(mut self, engine: Arc<crate::daemon::engine::Engine>) -> AppState {
        self.engine = Some(engine);
        self
    }

    /// The same state with the fleet behind `/hive/v1/fleet`.
    pub fn with_fleet(mut self, fleet: Arc<crate::fleet::Fleet>) -> AppState {
        self.fleet = Some(fleet);
        self
    }
}

/// The whole API as one router.
pub fn app(state: AppState) -> Router {
    let authenticated = Router::new()
        .route("/apis", get(discovery::api_groups))
        .route("/apis/hive.dev", get(discovery::api_group))
        .route("/apis/hive.dev/v1", get(discovery::api_resources))
        .route("/openapi/v3", get(openapi::index))
        .route("/openapi/v3/apis/hive.dev/v1", get(openapi::group_version))
        .merge(kinds::router())
        .merge(events::router())
        .merge(jobs::router())
        .merge(tokens::router())
        .merge(audit::router())
        .merge(approval_diff::router())
        .merge(crate::fleet::api::router())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .route("/version", get(discovery::version))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .merge(authenticated)
        .merge(crate::dashboard::router())
        .layer(axum::Extension(crate::dashboard::Sessions::default()))
        .layer(middleware::from_fn(log_request))
        // No response is ever sniffed into another type (a JSON error as HTML, say).
        .layer(middleware::map_response(|mut response: Response| async move {
            response
                .headers_mut()
                .insert(header::X_CONTENT_TYPE_OPTIONS, axum::http::HeaderValue::from_static("nosniff"));
            response
        }))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::BadRoute
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// The verb a request needs, and the resource it names (for the 403 message).
fn required(method: &Method, path: &str) -> (Verb, String) {
    let rest =
        path.strip_prefix("/apis/hive.dev/v1/").or_else(|| path.strip_prefix("/api/v1/")).unwrap_or("");
    let resource = rest.split('/').next().unwrap_or("").to_string();
    if path.starts_with("/hive/v1/tokens") {
        return (Verb::Admin, "tokens".into());
    }
    if path == "/hive/v1/fleet/offers" {
        // Searching offers spends the admin-configured Vast.ai key and its quota.
        return (Verb::Write, "offers".into());
    }
    if matches!(*method, Method::GET | Method::HEAD) {
        return (Verb::Read, resource);
    }
    if *method == Method::POST && path == "/apis/hive.dev/v1/approvals" {
        // An agent token may ask; admission checks it asks only for itself.
        return (Verb::Request, resource);
    }
    if resource == "providers" {
        return (Verb::Admin, resource);
    }
    if let Some(rest) = path.strip_prefix("/hive/v1/fleet/providers/") {
        // ConfigureProvider: credentials, like every Provider write, are admin's.
        return (Verb::Admin, format!("providers/{rest}"));
    }
    (Verb::Write, resource)
}

fn verb_word(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "access",
    }
}

async fn authenticate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(|b| b.trim().to_string());
    let bearer = bearer.as_deref();
    // Without a bearer token, the dashboard's session cookie stands in for it (same
    // roles, same errors); a mutation by cookie must also carry the page's CSRF token.
    let sessions = request.extensions().get::<crate::dashboard::Sessions>().cloned();
    let mut by_cookie = None;
    let principal = match bearer {
        Some(bearer) => state.tokens.authenticate(bearer),
        None => match sessions
            .as_ref()
            .map(|sessions| sessions.authenticate(&state.tokens, request.method(), request.headers()))
        {
            Some(crate::dashboard::CookieAuth::Allowed { principal, session }) => {
                by_cookie = Some(session);
                Some(principal)
            }
            Some(crate::dashboard::CookieAuth::CsrfRefused(why)) => {
                return ApiError::Forbidden(format!("CSRF token refused: {why}")).into_response();
            }
            Some(crate::dashboard::CookieAuth::None) | None => None,
        },
    };
    let Some(principal) = principal else {
        return ApiError::Unauthorized.into_response();
    };
    let (verb, resource) = required(request.method(), request.uri().path());
    if !principal.allows(verb) {
        let message = format!(
            "{resource}.hive.dev is forbidden: User \"{}\" (role {}) cannot {} resource \"{resource}\" in API group \"hive.dev\"",
            principal.name,
            principal.role,
            verb_word(request.method()),
        );
        return ApiError::Forbidden(message).into_response();
    }
    request.extensions_mut().insert::<Principal>(principal);
    let response = next.run(request).await;
    if streams::is_sized(&response) {
        return response; // not a stream: nothing to cut, nothing to clone
    }
    // A stream ends when what opened it does: the session (sign-out, revocation, expiry)
    // or the bearer token (revocation).
    match (sessions, by_cookie, bearer) {
        (Some(sessions), Some(id), _) => sessions.end_with_session(response, id, state.tokens.clone()),
        (_, _, Some(bearer)) => {
            let (tokens, bearer) = (state.tokens.clone(), bearer.to_string());
            streams::end_when_dead(response, move || tokens.authenticate(&bearer).is_some())
        }
        _ => response,
    }
}

async fn log_request(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    tracing::debug!(%method, path, status = response.status().as_u16(), elapsed_us = started.elapsed().as_micros() as u64, "request");
    response
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;
    use crate::auth::Role;
    use crate::store::StoreConfig;

    #[test]
    fn required_verbs() {
        let cases = [
            (Method::GET, "/apis/hive.dev/v1/agents", Verb::Read),
            (Method::GET, "/apis/hive.dev/v1/providers/p", Verb::Read),
            (Method::POST, "/apis/hive.dev/v1/agents", Verb::Write),
            (Method::POST, "/apis/hive.dev/v1/approvals", Verb::Request),
            (Method::PATCH, "/apis/hive.dev/v1/approvals/a", Verb::Write),
            (Method::GET, "/hive/v1/whoami", Verb::Read),
            (Method::PATCH, "/apis/hive.dev/v1/agents/a/status", Verb::Write),
            (Method::DELETE, "/apis/hive.dev/v1/fleetcommands/c", Verb::Write),
            (Method::POST, "/apis/hive.dev/v1/providers", Verb::Admin),
            (Method::PUT, "/apis/hive.dev/v1/providers/p/status", Verb::Admin),
            (Method::GET, "/hive/v1/tokens", Verb::Admin),
            (Method::GET, "/hive/v1/fleet/offers", Verb::Write),
            (Method::GET, "/hive/v1/fleet/nodes/n/telemetry", Verb::Read),
            (Method::POST, "/hive/v1/tokens", Verb::Admin),
        ];
        for (method, path, want) in cases {
            assert_eq!(required(&method, path).0, want, "{method} {path}");
        }
    }

    #[tokio::test]
    async fn routes_answer_without_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let tokens = TokenStore::open(dir.path()).unwrap();
        let viewer = tokens.create("v", Role::Viewer).unwrap();
        let app = app(AppState::new(store, tokens, ServerConfig::default()));
        let send = |method: &str, path: &str, token: Option<&str>| {
            let mut req = Request::builder().method(method).uri(path);
            if let Some(t) = token {
                req = req.header("authorization", format!("Bearer {t}"));
            }
            app.clone().oneshot(req.body(Body::empty()).unwrap())
        };
        assert_eq!(send("GET", "/version", None).await.unwrap().status(), StatusCode::OK);
        assert_eq!(send("GET", "/apis", None).await.unwrap().status(), StatusCode::UNAUTHORIZED);
        assert_eq!(send("GET", "/apis", Some(&viewer)).await.unwrap().status(), StatusCode::OK);
        assert_eq!(
            send("GET", "/apis/hive.dev/v1/agents", Some(&viewer)).await.unwrap().status(),
            StatusCode::OK
        );
        assert_eq!(
            send("GET", "/apis/hive.dev/v1/bogus", Some(&viewer)).await.unwrap().status(),
            StatusCode::NOT_FOUND
        );
        let forbidden = send("POST", "/apis/hive.dev/v1/agents", Some(&viewer)).await.unwrap();
        assert_eq!(forbidden.status(), StatusCode::FORBIDDEN);
        let body = axum::body::to_bytes(forbidden.into_body(), 1 << 20).await.unwrap();
        let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "Forbidden");
        let not_allowed = send("DELETE", "/apis/hive.dev/v1/agents", Some(&viewer)).await.unwrap();
        assert_eq!(not_allowed.status(), StatusCode::FORBIDDEN, "role checks come before routing");
    }
}
