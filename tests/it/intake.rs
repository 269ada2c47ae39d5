//! One intake for Jobs: a Job runs whatever wrote it — `hive apply`, `kubectl apply`
//! (client-side and server-side), `kubectl create`, POST — exactly once, claimed by the
//! daemon in its status; a template Job is expanded from the stored spec, a custom DAG
//! runs as written, a Job that cannot run ends Failed with a reason, `hive cancel` works
//! on an applied Job still queued, and a Job written while the daemon was down runs when
//! it comes back while a claimed one left unfinished is not run again.

use std::path::Path;

use serde_json::{json, Value};

use crate::agents::{agent, config_repo, git, wait_power, wait_terminal};
use crate::harness::{eventually, fails, ok, Api, Daemon};

fn restart_yaml(name: &str, agent: &str) -> String {
    format!(
        "apiVersion: hive.dev/v1\nkind: Job\nmetadata:\n  name: {name}\nspec:\n  template: Restart\n  agents: [{agent}]\n"
    )
}

/// The agent's process id, from the runtime's pid file.
fn pid_of(d: &Daemon, agent: &str) -> String {
    let pid = std::fs::read_to_string(d.dir.join(format!("agents/{agent}/pid"))).unwrap_or_default();
    pid.split_whitespace().next().unwrap_or_default().to_string()
}

/// How many times the agent's process started: each start greets once.
async fn starts(api: &Api, agent: &str) -> usize {
    let log = api.get(&format!("/apis/hive.dev/v1/agents/{agent}/log")).await.body;
    log.as_str().unwrap_or("").matches("hello from v1").count()
}

fn write(dir: &Path, file: &str, text: &str) -> String {
    let path = dir.join(file);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn claim_of(job: &Value) -> &str {
    job["status"]["claim"]["run"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_jobs_written_by_any_path_run_exactly_once() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("zeta", &repo, "Up")).await.code, 201);
    wait_power(&api, "zeta", "Running").await;
    eventually("zeta's first greeting", || async { (starts(&api, "zeta").await == 1).then_some(()) }).await;

    for path in ["hive-apply", "kubectl-apply", "kubectl-create", "kubectl-server-side"] {
        let name = format!("restart-by-{path}");
        let file = write(&d.dir, &format!("{name}.yaml"), &restart_yaml(&name, "zeta"));
        let (before_pid, before) = (pid_of(&d, "zeta"), starts(&api, "zeta").await);
        let out = match path {
            "hive-apply" => ok(d.hive(&["apply", "-f", &file])),
            "kubectl-apply" => ok(d.kubectl(&["apply", "-f", &file])),
            "kubectl-create" => ok(d.kubectl(&["create", "-f", &file])),
            _ => ok(d.kubectl(&["apply", "--server-side", "-f", &file])),
        };
        assert!(out.contains(&format!("job.hive.dev/{name} ")), "{path}: {out}");
        let job = wait_terminal(&api, &name).await;
        assert_eq!(job["status"]["phase"], "Done", "{path}: {}", job["status"]);
        assert!(!claim_of(&job).is_empty(), "{path}: the claim is visible in the Job: {}", job["status"]);
        let kinds: Vec<&str> =
            job["spec"]["nodes"].as_array().unwrap().iter().filter_map(|n| n["kind"].as_str()).collect();
        assert_eq!(kinds, ["SetWanted", "Signal", "Drain", "StopForUpdate", "Reconcile"], "{path}");
        // The process restarted, once.
        wait_power(&api, "zeta", "Running").await;
        eventually(&format!("zeta restarted by {path}"), || async {
            (starts(&api, "zeta").await > before).then_some(())
        })
        .await;
        assert_eq!(starts(&api, "zeta").await, before + 1, "{path}: one restart, not two");
        assert_ne!(pid_of(&d, "zeta"), before_pid, "{path}: a new process");
    }

    // Re-applying a Job that ran changes nothing and runs nothing.
    let file = d.dir.join("restart-by-hive-apply.yaml").display().to_string();
    let before = starts(&api, "zeta").await;
    let out = ok(d.hive(&["apply", "-f", &file]));
    assert_eq!(out.trim(), "job.hive.dev/restart-by-hive-apply unchanged");
    let job = api.get("/apis/hive.dev/v1/jobs/restart-by-hive-apply").await.body;
    assert_eq!(job["status"]["phase"], "Done");
    assert_eq!(starts(&api, "zeta").await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_custom_dags_run_and_cyclic_ones_are_refused() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("eta", &repo, "Up")).await.code, 201);
    wait_power(&api, "eta", "Running").await;

    let dag = "apiVersion: hive.dev/v1\nkind: Job\nmetadata:\n  name: bounce-eta\nspec:\n  template: Restart\n  nodes:\n    - id: stop\n      kind: StopForUpdate\n      agent: eta\n    - id: up\n      kind: Reconcile\n      agent: eta\n      deps: [{node: stop}]\n";
    let file = write(&d.dir, "bounce.yaml", dag);
    assert_eq!(ok(d.hive(&["apply", "-f", &file])).trim(), "job.hive.dev/bounce-eta created");
    let job = wait_terminal(&api, "bounce-eta").await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    let states: Vec<&str> =
        job["status"]["nodes"].as_array().unwrap().iter().filter_map(|n| n["state"].as_str()).collect();
    assert_eq!(states, ["Done", "Done"], "{}", job["status"]);
    wait_power(&api, "eta", "Running").await;

    // The spec of a claimed Job is fixed: the scheduler runs the one it claimed.
    let mut edited = job.clone();
    edited["spec"]["reason"] = json!("changed afterwards");
    let refused = api.put("/apis/hive.dev/v1/jobs/bounce-eta", &edited).await;
    assert_eq!(refused.code, 422, "{:?}", refused.body);
    assert!(refused.body.to_string().contains("spec"), "{:?}", refused.body);

    // A cycle is refused by every path that writes a spec, naming the field.
    let cyclic = "apiVersion: hive.dev/v1\nkind: Job\nmetadata:\n  name: loop\nspec:\n  template: Reconcile\n  nodes:\n    - {id: a, kind: Reconcile, agent: eta, deps: [{node: b}]}\n    - {id: b, kind: Reconcile, agent: eta, deps: [{node: a}]}\n";
    let file = write(&d.dir, "loop.yaml", cyclic);
    let err = fails(d.hive(&["apply", "-f", &file]));
    assert!(err.contains("spec.nodes") && err.contains("dependency cycle"), "{err}");
    let err = fails(d.kubectl(&["apply", "--server-side", "-f", &file]));
    assert!(err.contains("spec.nodes") && err.contains("dependency cycle"), "{err}");
    let err = fails(d.kubectl(&["apply", "-f", &file]));
    assert!(err.contains("spec.nodes") && err.contains("dependency cycle"), "{err}");
    let mut looped = job.clone();
    looped["spec"]["nodes"] = json!([
        {"id": "a", "kind": "Reconcile", "agent": "eta", "deps": [{"node": "b"}]},
        {"id": "b", "kind": "Reconcile", "agent": "eta", "deps": [{"node": "a"}]}
    ]);
    let refused = api.put("/apis/hive.dev/v1/jobs/bounce-eta", &looped).await;
    assert_eq!(refused.code, 422, "{:?}", refused.body);
    assert!(refused.body.to_string().contains("dependency cycle"), "{:?}", refused.body);
    assert_eq!(api.get("/apis/hive.dev/v1/jobs/loop").await.code, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_job_that_cannot_run_fails_with_a_reason() {
    let d = Daemon::start();
    let api = d.client();
    let file = write(&d.dir, "ghost.yaml", &restart_yaml("restart-ghost", "ghost"));
    ok(d.hive(&["apply", "-f", &file]));
    let job = wait_terminal(&api, "restart-ghost").await;
    assert_eq!(job["status"]["phase"], "Failed", "{}", job["status"]);
    let message = job["status"]["message"].as_str().unwrap_or("");
    assert!(message.contains("ghost") && message.contains("not found"), "{}", job["status"]);
    let table = ok(d.hive(&["get", "jobs"]));
    assert!(table.lines().any(|l| l.contains("restart-ghost") && l.contains("Failed")), "{table}");

    // A template that is not built from agents cannot be expanded: refused at admission.
    let meta = "apiVersion: hive.dev/v1\nkind: Job\nmetadata:\n  name: meta-x\nspec:\n  template: MetaUpdate\n  agents: [ghost]\n";
    let file = write(&d.dir, "meta.yaml", meta);
    let err = fails(d.hive(&["apply", "-f", &file]));
    assert!(err.contains("spec.template"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_answers_the_claimed_job_with_its_expanded_nodes() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("theta", &repo, "Up")).await.code, 201);
    wait_power(&api, "theta", "Running").await;
    let reply = api
        .post(
            "/apis/hive.dev/v1/jobs",
            &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "stop-theta"},
                    "spec": {"template": "Stop", "agents": ["theta"]}}),
        )
        .await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    let ids: Vec<&str> =
        reply.body["spec"]["nodes"].as_array().unwrap().iter().filter_map(|n| n["id"].as_str()).collect();
    assert_eq!(ids, ["theta/set-wanted", "theta/signal", "theta/drain", "theta/reconcile"]);
    assert!(!claim_of(&reply.body).is_empty(), "the answer is the claimed Job: {}", reply.body);
    assert_eq!(wait_terminal(&api, "stop-theta").await["status"]["phase"], "Done");
    wait_power(&api, "theta", "Stopped").await;
}

/// An agent whose harness ignores the fence: a graceful stop holds its lease for the
/// whole drain timeout (`drain` seconds), during which later Jobs wait fully queued.
async fn stubborn(d: &Daemon, api: &Api, name: &str, drain: u64) {
    let repo = d.dir.join(name);
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "--quiet", "-b", "main"]);
    std::fs::write(
        repo.join("run.sh"),
        "echo \"hello from v1\"\ntrap '' USR1\ntrap 'exit 0' TERM\nwhile true; do sleep 0.1; done\n",
    )
    .unwrap();
    git(&repo, &["add", "run.sh"]);
    git(&repo, &["commit", "--quiet", "-m", "stubborn"]);
    let mut object = agent(name, &repo, "Up");
    object["spec"]["config"]["rev"] = json!("main");
    object["spec"]["runtime"]["gracefulStopSeconds"] = json!(drain);
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &object).await.code, 201);
    wait_power(api, name, "Running").await;
}

/// Submits a Stop through POST and waits until its Drain holds the agent's lease.
async fn hold_lease(api: &Api, agent: &str) -> String {
    let reply = api
        .post(
            "/apis/hive.dev/v1/jobs",
            &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {},
                    "spec": {"template": "Stop", "agents": [agent]}}),
        )
        .await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    let name = reply.body["metadata"]["name"].as_str().unwrap().to_string();
    eventually("the stop to drain", || async {
        let job = api.get(&format!("/apis/hive.dev/v1/jobs/{name}")).await.body;
        let draining = job["status"]["nodes"].as_array().is_some_and(|n| {
            n.iter().any(|n| n["id"] == format!("{agent}/drain") && n["state"] == "Running")
        });
        draining.then_some(())
    })
    .await;
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hive_cancel_cancels_an_applied_job_still_queued() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let api = d.client();
    stubborn(&d, &api, "iota", 20).await;
    let stop = hold_lease(&api, "iota").await;
    let file = write(&d.dir, "restart.yaml", &restart_yaml("restart-iota", "iota"));
    ok(d.kubectl(&["apply", "--server-side", "-f", &file]));
    eventually("the applied Job to be claimed", || async {
        let job = api.get("/apis/hive.dev/v1/jobs/restart-iota").await.body;
        (!claim_of(&job).is_empty()).then_some(())
    })
    .await;
    let out = ok(d.hive(&["cancel", "restart-iota"]));
    assert_eq!(out.trim(), "job.hive.dev/restart-iota cancelled");
    assert_eq!(wait_terminal(&api, "restart-iota").await["status"]["phase"], "Cancelled");
    let _ = wait_terminal(&api, &stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_runs_jobs_written_while_down_and_not_claimed_ones_again() {
    let mut d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("lambda", &repo, "Up")).await.code, 201);
    wait_power(&api, "lambda", "Running").await;
    stubborn(&d, &api, "kappa", 30).await;
    let stop = hold_lease(&api, "kappa").await;
    // Claimed and queued behind the Stop's lease when the daemon dies.
    let file = write(&d.dir, "queued.yaml", &restart_yaml("restart-queued", "kappa"));
    ok(d.hive(&["apply", "-f", &file]));
    eventually("the applied Job to be claimed", || async {
        let job = api.get("/apis/hive.dev/v1/jobs/restart-queued").await.body;
        (!claim_of(&job).is_empty()).then_some(())
    })
    .await;
    d.kill9();

    // Written while no daemon runs, straight into its store.
    {
        let store = hive::store::Store::open(hive::store::StoreConfig::new(d.dir.join("hive.redb"))).unwrap();
        let job = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "restart-while-down"},
                         "spec": {"template": "Restart", "agents": ["lambda"]}});
        store.commit(hive::store::Mutation::Create { kind: "jobs", object: job }, false).await.unwrap();
        store.shutdown().await;
    }
    d.restart();
    let api = d.client();
    for name in [stop.as_str(), "restart-queued"] {
        let job = wait_terminal(&api, name).await;
        assert_eq!(job["status"]["phase"], "Interrupted", "{name}: {}", job["status"]);
    }
    let queued = api.get("/apis/hive.dev/v1/jobs/restart-queued").await.body;
    let ran = queued["status"]["nodes"].as_array().into_iter().flatten().any(|n| n["startedAt"].is_string());
    assert!(!ran, "a claimed Job is never run by a second daemon run: {}", queued["status"]);
    let job = wait_terminal(&api, "restart-while-down").await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    assert_ne!(claim_of(&job), claim_of(&queued), "claimed by the new run");
    wait_power(&api, "lambda", "Running").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_job_manifest_runs() {
    // The daemon runs from the repository root, where the hello agent's `.` resolves.
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let root = env!("CARGO_MANIFEST_DIR");
    ok(d.hive(&["apply", "-f", &format!("{root}/manifests/hello-agent.yaml")]));
    let out = d.kubectl(&["wait", "--for=condition=Ready", "agent/hello", "--timeout=90s"]);
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), d.log());
    let out = ok(d.hive(&["apply", "-f", &format!("{root}/manifests/job.yaml")]));
    let name = out.trim().strip_prefix("job.hive.dev/").and_then(|r| r.strip_suffix(" created")).expect(&out);
    let api = d.client();
    let job = wait_terminal(&api, name).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    wait_power(&api, "hello", "Running").await;
}
