//! An agent's log through the real daemon, as kubectl reads a pod's: each line stored
//! with its time, a run's start marked, and the log route's `previous`, `sinceTime`,
//! `sinceSeconds` and `timestamps` (and `hive logs`' flags for them) over a real process
//! agent that a rebuild restarts.

use std::time::Duration;

use serde_json::json;

use crate::agents::{agent, config_repo, wait_power};
use crate::harness::{Api, Daemon};

async fn log(api: &Api, query: &str) -> (u16, String) {
    let reply = api.get(&format!("/apis/hive.dev/v1/agents/alpha/log{query}")).await;
    let text = match &reply.body {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    (reply.code, text)
}

async fn wait_for_line(api: &Api, line: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, text) = log(api, "").await;
        if text.lines().any(|l| l == line) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "never printed {line:?}: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_logs_select_the_previous_run_by_time_and_carry_timestamps() {
    let d = Daemon::start_with(&["--agent-controller=true"]);
    let repo = config_repo(&d.dir);
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("alpha", &repo, "Up")).await.code, 201);
    wait_power(&api, "alpha", "Running").await;
    wait_for_line(&api, "hello from v1").await;
    // A new rev rebuilds and restarts it: a second run.
    let patched = api
        .patch(
            "/apis/hive.dev/v1/agents/alpha",
            "application/merge-patch+json",
            &json!({"spec": {"config": {"rev": "v2"}}}),
        )
        .await;
    assert_eq!(patched.code, 200);
    wait_for_line(&api, "hello from v2").await;

    // Plain lines by default, as before lines carried their time. (The first run's shell
    // may say `Terminated` as its sleep is stopped.)
    let (code, plain) = log(&api, "").await;
    assert_eq!(code, 200);
    let lines: Vec<&str> = plain.lines().filter(|l| *l != "Terminated").collect();
    assert_eq!(lines, ["hello from v1", "hello from v2"], "{plain}");

    // The previous run only.
    let (code, previous) = log(&api, "?previous=true").await;
    assert_eq!(code, 200);
    assert!(previous.starts_with("hello from v1\n") && !previous.contains("v2"), "{previous}");

    // Each line's time, RFC 3339 with nanoseconds, in order.
    let (_, stamped) = log(&api, "?timestamps=true").await;
    let times: Vec<chrono::DateTime<chrono::FixedOffset>> = stamped
        .lines()
        .map(|line| {
            let (time, text) = line.split_once(' ').unwrap_or_else(|| panic!("no prefix: {line:?}"));
            assert!(text.starts_with("hello from v") || text == "Terminated", "{line:?}");
            assert_eq!(time.len(), "2026-12-01T17:00:00.123456789Z".len(), "{time:?}");
            chrono::DateTime::parse_from_rfc3339(time).unwrap_or_else(|e| panic!("{time:?}: {e}"))
        })
        .collect();
    assert_eq!(times.len(), plain.lines().count(), "{stamped}");
    assert!(times.is_sorted(), "{stamped}");

    // Since the second run's line: only that one. Since a day ago: all.
    let since = times[times.len() - 1].to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    let query = format!("?sinceTime={}", since.replace(':', "%3A"));
    assert_eq!(log(&api, &query).await, (200, "hello from v2\n".to_string()));
    assert_eq!(log(&api, "?sinceSeconds=86400").await.1, plain);
    assert_eq!(log(&api, "?sinceSeconds=9223372036854775807").await, (200, plain.clone()));

    // Bad values are 400s that name the parameter.
    for (query, named) in [
        ("?sinceSeconds=soon", "sinceSeconds"),
        ("?sinceSeconds=0", "sinceSeconds"),
        ("?sinceTime=yesterday", "sinceTime"),
        ("?sinceSeconds=5&sinceTime=2026-12-01T17%3A00%3A00Z", "at most one"),
        ("?timestamps=maybe", "timestamps"),
        ("?previous=2", "previous"),
    ] {
        let (code, body) = log(&api, query).await;
        assert_eq!(code, 400, "{query}: {body}");
        assert!(body.contains(named), "{query}: {body}");
    }

    // The CLI's flags.
    let out = d.hive(&["logs", "agent/alpha", "--previous"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), previous);
    let out = d.hive(&["logs", "agent/alpha", "--since-time", &since, "--timestamps"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{since} hello from v2\n"));
    let out = d.hive(&["logs", "agent/alpha", "--since", "1h"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), plain);
}
