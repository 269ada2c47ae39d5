//! The wire as client-go v0.32 and controller-runtime v0.20 send it (Go modules cannot be
//! fetched here, so each request is written as their sources build it: path, method,
//! `Content-Type`, `Accept` and body): the event recorders of `tools/record` (core v1,
//! namespaced, strategic-merge count updates) and `tools/events` (`events.k8s.io/v1`,
//! series patches), the typed clientset's protobuf bodies, and the metadata client's
//! `PartialObjectMetadata` on get, list and watch.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{agent, Daemon};

/// The body `tools/record` posts for one event (a Go `v1.Event` as JSON: zero times as
/// `null`, empty strings kept where the Go field has no `omitempty`).
fn recorded(name: &str, namespace: &str, about: &str) -> Value {
    json!({
        "kind": "Event", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": null},
        "involvedObject": {"kind": "Agent", "name": about, "apiVersion": "hive.dev/v1", "resourceVersion": "1"},
        "reason": "Synced", "message": format!("reconciled {about}"),
        "source": {"component": "alpha-controller"},
        "firstTimestamp": "2026-12-06T04:00:00Z", "lastTimestamp": "2026-12-06T04:00:00Z",
        "count": 1, "type": "Normal", "eventTime": null,
        "reportingComponent": "alpha-controller", "reportingInstance": ""
    })
}

fn names(list: &Value) -> Vec<String> {
    let items = list["items"].as_array().unwrap_or_else(|| panic!("not a list: {list}"));
    items.iter().map(|i| i["metadata"]["name"].as_str().unwrap_or_default().to_string()).collect()
}

#[tokio::test]
async fn a_controller_records_core_events_on_namespaced_routes_with_client_go_names() {
    let d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("alpha")).await.code, 201);

    // Create: `OBJECT.HEX`, a DNS subdomain, in the involved object's namespace or
    // `default` for a cluster-scoped one.
    let name = "alpha.17a2b3c4d5e6f7a8";
    let reply = api.post("/api/v1/namespaces/default/events", &recorded(name, "default", "alpha")).await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    assert_eq!(reply.body["metadata"]["name"], name);
    assert_eq!(reply.body["metadata"]["namespace"], "default", "{:?}", reply.body);

    // The recorder's count update: a strategic-merge patch of the flat fields.
    let path = format!("/api/v1/namespaces/default/events/{name}");
    let patch = json!({"count": 2, "lastTimestamp": "2026-12-06T04:00:05Z"});
    let reply = api.patch(&path, "application/strategic-merge-patch+json", &patch).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    assert_eq!(reply.body["count"], 2);
    let read = api.get(&path).await;
    assert_eq!(
        (read.code, &read.body["count"], &read.body["lastTimestamp"]),
        (200, &json!(2), &json!("2026-12-06T04:00:05Z"))
    );
    // A strategic-merge directive is not a merge patch: refused, nothing changed.
    let reply =
        api.patch(&path, "application/strategic-merge-patch+json", &json!({"$patch": "replace"})).await;
    assert_eq!(reply.code, 422, "{:?}", reply.body);
    assert!(reply.body["message"].as_str().unwrap().contains("$patch"), "{:?}", reply.body);

    // Listed in its namespace with the field selectors `kubectl describe` and the
    // recorder use; not in another namespace; everywhere in the cluster-wide list.
    let selected = api
        .get("/api/v1/namespaces/default/events?fieldSelector=involvedObject.kind%3DAgent,involvedObject.name%3Dalpha")
        .await;
    assert_eq!(names(&selected.body), [name], "{:?}", selected.body);
    assert!(!names(&api.get("/api/v1/namespaces/other/events").await.body).contains(&name.to_string()));
    assert!(names(&api.get("/api/v1/events").await.body).contains(&name.to_string()));
    // A namespace in the body that is not the path's is refused, as kube-apiserver does;
    // one left out is the path's.
    let reply = api.post("/api/v1/namespaces/other/events", &recorded("alpha.2", "default", "alpha")).await;
    assert_eq!(reply.code, 400, "{:?}", reply.body);
    assert!(reply.body["message"].as_str().unwrap().contains("namespace"), "{:?}", reply.body);
    let mut unnamespaced = recorded("alpha.3", "", "alpha");
    unnamespaced["metadata"].as_object_mut().unwrap().remove("namespace");
    let reply = api.post("/api/v1/namespaces/team-a/events", &unnamespaced).await;
    assert_eq!(
        (reply.code, &reply.body["metadata"]["namespace"]),
        (201, &json!("team-a")),
        "{:?}",
        reply.body
    );

    // A namespace that is not a DNS label is refused naming the field; nothing stored.
    let mut bad_namespace = recorded("alpha.5", "", "alpha");
    bad_namespace["metadata"].as_object_mut().unwrap().remove("namespace");
    let reply = api.post("/api/v1/namespaces/Team_A/events", &bad_namespace).await;
    assert_eq!(reply.code, 422, "{:?}", reply.body);
    assert!(reply.body["message"].as_str().unwrap().contains("metadata.namespace"), "{:?}", reply.body);
    assert_eq!(api.get("/api/v1/events/alpha.5").await.code, 404);

    // A name that is not a DNS subdomain is still refused, naming the field.
    let reply = api.post("/api/v1/namespaces/default/events", &recorded("Alpha_1", "default", "alpha")).await;
    assert_eq!(reply.code, 422, "{:?}", reply.body);
    assert!(reply.body["message"].as_str().unwrap().contains("metadata.name"), "{:?}", reply.body);
    let long = format!("{}.{}.{}.{:x}", "a".repeat(63), "b".repeat(63), "c".repeat(63), 0x17a2b3c4d5e6f7u64);
    let reply = api.post("/api/v1/namespaces/default/events", &recorded(&long, "default", "alpha")).await;
    assert_eq!(reply.code, 201, "a {}-character subdomain name: {:?}", long.len(), reply.body);

    // A namespaced watch sees a later event of its namespace, and only those.
    let mut watch = api.watch("/api/v1/namespaces/default/events?watch=true&resourceVersion=0").await;
    let mut seen = Vec::new();
    while let Some(event) = watch.next(Duration::from_secs(2)).await {
        seen.push(event["object"]["metadata"]["name"].as_str().unwrap_or_default().to_string());
    }
    assert!(seen.contains(&name.to_string()) && !seen.iter().any(|n| n == "alpha.3"), "{seen:?}");
    assert_eq!(
        api.post("/api/v1/namespaces/default/events", &recorded("alpha.4", "default", "alpha")).await.code,
        201
    );
    let added = watch.next(Duration::from_secs(30)).await.expect("the watch sees the new event");
    assert_eq!((&added["type"], &added["object"]["metadata"]["name"]), (&json!("ADDED"), &json!("alpha.4")));

    // Delete by the namespaced path.
    assert_eq!(api.delete(&path).await.code, 200);
    assert_eq!(api.get(&path).await.code, 404);
}

/// The body `tools/events` posts (a Go `events.k8s.io/v1` Event as JSON).
fn reported(name: &str) -> Value {
    json!({
        "kind": "Event", "apiVersion": "events.k8s.io/v1",
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": null},
        "eventTime": "2026-12-06T04:00:00.123456Z",
        "reportingController": "alpha-controller", "reportingInstance": "alpha-controller-host",
        "action": "Reconcile", "reason": "Synced",
        "regarding": {"kind": "Agent", "name": "alpha", "apiVersion": "hive.dev/v1"},
        "note": "reconciled alpha", "type": "Normal",
        "deprecatedFirstTimestamp": null, "deprecatedLastTimestamp": null
    })
}

#[tokio::test]
async fn events_k8s_io_v1_serves_the_same_events_in_its_own_shape() {
    let d = Daemon::start();
    let api = d.client();
    let name = "alpha.17a2b3c4d5e6f7b0";
    let reply = api.post("/apis/events.k8s.io/v1/namespaces/default/events", &reported(name)).await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    assert_eq!(
        (&reply.body["apiVersion"], &reply.body["note"]),
        (&json!("events.k8s.io/v1"), &json!("reconciled alpha"))
    );
    assert_eq!(reply.body["regarding"]["name"], "alpha", "{:?}", reply.body);

    // The core group sees it as a core Event (what `kubectl describe` reads).
    let core = api.get(&format!("/api/v1/namespaces/default/events/{name}")).await;
    assert_eq!(core.code, 200, "{:?}", core.body);
    assert_eq!(core.body["apiVersion"], "v1");
    assert_eq!(core.body["involvedObject"]["name"], "alpha");
    assert_eq!(core.body["message"], "reconciled alpha");
    assert_eq!(core.body["reportingComponent"], "alpha-controller");
    assert_eq!(core.body["action"], "Reconcile");

    // The recorder's series update, a strategic-merge patch.
    let path = format!("/apis/events.k8s.io/v1/namespaces/default/events/{name}");
    let patch = json!({"series": {"count": 2, "lastObservedTime": "2026-12-06T04:00:10.000000Z"}});
    let reply = api.patch(&path, "application/strategic-merge-patch+json", &patch).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    assert_eq!(reply.body["series"]["count"], 2, "{:?}", reply.body);
    assert_eq!(api.get(&format!("/api/v1/events/{name}")).await.body["series"]["count"], 2);

    // Lists and watches in the events.k8s.io shape, hive's own events included.
    let list = api.get("/apis/events.k8s.io/v1/events").await;
    assert_eq!(
        (&list.body["apiVersion"], &list.body["kind"]),
        (&json!("events.k8s.io/v1"), &json!("EventList"))
    );
    let ours = list.body["items"].as_array().unwrap().iter().find(|e| e["metadata"]["name"] == name).cloned();
    assert_eq!(ours.expect("listed")["regarding"]["kind"], "Agent");
    let mut watch = api.watch("/apis/events.k8s.io/v1/namespaces/default/events?watch=1").await;
    let first = watch.next(Duration::from_secs(30)).await.expect("an initial event");
    assert_eq!(
        (&first["object"]["apiVersion"], &first["object"]["note"]),
        (&json!("events.k8s.io/v1"), &json!("reconciled alpha"))
    );

    // Discovery names the group, so kubectl and the RESTMapper find it.
    let groups = api.get("/apis").await.body;
    let listed = groups["groups"].as_array().unwrap().iter().any(|g| g["name"] == "events.k8s.io");
    assert!(listed, "{groups}");
    let resources = api.get("/apis/events.k8s.io/v1").await;
    assert_eq!(resources.body["resources"][0]["name"], "events", "{:?}", resources.body);
    assert_eq!(resources.body["resources"][0]["namespaced"], true, "{:?}", resources.body);
    let kubectl =
        crate::harness::ok(d.kubectl(&["get", "events.v1.events.k8s.io", "-n", "default", "-o", "name"]));
    assert!(kubectl.contains(name), "{kubectl}");

    // The served OpenAPI describes both groups' routes and shapes: kubectl explains
    // events.k8s.io's fields and validates a core Event against the core document.
    let explain = crate::harness::ok(d.kubectl(&["explain", "events", "--api-version=events.k8s.io/v1"]));
    assert!(explain.contains("regarding") && explain.contains("note"), "{explain}");
    let manifest = "apiVersion: v1\nkind: Event\nmetadata:\n  name: by-kubectl.1\n  namespace: default\n\
                    involvedObject:\n  kind: Agent\n  name: alpha\nreason: Noted\nmessage: by hand\n";
    let created =
        crate::harness::ok(d.kubectl_stdin(&["create", "--validate=strict", "-f", "-"], Some(manifest)));
    assert!(created.contains("event/by-kubectl.1 created"), "{created}");
    let misspelt = manifest.replace("reason:", "reasn:");
    let refused =
        crate::harness::fails(d.kubectl_stdin(&["create", "--validate=strict", "-f", "-"], Some(&misspelt)));
    assert!(refused.contains("reasn"), "{refused}");

    // Its own validation: the object it is about is required, named in its own terms.
    let mut bad = reported("alpha.1");
    bad.as_object_mut().unwrap().remove("regarding");
    let reply = api.post("/apis/events.k8s.io/v1/namespaces/default/events", &bad).await;
    assert_eq!(reply.code, 422, "{:?}", reply.body);
    assert!(reply.body["message"].as_str().unwrap().contains("regarding.name"), "{:?}", reply.body);
}

const METADATA_ONE: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";
const METADATA_LIST: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

async fn get_accepting(d: &Daemon, path: &str, accept: &str) -> (u16, String, Value) {
    let client = d.client();
    let reply = client
        .http
        .get(format!("{}{path}", client.base))
        .bearer_auth(client.token())
        .header("accept", accept)
        .send()
        .await
        .unwrap();
    let code = reply.status().as_u16();
    let content_type = reply.headers()["content-type"].to_str().unwrap().to_string();
    (code, content_type, serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap())
}

#[tokio::test]
async fn the_metadata_client_gets_partial_object_metadata_on_get_list_and_watch() {
    let d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("alpha")).await.code, 201);

    let (code, content_type, one) = get_accepting(&d, "/apis/hive.dev/v1/agents/alpha", METADATA_ONE).await;
    assert_eq!(code, 200);
    assert_eq!(content_type, "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1");
    assert_eq!(
        (&one["apiVersion"], &one["kind"]),
        (&json!("meta.k8s.io/v1"), &json!("PartialObjectMetadata"))
    );
    assert_eq!(one["metadata"]["labels"]["app"], "demo");
    assert!(one.get("spec").is_none(), "only metadata: {one}");

    let (code, content_type, list) = get_accepting(&d, "/apis/hive.dev/v1/agents", METADATA_LIST).await;
    assert_eq!(code, 200);
    assert_eq!(content_type, "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1");
    assert_eq!(
        (&list["apiVersion"], &list["kind"]),
        (&json!("meta.k8s.io/v1"), &json!("PartialObjectMetadataList"))
    );
    assert!(list["metadata"]["resourceVersion"].is_string(), "{list}");
    let item = &list["items"][0];
    assert_eq!(
        (&item["kind"], &item["metadata"]["name"]),
        (&json!("PartialObjectMetadata"), &json!("alpha"))
    );
    assert!(item.get("spec").is_none(), "{item}");

    // The watch: every event's object is PartialObjectMetadata, including a change.
    let client = d.client();
    let response = client
        .http
        .get(format!("{}/apis/hive.dev/v1/agents?watch=true&resourceVersion=0", client.base))
        .bearer_auth(client.token())
        .header("accept", METADATA_ONE)
        .send()
        .await
        .unwrap();
    let mut lines = crate::harness::WatchLines::from(response);
    let added = lines.next(Duration::from_secs(30)).await.expect("ADDED");
    assert_eq!(
        (&added["type"], &added["object"]["kind"]),
        (&json!("ADDED"), &json!("PartialObjectMetadata"))
    );
    let label = json!({"metadata": {"labels": {"tier": "gold"}}});
    assert_eq!(
        api.patch("/apis/hive.dev/v1/agents/alpha", "application/merge-patch+json", &label).await.code,
        200
    );
    let modified = lines.next(Duration::from_secs(30)).await.expect("MODIFIED");
    assert_eq!(modified["object"]["kind"], "PartialObjectMetadata", "{modified}");
    assert_eq!(modified["object"]["metadata"]["labels"]["tier"], "gold");
    assert!(modified["object"].get("spec").is_none(), "{modified}");

    // Asked for nothing hive can serve: 406, as kube-apiserver answers.
    let (code, _, status) = get_accepting(
        &d,
        "/apis/hive.dev/v1/agents/alpha",
        "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
    )
    .await;
    assert_eq!((code, &status["reason"]), (406, &json!("NotAcceptable")), "{status}");
}

/// Protobuf, as the typed clientset sends built-in types: the `k8s\0` magic, then a
/// `runtime.Unknown` whose `raw` is the object's message (field numbers from
/// k8s.io/api's generated.proto). A tiny encoder, independent of the server's decoder.
mod proto {
    pub fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    pub fn bytes(out: &mut Vec<u8>, field: u64, value: &[u8]) {
        varint(out, (field << 3) | 2);
        varint(out, value.len() as u64);
        out.extend_from_slice(value);
    }

    pub fn int(out: &mut Vec<u8>, field: u64, value: u64) {
        varint(out, field << 3);
        varint(out, value);
    }

    pub fn message(out: &mut Vec<u8>, field: u64, build: impl FnOnce(&mut Vec<u8>)) {
        let mut inner = Vec::new();
        build(&mut inner);
        bytes(out, field, &inner);
    }

    pub fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut out = b"k8s\0".to_vec();
        message(&mut out, 1, |t| {
            bytes(t, 1, api_version.as_bytes());
            bytes(t, 2, kind.as_bytes());
        });
        bytes(&mut out, 2, raw);
        bytes(&mut out, 3, b"");
        bytes(&mut out, 4, b"");
        out
    }
}

#[tokio::test]
async fn the_typed_clientset_creates_events_in_protobuf() {
    let d = Daemon::start();
    let api = d.client();
    // core/v1 Event: metadata 1 (name 1, namespace 3, labels 11 as map entries),
    // involvedObject 2 (kind 1, name 3, apiVersion 5), reason 3, message 4, source 5
    // (component 1), firstTimestamp 6 (seconds 1), count 8, type 9.
    let mut event = Vec::new();
    proto::message(&mut event, 1, |m| {
        proto::bytes(m, 1, b"alpha.17a2b3c4d5e6f7c0");
        proto::bytes(m, 3, b"default");
        proto::message(m, 11, |e| {
            proto::bytes(e, 1, b"team");
            proto::bytes(e, 2, b"blue");
        });
    });
    proto::message(&mut event, 2, |o| {
        proto::bytes(o, 1, b"Agent");
        proto::bytes(o, 3, b"alpha");
        proto::bytes(o, 5, b"hive.dev/v1");
    });
    proto::bytes(&mut event, 3, b"Synced");
    proto::bytes(&mut event, 4, "reconciled alpha ✓".as_bytes());
    proto::message(&mut event, 5, |s| proto::bytes(s, 1, b"alpha-controller"));
    proto::message(&mut event, 6, |t| proto::int(t, 1, 1_796_529_600));
    proto::int(&mut event, 8, 3);
    proto::bytes(&mut event, 9, b"Warning");
    let body = proto::envelope("v1", "Event", &event);

    let client = d.client();
    let reply = client
        .http
        .post(format!("{}/api/v1/namespaces/default/events", client.base))
        .bearer_auth(client.token())
        .header("content-type", "application/vnd.kubernetes.protobuf")
        .header("accept", "application/vnd.kubernetes.protobuf,application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let code = reply.status().as_u16();
    let content_type = reply.headers()["content-type"].to_str().unwrap().to_string();
    let created: Value = serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap();
    assert_eq!((code, content_type.as_str()), (201, "application/json"), "{created}");
    let stored = api.get("/api/v1/events/alpha.17a2b3c4d5e6f7c0").await.body;
    assert_eq!(
        stored["involvedObject"],
        json!({"kind": "Agent", "name": "alpha", "apiVersion": "hive.dev/v1"})
    );
    assert_eq!((&stored["reason"], &stored["message"]), (&json!("Synced"), &json!("reconciled alpha ✓")));
    assert_eq!((&stored["count"], &stored["type"]), (&json!(3), &json!("Warning")));
    assert_eq!(stored["source"]["component"], "alpha-controller");
    assert_eq!(stored["firstTimestamp"], "2026-12-06T04:00:00Z");
    assert_eq!(stored["metadata"]["labels"]["team"], "blue");

    // events.k8s.io/v1 too: metadata 1, eventTime 2 (seconds, nanos), reportingController
    // 4, reportingInstance 5, action 6, reason 7, regarding 8, note 10, type 11.
    let mut event = Vec::new();
    proto::message(&mut event, 1, |m| proto::bytes(m, 1, b"alpha.17a2b3c4d5e6f7c1"));
    proto::message(&mut event, 2, |t| {
        proto::int(t, 1, 1_796_529_600);
        proto::int(t, 2, 123_456_000);
    });
    proto::bytes(&mut event, 4, b"alpha-controller");
    proto::bytes(&mut event, 5, b"host-1");
    proto::bytes(&mut event, 6, b"Reconcile");
    proto::bytes(&mut event, 7, b"Synced");
    proto::message(&mut event, 8, |o| {
        proto::bytes(o, 1, b"Agent");
        proto::bytes(o, 3, b"alpha");
    });
    proto::bytes(&mut event, 10, b"done");
    proto::bytes(&mut event, 11, b"Normal");
    let body = proto::envelope("events.k8s.io/v1", "Event", &event);
    let reply = client
        .http
        .post(format!("{}/apis/events.k8s.io/v1/namespaces/default/events", client.base))
        .bearer_auth(client.token())
        .header("content-type", "application/vnd.kubernetes.protobuf")
        .header("accept", "application/vnd.kubernetes.protobuf,application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 201, "{}", reply.text().await.unwrap());
    let stored = api.get("/api/v1/events/alpha.17a2b3c4d5e6f7c1").await.body;
    assert_eq!((&stored["message"], &stored["reportingInstance"]), (&json!("done"), &json!("host-1")));
    assert_eq!(stored["eventTime"], "2026-12-06T04:00:00.123456Z");
    assert_eq!(stored["metadata"]["namespace"], "default", "the path's namespace: {stored}");

    // Misshapen protobuf is a 400 that says where, and stores nothing; protobuf for a
    // kind that has no protobuf form (hive's own) is a 415 naming JSON.
    let mut truncated = proto::envelope("v1", "Event", &event);
    truncated.truncate(truncated.len() - 9);
    let reply = client
        .http
        .post(format!("{}/api/v1/namespaces/default/events", client.base))
        .bearer_auth(client.token())
        .header("content-type", "application/vnd.kubernetes.protobuf")
        .body(truncated)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 400, "{}", reply.text().await.unwrap());
    let reply = client
        .http
        .post(format!("{}/apis/hive.dev/v1/agents", client.base))
        .bearer_auth(client.token())
        .header("content-type", "application/vnd.kubernetes.protobuf")
        .body(proto::envelope("hive.dev/v1", "Agent", b""))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 415);
    assert!(reply.text().await.unwrap().contains("application/json"));
}
