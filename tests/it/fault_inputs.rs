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
/// each. 3,000 of them made a 100 KB message and 3,000 headers, more than a client reads
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
