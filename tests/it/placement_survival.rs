//! Agents on rented nodes outlive the daemon: an agent placed on a Vast.ai node (the
//! in-process stand-in of the API, the instance's worker a real `hive fleet-worker` on
//! this host, as the instance's on-start runs it) keeps running through a graceful
//! daemon restart and is adopted as it runs — same process, same generation, nothing
//! rebuilt — when its worker rejoins; the boot sweep of a new hive base rebuilds it on
//! its node; killing the node marks it Lost and rents or starts nothing in its place.

use std::path::Path;

use serde_json::Value;

use crate::agents::config_repo;
use crate::fleet_myelin::{instance_worker, recovered, strs, vast_provision, Reap, Vast};
use crate::harness::{eventually, ok, Api, Daemon};
use crate::placement::{agents_under, condition, placed, ready};
use crate::vastai::{offers, Stand};

const AGENTS: &str = "/apis/hive.dev/v1/agents";
const NODES: &str = "/apis/hive.dev/v1/nodes";
const JOBS: &str = "/apis/hive.dev/v1/jobs";

/// The generation directory the worker's `current` link of `agent` points at.
pub(crate) fn generation(machine: &Path, agent: &str) -> std::path::PathBuf {
    std::fs::read_link(machine.join("agents").join(agent).join("current")).expect("the agent's current link")
}

/// Names of the Jobs that touch `agent`.
pub(crate) async fn jobs_of(api: &Api, agent: &str) -> Vec<Value> {
    let jobs = api.get(JOBS).await.body;
    let items = jobs["items"].as_array().cloned().unwrap_or_default();
    items
        .into_iter()
        .filter(|j| j["spec"]["agents"].as_array().is_some_and(|a| a.iter().any(|n| n == agent)))
        .collect()
}

/// Waits until `agent` is Ready with one process under `worker`; that process.
pub(crate) async fn running_under(api: &Api, agent: &str, worker: u32) -> u32 {
    ready(api, agent).await;
    eventually(&format!("{agent}'s one process under the worker"), || async {
        let pids = agents_under(worker);
        (pids.len() == 1).then(|| pids[0])
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_on_a_rented_node_outlives_a_restart_is_rebuilt_there_by_the_sweep_and_is_lost_with_it() {
    let (stand, base) = Stand::start(offers()).await;
    let vast = Vast::new(&base);
    let base1 = vast.flags(&["--agent-controller=true", "--hive-rev", "base-1"]);
    let mut d = Daemon::start_with(&strs(&base1));
    let api = d.client();
    vast.configure(&d);
    let tmp = tempfile::tempdir().unwrap();
    let repo = config_repo(tmp.path());
    let machine = tempfile::tempdir().unwrap();

    assert_eq!(api.post("/apis/hive.dev/v1/fleetcommands", &vast_provision("rent", &[101])).await.code, 201);
    eventually("node-1's instance", || async {
        api.get(&format!("{NODES}/node-1")).await.body["status"]["providerRef"]["instanceId"].as_u64()
    })
    .await;
    let create = stand.lock().last_create.clone();
    let worker = Reap(instance_worker(&create, machine.path()));
    let worker_pid = worker.0.id();
    eventually("node-1 Running", || async {
        (api.get(&format!("{NODES}/node-1")).await.body["status"]["phase"] == "Running").then_some(())
    })
    .await;
    assert_eq!(api.post(AGENTS, &placed("alpha", &repo, "node-1")).await.code, 201);
    let pid = running_under(&api, "alpha", worker_pid).await;
    let first = generation(machine.path(), "alpha");
    assert!(agents_under(d.pid()).is_empty(), "the daemon runs no agent itself");

    // A graceful restart leaves the rented node's agent running; the next daemon
    // adopts it as it runs once the worker rejoins: no Job rebuilds or restarts it.
    let before: Vec<String> = jobs_of(&api, "alpha")
        .await
        .iter()
        .map(|j| j["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    d.restart_with(&strs(&base1));
    let api = d.client();
    vast.configure(&d);
    recovered(&d, 2).await;
    eventually("node-1 to rejoin", || async {
        let n = api.get(&format!("{NODES}/node-1")).await.body;
        (n["status"]["runtime"]["joinedBy"] == "Rejoin" && n["status"]["phase"] == "Running").then_some(())
    })
    .await;
    assert_eq!(running_under(&api, "alpha", worker_pid).await, pid, "the same process, not restarted");
    let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
    assert_eq!(agent["status"]["power"], "Running", "{agent}");
    // Whatever the boot ran for it (a Reconcile that found it running), it built and
    // started nothing: the same generation, the same process, a while later too.
    for job in jobs_of(&api, "alpha").await {
        let name = job["metadata"]["name"].as_str().unwrap();
        if before.iter().any(|b| b == name) {
            continue;
        }
        assert_eq!(job["spec"]["template"], "Reconcile", "only a Reconcile after the restart: {job}");
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(agents_under(worker_pid), vec![pid], "still the same process");
    assert_eq!(generation(machine.path(), "alpha"), first, "no new generation");
    assert!(agents_under(d.pid()).is_empty(), "nothing started on the daemon's host");

    // A new hive base: the boot sweep rebuilds it on its node and starts it there.
    let base2 = vast.flags(&["--agent-controller=true", "--hive-rev", "base-2"]);
    d.restart_with(&strs(&base2));
    let api = d.client();
    vast.configure(&d);
    let sweep = eventually("the boot sweep", || async {
        let jobs = api.get(JOBS).await.body;
        jobs["items"].as_array()?.iter().find(|j| j["spec"]["template"] == "BootSweep").cloned()
    })
    .await;
    assert_eq!(sweep["spec"]["reason"], "boot sweep: 1 rebuild, 0 deferred, 0 up to date", "{sweep}");
    let sweep = crate::agents::wait_terminal(&api, sweep["metadata"]["name"].as_str().unwrap()).await;
    assert_eq!(sweep["status"]["phase"], "Done", "{}", sweep["status"]);
    let child = sweep["status"]["children"][0].as_str().expect("a rebuild child").to_string();
    let child = crate::agents::wait_terminal(&api, &child).await;
    assert_eq!(child["status"]["phase"], "Done", "{}", child["status"]);
    let rebuilt = running_under(&api, "alpha", worker_pid).await;
    assert_ne!(rebuilt, pid, "the rebuild started the new generation");
    assert_ne!(generation(machine.path(), "alpha"), first, "a new generation on the node");
    assert!(agents_under(d.pid()).is_empty(), "the rebuild ran on the node, not here");

    // Killing the node: the agent is Lost with it; nothing is rented or started instead.
    ok(d.hive(&["fleet", "kill", "node-1", "--command-id", "down"]));
    let lost = eventually("the agent to be observed Lost", || async {
        let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
        (agent["status"]["power"] == "Lost").then_some(agent)
    })
    .await;
    assert_eq!(condition(&lost, "NodeLost").unwrap()["status"], "True", "{lost}");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(stand.count("PUT /api/v0/asks/"), 1, "nothing was rented again");
    assert!(agents_under(d.pid()).is_empty(), "nothing started on the daemon's host");
    let nodes = api.get(NODES).await.body;
    assert_eq!(nodes["items"].as_array().unwrap().len(), 1, "no node was added: {nodes}");
    drop(worker);
}
