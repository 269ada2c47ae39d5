//! Jobs end to end through the daemon: template Jobs built by the submit layer and run
//! by the scheduler against real agent processes, cancel, node and agent logs, and a
//! `kill -9` of the daemon converging on restart.

use std::time::Duration;

use serde_json::{json, Value};

use crate::agents::{agent, config_repo, git, wait_power, wait_terminal};
use crate::harness::{fails, Api, Daemon};

async fn run_job(api: &Api, template: &str, agents: &[&str]) -> (String, Value) {
    let reply = api
        .post("/apis/hive.dev/v1/jobs", &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {},
                                               "spec": {"template": template, "agents": agents, "source": "Cli"}}))
        .await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    let name = reply.body["metadata"]["name"].as_str().unwrap().to_string();
    (name.clone(), wait_terminal(api, &name).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_jobs_drive_real_agents() {
    let mut d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    for name in ["alpha", "beta"] {
        assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent(name, &repo, "Up")).await.code, 201);
    }
    // The Agent controller spawns new agents by itself: one Spawn Job each.
    wait_power(&api, "alpha", "Running").await;
    wait_power(&api, "beta", "Running").await;
    let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
    let spawns: Vec<&Value> =
        jobs["items"].as_array().unwrap().iter().filter(|j| j["spec"]["template"] == "Spawn").collect();
    assert_eq!(spawns.len(), 2, "{jobs}");
    let job = spawns.iter().find(|j| j["spec"]["nodes"][0]["agent"] == "alpha").copied().unwrap().clone();
    let job = wait_terminal(&api, job["metadata"]["name"].as_str().unwrap()).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    assert_eq!(job["spec"]["source"], "Controller");

    // The node's build log and the agent's own output are readable.
    let log = api
        .get(&format!(
            "/apis/hive.dev/v1/jobs/{}/log?node=alpha%2Fcreate",
            job["metadata"]["name"].as_str().unwrap()
        ))
        .await;
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
        .post(
            "/apis/hive.dev/v1/jobs",
            &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {},
                                               "spec": {"template": "Start", "agents": ["alpha", "ghost"]}}),
        )
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_controller_converges_rebuilds_recovers_and_removes() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("gamma", &repo, "Up")).await.code, 201);
    let out = d.kubectl(&["wait", "--for=condition=Ready", "agent/gamma", "--timeout=60s"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = d.kubectl(&["wait", "--for=condition=Building=False", "agent/gamma", "--timeout=30s"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // A new rev rebuilds it once, and it serves the new generation.
    let patched = api
        .patch(
            "/apis/hive.dev/v1/agents/gamma",
            "application/merge-patch+json",
            &json!({"spec": {"config": {"rev": "v2"}}}),
        )
        .await;
    assert_eq!(patched.code, 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let log = api.get("/apis/hive.dev/v1/agents/gamma/log").await.body;
        if log.as_str().unwrap_or("").contains("hello from v2") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never rebuilt: {log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
    let rebuilds =
        jobs["items"].as_array().unwrap().iter().filter(|j| j["spec"]["template"] == "Rebuild").count();
    assert_eq!(rebuilds, 1, "exactly one Job for one intent change: {jobs}");
    let events = api.get("/api/v1/events?fieldSelector=involvedObject.name%3Dgamma").await.body;
    let reasons: Vec<&str> =
        events["items"].as_array().unwrap().iter().filter_map(|e| e["reason"].as_str()).collect();
    for reason in ["Spawned", "Built", "Rebuilt", "Started"] {
        assert!(reasons.contains(&reason), "{reason} missing from {reasons:?}");
    }

    // A crash (the process killed behind hive's back) is noticed and recovered.
    wait_power(&api, "gamma", "Running").await;
    // Past the runtime's start grace (an exit within it is a failed start, retried by
    // the cold-start fallback inside the same Job, not a crash).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = std::fs::read_to_string(d.dir.join("agents/gamma/pid")).unwrap();
    let pid = pid.split_whitespace().next().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-9", &pid]).status().unwrap().success());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let events =
            api.get("/api/v1/events?fieldSelector=involvedObject.name%3Dgamma%2Creason%3DCrashed").await.body;
        let running = api.get("/apis/hive.dev/v1/agents/gamma").await.body["status"]["power"] == "Running";
        if !events["items"].as_array().unwrap().is_empty() && running {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            let all = api.get("/api/v1/events?fieldSelector=involvedObject.name%3Dgamma").await.body;
            let agent = api.get("/apis/hive.dev/v1/agents/gamma").await.body;
            let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
            panic!(
                "crash not recovered: {events}\nall: {all}\nagent: {}\njobs: {}",
                agent["status"],
                jobs["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|j| format!(
                        "{} {} {}",
                        j["metadata"]["name"], j["spec"]["source"], j["status"]["phase"]
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Wanted Offline through a plain patch: the controller converges power.
    api.patch(
        "/apis/hive.dev/v1/agents/gamma",
        "application/merge-patch+json",
        &json!({"spec": {"wanted": "Offline"}}),
    )
    .await;
    wait_power(&api, "gamma", "Stopped").await;

    // Delete: the finalizer holds the object until the agent is removed.
    assert_eq!(api.delete("/apis/hive.dev/v1/agents/gamma").await.code, 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while api.get("/apis/hive.dev/v1/agents/gamma").await.code != 404 {
        assert!(tokio::time::Instant::now() < deadline, "the agent was never removed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!d.dir.join("agents/gamma").exists(), "its generations are removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hello_agent_runs_out_of_the_box() {
    // The daemon runs from the repository root (the test's working directory), as the
    // README's tour starts it; the example names this repository as `.`.
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/hello-agent.yaml");
    crate::harness::ok(d.hive(&["apply", "-f", manifest]));
    let out = d.kubectl(&["wait", "--for=condition=Ready", "agent/hello", "--timeout=90s"]);
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), d.log());
    let api = d.client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let log = api.get("/apis/hive.dev/v1/agents/hello/log").await.body;
        if log.as_str().unwrap_or("").contains("hello: hello, built") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no greeting: {log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, job) = run_job(&api, "Stop", &["hello"]).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    let log = api.get("/apis/hive.dev/v1/agents/hello/log").await.body;
    assert!(log.as_str().unwrap_or("").contains("checkpoint before stopping"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_queued_power_job_reverts_intent_to_observed() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    // An agent whose harness ignores the fence: a graceful stop holds its lease for the
    // whole drain timeout (2 s), during which a second Job waits fully queued.
    let repo = d.dir.join("stubborn");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "--quiet", "-b", "main"]);
    std::fs::write(repo.join("run.sh"), "trap '' USR1\ntrap 'exit 0' TERM\nwhile true; do sleep 0.1; done\n")
        .unwrap();
    git(&repo, &["add", "run.sh"]);
    git(&repo, &["commit", "--quiet", "-m", "stubborn"]);
    let api = d.client();
    let mut stubborn = agent("stubborn", &repo, "Up");
    stubborn["spec"]["config"]["rev"] = json!("main");
    stubborn["spec"]["runtime"]["gracefulStopSeconds"] = json!(2);
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &stubborn).await.code, 201);
    wait_power(&api, "stubborn", "Running").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let submit = |template: &'static str| {
        let api = api.clone();
        async move {
            let reply = api
                .post("/apis/hive.dev/v1/jobs", &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {},
                                                       "spec": {"template": template, "agents": ["stubborn"]}}))
                .await;
            assert_eq!(reply.code, 201, "{:?}", reply.body);
            reply.body["metadata"]["name"].as_str().unwrap().to_string()
        }
    };
    let stop = submit("Stop").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restart = submit("Restart").await;
    assert_eq!(api.get("/apis/hive.dev/v1/agents/stubborn").await.body["spec"]["wanted"], "Up");
    let cancelled = api
        .send(
            "POST",
            &format!("/apis/hive.dev/v1/jobs/{restart}/cancel"),
            "application/json",
            Some("{}".into()),
        )
        .await;
    assert_eq!(cancelled.code, 200, "{:?}", cancelled.body);
    assert_eq!(wait_terminal(&api, &restart).await["status"]["phase"], "Cancelled");
    // Still draining, so observed running: the cancelled Restart's intent is not kept
    // as a promise; wanted follows what is observed now.
    assert_eq!(api.get("/apis/hive.dev/v1/agents/stubborn").await.body["spec"]["wanted"], "Up");
    // A running Job cannot be cancelled.
    let refused =
        api.send("POST", &format!("/apis/hive.dev/v1/jobs/{stop}/cancel"), "application/json", None).await;
    assert_eq!(refused.code, 409, "{:?}", refused.body);
    let _ = wait_terminal(&api, &stop).await;
    let (_, job) = run_job(&api, "Kill", &["stubborn"]).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_creates_template_jobs() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("delta", &repo, "Up")).await.code, 201);
    wait_power(&api, "delta", "Running").await;
    let job = "apiVersion: hive.dev/v1\nkind: Job\nmetadata:\n  name: stop-delta\nspec:\n  template: Stop\n  agents: [delta]\n";
    let out = crate::harness::ok(d.kubectl_stdin(&["create", "-f", "-"], Some(job)));
    assert_eq!(out.trim(), "job.hive.dev/stop-delta created");
    let done = wait_terminal(&api, "stop-delta").await;
    assert_eq!(done["status"]["phase"], "Done", "{}", done["status"]);
    assert_eq!(done["spec"]["agents"], json!(["delta"]));
    wait_power(&api, "delta", "Stopped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_stored_without_the_scheduler_does_not_block_its_agent() {
    // A Job stored through server-side apply for an agent that does not exist yet: the
    // intake takes it and its Reconcile fails; it must not hold up the agent created
    // next.
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let job = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "inert"},
                     "spec": {"template": "Reconcile", "nodes": [{"id": "r", "kind": "Reconcile", "agent": "epsilon"}]}});
    let stored = api
        .send(
            "PATCH",
            "/apis/hive.dev/v1/jobs/inert?fieldManager=kubectl",
            "application/apply-patch+yaml",
            Some(job.to_string()),
        )
        .await;
    assert_eq!(stored.code, 201, "{:?}", stored.body);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("epsilon", &repo, "Up")).await.code, 201);
    wait_power(&api, "epsilon", "Running").await;
}

#[tokio::test]
async fn malformed_template_jobs_name_the_field_and_write_nothing() {
    let d = Daemon::start();
    let api = d.client();
    let cases = [
        (json!({"spec": {"template": "Sideways", "agents": ["a"]}}), 422, "spec.template"),
        (json!({"spec": {"template": "Stop", "agents": "a"}}), 422, "spec.agents"),
        (
            json!({"metadata": {"name": "Bad_Name"}, "spec": {"template": "Stop", "agents": ["a"]}}),
            422,
            "metadata.name",
        ),
        (json!({"spec": {"template": "Stop", "agents": []}}), 422, "spec.agents"),
        (json!({"spec": {"template": "Stop", "agents": ["a"], "bogus": 1}}), 400, "spec.bogus"),
    ];
    for (body, code, field) in cases {
        let mut body = body;
        body["apiVersion"] = json!("hive.dev/v1");
        body["kind"] = json!("Job");
        let reply = api.post("/apis/hive.dev/v1/jobs?fieldValidation=Strict", &body).await;
        assert_eq!(reply.code, code, "{body}: {:?}", reply.body);
        assert!(reply.body.to_string().contains(field), "{body}: {:?}", reply.body);
    }
    assert!(api.get("/apis/hive.dev/v1/jobs").await.body["items"].as_array().unwrap().is_empty());
}

// Regression (issue 29): a node's params were a JSON map read by string, so a misspelt
// key silently took its default (`relok: false` built with a relock) and any param was
// stored on any kind. Now each kind's params parse into its typed action at admission:
// an unknown key, a wrong type, a param on a kind that takes none or a missing required
// one is a 422 naming `spec.nodes[i].params.<key>`, by every write path, and nothing is
// stored.
#[tokio::test]
async fn bad_node_params_name_their_field_and_write_nothing() {
    let d = Daemon::start();
    let api = d.client();
    let job = |nodes: Value| {
        json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "bad-params"},
               "spec": {"template": "Rebuild", "nodes": nodes}})
    };
    let cases = [
        (
            json!([{"id": "p", "kind": "Prebuild", "agent": "a", "params": {"relok": false}}]),
            "spec.nodes[0].params.relok",
            "FieldValueNotSupported",
            "Unsupported value: \"relok\" (Prebuild takes: relock)",
        ),
        (
            json!([{"id": "w", "kind": "SetWanted", "agent": "a", "params": {"wanted": "Up"}},
                   {"id": "p", "kind": "Prebuild", "agent": "a", "params": {"relock": "yes"}, "deps": [{"node": "w"}]}]),
            "spec.nodes[1].params.relock",
            "FieldValueInvalid",
            "Invalid value: \"yes\": must be true or false",
        ),
        (
            json!([{"id": "s", "kind": "Swap", "agent": "a", "params": {"rev": "abc"}}]),
            "spec.nodes[0].params.rev",
            "FieldValueNotSupported",
            "Unsupported value: \"rev\" (Swap takes no params)",
        ),
        (
            json!([{"id": "d", "kind": "ApprovalDeploy", "agent": "a"}]),
            "spec.nodes[0].params.approval",
            "FieldValueRequired",
            "Required value: an ApprovalDeploy node names the Approval it deploys",
        ),
    ];
    for (nodes, field, reason, message) in cases {
        for path in ["/apis/hive.dev/v1/jobs?dryRun=All", "/apis/hive.dev/v1/jobs"] {
            let reply = api.post(path, &job(nodes.clone())).await;
            assert_eq!(reply.code, 422, "{path} {nodes}: {:?}", reply.body);
            let causes = reply.body["details"]["causes"].as_array().cloned().unwrap_or_default();
            assert_eq!(causes.len(), 1, "{nodes}: {causes:?}");
            assert_eq!(causes[0]["field"], field, "{nodes}: {causes:?}");
            assert_eq!(causes[0]["reason"], reason, "{nodes}: {causes:?}");
            assert_eq!(causes[0]["message"], message, "{nodes}: {causes:?}");
        }
    }
    // Every other write path admits a Job the same way.
    let yaml = "apiVersion: hive.dev/v1\nkind: Job\nmetadata:\n  name: relok\nspec:\n  template: Rebuild\n  nodes:\n    - {id: p, kind: Prebuild, agent: a, params: {relok: false}}\n";
    let file = d.dir.join("relok.yaml");
    std::fs::write(&file, yaml).unwrap();
    let err = fails(d.hive(&["apply", "-f", &file.display().to_string()]));
    assert!(err.contains("spec.nodes[0].params.relok"), "{err}");
    let err = fails(d.kubectl(&["apply", "--server-side", "-f", &file.display().to_string()]));
    assert!(err.contains("spec.nodes[0].params.relok"), "{err}");
    let after = api.get("/apis/hive.dev/v1/jobs").await;
    assert_eq!(after.body["items"].as_array().map(Vec::len), Some(0), "nothing written: {}", after.body);
}

fn ring_job(name: &str, len: usize) -> Value {
    let nodes: Vec<Value> = (0..len)
        .map(|i| {
            json!({"id": format!("n{i}"), "kind": "MetaLock", "params": {"inputs": ["hive"]},
                   "deps": [{"node": format!("n{}", (i + 1) % len)}]})
        })
        .collect();
    json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"template": "MetaUpdate", "nodes": nodes}})
}

// Regression (issue 14, item 1): the cyclic-DAG refusal named the whole cycle on each of
// its edges — 14 MB for a 1,000-node ring, and a 5,000-node ring (0.33 MB, even with
// dryRun) drove the daemon to 23.6 GB. Now one bounded cause per cycle, a documented
// node limit, and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cyclic_dag_of_thousands_of_nodes_is_one_small_refusal() {
    let d = Daemon::start();
    let api = d.client();
    for path in ["/apis/hive.dev/v1/jobs?dryRun=All", "/apis/hive.dev/v1/jobs"] {
        let reply = api.post(path, &ring_job("ring", 5_000)).await;
        assert_eq!(reply.code, 422, "{path}");
        let text = reply.body.to_string();
        assert!(text.len() < 4_096, "{path}: a {}-byte refusal", text.len());
        let causes = reply.body["details"]["causes"].as_array().unwrap();
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0]["field"], "spec.nodes[0].deps[0]");
        assert!(causes[0]["message"].as_str().unwrap().contains("(5000 nodes in all) -> n0"), "{causes:?}");
    }
    let over = api.post("/apis/hive.dev/v1/jobs", &ring_job("big", 5_001)).await;
    assert_eq!(over.code, 422);
    let causes = over.body["details"]["causes"].as_array().unwrap();
    assert_eq!(causes.len(), 1, "{causes:?}");
    assert_eq!(causes[0]["field"], "spec.nodes");
    assert_eq!(causes[0]["reason"], "FieldValueTooMany");
    // Nothing was stored, and the daemon answers at once.
    let after = api.get("/apis/hive.dev/v1/jobs").await;
    assert_eq!(after.body["items"].as_array().map(Vec::len), Some(0), "nothing written: {}", after.body);
    assert_eq!(api.get("/version").await.code, 200);
}

/// An agent whose main process does not handle the graceful kick: a Stop's Drain waits
/// its whole `gracefulStopSeconds`, so the Stop Job stays Running until the test ends it.
const NO_HARNESS_SH: &str = "trap 'exit 0' TERM\necho up\nwhile true; do sleep 0.1; done\n";

/// The stored Jobs of `template`.
async fn stored(api: &Api, template: &str) -> Vec<Value> {
    let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
    jobs["items"].as_array().unwrap().iter().filter(|j| j["spec"]["template"] == template).cloned().collect()
}

// Regression (issue 26, item 5): the history of 5 terminal Jobs per template was kept in
// memory only, so every restart began it empty — 6 Start Jobs stored after one restart,
// and Interrupted Jobs (never in any run's memory) kept forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_terminal_jobs_per_template_are_kept_across_restarts_interrupted_ones_included() {
    let mut d = Daemon::start();
    let repo = config_repo(&d.dir);
    std::fs::write(repo.join("run.sh"), NO_HARNESS_SH).unwrap();
    git(&repo, &["commit", "--quiet", "-am", "no harness"]);
    git(&repo, &["tag", "v3"]);
    let mut alpha = agent("alpha", &repo, "Offline");
    alpha["spec"]["config"]["rev"] = json!("v3");
    alpha["spec"]["runtime"]["gracefulStopSeconds"] = json!(3600);
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &alpha).await.code, 201);
    let (_, spawn) = run_job(&api, "Spawn", &["alpha"]).await;
    assert_eq!(spawn["status"]["phase"], "Done", "{}", spawn["status"]);

    // Six daemon runs, each with one Start that finishes and one Stop left draining when
    // the daemon is killed (so the next run marks it Interrupted).
    let mut last_stop = String::new();
    for _ in 0..6 {
        let api = d.client();
        let (_, start) = run_job(&api, "Start", &["alpha"]).await;
        assert_eq!(start["status"]["phase"], "Done", "{}", start["status"]);
        wait_power(&api, "alpha", "Running").await;
        let out = crate::harness::ok(d.hive(&["stop", "alpha", "--no-wait"]));
        last_stop = out.split_whitespace().next().unwrap().trim_start_matches("job.hive.dev/").to_string();
        crate::harness::eventually("the Stop draining", || async {
            let job = api.get(&format!("/apis/hive.dev/v1/jobs/{last_stop}")).await.body;
            let nodes = job["status"]["nodes"].as_array()?.clone();
            nodes.iter().any(|n| n["id"] == "alpha/drain" && n["state"] == "Running").then_some(())
        })
        .await;
        d.kill9();
        d.restart();
    }
    // One more Start in the last run pushes out the oldest Start kept. The mirror writes
    // the scheduler's batches in order (the boot's removals first of all, a settled
    // Job's status before the removals it caused), so once a Job of a later batch — a
    // Kill, of another template — is stored Done, the store is quiescent.
    let api = d.client();
    let (newest, start) = run_job(&api, "Start", &["alpha"]).await;
    assert_eq!(start["status"]["phase"], "Done", "{}", start["status"]);
    let (_, kill) = run_job(&api, "Kill", &["alpha"]).await;
    assert_eq!(kill["status"]["phase"], "Done", "{}", kill["status"]);

    let starts = stored(&api, "Start").await;
    let stops = stored(&api, "Stop").await;
    let names = |jobs: &[Value]| -> Vec<String> {
        jobs.iter().map(|j| format!("{} {}", j["metadata"]["name"], j["status"]["phase"])).collect()
    };
    assert_eq!(starts.len(), 5, "7 Starts ran, the 5 newest are kept: {:?}", names(&starts));
    assert!(starts.iter().any(|j| j["metadata"]["name"] == newest.as_str()), "{:?}", names(&starts));
    assert_eq!(stops.len(), 5, "6 Stops were interrupted, the 5 newest are kept: {:?}", names(&stops));
    assert!(stops.iter().all(|j| j["status"]["phase"] == "Interrupted"), "{:?}", names(&stops));
    assert!(stops.iter().any(|j| j["metadata"]["name"] == last_stop.as_str()), "{:?}", names(&stops));
}

/// A Job of `len` SetWanted nodes of agent `agent`, each after the previous one.
fn chain_job(name: &str, agent: &str, len: usize) -> Value {
    let nodes: Vec<Value> = (0..len)
        .map(|i| {
            let mut node = json!({"id": format!("n{i}"), "kind": "SetWanted", "agent": agent,
                                  "params": {"wanted": "Offline"}});
            if i > 0 {
                node["deps"] = json!([{"node": format!("n{}", i - 1)}]);
            }
            node
        })
        .collect();
    json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"template": "Reconcile", "nodes": nodes}})
}

// Regression (issue 28, item 4): the Jobs mirror rewrote a Job's whole status once per
// scheduler turn, so a 5,000-node chain wrote 10.6 GB (1.2 MB statuses) and took
// 387 s. Now a Job's node changes are written at most once per interval that grows with
// its size (`jobs::mirror::WRITE_RATE`), and at once only its first status, a new phase
// and its settling: the number of writes is bounded by the chain's running time over
// that interval, not by its length (this 1,000-node chain wrote ~1,000 statuses before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_job_rewrites_its_status_a_bounded_number_of_times() {
    use hive::jobs::mirror::{MAX_STALENESS, WRITE_RATE};
    const NODES: usize = 1_000;
    let d = Daemon::start();
    let api = d.client();
    let repo = config_repo(&d.dir);
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("a", &repo, "Offline")).await.code, 201);
    let mut watch = api.watch("/apis/hive.dev/v1/jobs?watch=true&fieldSelector=metadata.name%3Dchain").await;
    let started = std::time::Instant::now();
    assert_eq!(api.post("/apis/hive.dev/v1/jobs", &chain_job("chain", "a", NODES)).await.code, 201);

    // The first event is the Job as created (spec only): the smallest it will be, so
    // its size gives the shortest interval between two writes of node changes.
    let added = watch.next(Duration::from_secs(60)).await.expect("the Job's creation");
    assert_eq!(added["type"], "ADDED");
    let shortest =
        (added["object"].to_string().len() as f64 / WRITE_RATE as f64).min(MAX_STALENESS.as_secs_f64());
    // At once: the claim, the first status, a new phase (Running, then Done) and
    // settling, with room for one more; the rest one interval apart at least.
    let bound = |elapsed: f64| 6 + (elapsed / shortest) as usize;
    let mut writes = 0;
    let last = loop {
        let event = watch.next(Duration::from_secs(120)).await.expect("the chain goes on");
        writes += 1;
        let elapsed = started.elapsed().as_secs_f64();
        assert!(
            writes <= bound(elapsed),
            "{writes} writes of a {NODES}-node chain's status in {elapsed:.1} s (at most {} at one per {shortest:.2} s)",
            bound(elapsed)
        );
        if event["object"]["status"]["finishedAt"].is_string() {
            break event["object"].clone();
        }
    };
    // Every node's state at the end, in the stored object as kubectl reads it.
    assert_eq!(last["status"]["phase"], "Done", "{}", last["status"]["message"]);
    let stored = api.get("/apis/hive.dev/v1/jobs/chain").await.body;
    let nodes = stored["status"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), NODES);
    assert!(nodes.iter().all(|n| n["state"] == "Done"), "{}", stored["status"]);
}
