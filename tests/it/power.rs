//! The power verbs end to end: `hive stop|start|restart|rebuild` against real agent
//! processes submit one Job, print a progress line per change (plain lines, since
//! stdout is a pipe here), and exit 0 when every DAG is done, 1 otherwise; `hive jobs`,
//! `hive logs` and `hive cancel` read and act on what they left.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::agents::{config_repo, wait_power, wait_terminal};
use crate::harness::{fails, hive_bin, ok, Daemon};
use crate::pty;

fn agent(name: &str, repo: &Path) -> Value {
    crate::agents::agent(name, repo, "Up")
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

/// The last progress line of `agent` (`✓ Stop alpha: …`).
fn last_line_of<'a>(out: &'a str, agent: &str) -> &'a str {
    out.lines().rev().find(|l| l.split_whitespace().nth(2) == Some(&format!("{agent}:"))).unwrap_or_default()
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

    // One Job stops both agents gracefully; each agent's last line is its finished part
    // (a line per agent change on a pipe: never both joined into one line).
    let out = ok(d.hive(&["stop", "alpha", "beta", "--reason", "power test"]));
    check_plain(&out);
    assert!(!out.contains(" | "), "{out}");
    for agent in ["alpha", "beta"] {
        let last = last_line_of(&out, agent);
        assert!(last.starts_with(&format!("✓ Stop {agent}: set-wanted ✓")), "{out}");
        assert!(last.ends_with("reconcile ✓") && !last.contains('⟳') && !last.contains('·'), "{out}");
    }
    wait_power(&api, "alpha", "Stopped").await;
    assert_eq!(api.get("/apis/hive.dev/v1/agents/beta").await.body["spec"]["wanted"], "Offline");

    // --all lists the agents first.
    let out = ok(d.hive(&["start", "--all"]));
    check_plain(&out);
    assert!(last_line_of(&out, "alpha").starts_with("✓ Start alpha: "), "{out}");
    assert!(last_line_of(&out, "beta").starts_with("✓ Start beta: "), "{out}");
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
    assert!(output.contains("hello from v1"), "{output}");

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
    assert!(last_line_of(&out, "alpha").starts_with("✓ Kill alpha: set-wanted ✓"), "{out}");
    wait_power(&api, "alpha", "Stopped").await;
}

/// On a terminal — a pseudo-terminal 80 columns wide, no `$COLUMNS` — a power verb over
/// six agents, one of which fails, leaves what a user should see: the Job's name, one
/// line per agent (its glyph, the template, the agent, the time it took, its chain), each
/// within the width, none drawn over another, and the summary naming the failed agent.
/// Without a terminal, the same verb prints a line per agent change (issue 32).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_terminal_each_agent_has_its_line_and_the_summary_names_the_failure() {
    const AGENTS: [&str; 6] =
        ["manager", "researcher", "writer", "reviewer", "scheduler-with-a-long-name", "ops"];
    const COLS: usize = 80;
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    for name in AGENTS {
        assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent(name, &repo)).await.code, 201);
    }
    for name in AGENTS {
        wait_power(&api, name, "Running").await;
    }
    // researcher's configuration names a rev its repository lacks: its prebuild fails.
    let patch = api
        .patch(
            "/apis/hive.dev/v1/agents/researcher",
            "application/merge-patch+json",
            &json!({"spec": {"config": {"rev": "no-such-rev"}}}),
        )
        .await;
    assert_eq!(patch.code, 200, "{:?}", patch.body);

    let mut command = Command::new(hive_bin());
    command.arg("--kubeconfig").arg(&d.kubeconfig).arg("rebuild").args(AGENTS).env_remove("COLUMNS");
    let captured =
        tokio::task::spawn_blocking(move || pty::run(&mut command, COLS as u16, 40)).await.unwrap();
    let shown = pty::screen(&captured.bytes, COLS);
    let context = format!(
        "screen:\n{}\nbytes: {:?}\nstderr: {}",
        shown.join("\n"),
        String::from_utf8_lossy(&captured.bytes),
        captured.stderr
    );
    assert_eq!(captured.status.code(), Some(1), "{context}");
    assert!(captured.stderr.contains("failed: node researcher/prebuild: "), "{context}");

    assert_eq!(shown.len(), 1 + AGENTS.len() + 1, "the Job, one line per agent, the summary: {context}");
    assert!(shown[0].starts_with("job.hive.dev/") && shown[0].ends_with(" submitted"), "{context}");
    let board = &shown[1..=AGENTS.len()];
    for name in AGENTS {
        let lines: Vec<&String> =
            board.iter().filter(|l| l.split_whitespace().nth(2) == Some(name)).collect();
        assert_eq!(lines.len(), 1, "{name} has exactly one line: {context}");
        let words: Vec<&str> = lines[0].split_whitespace().collect();
        let glyph = if name == "researcher" { "✗" } else { "✓" };
        assert_eq!(&words[..2], [glyph, "Rebuild"], "{name}: {context}");
        let elapsed = words[3];
        assert!(
            elapsed.starts_with(|c: char| c.is_ascii_digit()) && elapsed.ends_with(['s', 'm', 'h']),
            "{name}'s line shows the time it took, not {elapsed:?}: {context}"
        );
        assert!(lines[0].contains("prebuild "), "{name}'s chain: {context}");
    }
    assert!(
        board.iter().all(|l| l.chars().count() < COLS),
        "every line ends before the last column (no pending wrap): {context}"
    );
    let long = board.iter().find(|l| l.contains("scheduler-with-a-long-name")).unwrap();
    assert!(long.ends_with('…'), "a line too long for the terminal is cut, marked: {context}");
    assert_eq!(shown[AGENTS.len() + 1], "5/6 done, 1 failed: researcher", "{context}");

    // Without a terminal (a pipe, as in CI) the same verb prints one line per agent
    // change: each line names one agent; it joined every agent into one line before.
    let piped = d.hive(&[&["rebuild"][..], &AGENTS[..]].concat());
    let stdout = String::from_utf8_lossy(&piped.stdout).into_owned();
    let context = format!("stdout:\n{stdout}\nstderr: {}", String::from_utf8_lossy(&piped.stderr));
    assert_eq!(piped.status.code(), Some(1), "{context}");
    check_plain(&stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("job.hive.dev/"), "{context}");
    let agent_of = |line: &str| -> Vec<&str> {
        AGENTS.iter().copied().filter(|a| line.split_whitespace().nth(2) == Some(&format!("{a}:"))).collect()
    };
    for line in &lines[1..] {
        assert_eq!(agent_of(line).len(), 1, "{line:?} is not one agent's line: {context}");
        assert!(line.chars().count() < 200, "{line:?}: {context}");
        assert!(!line.contains(" | "), "{line:?}: {context}");
    }
    for name in AGENTS {
        let last = lines[1..].iter().rev().find(|l| agent_of(l) == [name]);
        let last = last.unwrap_or_else(|| panic!("no line for {name}: {context}"));
        let glyph = if name == "researcher" { "✗" } else { "✓" };
        assert!(last.starts_with(&format!("{glyph} Rebuild {name}: prebuild ")), "{last:?}: {context}");
    }
}

// Regression (issue 26, item 7): `hive restart --all` listed every agent, so an agent
// kept Offline on purpose was rewritten to Up and started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_all_restarts_the_agents_wanted_up_and_start_all_starts_every_one() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    let agents = "/apis/hive.dev/v1/agents";
    assert_eq!(api.post(agents, &crate::agents::agent("up", &repo, "Up")).await.code, 201);
    assert_eq!(api.post(agents, &crate::agents::agent("down", &repo, "Offline")).await.code, 201);
    wait_power(&api, "up", "Running").await;
    let spawn = crate::harness::eventually("down's Spawn Job", || async {
        let jobs = crate::agent_contract::jobs_of(&api, "down").await;
        jobs.iter().find(|j| j["spec"]["template"] == "Spawn").map(|j| j["metadata"]["name"].clone())
    })
    .await;
    let spawn = wait_terminal(&api, spawn.as_str().unwrap()).await;
    assert_eq!(spawn["status"]["phase"], "Done", "{}", spawn["status"]);

    // restart --all: only the agent wanted Up is in the Job; the Offline one stays down.
    let out = ok(d.hive(&["restart", "--all"]));
    let job = api.get(&format!("/apis/hive.dev/v1/jobs/{}", submitted(&out))).await.body;
    assert_eq!(job["spec"]["agents"], json!(["up"]), "{out}");
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    let down = api.get("/apis/hive.dev/v1/agents/down").await.body;
    assert_eq!(down["spec"]["wanted"], "Offline", "{down}");
    assert_ne!(down["status"]["power"], "Running", "{down}");

    // restart NAME of an Offline agent is a start, as the document's shape says.
    let out = ok(d.hive(&["restart", "down"]));
    assert!(last_line(&out).starts_with("✓ Restart down: set-wanted ✓"), "{out}");
    wait_power(&api, "down", "Running").await;
    assert_eq!(api.get("/apis/hive.dev/v1/agents/down").await.body["spec"]["wanted"], "Up");

    // start --all starts every agent, the Offline ones too.
    ok(d.hive(&["stop", "down"]));
    wait_power(&api, "down", "Stopped").await;
    let out = ok(d.hive(&["start", "--all"]));
    let job = api.get(&format!("/apis/hive.dev/v1/jobs/{}", submitted(&out))).await.body;
    assert_eq!(job["spec"]["agents"], json!(["down", "up"]), "{out}");
    wait_power(&api, "down", "Running").await;

    // `--help` says what `--all` means for each verb (whitespace folded: clap wraps).
    let help = |verb: &str| ok(d.hive(&[verb, "--help"])).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help("restart").contains("every agent whose spec.wanted is Up"), "{}", help("restart"));
    assert!(help("start").contains("every agent, Offline ones too"), "{}", help("start"));
}
