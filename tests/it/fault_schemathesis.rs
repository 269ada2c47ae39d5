//! schemathesis (PyPI) against the real daemon's served OpenAPI document: generated and
//! boundary-value requests to every operation, checked for server errors, dropped
//! connections and conformance to the document (status codes, content types, response
//! schemas, negative data refused, auth not ignored). Runs only with
//! `HIVE_SCHEMATHESIS_TESTS=1` (`.ci/run` sets it and installs schemathesis); then any
//! failure fails.
//!
//! Bounded: a fixed seed, 10 examples per operation in the fuzzing phase beside the
//! coverage phase's boundary values, one worker, and a wall-clock limit. Every write
//! carries `dryRun=All`, so the run is admitted and validated in full but changes
//! nothing: no generated Job runs a generated command, no generated FleetCommand starts
//! workers, no generated Provider points the daemon at another host. Watches are left
//! out (`watch=false`): their answer is a stream of WatchEvents, not one JSON document.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{agent, Daemon};

/// The whole run is stopped (and the test fails) past this: a bound for a run that
/// hangs, not a measure of speed. The run is bounded by its seed and examples; on a slow
/// 2-core machine with a build beside it the coverage phase alone took 130 s.
const WALL_CLOCK: Duration = Duration::from_secs(480);

/// The schemathesis configuration: auth from the environment, the seeded objects' names
/// offered for every `{name}` and `metadata.name` half of the time, writes as dry runs.
const CONFIG: &str = r#"
headers = { Authorization = "Bearer ${HIVE_TOKEN}" }
request-timeout = 20.0

# A list naming a revision the store has not reached waits 3 s, then answers 504 Too
# large resource version, as kube-apiserver does: an answer the document lists.
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "504"]

[dictionaries.names]
values = ["fuzz", "process"]

[parameters]
"query.watch" = false
"query.dryRun" = "All"
"path.name" = { dictionary = "names", probability = 0.5 }
"body.metadata.name" = { dictionary = "names", probability = 0.5 }
"#;

fn schemathesis_version() -> Option<String> {
    let out = Command::new("schemathesis").arg("--version").output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_no_dropped_connection_and_no_nonconformance() {
    if std::env::var("HIVE_SCHEMATHESIS_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "skipped: set HIVE_SCHEMATHESIS_TESTS=1 to fuzz the API with schemathesis \
             (python3 -m pip install schemathesis)"
        );
        return;
    }
    let version = schemathesis_version()
        .expect("schemathesis is not installed: python3 -m pip install schemathesis (.ci/run does)");
    println!("{version}");

    let d = Daemon::start();
    let api = d.client();
    // Objects for the generated requests to find: an Agent (its repository a path that
    // does not exist, so nothing is ever fetched) and an Approval for it; the built-in
    // Provider `process` is there already.
    let mut fuzz = agent("fuzz");
    fuzz["spec"]["config"]["repo"] = json!(d.dir.join("no-such-repo").display().to_string());
    let created = api.post("/apis/hive.dev/v1/agents", &fuzz).await;
    assert_eq!(created.code, 201, "{}", created.body);
    let approval = json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": "fuzz"},
        "spec": {"kind": "ApplyCommit", "target": "fuzz", "payload": {"commit": "0123456789abcdef0123456789abcdef01234567"}}});
    let created = api.post("/apis/hive.dev/v1/approvals", &approval).await;
    assert_eq!(created.code, 201, "{}", created.body);
    let before = api.get("/apis/hive.dev/v1/agents/fuzz").await.body;

    let work = tempfile::tempdir().expect("tempdir");
    std::fs::write(work.path().join("schemathesis.toml"), CONFIG).unwrap();
    std::fs::write(work.path().join("ca.crt"), &d.ca_pem).unwrap();
    let started = Instant::now();
    let mut child = Command::new("schemathesis")
        .current_dir(work.path())
        .env("HIVE_TOKEN", &d.token)
        .args(["--config-file", "schemathesis.toml", "run"])
        .arg(format!("{}/openapi/v3/apis/hive.dev/v1", d.url))
        .args(["--url", &d.url, "--tls-verify", "ca.crt"])
        .args(["--seed", "1", "--max-examples", "10", "--workers", "1", "--phases", "coverage,fuzzing"])
        // Every check but positive_data_acceptance: the document cannot say that a Job's
        // agent must exist or that a node id may not repeat, so a schema-valid body is
        // often rightly refused (422).
        .args(["--exclude-checks", "positive_data_acceptance"])
        .args(["--generation-database", "none", "--no-color"])
        .args(["--report", "ndjson", "--report-dir", "report"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("schemathesis starts");
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let (stdout, stderr) = (read(Box::new(stdout)), read(Box::new(stderr)));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > WALL_CLOCK {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let elapsed = started.elapsed();
    let output = format!("{}\n{}", stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    let summary = output.find("=== FAILURES ===").or_else(|| output.find("=== SUMMARY ===")).unwrap_or(0);
    let report = &output[summary..];
    let status = status.unwrap_or_else(|| panic!("schemathesis ran past {WALL_CLOCK:?}:\n{report}"));

    // What the daemon answered, from the run's report: every response, every request that
    // got none.
    let mut cases = 0usize;
    let mut too_large_revisions = 0usize;
    let mut server_errors = Vec::new();
    let mut dropped = Vec::new();
    for entry in std::fs::read_dir(work.path().join("report")).expect("the report directory") {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let event: Value = serde_json::from_str(line).unwrap_or(Value::Null);
            if let Some(error) = event.get("NonFatalError") {
                dropped.push(format!("{}: {}", error["label"], error["value"]["message"]));
            }
            let interactions =
                event.pointer("/ScenarioFinished/recorder/interactions").and_then(Value::as_object);
            for interaction in interactions.into_iter().flat_map(|i| i.values()) {
                cases += 1;
                let code = interaction.pointer("/response/status_code").and_then(Value::as_u64).unwrap_or(0);
                let uri = interaction["request"]["uri"].as_str().unwrap_or_default();
                if code == 504 && uri.contains("resourceVersion=") {
                    too_large_revisions += 1;
                } else if code >= 500 {
                    server_errors.push(format!("{code} {uri}"));
                }
            }
        }
    }
    println!(
        "schemathesis: {cases} requests ({too_large_revisions} lists of a future revision: 504) \
         in {elapsed:.0?}, exit {status}\n{report}"
    );
    assert!(server_errors.is_empty(), "{} server errors:\n{}", server_errors.len(), server_errors.join("\n"));
    assert!(dropped.is_empty(), "{} requests got no answer:\n{}", dropped.len(), dropped.join("\n"));
    assert!(status.success(), "schemathesis found problems ({status}):\n{report}");
    assert!(cases > 1000, "only {cases} requests were made:\n{report}");

    // The daemon is still up and ready, did not panic, and the dry runs changed nothing.
    assert_eq!(d.client_with(None).get("/readyz").await.code, 200);
    let log = d.log();
    assert!(!log.contains("panicked"), "the daemon panicked:\n{}", tail(&log));
    let after = api.get("/apis/hive.dev/v1/agents/fuzz").await.body;
    assert_eq!(after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"], "{after}");
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
