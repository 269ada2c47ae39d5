//! Myelin's promises through the real daemon (issue 29): a node whose first telemetry is
//! slow stays Provisioning and becomes Running, never Failed. Workers are real
//! `hive fleet-worker` processes.

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use serde_json::{json, Value};

use crate::harness::{eventually, Api, Daemon};

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

/// A stand-in `nvidia-smi` in `dir`: the worker's first call (its join's facts) answers
/// "no GPU" at once; the second (the first telemetry pull's) writes the worker's pid to
/// `dir/stopped` and stops it with SIGSTOP, so its telemetry is late by as long as the
/// test keeps it stopped. Later calls answer "no GPU".
fn stopping_nvidia_smi(dir: &std::path::Path) {
    let script = format!(
        "#!/bin/sh\nd={dir}\nn=$(cat \"$d/calls\" 2>/dev/null || echo 0)\nn=$((n + 1))\necho $n > \"$d/calls\"\n\
         if [ \"$n\" = 2 ]; then echo $PPID > \"$d/stopped.tmp\"; mv \"$d/stopped.tmp\" \"$d/stopped\"; kill -STOP $PPID; fi\nexit 1\n",
        dir = dir.display()
    );
    let path = dir.join("nvidia-smi");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_first_telemetry_keeps_a_node_provisioning_then_running_never_failed() {
    let bin = tempfile::tempdir().unwrap();
    stopping_nvidia_smi(bin.path());
    let path = format!("{}:{}", bin.path().display(), std::env::var("PATH").unwrap_or_default());
    // Each attempt to pull telemetry waits 2 s (`--fleet-telemetry-wait`, here as its
    // variable) before it is retried.
    let d = Daemon::start_with_env(&[], &[("PATH", &path), ("HIVE_FLEET_TELEMETRY_WAIT", "2s")]);
    let api = d.client();
    let provision = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "slow"},
                           "spec": {"provision": {"provider": "process", "count": 1}}});
    assert_eq!(api.post(COMMANDS, &provision).await.code, 201);

    // The worker joined and was stopped at its first telemetry pull.
    let stopped = bin.path().join("stopped");
    let pid: u32 = eventually("the worker stopped at its first telemetry pull", || async {
        std::fs::read_to_string(&stopped).ok()?.trim().parse().ok()
    })
    .await;
    let mut worker = Continue(Some(pid));

    // However long it takes, the node waits, saying so; it is never Failed.
    let waiting = eventually("node-1 to say it waits for telemetry", || async {
        let n = node(&api, "node-1").await;
        assert_ne!(n["status"]["phase"], "Failed", "a slow node is slow, not Failed: {n}");
        let waits = condition(&n, "Telemetry").is_some_and(|c| c["reason"] == "WaitingForTelemetry");
        waits.then_some(n)
    })
    .await;
    assert_eq!(waiting["status"]["phase"], "Provisioning", "{waiting}");
    assert_eq!(condition(&waiting, "Telemetry").unwrap()["status"], "False", "{waiting}");
    assert_eq!(condition(&waiting, "Ready").unwrap()["status"], "False", "{waiting}");
    assert_eq!(api.get(&format!("{COMMANDS}/slow")).await.body["status"]["phase"], "Running");

    // It describes its telemetry at last: Running, through the pull retried meanwhile.
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
