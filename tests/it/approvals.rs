//! The deploy trail end to end, on real agent processes: an agent's own token requests
//! an approval for its config change, an operator approves it with `hive approve`, the
//! ApprovalDeploy Job deploys it (prepare → stop/update/start → finalize with a deploy
//! tag) and `hive audit` shows it; failures restore the lock and fail the approval
//! exactly once (under a failed start, a cancel while queued, a daemon restart); a
//! meta-update fans out exactly the affected agents; the boot sweep rebuilds stale
//! agents and a boot with no change commits nothing; permissions and limits.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::agents::{config_repo, git, wait_power, wait_terminal};
use crate::harness::{fails, ok, Api, Daemon};

fn sha(repo: &Path, rev: &str) -> String {
    let out = std::process::Command::new("git").args(["rev-parse", rev]).current_dir(repo).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Adds a commit (on branch `broken`) whose agent exits at once, so its start fails;
/// returns its sha.
fn broken_commit(repo: &Path) -> String {
    git(repo, &["checkout", "--quiet", "-b", "broken"]);
    std::fs::write(repo.join("run.sh"), "echo broken; exit 3\n").unwrap();
    git(repo, &["commit", "--quiet", "-am", "broken"]);
    let broken = sha(repo, "HEAD");
    git(repo, &["checkout", "--quiet", "main"]);
    broken
}

/// Waits until approval `approval` is in one of `phases`; returns it.
pub async fn wait_phase(api: &Api, approval: &str, phases: &[&str]) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let a = api.get(&format!("/apis/hive.dev/v1/approvals/{approval}")).await.body;
        if phases.contains(&a["status"]["phase"].as_str().unwrap_or("")) {
            return a;
        }
        assert!(tokio::time::Instant::now() < deadline, "{approval} never reached {phases:?}: {a}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn approval(name: &str, target: &str, commit: &str) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": name},
           "spec": {"kind": "ApplyCommit", "target": target, "payload": {"commit": commit},
                    "summary": "run the new prompt"}})
}

fn audit(d: &Daemon, agent: &str) -> Vec<Value> {
    let out = ok(d.hive(&["audit", agent, "-o", "json"]));
    serde_json::from_str::<Value>(&out).unwrap()["items"].as_array().unwrap().clone()
}

async fn spawned(d: &Daemon, repo: &Path, name: &str) -> Api {
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &crate::agents::agent(name, repo, "Up")).await.code, 201);
    wait_power(&api, name, "Running").await;
    api
}

fn events_of(d: &Daemon, name: &str, reason: &str) -> usize {
    let out = ok(d.kubectl(&["get", "events", "-o", "json"]));
    let list: Value = serde_json::from_str(&out).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["name"] == name && e["reason"] == reason)
        .map(|e| e["count"].as_u64().unwrap_or(1) as usize)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_flows_from_request_to_deploy_and_the_audit_shows_it() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = spawned(&d, &repo, "alpha").await;
    let v2 = sha(&repo, "v2");

    // The agent's own token: it may request for itself, nothing else.
    let token =
        ok(d.hive(&["token", "create", "--name", "alpha-token", "--role", "agent", "--agent", "alpha"]));
    let agent_api = d.client_with(Some(token.trim()));
    let whoami = agent_api.get("/hive/v1/whoami").await.body;
    assert_eq!((whoami["role"].as_str(), whoami["agent"].as_str()), (Some("agent"), Some("alpha")));
    let refused = agent_api.post("/apis/hive.dev/v1/approvals", &approval("for-beta", "beta", &v2)).await;
    assert_eq!(refused.code, 403, "{}", refused.body);
    assert!(refused.body["message"].as_str().unwrap().contains("only request approvals for itself"));
    let created = agent_api.post("/apis/hive.dev/v1/approvals", &approval("alpha-v2", "alpha", &v2)).await;
    assert_eq!(created.code, 201, "{}", created.body);
    assert_eq!(created.body["spec"]["requestedBy"], "alpha");
    wait_phase(&api, "alpha-v2", &["Pending"]).await;
    let decide = json!({"spec": {"decision": {"state": "Approved"}}});
    let self_approve = agent_api
        .patch("/apis/hive.dev/v1/approvals/alpha-v2", "application/merge-patch+json", &decide)
        .await;
    assert_eq!(self_approve.code, 403, "an agent never decides: {}", self_approve.body);

    // What it would change: from the applied v1 to v2, one commit, run.sh.
    let diff = api.get("/hive/v1/approvals/alpha-v2/diff").await;
    assert_eq!(diff.code, 200, "{}", diff.body);
    assert_eq!(
        (diff.body["base"].as_str(), diff.body["head"].as_str()),
        (Some(sha(&repo, "v1").as_str()), Some(v2.as_str()))
    );
    assert_eq!(diff.body["commitCount"], 1);
    assert!(diff.body["commits"][0].as_str().unwrap().ends_with(" v2"), "{}", diff.body);
    assert_eq!(
        (diff.body["filesChanged"].as_u64(), diff.body["insertions"].as_u64()),
        (Some(1), Some(1)),
        "{}",
        diff.body
    );
    assert!(diff.body["stat"][0].as_str().unwrap().contains("run.sh"), "{}", diff.body);
    assert_eq!(api.get("/hive/v1/approvals/nope/diff").await.code, 404);

    // The operator approves and follows it to Deployed.
    let out = ok(d.hive(&["approve", "alpha-v2"]));
    assert!(out.contains("approval.hive.dev/alpha-v2 approved by admin"), "{out}");
    let done = wait_phase(&api, "alpha-v2", &["Deployed"]).await;
    assert_eq!(done["status"]["decidedBy"], "admin");
    assert!(done["status"]["decidedAt"].as_str().is_some());
    let job_name = done["status"]["job"].as_str().unwrap().to_string();
    assert!(job_name.starts_with("approval-alpha-v2-"), "the Job is the approval object's own: {job_name}");
    let job = wait_terminal(&api, &job_name).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    assert_eq!(job["spec"]["approval"], "alpha-v2");
    let agent = api.get("/apis/hive.dev/v1/agents/alpha").await.body;
    assert_eq!(agent["spec"]["config"]["rev"], "v1", "the spec stays as the client wrote it");
    assert_eq!(agent["status"]["appliedRev"], v2);
    assert_eq!(agent["status"]["power"], "Running");

    // The audit trail holds the deploy commit with its tag.
    let trail = audit(&d, "alpha");
    let deploy = trail.iter().find(|e| e["op"] == "deploy").expect("a deploy commit");
    assert_eq!(deploy["tags"], json!(["deploy/alpha/1"]));
    assert!(deploy["subject"].as_str().unwrap().contains("approval alpha-v2"), "{deploy}");
    assert!(deploy["subject"].as_str().unwrap().contains("approved by admin"), "{deploy}");
    let table = ok(d.hive(&["audit", "alpha"]));
    assert!(table.contains("deploy/alpha/1"), "{table}");

    // Decided once: a second decision is refused and changes nothing.
    let again = fails(d.hive(&["deny", "alpha-v2", "--reason", "too late"]));
    assert!(again.contains("already decided: Approved"), "{again}");
    assert_eq!(events_of(&d, "alpha-v2", "Deployed"), 1);

    // A denial is recorded with its reason and runs nothing.
    let denied = agent_api.post("/apis/hive.dev/v1/approvals", &approval("alpha-v1", "alpha", "v1")).await;
    assert_eq!(denied.code, 201);
    let out = ok(d.hive(&["deny", "alpha-v1", "--reason", "we stay on v2"]));
    assert!(out.contains("denied by admin"), "{out}");
    let a = wait_phase(&api, "alpha-v1", &["Denied"]).await;
    assert_eq!(a["status"]["message"], "we stay on v2");
    assert!(a["status"]["job"].is_null(), "{a}");
    let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
    assert!(!jobs["items"].as_array().unwrap().iter().any(|j| j["spec"]["approval"] == "alpha-v1"), "{jobs}");

    // Stock kubectl decides the same way, and the server records who.
    let back = agent_api.post("/apis/hive.dev/v1/approvals", &approval("alpha-back", "alpha", "v1")).await;
    assert_eq!(back.code, 201);
    ok(d.kubectl(&[
        "patch",
        "approval",
        "alpha-back",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"decision":{"state":"Approved","reason":"roll back"}}}"#,
    ]));
    let a = wait_phase(&api, "alpha-back", &["Deployed"]).await;
    assert_eq!(a["status"]["decidedBy"], "admin");
    assert_eq!(
        api.get("/apis/hive.dev/v1/agents/alpha").await.body["status"]["appliedRev"],
        sha(&repo, "v1")
    );
    let tags: Vec<Value> = audit(&d, "alpha").iter().map(|e| e["tags"].clone()).collect();
    assert!(tags.contains(&json!(["deploy/alpha/2"])), "{tags:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_deploy_restores_the_lock_and_fails_the_approval_once() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = spawned(&d, &repo, "alpha").await;
    let broken = broken_commit(&repo);
    let before = audit(&d, "alpha");

    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval("bad", "alpha", &broken)).await.code, 201);
    let out = fails(d.hive(&["approve", "bad"]));
    assert!(out.contains("approval/bad: Failed"), "{out}");
    let a = wait_phase(&api, "bad", &["Failed"]).await;
    assert!(a["status"]["message"].as_str().unwrap().contains("failed"), "{a}");
    let job_name = a["status"]["job"].as_str().unwrap().to_string();
    let job = wait_terminal(&api, &job_name).await;
    assert_eq!(job["status"]["phase"], "Failed");
    let log = ok(d.hive(&["logs", &format!("job/{job_name}"), "--node", "alpha/approval-deploy"]));
    assert!(log.contains("deploy aborted, lock restored"), "{log}");

    // No deploy commit, the lock as before, and the agent back up on v1.
    let after = audit(&d, "alpha");
    assert_eq!(after.len(), before.len(), "a failed deploy leaves no commit: {after:?}");
    assert!(!std::fs::read_to_string(d.dir.join("meta/flake.lock")).unwrap().contains(&broken));
    let status = std::process::Command::new("git")
        .args(["status", "--porcelain"])
        .current_dir(d.dir.join("meta"))
        .output()
        .unwrap();
    assert!(status.stdout.is_empty(), "the meta tree is clean: {}", String::from_utf8_lossy(&status.stdout));
    wait_power(&api, "alpha", "Running").await;
    let agent = api.get("/apis/hive.dev/v1/agents/alpha").await.body;
    assert_eq!(agent["spec"]["config"]["rev"], "v1");
    assert_eq!(events_of(&d, "bad", "Failed"), 1, "resolved exactly once");

    // A commit that does not exist fails before touching anything.
    assert_eq!(
        api.post("/apis/hive.dev/v1/approvals", &approval("ghost", "alpha", "deadbeef")).await.code,
        201
    );
    fails(d.hive(&["approve", "ghost"]));
    wait_phase(&api, "ghost", &["Failed"]).await;
    assert_eq!(audit(&d, "alpha").len(), before.len());
}

/// An agent whose builds take a while, so a second DAG on it waits for the lease.
fn slow_agent(name: &str, repo: &Path) -> Value {
    let mut agent = crate::agents::agent(name, repo, "Up");
    agent["spec"]["runtime"]["process"]["build"] = json!(["sh", "-c", "sleep 4"]);
    agent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_cancelled_while_queued_or_interrupted_by_a_restart_fails_once() {
    let mut d = Daemon::start();
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &slow_agent("alpha", &repo)).await.code, 201);
    let spawn = api
        .post("/apis/hive.dev/v1/jobs", &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {}, "spec": {"template": "Spawn", "agents": ["alpha"]}}))
        .await;
    assert_eq!(spawn.code, 201, "{}", spawn.body);
    let v2 = sha(&repo, "v2");

    // Queued behind the spawn (which holds alpha's lease): cancel it.
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval("queued", "alpha", &v2)).await.code, 201);
    ok(d.hive(&["approve", "queued", "--no-wait"]));
    let deploying = wait_phase(&api, "queued", &["Deploying"]).await;
    let job_name = deploying["status"]["job"].as_str().unwrap();
    let cancelled = api.post(&format!("/apis/hive.dev/v1/jobs/{job_name}/cancel"), &json!({})).await;
    assert_eq!(cancelled.code, 200, "{}", cancelled.body);
    let a = wait_phase(&api, "queued", &["Failed"]).await;
    assert!(a["status"]["message"].as_str().unwrap().contains("cancelled before it ran"), "{a}");

    // Queued again behind a slow rebuild, then the daemon restarts: Interrupted → Failed.
    wait_terminal(&api, spawn.body["metadata"]["name"].as_str().unwrap()).await;
    let rebuild = api
        .post("/apis/hive.dev/v1/jobs", &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {}, "spec": {"template": "Rebuild", "agents": ["alpha"]}}))
        .await;
    assert_eq!(rebuild.code, 201);
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval("restart", "alpha", &v2)).await.code, 201);
    ok(d.hive(&["approve", "restart", "--no-wait"]));
    wait_phase(&api, "restart", &["Deploying"]).await;
    d.restart_with(&[]);
    let api = d.client();
    let a = wait_phase(&api, "restart", &["Failed"]).await;
    assert!(a["status"]["message"].as_str().unwrap().contains("interrupted by a daemon restart"), "{a}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(events_of(&d, "restart", "Failed"), 1, "resolved exactly once");
    assert_eq!(events_of(&d, "queued", "Failed"), 1, "resolved exactly once");
    let again = api.get("/apis/hive.dev/v1/approvals/restart").await.body;
    assert_eq!(again["status"]["phase"], "Failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_meta_update_fans_out_exactly_the_affected_agents() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    for name in ["alpha", "beta"] {
        let mut agent = crate::agents::agent(name, &repo, "Up");
        agent["spec"]["config"]["rev"] = json!("main");
        assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    }
    wait_power(&api, "alpha", "Running").await;
    wait_power(&api, "beta", "Running").await;
    // main moves on; only alpha's input is bumped.
    std::fs::write(repo.join("run.sh"), crate::agents::RUN_SH.replace("VERSION", "v3")).unwrap();
    git(&repo, &["commit", "--quiet", "-am", "v3"]);
    let v3 = sha(&repo, "HEAD");
    let update = json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": "bump-alpha"},
                        "spec": {"kind": "UpdateMetaInputs", "payload": {"inputs": ["alpha"]}}});
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &update).await.code, 201);
    ok(d.hive(&["approve", "bump-alpha"]));
    let bump = wait_phase(&api, "bump-alpha", &["Deployed", "Failed"]).await;
    let parent = wait_terminal(&api, bump["status"]["job"].as_str().unwrap()).await;
    assert_eq!(parent["status"]["phase"], "Done", "{}", parent["status"]);
    let children = parent["status"]["children"].as_array().cloned().unwrap_or_default();
    assert_eq!(children.len(), 1, "exactly alpha is rebuilt: {}", parent["status"]);
    let child = wait_terminal(&api, children[0].as_str().unwrap()).await;
    assert_eq!(child["spec"]["agents"], json!(["alpha"]));
    assert_eq!(child["spec"]["nodes"][0]["params"]["relock"], false);
    assert_eq!(child["status"]["phase"], "Done", "{}", child["status"]);
    let alpha = api.get("/apis/hive.dev/v1/agents/alpha").await.body;
    assert_eq!(alpha["status"]["appliedRev"], v3);
    let beta = api.get("/apis/hive.dev/v1/agents/beta").await.body;
    assert_ne!(beta["status"]["appliedRev"], v3, "beta was not touched");
    let lock = audit(&d, "alpha");
    assert!(lock.iter().any(|e| e["op"] == "lock-update"), "{lock:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_boot_sweep_rebuilds_stale_agents_and_a_quiet_boot_commits_nothing() {
    let mut d = Daemon::start_with(&["--agent-controller=true", "--hive-rev", "base-1"]);
    let repo = config_repo(&d.dir);
    let api = spawned(&d, &repo, "alpha").await;
    let mut offline = crate::agents::agent("idle", &repo, "Up");
    offline["metadata"]["name"] = json!("idle");
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &offline).await.code, 201);
    wait_power(&api, "idle", "Running").await;
    ok(d.hive(&["stop", "idle"]));
    let head = |d: &Daemon| audit(d, "alpha").first().map(|e| e["commit"].clone());
    let sweeps = |api: Api| async move {
        let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
        jobs["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["spec"]["template"] == "BootSweep")
            .cloned()
            .collect::<Vec<_>>()
    };

    // The same base again: nothing is stale, no sweep, no meta commit.
    let before = ok(d.hive(&["audit", "-o", "json"]));
    d.restart_with(&["--agent-controller=true", "--hive-rev", "base-1"]);
    let api = d.client();
    wait_power(&api, "alpha", "Running").await;
    assert!(sweeps(api.clone()).await.is_empty());
    assert_eq!(ok(d.hive(&["audit", "-o", "json"])), before, "a boot with no change commits nothing");

    // A new base: alpha (wanted Up) is rebuilt; idle (Offline) is deferred.
    let old_head = head(&d);
    d.restart_with(&["--agent-controller=true", "--hive-rev", "base-2"]);
    let api = d.client();
    let found = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let s = sweeps(api.clone()).await;
            if !s.is_empty() || tokio::time::Instant::now() > deadline {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(found.len(), 1, "one sweep Job");
    let sweep = wait_terminal(&api, found[0]["metadata"]["name"].as_str().unwrap()).await;
    assert_eq!(sweep["spec"]["reason"], "boot sweep: 1 rebuild, 1 deferred, 0 up to date");
    assert_eq!(sweep["status"]["phase"], "Done", "{}", sweep["status"]);
    let children = sweep["status"]["children"].as_array().unwrap();
    assert_eq!(children.len(), 1);
    let child = wait_terminal(&api, children[0].as_str().unwrap()).await;
    assert_eq!(
        (child["spec"]["agents"].clone(), child["status"]["phase"].clone()),
        (json!(["alpha"]), json!("Done"))
    );
    wait_power(&api, "alpha", "Running").await;
    let all = ok(d.hive(&["audit", "-o", "json"]));
    let top: Value = serde_json::from_str(&all).unwrap();
    assert_eq!(top["items"][0]["op"], "hive-bump", "the hive input was bumped: {top}");
    assert_ne!(head(&d), old_head);

    // The deferred agent's next start rebuilds first, against the bumped base.
    let out = ok(d.hive(&["start", "idle"]));
    assert!(out.lines().last().unwrap().contains("prebuild ✓"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_commit_then_rebuild_and_limits_are_reported_honestly() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = spawned(&d, &repo, "alpha").await;
    // This host either enforces limits with cgroup v2 or says why not: never silence.
    let agent = api.get("/apis/hive.dev/v1/agents/alpha").await.body;
    let limits = agent["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "LimitsEnforced")
        .cloned()
        .unwrap_or_else(|| panic!("no LimitsEnforced condition: {}", agent["status"]));
    assert!(limits["message"].as_str().unwrap().contains("cpu 200% memory 4G"), "{limits}");
    if limits["status"] == "False" {
        assert_eq!(limits["reason"], "NotEnforced");
    }

    let patch = json!({"spec": {"permissions": {"toolGroups": ["shell", "web"], "capabilities": ["net"]}}});
    let r = api.patch("/apis/hive.dev/v1/agents/alpha", "application/merge-patch+json", &patch).await;
    assert_eq!(r.code, 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let job = loop {
        let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
        if let Some(j) =
            jobs["items"].as_array().unwrap().iter().find(|j| j["spec"]["template"] == "PermChange")
        {
            break j["metadata"]["name"].as_str().unwrap().to_string();
        }
        assert!(tokio::time::Instant::now() < deadline, "no PermChange Job");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let job = wait_terminal(&api, &job).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    assert_eq!(job["spec"]["nodes"][0]["kind"], "WritePermFile");
    let groups = std::fs::read_to_string(d.dir.join("meta/agents/alpha/tool-groups.json")).unwrap();
    assert!(groups.contains("web"), "{groups}");
    assert!(audit(&d, "alpha").iter().any(|e| e["op"] == "permissions"));
    assert_eq!(events_of(&d, "alpha", "Permissions"), 1);

    // Deleting the agent removes it from the meta flake and lock, in one more commit.
    assert!(std::fs::read_to_string(d.dir.join("meta/flake.nix")).unwrap().contains("agent-alpha"));
    let before = audit(&d, "alpha").len();
    ok(d.hive(&["delete", "agent", "alpha"]));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while api.get("/apis/hive.dev/v1/agents/alpha").await.code != 404 {
        assert!(tokio::time::Instant::now() < deadline, "alpha was never deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!std::fs::read_to_string(d.dir.join("meta/flake.nix")).unwrap().contains("agent-alpha"));
    assert!(!std::fs::read_to_string(d.dir.join("meta/flake.lock")).unwrap().contains("agent-alpha"));
    let after = audit(&d, "alpha");
    assert_eq!(after.len(), before + 1, "{after:?}");
    assert_eq!(after[0]["op"], "sync");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_and_merge_config_pr_approvals_deploy_through_their_shapes() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let spec = crate::agents::agent("scout", &repo, "Offline")["spec"].clone();
    let spawn = json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": "spawn-scout"},
                       "spec": {"kind": "Spawn", "target": "scout", "payload": {"agent": spec}}});
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &spawn).await.code, 201);
    assert_eq!(api.get("/apis/hive.dev/v1/agents/scout").await.code, 404, "nothing runs before approval");
    ok(d.hive(&["approve", "spawn-scout"]));
    let deployed = wait_phase(&api, "spawn-scout", &["Deployed"]).await;
    let job = api
        .get(&format!("/apis/hive.dev/v1/jobs/{}", deployed["status"]["job"].as_str().unwrap()))
        .await
        .body;
    assert_eq!(job["spec"]["template"], "Spawn");
    let scout = api.get("/apis/hive.dev/v1/agents/scout").await.body;
    assert_eq!(scout["spec"]["wanted"], "Up", "wanted Up at approval");
    wait_power(&api, "scout", "Running").await;
    let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
    let spawns =
        jobs["items"].as_array().unwrap().iter().filter(|j| j["spec"]["template"] == "Spawn").count();
    assert_eq!(spawns, 1, "the Agent controller did not spawn it a second time");

    // A config PR (a branch here): the reviewed head must still be its head.
    git(&repo, &["branch", "feature", "v2"]);
    let pr = |name: &str, reviewed: &str| {
        json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": name},
               "spec": {"kind": "MergeConfigPr", "target": "scout",
                        "payload": {"pullRequest": "feature", "commit": reviewed}}})
    };
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &pr("pr-stale", &sha(&repo, "v1"))).await.code, 201);
    fails(d.hive(&["approve", "pr-stale"]));
    let a = wait_phase(&api, "pr-stale", &["Failed"]).await;
    let message = a["status"]["message"].as_str().unwrap();
    assert!(message.contains("scout/approval-deploy: ") && message.contains("moved on"), "{a}");
    let v2 = sha(&repo, "v2");
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &pr("pr-ok", &v2[..12])).await.code, 201);
    ok(d.hive(&["approve", "pr-ok"]));
    wait_phase(&api, "pr-ok", &["Deployed"]).await;
    assert_eq!(api.get("/apis/hive.dev/v1/agents/scout").await.body["status"]["appliedRev"], v2);
    assert!(audit(&d, "scout").iter().any(|e| e["tags"] == json!(["deploy/scout/1"])));
}

/// README's serve command uses the relative default `./.hive`: agents, mirrors and the
/// meta repo must work from it (git runs in other directories).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_state_dir_builds_and_runs_agents() {
    let tmp = tempfile::tempdir().unwrap();
    // nextest runs every test in its own process, so the working directory is ours.
    std::env::set_current_dir(tmp.path()).unwrap();
    let repo = config_repo(tmp.path());
    let d = Daemon::spawn(Path::new(".hive"), &["--agent-controller=true"]).expect("daemon starts");
    let api = d.client();
    assert_eq!(
        api.post("/apis/hive.dev/v1/agents", &crate::agents::agent("alpha", &repo, "Up")).await.code,
        201
    );
    wait_power(&api, "alpha", "Running").await;
    assert!(!audit(&d, "alpha").is_empty());
}

// Regression (issue 14, item 8): an Approval for an agent that does not exist was
// accepted (201) and stayed Pending forever.
#[tokio::test]
async fn a_config_change_approval_for_a_missing_agent_is_refused_naming_the_target() {
    let d = Daemon::start();
    let api = d.client();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let reply = api.post("/apis/hive.dev/v1/approvals", &approval("ghost-apply", "ghost", commit)).await;
    assert_eq!(reply.code, 422, "{}", reply.body);
    assert_eq!(reply.body["details"]["causes"][0]["field"], "spec.target", "{}", reply.body);
    assert!(reply.body["message"].as_str().unwrap().contains("\"ghost\" not found"), "{}", reply.body);
    assert_eq!(api.get("/apis/hive.dev/v1/approvals/ghost-apply").await.code, 404, "nothing stored");
    // A Spawn names the agent it will create: accepted.
    let spawn = json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": "spawn-ghost"},
        "spec": {"kind": "Spawn", "target": "ghost", "payload": {"agent": {"config": {"repo": "r"},
            "runtime": {"type": "process", "process": {"command": ["x"]}}}}}});
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &spawn).await.code, 201);
}

/// Issue 28 item 8: 128 viewers asking for one approval's diff at once got 11 × 409 from
/// the agent's one mirror (`could not lock config file`: each request fetched into it at
/// the same time), and each message showed the daemon's state dir. Every answer is now a
/// 200 with the same diff; a diff that fails names the agent and its repository, never a
/// path in the state dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_diffs_of_one_repo_all_succeed_and_a_failed_one_shows_no_state_path() {
    // One token's 128 requests at once: over the default per-client cap of 100 in flight
    // (those past it are 429s, `stream_limits`), so the cap is raised for this test.
    let d = Daemon::start_with(&["--agent-controller=true", "--max-requests-inflight-per-client", "128"]);
    // The repository outside the state dir, so that naming it is not naming the state dir.
    let repos = tempfile::tempdir().unwrap();
    let repo = config_repo(repos.path());
    let api = spawned(&d, &repo, "alpha").await;
    let v2 = sha(&repo, "v2");
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval("alpha-v2", "alpha", &v2)).await.code, 201);
    let viewer = ok(d.hive(&["token", "create", "--name", "vera", "--role", "viewer"]));
    let viewer = d.client_with(Some(viewer.trim()));

    let asks = (0..128).map(|_| {
        let viewer = viewer.clone();
        tokio::spawn(async move { viewer.get("/hive/v1/approvals/alpha-v2/diff").await })
    });
    let answers = futures_util::future::join_all(asks).await;
    let mut refused = Vec::new();
    for answer in answers {
        let answer = answer.unwrap();
        if answer.code != 200 {
            refused.push(format!("{}: {}", answer.code, answer.body));
            continue;
        }
        assert_eq!(
            (answer.body["head"].as_str(), answer.body["commitCount"].as_u64()),
            (Some(v2.as_str()), Some(1))
        );
    }
    assert!(refused.is_empty(), "{} of 128 refused, the first: {}", refused.len(), refused[0]);

    // A commit the repository does not have, then the repository gone: each a 409 that
    // names the agent and the repository, and no path in the state dir.
    let state_dir = d.dir.display().to_string();
    let repo_url = repo.display().to_string();
    let missing = "0123456789abcdef0123456789abcdef01234567";
    assert_eq!(
        api.post("/apis/hive.dev/v1/approvals", &approval("alpha-missing", "alpha", missing)).await.code,
        201
    );
    let unknown = viewer.get("/hive/v1/approvals/alpha-missing/diff").await;
    std::fs::rename(&repo, repos.path().join("moved")).unwrap();
    let gone = viewer.get("/hive/v1/approvals/alpha-v2/diff").await;
    for (what, reply) in [("unknown commit", unknown), ("repository gone", gone)] {
        assert_eq!(reply.code, 409, "{what}: {}", reply.body);
        let message = reply.body["message"].as_str().unwrap_or_default();
        assert!(
            !reply.body.to_string().contains(&state_dir),
            "{what}: shows the state dir {state_dir}: {message}"
        );
        assert!(message.contains("alpha") && message.contains(&repo_url), "{what}: names neither: {message}");
    }
}
