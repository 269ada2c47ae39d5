//! Issue 28, item 3: no token grows the daemon without bound. An agent token may keep at
//! most 16 approvals undecided; free text a client writes (an Approval's summary and
//! decision reason, a Job's reason) holds at most 4 KiB; no object a write would store
//! may take more than 1.5 MiB as JSON (etcd's default request limit), whether created
//! whole or grown by a patch. Each refusal names its limit and changes nothing.

use serde_json::{json, Value};

use crate::harness::{ok, Daemon};

fn approval(name: &str, summary: &str) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": name},
           "spec": {"kind": "ApplyCommit", "target": "alpha", "summary": summary,
                    "payload": {"commit": "0123456789abcdef0123456789abcdef01234567"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_token_keeps_at_most_sixteen_approvals_undecided() {
    let d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &crate::harness::agent("alpha")).await.code, 201);
    let token =
        ok(d.hive(&["token", "create", "--name", "alpha-token", "--role", "agent", "--agent", "alpha"]));
    let agent = d.client_with(Some(token.trim()));
    for i in 0..16 {
        let created = agent.post("/apis/hive.dev/v1/approvals", &approval(&format!("a-{i}"), "change")).await;
        assert_eq!(created.code, 201, "{}", created.body);
    }
    let refused = agent.post("/apis/hive.dev/v1/approvals", &approval("a-16", "one too many")).await;
    assert_eq!(refused.code, 403, "{}", refused.body);
    let message = refused.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("exceeded quota") && message.contains("16"), "{message}");
    assert_eq!(api.get("/apis/hive.dev/v1/approvals/a-16").await.code, 404, "nothing was stored");

    // A decision frees a place; operators are not bound by the agent's quota.
    ok(d.hive(&["deny", "a-0", "--reason", "no"]));
    let created = agent.post("/apis/hive.dev/v1/approvals", &approval("a-16", "now there is room")).await;
    assert_eq!(created.code, 201, "{}", created.body);
    let by_admin = api.post("/apis/hive.dev/v1/approvals", &approval("by-admin", "an operator's")).await;
    assert_eq!(by_admin.code, 201, "{}", by_admin.body);
    assert_eq!(refusals(&d, "pending_approvals").await, 1, "/metrics counts the refusal");
}

/// `hive_limit_refusals_total{limit}` on the daemon's `/metrics`.
async fn refusals(d: &Daemon, limit: &str) -> u64 {
    let text = d.client().get("/metrics").await.body.as_str().unwrap_or_default().to_string();
    let line = format!("hive_limit_refusals_total{{limit=\"{limit}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&line)?.parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_text_and_whole_objects_are_bounded() {
    let d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &crate::harness::agent("alpha")).await.code, 201);

    // 4 KiB of summary is fine, one byte more is a 422 naming the field.
    let fits = api.post("/apis/hive.dev/v1/approvals", &approval("fits", &"s".repeat(4096))).await;
    assert_eq!(fits.code, 201, "{}", fits.body);
    let long = api.post("/apis/hive.dev/v1/approvals", &approval("long", &"s".repeat(4097))).await;
    assert_eq!(long.code, 422, "{}", long.body);
    assert_eq!(long.body["details"]["causes"][0]["field"], "spec.summary", "{}", long.body);
    assert_eq!(long.body["details"]["causes"][0]["reason"], "FieldValueTooLong", "{}", long.body);
    let reason = json!({"spec": {"decision": {"state": "Denied", "reason": "r".repeat(5000)}}});
    let denied = api.patch("/apis/hive.dev/v1/approvals/fits", "application/merge-patch+json", &reason).await;
    assert_eq!(denied.code, 422, "{}", denied.body);
    assert_eq!(
        api.get("/apis/hive.dev/v1/approvals/fits").await.body["spec"]["decision"]["state"],
        "Pending"
    );

    // An object of 2 MiB (a body the server reads: under its 3 MiB) is refused whole.
    let mut big = crate::harness::agent("big");
    let env: serde_json::Map<String, Value> =
        (0..2048).map(|i| (format!("VAR_{i}"), json!("v".repeat(1024)))).collect();
    big["spec"]["runtime"]["process"]["env"] = Value::Object(env);
    let refused = api.post("/apis/hive.dev/v1/agents", &big).await;
    assert_eq!(refused.code, 413, "{}", refused.body);
    assert_eq!(refused.body["reason"], "RequestEntityTooLarge", "{}", refused.body);
    assert!(refused.body["message"].as_str().unwrap().contains("1572864"), "{}", refused.body);
    assert_eq!(api.get("/apis/hive.dev/v1/agents/big").await.code, 404);

    // Grown by patches of 1 MiB each: the second would pass the bound and changes nothing.
    let half: serde_json::Map<String, Value> =
        (0..1024).map(|i| (format!("A_{i}"), json!("a".repeat(1024)))).collect();
    let grow = json!({"spec": {"runtime": {"process": {"env": half}}}});
    let first = api.patch("/apis/hive.dev/v1/agents/alpha", "application/merge-patch+json", &grow).await;
    assert_eq!(first.code, 200, "{}", first.body);
    let before = api.get("/apis/hive.dev/v1/agents/alpha").await.body["metadata"]["resourceVersion"].clone();
    let more: serde_json::Map<String, Value> =
        (0..1024).map(|i| (format!("B_{i}"), json!("b".repeat(1024)))).collect();
    let grow = json!({"spec": {"runtime": {"process": {"env": more}}}});
    let second = api.patch("/apis/hive.dev/v1/agents/alpha", "application/merge-patch+json", &grow).await;
    assert_eq!(second.code, 413, "{}", second.body);
    let after = api.get("/apis/hive.dev/v1/agents/alpha").await.body["metadata"]["resourceVersion"].clone();
    assert_eq!(after, before, "the refused patch wrote nothing");
    assert_eq!(refusals(&d, "object_size").await, 2, "/metrics counts both refusals");
}
