//! Jobs as their users expect them (issue 33), each through the real daemon with real
//! process agents: a deadline that stops a build and still converges the agent, a
//! priority that overtakes a queued sweep, retries with backoff, history that ages out.

use serde_json::{json, Value};

use crate::agents::{agent, config_repo, wait_power, wait_terminal};
use crate::harness::{eventually, Api, Daemon};

const JOBS: &str = "/apis/hive.dev/v1/jobs";

/// Posts a Job with `spec`; returns its name.
async fn post_job(api: &Api, spec: Value) -> String {
    let reply = api.post(JOBS, &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"generateName": "job-"}, "spec": spec})).await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    reply.body["metadata"]["name"].as_str().unwrap().to_string()
}

/// Creates agent `name` from `repo` (built and stopped: wanted Offline) through a Spawn
/// Job, then gives it the build command `build`.
async fn spawned(api: &Api, repo: &std::path::Path, name: &str, build: &[&str]) {
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent(name, repo, "Offline")).await.code, 201);
    let spawn = post_job(api, json!({"template": "Spawn", "agents": [name]})).await;
    assert_eq!(wait_terminal(api, &spawn).await["status"]["phase"], "Done");
    let patch = json!({"spec": {"runtime": {"process": {"build": build}}}});
    let reply =
        api.patch(&format!("/apis/hive.dev/v1/agents/{name}"), "application/merge-patch+json", &patch).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
}

fn node<'a>(job: &'a Value, id: &str) -> &'a Value {
    job["status"]["nodes"].as_array().unwrap().iter().find(|n| n["id"] == id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_deadline_stops_its_build_fails_and_still_converges_its_agent() {
    let d = Daemon::start();
    let repo = config_repo(&d.dir);
    let api = d.client();
    let pid_file = d.dir.join("build.pid");
    // The pid is the build's own child: the whole build is stopped, not only its shell.
    let script = format!("sleep 300 & echo $! > {}; wait", pid_file.display());
    spawned(&api, &repo, "slow", &["sh", "-c", &script]).await;
    assert_ne!(api.get("/apis/hive.dev/v1/agents/slow").await.body["status"]["power"], "Running");

    // Start it through a build that outlasts the Job's 3 s deadline.
    let name = post_job(
        &api,
        json!({"template": "Start", "activeDeadlineSeconds": 3, "nodes": [
            {"id": "set-wanted", "kind": "SetWanted", "agent": "slow", "params": {"wanted": "Up"}},
            {"id": "prebuild", "kind": "Prebuild", "agent": "slow", "deps": [{"node": "set-wanted"}]},
            {"id": "swap", "kind": "Swap", "agent": "slow", "deps": [{"node": "prebuild"}]},
            {"id": "reconcile", "kind": "Reconcile", "agent": "slow", "deps": [{"node": "swap"}]}]}),
    )
    .await;
    let pid: u32 = eventually("the build to start", || async {
        std::fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse().ok())
    })
    .await;
    let job = wait_terminal(&api, &name).await;
    let status = &job["status"];
    assert_eq!(
        (&status["phase"], &status["reason"]),
        (&json!("Failed"), &json!("DeadlineExceeded")),
        "{status}"
    );
    assert!(status["message"].as_str().unwrap().contains("deadline of 3s"), "{status}");
    let prebuild = node(&job, "prebuild");
    assert_eq!(prebuild["state"], "Failed", "{status}");
    assert_eq!(prebuild["error"], "stopped: the Job ran past its deadline");
    assert_eq!(node(&job, "swap")["state"], "Cancelled", "{status}");
    assert_eq!(node(&job, "reconcile")["state"], "Done", "the tail Reconcile ran: {status}");
    // The build subprocess was killed, and the agent converged to its intent on the
    // generation it had.
    eventually("the build process to be gone", || async {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    })
    .await;
    wait_power(&api, "slow", "Running").await;
    // A bad deadline is refused, naming the field, and nothing is stored.
    let before = api.get(JOBS).await.body["items"].as_array().unwrap().len();
    let reply = api
        .post(
            JOBS,
            &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "bad"},
                            "spec": {"template": "Restart", "agents": ["slow"], "activeDeadlineSeconds": 0}}),
        )
        .await;
    assert_eq!(reply.code, 422, "{:?}", reply.body);
    assert!(
        reply.body["message"].as_str().unwrap().contains("spec.activeDeadlineSeconds"),
        "{:?}",
        reply.body
    );
    let reply = api
        .post(
            JOBS,
            &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "bad"},
                            "spec": {"template": "Restart", "agents": ["slow"], "priority": 5000}}),
        )
        .await;
    assert_eq!(reply.code, 422, "{:?}", reply.body);
    assert!(reply.body["message"].as_str().unwrap().contains("spec.priority"), "{:?}", reply.body);
    assert_eq!(api.get(JOBS).await.body["items"].as_array().unwrap().len(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_at_priority_10_overtakes_a_queued_sweep() {
    let d = Daemon::start();
    let repo = config_repo(&d.dir);
    let api = d.client();
    let release = d.dir.join("release");
    let script = format!("while [ ! -f {} ]; do sleep 0.1; done", release.display());
    spawned(&api, &repo, "x", &["sh", "-c", &script]).await;

    // A Job holds x's lease while its build waits for the test.
    let holder = post_job(
        &api,
        json!({"template": "Rebuild", "nodes": [
            {"id": "stop", "kind": "StopForUpdate", "agent": "x"},
            {"id": "prebuild", "kind": "Prebuild", "agent": "x", "deps": [{"node": "stop"}]}]}),
    )
    .await;
    eventually("the holder's build to run", || async {
        let job = api.get(&format!("{JOBS}/{holder}")).await.body;
        let nodes = job["status"]["nodes"].as_array()?.clone();
        nodes.iter().any(|n| n["id"] == "prebuild" && n["state"] == "Running").then_some(())
    })
    .await;
    // The sweep asks for x first, at the boot sweep's priority; then an operator's
    // restart at priority 10.
    let sweep = post_job(
        &api,
        json!({"template": "BootSweep", "priority": -10, "nodes": [{"id": "reconcile", "kind": "Reconcile", "agent": "x"}]}),
    )
    .await;
    let out = crate::harness::ok(d.hive(&["restart", "x", "--priority", "10", "--no-wait"]));
    let restart = out.split_whitespace().next().unwrap().trim_start_matches("job.hive.dev/").to_string();
    let table = crate::harness::ok(d.hive(&["get", "jobs"]));
    let header = table.lines().next().unwrap();
    assert!(header.contains("PRIORITY"), "{table}");
    let priority_of = |job: &str| {
        let at = header.find("PRIORITY").unwrap();
        let row = table.lines().find(|l| l.starts_with(job)).unwrap();
        row[at..].split_whitespace().next().unwrap().to_string()
    };
    assert_eq!(
        (priority_of(&restart), priority_of(&sweep)),
        ("10".to_string(), "-10".to_string()),
        "{table}"
    );

    std::fs::write(&release, "").unwrap();
    let restart = wait_terminal(&api, &restart).await;
    let sweep = wait_terminal(&api, &sweep).await;
    assert_eq!(restart["status"]["phase"], "Done", "{}", restart["status"]);
    assert_eq!(sweep["status"]["phase"], "Done", "{}", sweep["status"]);
    // The restart took x's lease first and started it; the sweep's Reconcile, which
    // asked first, ran after and found it running.
    let restarted = node(&restart, "x/reconcile")["step"].as_str().unwrap_or_default().to_string();
    assert!(restarted.starts_with("started"), "{}", restart["status"]);
    assert_eq!(node(&sweep, "reconcile")["step"], "already running", "{}", sweep["status"]);
    wait_power(&api, "x", "Running").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_that_fails_twice_succeeds_on_its_third_try_with_limit_3() {
    let d = Daemon::start_with(&["--build-retries=2"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let count = d.dir.join("tries");
    // Fails on its first two runs, succeeds on the third.
    let script = format!(
        "n=$(( $(cat {0} 2>/dev/null || echo 0) + 1 )); echo $n > {0}; echo try $n; [ $n -ge 3 ]",
        count.display()
    );
    spawned(&api, &repo, "flaky", &["sh", "-c", &script]).await;
    let steady = "true";
    spawned(&api, &repo, "steady", &["sh", "-c", steady]).await;

    // A template Job with a Job-wide retry: its Prebuild takes it.
    let name = post_job(
        &api,
        json!({"template": "Rebuild", "agents": ["flaky"], "retry": {"limit": 3, "backoff": {"initial": "1s", "max": "2s"}}}),
    )
    .await;
    let job = wait_terminal(&api, &name).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    let prebuild = node(&job, "flaky/prebuild");
    assert_eq!(prebuild["attempt"], 3, "{}", job["status"]);
    assert_eq!(std::fs::read_to_string(&count).unwrap().trim(), "3");
    // Each try is in the node's log, and each retry is an Event on the Job.
    let log = api.get(&format!("{JOBS}/{name}/log?node=flaky%2Fprebuild")).await.body;
    let log = log.as_str().unwrap_or_default();
    assert!(log.contains("hive: attempt 1 of 4 failed") && log.contains("hive: attempt 3 of 4"), "{log}");
    let events = eventually("two Retrying events", || async {
        let events = api.get("/api/v1/events").await.body;
        let retries: Vec<String> = events["items"]
            .as_array()?
            .iter()
            .filter(|e| e["involvedObject"]["name"] == name.as_str() && e["reason"] == "Retrying")
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect();
        (retries.len() == 2).then_some(retries)
    })
    .await;
    assert!(events.iter().any(|m| m.starts_with("node flaky/prebuild: attempt 3 of 4")), "{events:?}");
    // The surfaces: attempts in `hive get jobs`, the retry and the deadline in `describe`.
    let table = crate::harness::ok(d.hive(&["get", "jobs", &name]));
    let header = table.lines().next().unwrap();
    let at = header.find("ATTEMPTS").unwrap_or_else(|| panic!("{table}"));
    assert_eq!(table.lines().nth(1).unwrap()[at..].split_whitespace().next(), Some("3"), "{table}");
    let described = crate::harness::ok(d.hive(&["describe", &format!("job/{name}")]));
    assert!(described.contains("Retry") && described.contains("Attempt"), "{described}");

    // `--build-retries` gives a template Job's builds retries of their own.
    let plain = post_job(&api, json!({"template": "Rebuild", "agents": ["steady"]})).await;
    let job = wait_terminal(&api, &plain).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    let prebuild = job["spec"]["nodes"].as_array().unwrap().iter().find(|n| n["kind"] == "Prebuild").unwrap();
    assert_eq!(prebuild["retry"], json!({"limit": 2}), "{}", job["spec"]);
    let swap = job["spec"]["nodes"].as_array().unwrap().iter().find(|n| n["kind"] == "Swap").unwrap();
    assert!(swap.get("retry").is_none(), "{}", job["spec"]);

    // A retry on a node that may have taken effect is refused, naming it; nothing stored.
    let before = api.get(JOBS).await.body["items"].as_array().unwrap().len();
    let reply = api
        .post(
            JOBS,
            &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "bad-retry"},
                            "spec": {"template": "Rebuild", "nodes": [
                                {"id": "swap", "kind": "Swap", "agent": "steady", "retry": {"limit": 1}}]}}),
        )
        .await;
    assert_eq!(reply.code, 422, "{:?}", reply.body);
    assert!(reply.body["message"].as_str().unwrap().contains("spec.nodes[0].retry"), "{:?}", reply.body);
    assert_eq!(api.get(JOBS).await.body["items"].as_array().unwrap().len(), before);
}

/// Issue 33, item 4: a finished Job is deleted `spec.ttlSecondsAfterFinished` seconds
/// after it finished, one without a TTL of its own `--job-history-max-age` after, and
/// every watcher sees it go; a Job whose TTL is longer than the max age stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_age_out_by_their_ttl_or_the_daemons_max_age() {
    let d = Daemon::start_with(&["--agent-controller=false", "--job-history-max-age", "3s"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("x", &repo, "Offline")).await.code, 201);
    let rv = api.get(JOBS).await.body["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    let mut watch = api.watch(&format!("{JOBS}?watch=true&resourceVersion={rv}")).await;
    let reconcile = json!([{"id": "reconcile", "kind": "Reconcile", "agent": "x"}]);

    // Kept an hour, longer than the max age.
    let kept =
        post_job(&api, json!({"template": "Reconcile", "ttlSecondsAfterFinished": 3600, "nodes": reconcile}))
            .await;
    assert_eq!(wait_terminal(&api, &kept).await["status"]["phase"], "Done");
    // A template Job keeps its TTL through the submit layer's expansion.
    let reply = api
        .post(
            JOBS,
            &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"generateName": "stop-"},
                            "spec": {"template": "Stop", "agents": ["x"], "ttlSecondsAfterFinished": 1}}),
        )
        .await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    assert_eq!(reply.body["spec"]["ttlSecondsAfterFinished"], 1, "{}", reply.body["spec"]);
    let short = reply.body["metadata"]["name"].as_str().unwrap().to_string();
    // No TTL of its own: the max age. It finished after `kept`, so were `kept` aged by the
    // max age too, it would go first.
    let aged = post_job(&api, json!({"template": "Reconcile", "nodes": reconcile})).await;

    let mut gone: Vec<Value> = Vec::new();
    while !(gone.iter().any(|j| j["metadata"]["name"] == short.as_str())
        && gone.iter().any(|j| j["metadata"]["name"] == aged.as_str()))
    {
        let event = watch.next(std::time::Duration::from_secs(60)).await.expect("a watch event");
        if event["type"] == "DELETED" {
            gone.push(event["object"].clone());
        }
    }
    let names: Vec<&str> = gone.iter().filter_map(|j| j["metadata"]["name"].as_str()).collect();
    assert!(!names.contains(&kept.as_str()), "the Job kept an hour went: {names:?}");
    for job in &gone {
        // Deleted only once it had finished, with its last state on the event.
        assert!(job["status"]["finishedAt"].is_string(), "{job}");
        assert_eq!(job["status"]["phase"], "Done", "{job}");
    }
    assert_eq!(api.get(&format!("{JOBS}/{short}")).await.code, 404);
    assert_eq!(api.get(&format!("{JOBS}/{aged}")).await.code, 404);
    let listed = api.get(JOBS).await.body;
    let listed: Vec<&str> =
        listed["items"].as_array().unwrap().iter().filter_map(|j| j["metadata"]["name"].as_str()).collect();
    assert!(listed.contains(&kept.as_str()) && !listed.contains(&short.as_str()), "{listed:?}");
    let described = crate::harness::ok(d.hive(&["describe", &format!("job/{kept}")]));
    let expires =
        described.lines().find(|l| l.starts_with("Expires:")).unwrap_or_else(|| panic!("{described}"));
    assert!(expires.contains("3600s after it finished"), "{expires}");

    // A TTL out of bounds is refused, naming the field, and nothing is stored.
    let before = api.get(JOBS).await.body["items"].as_array().unwrap().len();
    for spec in [
        json!({"template": "Reconcile", "ttlSecondsAfterFinished": -1, "nodes": reconcile}),
        json!({"template": "Restart", "agents": ["x"], "ttlSecondsAfterFinished": 40_000_000}),
    ] {
        let reply =
            api.post(JOBS, &json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "bad"}, "spec": spec})).await;
        assert_eq!(reply.code, 422, "{:?}", reply.body);
        let message = reply.body["message"].as_str().unwrap();
        assert!(message.contains("spec.ttlSecondsAfterFinished"), "{message}");
    }
    assert_eq!(api.get(JOBS).await.body["items"].as_array().unwrap().len(), before);
}
