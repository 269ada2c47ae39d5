//! Power cuts (issue 27): what a cut can tear in the state dir, the daemon puts back by
//! itself at start, says so, and serves.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::cut_fs::CutFs;
use crate::harness::{agent, Daemon};

/// `git ARGS` in the state dir's meta repo, the repository named explicitly.
fn meta_git(state: &Path, args: &[&str]) -> String {
    let meta = state.join("meta");
    let out = Command::new("git")
        .args(args)
        .env("GIT_DIR", meta.join(".git"))
        .env("GIT_WORK_TREE", &meta)
        .current_dir(&meta)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The meta repo's `HEAD` commit.
fn meta_head(state: &Path) -> String {
    meta_git(state, &["rev-parse", "HEAD"]).trim().to_string()
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

/// The meta repo's commit subjects, newest first.
fn meta_subjects(state: &Path) -> String {
    meta_git(state, &["log", "--format=%s"])
}

#[tokio::test]
async fn every_acknowledged_write_and_deploy_survives_a_power_cut_and_the_daemon_comes_back() {
    let fs = match CutFs::new() {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("skipped: the power-cut test mounts a FUSE file system ({why})");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = fs.mount(&mnt).expect("mount the cut file system");
    let state = mnt.join("state");
    // The operator's `mkdir` of the state dir, made durable as a real file system does
    // within seconds (this one never does by itself).
    std::fs::create_dir(&state).unwrap();
    std::fs::File::open(&mnt).unwrap().sync_all().unwrap();
    let repo = crate::agents::config_repo(tmp.path());
    let flags = ["--agent-controller=true"];
    let mut daemon = Daemon::spawn(&state, &flags).expect("daemon starts on the cut file system");
    let api = daemon.client();

    // Deploys through the agent controller: each agent's first build commits it to the
    // meta repo; its Job succeeding is the acknowledgement.
    let deployed = ["alpha", "beta", "gamma"];
    for name in deployed {
        let agent = crate::agents::agent(name, &repo, "Offline");
        assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    }
    let mut settled = false;
    for _ in 0..600 {
        let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
        let jobs = jobs["items"].as_array().cloned().unwrap_or_default();
        let done = jobs.iter().filter(|j| j["status"]["phase"] == "Done").count();
        if done >= deployed.len() {
            settled = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if !settled {
        let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
        let log = daemon.log();
        let tail: Vec<&str> = log.lines().filter(|l| !l.contains(" INFO ")).take(40).collect();
        panic!("the three agents' builds did not succeed: {jobs:#}\n{}", tail.join("\n"));
    }

    // Write load: 8 writers creating Agents (whose rev does not resolve, so their Jobs
    // fail at once, locally); every 201 is acknowledged. The cut comes while they write:
    // the daemon dies mid-request, and everything it did not sync is gone.
    let acknowledged = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut writers = Vec::new();
    for w in 0..8 {
        let api = daemon.client();
        let repo = repo.clone();
        let acknowledged = acknowledged.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("w{w}-{i}");
                let mut agent = crate::agents::agent(&name, &repo, "Offline");
                agent["spec"]["config"]["rev"] = "no-such-rev".into();
                // The request in flight at the cut panics this task (the harness's
                // client does on a dropped connection); what it acknowledged is kept.
                if api.post("/apis/hive.dev/v1/agents", &agent).await.code == 201 {
                    acknowledged.lock().unwrap().push(name);
                }
            }
        }));
    }
    for _ in 0..3000 {
        if acknowledged.lock().unwrap().len() >= 300 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(acknowledged.lock().unwrap().len() >= 300, "the writers got too few creates acknowledged");
    daemon.kill9();
    for writer in writers {
        let _ = writer.await;
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    drop(mounted);
    fs.cut();
    let _mounted = fs.mount(&mnt).expect("mount again after the cut");

    let mut daemon = match Daemon::spawn(&state, &flags) {
        Ok(restarted) => restarted,
        Err(log) => panic!("the daemon did not come back after the cut: {log}"),
    };
    let api = daemon.client();
    let list = api.get("/apis/hive.dev/v1/agents").await.body;
    let names: Vec<&str> =
        list["items"].as_array().unwrap().iter().filter_map(|a| a["metadata"]["name"].as_str()).collect();
    let lost: Vec<&String> = acknowledged.iter().filter(|n| !names.contains(&n.as_str())).collect();
    assert!(lost.is_empty(), "{} acknowledged creates lost: {lost:?}", lost.len());
    let subjects = meta_subjects(&state);
    for name in deployed {
        assert!(subjects.contains(name), "the deploy of {name} is not in the meta repo's log:\n{subjects}");
    }
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("after-the-cut")).await.code, 201);
    daemon.kill9();
}
