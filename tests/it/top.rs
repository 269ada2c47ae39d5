//! `hive top` (issue 32): CPU and memory per agent, measured by the daemon from each
//! agent's process tree, and per fleet node from its telemetry, as `kubectl top`; before
//! this, `hive top` was an unknown verb (clap suggested `stop`).

use serde_json::json;

use crate::agents::{agent, config_repo, wait_power};
use crate::harness::{eventually, fails, ok, Daemon};

/// The cell of the row of `name` under `header` in an aligned table.
fn cell(table: &str, name: &str, header: &str) -> String {
    let head =
        table.lines().find(|l| l.starts_with("NAME")).unwrap_or_else(|| panic!("no header in\n{table}"));
    let at = head.find(header).unwrap_or_else(|| panic!("no {header} in\n{table}"));
    let line = table.lines().find(|l| l.split_whitespace().next() == Some(name));
    let line = line.unwrap_or_else(|| panic!("no row {name} in\n{table}"));
    line.get(at..).unwrap_or_default().split_whitespace().next().unwrap_or_default().to_string()
}

fn percent(text: &str) -> f64 {
    text.strip_suffix('%')
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("not a percentage: {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_each_agents_cpu_and_memory_and_each_nodes() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let mut busy = agent("busy", &repo, "Up");
    busy["spec"]["runtime"]["process"]["command"] = json!(["sh", "-c", "echo spinning; while :; do :; done"]);
    for a in [busy, agent("hello", &repo, "Up"), agent("off", &repo, "Offline")] {
        assert_eq!(api.post("/apis/hive.dev/v1/agents", &a).await.code, 201);
    }
    wait_power(&api, "busy", "Running").await;
    wait_power(&api, "hello", "Running").await;
    eventually("off built and stopped", || async {
        let off = api.get("/apis/hive.dev/v1/agents/off").await.body;
        (off["status"]["phase"] == "Stopped").then_some(())
    })
    .await;

    let table = ok(d.hive(&["top", "agents"]));
    assert!(percent(&cell(&table, "busy", "CPU")) > 5.0, "a busy loop uses CPU:\n{table}");
    assert!(percent(&cell(&table, "hello", "CPU")) < percent(&cell(&table, "busy", "CPU")), "{table}");
    for name in ["busy", "hello"] {
        let memory = cell(&table, name, "MEMORY");
        let mib: f64 =
            memory.strip_suffix("Mi").and_then(|m| m.parse().ok()).unwrap_or_else(|| panic!("{table}"));
        assert!(mib > 0.0, "{name}'s memory:\n{table}");
        assert!(cell(&table, name, "PROCESSES").parse::<u32>().unwrap() >= 1, "{table}");
        assert_eq!(cell(&table, name, "STATUS"), "Running", "{table}");
    }
    assert_eq!(cell(&table, "off", "CPU"), "-", "{table}");
    assert!(table.lines().any(|l| l.starts_with("off ") && l.ends_with("not running")), "{table}");

    // The API says the same, typed; a window out of bounds is a 400 naming it.
    let usage = api.get("/hive/v1/agents/usage?windowMs=200").await;
    assert_eq!(usage.code, 200, "{}", usage.body);
    let busy = usage.body["items"].as_array().unwrap().iter().find(|i| i["name"] == "busy").cloned().unwrap();
    assert!(busy["memoryBytes"].as_u64().unwrap() > 0, "{busy}");
    let refused = api.get("/hive/v1/agents/usage?windowMs=50").await;
    assert_eq!(refused.code, 400, "{}", refused.body);
    assert!(refused.body["message"].as_str().unwrap().contains("windowMs"), "{}", refused.body);
    ok(d.hive(&["kill", "busy"]));

    // A process node: its CPU and memory from its worker's telemetry.
    let command = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "top-node"},
                         "spec": {"provision": {"provider": "process", "count": 1}}});
    assert_eq!(api.post("/apis/hive.dev/v1/fleetcommands", &command).await.code, 201);
    eventually("node-1 Running with telemetry", || async {
        let n = api.get("/apis/hive.dev/v1/nodes/node-1").await.body;
        (n["status"]["phase"] == "Running" && n["status"]["telemetry"]["cpuPercent"].is_number())
            .then_some(())
    })
    .await;
    let nodes = ok(d.hive(&["top", "nodes"]));
    percent(&cell(&nodes, "node-1", "CPU"));
    assert!(cell(&nodes, "node-1", "MEMORY").ends_with('i'), "{nodes}");
    assert!(percent(&cell(&nodes, "node-1", "MEMORY%")) > 0.0, "{nodes}");
    // Both, agents first.
    let both = ok(d.hive(&["top"]));
    assert!(both.find("hello").unwrap() < both.find("node-1").unwrap(), "{both}");
    let err = fails(d.hive(&["top", "pods"]));
    assert!(err.contains("agents") && err.contains("nodes"), "{err}");
}
