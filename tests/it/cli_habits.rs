//! The kubectl habits of the hive CLI against the real daemon (issue 15): `hive events`
//! ordered by time, filtered and fitted to the terminal, and the rest of the habits.
//!
//! `HIVE_IT_CLI` (optional) runs another `hive` binary as the CLI against this suite's
//! daemon, e.g. main's, to see these tests fail before a change.

use std::process::{Command, Output, Stdio};

use serde_json::json;

use crate::harness::{fails, hive_bin, ok, Daemon};

/// Runs the CLI with `env` set and `COLUMNS` unset unless given (stdout is a pipe).
fn hive(d: &Daemon, env: &[(&str, &str)], args: &[&str]) -> Output {
    let bin = std::env::var("HIVE_IT_CLI").unwrap_or_else(|_| hive_bin().to_string());
    let mut cmd = Command::new(bin);
    cmd.arg("--kubeconfig").arg(&d.kubeconfig).args(args).env_remove("COLUMNS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).output().expect("run hive")
}

async fn post_event(d: &Daemon, name: &str, about: &str, type_: &str, last: &str, message: &str) {
    let event = json!({
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
        "involvedObject": {"apiVersion": "hive.dev/v1", "kind": "Agent", "name": about},
        "reason": if type_ == "Warning" { "Crashed" } else { "Started" }, "message": message, "type": type_,
        "count": 1, "firstTimestamp": last, "lastTimestamp": last, "source": {"component": "hive-test"}
    });
    let created = d.client().post("/api/v1/events", &event).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
}

/// The names of the events' messages in the order `hive events` printed them.
fn order(text: &str) -> Vec<&str> {
    text.lines().skip(1).filter_map(|l| l.split_whitespace().find(|w| w.starts_with("msg-"))).collect()
}

#[tokio::test]
async fn events_read_in_time_order_filtered_and_fitted_to_the_width() {
    let d = Daemon::start();
    let long =
        format!("msg-crash {}", "the harness exited with status 1 after printing a long trace; ".repeat(5));
    // Names in the reverse of time order: sorting by name would print them backwards.
    post_event(&d, "a-last", "k1", "Normal", "2026-11-29T10:30:00Z", "msg-restarted").await;
    post_event(&d, "b-middle", "k1", "Warning", "2026-11-29T10:20:00Z", &long).await;
    post_event(&d, "c-first", "k1", "Normal", "2026-11-29T10:10:00Z", "msg-started").await;
    post_event(&d, "d-other", "other", "Normal", "2026-11-29T10:15:00Z", "msg-other").await;

    let all = ok(hive(&d, &[], &["events"]));
    assert_eq!(order(&all), ["msg-started", "msg-other", "msg-crash", "msg-restarted"], "{all}");
    assert!(all.lines().next().unwrap().starts_with("LAST SEEN"), "{all}");
    assert!(all.contains(long.trim_end()), "a pipe gets the full message:\n{all}");

    let fitted = ok(hive(&d, &[("COLUMNS", "100")], &["events"]));
    for line in fitted.lines() {
        assert!(line.chars().count() <= 100, "wider than COLUMNS=100: {line:?}\n{fitted}");
    }
    assert!(fitted.contains("msg-crash the harness") && fitted.contains('…'), "{fitted}");
    let wide = ok(hive(&d, &[("COLUMNS", "100")], &["events", "-o", "wide"]));
    assert!(wide.contains(long.trim_end()) && wide.contains("hive-test"), "-o wide is never cut:\n{wide}");

    let about_k1 = ok(hive(&d, &[], &["events", "--for", "agent/k1"]));
    assert_eq!(order(&about_k1), ["msg-started", "msg-crash", "msg-restarted"], "{about_k1}");
    let warnings = ok(hive(&d, &[], &["events", "--for", "agent/k1", "--types", "Warning"]));
    assert_eq!(order(&warnings), ["msg-crash"], "{warnings}");
    let both = ok(hive(&d, &[], &["events", "--types", "warning,Normal"]));
    assert_eq!(order(&both).len(), 4, "{both}");
    let names = ok(hive(&d, &[], &["events", "-o", "name"]));
    let names: Vec<&str> = names.lines().filter_map(|l| l.rsplit('/').next()).collect();
    assert_eq!(names, ["c-first", "d-other", "b-middle", "a-last"], "time order in -o name too");

    let refused = hive(&d, &[], &["events", "--types", "Loud"]);
    assert_eq!(refused.status.code(), Some(2), "a usage error: {refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("valid --types are Normal or Warning"),
        "{refused:?}"
    );
    let err = fails(hive(&d, &[], &["events", "--for", "manager"]));
    assert!(err.contains("KIND/NAME"), "{err}");
}

/// The command between `<code>` and `</code>` that starts with `hive token create`.
fn hint_command(html: &str) -> String {
    html.split("<code>")
        .filter_map(|c| c.split("</code>").next())
        .find(|c| c.starts_with("hive token create"))
        .unwrap_or_else(|| panic!("no token hint on the login page:\n{html}"))
        .to_string()
}

#[tokio::test]
async fn the_login_hint_works_as_written_and_tokens_can_be_revoked() {
    let d = Daemon::start();
    let login = d.client_with(None).get("/login").await;
    let hint = hint_command(login.body.as_str().expect("the login page is HTML"));
    let words: Vec<String> = hint
        .split_whitespace()
        .skip(1)
        .map(|w| if w == "NAME" { "oncall".into() } else { w.into() })
        .collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let secret = ok(hive(&d, &[], &words)).trim().to_string();
    assert!(secret.starts_with("hive_"), "the hint {hint:?} printed a token: {secret:?}");
    let viewer = d.client_with(Some(&secret));
    assert_eq!(viewer.get("/hive/v1/whoami").await.code, 200);

    // kubectl's `create NAME` order works too.
    let second = ok(hive(&d, &[], &["token", "create", "ci", "--role", "viewer"])).trim().to_string();
    assert!(second.starts_with("hive_"), "{second}");

    let revoked = ok(hive(&d, &[], &["token", "revoke", "oncall"]));
    assert!(revoked.contains("oncall") && revoked.contains("revoked"), "{revoked}");
    assert_eq!(viewer.get("/hive/v1/whoami").await.code, 401, "a revoked token stops working");
    let listed = ok(hive(&d, &[], &["token", "list"]));
    assert!(!listed.contains("oncall") && listed.contains("ci"), "{listed}");
    let again = fails(hive(&d, &[], &["token", "revoke", "oncall"]));
    assert!(again.contains("not found") && again.contains("oncall"), "{again}");
}

#[tokio::test]
async fn wait_fails_fast_when_the_job_failed() {
    let d = Daemon::start();
    // Applied, a Job for an agent that does not exist is stored and ends Failed.
    let yaml = "apiVersion: hive.dev/v1\nkind: Job\nmetadata:\n  name: restart-ghost\nspec:\n  template: Restart\n  agents: [ghost]\n";
    ok(d.hive_stdin(&["apply", "-f", "-"], Some(yaml)));
    for wanted in ["--for=jsonpath={.status.phase}=Done", "--for=condition=Complete"] {
        // The timeout is long; the wait must end on the Failed phase, not on the clock.
        let err = fails(hive(&d, &[], &["wait", "job/restart-ghost", wanted, "--timeout", "20s"]));
        assert!(err.contains("job/restart-ghost reached the terminal phase Failed"), "{wanted}: {err}");
        assert!(err.contains("ghost") && !err.contains("timed out"), "{wanted}: {err}");
    }
    // Waiting for the failure itself still succeeds.
    let met = ok(hive(
        &d,
        &[],
        &["wait", "job/restart-ghost", "--for=jsonpath={.status.phase}=Failed", "--timeout", "60s"],
    ));
    assert!(met.contains("condition met"), "{met}");
}

#[tokio::test]
async fn get_speaks_custom_columns_sort_by_and_jsonpath_range() {
    let d = Daemon::start();
    let api = d.client();
    for (name, rank) in [("a", "3"), ("b", "1"), ("c", "2")] {
        let mut agent = crate::harness::agent(name);
        agent["metadata"]["labels"]["rank"] = json!(rank);
        agent["spec"]["wanted"] = json!("Offline");
        let created = api.post("/apis/hive.dev/v1/agents", &agent).await;
        assert_eq!(created.code, 201, "{:?}", created.body);
    }
    let columns = ok(hive(
        &d,
        &[],
        &[
            "get",
            "agents",
            "-o",
            "custom-columns=NAME:.metadata.name,RANK:{.metadata.labels.rank},GONE:.spec.nothing",
        ],
    ));
    assert_eq!(
        columns,
        "NAME   RANK   GONE\na      3      <none>\nb      1      <none>\nc      2      <none>\n"
    );
    let sorted = ok(hive(
        &d,
        &[],
        &[
            "get",
            "agents",
            "--sort-by=.metadata.labels.rank",
            "-o",
            "custom-columns=NAME:.metadata.name",
            "--no-headers",
        ],
    ));
    assert_eq!(sorted, "b\nc\na\n");
    let table = ok(hive(&d, &[], &["get", "agents", "--sort-by", "{.metadata.labels.rank}"]));
    let names: Vec<&str> = table.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(names, ["b", "c", "a"], "the server's table sorted too:\n{table}");
    let by_time =
        ok(hive(&d, &[], &["get", "agents", "--sort-by=.metadata.creationTimestamp", "-o", "name"]));
    assert_eq!(by_time.lines().count(), 3, "{by_time}");
    let ranged = ok(hive(
        &d,
        &[],
        &[
            "get",
            "agents",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.metadata.labels.rank}{\"\\n\"}{end}",
        ],
    ));
    assert_eq!(ranged, "a=3\nb=1\nc=2\n");

    let bad = hive(&d, &[], &["get", "agents", "-o", "custom-columns=NAME"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("<header>:<json-path-expr>"), "{bad:?}");
    let bad = hive(&d, &[], &["get", "agents", "-o", "jsonpath={range .items[*]}{.metadata.name}"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("{range} without its {end}"), "{bad:?}");
    let bad = hive(&d, &[], &["get", "agents", "--sort-by", "{.a}{.b}"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}

#[tokio::test]
async fn fleet_suggests_a_retry_only_when_it_helps() {
    let mut d = Daemon::start();
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();
    // Given an id: the user has it already.
    let given = hive(&d, &[], &["fleet", "provision", "--count", "1", "--command-id", "first"]);
    assert!(given.status.success(), "{}", stderr(&given));
    assert!(!stderr(&given).contains("rerun"), "{}", stderr(&given));
    // Succeeded with a generated id: the id is printed, no retry is needed.
    let generated = hive(&d, &[], &["fleet", "provision", "--count", "1"]);
    assert!(generated.status.success(), "{}", stderr(&generated));
    assert!(
        stderr(&generated).contains("command id: ") && !stderr(&generated).contains("rerun"),
        "{}",
        stderr(&generated)
    );
    // Refused by the server: nothing was created, a retry would be refused the same way.
    let refused = hive(&d, &[], &["fleet", "kill", "node-99"]);
    assert!(!refused.status.success() && !stderr(&refused).contains("rerun"), "{}", stderr(&refused));
    // The server's answer lost: the command may exist, and the same id is the safe retry.
    d.kill9();
    let lost = hive(&d, &[], &["fleet", "provision", "--count", "1"]);
    assert!(!lost.status.success(), "{}", stderr(&lost));
    assert!(stderr(&lost).contains("rerun with --command-id "), "{}", stderr(&lost));
}

#[test]
fn serve_says_where_the_dashboard_is_and_how_to_sign_in() {
    let daemon = Daemon::start();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let banner = loop {
        let mut lines = daemon.stdout_lines();
        if let Some(end) = lines.iter().position(|l| l.starts_with("hive: sign in")) {
            lines.truncate(end + 1);
            break lines;
        }
        assert!(std::time::Instant::now() < deadline, "no sign-in line in {lines:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let text = banner.join("\n");
    let url = banner.iter().find_map(|l| l.strip_prefix("hive: serving ")).expect(&text).to_string();
    assert!(banner.contains(&format!("hive: dashboard {url}/")), "{text}");
    let sign_in = banner.last().filter(|l| l.starts_with("hive: sign in")).expect(&text);
    // The command in the banner works as printed.
    let command = sign_in.split('`').nth(3).expect(&text).replace("NAME", "banner");
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(words[0], "hive", "{command}");
    let out = Command::new(hive_bin()).args(&words[1..]).stdin(Stdio::null()).output().expect("run the hint");
    assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("hive_"), "{command} printed a token");
}

#[tokio::test]
async fn get_watch_prints_a_row_only_when_a_column_changed() {
    use std::io::{BufRead, BufReader};
    let d = Daemon::start();
    let api = d.client();
    let mut agent = crate::harness::agent("w1");
    agent["spec"]["wanted"] = json!("Offline");
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    let bin = std::env::var("HIVE_IT_CLI").unwrap_or_else(|_| hive_bin().to_string());
    let mut child = Command::new(bin)
        .arg("--kubeconfig")
        .arg(&d.kubeconfig)
        .args(["get", "agents", "-w"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn get -w");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = |what: &str| {
        rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap_or_else(|_| panic!("no line: {what}"))
    };
    assert!(next("header").starts_with("NAME"));
    assert!(next("the listed row").starts_with("w1"));
    // Invisible changes: annotations (as a Node's telemetry summary is to its table).
    for i in 0..3 {
        let patch = json!({"metadata": {"annotations": {"touch": i.to_string()}}});
        let patched = api.patch("/apis/hive.dev/v1/agents/w1", "application/merge-patch+json", &patch).await;
        assert_eq!(patched.code, 200, "{:?}", patched.body);
    }
    // A visible one: the WANTED column.
    let patch = json!({"spec": {"wanted": "Up"}});
    assert_eq!(
        api.patch("/apis/hive.dev/v1/agents/w1", "application/merge-patch+json", &patch).await.code,
        200
    );
    let line = next("the changed row");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        line.starts_with("w1") && line.contains("Up"),
        "the first row printed after the list is the visible change: {line:?}"
    );
}

#[test]
fn completion_scripts_load_in_their_shells() {
    let bash = Command::new(hive_bin()).args(["completion", "bash"]).output().expect("run");
    assert!(bash.status.success());
    let script = String::from_utf8_lossy(&bash.stdout).into_owned();
    assert!(script.contains("complete") && script.contains("hive"), "{script}");
    // bash parses it and registers the completion.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("hive.bash");
    std::fs::write(&file, &script).unwrap();
    let loaded = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p hive", file.display()))
        .output()
        .expect("bash");
    assert!(loaded.status.success(), "{}", String::from_utf8_lossy(&loaded.stderr));
    assert!(String::from_utf8_lossy(&loaded.stdout).contains("hive"));
    for shell in ["zsh", "fish"] {
        let out = Command::new(hive_bin()).args(["completion", shell]).output().expect("run");
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let bad = Command::new(hive_bin()).args(["completion", "tcsh"]).output().expect("run");
    assert_eq!(bad.status.code(), Some(2));
}

/// The bytes that would drive a terminal: ESC, BEL and the one-byte CSI (U+009B in UTF-8).
fn raw_controls(text: &[u8]) -> Vec<u8> {
    text.iter().copied().filter(|b| [0x1b, 0x07, 0x9b].contains(b)).collect()
}

/// Issue 28 item 7: text a writer chose (an Approval's summary and reason, an Event's
/// message) reached the operator's terminal raw, so it could retitle the window and
/// recolour what followed. Human-readable output escapes it; `-o json|yaml` keep it exact.
#[tokio::test]
async fn terminal_escapes_in_objects_do_not_reach_the_terminal() {
    let d = Daemon::start();
    let repo = crate::agents::config_repo(&d.dir);
    let evil = "\u{1b}]0;pwned\u{7}\u{1b}[31m red \u{9b}2J";
    let spec = crate::agents::agent("scout", &repo, "Offline")["spec"].clone();
    let approval = json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": "evil"},
        "spec": {"kind": "Spawn", "target": "scout", "summary": evil, "payload": {"agent": spec}}});
    let created = d.client().post("/apis/hive.dev/v1/approvals", &approval).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    post_event(&d, "evil-event", "scout", "Warning", "2026-11-29T10:30:00Z", &format!("msg-evil {evil}"))
        .await;

    for args in [
        &["describe", "approval", "evil"][..],
        &["get", "approvals"],
        &["get", "approvals", "-o", "wide"],
        &["events"],
        &["get", "events"],
        &["get", "approvals", "-o", "yaml"],
    ] {
        let out = hive(&d, &[], args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            raw_controls(&out.stdout),
            b"",
            "{args:?} printed raw controls:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(raw_controls(&out.stderr), b"", "{args:?} printed raw controls to stderr");
    }
    let described = ok(hive(&d, &[], &["describe", "approval", "evil"]));
    assert!(described.contains("^[]0;pwned\\x07^[[31m red \\u{9b}2J"), "escaped visibly:\n{described}");
    let events = ok(hive(&d, &[], &["events"]));
    assert!(events.contains("msg-evil ^[]0;pwned"), "{events}");

    // Machine output stays exact: JSON's and YAML's own escapes give back the same text.
    let json: serde_json::Value =
        serde_json::from_str(&ok(hive(&d, &[], &["get", "approval", "evil", "-o", "json"]))).unwrap();
    assert_eq!(json["spec"]["summary"], evil);
    let yaml: serde_json::Value =
        serde_yaml_ng::from_str(&ok(hive(&d, &[], &["get", "approval", "evil", "-o", "yaml"]))).unwrap();
    assert_eq!(yaml["spec"]["summary"], evil);
}

/// How many worker threads the daemon's async runtime has, as it logs them at start (the
/// runtime's own count; its blocking threads share the workers' thread name, so
/// `/proc/PID/task` cannot tell them apart).
async fn runtime_workers(daemon: &Daemon) -> usize {
    let said = crate::harness::eventually("the worker count in the daemon's log", || async move {
        let log = daemon.log();
        let line = log.lines().find(|l| l.contains("the async runtime's worker threads"))?.to_string();
        Some(line)
    })
    .await;
    let count = said.split("workers=").nth(1).and_then(|rest| rest.split_whitespace().next());
    count.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no worker count in {said:?}"))
}

#[tokio::test]
async fn serve_runs_as_many_workers_as_asked_and_refuses_a_count_it_cannot() {
    // One worker: the daemon still answers a write and a watch sees it.
    let daemon = Daemon::start_with(&["--worker-threads", "1"]);
    assert_eq!(runtime_workers(&daemon).await, 1, "threads of a daemon asked for one worker");
    let api = daemon.client();
    let mut watch = api.watch("/apis/hive.dev/v1/agents?watch=true").await;
    let created = api.post("/apis/hive.dev/v1/agents", &crate::harness::agent("one-worker")).await;
    assert_eq!(created.code, 201, "{}", created.body);
    let event = watch.next(std::time::Duration::from_secs(10)).await.expect("the watch saw the create");
    assert_eq!(event["object"]["metadata"]["name"], "one-worker", "{event}");

    // The environment says the same as the flag.
    let env = Daemon::start_with_env(&[], &[("HIVE_WORKER_THREADS", "3")]);
    assert_eq!(runtime_workers(&env).await, 3, "threads of a daemon given HIVE_WORKER_THREADS=3");

    let scratch = tempfile::tempdir().unwrap();
    let state = scratch.path().join("state");
    for bad in ["0", "1025", "many"] {
        let out = Command::new(hive_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--worker-threads", bad, "--state-dir"])
            .arg(&state)
            .stdin(Stdio::null())
            .output()
            .expect("run hive serve");
        assert_eq!(out.status.code(), Some(2), "--worker-threads {bad} is a usage error");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("--worker-threads"), "the error names the flag: {said}");
        assert!(!state.exists(), "--worker-threads {bad}: a refused start made its state directory");
    }
}
