//! The contract, round two: what was approved, edited or started is exactly what runs.
//! Each test walks two ordinary operator steps in an order that used to go wrong, on real
//! process agents through the real daemon: an approval re-created under a used name, an
//! edit of `wanted` while a power Job waits, a start after the base changed, a re-apply
//! after an approved deploy, a Job re-created under a name the scheduler remembers.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::agents::{config_repo, git, wait_power, wait_terminal};
use crate::approvals::wait_phase;
use crate::harness::{ok, Api, Daemon};

fn sha(repo: &Path, rev: &str) -> String {
    let out = std::process::Command::new("git").args(["rev-parse", rev]).current_dir(repo).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn approval(name: &str, target: &str, commit: &str) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": name},
           "spec": {"kind": "ApplyCommit", "target": target, "payload": {"commit": commit}}})
}

/// The Job a power verb's `--no-wait` line names (`job.hive.dev/NAME submitted`).
fn job_of(out: &str) -> String {
    let line = out.lines().find(|l| l.starts_with("job.hive.dev/")).unwrap_or_else(|| panic!("{out}"));
    line.trim_start_matches("job.hive.dev/").split_whitespace().next().unwrap().to_string()
}

async fn agent_of(api: &Api, name: &str) -> Value {
    api.get(&format!("/apis/hive.dev/v1/agents/{name}")).await.body
}

/// Approves approval `name` with `hive approve` and waits until it resolves.
async fn approve(d: &Daemon, api: &Api, name: &str) -> Value {
    wait_phase(api, name, &["Pending"]).await;
    ok(d.hive(&["approve", name, "--no-wait"]));
    wait_phase(api, name, &["Deployed", "Failed"]).await
}

async fn spawned(d: &Daemon, repo: &Path, name: &str, rev: &str) -> Api {
    let api = d.client();
    let mut agent = crate::agents::agent(name, repo, "Up");
    agent["spec"]["config"]["rev"] = json!(rev);
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    wait_power(&api, name, "Running").await;
    api
}

/// Item 1: an approval is resolved only by a Job of its own. `apr` deployed v2, was
/// deleted, and a new `apr` for v1 was approved: it used to adopt the old Job by its
/// name and report Deployed at once, with the agent still on v2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_approval_of_a_used_name_deploys_through_a_job_of_its_own() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = spawned(&d, &repo, "alpha", "v1").await;
    let (v1, v2) = (sha(&repo, "v1"), sha(&repo, "v2"));

    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval("apr", "alpha", &v2)).await.code, 201);
    let first = approve(&d, &api, "apr").await;
    assert_eq!(first["status"]["phase"], "Deployed", "{}", first["status"]);
    assert_eq!(agent_of(&api, "alpha").await["status"]["appliedRev"], v2);
    let first_job = first["status"]["job"].as_str().unwrap().to_string();

    assert_eq!(api.delete("/apis/hive.dev/v1/approvals/apr").await.code, 200);
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval("apr", "alpha", &v1)).await.code, 201);
    let second = approve(&d, &api, "apr").await;
    let second_job = second["status"]["job"].as_str().unwrap_or_default().to_string();
    assert_ne!(second_job, first_job, "the new approval adopted the old one's Job: {}", second["status"]);
    assert_eq!(second["status"]["phase"], "Deployed", "{}", second["status"]);
    let job = wait_terminal(&api, &second_job).await;
    assert_eq!(
        (job["spec"]["approval"].as_str(), job["status"]["phase"].as_str()),
        (Some("apr"), Some("Done"))
    );
    let alpha = agent_of(&api, "alpha").await;
    assert_eq!(alpha["status"]["appliedRev"], v1, "the agent runs what the new approval approved");
    assert_eq!(alpha["status"]["power"], "Running");
    let trail = ok(d.hive(&["audit", "alpha", "-o", "json"]));
    let deploys = serde_json::from_str::<Value>(&trail).unwrap()["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["op"] == "deploy")
        .count();
    assert_eq!(deploys, 2, "each approval committed its own deploy: {trail}");
}

/// Item 4: executors never write spec. An approved deploy used to rewrite
/// `spec.config.rev` to the deployed commit: the agent stopped tracking its branch, and
/// re-applying its own manifest reverted the deploy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_deploy_leaves_the_spec_as_written_and_a_reapply_moves_nothing() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = spawned(&d, &repo, "alpha", "v1").await;
    let v2 = sha(&repo, "v2");
    let before = agent_of(&api, "alpha").await;

    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval("to-v2", "alpha", &v2)).await.code, 201);
    let resolved = approve(&d, &api, "to-v2").await;
    assert_eq!(resolved["status"]["phase"], "Deployed", "{}", resolved["status"]);
    let after = agent_of(&api, "alpha").await;
    assert_eq!(after["spec"], before["spec"], "the deploy wrote the agent's spec");
    assert_eq!(after["metadata"]["generation"], before["metadata"]["generation"]);
    assert_eq!(after["status"]["appliedRev"], v2);

    // The operator's own manifest, applied again: nothing to do, nothing moves.
    let mut manifest = crate::agents::agent("alpha", &repo, "Up");
    manifest["spec"]["config"]["rev"] = json!("v1");
    let file = d.dir.join("alpha.json");
    std::fs::write(&file, manifest.to_string()).unwrap();
    let out = ok(d.hive(&["apply", "-f", file.to_str().unwrap()]));
    assert!(out.contains("unchanged"), "{out}");
    tokio::time::sleep(Duration::from_secs(2)).await; // give a wrong rebuild time to start
    let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
    let rebuilds: Vec<&Value> = jobs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["spec"]["template"] == "Rebuild" && j["spec"]["agents"] == json!(["alpha"]))
        .collect();
    assert!(rebuilds.is_empty(), "the re-apply rebuilt the agent: {rebuilds:?}");
    assert_eq!(agent_of(&api, "alpha").await["status"]["appliedRev"], v2);
}

/// An agent that ignores the graceful-stop fence, so a drain waits its full
/// `gracefulStopSeconds` while the Job holds the agent's lease.
const DEAF_SH: &str = "trap '' USR1\ntrap 'exit 0' TERM\nwhile true; do sleep 0.1; done\n";

/// Item 2: the last writer of an intent wins. A Stop queued behind a restart (which held
/// the lease through a slow drain) used to write `wanted: Offline` again when its
/// SetWanted finally ran, reverting the `kubectl patch` written after it, and stopped the
/// agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_stop_never_reverts_a_later_edit_of_wanted() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    std::fs::write(repo.join("run.sh"), DEAF_SH).unwrap();
    git(&repo, &["commit", "--quiet", "-am", "deaf"]);
    let api = d.client();
    let mut agent = crate::agents::agent("alpha", &repo, "Up");
    agent["spec"]["config"]["rev"] = json!("main");
    agent["spec"]["runtime"]["gracefulStopSeconds"] = json!(4);
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    wait_power(&api, "alpha", "Running").await;

    ok(d.hive(&["restart", "alpha", "--no-wait"]));
    let stop = job_of(&ok(d.hive(&["stop", "alpha", "--no-wait"])));
    let patched =
        ok(d.kubectl(&["patch", "agent", "alpha", "--type", "merge", "-p", r#"{"spec":{"wanted":"Up"}}"#]));
    assert!(patched.contains("patched"), "{patched}");
    let generation = agent_of(&api, "alpha").await["metadata"]["generation"].clone();

    let job = wait_terminal(&api, &stop).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    let alpha = agent_of(&api, "alpha").await;
    assert_eq!(alpha["spec"]["wanted"], "Up", "the queued Stop reverted the later patch");
    assert_eq!(alpha["metadata"]["generation"], generation, "something wrote the spec after the patch");
    wait_power(&api, "alpha", "Running").await;
}

/// Item 3: a start never changes which commit runs. An agent on branch `main` (at v2),
/// stopped, deferred by the boot sweep of a new base, then commit v3 on `main`: its
/// start used to relock the branch and run v3, unreviewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_after_a_base_change_keeps_the_locked_commit() {
    let mut d = Daemon::start_with(&["--agent-controller=true", "--hive-rev", "base-1"]);
    let repo = config_repo(&d.dir);
    let api = spawned(&d, &repo, "alpha", "main").await;
    let v2 = sha(&repo, "main");
    assert_eq!(agent_of(&api, "alpha").await["status"]["appliedRev"], v2);
    ok(d.hive(&["stop", "alpha"]));

    d.restart_with(&["--agent-controller=true", "--hive-rev", "base-2"]);
    let api = d.client();
    std::fs::write(repo.join("run.sh"), crate::agents::RUN_SH.replace("VERSION", "v3")).unwrap();
    git(&repo, &["commit", "--quiet", "-am", "v3, not reviewed"]);
    assert_ne!(sha(&repo, "main"), v2);

    let out = ok(d.hive(&["start", "alpha"]));
    assert!(out.lines().last().unwrap_or("").contains("prebuild ✓"), "the stale agent rebuilt: {out}");
    wait_power(&api, "alpha", "Running").await;
    let alpha = agent_of(&api, "alpha").await;
    assert_eq!(alpha["status"]["appliedRev"], v2, "the start moved the agent to an unreviewed commit");
    let log = ok(d.hive(&["logs", "agent/alpha"]));
    assert!(!log.contains("hello from v3"), "{log}");
}

/// Item 8: a Job deleted and created again under its name runs again, whatever creates
/// it. The scheduler still remembered the settled Job of that name: `kubectl apply` and
/// `hive apply` stored the new one Failed ("the scheduler refused it") and POST answered
/// 409 after storing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_deleted_and_created_again_under_its_name_runs_again_on_every_path() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(
        api.post("/apis/hive.dev/v1/agents", &crate::agents::agent("idle", &repo, "Offline")).await.code,
        201
    );
    crate::harness::eventually("idle to be built", || {
        let api = api.clone();
        async move {
            api.get("/apis/hive.dev/v1/agents/idle").await.body["status"]["appliedRev"].as_str().map(drop)
        }
    })
    .await;
    let job = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "look"},
                     "spec": {"template": "Reconcile",
                              "nodes": [{"id": "r", "kind": "Reconcile", "agent": "idle"}]}});
    let file = d.dir.join("look.json");
    std::fs::write(&file, job.to_string()).unwrap();
    let path = file.to_str().unwrap();
    let mut uids = Vec::new();
    for round in 0..2 {
        for via in ["POST", "kubectl apply", "hive apply"] {
            match via {
                "POST" => {
                    let created = api.post("/apis/hive.dev/v1/jobs", &job).await;
                    assert_eq!(created.code, 201, "round {round}, {via}: {}", created.body);
                }
                "kubectl apply" => drop(ok(d.kubectl(&["apply", "-f", path]))),
                _ => drop(ok(d.hive(&["apply", "-f", path]))),
            }
            let done = wait_terminal(&api, "look").await;
            assert_eq!(done["status"]["phase"], "Done", "round {round}, {via}: {}", done["status"]);
            uids.push(done["metadata"]["uid"].clone());
            assert_eq!(api.delete("/apis/hive.dev/v1/jobs/look").await.code, 200, "round {round}, {via}");
            let gone = api.get("/apis/hive.dev/v1/jobs/look").await;
            assert_eq!(gone.code, 404, "round {round}, {via}: {}", gone.body);
        }
    }
    uids.dedup();
    assert_eq!(uids.len(), 6, "each create ran as a Job of its own");
}

/// Item 5, for the Jobs that never reach the scheduler: refused by the intake (their
/// agent does not exist) they are stored Failed, and used to pile up for the daemon's
/// whole run; they count in their template's five like any other terminal Job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_jobs_are_kept_five_per_template_too() {
    let d = Daemon::start();
    let api = d.client();
    for i in 0..7 {
        let job = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": format!("ghost-{i}")},
                         "spec": {"template": "Stop", "agents": ["ghost"]}});
        let file = d.dir.join(format!("ghost-{i}.json"));
        std::fs::write(&file, job.to_string()).unwrap();
        ok(d.hive(&["apply", "-f", file.to_str().unwrap()]));
        let failed = wait_terminal(&api, &format!("ghost-{i}")).await;
        assert_eq!(failed["status"]["phase"], "Failed", "{}", failed["status"]);
    }
    let kept = crate::harness::eventually("the two oldest refused Jobs to be removed", || {
        let api = api.clone();
        async move {
            let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
            let names: Vec<String> = jobs["items"]
                .as_array()?
                .iter()
                .filter_map(|j| j["metadata"]["name"].as_str().map(str::to_string))
                .collect();
            (names.len() <= 5).then_some(names)
        }
    })
    .await;
    assert_eq!(kept, ["ghost-2", "ghost-3", "ghost-4", "ghost-5", "ghost-6"]);
}
