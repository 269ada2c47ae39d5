//! Power cuts (issue 27): what a cut can tear in the state dir, the daemon puts back by
//! itself at start, says so, and serves.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::harness::{agent, Daemon};

/// The meta repo's `HEAD` commit, read with the repository named explicitly.
fn meta_head(state: &Path) -> String {
    let meta = state.join("meta");
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .env("GIT_DIR", meta.join(".git"))
        .env("GIT_WORK_TREE", &meta)
        .current_dir(&meta)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test]
async fn a_meta_repo_a_power_cut_emptied_is_put_back_at_start_and_the_daemon_serves() {
    let mut daemon = Daemon::start();
    let api = daemon.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("before")).await.code, 201);
    daemon.stop();
    let head = meta_head(&daemon.dir);
    // What issue 27 found after each cut: the files `git init` and the commits wrote,
    // present and empty.
    let git = daemon.dir.join("meta/.git");
    for file in ["HEAD", "config", "refs/heads/main", "index"] {
        std::fs::write(git.join(file), "").unwrap();
    }

    let mut daemon = match Daemon::spawn(&daemon.dir.clone(), &[]) {
        Ok(restarted) => restarted,
        Err(stderr) => panic!("the daemon did not come back after the cut: {stderr}"),
    };
    let api = daemon.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("after")).await.code, 201);
    assert_eq!(api.get("/apis/hive.dev/v1/agents/before").await.code, 200);
    assert_eq!(meta_head(&daemon.dir), head, "the meta repo is not back at its last commit");
    let log = daemon.log();
    assert!(log.contains("meta repo repaired at start"), "no log line says what was repaired:\n{log}");
    let events: Value = api.get("/api/v1/events").await.body;
    let repaired: Vec<&Value> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "MetaRepoRepaired" && e["involvedObject"]["kind"] == "MetaRepo")
        .collect();
    assert_eq!(repaired.len(), 1, "{events:#}");
    let message = repaired[0]["message"].as_str().unwrap();
    for named in [".git/HEAD", ".git/config", "refs/heads/main"] {
        assert!(message.contains(named), "{named} not in {message:?}");
    }
    daemon.stop();
}
