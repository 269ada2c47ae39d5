//! Every file in `manifests/` does what its comment says when applied to a fresh
//! `hive serve` started as README says (from the repository root, on its embedded
//! defaults: the Agent controller on, the process runtime and the process fleet
//! provider): the outcome is checked — agents running or kept stopped, Jobs Done,
//! approvals carried out, providers checked, a placed agent running on its node — not the
//! word "created". `fleet-command.yaml`
//! (applied twice, it provisions once) is `fleet_intake`'s, and the whole directory with
//! README's tour is `readme`'s.

use std::path::Path;

use serde_json::Value;

use crate::agents::{wait_power, wait_terminal};
use crate::harness::{eventually, ok, Api, Daemon};

fn manifest(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests").join(name).display().to_string()
}

/// A fresh daemon on its defaults (the suite's harness turns the Agent controller off
/// unless asked).
fn fresh() -> Daemon {
    Daemon::start_with(&["--agent-controller=true"])
}

async fn object(api: &Api, plural: &str, name: &str) -> Value {
    let reply = api.get(&format!("/apis/hive.dev/v1/{plural}/{name}")).await;
    assert_eq!(reply.code, 200, "{plural}/{name}: {}", reply.body);
    reply.body
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

async fn wait_ready(api: &Api, agent: &str) -> Value {
    eventually(&format!("{agent} Ready"), || async {
        let object = object(api, "agents", agent).await;
        (condition(&object, "Ready")?["status"] == "True").then_some(object)
    })
    .await
}

async fn wait_approval(api: &Api, name: &str, phase: &str) -> Value {
    let approval = crate::approvals::wait_phase(api, name, &[phase, "Failed"]).await;
    assert_eq!(approval["status"]["phase"], phase, "approval {name}: {}", approval["status"]);
    approval
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_agent_yaml_runs_the_hello_agent() {
    let d = fresh();
    let api = d.client();
    ok(d.hive(&["apply", "-f", &manifest("hello-agent.yaml")]));
    ok(d.hive(&["wait", "agent/hello", "--for=condition=Ready", "--timeout", "90s"]));
    let logs = eventually("hello's greeting in its log", || async {
        let out = d.hive(&["logs", "agent/hello"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("hello: hello, built").then_some(text)
    })
    .await;
    assert!(logs.contains("hello, built 20"), "built by its build step: {logs}");
    wait_power(&api, "hello", "Running").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_yaml_starts_manager_and_keeps_researcher_stopped_until_started() {
    let d = fresh();
    let api = d.client();
    ok(d.hive(&["apply", "-f", &manifest("agent.yaml")]));
    wait_ready(&api, "manager").await;
    wait_power(&api, "manager", "Running").await;
    // researcher: built (its Spawn Job Done) and left stopped, its spec untouched.
    let spawn: String = eventually("researcher's Spawn Job", || async {
        let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
        jobs["items"].as_array()?.iter().find_map(|j| {
            let spawn = j["spec"]["template"] == "Spawn" && j["spec"]["agents"][0] == "researcher";
            spawn.then(|| j["metadata"]["name"].as_str().unwrap().to_string())
        })
    })
    .await;
    let spawn = wait_terminal(&api, &spawn).await;
    assert_eq!(spawn["status"]["phase"], "Done", "{}", spawn["status"]);
    let researcher = object(&api, "agents", "researcher").await;
    assert_eq!(researcher["spec"]["wanted"], "Offline", "{researcher}");
    assert_ne!(researcher["status"]["power"], "Running", "{}", researcher["status"]);
    assert!(!d.dir.join("agents/researcher/pid").exists(), "researcher runs no process");
    let again = ok(d.hive(&["apply", "-f", &manifest("agent.yaml")]));
    assert!(again.lines().all(|l| l.ends_with(" unchanged")), "{again}");
    // "… until `hive start researcher`".
    ok(d.hive(&["start", "researcher"]));
    wait_power(&api, "researcher", "Running").await;
    wait_ready(&api, "researcher").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_yaml_rebuilds_the_hello_agent_to_done() {
    let d = fresh();
    let api = d.client();
    ok(d.hive(&["apply", "-f", &manifest("hello-agent.yaml")]));
    ok(d.hive(&["wait", "agent/hello", "--for=condition=Ready", "--timeout", "90s"]));
    let before = std::fs::read_to_string(d.dir.join("agents/hello/pid")).unwrap();
    ok(d.hive(&["apply", "-f", &manifest("job.yaml")]));
    let job = wait_terminal(&api, "rebuild-hello-1").await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    let nodes = job["status"]["nodes"].as_array().unwrap();
    assert!(nodes.iter().all(|n| n["state"] == "Done"), "{nodes:?}");
    // The rebuild stopped and started it again, on a new generation.
    wait_power(&api, "hello", "Running").await;
    let after = std::fs::read_to_string(d.dir.join("agents/hello/pid")).unwrap();
    assert_ne!(before, after, "the rebuild restarted hello");
    let again = ok(d.hive(&["apply", "-f", &manifest("job.yaml")]));
    assert!(again.ends_with(" unchanged\n"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_yaml_deploys_spawns_and_bumps_when_approved() {
    let d = fresh();
    let api = d.client();
    ok(d.hive(&["apply", "-f", &manifest("agent.yaml")]));
    ok(d.hive(&["apply", "-f", &manifest("approval.yaml")]));
    // The Approval controller marks each new approval Pending (asynchronously).
    for name in ["manager-apply-1", "spawn-scout", "bump-hive-base"] {
        wait_approval(&api, name, "Pending").await;
    }
    wait_ready(&api, "manager").await;

    ok(d.hive(&["approve", "manager-apply-1"]));
    wait_approval(&api, "manager-apply-1", "Deployed").await;
    let audit = ok(d.hive(&["audit", "manager"]));
    assert!(audit.contains("deploy/manager/1"), "the deploy is tagged in the meta repo:\n{audit}");
    wait_ready(&api, "manager").await;

    ok(d.hive(&["approve", "spawn-scout"]));
    wait_approval(&api, "spawn-scout", "Deployed").await;
    wait_power(&api, "scout", "Running").await;
    let scout = object(&api, "agents", "scout").await;
    assert_eq!(scout["spec"]["parent"], "manager", "{scout}");

    ok(d.hive(&["approve", "bump-hive-base"]));
    wait_approval(&api, "bump-hive-base", "Deployed").await;
    wait_ready(&api, "manager").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_yaml_gives_three_providers_each_checked_with_its_state() {
    let d = fresh();
    let api = d.client();
    ok(d.hive(&["apply", "-f", &manifest("provider.yaml")]));
    for name in ["local", "docker", "vastai"] {
        let provider = eventually(&format!("provider {name} checked"), || async {
            let provider = object(&api, "providers", name).await;
            provider["status"]["state"].is_string().then_some(provider)
        })
        .await;
        assert!(
            provider["status"]["message"].is_string() || provider["status"]["state"] == "Ready",
            "{provider}"
        );
    }
    let local = object(&api, "providers", "local").await;
    assert_eq!(local["status"]["state"], "Ready", "{}", local["status"]);
    // The example names no key (the daemon on its defaults reads none from its host):
    // the provider says how to give it one, and never shows a key.
    let vastai = object(&api, "providers", "vastai").await;
    assert_ne!(vastai["status"]["state"], "Ready", "{}", vastai["status"]);
}

/// placed-agent.yaml, applied before any node exists, waits for node-1 (Placed False,
/// nothing started); after fleet-command.yaml's Provision it runs the hello agent on
/// node-1 — Placed and Ready, its greeting streamed back from the node, its process a
/// child of node-1's worker — and `hive describe node/node-1` lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placed_agent_yaml_runs_hello_on_node_1_after_a_provision() {
    let d = fresh();
    let api = d.client();
    ok(d.hive(&["apply", "-f", &manifest("placed-agent.yaml")]));
    let waiting = eventually("hello-placed to wait for node-1", || async {
        let agent = object(&api, "agents", "hello-placed").await;
        (condition(&agent, "Placed")?["reason"] == "WaitingForNode").then_some(agent)
    })
    .await;
    assert!(waiting["status"]["activeJob"].is_null(), "nothing submitted while it waits: {waiting}");

    ok(d.hive(&["apply", "-f", &manifest("fleet-command.yaml")]));
    ok(d.hive(&["wait", "agent/hello-placed", "--for=condition=Ready", "--timeout", "120s"]));
    let agent = object(&api, "agents", "hello-placed").await;
    let placed = condition(&agent, "Placed").expect("Placed");
    assert_eq!((&placed["status"], &placed["reason"]), (&"True".into(), &"NodeRunning".into()), "{agent}");
    let logs = eventually("hello-placed's greeting in its log", || async {
        let out = d.hive(&["logs", "agent/hello-placed"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("hello-placed: hello, built").then_some(text)
    })
    .await;
    assert!(logs.contains("hello, built 20"), "built by its build step, on the node: {logs}");

    // Its process runs under node-1's worker, not under the daemon.
    let node = object(&api, "nodes", "node-1").await;
    let worker = node["status"]["providerRef"]["pid"].as_u64().expect("providerRef.pid");
    let parent_of = |pid: u32| -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 2..].split_whitespace().nth(1)?.parse().ok()
    };
    let pid: u32 = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .find(|pid: &u32| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains("run.sh") && parent_of(*pid) == Some(worker)
        })
        .unwrap_or_else(|| panic!("no run.sh under node-1's worker {worker}"));
    assert_ne!(parent_of(pid), Some(u64::from(d.pid())));

    let described = ok(d.hive(&["describe", "node/node-1"]));
    let row = described
        .lines()
        .skip_while(|l| !l.starts_with("Agents:"))
        .find(|l| l.split_whitespace().next() == Some("hello-placed"))
        .unwrap_or_else(|| panic!("hello-placed among node-1's agents:\n{described}"));
    assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["hello-placed", "Up", "Running", "True"]);
}
