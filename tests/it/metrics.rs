//! `/metrics` through the real daemon: a small scenario (create, list, get, watch,
//! patch, delete, a Job, a fleet provision with the process provider), scraped with a
//! viewer token and on `--metrics-listen`, checked by a real Prometheus parser
//! (`promtool check metrics`, Debian's `prometheus` package) and by the values the
//! scenario must have moved.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::agents::wait_terminal;
use crate::harness::{agent, eventually, Api, Daemon};

const AGENTS: &str = "/apis/hive.dev/v1/agents";

/// One scrape, parsed into samples.
struct Scrape {
    text: String,
}

impl Scrape {
    /// The value of the sample `name` whose labels include every pair of `labels`
    /// (summed over the samples that match, so a subset of the labels adds up the
    /// rest); 0 when there is none.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut total = 0.0;
        for line in self.text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let (series, value) = line.rsplit_once(' ').expect("a sample line has a value");
            let (metric, rendered) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                continue;
            }
            let pairs: Vec<(&str, &str)> = rendered
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').expect("label=value");
                    (k, v.trim_matches('"'))
                })
                .collect();
            if labels.iter().all(|want| pairs.contains(want)) {
                total += value.parse::<f64>().unwrap_or_else(|_| panic!("a number in {line:?}"));
            }
        }
        total
    }

    /// Whether a family of this name is declared.
    fn declares(&self, name: &str) -> bool {
        self.text.lines().any(|l| l.starts_with(&format!("# TYPE {name} ")))
    }
}

/// `/metrics` as `api` sees it, after `promtool check metrics` accepted it.
async fn scrape(api: &Api) -> Scrape {
    let reply = api.get("/metrics").await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    let content_type = reply.headers["content-type"].to_str().unwrap();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let text = reply.body.as_str().expect("metrics are text").to_string();
    promtool_accepts(&text);
    Scrape { text }
}

/// `promtool check metrics` (the Prometheus parser and linter) accepts `text`.
fn promtool_accepts(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs (Debian package `prometheus`; .ci/run installs it)");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics refused the scrape:\n{}{}\n---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A port free right now on 127.0.0.1, for a flag that needs one before the start.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_a_scenario_did_and_promtool_parses_them() {
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let d = Daemon::start_with(&["--metrics-listen", &metrics_addr]);
    let admin = d.client();
    let created = admin.post("/hive/v1/tokens", &json!({"name": "scraper", "role": "viewer"})).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    let viewer = d.client_with(created.body["token"].as_str());

    let anonymous = d.client_with(None).get("/metrics").await;
    assert_eq!(anonymous.code, 401, "{:?}", anonymous.body);
    assert_eq!(anonymous.body["reason"], "Unauthorized");

    let before = scrape(&viewer).await;

    // The API part: a watch open throughout, three creates and a conflicting one, a
    // list, a get, a patch and a delete.
    let mut watch = admin
        .watch(&format!("{AGENTS}?watch=true&resourceVersion={}", before.value("hive_store_revision", &[])))
        .await;
    for name in ["m0", "m1", "m2"] {
        let reply = admin.post(AGENTS, &agent(name)).await;
        assert_eq!(reply.code, 201, "{:?}", reply.body);
    }
    assert_eq!(admin.post(AGENTS, &agent("m0")).await.code, 409);
    assert_eq!(admin.get(AGENTS).await.code, 200);
    assert_eq!(admin.get(&format!("{AGENTS}/m1")).await.code, 200);
    let patched = admin
        .patch(
            &format!("{AGENTS}/m1"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"tier": "x"}}}),
        )
        .await;
    assert_eq!(patched.code, 200, "{:?}", patched.body);
    assert_eq!(admin.delete(&format!("{AGENTS}/m2")).await.code, 200);
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let event =
            watch.next(Duration::from_secs(30)).await.expect("the watch delivers the scenario's events");
        seen.push(event["type"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(seen, ["ADDED", "ADDED", "ADDED", "MODIFIED", "DELETED"]);

    let during = scrape(&viewer).await;
    let moved = |name: &str, labels: &[(&str, &str)]| during.value(name, labels) - before.value(name, labels);
    let agents = ("resource", "agents");
    assert_eq!(moved("apiserver_request_total", &[("verb", "create"), agents, ("code", "201")]), 3.0);
    assert_eq!(moved("apiserver_request_total", &[("verb", "create"), agents, ("code", "409")]), 1.0);
    assert_eq!(moved("apiserver_request_total", &[("verb", "list"), agents, ("code", "200")]), 1.0);
    assert_eq!(moved("apiserver_request_total", &[("verb", "get"), agents, ("code", "200")]), 1.0);
    assert_eq!(moved("apiserver_request_total", &[("verb", "patch"), agents, ("code", "200")]), 1.0);
    assert_eq!(moved("apiserver_request_total", &[("verb", "delete"), agents, ("code", "200")]), 1.0);
    assert_eq!(moved("apiserver_request_duration_seconds_count", &[("verb", "create"), agents]), 4.0);
    // The watch is open, is no in-flight request, and is out of the latency histogram.
    assert_eq!(during.value("apiserver_longrunning_requests", &[("verb", "watch"), agents]), 1.0);
    assert_eq!(during.value("apiserver_request_duration_seconds_count", &[("verb", "watch")]), 0.0);
    assert_eq!(moved("apiserver_watch_events_total", &[agents]), 5.0);
    assert_eq!(during.value("apiserver_storage_objects", &[agents]), 2.0);
    assert!(during.value("hive_store_revision", &[]) > before.value("hive_store_revision", &[]));
    let batches = moved("hive_store_commit_batch_size_count", &[]);
    assert!((1.0..=6.0).contains(&batches), "5 writes (and the token) in 1..=6 batches: {batches}");
    assert_eq!(moved("hive_store_commit_duration_seconds_count", &[]), batches);
    assert!(during.value("hive_store_events", &[]) >= 5.0);
    assert!(during.value("hive_store_event_bytes", &[]) > 0.0);
    assert_eq!(during.value("hive_agent_restarts", &[("agent", "m0")]), 0.0);
    assert!(during.text.contains(r#"hive_agent_restarts{agent="m1"} 0"#), "{}", during.text);

    // The audit log's writer counts the six mutations (three creates, the conflict, the
    // patch, the delete) once it has written them; reads are not audited by default.
    let audited = eventually("the six mutations in hive_audit_events_total", || async {
        let now = scrape(&viewer).await;
        let written =
            now.value("hive_audit_events_total", &[]) - before.value("hive_audit_events_total", &[]);
        (written >= 6.0).then_some((written, now))
    })
    .await;
    assert_eq!(audited.0, 6.0, "one line per mutation, none per read or scrape");
    assert_eq!(audited.1.value("hive_audit_dropped_total", &[]), 0.0);
    assert_eq!(audited.1.value("hive_audit_failed_total", &[]), 0.0);

    drop(watch);
    eventually("the closed watch to leave apiserver_longrunning_requests", || async {
        let now = scrape(&viewer).await;
        (now.value("apiserver_longrunning_requests", &[("verb", "watch"), agents]) == 0.0).then_some(())
    })
    .await;

    // The scheduler part: one Job of one Reconcile node, run to its end.
    let job = admin
        .post(
            "/apis/hive.dev/v1/jobs",
            &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "reconcile-m0"},
                    "spec": {"template": "Reconcile", "nodes": [{"id": "r", "kind": "Reconcile", "agent": "m0"}]}}),
        )
        .await;
    assert_eq!(job.code, 201, "{:?}", job.body);
    wait_terminal(&admin, job.body["metadata"]["name"].as_str().unwrap()).await;

    // The fleet part: one process worker, provisioned and Running.
    let provision = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "one"},
                           "spec": {"provision": {"provider": "process", "count": 1}}});
    assert_eq!(admin.post("/apis/hive.dev/v1/fleetcommands", &provision).await.code, 201);
    let after = eventually("the provisioned node to be Running in hive_fleet_nodes", || async {
        let now = scrape(&viewer).await;
        (now.value("hive_fleet_nodes", &[("phase", "Running"), ("provider", "process")]) == 1.0)
            .then_some(now)
    })
    .await;
    let moved = |name: &str, labels: &[(&str, &str)]| after.value(name, labels) - during.value(name, labels);
    assert_eq!(moved("hive_scheduler_node_duration_seconds_count", &[("kind", "Reconcile")]), 1.0);
    // The Job intake (the Job controller) took the Job; the Provider controller checked
    // the built-in providers.
    assert!(moved("controller_runtime_reconcile_total", &[("controller", "Job")]) >= 1.0, "{}", after.text);
    assert!(
        after.value("controller_runtime_reconcile_time_seconds_count", &[("controller", "Provider")]) >= 1.0
    );
    assert!(after.text.contains(r#"workqueue_depth{name="Job"} "#), "{}", after.text);
    assert_eq!(after.value("hive_scheduler_build_slots", &[]), 1.0);
    assert_eq!(after.value("hive_scheduler_build_slots_in_use", &[]), 0.0);
    assert_eq!(after.value("apiserver_storage_objects", &[("resource", "nodes")]), 1.0);
    assert_eq!(
        moved("apiserver_request_total", &[("verb", "create"), ("resource", "jobs"), ("code", "201")]),
        1.0
    );
    assert_eq!(
        moved(
            "apiserver_request_total",
            &[("verb", "create"), ("resource", "fleetcommands"), ("code", "201")]
        ),
        1.0
    );

    // Every family is there once the scenario touched it (a labelled family shows once it
    // has a series; hive_scheduler_running_nodes only while a node runs).
    for family in [
        "apiserver_request_total",
        "apiserver_request_duration_seconds",
        "apiserver_current_inflight_requests",
        "apiserver_longrunning_requests",
        "apiserver_watch_events_total",
        "hive_watch_dropped_total",
        "hive_store_commit_duration_seconds",
        "hive_store_commit_batch_size",
        "apiserver_storage_objects",
        "hive_store_revision",
        "hive_store_events",
        "hive_store_event_bytes",
        "hive_store_compacted_revision",
        "hive_scheduler_queued_nodes",
        "hive_scheduler_lease_waits",
        "hive_scheduler_build_slots",
        "hive_scheduler_build_slots_in_use",
        "hive_scheduler_node_duration_seconds",
        "hive_fleet_nodes",
        "hive_agent_restarts",
        "hive_audit_events_total",
        "hive_audit_dropped_total",
        "hive_audit_failed_total",
        "controller_runtime_reconcile_time_seconds",
        "controller_runtime_reconcile_total",
        "workqueue_depth",
    ] {
        assert!(after.declares(family), "{family} is not exported:\n{}", after.text);
    }

    // deploy/grafana-dashboard.json charts only families this daemon exports.
    let charted = dashboard_metrics();
    assert!(charted.len() >= 15, "{charted:?}");
    for name in &charted {
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|suffix| name.strip_suffix(suffix));
        let exported = after.declares(name) || base.is_some_and(|base| after.declares(base));
        assert!(exported, "deploy/grafana-dashboard.json charts {name}, which /metrics does not export");
    }

    // OpenMetrics for a client that asks for it (Prometheus does).
    let openmetrics = viewer
        .http
        .get(format!("{}/metrics", viewer.base))
        .bearer_auth(viewer.token())
        .header("accept", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
        .send()
        .await
        .unwrap();
    assert!(
        openmetrics.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"),
        "{:?}",
        openmetrics.headers()
    );
    let text = openmetrics.text().await.unwrap();
    assert!(text.contains("# TYPE apiserver_request counter"), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");

    // --metrics-listen: plain HTTP, no token.
    let plain = reqwest::Client::new().get(format!("http://{metrics_addr}/metrics")).send().await.unwrap();
    assert_eq!(plain.status().as_u16(), 200);
    let plain = Scrape { text: plain.text().await.unwrap() };
    promtool_accepts(&plain.text);
    assert_eq!(plain.value("apiserver_storage_objects", &[agents]), 2.0);
}

/// Every metric name the dashboard's queries use: the identifiers of its `expr`s that
/// start with one of hive's family prefixes.
fn dashboard_metrics() -> std::collections::BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("the dashboard has panels");
    let mut names = std::collections::BTreeSet::new();
    for panel in panels {
        assert!(panel["title"].is_string(), "{panel}");
        let targets = panel["targets"].as_array().expect("each panel has targets");
        for expr in targets.iter().map(|t| t["expr"].as_str().expect("each target has an expr")) {
            let identifiers = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
            for word in identifiers {
                if ["apiserver_", "hive_", "controller_runtime_", "workqueue_"]
                    .iter()
                    .any(|p| word.starts_with(p))
                {
                    names.insert(word.to_string());
                }
            }
        }
    }
    names
}

/// deploy/prometheus.yml is a Prometheus configuration (`promtool check config`; its
/// token and CA files are the host's, so syntax only).
#[test]
fn the_scrape_config_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus.yml");
    let out = Command::new("promtool")
        .args(["check", "config", "--syntax-only", path])
        .output()
        .expect("promtool runs (Debian package `prometheus`; .ci/run installs it)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains("127.0.0.1:9464") && text.contains("--metrics-listen"), "{text}");
}
