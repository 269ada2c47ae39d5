//! Myelin's promises through the real daemon (issue 29): a node whose first telemetry is
//! slow stays Provisioning and becomes Running, never Failed; provider state is ground
//! truth at recovery (a Stopped node whose instance runs again is adopted and its worker
//! accepted); and `--reset-state` never makes a leased instance invisible (it is
//! reported as an orphan and left alone). Workers are real `hive fleet-worker`
//! processes; Vast.ai is the stand-in of `vastai.rs`.

use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

use crate::harness::{eventually, hive_bin, ok, Api, Daemon};
use crate::vastai::{offers, Stand, KEY};

const COMMANDS: &str = "/apis/hive.dev/v1/fleetcommands";
const NODES: &str = "/apis/hive.dev/v1/nodes";

async fn node(api: &Api, name: &str) -> Value {
    api.get(&format!("{NODES}/{name}")).await.body
}

fn condition<'a>(node: &'a Value, type_: &str) -> Option<&'a Value> {
    node["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// Sends SIGCONT to a stopped worker when dropped, so a failing test leaves no frozen
/// process behind (the daemon's shutdown then stops it).
struct Continue(Option<u32>);

impl Continue {
    fn now(&mut self) {
        if let Some(pid) = self.0.take() {
            let _ = Command::new("kill").args(["-CONT", &pid.to_string()]).status();
        }
    }
}

impl Drop for Continue {
    fn drop(&mut self) {
        self.now();
    }
}

/// A stand-in `nvidia-smi` in `dir/bin`: until `dir/released` exists, every call writes
/// the calling worker's pid to `dir/stopped`, stops the worker with SIGSTOP and waits
/// for the release (its exit while the worker is stopped could make the kernel continue
/// an orphaned process group), so the worker is late by as long as the test keeps it
/// stopped; then it answers "no GPU". Each call is traced in `dir/trace`.
fn stopping_nvidia_smi(dir: &std::path::Path) {
    let script = format!(
        "#!/bin/sh\nd={dir}\necho \"$(date +%T.%N) pid=$PPID\" >> \"$d/trace\"\n\
         if [ ! -e \"$d/released\" ]; then\n\
         echo $PPID > \"$d/stopped.tmp\"; mv \"$d/stopped.tmp\" \"$d/stopped\"; kill -STOP $PPID\n\
         while [ ! -e \"$d/released\" ]; do sleep 0.1; done\nfi\nexit 1\n",
        dir = dir.display()
    );
    // Written aside and put in place by `install`, so no process of the suite ever holds
    // the stand-in open for writing: a child another test forks meanwhile would keep that
    // descriptor until its exec, and the worker's exec of the stand-in would fail with
    // ETXTBSY (no stand-in run, no stop).
    let draft = dir.join("nvidia-smi.draft");
    std::fs::write(&draft, script).unwrap();
    let installed =
        Command::new("install").arg("-m").arg("755").arg(&draft).arg(dir.join("bin/nvidia-smi")).status();
    assert!(installed.unwrap().success(), "installing the stand-in nvidia-smi");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_first_telemetry_keeps_a_node_provisioning_then_running_never_failed() {
    let bin = tempfile::tempdir().unwrap();
    std::fs::create_dir(bin.path().join("bin")).unwrap();
    stopping_nvidia_smi(bin.path());
    let path = format!("{}:{}", bin.path().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    // Each attempt to pull telemetry waits 2 s (`--fleet-telemetry-wait`, here as its
    // variable) before it is retried.
    let d = Daemon::start_with_env(&[], &[("PATH", &path), ("HIVE_FLEET_TELEMETRY_WAIT", "2s")]);
    let api = d.client();
    let provision = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "slow"},
                           "spec": {"provision": {"provider": "process", "count": 1}}});
    assert_eq!(api.post(COMMANDS, &provision).await.code, 201);

    // The worker is stopped when it asks for its GPUs: first for its join's facts (let
    // it go on until the node has joined), then at its first telemetry pull.
    let stopped = bin.path().join("stopped");
    let mut worker = loop {
        let pid: u32 = eventually("the worker to be stopped", || async {
            std::fs::read_to_string(&stopped).ok()?.trim().parse().ok()
        })
        .await;
        let mut worker = Continue(Some(pid));
        if node(&api, "node-1").await["status"]["runtime"]["joinedAt"].is_string() {
            break worker;
        }
        std::fs::remove_file(&stopped).unwrap();
        worker.now();
    };

    // However long it takes, the node waits, saying so; it is never Failed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let waiting = loop {
        let n = node(&api, "node-1").await;
        assert_ne!(n["status"]["phase"], "Failed", "a slow node is slow, not Failed: {n}");
        if condition(&n, "Telemetry").is_some_and(|c| c["reason"] == "WaitingForTelemetry") {
            break n;
        }
        if std::time::Instant::now() > deadline {
            let log = d.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            let trace = std::fs::read_to_string(bin.path().join("trace")).unwrap_or_default();
            panic!("node-1 never said it waits for telemetry: {n}\n{trace}\n{}", tail.join("\n"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(waiting["status"]["phase"], "Provisioning", "{waiting}");
    assert_eq!(condition(&waiting, "Telemetry").unwrap()["status"], "False", "{waiting}");
    assert_eq!(condition(&waiting, "Ready").unwrap()["status"], "False", "{waiting}");
    assert_eq!(api.get(&format!("{COMMANDS}/slow")).await.body["status"]["phase"], "Running");

    // It describes its telemetry at last: Running, through the pull retried meanwhile.
    std::fs::write(bin.path().join("released"), "").unwrap();
    worker.now();
    let running = eventually("node-1 Running", || async {
        let n = node(&api, "node-1").await;
        assert_ne!(n["status"]["phase"], "Failed", "a slow node is slow, not Failed: {n}");
        (n["status"]["phase"] == "Running").then_some(n)
    })
    .await;
    assert_eq!(condition(&running, "Telemetry").unwrap()["status"], "True", "{running}");
    assert!(running["status"]["readyAt"].is_string(), "{running}");
    assert!(running["status"]["error"].is_null(), "{running}");
    eventually("the command to succeed", || async {
        let c = api.get(&format!("{COMMANDS}/slow")).await.body;
        (c["status"]["phase"] == "Succeeded").then_some(())
    })
    .await;
    eventually("telemetry in the node status", || async {
        node(&api, "node-1").await["status"]["telemetry"]["cpuPercent"].is_number().then_some(())
    })
    .await;
    assert!(d.log().contains("fleet node waits for its telemetry"));
}

pub(crate) fn vast_provision(id: &str, offers: &[u64]) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
           "spec": {"provision": {"provider": "vastai", "count": offers.len(), "selectedOfferIds": offers}}})
}

/// A daemon with the `vastai` provider at `base` whose fleet endpoint keeps one port
/// across restarts (so the instances' workers find it).
pub(crate) struct Vast {
    flags: Vec<String>,
    key: tempfile::TempDir,
}

impl Vast {
    pub(crate) fn new(base: &str) -> Vast {
        let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let flags = ["--provider", "vastai", "--vastai-base-url", base, "--fleet-listen"];
        let mut flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
        flags.push(format!("127.0.0.1:{port}"));
        let key = tempfile::tempdir().unwrap();
        std::fs::write(key.path().join("key"), format!("{KEY}\n")).unwrap();
        Vast { flags, key }
    }

    pub(crate) fn flags(&self, more: &[&str]) -> Vec<String> {
        self.flags.iter().cloned().chain(more.iter().map(|f| f.to_string())).collect()
    }

    /// Gives the daemon the key (held in memory only, so once per run).
    pub(crate) fn configure(&self, d: &Daemon) {
        let key = self.key.path().join("key");
        let key = key.to_str().unwrap();
        ok(d.hive(&["fleet", "configure", "vastai", "--api-key-file", key, "--image", "example/node:cuda"]));
    }
}

pub(crate) fn strs(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

/// Waits until the daemon's log says recovery of the vastai provider finished `n` times
/// (once per run, counted over every run of this state dir).
pub(crate) async fn recovered(d: &Daemon, n: usize) {
    eventually(&format!("recovery #{n}"), || async {
        let log = d.log();
        let done = log.lines().filter(|l| l.contains("fleet recovery done") && l.contains("vastai")).count();
        (done >= n).then_some(())
    })
    .await;
}

/// Runs what a Vast.ai instance's on-start runs: `hive fleet-worker --supervise none`
/// configured by the instance's environment, as the create request gave it, with its
/// agents' state in `state` (a rented machine's `/var/lib/hive-worker`).
pub(crate) fn instance_worker(create: &Value, state: &std::path::Path) -> Child {
    let mut command = Command::new(hive_bin());
    command.args(["fleet-worker", "--supervise", "none"]).env("HIVE_FLEET_BIND", "127.0.0.1:0");
    command.env("HIVE_WORKER_STATE_DIR", state);
    for (key, value) in create["env"].as_object().expect("the create's env") {
        command.env(key, value.as_str().unwrap());
    }
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("worker")
}

/// Kills a worker process when dropped.
pub(crate) struct Reap(pub(crate) Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_node_whose_instance_runs_again_is_adopted_and_its_worker_accepted() {
    let (stand, base) = Stand::start(offers()).await;
    let vast = Vast::new(&base);
    let mut d = Daemon::start_with(&strs(&vast.flags(&[])));
    let api = d.client();
    vast.configure(&d);
    assert_eq!(api.post(COMMANDS, &vast_provision("rent", &[101])).await.code, 201);
    let instance = eventually("node-1's instance", || async {
        node(&api, "node-1").await["status"]["providerRef"]["instanceId"].as_u64()
    })
    .await;
    let create = stand.lock().last_create.clone();
    let machine = tempfile::tempdir().unwrap();
    let first = Reap(instance_worker(&create, machine.path()));
    eventually("node-1 Running", || async {
        (node(&api, "node-1").await["status"]["phase"] == "Running").then_some(())
    })
    .await;

    // The instance stops (its worker with it); the next daemon finds it stopped.
    drop(first);
    stand.lock().instances.get_mut(&instance).unwrap()["actual_status"] = json!("exited");
    d.restart_with(&strs(&vast.flags(&[])));
    let api = d.client();
    vast.configure(&d);
    recovered(&d, 2).await;
    let n1 = node(&api, "node-1").await;
    assert_eq!(n1["status"]["phase"], "Stopped", "{n1}");

    // The operator starts it again at Vast.ai. The next daemon observes it running:
    // adopted, waiting for its worker (not ignored because its record said Stopped).
    stand.lock().instances.get_mut(&instance).unwrap()["actual_status"] = json!("running");
    d.restart_with(&strs(&vast.flags(&[])));
    let api = d.client();
    vast.configure(&d);
    recovered(&d, 3).await;
    let n1 = node(&api, "node-1").await;
    assert_eq!(n1["status"]["phase"], "Provisioning", "adopted: {n1}");
    assert!(n1["status"]["error"].as_str().unwrap_or_default().contains("adopted"), "{n1}");
    assert!(n1["status"]["finishedAt"].is_null(), "{n1}");

    // Its on-start runs the worker again: accepted, and Running once telemetry flows.
    let _second = Reap(instance_worker(&create, machine.path()));
    let n1 = eventually("node-1 Running again", || async {
        let n = node(&api, "node-1").await;
        (n["status"]["phase"] == "Running").then_some(n)
    })
    .await;
    assert_eq!(n1["status"]["providerRef"]["instanceId"], instance, "{n1}");
    assert!(!d.log().contains("fleet: worker refused"), "the worker was accepted");
    eventually("telemetry in the node status", || async {
        node(&api, "node-1").await["status"]["telemetry"]["cpuPercent"].is_number().then_some(())
    })
    .await;
    assert_eq!(stand.count("PUT /api/v0/asks/"), 1, "nothing was rented again");
    assert_eq!(stand.count("DELETE /api/v0/instances/"), 0, "nothing was destroyed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reset_state_reports_the_earlier_identitys_instances_as_orphans_and_touches_nothing() {
    let (stand, base) = Stand::start(offers()).await;
    let vast = Vast::new(&base);
    let mut d = Daemon::start_with(&strs(&vast.flags(&[])));
    let api = d.client();
    vast.configure(&d);
    assert_eq!(api.post(COMMANDS, &vast_provision("rent", &[101])).await.code, 201);
    let instance = eventually("node-1's instance", || async {
        node(&api, "node-1").await["status"]["providerRef"]["instanceId"].as_u64()
    })
    .await;
    let label = stand.lock().instances[&instance]["label"].as_str().unwrap().to_string();
    let old_fleet = label.split(':').nth(1).unwrap().to_string();

    // A graceful stop leaves the lease; --reset-state forgets every intent and makes a
    // new identity (a new fleet label).
    d.restart_with(&strs(&vast.flags(&["--reset-state"])));
    let api = d.client();
    assert_eq!(api.get(&format!("{NODES}/node-1")).await.code, 404, "the state was reset");
    vast.configure(&d);
    recovered(&d, 2).await;

    let name = format!("orphan-vastai-{instance}");
    let orphan = node(&api, &name).await;
    assert_eq!(orphan["status"]["phase"], "Orphaned", "{orphan}");
    let error = orphan["status"]["error"].as_str().unwrap_or_default();
    assert!(error.contains(&old_fleet) && error.contains("--reset-state"), "{error}");
    assert_eq!(orphan["status"]["providerRef"]["instanceId"], instance, "{orphan}");
    let events = api.get(&format!("/api/v1/events?fieldSelector=involvedObject.name%3D{name}")).await.body;
    let reasons: Vec<&Value> = events["items"].as_array().unwrap().iter().map(|e| &e["reason"]).collect();
    assert!(reasons.contains(&&json!("OrphanFound")), "{events}");
    assert!(d.log().contains("fleet recovery: orphan reported"));

    // Nothing was touched: the lease runs on, nothing was rented or destroyed.
    assert!(stand.lock().instances.contains_key(&instance), "the instance is left alone");
    assert_eq!(stand.count("DELETE /api/v0/instances/"), 0);
    assert_eq!(stand.count("PUT /api/v0/asks/"), 1);
    // The report survives another restart (without a reset) and stays one report.
    d.restart_with(&strs(&vast.flags(&[])));
    let api = d.client();
    vast.configure(&d);
    recovered(&d, 3).await;
    assert_eq!(node(&api, &name).await["status"]["phase"], "Orphaned");
    assert_eq!(stand.count("DELETE /api/v0/instances/"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rented_node_whose_join_timed_out_is_failed_left_running_and_adopted_after_a_restart() {
    let (stand, base) = Stand::start(offers()).await;
    let vast = Vast::new(&base);
    let flags = vast.flags(&["--fleet-join-timeout", "2s"]);
    let mut d = Daemon::start_with(&strs(&flags));
    let api = d.client();
    vast.configure(&d);
    assert_eq!(api.post(COMMANDS, &vast_provision("rent", &[101])).await.code, 201);
    // No worker comes: the join times out. The node is Failed; the instance runs on.
    let failed = eventually("node-1 Failed by its join timeout", || async {
        let n = node(&api, "node-1").await;
        (n["status"]["phase"] == "Failed").then_some(n)
    })
    .await;
    let error = failed["status"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("2s"), "the error names the timeout: {failed}");
    let instance = failed["status"]["providerRef"]["instanceId"].as_u64().expect("instanceId");
    assert_eq!(stand.count("DELETE /api/v0/instances/"), 0, "the paid instance is left running");
    let create = stand.lock().last_create.clone();

    // The next daemon observes the running instance: adopted, waiting for its worker.
    d.restart_with(&strs(&flags));
    let api = d.client();
    vast.configure(&d);
    recovered(&d, 2).await;
    let n1 = node(&api, "node-1").await;
    assert_eq!(n1["status"]["phase"], "Provisioning", "adopted: {n1}");
    assert!(n1["status"]["error"].as_str().unwrap_or_default().contains("adopted"), "{n1}");

    // Its worker comes up at last: accepted, and the node runs.
    let machine = tempfile::tempdir().unwrap();
    let _worker = Reap(instance_worker(&create, machine.path()));
    let n1 = eventually("node-1 Running", || async {
        let n = node(&api, "node-1").await;
        (n["status"]["phase"] == "Running").then_some(n)
    })
    .await;
    assert_eq!(n1["status"]["providerRef"]["instanceId"], instance, "{n1}");
    assert_eq!(stand.count("PUT /api/v0/asks/"), 1, "nothing was rented again");
    assert_eq!(stand.count("DELETE /api/v0/instances/"), 0, "nothing was destroyed");
}
