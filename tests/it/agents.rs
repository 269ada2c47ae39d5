//! Shared by the tests that run real agents: a config repository made with git, a
//! process Agent pointing at it, and waits on Jobs and on observed power.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::Api;

pub const RUN_SH: &str = r#"trap 'rm -f "$HIVE_FENCE"' USR1
trap 'exit 0' TERM
echo "hello from VERSION"
while true; do sleep 0.1; done
"#;

pub fn git(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=hive", "-c", "user.email=hive@example.com", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A config repository with tags v1 and v2 of a tiny agent that honours the fence.
pub fn config_repo(dir: &Path) -> PathBuf {
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

pub fn agent(name: &str, repo: &Path, wanted: &str) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
           "spec": {"wanted": wanted, "config": {"repo": repo.display().to_string(), "rev": "v1"},
                    "runtime": {"type": "process", "gracefulStopSeconds": 5, "process": {"command": ["sh", "run.sh"]}}}})
}

pub async fn wait_terminal(api: &Api, name: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let job = api.get(&format!("/apis/hive.dev/v1/jobs/{name}")).await.body;
        let phase = job["status"]["phase"].as_str().unwrap_or("Queued");
        // A Failed Job may still run its AfterAny Reconcile; it is over once it settled.
        let settled = phase != "Failed" || job["status"]["finishedAt"].is_string();
        if !matches!(phase, "Queued" | "Running") && settled {
            return job;
        }
        assert!(tokio::time::Instant::now() < deadline, "job {name} did not finish: {}", job["status"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn wait_power(api: &Api, agent: &str, power: &str) {
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
