//! Bad input through the real daemon: whatever a request holds, the answer is a 4xx
//! `Status` naming the field, bounded in size, and nothing is written.

use serde_json::{json, Map, Value};

use crate::harness::{agent, Daemon, Reply};

const JOBS: &str = "/apis/hive.dev/v1/jobs";
const AGENTS: &str = "/apis/hive.dev/v1/agents";

/// How many causes one refusal lists, and the one more that counts the rest.
const MAX_CAUSES: usize = 50;

/// An error body this size holds 51 causes of a few hundred bytes each, twice (the
/// causes and the message that sums them up); thousands of causes are megabytes.
const MAX_ERROR_BYTES: usize = 128 * 1024;

fn body_len(reply: &Reply) -> usize {
    reply.body.to_string().len()
}

fn causes(reply: &Reply) -> &[Value] {
    reply.body["details"]["causes"].as_array().map_or(&[], Vec::as_slice)
}

/// The last cause counts what the list leaves out, at the first field it leaves out.
fn assert_bounded(reply: &Reply, found: usize, first_omitted: &str) {
    let causes = causes(reply);
    assert_eq!(causes.len(), MAX_CAUSES + 1, "{} causes", causes.len());
    let last = &causes[MAX_CAUSES];
    assert_eq!(last["field"], first_omitted, "{last}");
    let more = found - MAX_CAUSES;
    let message = last["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("{more} more")), "{last}");
    let size = body_len(reply);
    assert!(size < MAX_ERROR_BYTES, "the error is {size} bytes");
    let summary = reply.body["message"].as_str().unwrap_or_default();
    assert!(summary.contains(&format!("{more} more")), "{summary:.300}");
}

/// A Job of 5,000 nodes whose ids are all bad used to list 5,000 causes (and 5,000
/// more for their agents); a refusal lists 50 and counts the rest.
#[tokio::test]
async fn a_job_with_5000_bad_node_ids_lists_a_bounded_number_of_causes() {
    let d = Daemon::start();
    let api = d.client();
    let nodes: Vec<Value> = (0..5000)
        .map(|i| json!({"id": format!("bad id {i}"), "kind": "Reconcile", "agent": "Not_An_Agent"}))
        .collect();
    let job = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "many-bad"},
                     "spec": {"template": "Rebuild", "reason": "fuzz", "source": "Cli", "nodes": nodes}});
    for path in [format!("{JOBS}?dryRun=All"), JOBS.to_string()] {
        let reply = api.post(&path, &job).await;
        assert_eq!(reply.code, 422, "{path}: {:.500}", reply.body.to_string());
        assert_eq!(causes(&reply)[0]["field"], "spec.nodes[0].id");
        // Two problems per node (its id, then after every id its agent).
        assert_bounded(&reply, 10_000, "spec.nodes[50].id");
    }
    let list = api.get(JOBS).await;
    assert_eq!(list.body["items"], json!([]), "nothing was stored");
}

/// Unknown fields: `Strict` names each in the message, `Warn` sends one `Warning` header
/// each. 3,000 of them made a 102 KB message and 3,000 headers, more than a client reads
/// (reqwest gives up on the response).
#[tokio::test]
async fn thousands_of_unknown_fields_are_a_bounded_refusal_and_bounded_warnings() {
    let d = Daemon::start();
    let api = d.client();
    let mut body = agent("unknowns");
    let extra: Map<String, Value> = (0..3000).map(|i| (format!("unknown{i:04}"), json!(1))).collect();
    body["spec"].as_object_mut().unwrap().extend(extra);

    let strict = api.post(&format!("{AGENTS}?fieldValidation=Strict"), &body).await;
    assert_eq!(strict.code, 400, "{:.300}", strict.body.to_string());
    let message = strict.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("unknown field \"spec.unknown0000\""), "{message:.300}");
    assert!(message.contains("2950 more"), "{message:.300}");
    assert!(body_len(&strict) < MAX_ERROR_BYTES, "the error is {} bytes", body_len(&strict));
    assert_eq!(api.get(&format!("{AGENTS}/unknowns")).await.code, 404, "nothing was stored");

    let warned = api.post(AGENTS, &body).await;
    assert_eq!(warned.code, 201, "{:.300}", warned.body.to_string());
    let warnings: Vec<&str> =
        warned.headers.get_all("warning").iter().filter_map(|v| v.to_str().ok()).collect();
    assert_eq!(warnings.len(), MAX_CAUSES + 1, "{} warnings", warnings.len());
    assert!(warnings[0].contains("unknown field \\\"spec.unknown0000\\\""), "{}", warnings[0]);
    assert!(warnings[MAX_CAUSES].contains("2950 more"), "{}", warnings[MAX_CAUSES]);
}

/// A server-side apply that conflicts on 3,000 fields lists 50 and counts the rest, in
/// its causes and in its message.
#[tokio::test]
async fn an_apply_with_thousands_of_conflicts_lists_a_bounded_number() {
    let d = Daemon::start();
    let api = d.client();
    let path = format!("{AGENTS}/conflicts");
    let labelled = |value: &str| {
        let mut manifest = agent("conflicts");
        let labels: Map<String, Value> = (0..3000).map(|i| (format!("l{i:04}"), json!(value))).collect();
        manifest["metadata"]["labels"] = Value::Object(labels);
        manifest.to_string()
    };
    let apply = |manager: &str, manifest: String| {
        let (api, path) = (api.clone(), format!("{path}?fieldManager={manager}"));
        async move { api.send("PATCH", &path, "application/apply-patch+yaml", Some(manifest)).await }
    };
    let first = apply("alice", labelled("a")).await;
    assert_eq!(first.code, 201, "{:.300}", first.body.to_string());
    let conflict = apply("bob", labelled("b")).await;
    assert_eq!(conflict.code, 409, "{:.300}", conflict.body.to_string());
    assert_eq!(causes(&conflict)[0]["field"], ".metadata.labels.l0000");
    assert_bounded(&conflict, 3000, ".metadata.labels.l0050");
}

/// Found by schemathesis: a list ignored its watch-only flags, so `allowWatchBookmarks=-1`
/// or `sendInitialEvents=<garbage>` was a 200 (a watch refused them). Every parameter is
/// checked on every request that carries it, and a bad value is a 400 naming it.
#[tokio::test]
async fn a_bad_query_parameter_is_a_400_naming_it_whatever_the_route() {
    let d = Daemon::start();
    let api = d.client();
    let created = api.post(AGENTS, &agent("params")).await;
    assert_eq!(created.code, 201, "{}", created.body);
    let item = format!("{AGENTS}/params");
    let cases = [
        (format!("{AGENTS}?allowWatchBookmarks=-1"), "allowWatchBookmarks"),
        (format!("{AGENTS}?sendInitialEvents=maybe"), "sendInitialEvents"),
        (format!("{AGENTS}?timeoutSeconds=soon"), "timeoutSeconds"),
        (format!("{AGENTS}?resourceVersionMatch=Newest"), "resourceVersionMatch"),
        (format!("{item}?includeObject=Everything"), "includeObject"),
        (format!("{item}?force=perhaps"), "force"),
    ];
    for (path, param) in cases {
        let reply = api.get(&path).await;
        assert_eq!(reply.code, 400, "{path}: {}", reply.body);
        let message = reply.body["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(&format!("{param}: ")), "{path}: {message}");
    }
    for good in [
        format!(
            "{AGENTS}?allowWatchBookmarks=false&sendInitialEvents=false&resourceVersionMatch=NotOlderThan"
        ),
        format!("{item}?includeObject=Object"),
    ] {
        assert_eq!(api.get(&good).await.code, 200, "{good}");
    }
}

/// Sends `head` and then all of `body` over one TLS connection before reading anything,
/// as Python's `requests` (schemathesis) and many other clients do, and returns what
/// came back, or how the connection failed.
async fn send_whole_then_read(d: &Daemon, head: &str, body: &[u8]) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut d.ca_pem.as_slice()) {
        roots.add(cert.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let addr = d.url.trim_start_matches("https://").to_string();
    let tcp = tokio::net::TcpStream::connect(&addr).await.map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let work = async {
        tls.write_all(head.as_bytes()).await.map_err(|e| format!("writing the head: {e}"))?;
        tls.write_all(body).await.map_err(|e| format!("writing the body: {e}"))?;
        tls.flush().await.map_err(|e| format!("flushing: {e}"))?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match tls.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e) if answer.is_empty() => return Err(format!("reading the answer: {e}")),
                Err(_) => break,
            }
            if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), work)
        .await
        .map_err(|_| "timed out".to_string())?
}

/// Found by schemathesis (an `SSLEOFError` on `PATCH …?force=null&force=null`): an answer
/// given before the handler read the body (a bad query parameter, a role that may not
/// write, an unknown path) dropped the unread body with the connection, so a client still
/// sending it got a reset instead of the 4xx. The body is now read and discarded first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_refusal_reaches_a_client_that_sends_its_whole_body_first() {
    let d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post(AGENTS, &agent("early")).await.code, 201);
    let viewer = {
        let out = d.hive(&["token", "create", "--name", "vera", "--role", "viewer"]);
        crate::harness::ok(out).trim().to_string()
    };
    // 2 MiB: under the body limit, well over what socket buffers hold.
    let patch = json!({"metadata": {"annotations": {"big": "x".repeat(2 << 20)}}}).to_string();
    let cases = [
        ("PATCH", "/apis/hive.dev/v1/agents/early?force=perhaps", d.token.as_str(), "400"),
        ("PATCH", "/apis/hive.dev/v1/agents/early?limit=1&limit=2", d.token.as_str(), "400"),
        ("PATCH", "/apis/hive.dev/v1/agents/early", viewer.as_str(), "403"),
        ("POST", "/apis/hive.dev/v1/nosuchkind", d.token.as_str(), "404"),
    ];
    for (method, path, token, code) in cases {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/merge-patch+json\r\nContent-Length: {}\r\n\r\n",
            patch.len()
        );
        let answer = send_whole_then_read(&d, &head, patch.as_bytes()).await;
        let answer = answer.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert!(answer.starts_with(&format!("HTTP/1.1 {code} ")), "{method} {path}: {answer:.200}");
    }
    let object = api.get(&format!("{AGENTS}/early")).await;
    assert!(object.body["metadata"]["annotations"].get("big").is_none(), "nothing was written");
}

/// Issue 28 item 8: a NUL byte in `spec.config.dir` was stored (and would reach a path
/// the runtime opens); so would a control character in a command's later arguments.
/// Each is a 422 naming its field, and nothing is stored.
#[tokio::test]
async fn control_characters_in_an_agents_paths_and_arguments_are_refused_naming_the_field() {
    let d = Daemon::start();
    let api = d.client();
    let cases = [
        ("dir", "/spec/config/dir", json!("agents/a\u{0}b"), "spec.config.dir"),
        (
            "arg",
            "/spec/runtime/process/command",
            json!(["sh", "run\u{1b}]0;x\u{7}.sh"]),
            "spec.runtime.process.command[1]",
        ),
    ];
    for (name, pointer, value, field) in cases {
        let mut body = agent(name);
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        body.pointer_mut(parent).unwrap()[key] = value;
        let reply = api.post("/apis/hive.dev/v1/agents", &body).await;
        assert_eq!(reply.code, 422, "{name}: {:?}", reply.body);
        let fields: Vec<&str> = causes(&reply).iter().filter_map(|c| c["field"].as_str()).collect();
        assert_eq!(fields, [field], "{name}: {:?}", reply.body);
        assert_eq!(api.get(&format!("/apis/hive.dev/v1/agents/{name}")).await.code, 404, "nothing stored");
    }
}

/// An agent body whose text gives `metadata.labels.app` twice (`demo`, then `twice`) and
/// `spec.config.rev` twice (`main`, then `v2`).
fn agent_with_keys_twice(name: &str) -> String {
    let text = agent(name).to_string();
    let twice = text
        .replacen(r#""labels":{"app":"demo"}"#, r#""labels":{"app":"demo","app":"twice"}"#, 1)
        .replacen(r#""rev":"main""#, r#""rev":"main","rev":"v2""#, 1);
    assert_eq!(twice.len(), text.len() + r#","app":"twice","rev":"v2""#.len(), "{text}");
    twice
}

/// The same agent as block YAML, `app` and `rev` each given twice.
fn agent_yaml_with_keys_twice(name: &str) -> String {
    format!(
        "apiVersion: hive.dev/v1\nkind: Agent\nmetadata:\n  name: {name}\n  labels:\n    app: demo\n    app: twice\n\
         spec:\n  config:\n    repo: https://git.example.invalid/agents/{name}.git\n    rev: main\n    rev: v2\n\
         \x20 runtime:\n    type: process\n    process:\n      command: [./run.sh]\n"
    )
}

fn warnings(reply: &Reply) -> Vec<String> {
    reply.headers.get_all("warning").iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect()
}

const TWICE: [&str; 2] = ["metadata.labels.app", "spec.config.rev"];

/// Refused under `Strict`: a 400 that names each field given twice, nothing stored.
fn assert_refused_naming_both(what: &str, reply: &Reply) {
    assert_eq!(reply.code, 400, "{what}: {}", reply.body);
    assert_eq!(reply.body["reason"], "BadRequest", "{what}: {}", reply.body);
    let message = reply.body["message"].as_str().unwrap_or_default();
    for field in TWICE {
        assert!(message.contains(&format!("duplicate field \"{field}\"")), "{what}: {message}");
    }
}

/// Taken under `Warn`: the last value kept, one `Warning` per field given twice.
fn assert_warned_about_both(what: &str, reply: &Reply) {
    assert!(matches!(reply.code, 200 | 201), "{what}: {}", reply.body);
    assert_eq!(reply.body["metadata"]["labels"]["app"], "twice", "{what}: the last value wins");
    assert_eq!(reply.body["spec"]["config"]["rev"], "v2", "{what}: the last value wins");
    let warnings = warnings(reply);
    assert_eq!(
        warnings,
        TWICE.map(|f| format!("299 - \"duplicate field \\\"{f}\\\"\"")),
        "{what}: {warnings:?}"
    );
}

/// Issue 28 item 8: a key given twice in a JSON or YAML body was taken silently, the last
/// one winning. As kube-apiserver: `fieldValidation=Strict` refuses it with a 400 naming
/// the field, `Warn` (the default) keeps the last and says so in a `Warning`, `Ignore`
/// says nothing — on create, replace, merge patch and apply; a JSON patch's operations
/// are checked the same way.
#[tokio::test]
async fn a_key_given_twice_is_refused_under_strict_and_warned_about_otherwise() {
    let d = Daemon::start();
    let api = d.client();
    let strict = "fieldValidation=Strict";

    // Create, JSON and YAML.
    for (what, media, body) in [
        ("json", "application/json", agent_with_keys_twice("twice-json")),
        ("yaml", "application/yaml", agent_yaml_with_keys_twice("twice-yaml")),
    ] {
        let name = format!("twice-{what}");
        let refused = api.send("POST", &format!("{AGENTS}?{strict}"), media, Some(body.clone())).await;
        assert_refused_naming_both(&format!("create {what} Strict"), &refused);
        assert_eq!(api.get(&format!("{AGENTS}/{name}")).await.code, 404, "{what}: nothing stored");
        let ignored = api
            .send("POST", &format!("{AGENTS}?fieldValidation=Ignore&dryRun=All"), media, Some(body.clone()))
            .await;
        assert_eq!(ignored.code, 201, "create {what} Ignore: {}", ignored.body);
        assert_eq!(warnings(&ignored), Vec::<String>::new(), "create {what} Ignore");
        let warned = api.send("POST", AGENTS, media, Some(body.clone())).await;
        assert_warned_about_both(&format!("create {what} (Warn by default)"), &warned);
    }

    // Replace.
    let item = format!("{AGENTS}/twice-json");
    let body = agent_with_keys_twice("twice-json");
    let refused = api.send("PUT", &format!("{item}?{strict}"), "application/json", Some(body.clone())).await;
    assert_refused_naming_both("replace Strict", &refused);
    let warned =
        api.send("PUT", &format!("{item}?fieldValidation=Warn"), "application/json", Some(body)).await;
    assert_warned_about_both("replace Warn", &warned);

    // Merge patch and apply: the patch, and the applied manifest, are bodies too.
    let merge =
        r#"{"metadata":{"labels":{"app":"demo","app":"twice"}},"spec":{"config":{"rev":"main","rev":"v2"}}}"#;
    let refused = api
        .send("PATCH", &format!("{item}?{strict}"), "application/merge-patch+json", Some(merge.into()))
        .await;
    assert_refused_naming_both("merge patch Strict", &refused);
    let warned = api.send("PATCH", &item, "application/merge-patch+json", Some(merge.into())).await;
    assert_warned_about_both("merge patch Warn", &warned);
    let apply = format!("{item}?fieldManager=dup&force=true");
    let manifest = agent_yaml_with_keys_twice("twice-json");
    let refused = api
        .send("PATCH", &format!("{apply}&{strict}"), "application/apply-patch+yaml", Some(manifest.clone()))
        .await;
    assert_refused_naming_both("apply Strict", &refused);
    let warned = api.send("PATCH", &apply, "application/apply-patch+yaml", Some(manifest)).await;
    assert_warned_about_both("apply Warn", &warned);

    // A JSON patch operation that gives `value` twice.
    let ops = r#"[{"op":"replace","path":"/spec/config/rev","value":"main","value":"v3"}]"#;
    let refused =
        api.send("PATCH", &format!("{item}?{strict}"), "application/json-patch+json", Some(ops.into())).await;
    assert_eq!(refused.code, 400, "{}", refused.body);
    let message = refused.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("json patch") && message.contains("duplicate field \"[0].value\""), "{message}");
    let warned = api.send("PATCH", &item, "application/json-patch+json", Some(ops.into())).await;
    assert_eq!(warned.code, 200, "{}", warned.body);
    assert_eq!(warned.body["spec"]["config"]["rev"], "v3");
    assert_eq!(warnings(&warned), ["299 - \"json patch duplicate field \\\"[0].value\\\"\""]);

    // Nothing else is touched by a refusal.
    let stored = api.get(&item).await;
    assert_eq!(stored.body["spec"]["config"]["rev"], "v3", "{}", stored.body);
}

/// A body of 100,000 keys each given twice, and one whose duplicate sits under a deep path
/// of long keys: the refusal and the warnings list 50 fields and count the rest, the
/// field paths they name are cut short, and neither takes long.
#[tokio::test]
async fn a_body_of_many_keys_given_twice_is_a_bounded_refusal_and_bounded_warnings() {
    let d = Daemon::start();
    let api = d.client();
    // Under an unknown field, so that only the keys given twice are at stake.
    let mut extra = String::new();
    for i in 0..100_000 {
        extra.push_str(&format!("\"l{i}\":\"a\",\"l{i}\":\"b\","));
    }
    let text = agent("many-twice").to_string();
    let body = text.replacen(r#""rev":"main""#, &format!("\"rev\":\"main\",\"extra\":{{{extra}\"z\":1}}"), 1);
    assert!(body.len() < 3 << 20, "{} bytes: within the body limit", body.len());
    let started = std::time::Instant::now();
    let strict = format!("{AGENTS}?fieldValidation=Strict");
    let refused = api.send("POST", &strict, "application/json", Some(body.clone())).await;
    assert_eq!(refused.code, 400, "{:.300}", refused.body.to_string());
    let message = refused.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("duplicate field \"spec.config.extra.l0\""), "{message:.300}");
    assert!(message.contains("99950 more"), "{message:.300}");
    assert!(message.contains("unknown field \"spec.config.extra\""), "{message:.300}");
    assert!(body_len(&refused) < MAX_ERROR_BYTES, "the error is {} bytes", body_len(&refused));

    let warned = api.send("POST", &format!("{AGENTS}?dryRun=All"), "application/json", Some(body)).await;
    assert_eq!(warned.code, 201, "{:.300}", warned.body.to_string());
    let warned_about = warnings(&warned);
    assert_eq!(warned_about.len(), MAX_CAUSES + 2, "{warned_about:?}");
    assert!(warned_about[MAX_CAUSES].contains("99950 more"), "{}", warned_about[MAX_CAUSES]);
    assert!(warned_about[MAX_CAUSES + 1].contains("unknown field"), "{}", warned_about[MAX_CAUSES + 1]);

    // 100 levels of 20 KiB keys, and a key given twice at the bottom: the path named is cut.
    let key = "k".repeat(20 << 10);
    let mut deep = String::from("\"x\":1,\"x\":2");
    for _ in 0..100 {
        deep = format!("\"{key}\":{{{deep}}}");
    }
    let body = text.replacen(r#""rev":"main""#, &format!("\"rev\":\"main\",\"extra\":{{{deep}}}"), 1);
    let refused = api.send("POST", &strict, "application/json", Some(body)).await;
    assert_eq!(refused.code, 400, "{:.300}", refused.body.to_string());
    let message = refused.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("duplicate field \"spec.config.extra.kkk"), "{message:.300}");
    assert!(body_len(&refused) < 16 << 10, "the error is {} bytes", body_len(&refused));
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "took {:?}", started.elapsed());
}

/// 100,000 nested YAML flow mappings (half a megabyte) kept the YAML parser busy for over
/// a minute of CPU before the 400: libyaml reads the whole document before anything
/// counts its depth, and its scanner looks at every open flow level for every token. The
/// body is now refused at once, naming the bound.
#[tokio::test]
async fn a_yaml_body_nested_a_hundred_thousand_deep_is_refused_at_once() {
    let d = Daemon::start();
    let api = d.client();
    let depth = 100_000;
    let body = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
    let started = std::time::Instant::now();
    let reply = api.send("POST", AGENTS, "application/yaml", Some(body)).await;
    let took = started.elapsed();
    assert_eq!(reply.code, 400, "{:.300}", reply.body.to_string());
    let message = reply.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("nested more than 128 deep"), "{message}");
    assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
}
