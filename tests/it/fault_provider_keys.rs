//! Issue 14, item 7: a Provider's Vast.ai key sources are limited to what the operator of
//! the host allowed when starting `hive serve` — files inside `--provider-key-dir`,
//! variables named by `--provider-key-env`, sent only to the public API or a base URL
//! named by `--provider-base-url`. An API admin naming anything else (`/etc/hostname`,
//! a file outside the directory, a `..` path, a symbolic link out of it, `$HOME`) gets a
//! 422 naming the field on every write path, and the daemon sends nothing anywhere; a key
//! file that cannot be used looks the same to the API whatever is wrong with it (no
//! existence oracle); allowed sources still work end to end.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{eventually, fails, ok, Daemon, Reply};
use crate::vastai::{offers, Stand, KEY};

const PROVIDERS: &str = "/apis/hive.dev/v1/providers";
/// The key of the providers this suite allows: the only one the trap may ever see.
const CANARY: &str = "canary-key-allowed-0123456789";
/// What an admin must never get the daemon to send: a file outside the key directory.
const OUTSIDE: &str = "outside-secret-9f8e7d6c5b4a";
/// The variable the operator allows in these tests.
const ALLOWED_ENV: &str = "HIVE_TEST_VAST_KEY";

/// A 127.0.0.1 listener standing in for whatever URL an admin names: it records the head
/// of every request (its `Authorization` header included) and answers 401 at once.
struct Trap {
    heads: Arc<Mutex<Vec<String>>>,
    url: String,
}

impl Trap {
    async fn start() -> Trap {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api/v0", listener.local_addr().unwrap());
        let heads = Arc::new(Mutex::new(Vec::new()));
        let recorded = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await;
                    let n = read.ok().and_then(Result::ok).unwrap_or(0);
                    recorded
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                    let answer =
                        "HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                    let _ = tcp.write_all(answer.as_bytes()).await;
                });
            }
        });
        Trap { heads, url }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Every `Authorization` value received, lowercased header name stripped.
    fn authorizations(&self) -> Vec<String> {
        self.heads()
            .iter()
            .flat_map(|head| {
                head.lines()
                    .filter_map(|l| l.split_once(':'))
                    .filter(|(name, _)| name.eq_ignore_ascii_case("authorization"))
                    .map(|(_, value)| value.trim().to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

fn vastai(name: &str, settings: Value) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Provider", "metadata": {"name": name},
           "spec": {"type": "vastai", "vastai": settings}})
}

/// The fields the causes of a `Status` name.
fn cause_fields(status: &Value) -> Vec<String> {
    status["details"]["causes"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["field"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// What is wrong with one refusal, if anything: it must be a 422 naming `field`, whose
/// message says `hint` (what the operator must pass), and nothing may be stored.
fn check_refused(what: &str, reply: &Reply, field: &str, hint: &str) -> Option<String> {
    let message = reply.body["message"].as_str().unwrap_or_default();
    let problem = if reply.code != 422 {
        Some(format!("{what}: HTTP {} (want 422): {}", reply.code, reply.body))
    } else if !cause_fields(&reply.body).iter().any(|f| f == field) {
        Some(format!("{what}: no cause names {field}: {}", reply.body))
    } else if !message.contains(hint) {
        Some(format!("{what}: the message does not say {hint:?}: {message}"))
    } else {
        None
    };
    problem
}

/// A key directory for the tests: `canary.key` (the allowed key), `escape` (a symbolic
/// link to a file outside it), `hostname` (a symbolic link to /etc/hostname); and that
/// outside file, in a directory of its own.
struct Keys {
    dir: tempfile::TempDir,
    outside: tempfile::TempDir,
}

impl Keys {
    fn new() -> Keys {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("canary.key"), format!("{CANARY}\n")).unwrap();
        std::fs::write(outside.path().join("outside.key"), OUTSIDE).unwrap();
        std::os::unix::fs::symlink(outside.path().join("outside.key"), dir.path().join("escape")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("hostname")).unwrap();
        Keys { dir, outside }
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_source_the_operator_did_not_allow_is_a_422_on_every_path_and_nothing_is_sent() {
    let trap = Trap::start().await;
    let keys = Keys::new();
    let key_dir = keys.dir().display().to_string();
    let d = Daemon::start_with(&[
        "--provider-key-dir",
        &key_dir,
        "--provider-key-env",
        ALLOWED_ENV,
        "--provider-base-url",
        &trap.url,
    ]);
    let api = d.client();
    let outside = keys.outside.path().join("outside.key").display().to_string();
    let mut problems = Vec::new();

    // Every create path: POST (also a dry run), server-side apply.
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "etc-hostname",
            json!({"apiKeyFile": "/etc/hostname", "baseUrl": trap.url}),
            "spec.vastai.apiKeyFile",
            "--provider-key-dir",
        ),
        (
            "outside-file",
            json!({"apiKeyFile": outside, "baseUrl": trap.url}),
            "spec.vastai.apiKeyFile",
            "--provider-key-dir",
        ),
        (
            "dot-dot",
            json!({"apiKeyFile": "../outside.key", "baseUrl": trap.url}),
            "spec.vastai.apiKeyFile",
            "..",
        ),
        (
            "symlink-escape",
            json!({"apiKeyFile": "escape", "baseUrl": trap.url}),
            "spec.vastai.apiKeyFile",
            "--provider-key-dir",
        ),
        (
            "symlink-hostname",
            json!({"apiKeyFile": "hostname", "baseUrl": trap.url}),
            "spec.vastai.apiKeyFile",
            "--provider-key-dir",
        ),
        (
            "env-home",
            json!({"apiKeyEnv": "HOME", "baseUrl": trap.url}),
            "spec.vastai.apiKeyEnv",
            "--provider-key-env HOME",
        ),
        (
            "url-elsewhere",
            json!({"apiKeyFile": "canary.key", "baseUrl": "http://127.0.0.1:9/elsewhere/v0"}),
            "spec.vastai.baseUrl",
            "--provider-base-url http://127.0.0.1:9/elsewhere/v0",
        ),
    ];
    for (name, settings, field, hint) in &cases {
        let body = vastai(name, settings.clone());
        let reply = api.post(PROVIDERS, &body).await;
        problems.extend(check_refused(&format!("POST {name}"), &reply, field, hint));
        let dry = api.post(&format!("{PROVIDERS}?dryRun=All"), &body).await;
        problems.extend(check_refused(&format!("POST ?dryRun=All {name}"), &dry, field, hint));
        let ssa = api
            .send(
                "PATCH",
                &format!("{PROVIDERS}/{name}?fieldManager=intruder"),
                "application/apply-patch+yaml",
                Some(body.to_string()),
            )
            .await;
        problems.extend(check_refused(&format!("server-side apply {name}"), &ssa, field, hint));
        if api.get(&format!("{PROVIDERS}/{name}")).await.code != 404 {
            problems.push(format!("{name}: stored although refused"));
        }
    }

    // Every update path of an allowed provider: PUT, merge patch, JSON patch,
    // ConfigureProvider. It stays as it was.
    let allowed = vastai("allowed", json!({"apiKeyFile": "canary.key", "baseUrl": trap.url}));
    let created = api.post(PROVIDERS, &allowed).await;
    assert_eq!(created.code, 201, "an allowed source is admitted: {:?}", created.body);
    let stored_spec = created.body["spec"].clone();
    let path = format!("{PROVIDERS}/allowed");
    let mut put = created.body.clone();
    put["spec"]["vastai"]["apiKeyFile"] = json!("/etc/hostname");
    let reply = api.put(&path, &put).await;
    problems.extend(check_refused("PUT", &reply, "spec.vastai.apiKeyFile", "--provider-key-dir"));
    let merge = json!({"spec": {"vastai": {"apiKeyFile": null, "apiKeyEnv": "HOME"}}});
    let reply = api.patch(&path, "application/merge-patch+json", &merge).await;
    problems.extend(check_refused("merge patch", &reply, "spec.vastai.apiKeyEnv", "--provider-key-env HOME"));
    let ops = json!([{"op": "replace", "path": "/spec/vastai/baseUrl", "value": "http://127.0.0.1:9/elsewhere/v0"}]);
    let reply = api.patch(&path, "application/json-patch+json", &ops).await;
    problems.extend(check_refused("JSON patch", &reply, "spec.vastai.baseUrl", "--provider-base-url"));
    let reply = api
        .post(
            "/hive/v1/fleet/providers/allowed/configure",
            &json!({"baseUrl": "http://127.0.0.1:9/elsewhere/v0"}),
        )
        .await;
    problems.extend(check_refused("ConfigureProvider", &reply, "spec.vastai.baseUrl", "--provider-base-url"));
    let now = api.get(&path).await.body;
    if now["spec"] != stored_spec {
        problems.push(format!("the allowed provider changed: {}", now["spec"]));
    }

    // The clients: kubectl apply (client-side) and hive apply name the field too.
    let manifest = vastai("by-kubectl", json!({"apiKeyEnv": "HOME", "baseUrl": trap.url})).to_string();
    let out = d.kubectl_stdin(&["apply", "-f", "-"], Some(&manifest));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() || !err.contains("spec.vastai.apiKeyEnv") {
        problems.push(format!("kubectl apply: {:?}: {err}", out.status));
    }
    let manifest = vastai("by-hive", json!({"apiKeyFile": "/etc/hostname", "baseUrl": trap.url})).to_string();
    let out = d.hive_stdin(&["apply", "-f", "-"], Some(&manifest));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() || !err.contains("spec.vastai.apiKeyFile") {
        problems.push(format!("hive apply: {:?}: {err}", out.status));
    }

    // The allowed provider is checked against the trap with the allowed key: once that
    // request arrived, the daemon had time to send any other, and none came.
    eventually("the allowed provider's check to reach the trap", || async {
        trap.authorizations().iter().any(|a| a.contains(CANARY)).then_some(())
    })
    .await;
    let checked = eventually("the allowed provider checked", || async {
        let p = api.get(&path).await.body;
        p["status"]["state"].as_str().map(str::to_string)
    })
    .await;
    assert_eq!(checked, "ConfigurationError", "the trap refuses every key");
    let home = std::env::var("HOME").unwrap_or_default();
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    for auth in trap.authorizations() {
        if auth != format!("Bearer {CANARY}") {
            problems.push(format!("the daemon sent another credential: {auth:?}"));
        }
    }
    let everything = trap.heads().concat();
    for (what, secret) in
        [("$HOME", home.trim()), ("/etc/hostname", hostname.trim()), ("the outside file", OUTSIDE)]
    {
        if !secret.is_empty() && everything.contains(secret) {
            problems.push(format!("{what} left the daemon"));
        }
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_file_that_cannot_be_used_looks_the_same_whatever_is_wrong_with_it() {
    let trap = Trap::start().await;
    let keys = Keys::new();
    let dir = keys.dir();
    std::fs::write(dir.join("empty"), "").unwrap();
    std::fs::write(dir.join("multi-line"), "first-line-0123\nsecond-line-4567\n").unwrap();
    std::fs::write(dir.join("too-big"), "a".repeat(256 * 1024)).unwrap();
    std::fs::create_dir(dir.join("a-directory")).unwrap();
    let unreadable = dir.join("unreadable");
    std::fs::write(&unreadable, "unreadable-key-0123").unwrap();
    std::fs::set_permissions(&unreadable, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    // Root reads any file: then there is no unreadable file to show.
    let root = std::fs::read(&unreadable).is_ok();
    let fifo =
        std::process::Command::new("mkfifo").arg(dir.join("a-fifo")).status().is_ok_and(|s| s.success());
    let mut cases = vec!["missing", "empty", "multi-line", "too-big", "a-directory"];
    if !root {
        cases.push("unreadable");
    } else {
        eprintln!("running as root: the unreadable-file case is skipped (root reads it)");
    }
    if fifo {
        cases.push("a-fifo");
    } else {
        eprintln!("no mkfifo: the named-pipe case is skipped");
    }
    let key_dir = dir.display().to_string();
    let d = Daemon::start_with(&["--provider-key-dir", &key_dir, "--provider-base-url", &trap.url]);
    let api = d.client();
    // The compatible absolute form (a path inside the key directory) is accepted too.
    for case in &cases {
        let reply = api
            .post(
                PROVIDERS,
                &vastai(&format!("p-{case}"), json!({"apiKeyFile": keys.path(case), "baseUrl": trap.url})),
            )
            .await;
        assert_eq!(reply.code, 201, "{case}: {:?}", reply.body);
    }
    let mut messages = BTreeMap::new();
    for case in &cases {
        let provider = eventually(&format!("p-{case} checked"), || async {
            let p = api.get(&format!("{PROVIDERS}/p-{case}")).await.body;
            p["status"]["message"].is_string().then_some(p)
        })
        .await;
        messages.insert(
            *case,
            (provider["status"]["state"].to_string(), provider["status"]["message"].to_string()),
        );
    }
    let distinct: std::collections::BTreeSet<_> = messages.values().collect();
    assert_eq!(distinct.len(), 1, "what the API shows differs by what is wrong with the file: {messages:#?}");
    let (state, message) = messages.values().next().unwrap();
    assert_eq!(state, "\"ConfigurationError\"");
    assert!(message.contains("not usable"), "{message}");
    // The detail is the operator's, in the daemon's log.
    let log = d.log();
    for reason in ["no such file", "is empty", "more than one line", "larger than", "not a regular file"] {
        assert!(log.contains(reason), "the log does not say {reason:?}:\n{log}");
    }
    assert!(trap.heads().is_empty(), "no usable key, so nothing is sent: {:?}", trap.heads());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_key_file_and_variable_still_reach_vastai_and_a_revoked_source_is_not_read() {
    let (stand, base) = Stand::start(offers()).await;
    let keys = Keys::new();
    let dir = keys.dir();
    std::fs::write(dir.join("vast.key"), format!("{KEY}\n")).unwrap();
    // A Kubernetes-style secret volume: links that stay inside the directory.
    std::fs::create_dir(dir.join("..2026_12_01")).unwrap();
    std::fs::write(dir.join("..2026_12_01").join("vast.key"), KEY).unwrap();
    std::os::unix::fs::symlink("..2026_12_01", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/vast.key", dir.join("linked.key")).unwrap();
    let key_dir = dir.display().to_string();
    let flags =
        ["--provider-key-dir", &key_dir, "--provider-key-env", ALLOWED_ENV, "--provider-base-url", &base];
    let mut d = Daemon::start_with_env(&flags, &[(ALLOWED_ENV, KEY)]);
    let api = d.client();
    let sources = [
        ("by-file", json!({"apiKeyFile": "vast.key", "baseUrl": base})),
        ("by-link", json!({"apiKeyFile": "linked.key", "baseUrl": base})),
        ("by-env", json!({"apiKeyEnv": ALLOWED_ENV, "baseUrl": base})),
    ];
    for (name, settings) in &sources {
        let reply = api.post(PROVIDERS, &vastai(name, settings.clone())).await;
        assert_eq!(reply.code, 201, "{name}: {:?}", reply.body);
    }
    for (name, _) in &sources {
        let state = eventually(&format!("{name} checked"), || async {
            let p = api.get(&format!("{PROVIDERS}/{name}")).await.body;
            p["status"]["state"].as_str().map(|s| (s.to_string(), p["status"]["message"].clone()))
        })
        .await;
        assert_eq!(state.0, "Ready", "{name}: {:?}", state.1);
        let out = ok(d.hive(&[
            "fleet",
            "offers",
            "--provider",
            name,
            "--gpu",
            "RTX 4090",
            "--max-price",
            "0.5",
            "--num-gpus",
            "1",
        ]));
        let ids: Vec<&str> = out.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
        assert_eq!(ids, ["101", "102"], "{name}: {out}");
    }
    assert!(stand.rentals().is_empty(), "searching leases nothing");
    let searches = stand.count("POST /api/v0/bundles/");
    assert_eq!(searches, 3);

    // Restarted without the variable and the directory allowed: the stored providers
    // are not read, and say what the operator must pass.
    d.restart_with(&["--provider-base-url", &base]);
    let api = d.client();
    let calls = stand.lock().requests.len();
    for (name, field, flag) in [
        ("by-file", "apiKeyFile", "--provider-key-dir"),
        ("by-env", "apiKeyEnv", &format!("--provider-key-env {ALLOWED_ENV}") as &str),
    ] {
        let message = eventually(&format!("{name} refused after the restart"), || async {
            let p = api.get(&format!("{PROVIDERS}/{name}")).await.body;
            let message = p["status"]["message"].as_str().unwrap_or_default().to_string();
            (p["status"]["state"] == "ConfigurationError" && message.contains(flag)).then_some(message)
        })
        .await;
        assert!(message.contains(field), "{name}: {message}");
    }
    assert_eq!(stand.lock().requests.len(), calls, "a source no longer allowed is never used");
    let err = fails(d.hive(&["fleet", "offers", "--provider", "by-env"]));
    assert!(err.contains("ConfigurationError"), "{err}");

    // The key appears in no response and no log line.
    let mut seen = api.get(PROVIDERS).await.body.to_string();
    seen += &d.log();
    assert!(!seen.contains(KEY), "the Vast.ai key leaked");
    assert!(!stand.lock().key_in_url);
}
