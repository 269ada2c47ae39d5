//! Deploy paths through the real daemon: two rebuilds of one agent each deploy their
//! own build; a Job whose Swap failed is Failed while its AfterAny Reconcile still
//! runs; a failed finalize of an approval's deploy leaves agent, marker and lock on the
//! previous commit; an approval's outcome survives its Job falling out of history.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::agents::{git, wait_power, wait_terminal};
use crate::harness::{Api, Daemon};

/// An agent that takes its time to stop: on SIGTERM it waits for `$RELEASE` to exist.
const SLOW_STOP: &str = r#"trap 'rm -f "$HIVE_FENCE"' USR1
trap 'while [ ! -f "$RELEASE" ]; do sleep 0.1; done; exit 0' TERM
echo "hello from VERSION"
while true; do sleep 0.1; done
"#;

/// A config repository with tags v1, v2 and v3 of the slow-stopping agent.
fn repo(dir: &Path) -> PathBuf {
    let repo = dir.join("slow-repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "--quiet", "-b", "main"]);
    for version in ["v1", "v2", "v3"] {
        std::fs::write(repo.join("run.sh"), SLOW_STOP.replace("VERSION", version)).unwrap();
        git(&repo, &["add", "run.sh"]);
        git(&repo, &["commit", "--quiet", "-m", version]);
        git(&repo, &["tag", version]);
    }
    repo
}

fn sha(repo: &Path, rev: &str) -> String {
    let out = std::process::Command::new("git").args(["rev-parse", rev]).current_dir(repo).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn slow_agent(name: &str, repo: &Path, release: &Path) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
           "spec": {"wanted": "Up", "config": {"repo": repo.display().to_string(), "rev": "v1"},
                    "runtime": {"type": "process", "gracefulStopSeconds": 120,
                                "process": {"command": ["sh", "run.sh"],
                                            "env": {"RELEASE": release.display().to_string()}}}}})
}

async fn post_job(api: &Api, spec: Value) -> String {
    post_named(api, json!({}), spec).await
}

async fn post_named(api: &Api, metadata: Value, spec: Value) -> String {
    let job = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": metadata, "spec": spec});
    let reply = api.post("/apis/hive.dev/v1/jobs", &job).await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    reply.body["metadata"]["name"].as_str().unwrap().to_string()
}

async fn set_rev(api: &Api, agent: &str, rev: &str) {
    let patch = json!({"spec": {"config": {"rev": rev}}});
    let reply =
        api.patch(&format!("/apis/hive.dev/v1/agents/{agent}"), "application/merge-patch+json", &patch).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
}

fn node<'a>(job: &'a Value, id: &str) -> &'a Value {
    job["status"]["nodes"].as_array().and_then(|n| n.iter().find(|n| n["id"] == id)).unwrap_or(&Value::Null)
}

/// Polls Job `name` until `check` holds, returning it.
async fn job_until(api: &Api, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let job = api.get(&format!("/apis/hive.dev/v1/jobs/{name}")).await.body;
        if check(&job) {
            return job;
        }
        assert!(tokio::time::Instant::now() < deadline, "job {name}: never {what}: {}", job["status"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Spawns `name` through a Spawn Job and waits for it to run.
async fn spawn(api: &Api, name: &str) {
    let job = post_job(api, json!({"template": "Spawn", "agents": [name], "source": "Cli"})).await;
    let job = wait_terminal(api, &job).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    wait_power(api, name, "Running").await;
}

/// The generation a Prebuild step names (`built generation <id>`).
fn built(job: &Value) -> String {
    let step = node(job, "alpha/prebuild")["step"].as_str().unwrap_or_default();
    step.strip_prefix("built generation ").unwrap_or_else(|| panic!("prebuild step {step:?}")).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rebuilds_of_one_agent_each_swap_in_their_own_build() {
    let d = Daemon::start_with(&["--build-slots", "2"]);
    let repo = repo(&d.dir);
    let release = d.dir.join("release");
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &slow_agent("alpha", &repo, &release)).await.code, 201);
    spawn(&api, "alpha").await;

    // Job a builds v2, then its StopForUpdate waits on the agent; meanwhile Job b
    // (whose Prebuild takes no lease) builds v3.
    set_rev(&api, "alpha", "v2").await;
    let a = post_job(&api, json!({"template": "Rebuild", "agents": ["alpha"], "source": "Cli"})).await;
    job_until(&api, &a, "built", |j| node(j, "alpha/prebuild")["state"] == "Done").await;
    job_until(&api, &a, "stopping", |j| node(j, "alpha/stop-for-update")["state"] == "Running").await;
    set_rev(&api, "alpha", "v3").await;
    let b = post_job(&api, json!({"template": "Rebuild", "agents": ["alpha"], "source": "Cli"})).await;
    job_until(&api, &b, "built", |j| node(j, "alpha/prebuild")["state"] == "Done").await;
    std::fs::write(&release, "").unwrap();

    let a = wait_terminal(&api, &a).await;
    assert_eq!(a["status"]["phase"], "Done", "{}", a["status"]);
    let b = wait_terminal(&api, &b).await;
    assert_eq!(b["status"]["phase"], "Done", "{}", b["status"]);
    let (built_a, built_b) = (built(&a), built(&b));
    assert!(built_a.ends_with(&sha(&repo, "v2")[..12]), "{built_a}");
    assert_eq!(node(&a, "alpha/swap")["step"], format!("now on generation {built_a}"), "{}", a["status"]);
    assert_eq!(node(&b, "alpha/swap")["step"], format!("now on generation {built_b}"), "{}", b["status"]);
    wait_power(&api, "alpha", "Running").await;
    let marker = std::fs::read_to_string(d.dir.join("applied/alpha.json")).unwrap_or_default();
    assert!(marker.contains(&sha(&repo, "v3")), "the last deploy is b's v3: {marker}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_swap_failed_is_failed_while_its_reconcile_runs() {
    let d = Daemon::start();
    let repo = repo(&d.dir);
    let release = d.dir.join("release");
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &slow_agent("alpha", &repo, &release)).await.code, 201);
    spawn(&api, "alpha").await;
    let patch = json!({"spec": {"wanted": "Offline"}});
    assert_eq!(
        api.patch("/apis/hive.dev/v1/agents/alpha", "application/merge-patch+json", &patch).await.code,
        200
    );

    // A Swap with no Prebuild in its Job fails; the AfterAny Reconcile then stops the
    // agent, which waits for the release file.
    let job = post_named(
        &api,
        json!({"name": "swap-then-reconcile"}),
        json!({"template": "Reconcile", "source": "Cli", "nodes": [
            {"id": "swap", "kind": "Swap", "agent": "alpha"},
            {"id": "reconcile", "kind": "Reconcile", "agent": "alpha", "deps": [{"node": "swap", "edge": "AfterAny"}]}
        ]}),
    )
    .await;
    let running = job_until(&api, &job, "reconciling", |j| node(j, "reconcile")["state"] == "Running").await;
    assert_eq!(node(&running, "swap")["state"], "Failed", "{}", running["status"]);
    let seen = job_until(&api, &job, "failed", |j| j["status"]["phase"] != "Running").await;
    assert_eq!(seen["status"]["phase"], "Failed", "{}", seen["status"]);
    assert_eq!(node(&seen, "reconcile")["state"], "Running", "still stopping: {}", seen["status"]);
    assert!(seen["status"]["finishedAt"].is_null(), "not settled yet: {}", seen["status"]);

    std::fs::write(&release, "").unwrap();
    let settled = job_until(&api, &job, "settled", |j| j["status"]["finishedAt"].is_string()).await;
    assert_eq!(settled["status"]["phase"], "Failed", "{}", settled["status"]);
    assert_eq!(node(&settled, "reconcile")["state"], "Done", "{}", settled["status"]);
    wait_power(&api, "alpha", "Stopped").await;
}

fn approval(name: &str, commit: &str) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": name},
           "spec": {"kind": "ApplyCommit", "target": "alpha", "payload": {"commit": commit}, "summary": "next"}})
}

async fn approve(api: &Api, name: &str) {
    let decide = json!({"spec": {"decision": {"state": "Approved"}}});
    let reply = api
        .patch(&format!("/apis/hive.dev/v1/approvals/{name}"), "application/merge-patch+json", &decide)
        .await;
    assert_eq!(reply.code, 200, "{}", reply.body);
}

/// Agent `alpha` on a config repo with tags v1 and v2, running v1; its API and both shas.
async fn alpha_running_on_v1(d: &Daemon) -> (Api, String, String) {
    let repo = crate::agents::config_repo(&d.dir);
    let api = d.client();
    let agent = crate::agents::agent("alpha", &repo, "Up");
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    wait_power(&api, "alpha", "Running").await;
    (api, sha(&repo, "v1"), sha(&repo, "v2"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_finalize_puts_agent_marker_and_lock_back_on_the_previous_commit() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let (api, v1, v2) = alpha_running_on_v1(&d).await;
    // A tag `deploy/alpha` makes the deploy tag `deploy/alpha/1` impossible: finalize fails
    // after the new generation came up.
    git(&d.dir.join("meta"), &["tag", "deploy/alpha"]);

    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval("next", &v2)).await.code, 201);
    crate::approvals::wait_phase(&api, "next", &["Pending"]).await;
    approve(&api, "next").await;
    let a = crate::approvals::wait_phase(&api, "next", &["Failed", "Deployed"]).await;
    assert_eq!(a["status"]["phase"], "Failed", "{a}");
    let job = wait_terminal(&api, a["status"]["job"].as_str().unwrap()).await;
    assert_eq!(job["status"]["phase"], "Failed");

    // The lock, the marker and what runs agree: v1.
    let lock = std::fs::read_to_string(d.dir.join("meta/flake.lock")).unwrap();
    assert!(lock.contains(&v1) && !lock.contains(&v2), "{lock}");
    let marker = std::fs::read_to_string(d.dir.join("applied/alpha.json")).unwrap();
    assert!(marker.contains(&v1), "{marker}");
    wait_power(&api, "alpha", "Running").await;
    let current = std::fs::read_link(d.dir.join("agents/alpha/current")).unwrap();
    let current = current.file_name().unwrap().to_string_lossy().into_owned();
    assert!(current.ends_with(&v1[..12]), "runs {current}");
    let agent = api.get("/apis/hive.dev/v1/agents/alpha").await.body;
    assert_eq!(agent["spec"]["config"]["rev"], "v1", "{agent}");
    assert!(a["status"]["message"].as_str().unwrap_or("").contains("finalizing the deploy failed"), "{a}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_stays_deployed_after_its_job_falls_out_of_history() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let (api, v1, v2) = alpha_running_on_v1(&d).await;

    // The first approval's Job, then six more ApprovalDeploy Jobs: the history keeps
    // five per template, so the first Job object is deleted.
    let names: Vec<String> = (0..7).map(|i| format!("deploy-{i}")).collect();
    let mut first_job = String::new();
    for (i, name) in names.iter().enumerate() {
        let commit = if i % 2 == 0 { &v2 } else { &v1 };
        assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval(name, commit)).await.code, 201);
        crate::approvals::wait_phase(&api, name, &["Pending"]).await;
        approve(&api, name).await;
        let a = crate::approvals::wait_phase(&api, name, &["Deployed", "Failed"]).await;
        assert_eq!(a["status"]["phase"], "Deployed", "{a}");
        if i == 0 {
            first_job = a["status"]["job"].as_str().unwrap().to_string();
        }
    }
    let first = format!("/apis/hive.dev/v1/jobs/{first_job}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while api.get(&first).await.code != 404 {
        assert!(tokio::time::Instant::now() < deadline, "approval-deploy-0 never left the history");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for name in &names {
        let a = api.get(&format!("/apis/hive.dev/v1/approvals/{name}")).await.body;
        assert_eq!(a["status"]["phase"], "Deployed", "{a}");
    }
}
