//! The fleet: idempotent Provision/Kill commands, `process` workers supervised over
//! their stdin pipe, monotonic logical ids, and the daemon's durable identity.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{eventually, ok, Api, Daemon};

const COMMANDS: &str = "/apis/hive.dev/v1/fleetcommands";
const NODES: &str = "/apis/hive.dev/v1/nodes";

fn provision(id: &str, count: u32) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
           "spec": {"provision": {"provider": "process", "count": count}}})
}

fn kill(id: &str, node: &str) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
           "spec": {"kill": {"node": node}}})
}

async fn list(api: &Api, path: &str) -> Vec<Value> {
    let reply = api.get(path).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    reply.body["items"].as_array().cloned().unwrap_or_default()
}

/// Polls `check` until it returns `Some`, for up to 30 s.
/// Waits until the command is terminal and every node it names is in `phase`.
async fn settled(api: &Api, id: &str, phase: &str) -> Vec<Value> {
    eventually(&format!("command {id} to settle with nodes {phase}"), || async {
        let command = api.get(&format!("{COMMANDS}/{id}")).await.body;
        if command["status"]["phase"] != "Succeeded" {
            return None;
        }
        let mut nodes = Vec::new();
        for name in command["status"]["nodes"].as_array()? {
            let node = api.get(&format!("{NODES}/{}", name.as_str()?)).await.body;
            (node["status"]["phase"] == phase).then_some(())?;
            nodes.push(node);
        }
        Some(nodes)
    })
    .await
}

/// The node's telemetry summary once it is present (and, given `previous`, once it
/// differs from it: telemetry keeps flowing).
async fn telemetry_of(api: &Api, node: &str, previous: Option<&Value>) -> Value {
    eventually("telemetry in the node status", || async {
        let node = api.get(&format!("{NODES}/{node}")).await.body;
        let t = node["status"]["telemetry"].clone();
        let fields = ["cpuPercent", "memoryTotalBytes", "diskTotalBytes", "uptimeSeconds"];
        (fields.iter().all(|f| t[f].is_number()) && previous != Some(&t)).then_some(t)
    })
    .await
}

fn pid_of(node: &Value) -> u32 {
    node["status"]["providerRef"]["pid"].as_u64().expect("providerRef.pid") as u32
}

/// `/proc/<pid>/stat` fields after the command name: state, ppid, …
fn stat(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(String::from).collect())
}

/// A live (not zombie) process.
fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| s[0] != "Z")
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Live `fleet-worker` children of `parent`.
fn workers_of(parent: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Some(fields) = stat(pid) else { continue };
        if fields[0] != "Z" && fields[1] == parent.to_string() && cmdline(pid).contains("fleet-worker") {
            pids.push(pid);
        }
    }
    pids
}

async fn all_gone(pids: &[u32]) {
    eventually("worker processes to exit", || async { pids.iter().all(|p| !alive(*p)).then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn provision_then_kill_keeps_the_record() {
    let d = Daemon::start();
    let api = d.client();
    let out = ok(d.hive(&["fleet", "provision", "--count", "3", "--command-id", "first"]));
    assert!(out.contains("first Succeeded"), "{out}");
    let nodes = settled(&api, "first", "Running").await;
    let names: Vec<&str> = nodes.iter().map(|n| n["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["node-1", "node-2", "node-3"]);
    for node in &nodes {
        let pid = pid_of(node);
        assert!(alive(pid), "worker {pid} runs");
        assert!(cmdline(pid)
            .contains(&format!("fleet-worker --node {}", node["metadata"]["name"].as_str().unwrap())));
        assert_eq!(node["spec"]["command"], "first");
        assert_eq!(node["spec"]["provider"], "process", "the daemon's default provider was filled in");
        assert!(node["status"]["readyAt"].is_string());
        // Joined over iroh (on loopback) in agent-only mode, before it was Running.
        let runtime = &node["status"]["runtime"];
        assert_eq!(
            (runtime["agentOnly"].as_bool(), runtime["joinedBy"].as_str()),
            (Some(true), Some("Join")),
            "{node}"
        );
        assert!(runtime["cpus"].as_u64().unwrap() >= 1, "{node}");
        assert!(node["status"]["endpointId"].as_str().is_some_and(|e| e.len() == 64), "{node}");
        for address in node["status"]["addresses"].as_array().unwrap() {
            assert!(address.as_str().unwrap().starts_with("127.0.0.1:"), "iroh stays on loopback: {node}");
        }
    }
    // Telemetry is pulled: the summary lands in the status, and changes.
    let first = telemetry_of(&api, "node-1", None).await;
    telemetry_of(&api, "node-1", Some(&first)).await;
    let stream = api.get("/hive/v1/fleet/nodes/node-1/telemetry?follow=false").await;
    assert_eq!(stream.code, 200);
    // NDJSON: the harness keeps a body that is not one JSON document as text.
    let text = stream.body.as_str().unwrap_or_default().to_string();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["type"], "descriptors");
    let channels: Vec<&str> =
        lines[0]["channels"].as_array().unwrap().iter().map(|c| c["channel"].as_str().unwrap()).collect();
    for channel in ["cpu.percent", "memory.used_bytes", "disk.used_bytes", "uptime.seconds"] {
        assert!(channels.contains(&channel), "{channel} in {channels:?}");
    }
    assert!(lines[1..].iter().any(|f| f["type"] == "frame" && f["channel"] == "cpu.percent"), "{lines:?}");
    assert_eq!(api.get("/hive/v1/fleet/nodes/node-99/telemetry").await.code, 404);
    assert!(!ok(d.hive(&["--help"])).contains("fleet-worker"), "the worker mode is hidden");
    let status = ok(d.hive(&["fleet", "status"]));
    assert!(status.starts_with("PROVIDERS") && status.contains("process   process   Ready"), "{status}");
    assert!(status.contains("first   provision 3 × process   Succeeded"), "{status}");
    let node_rows: Vec<&str> = status.lines().skip_while(|l| *l != "NODES").skip(2).collect();
    assert!(node_rows[1].starts_with("node-2") && node_rows[1].contains("Running"), "{status}");
    assert!(node_rows[0].contains('%'), "CPU telemetry in the table: {status}");

    let victim = pid_of(&nodes[1]);
    ok(d.hive(&["fleet", "kill", "node-2", "--command-id", "kill-2"]));
    let killed = api.get(&format!("{NODES}/node-2")).await.body;
    assert_eq!(killed["status"]["phase"], "Killed", "{killed}");
    assert_eq!(killed["metadata"]["annotations"]["hive.dev/killed-by"], "kill-2");
    all_gone(&[victim]).await;
    assert!(alive(pid_of(&nodes[0])) && alive(pid_of(&nodes[2])), "the other workers keep running");
    assert_eq!(list(&api, NODES).await.len(), 3, "the killed node's record is kept");
    // A killed node's telemetry is over: a kill drops what was held of it, and the
    // answer says so (issue 32: it was a 200 with nothing in it), at once.
    let over =
        tokio::time::timeout(Duration::from_secs(10), api.get("/hive/v1/fleet/nodes/node-2/telemetry")).await;
    let over = over.expect("a killed node's telemetry answers");
    assert_eq!(over.code, 409, "{:?}", over.body);
    let message = over.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("\"node-2\" is Killed"), "{message}");
    // Re-sending the kill returns the stored record and changes nothing.
    let again = api.post(COMMANDS, &kill("kill-2", "node-2")).await;
    assert_eq!(again.code, 200, "{:?}", again.body);
    assert_eq!(again.body["status"]["phase"], "Succeeded");
    // Killing a node that does not exist is refused, naming the field.
    let missing = api.post(COMMANDS, &kill("kill-9", "node-9")).await;
    assert_eq!(missing.code, 422, "{:?}", missing.body);
    assert!(missing.body["message"].as_str().unwrap().contains("spec.kill.node"), "{:?}", missing.body);
    assert_eq!(api.get(&format!("{COMMANDS}/kill-9")).await.code, 404);
    // Without --command-id, one is generated and printed so that a retry can reuse it.
    let out = d.hive(&["fleet", "provision", "--count", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let id =
        stderr.split("command id: ").nth(1).and_then(|r| r.split_whitespace().next()).expect("printed id");
    let retried = ok(d.hive(&["fleet", "provision", "--count", "1", "--command-id", id]));
    assert!(retried.contains("node-4 Running"), "the retry reports the same node: {retried}");
    assert_eq!(list(&api, NODES).await.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn a_replayed_command_id_creates_once() {
    let d = Daemon::start();
    let api = d.client();
    let mut posts = Vec::new();
    for _ in 0..100 {
        let api = api.clone();
        posts.push(tokio::spawn(async move { api.post(COMMANDS, &provision("same", 3)).await }));
    }
    let mut codes = Vec::new();
    for post in posts {
        let reply = post.await.unwrap();
        assert_eq!(reply.body["metadata"]["name"], "same", "{:?}", reply.body);
        codes.push(reply.code);
    }
    assert_eq!(codes.iter().filter(|c| **c == 201).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 200).count(), 99, "{codes:?}");
    let nodes = settled(&api, "same", "Running").await;
    assert_eq!(nodes.len(), 3);
    assert_eq!(list(&api, COMMANDS).await.len(), 1);
    assert_eq!(list(&api, NODES).await.len(), 3);
    let daemon_pid: u32 = stat(pid_of(&nodes[0])).unwrap()[1].parse().unwrap();
    let mut workers = workers_of(daemon_pid);
    workers.sort();
    let mut want: Vec<u32> = nodes.iter().map(pid_of).collect();
    want.sort();
    assert_eq!(workers, want, "exactly one worker per node");

    let before = api.get(&format!("{COMMANDS}/same")).await.body;
    // Another body under a used id: the original record, and a warning saying so.
    let reused = api.post(COMMANDS, &provision("same", 4)).await;
    assert_eq!(reused.code, 200, "{:?}", reused.body);
    assert_eq!(reused.body, before);
    let warning = reused.headers.get("warning").and_then(|w| w.to_str().ok()).unwrap_or_default();
    assert!(warning.contains("\\\"same\\\"") && warning.contains("different body"), "{warning}");
    assert_eq!(api.get(&format!("{COMMANDS}/same")).await.body, before);
    assert_eq!(list(&api, NODES).await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logical_ids_are_never_reused() {
    let mut d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post(COMMANDS, &provision("a", 2)).await.code, 201);
    let nodes = settled(&api, "a", "Running").await;
    let ids: Vec<u64> = nodes.iter().map(|n| n["spec"]["logicalId"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1, 2]);
    let pids: Vec<u32> = nodes.iter().map(pid_of).collect();
    assert_eq!(api.post(COMMANDS, &kill("k", "node-2")).await.code, 201);
    settled(&api, "k", "Killed").await;
    assert_eq!(api.delete(&format!("{NODES}/node-2")).await.code, 200);

    // kill -9: the supervision pipe closes, so the workers end with the daemon.
    d.restart();
    all_gone(&pids).await;
    let api = d.client();
    let left = api.get(&format!("{NODES}/node-1")).await.body;
    assert_eq!(left["status"]["phase"], "Stopped", "a worker of a previous run is not adopted: {left}");
    assert_eq!(api.post(COMMANDS, &provision("b", 1)).await.code, 201);
    let nodes = settled(&api, "b", "Running").await;
    assert_eq!(nodes[0]["metadata"]["name"], "node-3");
    assert_eq!(nodes[0]["spec"]["logicalId"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_racing_its_provision_ends_killed_with_no_worker() {
    let d = Daemon::start();
    let api = d.client();
    for round in 0..5 {
        let (p, k, node) = (format!("p{round}"), format!("k{round}"), format!("node-{}", round + 1));
        assert_eq!(api.post(COMMANDS, &provision(&p, 1)).await.code, 201);
        assert_eq!(api.post(COMMANDS, &kill(&k, &node)).await.code, 201);
        settled(&api, &k, "Killed").await;
        eventually("the provision to finish", || async {
            let c = api.get(&format!("{COMMANDS}/{p}")).await.body;
            matches!(c["status"]["phase"].as_str(), Some("Succeeded" | "Failed")).then_some(())
        })
        .await;
        let record = api.get(&format!("{NODES}/{node}")).await.body;
        assert_eq!(record["status"]["phase"], "Killed", "the kill's outcome stands: {record}");
        if let Some(pid) = record["status"]["providerRef"]["pid"].as_u64() {
            all_gone(&[pid as u32]).await;
        }
    }
    assert!(workers_of(d.pid()).is_empty(), "no worker outlives its kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_without_the_node_join_token_is_refused() {
    let d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post(COMMANDS, &provision("p", 1)).await.code, 201);
    let node = settled(&api, "p", "Running").await.remove(0);
    let pid = pid_of(&node);
    // The token is in the worker's environment only, never on its command line or in the API.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let token = String::from_utf8_lossy(&environ)
        .split('\0')
        .find_map(|v| v.strip_prefix("HIVE_JOIN_TOKEN=").map(str::to_string))
        .expect("the worker has its join token");
    assert!(!cmdline(pid).contains(&token));
    assert!(!api.get(NODES).await.body.to_string().contains(&token));
    // An impostor dialling the same control target as node-1, without the token.
    let args = cmdline(pid);
    let control = args.split_whitespace().skip_while(|a| *a != "--control").nth(1).unwrap().to_string();
    let mut impostor = std::process::Command::new(crate::harness::hive_bin())
        .args(["fleet-worker", "--node", "node-1", "--logical-id", "1", "--supervise", "none"])
        .args(["--bind", "127.0.0.1:0", "--control", &control])
        .env_remove("HIVE_JOIN_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually("the impostor to be refused", || async {
        d.log().contains("node-1: the join token is missing or wrong").then_some(())
    })
    .await;
    let _ = impostor.kill();
    let _ = impostor.wait();
    let after = api.get(&format!("{NODES}/node-1")).await.body;
    assert_eq!(after["status"]["endpointId"], node["status"]["endpointId"], "the impostor changed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_fleet_requests_name_the_field_and_change_nothing() {
    let d = Daemon::start();
    let api = d.client();
    let revision = |reply: crate::harness::Reply| reply.body["metadata"]["resourceVersion"].clone();
    // Let the start-up writes (built-in Provider and its status) settle first.
    eventually("the process provider's status", || async {
        let p = api.get("/apis/hive.dev/v1/providers/process").await.body;
        p["status"]["state"].is_string().then_some(())
    })
    .await;
    let before = revision(api.get(NODES).await);
    let cases: Vec<(&str, &str, Option<Value>, u16, &str)> = vec![
        ("GET", "/hive/v1/fleet/offers?maxPrice=cheap", None, 400, "maxPrice"),
        ("GET", "/hive/v1/fleet/offers?gpus=1", None, 400, "gpus"),
        ("GET", "/hive/v1/fleet/offers?maxPrice=-1", None, 400, "maxPrice"),
        ("GET", "/hive/v1/fleet/offers?provider=process", None, 400, "only Vast.ai providers have offers"),
        ("GET", "/hive/v1/fleet/nodes/node-1/telemetry?follow=perhaps", None, 400, "follow"),
        ("GET", "/hive/v1/fleet/nodes/node-404/telemetry", None, 404, "node-404"),
        (
            "POST",
            "/hive/v1/fleet/providers/process/configure",
            Some(json!({"apiKey": "k"})),
            422,
            "spec.type",
        ),
        ("POST", "/hive/v1/fleet/providers/nope/configure", Some(json!({})), 404, "nope"),
        ("POST", "/hive/v1/fleet/providers/vastai/configure", Some(json!({"apiKee": "k"})), 400, "apiKee"),
        ("POST", "/hive/v1/fleet/providers/vastai/configure", Some(json!({"apiKey": 5})), 400, "apiKey"),
        ("POST", "/hive/v1/fleet/providers/vastai/configure", Some(json!({"diskGb": 2})), 422, "diskGb"),
        (
            "POST",
            "/hive/v1/fleet/providers/vastai/configure",
            Some(json!({"baseUrl": "ftp://x"})),
            422,
            "baseUrl",
        ),
        ("POST", COMMANDS, Some(provision("huge", 1001)), 422, "spec.provision.count"),
        ("POST", COMMANDS, Some(kill("kill-missing", "node-9")), 422, "spec.kill.node"),
    ];
    for (method, path, body, code, needle) in cases {
        let reply = match body {
            Some(body) => api.send(method, path, "application/json", Some(body.to_string())).await,
            None => api.get(path).await,
        };
        assert_eq!(reply.code, code, "{method} {path}: {}", reply.body);
        let text = reply.body.to_string();
        assert!(text.contains(needle), "{method} {path} names {needle:?}: {text}");
        assert!(!text.contains("\"k\""), "an error never echoes a key: {text}");
    }
    // A wrongly typed key is not quoted back either.
    let typed =
        api.post("/hive/v1/fleet/providers/vastai/configure", &json!({"apiKey": ["s3cret-key"]})).await;
    assert_eq!(typed.code, 400);
    assert!(!typed.body.to_string().contains("s3cret-key"), "{}", typed.body);
    assert_eq!(revision(api.get(NODES).await), before, "nothing was written");
    assert_eq!(api.get("/apis/hive.dev/v1/providers/vastai").await.code, 404, "no Provider was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_node_record_stops_its_local_worker() {
    let d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post(COMMANDS, &provision("p", 2)).await.code, 201);
    let nodes = settled(&api, "p", "Running").await;
    assert_eq!(api.delete(&format!("{NODES}/node-1")).await.code, 200);
    all_gone(&[pid_of(&nodes[0])]).await;
    assert!(alive(pid_of(&nodes[1])), "the other worker runs on");
    // The endpoint was bound on loopback only (the harness's --fleet-listen).
    let log = d.log();
    let bound = log.lines().find(|l| l.contains("fleet endpoint bound")).expect("bound line");
    assert!(bound.contains("127.0.0.1:") && !bound.contains("0.0.0.0"), "{bound}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_that_dies_fails_its_node() {
    let d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post(COMMANDS, &provision("p", 1)).await.code, 201);
    let pid = pid_of(&settled(&api, "p", "Running").await[0]);
    assert!(std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    let node = eventually("the node to fail", || async {
        let node = api.get(&format!("{NODES}/node-1")).await.body;
        (node["status"]["phase"] == "Failed").then_some(node)
    })
    .await;
    assert!(node["status"]["error"].as_str().unwrap().contains("exited unexpectedly"), "{node}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_stops_the_workers_and_clears_their_records() {
    let mut d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post(COMMANDS, &provision("p", 2)).await.code, 201);
    let pids: Vec<u32> = settled(&api, "p", "Running").await.iter().map(pid_of).collect();
    d.restart_with(&[]);
    all_gone(&pids).await;
    let api = d.client();
    // Local workers cannot be adopted: a graceful stop clears their records (a crash
    // leaves them to be marked Stopped, see logical_ids_are_never_reused).
    assert_eq!(list(&api, NODES).await, Vec::<Value>::new());
    let command = api.get(&format!("{COMMANDS}/p")).await.body;
    assert_eq!(command["status"]["phase"], "Succeeded", "the command record stays: {command}");
    // Ids stay unique after the records are gone.
    assert_eq!(api.post(COMMANDS, &provision("q", 1)).await.code, 201);
    assert_eq!(settled(&api, "q", "Running").await[0]["spec"]["logicalId"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_identity_is_stable_and_a_corrupt_one_refuses_to_start() {
    use std::os::unix::fs::PermissionsExt;
    let mut d = Daemon::start();
    let path = d.dir.join("identity.key");
    let key = std::fs::read(&path).unwrap();
    assert_eq!(key.len(), 32);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    d.restart();
    assert_eq!(std::fs::read(&path).unwrap(), key, "the same key after a restart");
    // The log names the key only by its fingerprint (ANSI colour codes stripped).
    let log = strip_ansi(&d.log());
    let fingerprints: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("fleet identity loaded"))
        .filter_map(|l| l.split("fingerprint=").nth(1)?.split_whitespace().next())
        .collect();
    assert_eq!(fingerprints.len(), 2, "{log}");
    assert_eq!(fingerprints[0], fingerprints[1]);
    assert_eq!(fingerprints[0].len(), 8);

    d.kill9();
    std::fs::write(&path, &key[..10]).unwrap();
    let err = Daemon::spawn(&d.dir, &[]).err().expect("a truncated identity refuses to start");
    assert!(err.contains(&path.display().to_string()) && err.contains("--reset-state"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), &key[..10], "the file is left alone");
    let fresh = Daemon::spawn(&d.dir, &["--reset-state"]).expect("--reset-state clears it");
    let new_key = std::fs::read(&path).unwrap();
    assert_eq!(new_key.len(), 32);
    assert_ne!(new_key, key);
    drop(fresh);
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
