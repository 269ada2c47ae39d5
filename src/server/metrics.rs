//! `GET /metrics`: the daemon's metrics in the OpenMetrics text format (which
//! Prometheus scrapes), for any role that may read; also served without authentication
//! on `hive serve --metrics-listen` (plain HTTP, for a scraper on the same host). And
//! [`record_request`], the layer that counts every request and its latency
//! (`apiserver_request_total`, `apiserver_request_duration_seconds`, in-flight and
//! long-running requests), kept a layer of its own so other layers merge beside it.
//!
//! A request's labels are bounded whatever its path: the resource and subresource are
//! taken from the known ones only (anything else is `""`), the verb is kube's.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::StreamExt as _;

use super::routes::{self, ApiRouter};
use super::AppState;
use crate::auth::Verb;
use crate::metrics::{InflightLabels, Levels, RequestLabels, RouteLabels};

/// The authenticated `/metrics` route.
pub fn router() -> ApiRouter {
    ApiRouter::new().route("/metrics", routes::get(Verb::Read, scrape))
}

/// `/metrics` alone, without authentication: what `--metrics-listen` serves.
pub fn plain_router(state: AppState) -> Router {
    Router::new().route("/metrics", axum::routing::get(scrape)).with_state(state)
}

/// The metrics text, with the levels read now: OpenMetrics when the client asks for it
/// (Prometheus does), else the Prometheus text format 0.0.4.
async fn scrape(State(state): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    let levels = levels(&state);
    let text = state.metrics.encode(&levels);
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let (body, content_type) = if openmetrics {
        (text, crate::metrics::OPENMETRICS)
    } else {
        (crate::metrics::prometheus_text(&text), crate::metrics::PROMETHEUS_TEXT)
    };
    let mut response = body.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// What the store, the scheduler and the fleet hold right now.
fn levels(state: &AppState) -> Levels {
    let stats = state.store.stats();
    let mut levels = Levels {
        revision: stats.revision as i64,
        events: stats.events as i64,
        event_bytes: stats.event_bytes as i64,
        compacted: stats.compacted as i64,
        ..Levels::default()
    };
    let resources = hive_api::kinds().iter().map(|k| k.plural).chain(["events"]);
    levels.objects = resources.map(|r| (r.to_string(), state.store.list(r).1.len() as i64)).collect();
    let (_, agents) = crate::client::Api::<hive_api::Agent>::new(&state.store).list();
    levels.agent_restarts =
        agents.into_iter().map(|a| (a.metadata.name, i64::from(a.status.restarts))).collect();
    let (_, nodes) = crate::client::Api::<hive_api::Node>::new(&state.store).list();
    let mut fleet: std::collections::BTreeMap<(String, String), i64> = Default::default();
    for node in nodes {
        let phase = node.status.phase.map_or_else(|| "Pending".to_string(), |p| format!("{p:?}"));
        *fleet.entry((phase, node.spec.provider)).or_default() += 1;
    }
    levels.fleet_nodes = fleet.into_iter().map(|((phase, provider), n)| (phase, provider, n)).collect();
    // Jobs in the store mirror the scheduler's nodes (the scheduler writes each change).
    let (_, jobs) = crate::client::Api::<hive_api::Job>::new(&state.store).list();
    let mut running: std::collections::BTreeMap<String, i64> = Default::default();
    for job in &jobs {
        for status in &job.status.nodes {
            match status.state {
                hive_api::job::JobNodeState::Queued => levels.queued_nodes += 1,
                hive_api::job::JobNodeState::Running => {
                    let kind = job.spec.nodes.iter().find(|n| n.id == status.id).map(|n| n.kind);
                    let kind = kind.map_or_else(|| "Unknown".to_string(), |k| format!("{k:?}"));
                    *running.entry(kind).or_default() += 1;
                }
                _ => {}
            }
        }
    }
    levels.running_nodes = running.into_iter().collect();
    levels.leading = state.jobs.get().is_some();
    levels.leader = state.replication.as_ref().and_then(|r| match r.leader() {
        super::forward::Leader::Me => Some(r.name().to_string()),
        super::forward::Leader::Other { name, .. } => Some(name),
        super::forward::Leader::Unknown => None,
    });
    levels
}

/// Counts the request by verb, resource, subresource and code, times it to its
/// response head, and keeps the in-flight and long-running gauges. A streaming answer
/// (watch, followed log, telemetry) counts as long-running until its body is dropped.
pub async fn record_request(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let metrics = state.metrics.clone();
    if !metrics.recording {
        return next.run(request).await;
    }
    let started = Instant::now();
    let route = classify(request.method(), request.uri().path(), request.uri().query());
    let request_kind = match *request.method() {
        Method::GET | Method::HEAD => "readOnly",
        _ => "mutating",
    };
    // A guard, so a request whose client went away (its future dropped) leaves too.
    let inflight =
        Decrement::after_inc(metrics.api.inflight.get_or_create_owned(&InflightLabels { request_kind }));
    let response = next.run(request).await;
    drop(inflight);
    let code = response.status().as_u16();
    let RouteLabels { verb, resource, subresource } = route.clone();
    metrics.api.requests.get_or_create(&RequestLabels { verb, resource, subresource, code }).inc();
    if super::streams::is_sized(&response) {
        metrics.api.duration.get_or_create(&route).observe(crate::metrics::seconds(started.elapsed()));
        return response;
    }
    let guard = Decrement::after_inc(metrics.api.longrunning.get_or_create_owned(&route));
    let (parts, body) = response.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _held = &guard;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

/// One on a gauge while it lives: taken off when dropped (the request answered or
/// abandoned, a stream's body ended or dropped).
struct Decrement(prometheus_client::metrics::gauge::Gauge);

impl Decrement {
    fn after_inc(gauge: prometheus_client::metrics::gauge::Gauge) -> Decrement {
        gauge.inc();
        Decrement(gauge)
    }
}

impl Drop for Decrement {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The resources a request may be counted under; any other segment is `""`.
const RESOURCES: [&str; 13] = [
    "agents",
    "approvals",
    "events",
    "fleetcommands",
    "jobs",
    "nodes",
    "providers",
    "audit",
    "fleet",
    "tokens",
    "whoami",
    "metrics",
    "offers",
];

/// The subresources a request may be counted under.
const SUBRESOURCES: [&str; 7] = ["status", "log", "cancel", "diff", "telemetry", "configure", "scale"];

fn known(list: &[&'static str], segment: Option<&str>) -> &'static str {
    segment.and_then(|s| list.iter().find(|k| **k == s)).copied().unwrap_or("")
}

/// kube's verb, resource and subresource of a request.
fn classify(method: &Method, path: &str, query: Option<&str>) -> RouteLabels {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // (resource, name, subresource) segments, where the path addresses a resource.
    let addressed: Option<(Option<&str>, Option<&str>, Option<&str>)> = match segments.as_slice() {
        ["apis", "hive.dev", "v1", rest @ ..]
        | ["api", "v1", "namespaces", _, rest @ ..]
        | ["api", "v1", rest @ ..]
            if !rest.is_empty() =>
        {
            Some((rest.first().copied(), rest.get(1).copied(), rest.get(2).copied()))
        }
        // /hive/v1/fleet/nodes/{name}/telemetry, /hive/v1/fleet/offers,
        // /hive/v1/fleet/providers/{name}/configure
        ["hive", "v1", "fleet", "offers"] => Some((Some("offers"), None, None)),
        ["hive", "v1", "fleet", resource, name, sub] => Some((Some(resource), Some(name), Some(sub))),
        ["hive", "v1", resource, rest @ ..] => {
            Some((Some(resource), rest.first().copied(), rest.get(1).copied()))
        }
        ["metrics"] => Some((Some("metrics"), None, None)),
        _ => None,
    };
    let Some((resource, name, sub)) = addressed else {
        return RouteLabels { verb: plain_verb(method), resource: "", subresource: "" };
    };
    let (resource, subresource) = (known(&RESOURCES, resource), known(&SUBRESOURCES, sub));
    if resource.is_empty() {
        return RouteLabels { verb: plain_verb(method), resource, subresource };
    }
    let watch = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match *method {
        Method::GET | Method::HEAD if watch => "watch",
        Method::GET | Method::HEAD if name.is_none() => "list",
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if name.is_none() => "deletecollection",
        Method::DELETE => "delete",
        _ => plain_verb(method),
    };
    RouteLabels { verb, resource, subresource }
}

fn plain_verb(method: &Method) -> &'static str {
    match *method {
        Method::GET => "get",
        Method::HEAD => "head",
        Method::POST => "post",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::OPTIONS => "options",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What recording costs one request: the same trivial route through `oneshot` with
    /// the layer recording and with it off (`--metrics=false`). A measurement, not a
    /// check: run it with `--run-ignored only --no-capture` (docs/benchmarks.md).
    #[tokio::test]
    #[ignore = "a measurement, printed; see docs/benchmarks.md"]
    async fn recording_costs_per_request() {
        use tower::ServiceExt as _;
        const N: u32 = 200_000;
        let dir = tempfile::tempdir().unwrap();
        let store =
            crate::store::Store::open(crate::store::StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let tokens = crate::auth::TokenStore::open(dir.path()).unwrap();
        let state = AppState::new(store, tokens, super::super::ServerConfig::default());
        for recording in [false, true, false, true] {
            let state =
                state.clone().with_metrics(std::sync::Arc::new(crate::metrics::Metrics::new(recording)));
            let app: Router = Router::new()
                .route("/apis/hive.dev/v1/agents", axum::routing::post(|| async { "ok" }))
                .layer(axum::middleware::from_fn_with_state(state.clone(), record_request))
                .with_state(state);
            let started = Instant::now();
            for _ in 0..N {
                let request = Request::builder()
                    .method(Method::POST)
                    .uri("/apis/hive.dev/v1/agents")
                    .body(Body::empty())
                    .unwrap();
                let response = app.clone().oneshot(request).await.unwrap();
                assert_eq!(response.status(), 200);
            }
            let per = started.elapsed() / N;
            println!("recording={recording}: {per:?} per request through the layer ({N} requests)");
        }
    }

    #[test]
    fn requests_are_labelled_as_kube_does_and_boundedly() {
        /// (method, path, query) → (verb, resource, subresource).
        type Case = (Method, &'static str, Option<&'static str>, (&'static str, &'static str, &'static str));
        let cases: &[Case] = &[
            (Method::POST, "/apis/hive.dev/v1/agents", None, ("create", "agents", "")),
            (Method::GET, "/apis/hive.dev/v1/agents", None, ("list", "agents", "")),
            (
                Method::GET,
                "/apis/hive.dev/v1/agents",
                Some("watch=true&resourceVersion=3"),
                ("watch", "agents", ""),
            ),
            (Method::GET, "/apis/hive.dev/v1/agents/a", None, ("get", "agents", "")),
            (Method::PATCH, "/apis/hive.dev/v1/agents/a/status", None, ("patch", "agents", "status")),
            (Method::DELETE, "/apis/hive.dev/v1/agents/a", None, ("delete", "agents", "")),
            (Method::DELETE, "/apis/hive.dev/v1/agents", None, ("deletecollection", "agents", "")),
            (Method::PUT, "/apis/hive.dev/v1/jobs/j", None, ("update", "jobs", "")),
            (Method::POST, "/apis/hive.dev/v1/jobs/j/cancel", None, ("create", "jobs", "cancel")),
            (Method::GET, "/api/v1/namespaces/default/events", None, ("list", "events", "")),
            (Method::GET, "/api/v1/events", Some("watch=1"), ("watch", "events", "")),
            (Method::GET, "/hive/v1/fleet/nodes/n1/telemetry", None, ("get", "nodes", "telemetry")),
            (Method::GET, "/hive/v1/fleet/offers", None, ("list", "offers", "")),
            (Method::POST, "/hive/v1/tokens", None, ("create", "tokens", "")),
            (Method::GET, "/metrics", None, ("list", "metrics", "")),
            (Method::GET, "/apis/hive.dev/v1", None, ("get", "", "")),
            (Method::GET, "/apis/hive.dev/v1/made-up-thing/x/y", None, ("get", "", "")),
            (Method::GET, "/apis/hive.dev/v1/agents/a/made-up", None, ("get", "agents", "")),
            (Method::GET, "/agents/alpha", None, ("get", "", "")),
        ];
        for (method, path, query, (verb, resource, subresource)) in cases {
            let got = classify(method, path, *query);
            assert_eq!(
                (got.verb, got.resource, got.subresource),
                (*verb, *resource, *subresource),
                "{method} {path} {query:?}"
            );
        }
    }
}
