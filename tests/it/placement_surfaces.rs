//! Where an agent runs, as every client shows it (issue 29, "Surfaces"): for an agent
//! placed on a process node and one on the daemon's host, through the real daemon —
//! `hive describe node/NAME` lists the node's agents with their power and Ready,
//! `hive describe agent/NAME` names its node, `hive get agents -o wide` its NODE, and
//! the MCP `get_agent` and `list_agents` tools report the node (none: the daemon's host).

use serde_json::{json, Value};

use crate::agents::config_repo;
use crate::harness::{eventually, ok, Daemon};
use crate::mcp::Mcp;

const AGENTS: &str = "/apis/hive.dev/v1/agents";

fn condition<'a>(agent: &'a Value, type_: &str) -> Option<&'a Value> {
    agent["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// A line's words, so a check does not depend on column widths.
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// The rows of `describe`'s `Agents:` section (after its header and rule), as words.
fn agents_section(described: &str) -> Vec<Vec<&str>> {
    let mut lines = described.lines().skip_while(|l| !l.starts_with("Agents:"));
    let head = lines.next().unwrap_or_else(|| panic!("no Agents: section in\n{described}"));
    if head.contains("<none>") {
        return Vec::new();
    }
    lines.skip(2).take_while(|l| l.starts_with("  ")).map(words).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn describe_get_and_mcp_show_where_an_agent_runs() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let api = d.client();
    let tmp = tempfile::tempdir().unwrap();
    let repo = config_repo(tmp.path());

    let mut alpha = crate::agents::agent("alpha", &repo, "Up");
    alpha["spec"]["placement"] = json!({"node": "node-1"});
    assert_eq!(api.post(AGENTS, &alpha).await.code, 201);
    // One that waits for a node that never comes, and one on the daemon's host.
    let mut waiting = crate::agents::agent("waiting", &repo, "Up");
    waiting["spec"]["placement"] = json!({"node": "node-9"});
    assert_eq!(api.post(AGENTS, &waiting).await.code, 201);
    assert_eq!(api.post(AGENTS, &crate::agents::agent("local", &repo, "Offline")).await.code, 201);

    // Before its node exists, the node cannot be described; the agent says where it waits.
    let out = d.hive(&["describe", "node/node-1"]);
    assert!(!out.status.success(), "no node-1 yet");
    let command = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "p"},
                         "spec": {"provision": {"provider": "process", "count": 1}}});
    assert_eq!(api.post("/apis/hive.dev/v1/fleetcommands", &command).await.code, 201);
    eventually("alpha Ready and Running on node-1", || async {
        let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
        (condition(&agent, "Ready")?["status"] == "True" && agent["status"]["power"] == "Running")
            .then_some(())
    })
    .await;
    eventually("waiting to say it waits", || async {
        let agent = api.get(&format!("{AGENTS}/waiting")).await.body;
        (condition(&agent, "Placed")?["reason"] == "WaitingForNode").then_some(())
    })
    .await;

    // describe node/node-1: its one agent, with wanted, observed power and Ready.
    let described = ok(d.hive(&["describe", "node/node-1"]));
    assert_eq!(agents_section(&described), vec![vec!["alpha", "Up", "Running", "True"]], "{described}");
    assert!(described.contains("Agents:") && described.contains("(1 placed)"), "{described}");

    // describe agent/…: the node up top, and the Placed condition among the conditions.
    let described = ok(d.hive(&["describe", "agent/alpha"]));
    assert!(described.lines().any(|l| words(l) == ["Node:", "node-1"]), "{described}");
    let placed = described.lines().find(|l| l.trim_start().starts_with("Placed ")).expect("Placed row");
    assert_eq!(words(placed)[1..3], ["True", "NodeRunning"], "{described}");
    let described = ok(d.hive(&["describe", "agent/local"]));
    assert!(
        described.lines().any(|l| words(l) == ["Node:", "<none>", "(the", "daemon's", "host)"]),
        "{described}"
    );
    let described = ok(d.hive(&["describe", "agent/waiting"]));
    assert!(described.lines().any(|l| words(l) == ["Node:", "node-9"]), "{described}");
    assert!(described.contains("WaitingForNode"), "{described}");

    // get -o wide: the NODE column, the last one (cells may be blank, headers two words:
    // the column is found by where its header starts).
    let wide = ok(d.hive(&["get", "agents", "-o", "wide"]));
    let at = wide.lines().next().unwrap().find("NODE").expect("a NODE column");
    let node_of = |name: &str| {
        let row = wide.lines().find(|l| words(l)[0] == name).unwrap_or_else(|| panic!("{name} in\n{wide}"));
        row.get(at..).unwrap_or_default().trim().to_string()
    };
    assert_eq!(node_of("alpha"), "node-1", "{wide}");
    assert_eq!(node_of("waiting"), "node-9", "{wide}");
    assert_eq!(node_of("local"), "", "{wide}");

    // MCP: get_agent and list_agents report the node; none for the daemon's host.
    let (mut mcp, _) = Mcp::start(&d.kubeconfig).await;
    let (summary, data) = mcp.call_ok("get_agent", json!({"name": "alpha"})).await;
    assert_eq!(data["spec"]["node"], "node-1", "{data}");
    assert!(summary.contains("on node node-1"), "{summary}");
    let placed = data["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Placed").cloned();
    assert_eq!(placed.map(|c| c["status"].clone()), Some(json!("True")), "{data}");
    let (summary, data) = mcp.call_ok("get_agent", json!({"name": "local"})).await;
    assert_eq!(data["spec"].get("node"), None, "{data}");
    assert!(summary.contains("on the daemon's host"), "{summary}");
    let (_, data) = mcp.call_ok("list_agents", json!({})).await;
    let node_of = |name: &str| {
        let rows = data["agents"].as_array().unwrap();
        rows.iter().find(|r| r["name"] == name).map(|r| r.get("node").cloned())
    };
    assert_eq!(node_of("alpha"), Some(Some(json!("node-1"))), "{data}");
    assert_eq!(node_of("waiting"), Some(Some(json!("node-9"))), "{data}");
    assert_eq!(node_of("local"), Some(None), "{data}");
    mcp.close().await;
}
