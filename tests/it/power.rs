//! The power verbs end to end: `hive stop|start|restart|rebuild` against real agent
//! processes submit one Job, print a progress line per change (plain lines, since
//! stdout is a pipe here), and exit 0 when every DAG is done, 1 otherwise; `hive jobs`,
//! `hive logs` and `hive cancel` read and act on what they left.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{fails, ok, Api, Daemon};

const RUN_SH: &str = r#"trap 'rm -f "$HIVE_FENCE"' USR1
trap 'exit 0' TERM
echo "hello from the power test"
while true; do sleep 0.1; done
"#;

fn git(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=hive", "-c", "user.email=hive@example.com", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A config repository with one tagged commit (v1) of an agent that honours the fence.
fn config_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("power-config");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "--quiet", "-b", "main"]);
    std::fs::write(repo.join("run.sh"), RUN_SH).unwrap();
    git(&repo, &["add", "run.sh"]);
    git(&repo, &["commit", "--quiet", "-m", "v1"]);
    git(&repo, &["tag", "v1"]);
    repo
}

fn agent(name: &str, repo: &Path) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
           "spec": {"wanted": "Up", "config": {"repo": repo.display().to_string(), "rev": "v1"},
                    "runtime": {"type": "process", "gracefulStopSeconds": 5, "process": {"command": ["sh", "run.sh"]}}}})
}

async fn wait_terminal(api: &Api, name: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let job = api.get(&format!("/apis/hive.dev/v1/jobs/{name}")).await.body;
        let phase = job["status"]["phase"].as_str().unwrap_or("Queued");
        if !matches!(phase, "Queued" | "Running") {
            return job;
        }
        assert!(tokio::time::Instant::now() < deadline, "job {name} did not finish: {}", job["status"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_power(api: &Api, agent: &str, power: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let a = api.get(&format!("/apis/hive.dev/v1/agents/{agent}")).await.body;
        if a["status"]["power"] == power {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{agent} never became {power}: {}", a["status"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Plain progress output: no control sequences, and a line only when it changed.
fn check_plain(out: &str) {
    assert!(!out.contains('\x1b') && !out.contains('\r'), "control sequences in plain output: {out:?}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.windows(2).all(|w| w[0] != w[1]), "a line repeated without a change:\n{out}");
}

/// The Job name from the first line, `job.hive.dev/NAME submitted`.
fn submitted(out: &str) -> &str {
    let first = out.lines().next().unwrap_or_default();
    first.strip_prefix("job.hive.dev/").and_then(|r| r.strip_suffix(" submitted")).expect(out)
}

fn last_line(out: &str) -> &str {
    out.lines().last().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_verbs_block_with_progress_and_exit_codes() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    for name in ["alpha", "beta"] {
        assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent(name, &repo)).await.code, 201);
    }
    // The Agent controller spawns them.
    wait_power(&api, "alpha", "Running").await;
    wait_power(&api, "beta", "Running").await;

    // One Job stops both agents gracefully; the last line is the finished DAG.
    let out = ok(d.hive(&["stop", "alpha", "beta", "--reason", "power test"]));
    check_plain(&out);
    let last = last_line(&out);
    assert!(last.starts_with("✓ Stop alpha: set-wanted ✓"), "{out}");
    assert!(last.contains(" | beta: set-wanted ✓") && last.ends_with("reconcile ✓"), "{out}");
    assert!(!last.contains('⟳') && !last.contains('·'), "{out}");
    wait_power(&api, "alpha", "Stopped").await;
    assert_eq!(api.get("/apis/hive.dev/v1/agents/beta").await.body["spec"]["wanted"], "Offline");

    // --all lists the agents first.
    let out = ok(d.hive(&["start", "--all"]));
    check_plain(&out);
    assert!(last_line(&out).starts_with("✓ Start alpha: "), "{out}");
    assert!(last_line(&out).contains(" | beta: "), "{out}");
    wait_power(&api, "alpha", "Running").await;

    let out = ok(d.hive(&["restart", "alpha"]));
    check_plain(&out);
    assert!(last_line(&out).starts_with("✓ Restart alpha: set-wanted ✓"), "{out}");
    let restart = api.get(&format!("/apis/hive.dev/v1/jobs/{}", submitted(&out))).await.body;
    assert_eq!(restart["spec"]["template"], "Restart");
    wait_power(&api, "alpha", "Running").await;

    // --no-wait names the Job and returns.
    let out = ok(d.hive(&["stop", "beta", "--no-wait"]));
    assert_eq!(out.lines().count(), 1, "{out}");
    let name = submitted(&out);
    let job = wait_terminal(&api, name).await;
    assert_eq!(job["spec"]["source"], "Cli");
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);

    // The Jobs are in the table; their logs and the agent's output are readable.
    let table = ok(d.hive(&["jobs"]));
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table.lines().any(|l| l.starts_with(name) && l.contains("Stop") && l.contains("✓ Done")),
        "{table}"
    );
    ok(d.hive(&["logs", &format!("job/{name}")]));
    ok(d.hive(&["logs", &format!("job/{name}"), "--node", "reconcile"]));
    let output = ok(d.hive(&["logs", "agent/alpha", "--tail", "5"]));
    assert!(output.contains("hello from the power test"), "{output}");

    // Refusals: an unknown agent, a finished Job that cannot be cancelled.
    let err = fails(d.hive(&["stop", "ghost"]));
    assert!(err.contains("NotFound") && err.contains("ghost"), "{err}");
    let err = fails(d.hive(&["cancel", name]));
    assert!(err.contains("Conflict"), "{err}");

    // A DAG that fails exits 1 and names the failed node.
    let patch = api
        .patch(
            "/apis/hive.dev/v1/agents/alpha",
            "application/merge-patch+json",
            &json!({"spec": {"config": {"rev": "no-such-rev"}}}),
        )
        .await;
    assert_eq!(patch.code, 200, "{:?}", patch.body);
    let failed = d.hive(&["rebuild", "alpha"]);
    let stdout = String::from_utf8_lossy(&failed.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&failed.stderr).into_owned();
    assert_eq!(failed.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(last_line(&stdout).starts_with("✗ Rebuild alpha: prebuild ✗"), "{stdout}");
    assert!(stderr.contains("failed: node alpha/prebuild: "), "{stderr}");

    // Kill leaves nothing running (the daemon is killed with -9 at the end of the test,
    // and agents run in sessions of their own).
    let out = ok(d.hive(&["kill", "--all"]));
    check_plain(&out);
    assert!(last_line(&out).starts_with("✓ Kill alpha: set-wanted ✓"), "{out}");
    wait_power(&api, "alpha", "Stopped").await;
}
