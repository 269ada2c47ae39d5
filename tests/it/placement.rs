//! Agents on fleet nodes (`spec.placement.node`): an agent placed on a process node runs
//! under that node's worker, built from the config commit the daemon ships, with the
//! same Jobs, crash-watch and logs as a local agent; a placement on a node that is not
//! there waits, and bad placements are refused naming the field.

use std::path::Path;

use serde_json::{json, Value};

use crate::agents::config_repo;
use crate::harness::{eventually, ok, Api, Daemon};

const AGENTS: &str = "/apis/hive.dev/v1/agents";
const COMMANDS: &str = "/apis/hive.dev/v1/fleetcommands";
const NODES: &str = "/apis/hive.dev/v1/nodes";

pub(crate) fn placed(name: &str, repo: &Path, node: &str) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
           "spec": {"wanted": "Up", "config": {"repo": repo.display().to_string(), "rev": "v1"},
                    "placement": {"node": node},
                    "runtime": {"type": "process", "gracefulStopSeconds": 5, "process": {"command": ["sh", "run.sh"]}}}})
}

fn provision(id: &str) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
           "spec": {"provision": {"provider": "process", "count": 1}}})
}

pub(crate) fn condition<'a>(agent: &'a Value, type_: &str) -> Option<&'a Value> {
    agent["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// `/proc/<pid>/stat` fields after the command name: state, ppid, …
fn stat(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(String::from).collect())
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Live processes running the agent's `run.sh` whose parent is `parent`.
pub(crate) fn agents_under(parent: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Some(fields) = stat(pid) else { continue };
        if fields[0] != "Z" && fields[1] == parent.to_string() && cmdline(pid).contains("run.sh") {
            pids.push(pid);
        }
    }
    pids
}

/// Waits until agent `name` is Ready.
pub(crate) async fn ready(api: &Api, name: &str) {
    eventually(&format!("{name} to be Ready"), || async {
        let agent = api.get(&format!("{AGENTS}/{name}")).await.body;
        (condition(&agent, "Ready")?["status"] == "True").then_some(())
    })
    .await;
}

pub(crate) async fn running_node(api: &Api, name: &str) -> Value {
    eventually(&format!("node {name} to run"), || async {
        let node = api.get(&format!("{NODES}/{name}")).await.body;
        (node["status"]["phase"] == "Running").then_some(node)
    })
    .await
}

/// The pid of a process node's worker, from its Node.
fn worker_pid(node: &Value) -> u32 {
    node["status"]["providerRef"]["pid"].as_u64().expect("providerRef.pid") as u32
}

/// A daemon with the agent controller, node-1 provisioned and Running, and `alpha`
/// placed on it and Ready: the daemon, the temp dir holding the config repo, the repo,
/// and node-1's worker pid.
async fn alpha_on_node_1() -> (Daemon, tempfile::TempDir, std::path::PathBuf, u32) {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let api = d.client();
    let tmp = tempfile::tempdir().unwrap();
    let repo = config_repo(tmp.path());
    assert_eq!(api.post(COMMANDS, &provision("p")).await.code, 201);
    let worker = worker_pid(&running_node(&api, "node-1").await);
    assert_eq!(api.post(AGENTS, &placed("alpha", &repo, "node-1")).await.code, 201);
    ready(&api, "alpha").await;
    (d, tmp, repo, worker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_placed_on_a_process_node_runs_under_its_worker() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let api = d.client();
    let tmp = tempfile::tempdir().unwrap();
    let repo = config_repo(tmp.path());

    // Placed before the node exists: accepted, and it waits, saying why.
    assert_eq!(api.post(AGENTS, &placed("alpha", &repo, "node-1")).await.code, 201);
    let waiting = eventually("the agent to wait for its node", || async {
        let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
        (condition(&agent, "Placed")?["status"] == "False").then_some(agent)
    })
    .await;
    let placed_cond = condition(&waiting, "Placed").unwrap();
    assert_eq!(placed_cond["reason"], "WaitingForNode", "{waiting}");
    assert!(placed_cond["message"].as_str().unwrap().contains("node-1"), "{waiting}");
    assert!(waiting["status"]["activeJob"].is_null(), "nothing is submitted while it waits: {waiting}");

    assert_eq!(api.post(COMMANDS, &provision("p")).await.code, 201);
    let worker = worker_pid(&running_node(&api, "node-1").await);

    let agent = eventually("the placed agent to be Ready", || async {
        let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
        (condition(&agent, "Ready")?["status"] == "True" && agent["status"]["power"] == "Running")
            .then_some(agent)
    })
    .await;
    assert_eq!(condition(&agent, "Placed").unwrap()["status"], "True", "{agent}");
    // It runs under the node's worker, not under the daemon.
    let pids = eventually("the agent's process under the worker", || async {
        let pids = agents_under(worker);
        (pids.len() == 1).then_some(pids)
    })
    .await;
    assert!(agents_under(d.pid()).is_empty(), "the daemon runs no agent itself");
    // Built from the commit the daemon shipped: the worker's agent dir holds it.
    let v1 = String::from_utf8(
        std::process::Command::new("git")
            .args(["rev-parse", "v1^{commit}"])
            .current_dir(&repo)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(agent["status"]["appliedRev"], v1.trim(), "{agent}");

    // Its output streams back from the node.
    let logs = eventually("the agent's output", || async {
        let out = d.hive(&["logs", "agent/alpha"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("hello from v1").then_some(text)
    })
    .await;
    assert!(logs.contains("hello from v1"), "{logs}");

    // A crash on the node is crash-watched and the agent restarted there.
    assert!(std::process::Command::new("kill")
        .args(["-KILL", &pids[0].to_string()])
        .status()
        .unwrap()
        .success());
    let mut tries = 0;
    let restarted = loop {
        let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
        let now = agents_under(worker);
        if agent["status"]["restarts"].as_u64() >= Some(1) && now.len() == 1 && now[0] != pids[0] {
            break now;
        }
        tries += 1;
        assert!(tries < 600, "crash-watch did not restart it: {agent} {now:?} {pids:?}\n{}", d.log());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(restarted.len(), 1);

    // A rev change rebuilds on the node and swaps to it.
    let patch = json!({"spec": {"config": {"rev": "v2"}}});
    assert_eq!(api.patch(&format!("{AGENTS}/alpha"), "application/merge-patch+json", &patch).await.code, 200);
    eventually("v2 to run on the node", || async {
        let out = d.hive(&["logs", "agent/alpha", "--tail", "1"]);
        String::from_utf8_lossy(&out.stdout).contains("hello from v2").then_some(())
    })
    .await;
    let after = agents_under(worker);
    assert_eq!(after.len(), 1, "one process of the agent after the swap");

    // `hive stop` stops it on the node.
    ok(d.hive(&["stop", "alpha"]));
    eventually("the agent to stop on the node", || async { agents_under(worker).is_empty().then_some(()) })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_placements_are_refused_or_wait_and_start_nothing() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let api = d.client();
    let tmp = tempfile::tempdir().unwrap();
    let repo = config_repo(tmp.path());

    let mut bad = placed("beta", &repo, "Node_1");
    let reply = api.post(AGENTS, &bad).await;
    assert_eq!(reply.code, 422, "{:?}", reply.body);
    assert!(reply.body["message"].as_str().unwrap().contains("spec.placement.node"), "{:?}", reply.body);
    bad["spec"]["placement"]["node"] = json!("node-1");
    bad["spec"]["runtime"] = json!({"type": "nixosContainer"});
    let reply = api.post(AGENTS, &bad).await;
    assert_eq!(reply.code, 422, "{:?}", reply.body);
    assert!(reply.body["message"].as_str().unwrap().contains("spec.placement"), "{:?}", reply.body);
    assert_eq!(api.get(&format!("{AGENTS}/beta")).await.code, 404, "nothing was stored");

    // A killed node takes no agent: it waits, saying the node is Killed.
    assert_eq!(api.post(COMMANDS, &provision("p")).await.code, 201);
    running_node(&api, "node-1").await;
    let kill = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "k"},
                      "spec": {"kill": {"node": "node-1"}}});
    assert_eq!(api.post(COMMANDS, &kill).await.code, 201);
    eventually("the node to be killed", || async {
        let node = api.get(&format!("{NODES}/node-1")).await.body;
        (node["status"]["phase"] == "Killed").then_some(())
    })
    .await;
    assert_eq!(api.post(AGENTS, &placed("gamma", &repo, "node-1")).await.code, 201);
    let agent = eventually("the agent on a killed node to wait", || async {
        let agent = api.get(&format!("{AGENTS}/gamma")).await.body;
        let message = condition(&agent, "Placed")?["message"].as_str()?.to_string();
        message.contains("Killed").then_some(agent)
    })
    .await;
    assert!(agent["status"]["activeJob"].is_null(), "{agent}");
    assert!(agents_under(d.pid()).is_empty(), "nothing started on the daemon's host instead");
    // Deleting it does not hang on the unreachable node.
    assert_eq!(api.delete(&format!("{AGENTS}/gamma")).await.code, 200);
    eventually("the waiting agent to be deleted", || async {
        (api.get(&format!("{AGENTS}/gamma")).await.code == 404).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_placed_agent_whose_node_is_killed_is_lost_and_not_moved() {
    let (d, _tmp, _, worker) = alpha_on_node_1().await;
    let api = d.client();
    assert_eq!(agents_under(worker).len(), 1);

    let kill = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "k"},
                      "spec": {"kill": {"node": "node-1"}}});
    assert_eq!(api.post(COMMANDS, &kill).await.code, 201);
    let lost = eventually("the agent to be observed Lost", || async {
        let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
        (agent["status"]["power"] == "Lost").then_some(agent)
    })
    .await;
    let node_lost = condition(&lost, "NodeLost").expect("a NodeLost condition");
    assert_eq!(node_lost["status"], "True", "{lost}");
    assert!(node_lost["message"].as_str().unwrap().contains("node-1"), "{lost}");
    assert_eq!(condition(&lost, "Ready").unwrap()["status"], "False", "{lost}");
    let events = eventually("a NodeLost Event", || async {
        let events = api.get("/api/v1/events").await.body;
        let items = events["items"].as_array()?.clone();
        items
            .iter()
            .any(|e| e["reason"] == "NodeLost" && e["involvedObject"]["name"] == "alpha")
            .then_some(items)
    })
    .await;
    assert!(!events.is_empty());
    // Nothing moved it: no agent process on the daemon's host, no other node, and it
    // stays Lost with no Job working on it.
    assert!(agents_under(d.pid()).is_empty());
    let nodes = api.get(NODES).await.body;
    assert_eq!(nodes["items"].as_array().unwrap().len(), 1, "{nodes}");
    let again = api.get(&format!("{AGENTS}/alpha")).await.body;
    assert_eq!(again["status"]["power"], "Lost", "{again}");
    assert!(again["status"]["activeJob"].is_null(), "{again}");

    // The operator's answer: a new placement. The move leaves the lost node as it is
    // and runs the agent on the new one.
    assert_eq!(api.post(COMMANDS, &provision("p2")).await.code, 201);
    let worker2 = worker_pid(&running_node(&api, "node-2").await);
    place(&api, "alpha", json!({"node": "node-2"})).await;
    let job = moved_by_one_job(&api, "alpha", 1).await;
    let vacate = step(&job, "alpha/vacate");
    assert!(vacate.contains("node node-1 cannot be reached"), "{vacate}");
    ready(&api, "alpha").await;
    eventually("the agent under node-2's worker", || async {
        (agents_under(worker2).len() == 1).then_some(())
    })
    .await;
    let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
    assert_eq!(agent["status"]["power"], "Running", "{agent}");
    assert_eq!(agent["status"]["node"], "node-2", "{agent}");
    let node_lost = condition(&agent, "NodeLost").expect("the NodeLost condition");
    assert_eq!(
        (node_lost["status"].as_str(), node_lost["reason"].as_str()),
        (Some("False"), Some("Moved")),
        "{agent}"
    );
    assert!(agents_under(d.pid()).is_empty());
}

/// Merge-patches `spec.placement` of `agent` (`null`: the daemon's host).
async fn place(api: &Api, agent: &str, placement: Value) {
    let patch = json!({"spec": {"placement": placement}});
    let reply = api.patch(&format!("{AGENTS}/{agent}"), "application/merge-patch+json", &patch).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
}

/// The `nth` Move Job of `agent` (counting from 1), once it finished: Done, with the
/// move's four nodes.
async fn moved_by_one_job(api: &Api, agent: &str, nth: usize) -> Value {
    let job = eventually(&format!("{agent}'s Move Job to finish"), || async {
        let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
        let mut moves: Vec<Value> = jobs["items"]
            .as_array()?
            .iter()
            .filter(|j| j["spec"]["template"] == "Move" && j["spec"]["agents"] == json!([agent]))
            .cloned()
            .collect();
        moves.sort_by_key(|j| {
            j["metadata"]["resourceVersion"].as_str().unwrap_or("").parse::<u64>().unwrap_or(0)
        });
        if moves.len() < nth {
            return None;
        }
        let job = moves.swap_remove(nth - 1);
        matches!(job["status"]["phase"].as_str(), Some("Done" | "Failed")).then_some(job)
    })
    .await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    let kinds: Vec<&str> =
        job["spec"]["nodes"].as_array().unwrap().iter().map(|n| n["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["Vacate", "Create", "WriteDropin", "Reconcile"], "{job}");
    assert_eq!(job["spec"]["nodes"][1]["params"]["relock"], false, "a move builds the locked commit: {job}");
    job
}

/// The step a node of `job` ended with.
fn step(job: &Value, node: &str) -> String {
    let nodes = job["status"]["nodes"].as_array().expect("node statuses");
    let found = nodes.iter().find(|n| n["id"] == node).unwrap_or_else(|| panic!("no node {node}: {job}"));
    found["step"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_placement_change_moves_the_agent_as_one_job_and_meta_updates_reach_it_there() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let api = d.client();
    let tmp = tempfile::tempdir().unwrap();
    let repo = config_repo(tmp.path());
    let head = || {
        let out = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(&repo)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let mut provision2 = provision("p");
    provision2["spec"]["provision"]["count"] = json!(2);
    assert_eq!(api.post(COMMANDS, &provision2).await.code, 201);
    let worker1 = worker_pid(&running_node(&api, "node-1").await);
    let worker2 = worker_pid(&running_node(&api, "node-2").await);

    // On node-1, following the branch `main` (at v2).
    let mut alpha = placed("alpha", &repo, "node-1");
    alpha["spec"]["config"]["rev"] = json!("main");
    assert_eq!(api.post(AGENTS, &alpha).await.code, 201);
    ready(&api, "alpha").await;
    let v2 = head();
    assert_eq!(agents_under(worker1).len(), 1);
    // main moves on to v3, unreviewed: a move must not take it.
    std::fs::write(repo.join("run.sh"), crate::agents::RUN_SH.replace("VERSION", "v3")).unwrap();
    crate::agents::git(&repo, &["commit", "--quiet", "-am", "v3"]);
    let v3 = head();

    // To node-2: one Move Job; it stops there and runs here, on the commit it ran.
    place(&api, "alpha", json!({"node": "node-2"})).await;
    let job = moved_by_one_job(&api, "alpha", 1).await;
    assert_eq!(step(&job, "alpha/vacate"), "stopped and removed on node node-1", "{job}");
    ready(&api, "alpha").await;
    eventually("the agent under node-2's worker only", || async {
        (agents_under(worker2).len() == 1 && agents_under(worker1).is_empty()).then_some(())
    })
    .await;
    let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
    assert_eq!(agent["status"]["node"], "node-2", "{agent}");
    assert_eq!(agent["status"]["appliedRev"], v2.as_str(), "the move rebuilt the commit it ran: {agent}");
    assert!(!d.dir.join("fleet/workers/node-1/agents/alpha").exists(), "node-1 keeps nothing of it");
    let logs = ok(d.hive(&["logs", "agent/alpha"]));
    assert!(logs.contains("hello from v2") && !logs.contains("hello from v3"), "{logs}");

    // A meta-update of its input fans out to it on node-2: the build runs there.
    let update = json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": "bump-alpha"},
                        "spec": {"kind": "UpdateMetaInputs", "payload": {"inputs": ["alpha"]}}});
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &update).await.code, 201);
    ok(d.hive(&["approve", "bump-alpha"]));
    let done = eventually("the meta-update to be Deployed", || async {
        let a = api.get("/apis/hive.dev/v1/approvals/bump-alpha").await.body;
        matches!(a["status"]["phase"].as_str(), Some("Deployed" | "Failed")).then_some(a)
    })
    .await;
    assert_eq!(done["status"]["phase"], "Deployed", "{done}");
    let agent = eventually("v3 to run on node-2", || async {
        let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
        (agent["status"]["appliedRev"] == v3.as_str() && agent["status"]["power"] == "Running")
            .then_some(agent)
    })
    .await;
    assert_eq!(agent["status"]["node"], "node-2", "{agent}");
    eventually("v3's output from node-2", || async {
        let out = d.hive(&["logs", "agent/alpha", "--tail", "1"]);
        (String::from_utf8_lossy(&out.stdout).contains("hello from v3") && agents_under(worker2).len() == 1)
            .then_some(())
    })
    .await;

    // Back to the daemon's own host.
    place(&api, "alpha", Value::Null).await;
    let job = moved_by_one_job(&api, "alpha", 2).await;
    assert_eq!(step(&job, "alpha/vacate"), "stopped and removed on node node-2", "{job}");
    ready(&api, "alpha").await;
    eventually("the agent under the daemon only", || async {
        (agents_under(d.pid()).len() == 1 && agents_under(worker2).is_empty()).then_some(())
    })
    .await;
    let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
    assert!(agent["status"]["node"].is_null(), "{agent}");
    assert_eq!(agent["status"]["appliedRev"], v3.as_str(), "{agent}");
    let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
    let moves = jobs["items"].as_array().unwrap().iter().filter(|j| j["spec"]["template"] == "Move").count();
    assert_eq!(moves, 2, "one Job per move");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_approved_commit_deploys_to_a_placed_agent_on_its_node() {
    let (d, _tmp, repo, worker) = alpha_on_node_1().await;
    let api = d.client();
    let rev = |name: &str| {
        let out =
            std::process::Command::new("git").args(["rev-parse", name]).current_dir(&repo).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let v2 = rev("v2");

    // The deploy trail is the daemon's (its meta repo); the build and the start run on the node.
    let approval = json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": "alpha-v2"},
                          "spec": {"kind": "ApplyCommit", "target": "alpha", "payload": {"commit": v2},
                                   "summary": "v2 on the node"}});
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval).await.code, 201);
    ok(d.hive(&["approve", "alpha-v2"]));
    let done = eventually("the approval to be Deployed", || async {
        let a = api.get("/apis/hive.dev/v1/approvals/alpha-v2").await.body;
        matches!(a["status"]["phase"].as_str(), Some("Deployed" | "Failed")).then_some(a)
    })
    .await;
    assert_eq!(done["status"]["phase"], "Deployed", "{done}");
    let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
    assert_eq!(agent["status"]["appliedRev"], v2, "{agent}");
    assert_eq!(agent["status"]["power"], "Running", "{agent}");
    eventually("v2 to run under the node's worker", || async {
        let out = d.hive(&["logs", "agent/alpha", "--tail", "1"]);
        (String::from_utf8_lossy(&out.stdout).contains("hello from v2") && agents_under(worker).len() == 1)
            .then_some(())
    })
    .await;
    assert!(agents_under(d.pid()).is_empty(), "nothing ran on the daemon's host");
    let trail = ok(d.hive(&["audit", "alpha"]));
    assert!(trail.contains("deploy/alpha/1"), "{trail}");
}
