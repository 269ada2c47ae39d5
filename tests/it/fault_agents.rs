//! Agent faults through the real daemon (issue 14): a graceful stop whose SIGUSR1 kick
//! cannot kill an agent that does not handle it (item 6), and a spawn whose build fails
//! does not leave `Building` True (item 8).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::agents::{agent, config_repo, git, wait_power, wait_terminal};
use crate::harness::{eventually, ok, Api, Daemon};

/// An agent with no harness at all: no trap for SIGUSR1 (whose default action ends a
/// process) nor for SIGTERM.
const PLAIN_SH: &str = "echo \"plain agent up\"\nwhile true; do sleep 0.1; done\n";

/// A config repository whose tag v1 is [`PLAIN_SH`].
fn plain_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("plain-repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "--quiet", "-b", "main"]);
    std::fs::write(repo.join("run.sh"), PLAIN_SH).unwrap();
    git(&repo, &["add", "run.sh"]);
    git(&repo, &["commit", "--quiet", "-m", "v1"]);
    git(&repo, &["tag", "v1"]);
    repo
}

/// The agent's Events, as `(reason, message)`.
async fn events_of(api: &Api, agent: &str) -> Vec<(String, String)> {
    let events = api
        .get(&format!(
            "/api/v1/events?fieldSelector=involvedObject.name%3D{agent}%2CinvolvedObject.kind%3DAgent"
        ))
        .await
        .body;
    let items = events["items"].as_array().cloned().unwrap_or_default();
    items
        .iter()
        .map(|e| (e["reason"].as_str().unwrap_or("").into(), e["message"].as_str().unwrap_or("").into()))
        .collect()
}

/// The newest Job of `template` whose `spec.agents` names `agent`.
async fn job_of(api: &Api, template: &str, agent: &str) -> Option<Value> {
    crate::agent_contract::jobs_of(api, agent).await.into_iter().rfind(|j| j["spec"]["template"] == template)
}

/// The step label a Job's node `id` ended on.
fn step(job: &Value, id: &str) -> String {
    let nodes = job["status"]["nodes"].as_array().cloned().unwrap_or_default();
    let node = nodes.iter().find(|n| n["id"] == id);
    node.and_then(|n| n["step"].as_str())
        .unwrap_or_else(|| panic!("no step of {id}: {}", job["status"]))
        .into()
}

fn condition(agent: &Value, type_: &str) -> Option<Value> {
    agent["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_).cloned()
}

/// Issue 14, item 6: the graceful fence's SIGUSR1 killed any agent that does not handle
/// it ("stopped (killed by signal 10)") before its stop ever sent SIGTERM. Now the kick
/// is withheld from such an agent: the fence stays set for the drain bound
/// (`gracefulStopSeconds`), then the stop's SIGTERM ends it. An agent whose harness
/// traps SIGUSR1, stopped by the same Job, is still kicked and drains at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_ends_an_agent_that_ignores_sigusr1_by_sigterm_not_by_the_kick() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let api = d.client();
    let mut plain = agent("plain", &plain_repo(&d.dir), "Up");
    plain["spec"]["runtime"]["gracefulStopSeconds"] = json!(2);
    let honours = agent("honours", &config_repo(&d.dir), "Up");
    for body in [&plain, &honours] {
        assert_eq!(api.post("/apis/hive.dev/v1/agents", body).await.code, 201);
    }
    wait_power(&api, "plain", "Running").await;
    wait_power(&api, "honours", "Running").await;

    // One graceful Stop for both, as `hive stop` submits it.
    ok(d.hive(&["stop", "plain", "honours"]));
    let stop = job_of(&api, "Stop", "plain").await.expect("the Stop Job");
    let stop = wait_terminal(&api, stop["metadata"]["name"].as_str().unwrap()).await;
    assert_eq!(stop["status"]["phase"], "Done", "{}", stop["status"]);

    // How the plain agent ended, as recorded: by the stop's SIGTERM, not by the kick.
    let stopped = eventually("the Stopped event of plain", || async {
        events_of(&api, "plain").await.into_iter().find(|(reason, _)| reason == "Stopped")
    })
    .await;
    let events = events_of(&api, "plain").await;
    assert!(
        events.iter().all(|(_, message)| !message.contains("signal 10")),
        "the kick killed the agent: {events:?}"
    );
    assert_eq!(stopped.1, "stopped (killed by signal 15)", "{events:?}");
    // The Job says why: no kick for an agent that does not handle SIGUSR1, a drain that
    // ran to its bound, then the stop.
    let signal = step(&stop, "plain/signal");
    assert!(signal.contains("SIGUSR1 withheld") && signal.contains("does not handle it"), "{signal}");
    assert_eq!(step(&stop, "plain/drain"), "drain timed out; stopping anyway");
    assert_eq!(step(&stop, "plain/reconcile"), "stopped");

    // The agent with a harness is kicked as before, clears the fence and exits on TERM.
    assert_eq!(step(&stop, "honours/signal"), "fence set; harness kicked with SIGUSR1");
    assert_eq!(step(&stop, "honours/drain"), "drained");
    let stopped = eventually("the Stopped event of honours", || async {
        events_of(&api, "honours").await.into_iter().find(|(reason, _)| reason == "Stopped")
    })
    .await;
    assert_eq!(stopped.1, "stopped (exit code 0)");
    wait_power(&api, "plain", "Stopped").await;
    wait_power(&api, "honours", "Stopped").await;
}

/// Issue 14, item 8: after a spawn whose build failed, `Building` stayed True (reason
/// `Spawn`, "Job … is building it") forever, though `Converged` said the spawn failed.
/// Now `Building` is False with reason `BuildFailed`, and the three conditions name the
/// Job and say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_spawn_build_leaves_building_false_and_says_why() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let api = d.client();
    let mut broken = agent("broken", &config_repo(&d.dir), "Up");
    // Long enough for the controller to see the spawn under way.
    broken["spec"]["runtime"]["process"]["build"] =
        json!(["sh", "-c", "sleep 1; echo the build is broken >&2; exit 1"]);
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &broken).await.code, 201);
    let get = || async { api.get("/apis/hive.dev/v1/agents/broken").await.body };

    let building = eventually("Building True while the spawn runs", || async {
        condition(&get().await, "Building").filter(|c| c["status"] == "True")
    })
    .await;
    assert_eq!(building["reason"], "Spawn", "{building}");
    let spawn = job_of(&api, "Spawn", "broken").await.expect("the Spawn Job");
    let job_name = spawn["metadata"]["name"].as_str().unwrap().to_string();
    let spawn = wait_terminal(&api, &job_name).await;
    assert_eq!(spawn["status"]["phase"], "Failed", "{}", spawn["status"]);

    let agent = eventually("Converged False after the failed spawn", || async {
        let agent = get().await;
        let converged = condition(&agent, "Converged")?;
        (converged["reason"] == "BuildFailed").then_some(agent)
    })
    .await;
    let building = condition(&agent, "Building").unwrap();
    assert_eq!(building["status"], "False", "Building after a failed spawn: {building}");
    assert_eq!(building["reason"], "BuildFailed", "{building}");
    let message = building["message"].as_str().unwrap();
    assert!(message.contains(&job_name) && message.contains("the build is broken"), "{message}");
    for type_ in ["Converged", "Ready"] {
        let c = condition(&agent, type_).unwrap();
        assert_eq!(c["status"], "False", "{c}");
        assert_eq!(c["reason"], "BuildFailed", "{c}");
        let message = c["message"].as_str().unwrap();
        assert!(message.contains(&job_name) && message.contains("the build is broken"), "{type_}: {message}");
    }
    assert_eq!(agent["status"]["phase"], "BuildFailed", "{}", agent["status"]);
}
