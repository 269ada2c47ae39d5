//! Why is it failing? (issue 32): the real daemon's agents say where they stand in one
//! word — the server's Table, `hive get`, kubectl — an agent that crashed keeps its last
//! exit (code, time, the last lines of its stderr, without the state dir's path) at the
//! top of `hive describe`, and `hive wait --for=condition=Ready` gives up at once, with
//! the reason, on an agent that failed for good.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::agents::config_repo;
use crate::harness::{eventually, fails, ok, Api, Daemon};

async fn agent_of(api: &Api, name: &str) -> Value {
    api.get(&format!("/apis/hive.dev/v1/agents/{name}")).await.body
}

/// The cell of the row of `name` under `header` in an aligned table (an empty cell is
/// spaces, so the column is found by where its header starts).
fn cell(table: &str, name: &str, header: &str) -> String {
    let head = table.lines().next().unwrap();
    let at = head.find(&format!("{header} ")).unwrap_or_else(|| panic!("no {header} in\n{table}"));
    let line = table.lines().find(|l| l.split_whitespace().next() == Some(name));
    let line = line.unwrap_or_else(|| panic!("no row {name} in\n{table}"));
    line.get(at..).unwrap_or_default().split_whitespace().next().unwrap_or_default().to_string()
}

/// An agent whose command prints a panic naming a file under its working directory (in
/// the state dir) on stderr, and exits 3.
fn crashing(repo: &std::path::Path) -> Value {
    let mut agent = crate::agents::agent("crashy", repo, "Up");
    agent["spec"]["runtime"]["process"]["command"] =
        json!(["sh", "-c", "echo starting; echo \"panic: $PWD/config.toml: no such file\" >&2; exit 3"]);
    agent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_agent_says_crash_loop_back_off_and_keeps_its_last_exit() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &crashing(&repo)).await.code, 201);
    let crashy = eventually("a crash restart", || async {
        let crashy = agent_of(&api, "crashy").await;
        (crashy["status"]["restarts"].as_u64().unwrap_or(0) >= 1
            && crashy["status"]["phase"] == "CrashLoopBackOff")
            .then_some(crashy)
    })
    .await;
    let state_dir = d.dir.display().to_string();
    let last = &crashy["status"]["lastExit"];
    assert_eq!(last["exitCode"], 3, "{}", crashy["status"]);
    assert!(last["finishedAt"].is_string(), "{last}");
    let stderr: Vec<&str> = last["stderr"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert_eq!(stderr.len(), 1, "stderr only, not stdout: {stderr:?}");
    assert!(stderr[0].starts_with("panic: $STATE_DIR/agents/crashy/"), "{stderr:?}");
    assert!(stderr[0].ends_with("/config.toml: no such file"), "{stderr:?}");
    let status = crashy["status"].to_string();
    assert!(!status.contains(&state_dir), "the state dir's path is in the status: {status}");

    let table = ok(d.hive(&["get", "agents"]));
    assert_eq!(cell(&table, "crashy", "STATUS"), "CrashLoopBackOff", "{table}");
    let kubectl = ok(d.kubectl(&["get", "agents"]));
    assert_eq!(cell(&kubectl, "crashy", "STATUS"), "CrashLoopBackOff", "{kubectl}");

    // `describe` says the last exit before the spec and the status.
    let described = ok(d.hive(&["describe", "agent", "crashy"]));
    let at = |what: &str| described.find(what).unwrap_or_else(|| panic!("no {what:?} in\n{described}"));
    assert!(at("Status:") < at("Last Exit:"), "{described}");
    assert!(at("Last Exit:") < at("Spec:"), "{described}");
    assert!(described.contains("exit code 3"), "{described}");
    assert!(described.contains("panic: $STATE_DIR/agents/crashy/"), "{described}");
    // The state dir holds the test's config repo, which the spec names; nothing else
    // names it.
    let leaks: Vec<&str> =
        described.lines().filter(|l| l.contains(&state_dir) && !l.contains("config-repo")).collect();
    assert!(leaks.is_empty(), "{leaks:#?}\n{described}");
    let conditions = described.split("Conditions:").nth(1).unwrap().split("Events:").next().unwrap();
    let widest = conditions.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(widest <= 200, "a condition line of {widest} columns:\n{described}");

    // A wait for Ready ends at once, naming the phase and why.
    let began = Instant::now();
    let err = fails(d.hive(&["wait", "agent/crashy", "--for=condition=Ready", "--timeout=60s"]));
    assert!(began.elapsed() < Duration::from_secs(20), "waited {:?}", began.elapsed());
    assert!(err.contains("CrashLoopBackOff"), "{err}");
    assert!(err.contains("exit code 3"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_cannot_launch_says_start_failed_once_and_a_wait_gives_up() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let mut agent = crate::agents::agent("nolaunch", &repo, "Up");
    agent["spec"]["runtime"]["process"]["command"] = json!(["./no-such-program"]);
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    let agent = eventually("StartFailed", || async {
        let agent = agent_of(&api, "nolaunch").await;
        (agent["status"]["phase"] == "StartFailed").then_some(agent)
    })
    .await;
    let table = ok(d.hive(&["get", "agents"]));
    assert_eq!(cell(&table, "nolaunch", "STATUS"), "StartFailed", "{table}");
    // The spawn's start and its cold-start fallback failed alike: the error says it once,
    // without the state dir.
    let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
    let errors: Vec<String> = jobs["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|j| j["status"]["nodes"].as_array().cloned().unwrap_or_default())
        .filter_map(|n| n["error"].as_str().map(str::to_string))
        .collect();
    let error = errors.iter().find(|e| e.contains("no-such-program")).expect("the start's error");
    assert_eq!(error.matches("no-such-program").count(), 1, "{error}");
    assert!(error.contains("again after a cold start"), "{error}");
    assert!(!error.contains(&d.dir.display().to_string()), "{error}");
    let status = agent["status"].to_string();
    assert!(!status.contains(&d.dir.display().to_string()), "{status}");
    let began = Instant::now();
    let err = fails(d.hive(&["wait", "agent/nolaunch", "--for=condition=Ready", "--timeout=60s"]));
    assert!(began.elapsed() < Duration::from_secs(20), "waited {:?}", began.elapsed());
    assert!(err.contains("StartFailed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_on_purpose_running_and_a_failed_build_each_have_their_word() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let up = crate::agents::agent("up", &repo, "Up");
    let off = crate::agents::agent("off", &repo, "Offline");
    let mut broken = crate::agents::agent("broken", &repo, "Up");
    broken["spec"]["runtime"]["process"]["build"] = json!(["sh", "-c", "echo cannot build >&2; exit 1"]);
    for agent in [&up, &off, &broken] {
        assert_eq!(api.post("/apis/hive.dev/v1/agents", agent).await.code, 201);
    }
    let want = [("up", "Running"), ("off", "Stopped"), ("broken", "BuildFailed")];
    eventually("each agent's phase", || async {
        let mut all = true;
        for (name, phase) in want {
            all &= agent_of(&api, name).await["status"]["phase"] == phase;
        }
        all.then_some(())
    })
    .await;
    let table = ok(d.hive(&["get", "agents", "-o", "wide"]));
    for (name, phase) in want {
        assert_eq!(cell(&table, name, "STATUS"), phase, "{table}");
    }
    let err = fails(d.hive(&["wait", "agent/broken", "--for=condition=Ready", "--timeout=60s"]));
    assert!(err.contains("BuildFailed"), "{err}");
}

/// A Job whose nodes failed on two agents names both in its message (it named the first
/// only), and `hive jobs --agent A --phase P` lists just the Jobs that touch A in phase P.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_names_every_failed_node_and_hive_jobs_filters_by_agent_and_phase() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    for name in ["nolaunch-a", "nolaunch-b"] {
        let mut agent = crate::agents::agent(name, &repo, "Up");
        agent["spec"]["runtime"]["process"]["command"] = json!(["./no-such-program"]);
        assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    }
    assert_eq!(
        api.post("/apis/hive.dev/v1/agents", &crate::agents::agent("fine", &repo, "Up")).await.code,
        201
    );
    eventually("both StartFailed, fine Running", || async {
        let a = agent_of(&api, "nolaunch-a").await["status"]["phase"] == "StartFailed";
        let b = agent_of(&api, "nolaunch-b").await["status"]["phase"] == "StartFailed";
        let fine = agent_of(&api, "fine").await["status"]["phase"] == "Running";
        (a && b && fine).then_some(())
    })
    .await;
    let restart = d.hive(&["restart", "nolaunch-a", "nolaunch-b"]);
    assert_eq!(restart.status.code(), Some(1), "{}", String::from_utf8_lossy(&restart.stderr));
    let out = String::from_utf8_lossy(&restart.stdout).into_owned();
    let name = out
        .lines()
        .find_map(|l| l.strip_prefix("job.hive.dev/")?.strip_suffix(" submitted"))
        .unwrap_or_else(|| panic!("no Job named in {out}"))
        .to_string();
    let job = crate::agents::wait_terminal(&api, &name).await;
    assert_eq!(job["status"]["phase"], "Failed", "{}", job["status"]);
    let failed: Vec<String> = job["status"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["state"] == "Failed")
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(failed.len(), 2, "{}", job["status"]);
    let message = job["status"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("2 nodes failed: "), "{message}");
    for id in &failed {
        assert!(message.contains(&format!("{id}: ")), "{id} is not named: {message}");
    }
    let described = ok(d.hive(&["describe", "job", &name]));
    for id in &failed {
        assert!(described.contains(id.as_str()), "{described}");
    }

    // hive jobs --agent --phase: only the Jobs touching nolaunch-a, only the Failed ones.
    let names = |table: &str| -> Vec<String> {
        table.lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect()
    };
    let all = ok(d.hive(&["jobs"]));
    let mine = names(&ok(d.hive(&["jobs", "--agent", "nolaunch-a", "--phase", "failed"])));
    assert!(mine.contains(&name), "{mine:?}\n{all}");
    let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
    let want: Vec<String> = jobs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["status"]["phase"] == "Failed")
        .filter(|j| j["spec"]["nodes"].as_array().unwrap().iter().any(|n| n["agent"] == "nolaunch-a"))
        .map(|j| j["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let (mut got, mut want) = (mine.clone(), want);
    got.sort();
    want.sort();
    assert_eq!(got, want, "{all}");
    assert!(names(&all).len() > mine.len(), "the filter left out fine's Jobs: {all}");
    let done = names(&ok(d.hive(&["jobs", "--agent", "fine", "--phase", "Done"])));
    assert!(!done.is_empty() && !done.contains(&name), "{done:?}\n{all}");
    let none = d.hive(&["jobs", "--agent", "nobody"]);
    assert!(none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("No jobs match."));
    let err = fails(d.hive(&["jobs", "--phase", "Broken"]));
    assert!(err.contains("not a Job phase"), "{err}");
}

/// Noise (issue 32): limits that cannot be enforced are said once per agent and cause —
/// one `LimitsNotEnforced` Event (count 1) and one warning — not at every start; and a
/// graceful stop logs no "store is shut down" warnings from the parts still winding down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_not_enforced_is_said_once_and_a_stop_is_quiet() {
    let mut d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(
        api.post("/apis/hive.dev/v1/agents", &crate::agents::agent("calm", &repo, "Up")).await.code,
        201
    );
    crate::agents::wait_power(&api, "calm", "Running").await;
    let agent = agent_of(&api, "calm").await;
    let enforced = agent["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "LimitsEnforced" && c["status"] == "True");
    if enforced {
        eprintln!("skipped the limits half: this host enforces agent limits (cgroup v2 delegated)");
    } else {
        for _ in 0..2 {
            ok(d.hive(&["restart", "calm"]));
        }
        let selector = "fieldSelector=involvedObject.name=calm,reason=LimitsNotEnforced";
        let events = api.get(&format!("/api/v1/events?{selector}")).await.body;
        let items = events["items"].as_array().unwrap();
        let counts: Vec<u64> = items.iter().map(|e| e["count"].as_u64().unwrap_or(1)).collect();
        assert_eq!(counts, [1], "one LimitsNotEnforced Event, once: {events}");
        let said =
            d.log().lines().filter(|l| l.contains("starting without enforced limits agent=calm")).count();
        assert_eq!(said, 1, "{}", d.log());
    }
    // A local fleet node: its worker logs into the daemon's (redirected) stderr, and it
    // ends with the daemon.
    let command = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "quiet"},
                         "spec": {"provision": {"provider": "process", "count": 1}}});
    assert_eq!(api.post("/apis/hive.dev/v1/fleetcommands", &command).await.code, 201);
    eventually("node-1 Running", || async {
        let n = api.get("/apis/hive.dev/v1/nodes/node-1").await.body;
        (n["status"]["phase"] == "Running").then_some(())
    })
    .await;
    d.stop();
    let log = d.log();
    let noisy: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ") && l.contains("shut down")).collect();
    assert!(noisy.is_empty(), "warnings at shutdown:\n{}", noisy.join("\n"));
    // No colour in a log that is not a terminal, the fleet worker's lines included.
    assert!(log.contains("fleet worker"), "the worker logged nothing here:\n{log}");
    assert!(!log.contains('\x1b'), "escape codes in a redirected log:\n{log}");
}

/// The built-in `docker` Provider of a daemon whose fleet endpoint listens on loopback
/// only says why it is not Ready (issue 32: it said Ready, and every Provision failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_provider_on_a_loopback_fleet_endpoint_says_why_it_is_not_ready() {
    let d = Daemon::start_with(&["--provider", "docker"]);
    let api = d.client();
    let docker = eventually("the docker Provider checked", || async {
        let p = api.get("/apis/hive.dev/v1/providers/docker").await.body;
        p["status"]["state"].is_string().then_some(p)
    })
    .await;
    assert_eq!(docker["status"]["state"], "ConfigurationError", "{docker}");
    let message = docker["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("loopback only") && message.contains("--fleet-listen"), "{message}");
}
