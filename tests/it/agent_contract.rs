//! The Agent contract through the real daemon and the process runtime: what is applied
//! is what runs, by every path — an agent created Offline stays stopped, a `kubectl
//! patch` of `wanted` takes the same graceful shape as `hive stop`, a branch rev does
//! not rebuild (or move) on a start, a crash loop is not Ready and backs off without a
//! Job per try, and the boot sweep's rebuild is the first start after a base change.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::agents::{config_repo, git, wait_power, wait_terminal};
use crate::harness::{eventually, fails, ok, Api, Daemon};

/// The Jobs whose `spec.agents` name `agent`, oldest first (by resourceVersion).
pub(crate) async fn jobs_of(api: &Api, agent: &str) -> Vec<Value> {
    let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
    let mut jobs: Vec<Value> = jobs["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|j| j["spec"]["agents"].as_array().is_some_and(|a| a.iter().any(|n| n == agent)))
        .collect();
    jobs.sort_by_key(|j| {
        j["metadata"]["resourceVersion"].as_str().unwrap_or("0").parse::<u64>().unwrap_or(0)
    });
    jobs
}

/// The node kinds of a Job, in order.
fn kinds(job: &Value) -> Vec<String> {
    job["spec"]["nodes"].as_array().unwrap().iter().map(|n| n["kind"].as_str().unwrap().to_string()).collect()
}

async fn agent_of(api: &Api, name: &str) -> Value {
    api.get(&format!("/apis/hive.dev/v1/agents/{name}")).await.body
}

fn condition(agent: &Value, type_: &str) -> Option<Value> {
    agent["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_).cloned()
}

/// How many times the agent was started, from its folded `Started` Events.
async fn starts(api: &Api, agent: &str) -> i64 {
    let events = api
        .get(&format!(
            "/api/v1/events?fieldSelector=involvedObject.name%3D{agent}%2CinvolvedObject.kind%3DAgent"
        ))
        .await
        .body;
    events["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|e| e["reason"] == "Started")
        .map(|e| e["count"].as_i64().unwrap_or(1))
        .sum()
}

/// Waits until the Agent controller's Spawn Job of `agent` is terminal.
async fn spawned(api: &Api, agent: &str) -> Value {
    let name = eventually(&format!("a Spawn Job of {agent}"), || async {
        jobs_of(api, agent)
            .await
            .into_iter()
            .find(|j| j["spec"]["template"] == "Spawn")
            .map(|j| j["metadata"]["name"].as_str().unwrap().to_string())
    })
    .await;
    wait_terminal(api, &name).await
}

fn process_agent_yaml(name: &str, repo: &Path, wanted: &str) -> String {
    format!(
        "apiVersion: hive.dev/v1\nkind: Agent\nmetadata:\n  name: {name}\nspec:\n  wanted: {wanted}\n  config:\n    repo: {}\n    rev: v1\n  runtime:\n    type: process\n    gracefulStopSeconds: 5\n    process:\n      command: [sh, run.sh]\n",
        repo.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_created_offline_is_built_but_not_started_and_its_spec_is_not_rewritten() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let api = d.client();
    let manifest = format!("{}/manifests/agent.yaml", env!("CARGO_MANIFEST_DIR"));
    ok(d.hive(&["apply", "-f", &manifest]));
    // The controller acts on researcher (`wanted: Offline`, "kept stopped for now").
    spawned(&api, "researcher").await;
    let researcher = agent_of(&api, "researcher").await;
    assert_eq!(researcher["spec"]["wanted"], "Offline", "the spec was rewritten: {researcher}");
    assert_eq!(researcher["metadata"]["generation"], 1, "{researcher}");
    assert_ne!(researcher["status"]["power"], "Running", "{}", researcher["status"]);
    let again = ok(d.hive(&["apply", "-f", &manifest]));
    assert!(again.contains("agent.hive.dev/researcher unchanged"), "{again}");

    // A process agent created Offline: spawned (built) and left stopped, until a start.
    let repo = config_repo(&d.dir);
    let yaml = process_agent_yaml("scout", &repo, "Offline");
    ok(d.hive_stdin(&["apply", "-f", "-"], Some(&yaml)));
    let spawn = spawned(&api, "scout").await;
    assert_eq!(spawn["status"]["phase"], "Done", "{}", spawn["status"]);
    let scout = agent_of(&api, "scout").await;
    assert_eq!(scout["spec"]["wanted"], "Offline", "{scout}");
    assert_eq!(starts(&api, "scout").await, 0, "no process was started");
    assert!(!d.dir.join("agents/scout/pid").exists(), "no process runs");
    let again = ok(d.hive_stdin(&["apply", "-f", "-"], Some(&yaml)));
    assert!(again.contains("agent.hive.dev/scout unchanged"), "{again}");
    eventually("scout converged stopped", || async {
        let scout = agent_of(&api, "scout").await;
        (condition(&scout, "Converged")?["status"] == "True").then_some(())
    })
    .await;

    let out = ok(d.hive(&["start", "scout"]));
    assert!(out.lines().last().unwrap().starts_with("✓ Start scout"), "{out}");
    wait_power(&api, "scout", "Running").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_patch_of_wanted_offline_stops_with_the_graceful_stop_shape() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let agent = crate::agents::agent("calm", &repo, "Up");
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    wait_power(&api, "calm", "Running").await;
    let before = jobs_of(&api, "calm").await.len();

    ok(d.kubectl(&["patch", "agent", "calm", "--type=merge", "-p", r#"{"spec":{"wanted":"Offline"}}"#]));
    let job = eventually("the controller's Job for the edit", || async {
        let jobs = jobs_of(&api, "calm").await;
        (jobs.len() > before).then(|| jobs.last().unwrap()["metadata"]["name"].as_str().unwrap().to_string())
    })
    .await;
    let job = wait_terminal(&api, &job).await;
    assert_eq!(job["spec"]["template"], "Stop", "{}", job["spec"]);
    assert_eq!(kinds(&job), ["SetWanted", "Signal", "Drain", "Reconcile"], "the same shape as `hive stop`");
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    wait_power(&api, "calm", "Stopped").await;
    let calm = agent_of(&api, "calm").await;
    assert_eq!(calm["spec"]["wanted"], "Offline");

    // And back: the edit to Up is the Start shape.
    let before = jobs_of(&api, "calm").await.len();
    ok(d.kubectl(&["patch", "agent", "calm", "--type=merge", "-p", r#"{"spec":{"wanted":"Up"}}"#]));
    let job = eventually("the controller's Job for the second edit", || async {
        let jobs = jobs_of(&api, "calm").await;
        (jobs.len() > before).then(|| jobs.last().unwrap()["metadata"]["name"].as_str().unwrap().to_string())
    })
    .await;
    let job = wait_terminal(&api, &job).await;
    assert_eq!(
        (job["spec"]["template"].clone(), kinds(&job)),
        (json!("Start"), vec!["SetWanted".to_string(), "Reconcile".into()])
    );
    wait_power(&api, "calm", "Running").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_on_a_branch_rev_neither_rebuilds_nor_moves_to_a_new_branch_head() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let mut agent = crate::agents::agent("branchy", &repo, "Up");
    agent["spec"]["config"]["rev"] = json!("main");
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    wait_power(&api, "branchy", "Running").await;
    let current = d.dir.join("agents/branchy/current");
    let generation = std::fs::read_link(&current).unwrap();
    let applied = agent_of(&api, "branchy").await["status"]["appliedRev"].clone();

    let cycle = |why: &'static str| {
        let (d, api, current, generation, applied) = (&d, &api, &current, &generation, &applied);
        async move {
            ok(d.hive(&["stop", "branchy"]));
            let out = ok(d.hive(&["start", "branchy"]));
            let last = out.lines().last().unwrap();
            assert!(last.starts_with("✓ Start branchy: set-wanted ✓"), "{why}: {out}");
            assert!(!last.contains("prebuild"), "{why}: the start rebuilt: {out}");
            wait_power(api, "branchy", "Running").await;
            assert_eq!(&std::fs::read_link(current).unwrap(), generation, "{why}: a new generation");
            assert_eq!(&agent_of(api, "branchy").await["status"]["appliedRev"], applied, "{why}");
        }
    };
    cycle("no new commit").await;

    // A new commit on main, the lock unchanged: the start does not silently move.
    std::fs::write(repo.join("run.sh"), crate::agents::RUN_SH.replace("VERSION", "v3")).unwrap();
    git(&repo, &["commit", "--quiet", "-am", "v3"]);
    cycle("a new commit on main").await;
    let output = ok(d.hive(&["logs", "agent/branchy", "--tail", "3"]));
    assert!(output.contains("hello from v2") && !output.contains("v3"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_is_not_ready_counts_restarts_and_backs_off_without_a_job_per_try() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let mut agent = crate::agents::agent("crashy", &repo, "Up");
    agent["spec"]["runtime"]["process"]["command"] = json!(["sh", "-c", "exit 1"]);
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    spawned(&api, "crashy").await;
    let began = std::time::Instant::now();

    let crashy = eventually("two crash restarts", || async {
        let crashy = agent_of(&api, "crashy").await;
        (crashy["status"]["restarts"].as_u64().unwrap_or(0) >= 2).then_some(crashy)
    })
    .await;
    let crashed = condition(&crashy, "Crashed").expect("Crashed");
    assert_eq!(crashed["status"], "True", "{crashed}");
    eventually("Ready False and Converged False", || async {
        let crashy = agent_of(&api, "crashy").await;
        let ready = condition(&crashy, "Ready")?;
        let converged = condition(&crashy, "Converged")?;
        (ready["status"] == "False" && converged["status"] == "False").then_some(())
    })
    .await;
    let err = fails(d.kubectl(&["wait", "--for=condition=Ready", "agent/crashy", "--timeout=3s"]));
    assert!(err.contains("timed out"), "{err}");

    // The backoff holds: 1 s, 2 s, 4 s … from the last start, however fast the command
    // dies; each try is one start (only the spawn's start has the cold-start retry).
    let since = began.elapsed().as_secs() as i64;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let seconds = began.elapsed().as_secs() as i64;
    let count = starts(&api, "crashy").await;
    let restarts = agent_of(&api, "crashy").await["status"]["restarts"].as_u64().unwrap();
    assert!(restarts <= 6, "{restarts} restarts in {seconds} s");
    assert!(
        count <= 2 + restarts as i64,
        "{count} starts for {restarts} tries in the {seconds} s since the spawn ({since} s to two restarts)"
    );
    // No Job per try: the spawn is the only Job that names it.
    let jobs = jobs_of(&api, "crashy").await;
    let names: Vec<Value> = jobs.iter().map(|j| j["metadata"]["name"].clone()).collect();
    assert_eq!(jobs.len(), 1, "{names:?}\n{}", d.log());
    let table = ok(d.hive(&["get", "agents"]));
    let header = table.lines().next().unwrap();
    assert!(header.contains("RESTARTS"), "{table}");
    let row = table.lines().find(|l| l.starts_with("crashy")).unwrap();
    assert!(row.split_whitespace().any(|c| c.parse::<u64>().is_ok_and(|n| n >= 2)), "{table}");
    let kubectl = ok(d.kubectl(&["get", "agents"]));
    assert!(kubectl.lines().next().unwrap().contains("RESTARTS"), "{kubectl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_base_change_the_first_start_is_the_boot_sweeps_rebuild() {
    let mut d = Daemon::start_with(&["--agent-controller=true", "--hive-rev", "base-1"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(
        api.post("/apis/hive.dev/v1/agents", &crate::agents::agent("swept", &repo, "Up")).await.code,
        201
    );
    wait_power(&api, "swept", "Running").await;
    // The crash watch writes `Running` before it records the Started event.
    let before = eventually("the first start's event", || async {
        let n = starts(&api, "swept").await;
        (n >= 1).then_some(n)
    })
    .await;
    let generation = std::fs::read_link(d.dir.join("agents/swept/current")).unwrap();

    d.restart_with(&["--agent-controller=true", "--hive-rev", "base-2"]);
    let api = d.client();
    let sweep = eventually("the boot sweep", || async {
        let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
        jobs["items"].as_array()?.iter().find(|j| j["spec"]["template"] == "BootSweep").cloned()
    })
    .await;
    let sweep = wait_terminal(&api, sweep["metadata"]["name"].as_str().unwrap()).await;
    let child = sweep["status"]["children"][0].as_str().expect("a rebuild child").to_string();
    let child = wait_terminal(&api, &child).await;
    assert_eq!(child["status"]["phase"], "Done", "{}", child["status"]);
    wait_power(&api, "swept", "Running").await;
    assert_ne!(std::fs::read_link(d.dir.join("agents/swept/current")).unwrap(), generation);
    let after = eventually("the rebuild's start event", || async {
        let n = starts(&api, "swept").await - before;
        (n >= 1).then_some(n)
    })
    .await;
    assert_eq!(after, 1, "the only start after the boot is the rebuild's, on the new generation");
    let jobs = jobs_of(&api, "swept").await;
    let others: Vec<&Value> = jobs
        .iter()
        .filter(|j| j["spec"]["source"] == "Controller" && j["spec"]["template"] != "Spawn")
        .collect();
    assert!(others.is_empty(), "the controller started it on the old config: {others:?}");
}

// Regression (issue 26, item 6): each crash-watch retry ran the runtime's cold-start
// fallback too, so every try launched the process twice (10 starts for 5 tries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_watch_restart_launches_the_agent_once_per_try() {
    let d = Daemon::start();
    let repo = config_repo(&d.dir);
    // Each launch leaves a line in `launches`; while `crash` exists the agent exits at
    // once (and a running one exits on its own, a crash).
    let (launches, crash) = (d.dir.join("launches"), d.dir.join("crash"));
    let script = format!(
        "echo launch >> '{}'\ntrap 'exit 0' TERM\nwhile true; do [ -e '{}' ] && exit 3; sleep 0.1; done\n",
        launches.display(),
        crash.display()
    );
    std::fs::write(repo.join("run.sh"), script).unwrap();
    git(&repo, &["commit", "--quiet", "-am", "counts its launches"]);
    git(&repo, &["tag", "v3"]);
    let mut spec = crate::agents::agent("loopy", &repo, "Up");
    spec["spec"]["config"]["rev"] = json!("v3");
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &spec).await.code, 201);
    // No Agent controller here: crash-watch is the only thing that starts it after the
    // spawn, so every launch past the first is one of its tries.
    let spawn = api
        .post(
            "/apis/hive.dev/v1/jobs",
            &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {},
                    "spec": {"template": "Spawn", "agents": ["loopy"]}}),
        )
        .await;
    assert_eq!(spawn.code, 201, "{:?}", spawn.body);
    let spawn = wait_terminal(&api, spawn.body["metadata"]["name"].as_str().unwrap()).await;
    assert_eq!(spawn["status"]["phase"], "Done", "{}", spawn["status"]);
    wait_power(&api, "loopy", "Running").await;
    let count = || std::fs::read_to_string(&launches).unwrap_or_default().lines().count();
    assert_eq!(count(), 1);

    // Crash it, and let at least one whole try fail (the second try begins only after
    // the first one's outcome), then let it come up again.
    std::fs::write(&crash, b"").unwrap();
    eventually("two crash-watch tries", || async {
        (agent_of(&api, "loopy").await["status"]["restarts"].as_u64().unwrap_or(0) >= 2).then_some(())
    })
    .await;
    std::fs::remove_file(&crash).unwrap();
    let loopy = eventually("a crash-watch try that stays up", || async {
        let loopy = agent_of(&api, "loopy").await;
        let crashed = condition(&loopy, "Crashed")?;
        (crashed["status"] == "False" && loopy["status"]["power"] == "Running").then_some(loopy)
    })
    .await;
    let restarts = loopy["status"]["restarts"].as_u64().unwrap() as usize;
    assert_eq!(count(), 1 + restarts, "one launch for the spawn and one per crash-watch try ({restarts})");
    let started = eventually("a Started event per launch", || async {
        let n = starts(&api, "loopy").await;
        (n as usize > restarts).then_some(n)
    })
    .await;
    assert_eq!(started as usize, 1 + restarts, "Started events: one per launch");
}
