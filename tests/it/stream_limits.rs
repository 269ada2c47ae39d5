//! What a reader may hold (issue 28, items 1, 2 and 5): log reads stream from disk in
//! bounded chunks and end when their client stops reading, long-running requests are
//! capped per token and in all (429 with `Retry-After`) with room kept for admins and
//! `/readyz`, and every stream ends when its token is revoked, read or not. Every
//! connection goes to 127.0.0.1 and every wait is bounded.

use std::time::Duration;

use http_body_util::BodyExt as _;
use serde_json::json;

use crate::harness::{agent, Daemon};
use crate::http2::H2;

const AGENTS: &str = "/apis/hive.dev/v1/agents";

/// The daemon's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a number")
}

/// An agent `name` that the daemon leaves alone (`--agent-controller=false`), with a log
/// of `bytes` (about) in its two files, as the supervisor writes them; its last line is
/// `the very last line`.
async fn agent_with_log(d: &Daemon, name: &str, bytes: usize) {
    let created = d.client().post(AGENTS, &agent(name)).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    let logs = d.dir.join("agents").join(name).join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let line = format!("2026-12-01T17:00:00.000000001Z stdout F {}\n", "x".repeat(200));
    let half = line.repeat(bytes / 2 / line.len());
    std::fs::write(logs.join("agent.log.1"), &half).unwrap();
    let last = "2026-12-01T17:00:01.000000001Z stderr F the very last line\n";
    std::fs::write(logs.join("agent.log"), format!("{half}{last}")).unwrap();
}

/// The open long-running requests of `subresource` ("" for watches) by the daemon's
/// `apiserver_longrunning_requests` gauge.
async fn open_streams(d: &Daemon, subresource: &str) -> u64 {
    let text = d.client().get("/metrics").await.body.as_str().unwrap_or_default().to_string();
    text.lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
        .filter(|l| l.contains(&format!("subresource=\"{subresource}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A counter of `/metrics` (0 when absent).
async fn counter(d: &Daemon, name: &str, label: &str) -> u64 {
    let text = d.client().get("/metrics").await.body.as_str().unwrap_or_default().to_string();
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

async fn wait_for_open(d: &Daemon, subresource: &str, n: u64, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    let mut open = 0;
    while tokio::time::Instant::now() < deadline {
        open = open_streams(d, subresource).await;
        if open == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("{open} {subresource:?} streams open after {within:?}, not {n}");
}

/// A viewer token's value.
async fn viewer(d: &Daemon, name: &str) -> String {
    let reply = d.client().post("/hive/v1/tokens", &json!({"name": name, "role": "viewer"})).await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    reply.body["token"].as_str().unwrap().to_string()
}

/// Fifty log reads of a 16 MB log that nobody reads, on one HTTP/2 connection: the
/// daemon holds a few chunks of each, not the log (on `main` before this, each read
/// loaded the whole log: ~11 MiB a stream), and ends every one after the write timeout.
/// A `tail=1` read still answers the last line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_log_reads_hold_a_few_chunks_each_and_end_after_the_write_timeout() {
    const READS: usize = 50;
    let d = Daemon::start_with(&["--agent-controller=false", "--watch-write-timeout", "3s"]);
    agent_with_log(&d, "chatty", 16 << 20).await;
    let tail = d.client().get(&format!("{AGENTS}/chatty/log?tail=1")).await;
    assert_eq!((tail.code, tail.body.as_str()), (200, Some("the very last line\n")));

    let h2 = H2::connect(&d).await;
    let before = rss_kib(d.pid());
    let mut unread = Vec::new();
    for _ in 0..READS {
        let response = h2.request("GET", &format!("{AGENTS}/chatty/log"), None).await;
        assert_eq!(response.status().as_u16(), 200);
        unread.push(response.into_body());
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let grown_mib = rss_kib(d.pid()).saturating_sub(before) / 1024;
    // Each stream: what h2 queues (400 KiB) and a few 64 KiB chunks.
    assert!(grown_mib < 100, "{READS} unread log reads grew the daemon by {grown_mib} MiB");

    // Not a byte read from them, and they end: the write timeout, then a reset.
    wait_for_open(&d, "log", 0, Duration::from_secs(30)).await;
    assert!(counter(&d, "hive_streams_ended_total", "not_reading").await >= READS as u64);
    let mut body = unread.pop().unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match body.frame().await {
                Some(Ok(_)) => continue,
                Some(Err(_)) => return "reset",
                None => return "ended",
            }
        }
    })
    .await;
    assert_eq!(ended, Ok("reset"), "an unread log read was not reset");
}

/// A followed log that its client does not read ends when its token is revoked (on
/// `main` before this it was still served a minute later: only a polled body checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_followed_log_ends_when_its_token_is_revoked() {
    let d = Daemon::start_with(&["--agent-controller=false", "--watch-write-timeout", "5m"]);
    agent_with_log(&d, "chatty", 16 << 20).await;
    let mut h2 = H2::connect(&d).await;
    h2.token = viewer(&d, "reader").await;
    let response = h2.request("GET", &format!("{AGENTS}/chatty/log?follow=true"), None).await;
    assert_eq!(response.status().as_u16(), 200);
    let _unread = response.into_body();
    wait_for_open(&d, "log", 1, Duration::from_secs(10)).await;
    let revoked = d.client().delete("/hive/v1/tokens/reader").await;
    assert!(revoked.code < 300, "{:?}", revoked.body);
    // Liveness is checked every 15 s.
    wait_for_open(&d, "log", 0, Duration::from_secs(40)).await;
    assert_eq!(counter(&d, "hive_streams_ended_total", "credential_ended").await, 1);
}

/// Long-running requests are capped per token and in all, answered 429 with
/// `Retry-After` naming the flag, and counted; an admin still gets a watch from the
/// reserve, writes and `/readyz` answer; a place freed is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_running_requests_are_capped_per_token_and_in_all_with_room_for_admins() {
    let d = Daemon::start_with(&["--max-long-running", "8", "--max-long-running-per-client", "5"]);
    let mut first = H2::connect(&d).await;
    first.token = viewer(&d, "first").await;
    let mut second = H2::connect(&d).await;
    second.token = viewer(&d, "second").await;
    let watch = format!("{AGENTS}?watch=true");
    let mut held = Vec::new();
    for _ in 0..5 {
        let response = first.request("GET", &watch, None).await;
        assert_eq!(response.status().as_u16(), 200);
        held.push(response.into_body());
    }
    let refused = first.request("GET", &watch, None).await;
    assert_eq!(refused.status().as_u16(), 429);
    assert_eq!(refused.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status["reason"], "TooManyRequests");
    assert!(status["message"].as_str().unwrap().contains("--max-long-running-per-client"), "{status}");
    // The first token may still list: the caps are per kind of request.
    assert_eq!(first.json("GET", AGENTS, None).await.0, 200);

    let mut theirs = Vec::new();
    for _ in 0..3 {
        let response = second.request("GET", &watch, None).await;
        assert_eq!(response.status().as_u16(), 200);
        theirs.push(response.into_body());
    }
    let full = second.json("GET", &watch, None).await;
    assert_eq!(full.0, 429, "{}", full.1);
    assert!(full.1["message"].as_str().unwrap().contains("--max-long-running)"), "{}", full.1);

    // The operator is not locked out.
    let admin = H2::connect(&d).await;
    let response = admin.request("GET", &watch, None).await;
    assert_eq!(response.status().as_u16(), 200, "an admin's watch comes from the reserve");
    let _admin_watch = response.into_body();
    assert_eq!(admin.json("POST", AGENTS, Some(&agent("still-writable"))).await.0, 201);
    let ready = reqwest_insecure().get(format!("{}/readyz", d.url)).send().await.unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    assert_eq!(counter(&d, "hive_limit_refusals_total", "long_running_per_client").await, 1);
    assert_eq!(counter(&d, "hive_limit_refusals_total", "long_running_total").await, 1);

    // A place freed is a place again.
    drop(held);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let response = second.request("GET", &watch, None).await;
        if response.status().as_u16() == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the freed places were never given back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The reproduction: a viewer opens 5 HTTP/2 connections × 250 followed logs
/// against a daemon with 1,024 open files. On `main` before this they took every
/// descriptor: new connections, an admin write and `/readyz` timed out. Now the token
/// gets its 100, the rest are 429, and the daemon serves everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followed_logs_cannot_take_the_daemons_descriptors() {
    let Some(d) = Daemon::start_with_open_files(1024, &["--agent-controller=false"]) else {
        eprintln!("skipped: prlimit is not on PATH");
        return;
    };
    agent_with_log(&d, "chatty", 64 << 10).await;
    let token = viewer(&d, "greedy").await;
    let mut connections = Vec::new();
    for _ in 0..5 {
        let mut h2 = H2::connect(&d).await;
        h2.token = token.clone();
        connections.push(h2);
    }
    let path = format!("{AGENTS}/chatty/log?follow=true");
    let (mut open, mut refused) = (Vec::new(), 0);
    for h2 in &connections {
        let answers = futures_util::future::join_all((0..250).map(|_| h2.request("GET", &path, None))).await;
        for response in answers {
            match response.status().as_u16() {
                200 => open.push(response.into_body()),
                429 => refused += 1,
                other => panic!("a followed log answered {other}"),
            }
        }
    }
    assert_eq!((open.len(), refused), (100, 1150));
    // Everyone else is served.
    let created = d.client().post(AGENTS, &agent("admin-write")).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    let ready = reqwest_insecure().get(format!("{}/readyz", d.url)).send().await.unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    let other = viewer(&d, "other").await;
    let listed = d.client_with(Some(&other)).get(AGENTS).await;
    assert_eq!(listed.code, 200);
}

fn reqwest_insecure() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}
