//! The daemon's `docker` provider end to end on the real engine (`HIVE_DOCKER_TESTS=1`):
//! node containers on a private network join the daemon over iroh, serve telemetry the
//! daemon pulls, are killed by command, survive a graceful daemon restart, are adopted,
//! rejoin with a RejoinHello under the new control generation; a record whose container
//! vanished is marked Stopped, and a labelled container without a record is reported as
//! an orphan and left running.

use std::process::{Command, Stdio};

use serde_json::Value;

use crate::fleet_docker::{docker_tests_enabled, node_image};
use crate::fleet_myelin::strs;
use crate::harness::{eventually, ok, Api, Daemon};

const NODES: &str = "/apis/hive.dev/v1/nodes";

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).stdin(Stdio::null()).output().expect("docker CLI");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Removes every container on the test's network, then the network.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let ids = docker(&["ps", "-aq", "--filter", &format!("network={}", self.0)]);
        for id in ids.lines().filter(|l| !l.is_empty()) {
            docker(&["rm", "-f", id]);
        }
        docker(&["network", "rm", &self.0]);
    }
}

async fn node(api: &Api, name: &str) -> Value {
    api.get(&format!("{NODES}/{name}")).await.body
}

async fn until(api: &Api, name: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    eventually(&format!("{name}: {what}"), || async {
        let n = node(api, name).await;
        done(&n).then_some(n)
    })
    .await
}

fn container_of(node: &Value) -> String {
    node["status"]["providerRef"]["containerId"].as_str().expect("containerId").to_string()
}

fn running(id: &str) -> bool {
    docker(&["inspect", "--format", "{{.State.Running}}", id]) == "true"
}

/// The node image, a fresh private network's name, and the flags of a daemon whose
/// default provider is docker on that network (plus `extra`), its fleet endpoint on a
/// fixed port, so surviving workers redial a restarted daemon there.
async fn docker_daemon_flags(extra: &[&str]) -> (String, String, Vec<String>) {
    let image = tokio::task::spawn_blocking(node_image).await.unwrap();
    let network = format!("hive-it-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let port = std::net::UdpSocket::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port();
    let mut flags: Vec<String> = extra.iter().map(|f| f.to_string()).collect();
    for flag in
        ["--provider", "docker", "--fleet-listen", &format!("0.0.0.0:{port}"), "--docker-image", &image]
    {
        flags.push(flag.to_string());
    }
    flags.extend(["--docker-network".to_string(), network.clone()]);
    (image, network, flags)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_nodes_join_are_killed_adopted_and_rejoin_after_a_restart() {
    if !docker_tests_enabled("docker_nodes_join_are_killed_adopted_and_rejoin_after_a_restart") {
        return;
    }
    let (image, network, flags) = docker_daemon_flags(&[]).await;
    let _cleanup = Cleanup(network.clone());
    let flags = strs(&flags);
    let mut d = Daemon::start_with(&flags);
    let api = d.client();

    let out = ok(d.hive(&["fleet", "provision", "--count", "3", "--command-id", "up"]));
    assert!(out.contains("up Succeeded"), "{out}");
    let mut generation = 0;
    for name in ["node-1", "node-2", "node-3"] {
        let n = node(&api, name).await;
        assert_eq!(n["status"]["phase"], "Running", "{n}");
        let id = container_of(&n);
        assert!(running(&id), "{name}'s container runs");
        let labels = docker(&["inspect", "--format", "{{json .Config.Labels}}", &id]);
        assert!(
            labels.contains(&format!("\"dev.hive.node\":\"{name}\""))
                && labels.contains("\"dev.hive.command\":\"up\""),
            "{labels}"
        );
        let runtime = &n["status"]["runtime"];
        assert_eq!(runtime["agentOnly"], true, "{n}");
        generation = runtime["controlGeneration"].as_u64().unwrap();
        let address = n["status"]["addresses"][0].as_str().unwrap();
        assert!(!address.starts_with("127."), "a container advertises its network address: {n}");
    }
    until(&api, "node-1", "telemetry", |n| n["status"]["telemetry"]["cpuPercent"].is_number()).await;

    // Kill removes the container and keeps the record.
    let victim = container_of(&node(&api, "node-2").await);
    ok(d.hive(&["fleet", "kill", "node-2", "--command-id", "down"]));
    assert_eq!(node(&api, "node-2").await["status"]["phase"], "Killed");
    assert!(docker(&["ps", "-aq", "--filter", &format!("id={victim}")]).is_empty(), "container removed");

    // A record whose container vanishes, and a labelled container nobody recorded.
    let gone = container_of(&node(&api, "node-3").await);
    docker(&["rm", "-f", &gone]);
    let survivor = container_of(&node(&api, "node-1").await);
    let fleet_label =
        docker(&["inspect", "--format", "{{index .Config.Labels \"dev.hive.fleet\"}}", &survivor]);
    // The orphan's worker dials this daemon too (and is refused: no record).
    let args: Vec<String> =
        serde_json::from_str(&docker(&["inspect", "--format", "{{json .Args}}", &survivor])).unwrap();
    let control = args.iter().skip_while(|a| *a != "--control").nth(1).expect("--control").clone();
    let orphan = docker(&[
        "run",
        "-d",
        "--network",
        &network,
        "--label",
        &format!("dev.hive.fleet={fleet_label}"),
        "--label",
        "dev.hive.node=node-40",
        "--label",
        "dev.hive.logical-id=40",
        "--label",
        "dev.hive.command=lost",
        &image,
        "hive",
        "fleet-worker",
        "--node",
        "node-40",
        "--logical-id",
        "40",
        "--supervise",
        "none",
        "--control",
        &control,
    ]);
    assert!(!orphan.is_empty(), "the orphan container started");

    // Graceful restart: containers are left running, then adopted; node-1's worker
    // rejoins under the new generation and its telemetry is pulled again.
    let before = node(&api, "node-1").await["status"]["telemetry"]["updatedAt"].clone();
    d.restart_with(&flags);
    let api = d.client();
    assert!(running(&survivor), "a graceful stop leaves containers running");
    let n1 = until(&api, "node-1", "rejoined", |n| {
        n["status"]["runtime"]["joinedBy"] == "Rejoin"
            && n["status"]["runtime"]["controlGeneration"].as_u64() > Some(generation)
    })
    .await;
    assert_eq!(container_of(&n1), survivor, "adopted, not recreated");
    until(&api, "node-1", "telemetry after the rejoin", |n| {
        n["status"]["telemetry"]["updatedAt"] != before && n["status"]["phase"] == "Running"
    })
    .await;
    let n3 = until(&api, "node-3", "stopped", |n| n["status"]["phase"] == "Stopped").await;
    assert!(n3["status"]["error"].as_str().unwrap().contains("not recreated"), "{n3}");
    let orphan_name = format!("orphan-docker-{}", &orphan[..12]);
    let o = until(&api, &orphan_name, "orphaned", |n| n["status"]["phase"] == "Orphaned").await;
    assert!(o["status"]["error"].as_str().unwrap().contains("node node-40 of command lost"), "{o}");
    assert!(running(&orphan), "the orphan is left running");
    assert_eq!(node(&api, "node-2").await["status"]["phase"], "Killed");
    let names = docker(&["ps", "-a", "--filter", &format!("network={network}"), "--format", "{{.Names}}"]);
    assert_eq!(names.lines().count(), 2, "nothing was recreated: {names}");

    // A worker that goes away is reported; its node and container are left as they are.
    docker(&["stop", "-t", "5", &survivor]);
    let n1 = until(&api, "node-1", "lost", |n| {
        n["status"]["error"].as_str().is_some_and(|e| e.contains("control connection was lost"))
    })
    .await;
    assert_eq!(n1["status"]["phase"], "Running", "{n1}");
}

/// The host pid of a container's worker: the child of its init (`docker run --init`)
/// that runs `hive fleet-worker`.
fn worker_pid(container: &str) -> u32 {
    let init: u32 =
        docker(&["inspect", "--format", "{{.State.Pid}}", container]).parse().expect("the container's pid");
    let children = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|pid| pid.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("fleet-worker"))
        })
        .unwrap_or_else(|| panic!("no fleet-worker under the container's init {init}: {children}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_on_a_docker_node_survives_a_graceful_restart_and_is_lost_with_its_node() {
    use crate::placement::{agents_under, condition, placed, ready};
    if !docker_tests_enabled(
        "an_agent_on_a_docker_node_survives_a_graceful_restart_and_is_lost_with_its_node",
    ) {
        return;
    }
    let (_, network, flags) = docker_daemon_flags(&["--agent-controller=true"]).await;
    let _cleanup = Cleanup(network.clone());
    let flags = strs(&flags);
    let mut d = Daemon::start_with(&flags);
    let api = d.client();
    let tmp = tempfile::tempdir().unwrap();
    let repo = crate::agents::config_repo(tmp.path());
    let out = ok(d.hive(&["fleet", "provision", "--count", "1", "--command-id", "up"]));
    assert!(out.contains("up Succeeded"), "{out}");
    let container =
        container_of(&until(&api, "node-1", "running", |n| n["status"]["phase"] == "Running").await);
    let worker = worker_pid(&container);

    // Placed on the container node: built there from the shipped commit, run by its worker.
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &placed("alpha", &repo, "node-1")).await.code, 201);
    ready(&api, "alpha").await;
    let pids = eventually("the agent's process in the container", || async {
        let pids = agents_under(worker);
        (pids.len() == 1).then_some(pids)
    })
    .await;
    let current = format!("/proc/{worker}/root/var/lib/hive-worker/agents/alpha/current");
    let generation = std::fs::read_link(&current).expect("the agent's current generation in the container");
    assert!(agents_under(d.pid()).is_empty(), "the daemon runs no agent itself");

    // A graceful restart leaves it running; the next daemon adopts it as it runs.
    d.restart_with(&flags);
    let api = d.client();
    until(&api, "node-1", "rejoined", |n| {
        n["status"]["runtime"]["joinedBy"] == "Rejoin" && n["status"]["phase"] == "Running"
    })
    .await;
    ready(&api, "alpha").await;
    let agent = api.get("/apis/hive.dev/v1/agents/alpha").await.body;
    assert_eq!(agent["status"]["power"], "Running", "{agent}");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(agents_under(worker), pids, "the same process, not restarted");
    assert_eq!(std::fs::read_link(&current).unwrap(), generation, "no new generation");

    // Killing the node removes the container; the agent is Lost and nothing is recreated.
    ok(d.hive(&["fleet", "kill", "node-1", "--command-id", "down"]));
    let lost = eventually("the agent to be observed Lost", || async {
        let agent = api.get("/apis/hive.dev/v1/agents/alpha").await.body;
        (agent["status"]["power"] == "Lost").then_some(agent)
    })
    .await;
    assert_eq!(condition(&lost, "NodeLost").unwrap()["status"], "True", "{lost}");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let names = docker(&["ps", "-a", "--filter", &format!("network={network}"), "--format", "{{.Names}}"]);
    assert!(names.trim().is_empty(), "nothing was recreated: {names}");
    assert!(agents_under(d.pid()).is_empty(), "nothing started on the daemon's host");
    let nodes = api.get(NODES).await.body;
    assert_eq!(nodes["items"].as_array().unwrap().len(), 1, "no node was added: {nodes}");
}
