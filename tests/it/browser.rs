//! The dashboard in a real browser (tests/browser/dashboard.py: Playwright for Python
//! driving Debian's Chromium) against the real daemon. Runs only with
//! `HIVE_BROWSER_TESTS=1` (`.ci/run` sets it and installs both); then any failure fails.

use std::process::Command;

use serde_json::{json, Value};

use crate::agents::{config_repo, wait_power};
use crate::harness::{ok, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_in_a_browser() {
    if std::env::var("HIVE_BROWSER_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "skipped: set HIVE_BROWSER_TESTS=1 to run the browser suite (needs chromium and playwright)"
        );
        return;
    }
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let created = api.post("/apis/hive.dev/v1/agents", &crate::agents::agent("hello", &repo, "Up")).await;
    assert_eq!(created.code, 201, "{}", created.body);
    wait_power(&api, "hello", "Running").await;

    let token = |name: &str, role: &str| {
        ok(d.hive(&["token", "create", "--name", name, "--role", role])).trim().to_string()
    };
    let viewer = token("vera", "viewer");
    let operator = token("otto", "operator");

    // A pending approval, as an agent would ask for its next config commit.
    let v2 = String::from_utf8(
        Command::new("git").args(["rev-parse", "v2"]).current_dir(&repo).output().unwrap().stdout,
    )
    .unwrap();
    let approval = json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": "hello-v2"},
        "spec": {"kind": "ApplyCommit", "target": "hello", "payload": {"commit": v2.trim()},
                 "summary": "run the new prompt"}});
    let asked = api.post("/apis/hive.dev/v1/approvals", &approval).await;
    assert_eq!(asked.code, 201, "{}", asked.body);

    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let artifacts = std::path::Path::new(&target).join("browser-artifacts");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/dashboard.py");
    let out = tokio::task::spawn_blocking({
        let (url, artifacts, admin) = (d.url.clone(), artifacts.clone(), d.token.clone());
        move || {
            Command::new("python3")
                .arg(script)
                .env("HIVE_URL", url)
                .env("HIVE_OPERATOR_TOKEN", operator)
                .env("HIVE_VIEWER_TOKEN", viewer)
                .env("HIVE_ADMIN_TOKEN", admin)
                .env("HIVE_APPROVAL", "hello-v2")
                .env("HIVE_ARTIFACTS", &artifacts)
                .output()
                .expect("python3 runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "browser suite failed (screenshots in {}):\n{stdout}\n{stderr}\n--- daemon log tail ---\n{}",
        artifacts.display(),
        d.log().lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

/// `--dashboard-listen` serves the same pages and API on a second address, same TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_is_served_on_an_extra_listener_too() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let d = Daemon::start_with(&["--dashboard-listen", &port.to_string()]);
    let mut api = d.client();
    api.base = format!("https://127.0.0.1:{port}");
    let login = api.get("/login").await;
    assert_eq!(login.code, 200, "{:?}", login.body);
    assert!(login.body.as_str().unwrap_or("").contains("name=\"token\""));
    assert_eq!(api.get("/apis/hive.dev/v1/agents").await.code, 200, "the API answers there too");
    // And on the main listener, the root is the dashboard.
    let root = d.client_with(None).get("/").await;
    assert_eq!(root.code, 200, "reqwest follows the redirect to /login");
    assert!(root.body.as_str().unwrap_or("").contains("Sign in"));
}

/// The Myelin document's `MYELIN_DASHBOARD_PORT` selects the dashboard's port too (issue
/// 29): on `main` before this it was not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn myelin_dashboard_port_selects_the_dashboards_port() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let d = Daemon::start_with_env(&[], &[("MYELIN_DASHBOARD_PORT", &port.to_string())]);
    let mut api = d.client();
    api.base = format!("https://127.0.0.1:{port}");
    let login = api.get("/login").await;
    assert_eq!(login.code, 200, "{:?}", login.body);
    // A bad value is a clear start-up error naming the variable.
    let dir = tempfile::tempdir().unwrap();
    let refused = Daemon::spawn_env(dir.path(), &[], &[("MYELIN_DASHBOARD_PORT", "not-a-port")])
        .err()
        .expect("the daemon refuses to start");
    assert!(refused.contains("MYELIN_DASHBOARD_PORT"), "{refused}");
}

/// Logs, Jobs, charts and the metrics page in a real browser
/// (tests/browser/logs_jobs_metrics.py): an agent with two runs and a few Jobs, and a
/// process node whose telemetry hub holds recent frames before the page opens.
/// Screenshots go to `$HIVE_BROWSER_ARTIFACTS` (default: the target dir's
/// `browser-artifacts/logs-jobs-metrics`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_jobs_charts_and_metrics_work_in_a_browser() {
    if std::env::var("HIVE_BROWSER_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "skipped: set HIVE_BROWSER_TESTS=1 to run the browser suite (needs chromium and playwright)"
        );
        return;
    }
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let created = api.post("/apis/hive.dev/v1/agents", &crate::agents::agent("hello", &repo, "Up")).await;
    assert_eq!(created.code, 201, "{}", created.body);
    wait_power(&api, "hello", "Running").await;
    // A second run (a rebuild to v2), so the log holds two and the Jobs page a Rebuild.
    let patch = json!({"spec": {"config": {"rev": "v2"}}});
    let patched = api.patch("/apis/hive.dev/v1/agents/hello", "application/merge-patch+json", &patch).await;
    assert_eq!(patched.code, 200, "{}", patched.body);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let log = api.get("/apis/hive.dev/v1/agents/hello/log").await.body;
        if log.as_str().unwrap_or("").contains("hello from v2") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never rebuilt: {log}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // A process node, Running, whose hub holds a few frames before any page opens.
    let command = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "provision-charts"},
                         "spec": {"provision": {"provider": "process", "count": 1}}});
    let provisioned = api.post("/apis/hive.dev/v1/fleetcommands", &command).await;
    assert_eq!(provisioned.code, 201, "{}", provisioned.body);
    let node = loop {
        let cmd = api.get("/apis/hive.dev/v1/fleetcommands/provision-charts").await.body;
        let node = cmd["status"]["nodes"][0].as_str().map(String::from);
        if let Some(node) = node {
            let n = api.get(&format!("/apis/hive.dev/v1/nodes/{node}")).await.body;
            if n["status"]["phase"] == "Running" {
                break node;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no Running node: {cmd}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    loop {
        let frames = api.get(&format!("/hive/v1/fleet/nodes/{node}/telemetry?follow=false")).await;
        let text = frames.body.as_str().map(String::from).unwrap_or_else(|| frames.body.to_string());
        if text.matches("\"cpu.percent\"").count() >= 6 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the hub holds too few frames: {text}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }

    let token = |name: &str, role: &str| {
        ok(d.hive(&["token", "create", "--name", name, "--role", role])).trim().to_string()
    };
    let viewer = token("vera", "viewer");
    let operator = token("otto", "operator");
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let artifacts =
        std::env::var("HIVE_BROWSER_ARTIFACTS").map(std::path::PathBuf::from).unwrap_or_else(|_| {
            std::path::Path::new(&target).join("browser-artifacts").join("logs-jobs-metrics")
        });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/logs_jobs_metrics.py");
    let out = tokio::task::spawn_blocking({
        let (url, artifacts, admin) = (d.url.clone(), artifacts.clone(), d.token.clone());
        move || {
            Command::new("python3")
                .arg(script)
                .env("HIVE_URL", url)
                .env("HIVE_OPERATOR_TOKEN", operator)
                .env("HIVE_VIEWER_TOKEN", viewer)
                .env("HIVE_ADMIN_TOKEN", admin)
                .env("HIVE_NODE", node)
                .env("HIVE_ARTIFACTS", &artifacts)
                .output()
                .expect("python3 runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "browser suite failed (screenshots in {}):\n{stdout}\n{stderr}\n--- daemon log tail ---\n{}",
        artifacts.display(),
        d.log().lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

/// Where agents run, in a real browser (tests/browser/placement.py): `alpha` placed on
/// process node `node-1` and Ready there, `local` on the daemon's host, and a second
/// node with no agents. Screenshots go to the target dir's `browser-artifacts/placement`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_on_nodes_show_in_the_dashboard() {
    if std::env::var("HIVE_BROWSER_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "skipped: set HIVE_BROWSER_TESTS=1 to run the browser suite (needs chromium and playwright)"
        );
        return;
    }
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let mut alpha = crate::agents::agent("alpha", &repo, "Up");
    alpha["spec"]["placement"] = json!({"node": "node-1"});
    for agent in [alpha, crate::agents::agent("local", &repo, "Offline")] {
        let created = api.post("/apis/hive.dev/v1/agents", &agent).await;
        assert_eq!(created.code, 201, "{}", created.body);
    }
    let command = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "p"},
                         "spec": {"provision": {"provider": "process", "count": 2}}});
    let provisioned = api.post("/apis/hive.dev/v1/fleetcommands", &command).await;
    assert_eq!(provisioned.code, 201, "{}", provisioned.body);
    crate::harness::eventually("alpha Ready on node-1", || async {
        let a = api.get("/apis/hive.dev/v1/agents/alpha").await.body;
        let ready = a["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        (ready && a["status"]["power"] == "Running").then_some(())
    })
    .await;
    crate::harness::eventually("node-2 Running", || async {
        let n = api.get("/apis/hive.dev/v1/nodes/node-2").await.body;
        (n["status"]["phase"] == "Running").then_some(())
    })
    .await;

    let token = |name: &str, role: &str| {
        ok(d.hive(&["token", "create", "--name", name, "--role", role])).trim().to_string()
    };
    let viewer = token("vera", "viewer");
    let operator = token("otto", "operator");
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let artifacts = std::path::Path::new(&target).join("browser-artifacts").join("placement");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/placement.py");
    let out = tokio::task::spawn_blocking({
        let (url, artifacts, admin) = (d.url.clone(), artifacts.clone(), d.token.clone());
        move || {
            Command::new("python3")
                .arg(script)
                .env("HIVE_URL", url)
                .env("HIVE_OPERATOR_TOKEN", operator)
                .env("HIVE_VIEWER_TOKEN", viewer)
                .env("HIVE_ADMIN_TOKEN", admin)
                .env("HIVE_NODE", "node-1")
                .env("HIVE_ARTIFACTS", &artifacts)
                .output()
                .expect("python3 runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "browser suite failed (screenshots in {}):\n{stdout}\n{stderr}\n--- daemon log tail ---\n{}",
        artifacts.display(),
        d.log().lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

/// Why an agent fails, in a real browser at desktop and phone width
/// (tests/browser/why_failing.py): `crashy` crash-loops after a panic on stderr, `off` is
/// Offline on purpose, `hello` runs. Screenshots go to the target dir's
/// `browser-artifacts/why-failing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_an_agent_fails_shows_in_a_browser() {
    if std::env::var("HIVE_BROWSER_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "skipped: set HIVE_BROWSER_TESTS=1 to run the browser suite (needs chromium and playwright)"
        );
        return;
    }
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let mut crashy = crate::agents::agent("crashy", &repo, "Up");
    crashy["spec"]["runtime"]["process"]["command"] =
        json!(["sh", "-c", "echo \"panic: $PWD/config.toml: no such file\" >&2; exit 3"]);
    let agents =
        [crashy, crate::agents::agent("off", &repo, "Offline"), crate::agents::agent("hello", &repo, "Up")];
    for agent in agents {
        let created = api.post("/apis/hive.dev/v1/agents", &agent).await;
        assert_eq!(created.code, 201, "{}", created.body);
    }
    crate::harness::eventually("crashy crash-looping, off stopped, hello running", || async {
        let phase = |a: Value| a["status"]["phase"].as_str().unwrap_or_default().to_string();
        let crashy = phase(api.get("/apis/hive.dev/v1/agents/crashy").await.body);
        let off = phase(api.get("/apis/hive.dev/v1/agents/off").await.body);
        let hello = phase(api.get("/apis/hive.dev/v1/agents/hello").await.body);
        (crashy == "CrashLoopBackOff" && off == "Stopped" && hello == "Running").then_some(())
    })
    .await;

    let viewer = ok(d.hive(&["token", "create", "--name", "vera", "--role", "viewer"])).trim().to_string();
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let artifacts = std::path::Path::new(&target).join("browser-artifacts").join("why-failing");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/why_failing.py");
    let out = tokio::task::spawn_blocking({
        let (url, artifacts, admin) = (d.url.clone(), artifacts.clone(), d.token.clone());
        move || {
            Command::new("python3")
                .arg(script)
                .env("HIVE_URL", url)
                .env("HIVE_OPERATOR_TOKEN", &admin)
                .env("HIVE_VIEWER_TOKEN", viewer)
                .env("HIVE_ADMIN_TOKEN", &admin)
                .env("HIVE_ARTIFACTS", &artifacts)
                .output()
                .expect("python3 runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "browser suite failed (screenshots in {}):\n{stdout}\n{stderr}\n--- daemon log tail ---\n{}",
        artifacts.display(),
        d.log().lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

/// The Events page and a Job's graph in a real browser at desktop and phone width
/// (tests/browser/events_dag.py): `crashy` crash-loops (Warning Events), `hello` and
/// `second` run, and a Rebuild of both (two lanes, an AfterAny edge each) is Done.
/// Screenshots go to the target dir's `browser-artifacts/events-dag`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_job_graphs_show_in_a_browser() {
    if std::env::var("HIVE_BROWSER_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "skipped: set HIVE_BROWSER_TESTS=1 to run the browser suite (needs chromium and playwright)"
        );
        return;
    }
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let mut crashy = crate::agents::agent("crashy", &repo, "Up");
    crashy["spec"]["runtime"]["process"]["command"] =
        json!(["sh", "-c", "echo 'panic: no config' >&2; exit 3"]);
    let agents =
        [crashy, crate::agents::agent("hello", &repo, "Up"), crate::agents::agent("second", &repo, "Up")];
    for agent in agents {
        let created = api.post("/apis/hive.dev/v1/agents", &agent).await;
        assert_eq!(created.code, 201, "{}", created.body);
    }
    wait_power(&api, "hello", "Running").await;
    wait_power(&api, "second", "Running").await;
    crate::harness::eventually("crashy crash-looping", || async {
        let crashy = api.get("/apis/hive.dev/v1/agents/crashy").await.body;
        (crashy["status"]["phase"] == "CrashLoopBackOff").then_some(())
    })
    .await;
    let out = ok(d.hive(&["rebuild", "hello", "second"]));
    let job = out
        .lines()
        .find_map(|l| l.strip_prefix("job.hive.dev/")?.strip_suffix(" submitted"))
        .unwrap_or_else(|| panic!("no Job named in {out}"))
        .to_string();

    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let artifacts = std::path::Path::new(&target).join("browser-artifacts").join("events-dag");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/events_dag.py");
    let out = tokio::task::spawn_blocking({
        let (url, artifacts, admin) = (d.url.clone(), artifacts.clone(), d.token.clone());
        move || {
            Command::new("python3")
                .arg(script)
                .env("HIVE_URL", url)
                .env("HIVE_OPERATOR_TOKEN", &admin)
                .env("HIVE_VIEWER_TOKEN", &admin)
                .env("HIVE_ADMIN_TOKEN", &admin)
                .env("HIVE_JOB", job)
                .env("HIVE_ARTIFACTS", &artifacts)
                .output()
                .expect("python3 runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "browser suite failed (screenshots in {}):\n{stdout}\n{stderr}\n--- daemon log tail ---\n{}",
        artifacts.display(),
        d.log().lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}
