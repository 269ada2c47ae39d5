//! The Vast.ai provider client against an in-process stand-in that speaks the documented
//! API (`/api/v0/bundles/`, `/api/v0/asks/{id}/`, `/api/v0/instances/{id}/`,
//! `/api/v1/instances/`, `/api/v0/users/current/`) on 127.0.0.1:0. The stand-in checks
//! the Bearer key, records every create with its offer id and label, and can be told to
//! answer 429, to fail a create after (or before) recording it, to drop the connection,
//! or to hang.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use hive::fleet::providers::vastai::{
    instance_label, ApiKey, Destroyed, InstanceId, RetryPolicy, VastClient, VastConfig, VastError,
};
use hive_api::provider::{OfferFilter, ProviderState};
use serde_json::{json, Value};
use tokio::sync::Notify;

pub(crate) const KEY: &str = "vast-test-key-5f1c0a9e3b7d4c21";

/// What the stand-in does to the next create.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// Rent, then drop the connection without answering.
    Drop,
    /// Rent, then answer this (5xx) status.
    FailAfter(u16),
    /// Rent, then never answer (the client times out).
    Hang,
    /// Answer this status without renting.
    FailBefore(u16),
}

#[derive(Default)]
pub(crate) struct Inner {
    offers: Vec<Value>,
    pub(crate) instances: BTreeMap<u64, Value>,
    next_id: u64,
    /// Every rental: (offer id, label).
    rentals: Vec<(u64, String)>,
    /// Every request: `METHOD /path`.
    pub(crate) requests: Vec<String>,
    /// 429s still to answer, each with its optional Retry-After (seconds).
    throttle: VecDeque<Option<u64>>,
    /// Faults for the next creates, in order.
    faults: VecDeque<Fault>,
    page_size: usize,
    /// Whether any request carried the key in its URL.
    pub(crate) key_in_url: bool,
    last_query: Value,
    pub(crate) last_create: Value,
    /// List calls still to answer as if the list lagged: without any instance.
    lagging_lists: u32,
}

#[derive(Clone)]
pub(crate) struct Stand {
    inner: Arc<Mutex<Inner>>,
    drop_connections: Arc<Notify>,
}

fn offer(id: u64, gpu: &str, gpus: u32, price: f64, geo: &str) -> Value {
    json!({"id": id, "ask_contract_id": id, "machine_id": id + 1000, "host_id": 7, "gpu_name": gpu,
           "num_gpus": gpus, "gpu_ram": 24564, "dph_total": price, "reliability2": 0.99,
           "verification": "verified", "verified": true, "geolocation": geo, "rentable": true,
           "rented": false, "external": false, "disk_space": 200.0, "cuda_max_good": 12.8})
}

pub(crate) fn offers() -> Vec<Value> {
    let mut rented = offer(106, "RTX 4090", 1, 0.20, "Austin, US");
    rented["rented"] = json!(true);
    vec![
        offer(101, "RTX 4090", 1, 0.35, "Austin, US"),
        offer(102, "RTX 4090", 1, 0.45, "Berlin, DE"),
        offer(103, "RTX 4090", 1, 0.65, "Austin, US"),
        offer(104, "RTX 4090", 2, 0.40, "Austin, US"),
        offer(105, "H100 SXM", 1, 0.30, "Austin, US"),
        rented,
    ]
}

/// The stand-in's reading of one `field: {op: value}` constraint.
fn passes(q: &Value, offer: &Value) -> bool {
    let Some(q) = q.as_object() else { return true };
    q.iter().all(|(field, cond)| {
        let Some(ops) = cond.as_object() else { return true };
        let have = if field == "geolocation" {
            json!(offer[field].as_str().and_then(|g| g.rsplit(", ").next()).unwrap_or(""))
        } else if offer[field].is_null() {
            json!(false)
        } else {
            offer[field].clone()
        };
        ops.iter().all(|(op, want)| {
            let (h, w) = (have.as_f64().unwrap_or(f64::NAN), want.as_f64().unwrap_or(f64::NAN));
            match op.as_str() {
                "eq" => &have == want,
                "neq" => &have != want,
                "gt" => h > w,
                "gte" => h >= w,
                "lt" => h < w,
                "lte" => h <= w,
                "in" => want.as_array().is_some_and(|a| a.contains(&have)),
                "notin" => want.as_array().is_some_and(|a| !a.contains(&have)),
                _ => false,
            }
        })
    })
}

fn reply(code: u16, body: Value) -> Response {
    (StatusCode::from_u16(code).unwrap(), Json(body)).into_response()
}

impl Stand {
    pub(crate) async fn start(offers: Vec<Value>) -> (Stand, String) {
        let stand = Stand {
            inner: Arc::new(Mutex::new(Inner { offers, next_id: 5000, page_size: 25, ..Default::default() })),
            drop_connections: Arc::new(Notify::new()),
        };
        let app = Router::new()
            .route("/api/v0/bundles/", post(search))
            .route("/api/v0/asks/{id}/", put(create))
            .route("/api/v0/instances/{id}/", get(show).delete(destroy))
            .route("/api/v1/instances/", get(list))
            .route("/api/v0/users/current/", get(user))
            .with_state(stand.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let drop_connections = stand.drop_connections.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let service = hyper_util::service::TowerToHyperService::new(app.clone());
                let dropper = drop_connections.clone();
                tokio::spawn(async move {
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
                    // Told to, the connection is dropped mid-request: no answer at all.
                    tokio::select! {
                        _ = conn => {}
                        _ = dropper.notified() => {}
                    }
                });
            }
        });
        (stand, format!("http://{addr}/api/v0"))
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn rentals(&self) -> Vec<(u64, String)> {
        self.lock().rentals.clone()
    }

    pub(crate) fn count(&self, prefix: &str) -> usize {
        self.lock().requests.iter().filter(|r| r.starts_with(prefix)).count()
    }

    /// The common front of every route: records the request, checks the key, throttles.
    fn gate(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Option<Response> {
        let mut inner = self.lock();
        inner.requests.push(format!("{method} {}", uri.path()));
        if uri.to_string().contains("api_key") || uri.to_string().contains(KEY) {
            inner.key_in_url = true;
        }
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        if auth != format!("Bearer {KEY}") {
            // Like a careless server, it echoes what it was given.
            return Some(reply(
                401,
                json!({"success": false, "error": "invalid_user_key", "msg": format!("bad key: {auth}")}),
            ));
        }
        if let Some(retry_after) = inner.throttle.pop_front() {
            let mut response =
                (StatusCode::TOO_MANY_REQUESTS, "API requests too frequent endpoint threshold=4.5")
                    .into_response();
            if let Some(secs) = retry_after {
                response.headers_mut().insert("retry-after", secs.to_string().parse().unwrap());
            }
            return Some(response);
        }
        None
    }
}

async fn search(
    State(s): State<Stand>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Json(q): Json<Value>,
) -> Response {
    if let Some(r) = s.gate(&method, &uri, &headers) {
        return r;
    }
    let mut inner = s.lock();
    inner.last_query = q.clone();
    let found: Vec<Value> = inner.offers.iter().filter(|o| passes(&q, o)).cloned().collect();
    reply(200, json!({"offers": found}))
}

async fn create(
    State(s): State<Stand>,
    Path(id): Path<u64>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Some(r) = s.gate(&method, &uri, &headers) {
        return r;
    }
    let (fault, new) = {
        let mut inner = s.lock();
        inner.last_create = body.clone();
        let fault = inner.faults.pop_front();
        if let Some(Fault::FailBefore(code)) = fault {
            let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            return reply(
                code,
                json!({"success": false, "error": "internal", "msg": format!("failed handling {auth}")}),
            );
        }
        let Some(offer) = inner.offers.iter_mut().find(|o| o["id"] == id && o["rented"] == false) else {
            return reply(
                404,
                json!({"success": false, "error": "no_such_ask", "msg": format!("Ask {id} is no longer available")}),
            );
        };
        offer["rented"] = json!(true);
        let gpu = offer["gpu_name"].clone();
        let label = body["label"].as_str().unwrap_or("").to_string();
        inner.next_id += 1;
        let new = inner.next_id;
        inner.rentals.push((id, label.clone()));
        inner.instances.insert(
            new,
            json!({"id": new, "label": label, "actual_status": null, "intended_status": "running",
                   "gpu_name": gpu, "num_gpus": 1, "machine_id": id + 1000, "ssh_host": "ssh4.vast.ai",
                   "ssh_port": 41234, "image_uuid": body["image"]}),
        );
        (fault, new)
    };
    match fault {
        Some(Fault::Drop) => {
            s.drop_connections.notify_waiters();
            std::future::pending::<()>().await;
            unreachable!()
        }
        Some(Fault::Hang) => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        Some(Fault::FailAfter(code)) => reply(code, json!({"success": false, "error": "server_error"})),
        _ => reply(200, json!({"success": true, "new_contract": new})),
    }
}

async fn show(
    State(s): State<Stand>,
    Path(id): Path<u64>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.gate(&method, &uri, &headers) {
        return r;
    }
    let instance = s.lock().instances.get(&id).cloned().unwrap_or(Value::Null);
    reply(200, json!({"instances": instance}))
}

async fn destroy(
    State(s): State<Stand>,
    Path(id): Path<u64>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.gate(&method, &uri, &headers) {
        return r;
    }
    match s.lock().instances.remove(&id) {
        Some(_) => reply(200, json!({"success": true, "msg": "destroying instance"})),
        None => reply(404, json!({"success": false, "error": "no_such_instance", "msg": "no such instance"})),
    }
}

async fn list(
    State(s): State<Stand>,
    Query(q): Query<BTreeMap<String, String>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.gate(&method, &uri, &headers) {
        return r;
    }
    let mut inner = s.lock();
    if inner.lagging_lists > 0 {
        inner.lagging_lists -= 1;
        return reply(200, json!({"instances": [], "instances_found": 0, "next_token": null}));
    }
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(25).min(inner.page_size);
    let after: u64 = q.get("after_token").and_then(|t| t.parse().ok()).unwrap_or(0);
    let page: Vec<Value> = inner.instances.range(after + 1..).take(limit).map(|(_, v)| v.clone()).collect();
    let last = page.last().and_then(|v| v["id"].as_u64());
    let more = last.is_some_and(|l| inner.instances.range(l + 1..).next().is_some());
    let next = if more { json!(last.unwrap().to_string()) } else { Value::Null };
    reply(200, json!({"instances": page, "instances_found": inner.instances.len(), "next_token": next}))
}

async fn user(State(s): State<Stand>, method: Method, uri: Uri, headers: HeaderMap) -> Response {
    if let Some(r) = s.gate(&method, &uri, &headers) {
        return r;
    }
    reply(200, json!({"id": 4242, "username": "tester", "credit": 12.5}))
}

fn config(base: &str, key: &str) -> VastConfig {
    let mut config = VastConfig::new(ApiKey::new(key).unwrap());
    config.base_url = base.to_string();
    config.request_timeout = Duration::from_secs(5);
    config.retry = RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(40),
        max_retry_after: Duration::from_secs(5),
    };
    config.settle = Duration::ZERO;
    config
}

fn client(base: &str) -> VastClient {
    VastClient::new(config(base, KEY)).unwrap()
}

/// A log buffer every `tracing` event of the current thread goes to.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .finish();
        (logs.clone(), tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

fn ids<T>(items: &[T], id: impl Fn(&T) -> u64) -> Vec<u64> {
    items.iter().map(id).collect()
}

#[tokio::test]
async fn search_returns_only_the_matching_offers() {
    let (stand, base) = Stand::start(offers()).await;
    let filter = OfferFilter {
        gpu_name: Some("RTX 4090".into()),
        num_gpus: Some(1),
        max_dollars_per_hour: Some(0.5),
        ..Default::default()
    };
    let found = client(&base).search_offers(&filter).await.unwrap();
    assert_eq!(ids(&found, |o| o.id), [101, 102], "cheapest first, rented 106 excluded");
    assert_eq!(found[0].country(), Some("US"));
    let q = stand.lock().last_query.clone();
    assert_eq!(q["gpu_name"], json!({"eq": "RTX 4090"}));
    assert_eq!(q["dph_total"], json!({"lte": 0.5}));
    assert_eq!(q["num_gpus"], json!({"eq": 1}));
    let germany = OfferFilter { geolocation: vec!["DE".into()], ..filter };
    assert_eq!(ids(&client(&base).search_offers(&germany).await.unwrap(), |o| o.id), [102]);
    assert!(stand.rentals().is_empty(), "a search leases nothing");
}

#[tokio::test]
async fn create_leases_exactly_the_offer_asked_for() {
    let (stand, base) = Stand::start(offers()).await;
    let c = client(&base);
    let label = instance_label("cmd-1", "node-1");
    let id = c.create(102, &label, "ghcr.io/example/node:cuda", Some("echo boot")).await.unwrap();
    assert_eq!(stand.rentals(), [(102, label.clone())]);
    let sent = stand.lock().last_create.clone();
    assert_eq!(
        (sent["image"].as_str(), sent["onstart"].as_str()),
        (Some("ghcr.io/example/node:cuda"), Some("echo boot"))
    );
    let shown = c.show(id).await.unwrap().expect("the instance exists");
    assert_eq!((shown.id, shown.label.as_deref()), (id, Some(label.as_str())));
    assert_eq!((shown.ssh_host.as_deref(), shown.ssh_port), (Some("ssh4.vast.ai"), Some(41234)));
    assert_eq!(c.show(InstanceId(1)).await.unwrap(), None);
    assert!(!stand.lock().key_in_url);
}

#[tokio::test]
async fn an_ambiguous_create_is_settled_by_its_label_and_adopted() {
    for fault in [Fault::Drop, Fault::FailAfter(500), Fault::FailAfter(502), Fault::Hang] {
        let (logs, guard) = Logs::capture();
        let (stand, base) = Stand::start(offers()).await;
        stand.lock().faults.push_back(fault);
        let mut config = config(&base, KEY);
        config.request_timeout = Duration::from_millis(700);
        let c = VastClient::new(config).unwrap();
        let label = instance_label("cmd-7", "node-3");
        let created = c
            .create_instance(&hive::fleet::providers::vastai::CreateRequest::new(
                101,
                label.clone(),
                "img",
                None,
            ))
            .await
            .unwrap_or_else(|e| panic!("{fault:?}: {e}"));
        let recorded = *stand.lock().instances.keys().next().unwrap();
        assert!(created.adopted, "{fault:?}");
        assert_eq!(created.id, InstanceId(recorded), "{fault:?}");
        assert_eq!((created.creates_sent, created.duplicates.len()), (1, 0), "{fault:?}");
        assert_eq!(stand.rentals(), [(101, label)], "{fault:?}: exactly one rental");
        assert_eq!(stand.count("PUT "), 1, "{fault:?}: no second create");
        assert_eq!(stand.count("GET /api/v1/instances/"), 1, "{fault:?}: one lookup by label");
        // Each fault took its own path to the ambiguity.
        let log = logs.text();
        let reason = match fault {
            Fault::Hang => "timed out",
            Fault::FailAfter(500) => "HTTP 500",
            Fault::FailAfter(_) => "HTTP 502",
            _ => "connection closed",
        };
        assert!(log.contains(reason), "{fault:?}: {log}");
        drop(guard);
    }
}

#[tokio::test]
async fn an_ambiguous_failure_with_nothing_rented_is_retried_exactly_once() {
    let (logs, _guard) = Logs::capture();
    let (stand, base) = Stand::start(offers()).await;
    stand.lock().faults.push_back(Fault::FailBefore(500));
    let label = instance_label("cmd-8", "node-4");
    let created = client(&base)
        .create_instance(&hive::fleet::providers::vastai::CreateRequest::new(101, label.clone(), "img", None))
        .await
        .unwrap();
    assert_eq!((created.adopted, created.creates_sent), (false, 2));
    assert_eq!(stand.rentals(), [(101, label.clone())]);
    let order: Vec<String> = stand.lock().requests.clone();
    assert_eq!(order, ["PUT /api/v0/asks/101/", "GET /api/v1/instances/", "PUT /api/v0/asks/101/"]);

    // Failing twice: two creates, never a third, and an error saying the outcome is unknown.
    let (stand, base) = Stand::start(offers()).await;
    stand.lock().faults.extend([Fault::FailBefore(503), Fault::FailBefore(500)]);
    let err = client(&base).create(101, &label, "img", None).await.unwrap_err();
    assert!(matches!(err, VastError::Ambiguous { offer_id: 101, .. }), "{err}");
    assert_eq!(stand.count("PUT "), 2);
    assert!(stand.rentals().is_empty());
    let text = err.to_string();
    assert!(!text.contains(KEY) && text.contains("[redacted]"), "the server echoed the key: {text}");
    assert!(!logs.text().contains(KEY));
}

#[tokio::test]
async fn rate_limits_are_backed_off_boundedly() {
    let (logs, _guard) = Logs::capture();
    let (stand, base) = Stand::start(offers()).await;
    let c = client(&base);
    stand.lock().throttle.extend([None, Some(1)]);
    let found = c.search_offers(&OfferFilter::default()).await.unwrap();
    assert_eq!(found.len(), 5);
    assert_eq!(stand.count("POST /api/v0/bundles/"), 3, "two 429s, then success");
    let text = logs.text();
    assert_eq!(text.matches("backing off").count(), 2, "{text}");
    assert!(
        text.contains("retry_after_ms=1000") && text.contains("delay_ms=1000"),
        "Retry-After honoured: {text}"
    );

    // A create is backed off too, and still rents once.
    stand.lock().throttle.extend([None, None]);
    c.create(101, &instance_label("c", "node-1"), "img", None).await.unwrap();
    assert_eq!(stand.count("PUT "), 3);
    assert_eq!(stand.rentals().len(), 1);

    // Bounded: four attempts, then an error.
    stand.lock().throttle.extend([None; 10]);
    let err = c.show(InstanceId(5001)).await.unwrap_err();
    assert!(matches!(err, VastError::RateLimited { what: "show", attempts: 4 }), "{err}");
    assert_eq!(stand.count("GET /api/v0/instances/"), 4);

    // A Retry-After beyond the policy is not waited for.
    stand.lock().throttle.clear();
    stand.lock().throttle.push_back(Some(600));
    let err = c.show(InstanceId(5001)).await.unwrap_err();
    assert!(matches!(err, VastError::RateLimited { attempts: 1, .. }), "{err}");
}

#[tokio::test]
async fn destroy_twice_the_second_is_a_no_op() {
    let (stand, base) = Stand::start(offers()).await;
    let c = client(&base);
    let id = c.create(101, &instance_label("c", "node-1"), "img", None).await.unwrap();
    assert_eq!(c.destroy(id).await.unwrap(), Destroyed::Destroyed);
    assert_eq!(c.destroy(id).await.unwrap(), Destroyed::AlreadyGone);
    assert_eq!(c.show(id).await.unwrap(), None);
    assert_eq!(stand.count("DELETE "), 2);
}

#[tokio::test]
async fn a_wrong_key_is_a_configuration_error_and_no_key_ever_leaks() {
    let (logs, _guard) = Logs::capture();
    let (stand, base) = Stand::start(offers()).await;
    let wrong = "wrong-key-7d3e9a1b2c4f8e6a";
    let bad = VastClient::new(config(&base, wrong)).unwrap();
    let readiness = bad.validate().await;
    assert_eq!(readiness.state, ProviderState::ConfigurationError);
    assert!(readiness.message.contains("refused the API key"), "{}", readiness.message);
    let mut texts = vec![readiness.message.clone(), format!("{bad:?}")];
    let errors = [
        bad.search_offers(&OfferFilter::default()).await.unwrap_err(),
        bad.create(101, &instance_label("c", "node-1"), "img", None).await.unwrap_err(),
        bad.show(InstanceId(1)).await.unwrap_err(),
        bad.destroy(InstanceId(1)).await.unwrap_err(),
        bad.list_by_label("hive:").await.unwrap_err(),
    ];
    for err in &errors {
        assert!(matches!(err, VastError::Unauthorized { status: 401 }), "{err}");
        texts.push(err.to_string());
        texts.push(format!("{err:?}"));
    }
    assert!(stand.rentals().is_empty());

    let good = client(&base);
    let readiness = good.validate().await;
    assert_eq!(readiness.state, ProviderState::Ready, "{}", readiness.message);
    texts.push(readiness.message);
    texts.push(format!("{good:?}"));
    // An error whose server text echoes the key.
    stand.lock().faults.extend([Fault::FailBefore(500), Fault::FailBefore(500)]);
    let echoed = good.create(101, &instance_label("c", "node-2"), "img", None).await.unwrap_err();
    texts.push(echoed.to_string());
    texts.push(format!("{echoed:?}"));

    let log = logs.text();
    assert!(log.contains("vast.ai"), "the test saw the client's log lines: {log}");
    texts.push(log);
    for text in texts {
        assert!(!text.contains(wrong) && !text.contains(KEY), "a key leaked: {text}");
    }
    assert!(!stand.lock().key_in_url, "the key is sent only as a header");
}

#[tokio::test]
async fn a_stale_offer_is_never_rented() {
    let (stand, base) = Stand::start(offers()).await;
    let c = client(&base);
    for stale in [999, 106] {
        let err = c.create(stale, &instance_label("c", "node-1"), "img", None).await.unwrap_err();
        match &err {
            VastError::OfferUnavailable { offer_id, .. } => assert_eq!(*offer_id, stale),
            other => panic!("{other}"),
        }
        assert!(err.to_string().contains("no longer available"), "{err}");
    }
    assert!(stand.rentals().is_empty());
    assert_eq!(stand.count("PUT "), 2, "no retry, no other offer");
    // Once rented, an offer is stale for the next command too.
    c.create(101, &instance_label("a", "node-2"), "img", None).await.unwrap();
    let err = c.create(101, &instance_label("b", "node-3"), "img", None).await.unwrap_err();
    assert!(matches!(err, VastError::OfferUnavailable { offer_id: 101, .. }), "{err}");
    assert_eq!(stand.rentals().len(), 1);
}

#[tokio::test]
async fn list_by_label_reads_every_page() {
    let (stand, base) = Stand::start(offers()).await;
    stand.lock().page_size = 2;
    let c = client(&base);
    for (offer, node) in [(101, "node-1"), (102, "node-2"), (103, "node-10"), (104, "node-11")] {
        c.create(offer, &instance_label("cmd", node), "img", None).await.unwrap();
    }
    stand.lock().instances.insert(9999, json!({"id": 9999, "label": "someone-else"}));
    let ours = c.list_by_label("hive:").await.unwrap();
    assert_eq!(ours.len(), 4);
    assert_eq!(c.list_instances().await.unwrap().len(), 5);
    assert_eq!(stand.count("GET /api/v1/instances/"), 6, "three pages each");
    let one = c.list_by_label(&instance_label("cmd", "node-1")).await.unwrap();
    assert_eq!(one.len(), 3, "a prefix: node-1, node-10, node-11");
}

#[tokio::test]
async fn a_lagging_list_never_causes_a_second_rental() {
    let label = instance_label("cmd-9", "node-5");
    let request = hive::fleet::providers::vastai::CreateRequest::new(101, label.clone(), "img", None);

    // Without a settle wait: the retry finds the offer taken, looks again, adopts.
    let (stand, base) = Stand::start(offers()).await;
    stand.lock().faults.push_back(Fault::FailAfter(500));
    stand.lock().lagging_lists = 1;
    let created = client(&base).create_instance(&request).await.unwrap();
    assert_eq!((created.adopted, created.creates_sent), (true, 2));
    assert_eq!(stand.rentals(), [(101, label.clone())], "exactly one rental");

    // With a settle wait: the second look finds it before any retry.
    let (stand, base) = Stand::start(offers()).await;
    stand.lock().faults.push_back(Fault::FailAfter(500));
    stand.lock().lagging_lists = 1;
    let mut config = config(&base, KEY);
    config.settle = Duration::from_millis(20);
    let created = VastClient::new(config).unwrap().create_instance(&request).await.unwrap();
    assert_eq!((created.adopted, created.creates_sent), (true, 1));
    assert_eq!(stand.count("PUT "), 1);
    assert_eq!(stand.rentals().len(), 1);
}
