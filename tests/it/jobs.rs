//! Jobs end to end through the daemon: template Jobs built by the submit layer and run
//! by the scheduler against real agent processes, cancel, node and agent logs, and a
//! `kill -9` of the daemon converging on restart.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{Api, Daemon};

const RUN_SH: &str = r#"trap 'rm -f "$HIVE_FENCE"' USR1
trap 'exit 0' TERM
echo "hello from VERSION"
while true; do sleep 0.1; done
"#;

fn git(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=hive", "-c", "user.email=hive@example.com", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A config repository with tags v1 and v2 of a tiny agent that honours the fence.
fn config_repo(dir: &Path) -> std::path::PathBuf {
    let repo = dir.join("config-repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "--quiet", "-b", "main"]);
    for version in ["v1", "v2"] {
        std::fs::write(repo.join("run.sh"), RUN_SH.replace("VERSION", version)).unwrap();
        git(&repo, &["add", "run.sh"]);
        git(&repo, &["commit", "--quiet", "-m", version]);
        git(&repo, &["tag", version]);
    }
    repo
}

fn agent(name: &str, repo: &Path, wanted: &str) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
           "spec": {"wanted": wanted, "config": {"repo": repo.display().to_string(), "rev": "v1"},
                    "runtime": {"type": "process", "gracefulStopSeconds": 5, "process": {"command": ["sh", "run.sh"]}}}})
}

async fn run_job(api: &Api, template: &str, agents: &[&str]) -> (String, Value) {
    let reply = api
        .post("/apis/hive.dev/v1/jobs", &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {},
                                               "spec": {"template": template, "agents": agents, "source": "Cli"}}))
        .await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    let name = reply.body["metadata"]["name"].as_str().unwrap().to_string();
    (name.clone(), wait_terminal(api, &name).await)
}

async fn wait_terminal(api: &Api, name: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let job = api.get(&format!("/apis/hive.dev/v1/jobs/{name}")).await.body;
        let phase = job["status"]["phase"].as_str().unwrap_or("Queued");
        if !matches!(phase, "Queued" | "Running") {
            return job;
        }
        assert!(tokio::time::Instant::now() < deadline, "job {name} did not finish: {}", job["status"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_power(api: &Api, agent: &str, power: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let a = api.get(&format!("/apis/hive.dev/v1/agents/{agent}")).await.body;
        if a["status"]["power"] == power {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{agent} never became {power}: {}", a["status"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_jobs_drive_real_agents() {
    let mut d = Daemon::start();
    let repo = config_repo(&d.dir);
    let api = d.client();
    for name in ["alpha", "beta"] {
        assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent(name, &repo, "Up")).await.code, 201);
    }
    let (_, job) = run_job(&api, "Spawn", &["alpha", "beta"]).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    let ids: Vec<&str> = job["spec"]["nodes"].as_array().unwrap().iter().map(|n| n["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["alpha/create", "alpha/write-dropin", "alpha/reconcile", "beta/create", "beta/write-dropin", "beta/reconcile"]);
    wait_power(&api, "alpha", "Running").await;
    wait_power(&api, "beta", "Running").await;

    // The node's build log and the agent's own output are readable.
    let log = api.get(&format!("/apis/hive.dev/v1/jobs/{}/log?node=alpha%2Fcreate", job["metadata"]["name"].as_str().unwrap())).await;
    assert_eq!(log.code, 200);
    let out = api.get("/apis/hive.dev/v1/agents/alpha/log?tail=5").await;
    assert!(out.body.as_str().unwrap_or("").contains("hello from v1"), "{:?}", out.body);

    // One Job stops both, gracefully.
    let (_, job) = run_job(&api, "Stop", &["alpha", "beta"]).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    wait_power(&api, "alpha", "Stopped").await;
    let a = api.get("/apis/hive.dev/v1/agents/alpha").await.body;
    assert_eq!(a["spec"]["wanted"], "Offline");

    // Unknown agents are refused before anything is written.
    let refused = api
        .post("/apis/hive.dev/v1/jobs", &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {},
                                               "spec": {"template": "Start", "agents": ["alpha", "ghost"]}}))
        .await;
    assert_eq!(refused.code, 404, "{:?}", refused.body);
    assert_eq!(api.get("/apis/hive.dev/v1/agents/alpha").await.body["spec"]["wanted"], "Offline");

    // Start alpha, then kill -9 the daemon: the restart marks nothing lost and the boot
    // reconcile brings the wanted-up agent back.
    let (_, job) = run_job(&api, "Start", &["alpha"]).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    wait_power(&api, "alpha", "Running").await;
    d.kill9();
    d.restart();
    let api = d.client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
        let boot = jobs["items"].as_array().unwrap().iter().find(|j| j["spec"]["source"] == "Boot").cloned();
        if let Some(boot) = boot {
            if boot["status"]["phase"] == "Done" {
                break;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no boot reconcile finished: {jobs}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = api.get("/apis/hive.dev/v1/agents/alpha/log").await;
    assert_eq!(out.code, 200);
    let (_, job) = run_job(&api, "Kill", &["alpha"]).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
}
