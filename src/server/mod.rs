//! The HTTP API: Kubernetes wire conventions over the store — discovery, OpenAPI,
//! CRUD with patches and server-side apply, `/status`, watch, Table output — behind
//! bearer-token auth, served over TLS.

pub mod admission;
pub mod apply;
pub mod approval_diff;
pub mod audit;
pub mod audit_log;
pub mod body;
pub mod discovery;
pub mod error;
pub mod events;
pub mod fleet;
pub mod forward;
pub mod generate_name;
pub mod jobs;
pub mod kinds;
pub mod list_body;
pub mod local_api;
pub mod metrics;
pub mod openapi;
pub mod params;
pub mod request_id;
pub mod resources;
pub mod routes;
pub mod selectors;
pub mod serve;
pub mod shape;
pub mod streams;
pub mod table;
pub mod telemetry;
pub mod tls;
pub mod tokens;
pub mod usage;
pub mod watch;

#[cfg(test)]
mod misshapen_input_tests;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::FutureExt;

use crate::auth::{Principal, TokenStore, Verb};
use crate::fleet::service::FleetService;
use crate::jobs::JobService;
use crate::store::Store;
use error::ApiError;
use routes::ApiRouter;

/// Tunables of the HTTP layer.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK.
    pub bookmark_interval: Duration,
    /// How long a streaming answer (a watch, a log, telemetry, a large list) waits for
    /// its client to take the next chunk; one that waits longer is ended (its memory
    /// freed) as not reading.
    pub watch_write_timeout: Duration,
    /// The caps on requests held at once (`streams.rs`).
    pub limits: streams::Limits,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bookmark_interval: Duration::from_secs(10),
            watch_write_timeout: Duration::from_secs(30),
            limits: streams::Limits::default(),
        }
    }
}

/// What every handler shares. Cloned by every layer and extractor of every request,
/// so it is one `Arc`: a clone is one counter, not one per field.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// The fields of [`AppState`].
#[derive(Clone)]
pub struct Shared {
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
    /// Jobs and the runtime behind them, once this process runs them (a replica on etcd
    /// from when it is elected; see [`forward`] for one that does not lead).
    pub jobs: Arc<std::sync::OnceLock<Arc<dyn JobService>>>,
    /// The fleet (providers, offers, telemetry), once this process runs it.
    pub fleet: Arc<std::sync::OnceLock<Arc<dyn FleetService>>>,
    /// Where Providers may take a Vast.ai key from, as this server's flags say, when set
    /// (a replica admits Providers by them whether or not it runs the fleet).
    pub key_sources: Option<Arc<crate::fleet::providers::keys::KeySources>>,
    /// This replica among others on one store on etcd; `None` for a daemon on its own.
    pub replication: Option<Arc<forward::Replication>>,
    /// The API audit log, when `hive serve` writes one.
    pub audit: Option<audit_log::AuditLog>,
    /// The registry `/metrics` serves and the handles the request layer records into.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The requests held now, against `config.limits`.
    pub held: Arc<streams::Held>,
    /// The dashboard's sign-in sessions: this process's own, or shared by its replicas.
    pub sessions: crate::auth::sessions::Sessions,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// Builds the state, rendering the OpenAPI document once.
    pub fn new(store: Store, tokens: TokenStore, config: ServerConfig) -> AppState {
        let (json, hash) = openapi::rendered();
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let held = streams::Held::new(config.limits, streams::Counts::of(&metrics.api));
        AppState(Arc::new(Shared {
            store,
            tokens,
            config: Arc::new(config),
            openapi_json: Arc::new(json),
            openapi_hash: Arc::from(hash),
            jobs: Arc::default(),
            fleet: Arc::default(),
            key_sources: None,
            replication: None,
            audit: None,
            metrics,
            held,
            sessions: crate::auth::sessions::Sessions::default(),
        }))
    }

    /// The same state with `sessions` (shared by the replicas on one etcd).
    pub fn with_sessions(mut self, sessions: crate::auth::sessions::Sessions) -> AppState {
        self.building().sessions = sessions;
        self
    }

    /// The fields to change while building the state (copied if already shared).
    fn building(&mut self) -> &mut Shared {
        Arc::make_mut(&mut self.0)
    }

    /// The same state writing the API audit log.
    pub fn with_audit(mut self, audit: audit_log::AuditLog) -> AppState {
        self.building().audit = Some(audit);
        self
    }

    /// The same state recording into (and serving) `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> AppState {
        let held = streams::Held::new(self.config.limits, streams::Counts::of(&metrics.api));
        let shared = self.building();
        shared.metrics = metrics;
        shared.held = held;
        self
    }

    /// The same state with the service that runs Jobs. Every clone of the state sees it,
    /// also one made before (a replica elected after it started serving); set once.
    pub fn with_jobs(self, jobs: Arc<dyn JobService>) -> AppState {
        let _ = self.jobs.set(jobs);
        self
    }

    /// The same state with the fleet behind `/hive/v1/fleet` (as [`AppState::with_jobs`]).
    pub fn with_fleet(self, fleet: Arc<dyn FleetService>) -> AppState {
        let _ = self.fleet.set(fleet);
        self
    }

    /// The same state admitting Providers by `sources` (the `hive serve` flags), also
    /// before or without a running fleet.
    pub fn with_key_sources(mut self, sources: crate::fleet::providers::keys::KeySources) -> AppState {
        self.building().key_sources = Some(Arc::new(sources));
        self
    }

    /// The same state for a replica among others on one store.
    pub fn with_replication(mut self, replication: forward::Replication) -> AppState {
        self.building().replication = Some(Arc::new(replication));
        self
    }

    /// The service that runs Jobs. On a replica that does not lead: `OnLeader` (the
    /// request is forwarded); on a server that runs none: a 400 saying `without`.
    pub fn job_service(&self, without: &str) -> error::ApiResult<Arc<dyn JobService>> {
        match self.jobs.get() {
            Some(jobs) => Ok(jobs.clone()),
            None if self.replication.is_some() => Err(ApiError::OnLeader("the scheduler")),
            None => Err(ApiError::BadRequest(without.into())),
        }
    }

    /// The Jobs service when this server runs one, `None` when it runs none on purpose
    /// (a server embedded without a scheduler), `OnLeader` on a replica that does not lead.
    pub fn local_jobs(&self) -> error::ApiResult<Option<Arc<dyn JobService>>> {
        match self.jobs.get() {
            Some(jobs) => Ok(Some(jobs.clone())),
            None if self.replication.is_some() => Err(ApiError::OnLeader("the scheduler")),
            None => Ok(None),
        }
    }

    /// The fleet, `OnLeader` on a replica that does not lead, or a 400 when this server
    /// runs none.
    pub fn running_fleet(&self) -> error::ApiResult<&Arc<dyn FleetService>> {
        match self.fleet.get() {
            Some(fleet) => Ok(fleet),
            None if self.replication.is_some() => Err(ApiError::OnLeader("the fleet")),
            None => Err(ApiError::BadRequest("this server runs no fleet".into())),
        }
    }

    /// Where Providers may take a Vast.ai key from on this host: the server's flags
    /// (those the fleet runs by, on every replica, leading or not), else the running
    /// fleet's, else nothing.
    pub fn key_sources(&self) -> &crate::fleet::providers::keys::KeySources {
        match (&self.key_sources, self.fleet.get()) {
            (Some(sources), _) => sources,
            (None, Some(fleet)) => fleet.key_sources(),
            (None, None) => &crate::fleet::providers::keys::NONE,
        }
    }

    /// What admission looks up for a write: the stored agents, the key sources.
    pub fn admission_facts(&self) -> admission::Facts<'_> {
        admission::Facts::new(|agent| self.store.get("agents", agent).is_some(), self.key_sources())
            .with_pending_approvals(|agent| pending_approvals(&self.store, agent))
            .with_refusals(|limit| {
                self.metrics.api.refused(limit).inc();
            })
    }
}

/// The approvals `agent` requested that are not decided yet (the quota of
/// `admission::MAX_PENDING_APPROVALS_PER_AGENT`).
fn pending_approvals(store: &Store, agent: &str) -> usize {
    use hive_api::approval::{Approval, DecisionState};
    crate::client::Api::<Approval>::new(store)
        .list()
        .1
        .iter()
        .filter(|a| {
            a.spec.requested_by.as_deref() == Some(agent) && a.spec.decision.state == DecisionState::Pending
        })
        .count()
}

/// Every authenticated route, each method with the verb it needs.
pub fn api_routes() -> ApiRouter {
    ApiRouter::new()
        .route("/apis", routes::get(Verb::Read, discovery::api_groups))
        .route("/apis/hive.dev", routes::get(Verb::Read, discovery::api_group))
        .route("/apis/hive.dev/v1", routes::get(Verb::Read, discovery::api_resources))
        .route("/openapi/v2", routes::get(Verb::Read, openapi::v2))
        .route("/openapi/v3", routes::get(Verb::Read, openapi::index))
        .route("/openapi/v3/apis/hive.dev/v1", routes::get(Verb::Read, openapi::group_version))
        .route("/openapi/v3/api/v1", routes::get(Verb::Read, openapi::core_v1))
        .route("/openapi/v3/apis/events.k8s.io/v1", routes::get(Verb::Read, openapi::events_v1))
        .merge(kinds::router())
        .merge(events::router())
        .merge(jobs::router())
        .merge(tokens::router())
        .merge(audit::router())
        .merge(approval_diff::router())
        .merge(usage::router())
        .merge(fleet::router())
        .merge(metrics::router())
}

/// The whole API as one router.
pub fn app(state: AppState) -> Router {
    app_with_pages(state, Router::new())
}

/// `GET /readyz`: ready while the store takes writes. After a failed write it asks the
/// store to reopen its database first, so readiness returns by itself once space is
/// freed. Unauthenticated, like `/healthz`, and says no more than kube-apiserver's; with
/// `?verbose` it lists its checks as kube-apiserver does, and among replicas on etcd
/// which one leads (a replica that does not lead is ready: it serves the API).
async fn readyz(State(state): State<AppState>, uri: axum::http::Uri) -> Response {
    let verbose =
        uri.query().is_some_and(|q| q.split('&').any(|p| p == "verbose" || p.starts_with("verbose=")));
    let store = state.store.probe().await;
    let mut lines = Vec::new();
    match &store {
        Ok(()) => lines.push("[+]store ok".to_string()),
        Err(why) => lines.push(format!("[-]store failed: {why}")),
    }
    if let Some(replication) = &state.replication {
        lines.push(match replication.leader() {
            forward::Leader::Me => format!("[+]leader ok: this replica ({}) leads", replication.name()),
            forward::Leader::Other { name, url } => format!("[+]leader ok: {name} ({url}) leads"),
            forward::Leader::Unknown => "[+]leader ok: no replica leads right now".to_string(),
        });
    }
    match store {
        Ok(()) if verbose => format!("{}\nreadyz check passed\n", lines.join("\n")).into_response(),
        Ok(()) => "ok".into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, format!("{}\nreadyz check failed\n", lines.join("\n")))
            .into_response(),
    }
}

/// The whole API plus `pages`, routes served beside it without API authentication (the
/// dashboard: its pages do their own sign-in). The composition root passes the
/// dashboard's router here, so the server never depends on the dashboard. Every request
/// carries a [`local_api::LocalApi`]: the same authenticated routes, for a page shell to
/// ask the API what the browser would.
pub fn app_with_pages(state: AppState, pages: Router<AppState>) -> Router {
    // Everything here is behind `authenticate`, including the fallback, so an
    // unauthenticated request gets 401 whatever its path; each route authorizes itself.
    let authenticated = api_routes()
        .into_router()
        .fallback(not_found)
        // Inside authentication, so the audit entry has the leader's answer; the leader
        // authenticates a forwarded request again, with the token it carries (every
        // replica shares the tokens).
        .layer(
            tower::ServiceBuilder::new()
                .layer(middleware::from_fn_with_state(state.clone(), authenticate))
                .layer(middleware::from_fn_with_state(state.clone(), forward::layer)),
        );
    let local = local_api::LocalApi(authenticated.clone().with_state(state.clone()));
    let app = Router::new()
        .route("/version", get(discovery::version))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .merge(authenticated)
        .merge(pages)
        // What every request passes through, outermost first, as one layer: each
        // `Router::layer` boxes every route again, and a request paid a boxed clone of
        // the service and a boxed future at each.
        .layer(
            tower::ServiceBuilder::new()
                // A request id first, so every layer, log line and audit entry of the
                // request has it.
                .layer(middleware::from_fn(request_id::assign))
                // No response is ever sniffed into another type (a JSON error as HTML).
                .layer(middleware::map_response(|mut response: Response| async move {
                    response.headers_mut().insert(
                        header::X_CONTENT_TYPE_OPTIONS,
                        axum::http::HeaderValue::from_static("nosniff"),
                    );
                    response
                }))
                .layer(middleware::from_fn_with_state(state.clone(), metrics::record_request))
                .layer(middleware::from_fn(log_request))
                .layer(middleware::from_fn(body::drain_unread))
                .layer(middleware::from_fn(catch_panic))
                .layer(axum::Extension(state.sessions.clone()))
                .layer(axum::Extension(local)),
        );
    app.with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::BadRoute
}

/// Establishes who is calling and inserts the [`Principal`]; what the caller may do is
/// each route's own check (`routes.rs`). Records the request in the API audit log, when
/// there is one, with who called (none for a 401): this layer knows, so the audit log
/// needs no layer of its own.
async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some((log, pending)) = state.audit.as_ref().and_then(|log| Some((log, log.begin(&request)?))) else {
        return authenticated(&state, request, next).await.1;
    };
    let (principal, response) = authenticated(&state, request, next).await;
    pending.finish(log, principal, response).await
}

/// [`authenticate`] without the audit log: the response, and who was answered (`None`
/// when nobody was established).
async fn authenticated(state: &AppState, mut request: Request, next: Next) -> (Option<Principal>, Response) {
    // The header's value shares the bytes hyper read: kept past the request without a copy.
    let authorization = request.headers().get(header::AUTHORIZATION).cloned();
    let bearer = authorization
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    // Without a bearer token, the dashboard's session cookie stands in for it (same
    // roles, same errors); a mutation by cookie must also carry the page's CSRF token.
    let sessions = request.extensions().get::<crate::auth::sessions::Sessions>().cloned();
    let mut by_cookie = None;
    let principal = match (bearer, &sessions) {
        (Some(bearer), _) => state.tokens.authenticate(bearer),
        (None, None) => None,
        (None, Some(sessions)) => {
            match sessions.authenticate(&state.tokens, request.method(), request.headers()).await {
                crate::auth::sessions::CookieAuth::Allowed { principal, session } => {
                    by_cookie = Some(session);
                    Some(principal)
                }
                crate::auth::sessions::CookieAuth::CsrfRefused(why) => {
                    return (None, ApiError::Forbidden(format!("CSRF token refused: {why}")).into_response());
                }
                crate::auth::sessions::CookieAuth::None => None,
            }
        }
    };
    let Some(principal) = principal else {
        return (None, ApiError::Unauthorized.into_response());
    };
    let permit = match state.held.admit(&principal, streams::Class::of(request.method(), request.uri())) {
        Ok(permit) => permit,
        Err(refused) => return (Some(principal), ApiError::TooManyRequests(refused).into_response()),
    };
    request.extensions_mut().insert::<Principal>(principal.clone());
    let response = next.run(request).await;
    if streams::is_sized(&response) {
        return (Some(principal), response); // not a stream: nothing to keep, nothing to clone
    }
    // A stream ends when what opened it does: the session (sign-out, revocation, expiry)
    // or the bearer token (revocation); and when its client stops reading.
    let live: Box<dyn Fn() -> bool + Send + Sync> = match (sessions, by_cookie, bearer) {
        (Some(sessions), Some(id), _) => {
            let tokens = state.tokens.clone();
            Box::new(move || sessions.is_session_live(&id, &tokens))
        }
        (_, _, Some(bearer)) => {
            let (tokens, bearer) = (state.tokens.clone(), bearer.to_string());
            Box::new(move || tokens.authenticate(&bearer).is_some())
        }
        _ => Box::new(|| true),
    };
    let keep = streams::Keep {
        live,
        write_timeout: state.config.watch_write_timeout,
        permit: Some(permit),
        counts: Some(state.held.counts()),
    };
    (Some(principal), streams::keep(response, keep))
}

/// Answers a request whose handler panicked with a 500 `Status` instead of dropping the
/// connection. A safety net, not input handling: a panic is a bug (the misshapen-input
/// tests fail on any), and this only keeps one request's bug from reaching its client as
/// a reset. The panic message is logged, not sent.
async fn catch_panic(request: Request, next: Next) -> Response {
    match AssertUnwindSafe(next.run(request)).catch_unwind().await {
        Ok(response) => response,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(no message)");
            ApiError::Internal(anyhow::anyhow!("the request handler panicked: {message}")).into_response()
        }
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
    use axum::http::{Method, Request, StatusCode};
    use tower::ServiceExt;

    use super::*;
    use crate::auth::Role;
    use crate::store::StoreConfig;

    /// The app with one token of each role (the agent's bound to `alpha`), sending
    /// requests through `oneshot`.
    struct Fixture {
        app: Router,
        tokens: TokenStore,
        /// Each role's token, lowest role first.
        roles: Vec<(Role, String)>,
        _dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
            let tokens = TokenStore::open(dir.path()).unwrap();
            let roles = Role::ALL
                .into_iter()
                .map(|role| {
                    let agent = (role == Role::Agent).then_some("alpha");
                    (role, tokens.create_bound(&format!("t-{role}"), role, agent).unwrap())
                })
                .collect();
            let app = app(AppState::new(store, tokens.clone(), ServerConfig::default()));
            Fixture { app, tokens, roles, _dir: dir }
        }

        async fn send(
            &self,
            method: &Method,
            path: &str,
            token: Option<&str>,
        ) -> (StatusCode, serde_json::Value) {
            let mut req = Request::builder().method(method).uri(path);
            if let Some(t) = token {
                req = req.header("authorization", format!("Bearer {t}"));
            }
            let response = self.app.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            (status, serde_json::from_slice(&body).unwrap_or_default())
        }

        /// Whether the route's authorization refused `token`: a 403 with exactly the
        /// message the check sends (a handler's own 403, say admission's, is not it).
        async fn refused(&self, method: &Method, path: &str, token: &str) -> bool {
            let (status, body) = self.send(method, path, Some(token)).await;
            if status != StatusCode::FORBIDDEN {
                return false;
            }
            if *method == Method::HEAD {
                return true; // no body to read the message from
            }
            let principal = self.tokens.authenticate(token).unwrap();
            body["message"] == routes::forbidden_message(&principal, method, path)
        }
    }

    /// A request path for a route's path: every `{param}` becomes `sample`.
    fn sample(path: &str) -> String {
        path.split('/')
            .map(|seg| if seg.starts_with('{') { "sample" } else { seg })
            .collect::<Vec<_>>()
            .join("/")
    }

    /// What every route declares, and that exactly the roles its verb allows get past
    /// its check (by sending each method with each role's token through `app()`). A new
    /// route shows up here with its verb.
    #[tokio::test]
    async fn required_verbs() {
        let table = api_routes().table();
        let rendered: Vec<String> =
            table.iter().map(|d| format!("{:<6} {:<46} {}", d.method.as_str(), d.path, d.verb)).collect();
        insta::assert_snapshot!(rendered.join("\n"), @r"
        GET    /api                                           read
        GET    /api/v1                                        read
        GET    /api/v1/events                                 read
        POST   /api/v1/events                                 write
        GET    /api/v1/events/{name}                          read
        PUT    /api/v1/events/{name}                          write
        PATCH  /api/v1/events/{name}                          write
        DELETE /api/v1/events/{name}                          write
        GET    /api/v1/namespaces/{namespace}/events          read
        POST   /api/v1/namespaces/{namespace}/events          write
        GET    /api/v1/namespaces/{namespace}/events/{name}   read
        PUT    /api/v1/namespaces/{namespace}/events/{name}   write
        PATCH  /api/v1/namespaces/{namespace}/events/{name}   write
        DELETE /api/v1/namespaces/{namespace}/events/{name}   write
        GET    /apis                                          read
        GET    /apis/events.k8s.io                            read
        GET    /apis/events.k8s.io/v1                         read
        GET    /apis/events.k8s.io/v1/events                  read
        GET    /apis/events.k8s.io/v1/namespaces/{namespace}/events read
        POST   /apis/events.k8s.io/v1/namespaces/{namespace}/events write
        GET    /apis/events.k8s.io/v1/namespaces/{namespace}/events/{name} read
        PUT    /apis/events.k8s.io/v1/namespaces/{namespace}/events/{name} write
        PATCH  /apis/events.k8s.io/v1/namespaces/{namespace}/events/{name} write
        DELETE /apis/events.k8s.io/v1/namespaces/{namespace}/events/{name} write
        GET    /apis/hive.dev                                 read
        GET    /apis/hive.dev/v1                              read
        GET    /apis/hive.dev/v1/agents                       read
        POST   /apis/hive.dev/v1/agents                       write
        GET    /apis/hive.dev/v1/agents/{name}                read
        PUT    /apis/hive.dev/v1/agents/{name}                write
        PATCH  /apis/hive.dev/v1/agents/{name}                write
        DELETE /apis/hive.dev/v1/agents/{name}                write
        GET    /apis/hive.dev/v1/agents/{name}/log            read
        GET    /apis/hive.dev/v1/agents/{name}/status         read
        PUT    /apis/hive.dev/v1/agents/{name}/status         write
        PATCH  /apis/hive.dev/v1/agents/{name}/status         write
        GET    /apis/hive.dev/v1/approvals                    read
        POST   /apis/hive.dev/v1/approvals                    request
        GET    /apis/hive.dev/v1/approvals/{name}             read
        PUT    /apis/hive.dev/v1/approvals/{name}             write
        PATCH  /apis/hive.dev/v1/approvals/{name}             write
        DELETE /apis/hive.dev/v1/approvals/{name}             write
        GET    /apis/hive.dev/v1/approvals/{name}/status      read
        PUT    /apis/hive.dev/v1/approvals/{name}/status      write
        PATCH  /apis/hive.dev/v1/approvals/{name}/status      write
        GET    /apis/hive.dev/v1/fleetcommands                read
        POST   /apis/hive.dev/v1/fleetcommands                write
        GET    /apis/hive.dev/v1/fleetcommands/{name}         read
        PUT    /apis/hive.dev/v1/fleetcommands/{name}         write
        PATCH  /apis/hive.dev/v1/fleetcommands/{name}         write
        DELETE /apis/hive.dev/v1/fleetcommands/{name}         write
        GET    /apis/hive.dev/v1/fleetcommands/{name}/status  read
        PUT    /apis/hive.dev/v1/fleetcommands/{name}/status  write
        PATCH  /apis/hive.dev/v1/fleetcommands/{name}/status  write
        GET    /apis/hive.dev/v1/jobs                         read
        POST   /apis/hive.dev/v1/jobs                         write
        GET    /apis/hive.dev/v1/jobs/{name}                  read
        PUT    /apis/hive.dev/v1/jobs/{name}                  write
        PATCH  /apis/hive.dev/v1/jobs/{name}                  write
        DELETE /apis/hive.dev/v1/jobs/{name}                  write
        POST   /apis/hive.dev/v1/jobs/{name}/cancel           write
        GET    /apis/hive.dev/v1/jobs/{name}/log              read
        GET    /apis/hive.dev/v1/jobs/{name}/status           read
        PUT    /apis/hive.dev/v1/jobs/{name}/status           write
        PATCH  /apis/hive.dev/v1/jobs/{name}/status           write
        GET    /apis/hive.dev/v1/nodes                        read
        POST   /apis/hive.dev/v1/nodes                        write
        GET    /apis/hive.dev/v1/nodes/{name}                 read
        PUT    /apis/hive.dev/v1/nodes/{name}                 write
        PATCH  /apis/hive.dev/v1/nodes/{name}                 write
        DELETE /apis/hive.dev/v1/nodes/{name}                 write
        GET    /apis/hive.dev/v1/nodes/{name}/status          read
        PUT    /apis/hive.dev/v1/nodes/{name}/status          write
        PATCH  /apis/hive.dev/v1/nodes/{name}/status          write
        GET    /apis/hive.dev/v1/providers                    read
        POST   /apis/hive.dev/v1/providers                    admin
        GET    /apis/hive.dev/v1/providers/{name}             read
        PUT    /apis/hive.dev/v1/providers/{name}             admin
        PATCH  /apis/hive.dev/v1/providers/{name}             admin
        DELETE /apis/hive.dev/v1/providers/{name}             admin
        GET    /apis/hive.dev/v1/providers/{name}/status      read
        PUT    /apis/hive.dev/v1/providers/{name}/status      admin
        PATCH  /apis/hive.dev/v1/providers/{name}/status      admin
        GET    /hive/v1/agents/usage                          read
        GET    /hive/v1/approvals/{name}/diff                 read
        GET    /hive/v1/audit                                 read
        GET    /hive/v1/fleet/nodes/{name}/telemetry          read
        GET    /hive/v1/fleet/offers                          write
        POST   /hive/v1/fleet/providers/{name}/configure      admin
        GET    /hive/v1/tokens                                admin
        POST   /hive/v1/tokens                                admin
        DELETE /hive/v1/tokens/{name}                         admin
        GET    /hive/v1/whoami                                read
        GET    /metrics                                       read
        GET    /openapi/v2                                    read
        GET    /openapi/v3                                    read
        GET    /openapi/v3/api/v1                             read
        GET    /openapi/v3/apis/events.k8s.io/v1              read
        GET    /openapi/v3/apis/hive.dev/v1                   read
        ");
        let f = Fixture::new();
        for declared in &table {
            let path = sample(declared.path);
            let mut allowed = Vec::new();
            for (role, token) in &f.roles {
                if !f.refused(&declared.method, &path, token).await {
                    allowed.push(*role);
                }
            }
            let want: Vec<Role> =
                Role::ALL.into_iter().filter(|role| *role >= declared.verb.required_role()).collect();
            assert_eq!(allowed, want, "{} {} needs {}", declared.method, declared.path, declared.verb);
        }
    }

    /// Walks every route of `app()` with every method: unauthenticated it is 401; with a
    /// token, a declared method is served only to roles its verb allows, and an
    /// undeclared one is 405 only to roles that may use the whole path, 403 otherwise.
    /// Unknown paths are 401 too without a token, 404 with one.
    #[tokio::test]
    async fn every_route_authenticates_then_authorizes_every_method() {
        let routes = api_routes();
        let table = routes.table();
        let paths: std::collections::BTreeSet<&str> = table.iter().map(|d| d.path).collect();
        let f = Fixture::new();
        let methods = [
            Method::GET,
            Method::HEAD,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
            Method::OPTIONS,
        ];
        for path in paths {
            let concrete = sample(path);
            for method in &methods {
                let declared = table.iter().find(|d| {
                    d.path == path
                        && (d.method == *method || (*method == Method::HEAD && d.method == Method::GET))
                });
                let (status, _) = f.send(method, &concrete, None).await;
                assert_eq!(status, StatusCode::UNAUTHORIZED, "anonymous {method} {path}");
                let needed = declared.map_or_else(|| routes.unserved_verb(path).unwrap(), |d| d.verb);
                for (role, token) in &f.roles {
                    let refused = f.refused(method, &concrete, token).await;
                    assert_eq!(refused, !role.allows(needed), "{role} {method} {path} (needs {needed})");
                    if declared.is_none() && !refused {
                        let (status, _) = f.send(method, &concrete, Some(token)).await;
                        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{role} {method} {path}");
                    }
                }
            }
        }
        for path in ["/apis/hive.dev/v1/bogus", "/hive/v1/nothing", "/api/v1/pods"] {
            assert_eq!(f.send(&Method::GET, path, None).await.0, StatusCode::UNAUTHORIZED, "{path}");
            let viewer = &f.roles[0].1;
            assert_eq!(f.send(&Method::DELETE, path, Some(viewer)).await.0, StatusCode::NOT_FOUND, "{path}");
        }
    }

    /// Every operation the OpenAPI document describes is a declared route, so none can
    /// be served beside the table (on the unauthenticated router, say).
    #[test]
    fn documented_operations_are_declared_routes() {
        let table = api_routes().table();
        let (json, _) = openapi::rendered();
        let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
        let mut documented = 0;
        for (path, operations) in doc["paths"].as_object().unwrap() {
            let methods = operations.as_object().unwrap().keys();
            let methods = methods.filter(|key| {
                ["get", "put", "post", "delete", "patch", "head", "options"].contains(&key.as_str())
            });
            for method in methods {
                let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
                let found = table.iter().any(|d| d.path == path && d.method == method);
                assert!(found, "{method} {path} is documented but declares no verb");
                documented += 1;
            }
        }
        assert!(documented >= 54, "the kinds alone document 54 operations, found {documented}");
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_a_500_status() {
        let app = Router::new()
            .route("/boom", get(|| async { panic!("boom") as &'static str }))
            .layer(middleware::from_fn(catch_panic));
        let response = app.oneshot(Request::get("/boom").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (status["kind"].as_str(), status["reason"].as_str()),
            (Some("Status"), Some("InternalError"))
        );
        assert!(
            !status["message"].as_str().unwrap().contains("boom"),
            "the panic is logged, not sent: {status}"
        );
    }

    #[tokio::test]
    async fn routes_answer_without_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let tokens = TokenStore::open(dir.path()).unwrap();
        let viewer = tokens.create("v", Role::Viewer).unwrap();
        let operator = tokens.create("o", Role::Operator).unwrap();
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
        let not_allowed = send("DELETE", "/apis/hive.dev/v1/agents", Some(&operator)).await.unwrap();
        assert_eq!(not_allowed.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(not_allowed.headers()["allow"], "GET,HEAD,POST");
    }
}
