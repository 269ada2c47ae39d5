//! Operations (issue 15): the daemon's logs (`--log-format json` lines carry the request
//! id a client chose; a log file holds no colour codes) and the API audit log (every
//! mutation once, with who did it, its code and resourceVersion; never a token; rotated
//! by size; read back by `hive audit --api`).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::harness::{agent, eventually, ok, Api, Daemon, Reply};

/// Sends `method path` with `body` (a merge patch for PATCH) and the request id `id`.
async fn send_with_id(api: &Api, id: &str, method: &str, path: &str, body: Option<&Value>) -> Reply {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = api.http.request(method.clone(), format!("{}{}", api.base, path)).bearer_auth(api.token());
    req = req.header("x-request-id", id);
    if let Some(body) = body {
        let content_type = if method == reqwest::Method::PATCH {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        req = req.header("content-type", content_type).body(body.to_string());
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("{path}: {e:?}"));
    let code = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply { code, headers, body }
}

fn lines_of(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
}

fn audit_file(d: &Daemon) -> PathBuf {
    d.dir.join("audit.log")
}

/// `--log-format json`: every line the daemon logs parses as JSON, and the lines logged
/// while serving a request carry the id the client sent; every answer (an error too)
/// echoes it as `X-Request-Id` and `Audit-Id`, and an ill-formed id is replaced.
#[tokio::test]
async fn json_log_lines_carry_the_request_id_of_a_request() {
    let d = Daemon::start_with(&["--log-format", "json"]);
    let api = d.client();
    let created = send_with_id(
        &api,
        "it-log-1",
        "POST",
        "/hive/v1/tokens",
        Some(&json!({"name": "ops", "role": "operator"})),
    )
    .await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    for header in ["x-request-id", "audit-id"] {
        assert_eq!(created.headers[header], "it-log-1", "{header}");
    }
    let missing = send_with_id(&api, "it-log-2", "GET", "/apis/hive.dev/v1/agents/nope", None).await;
    assert_eq!((missing.code, missing.body["kind"].as_str()), (404, Some("Status")));
    assert_eq!(missing.headers["x-request-id"], "it-log-2", "an error Status carries the id too");
    let long = "x".repeat(65);
    let replaced = send_with_id(&api, &long, "GET", "/apis/hive.dev/v1/agents", None).await;
    let fresh = replaced.headers["x-request-id"].to_str().unwrap();
    assert!(fresh != long && fresh.len() == 36, "an ill-formed id is replaced by a UUID: {fresh}");
    assert_eq!(replaced.headers["audit-id"], fresh);

    let line = eventually("the token's log line with its request id", || async {
        d.log()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .find(|l| l["span"]["request_id"] == "it-log-1" && l["fields"]["message"] == "token created")
    })
    .await;
    assert_eq!(line["level"], "INFO");
    assert!(line["timestamp"].is_string(), "{line}");
    assert!(!d.log().contains(created.body["token"].as_str().unwrap()), "the token is never logged");
}

/// The default text format written to a file (the harness sends stderr to
/// `daemon.log`) has no ANSI escape codes.
#[tokio::test]
async fn a_log_file_has_no_escape_bytes() {
    let d = Daemon::start();
    assert_eq!(d.client().get("/apis/hive.dev/v1/agents").await.code, 200);
    let log = d.log();
    assert!(log.contains("hive is serving"), "{log}");
    assert!(!log.contains('\u{1b}'), "ESC in a log file:\n{log}");
}

/// What one request of the scenario expects to find in the audit log.
struct Expect {
    id: &'static str,
    user: &'static str,
    role: &'static str,
    verb: &'static str,
    resource: &'static str,
    name: Option<&'static str>,
    subresource: Option<&'static str>,
    code: u16,
    /// The resourceVersion the response carried, if any.
    rv: Option<String>,
}

/// A scenario of mutations by an admin and an operator (tokens made with `hive token
/// create`), one refused (403) and one invalid (422): each is in the audit log exactly
/// once with who did it, its code and the resulting resourceVersion; reads are not; no
/// token appears anywhere in the file; `hive audit --api --user` filters.
#[tokio::test]
async fn every_mutation_is_audited_once_with_who_did_it_and_no_token() {
    let d = Daemon::start();
    let boss_token = ok(d.hive(&["token", "create", "--name", "boss", "--role", "admin"])).trim().to_string();
    let ops_token =
        ok(d.hive(&["token", "create", "--name", "ops", "--role", "operator"])).trim().to_string();
    let boss = d.client_with(Some(&boss_token));
    let ops = d.client_with(Some(&ops_token));
    let rv = |r: &Reply| r.body["metadata"]["resourceVersion"].as_str().map(str::to_string);
    let mut expected = Vec::new();

    let created =
        send_with_id(&ops, "s-create", "POST", "/apis/hive.dev/v1/agents", Some(&agent("a1"))).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    expected.push(Expect {
        id: "s-create",
        user: "ops",
        role: "operator",
        verb: "create",
        resource: "agents",
        name: Some("a1"),
        subresource: None,
        code: 201,
        rv: rv(&created),
    });
    let patched = send_with_id(
        &ops,
        "s-patch",
        "PATCH",
        "/apis/hive.dev/v1/agents/a1",
        Some(&json!({"metadata": {"labels": {"team": "blue"}}})),
    )
    .await;
    assert_eq!(patched.code, 200, "{:?}", patched.body);
    expected.push(Expect {
        id: "s-patch",
        user: "ops",
        role: "operator",
        verb: "patch",
        resource: "agents",
        name: Some("a1"),
        subresource: None,
        code: 200,
        rv: rv(&patched),
    });
    let mut invalid = agent("a2");
    invalid["spec"]["resources"] = json!({"memoryMax": "lots"});
    let refused_invalid =
        send_with_id(&ops, "s-invalid", "POST", "/apis/hive.dev/v1/agents", Some(&invalid)).await;
    assert_eq!(refused_invalid.code, 422, "{:?}", refused_invalid.body);
    expected.push(Expect {
        id: "s-invalid",
        user: "ops",
        role: "operator",
        verb: "create",
        resource: "agents",
        name: Some("a2"),
        subresource: None,
        code: 422,
        rv: None,
    });
    let forbidden = send_with_id(
        &ops,
        "s-forbidden",
        "POST",
        "/hive/v1/tokens",
        Some(&json!({"name": "sneaky", "role": "admin"})),
    )
    .await;
    assert_eq!(forbidden.code, 403, "{:?}", forbidden.body);
    expected.push(Expect {
        id: "s-forbidden",
        user: "ops",
        role: "operator",
        verb: "create",
        resource: "tokens",
        name: None,
        subresource: None,
        code: 403,
        rv: None,
    });
    let read = send_with_id(&ops, "s-read", "GET", "/apis/hive.dev/v1/agents/a1", None).await;
    assert_eq!(read.code, 200);

    let minted = send_with_id(
        &boss,
        "s-token",
        "POST",
        "/hive/v1/tokens",
        Some(&json!({"name": "viewer1", "role": "viewer"})),
    )
    .await;
    assert_eq!(minted.code, 201, "{:?}", minted.body);
    let viewer_token = minted.body["token"].as_str().unwrap().to_string();
    expected.push(Expect {
        id: "s-token",
        user: "boss",
        role: "admin",
        verb: "create",
        resource: "tokens",
        name: Some("viewer1"),
        subresource: None,
        code: 201,
        rv: None,
    });
    let status = send_with_id(
        &boss,
        "s-status",
        "PATCH",
        "/apis/hive.dev/v1/agents/a1/status",
        Some(&json!({"status": {}})),
    )
    .await;
    assert_eq!(status.code, 200, "{:?}", status.body);
    expected.push(Expect {
        id: "s-status",
        user: "boss",
        role: "admin",
        verb: "patch",
        resource: "agents",
        name: Some("a1"),
        subresource: Some("status"),
        code: 200,
        rv: rv(&status),
    });
    let deleted = send_with_id(&boss, "s-delete", "DELETE", "/apis/hive.dev/v1/agents/a1", None).await;
    assert_eq!(deleted.code, 200, "{:?}", deleted.body);
    expected.push(Expect {
        id: "s-delete",
        user: "boss",
        role: "admin",
        verb: "delete",
        resource: "agents",
        name: Some("a1"),
        subresource: None,
        code: 200,
        rv: rv(&deleted),
    });
    let revoked = send_with_id(&boss, "s-revoke", "DELETE", "/hive/v1/tokens/viewer1", None).await;
    assert!(revoked.code < 300, "{:?}", revoked.body);
    expected.push(Expect {
        id: "s-revoke",
        user: "boss",
        role: "admin",
        verb: "delete",
        resource: "tokens",
        name: Some("viewer1"),
        subresource: None,
        code: revoked.code,
        rv: None,
    });

    let path = audit_file(&d);
    let lines = eventually("every mutation in the audit log", || async {
        let lines = lines_of(&path);
        lines.iter().any(|l| l["requestId"] == "s-revoke").then_some(lines)
    })
    .await;
    for e in &expected {
        let found: Vec<&Value> = lines.iter().filter(|l| l["requestId"] == e.id).collect();
        assert_eq!(found.len(), 1, "{} is in the log once: {lines:#?}", e.id);
        let l = found[0];
        let want = json!({
            "user": e.user, "role": e.role, "verb": e.verb, "resource": e.resource, "name": e.name,
            "subresource": e.subresource, "code": e.code, "resourceVersion": e.rv,
        });
        for (field, value) in want.as_object().unwrap() {
            assert_eq!(&l[field], value, "{}: {field} in {l}", e.id);
        }
        assert!(l["sourceAddress"].as_str().unwrap().starts_with("127.0.0.1:"), "{l}");
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
    }
    assert!(expected.iter().filter(|e| e.rv.is_some()).count() >= 3, "resourceVersions were compared");
    assert!(!lines.iter().any(|l| l["requestId"] == "s-read"), "reads are not recorded by default");
    // The CLI's own token creates are mutations too, by the kubeconfig's admin.
    for name in ["boss", "ops"] {
        let by_cli =
            lines.iter().filter(|l| l["resource"] == "tokens" && l["name"] == name && l["code"] == 201);
        assert_eq!(by_cli.count(), 1, "hive token create {name}");
    }
    let text = std::fs::read_to_string(&path).unwrap();
    for (what, token) in
        [("admin", &d.token), ("boss", &boss_token), ("ops", &ops_token), ("viewer1", &viewer_token)]
    {
        assert!(!token.is_empty() && !text.contains(token.as_str()), "the {what} token is in the audit log");
    }
    assert!(!text.contains("hive_"), "no token-shaped string in the audit log:\n{text}");

    // `hive audit --api --user ops` shows ops's four mutations and nothing else.
    let file = path.to_str().unwrap();
    let shown: Value =
        serde_json::from_str(&ok(d.hive(&["audit", "--api", "--file", file, "--user", "ops", "-o", "json"])))
            .unwrap();
    let ids: Vec<&str> =
        shown["items"].as_array().unwrap().iter().map(|l| l["requestId"].as_str().unwrap()).collect();
    assert_eq!(ids, ["s-create", "s-patch", "s-invalid", "s-forbidden"]);
    let table = ok(d.hive(&["audit", "--api", "--file", file, "--user", "boss", "--since", "1h"]));
    assert!(
        table.starts_with("TIME") && table.contains("s-delete") && table.contains("agents/status"),
        "{table}"
    );
    assert!(!table.contains("s-create"), "{table}");
}

/// `--audit-reads` records reads too, with their kube verbs.
#[tokio::test]
async fn reads_are_recorded_when_asked() {
    let d = Daemon::start_with(&["--audit-reads"]);
    let api = d.client();
    assert_eq!(send_with_id(&api, "r-list", "GET", "/apis/hive.dev/v1/agents", None).await.code, 200);
    assert_eq!(send_with_id(&api, "r-get", "GET", "/apis/hive.dev/v1/agents/none", None).await.code, 404);
    let path = audit_file(&d);
    let lines = eventually("the reads in the audit log", || async {
        let lines = lines_of(&path);
        lines.iter().any(|l| l["requestId"] == "r-get").then_some(lines)
    })
    .await;
    let verb = |id: &str| {
        lines.iter().find(|l| l["requestId"] == id).map(|l| (l["verb"].clone(), l["code"].clone()))
    };
    assert_eq!(verb("r-list"), Some((json!("list"), json!(200))));
    assert_eq!(verb("r-get"), Some((json!("get"), json!(404))));
}

/// With a tiny `--audit-log-max-size` the log rotates: `audit.log`, `.1` and `.2` each
/// stay under the size, no `.3` is kept, and `hive audit --api` reads across them,
/// oldest first, ending with the newest write.
#[tokio::test]
async fn the_audit_log_rotates_by_size() {
    let d = Daemon::start_with(&["--audit-log-max-size", "2K", "--audit-log-max-backups", "2"]);
    let api = d.client();
    for n in 0..40 {
        let reply = api.post("/apis/hive.dev/v1/agents", &agent(&format!("r{n}"))).await;
        assert_eq!(reply.code, 201, "{:?}", reply.body);
    }
    let path = audit_file(&d);
    eventually("the last create in the audit log", || async {
        lines_of(&path).iter().any(|l| l["name"] == "r39").then_some(())
    })
    .await;
    let backups = [
        path.clone(),
        PathBuf::from(format!("{}.1", path.display())),
        PathBuf::from(format!("{}.2", path.display())),
    ];
    for file in &backups {
        let len = std::fs::metadata(file).unwrap_or_else(|e| panic!("{}: {e}", file.display())).len();
        assert!(len > 0 && len <= 2048, "{} is {len} bytes", file.display());
    }
    assert!(!Path::new(&format!("{}.3", path.display())).exists(), "only two backups are kept");
    let kept: usize = backups.iter().map(|f| lines_of(f).len()).sum();
    let shown: Value = serde_json::from_str(&ok(d.hive(&[
        "audit",
        "--api",
        "--file",
        path.to_str().unwrap(),
        "--limit",
        "1000",
        "-o",
        "json",
    ])))
    .unwrap();
    let names: Vec<&str> =
        shown["items"].as_array().unwrap().iter().filter_map(|l| l["name"].as_str()).collect();
    assert_eq!(names.len(), kept, "every kept entry is shown");
    assert!(kept < 40, "older entries were rotated away");
    let mut sorted: Vec<u32> = names.iter().map(|n| n[1..].parse().unwrap()).collect();
    assert_eq!(sorted.last(), Some(&39), "newest last");
    let before = sorted.clone();
    sorted.sort_unstable();
    assert_eq!(before, sorted, "oldest first, across the backups");
}

/// A graceful stop (SIGTERM) writes and fsyncs every entry already queued before the
/// daemon exits: a burst of concurrent creates answered just before the stop is in the
/// file afterwards, each once, and the daemon did not warn of entries left behind.
#[tokio::test]
async fn a_graceful_stop_writes_every_queued_entry() {
    let mut d = Daemon::start();
    let api = d.client();
    let names: Vec<String> = (0..300).map(|n| format!("stop{n}")).collect();
    let bodies: Vec<Value> = names.iter().map(|n| agent(n)).collect();
    let replies =
        futures_util::future::join_all(bodies.iter().map(|b| api.post("/apis/hive.dev/v1/agents", b))).await;
    for (name, reply) in names.iter().zip(&replies) {
        assert_eq!(reply.code, 201, "{name}: {:?}", reply.body);
    }
    d.stop();
    let lines = lines_of(&audit_file(&d));
    for name in &names {
        let found: Vec<&Value> = lines.iter().filter(|l| l["name"] == name.as_str()).collect();
        assert_eq!(found.len(), 1, "{name} once in the audit log after the stop");
        assert_eq!((found[0]["verb"].as_str(), found[0]["code"].as_u64()), (Some("create"), Some(201)));
        assert!(found[0]["resourceVersion"].is_string(), "{}", found[0]);
    }
    let log = d.log();
    assert!(!log.contains("audit log: shutting down before"), "{log}");
}
