//! The REST surface with the Kubernetes semantics kubectl relies on.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{agent, Daemon};

const AGENTS: &str = "/apis/hive.dev/v1/agents";

#[tokio::test]
async fn discovery_version_and_openapi() {
    let d = Daemon::start();
    let anon = d.client_with(None);
    let version = anon.get("/version").await;
    assert_eq!(version.code, 200);
    assert_eq!(version.body["major"], "1");

    let api = d.client();
    // Aggregated discovery is asked for first; we answer the legacy document with a
    // plain JSON content type, never a 406.
    let groups = api.send("GET", "/apis", "", None).await;
    assert_eq!(groups.code, 200);
    assert_eq!(groups.body["kind"], "APIGroupList");
    assert_eq!(groups.headers["content-type"], "application/json");
    let resources = api.get("/apis/hive.dev/v1").await;
    let names: Vec<&str> =
        resources.body["resources"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
    for plural in ["agents", "jobs", "approvals", "nodes", "fleetcommands", "providers", "agents/status"] {
        assert!(names.contains(&plural), "{plural} missing from {names:?}");
    }
    let index = api.get("/openapi/v3").await;
    let url = index.body["paths"]["apis/hive.dev/v1"]["serverRelativeURL"].as_str().unwrap().to_string();
    let doc = api.get(&url).await;
    assert_eq!(doc.code, 200);
    assert!(doc.body["components"]["schemas"]["Agent"].is_object());
}

#[tokio::test]
async fn create_get_update_conflict_and_generation() {
    let d = Daemon::start();
    let api = d.client();
    let created = api.post(AGENTS, &agent("a1")).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    let meta = &created.body["metadata"];
    assert_eq!(meta["generation"], 1);
    assert!(meta["uid"].is_string());
    let rv1: u64 = meta["resourceVersion"].as_str().unwrap().parse().unwrap();

    let dup = api.post(AGENTS, &agent("a1")).await;
    assert_eq!(dup.code, 409);
    assert_eq!(dup.body["reason"], "AlreadyExists");

    // A spec change bumps generation; a label change does not.
    let mut obj = created.body.clone();
    obj["spec"]["wanted"] = json!("Offline");
    let updated = api.put(&format!("{AGENTS}/a1"), &obj).await;
    assert_eq!(updated.code, 200, "{:?}", updated.body);
    assert_eq!(updated.body["metadata"]["generation"], 2);
    let rv2: u64 = updated.body["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    assert!(rv2 > rv1);

    // The first body's resourceVersion is stale now.
    let stale = api.put(&format!("{AGENTS}/a1"), &obj).await;
    assert_eq!(stale.code, 409);
    assert_eq!(stale.body["reason"], "Conflict");

    let mut labelled = updated.body.clone();
    labelled["metadata"]["labels"]["tier"] = json!("gold");
    let relabelled = api.put(&format!("{AGENTS}/a1"), &labelled).await;
    assert_eq!(relabelled.body["metadata"]["generation"], 2);

    let missing = api.get(&format!("{AGENTS}/nope")).await;
    assert_eq!(missing.code, 404);
    assert_eq!(missing.body["kind"], "Status");
    assert_eq!(missing.body["message"], "agents.hive.dev \"nope\" not found");
}

#[tokio::test]
async fn status_subresource_writes_only_status() {
    let d = Daemon::start();
    let api = d.client();
    let created = api.post(AGENTS, &agent("s1")).await;
    let mut obj = created.body.clone();
    obj["spec"]["wanted"] = json!("Offline");
    obj["status"] = json!({"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True", "reason": "Running"}]});
    let written = api.put(&format!("{AGENTS}/s1/status"), &obj).await;
    assert_eq!(written.code, 200, "{:?}", written.body);
    assert_eq!(written.body["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(
        written.body["spec"]["wanted"], created.body["spec"]["wanted"],
        "status write must not change spec"
    );
    assert_eq!(written.body["metadata"]["generation"], 1);
    // A spec write keeps status.
    let patched = api
        .patch(
            &format!("{AGENTS}/s1"),
            "application/merge-patch+json",
            &json!({"status": {"conditions": []}, "metadata": {"labels": {"x": "y"}}}),
        )
        .await;
    assert_eq!(patched.body["status"]["conditions"][0]["type"], "Ready");
}

#[tokio::test]
async fn validation_errors_name_fields_and_change_nothing() {
    let d = Daemon::start();
    let api = d.client();
    let mut bad = agent("Bad_Name");
    bad["spec"]["resources"] = json!({"memoryMax": "lots"});
    let reply = api.post(AGENTS, &bad).await;
    assert_eq!(reply.code, 422, "{:?}", reply.body);
    assert_eq!(reply.body["reason"], "Invalid");
    let fields: Vec<&str> = reply.body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    assert!(fields.contains(&"metadata.name"), "{fields:?}");
    assert!(fields.contains(&"spec.resources.memoryMax"), "{fields:?}");

    let malformed = api.send("POST", AGENTS, "application/json", Some("{\"metadata\": {".into())).await;
    assert_eq!(malformed.code, 400);
    assert!(malformed.body["message"].as_str().unwrap().contains("line 1"), "{:?}", malformed.body);

    let huge = "x".repeat(4 * 1024 * 1024);
    let too_big = api.send("POST", AGENTS, "application/json", Some(huge)).await;
    assert_eq!(too_big.code, 413);
    assert_eq!(too_big.body["reason"], "RequestEntityTooLarge");

    let mut unknown = agent("u1");
    unknown["spec"]["bogus"] = json!(1);
    let strict = api.post(&format!("{AGENTS}?fieldValidation=Strict"), &unknown).await;
    assert_eq!(strict.code, 400);
    assert!(
        strict.body["message"].as_str().unwrap().contains("unknown field \"spec.bogus\""),
        "{:?}",
        strict.body
    );
    let warn = api.post(&format!("{AGENTS}?fieldValidation=Warn"), &unknown).await;
    assert_eq!(warn.code, 201);
    assert!(warn.headers["warning"].to_str().unwrap().contains("unknown field"));
    assert!(warn.body["spec"].get("bogus").is_none());

    let list = api.get(AGENTS).await;
    let names: Vec<&str> = list.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["u1"], "rejected requests must change nothing");
}

#[tokio::test]
async fn patches_dry_run_and_strategic_merge() {
    let d = Daemon::start();
    let api = d.client();
    api.post(AGENTS, &agent("p1")).await;
    let merge = api
        .patch(
            &format!("{AGENTS}/p1"),
            "application/merge-patch+json",
            &json!({"spec": {"wanted": "Offline"}}),
        )
        .await;
    assert_eq!(merge.code, 200, "{:?}", merge.body);
    assert_eq!(merge.body["spec"]["wanted"], "Offline");
    let jp = api
        .patch(
            &format!("{AGENTS}/p1"),
            "application/json-patch+json",
            &json!([{"op": "replace", "path": "/spec/wanted", "value": "Up"}]),
        )
        .await;
    assert_eq!(jp.code, 200, "{:?}", jp.body);
    assert_eq!(jp.body["spec"]["wanted"], "Up");
    let smp = api.patch(&format!("{AGENTS}/p1"), "application/strategic-merge-patch+json", &json!({})).await;
    assert_eq!(smp.code, 415);
    let rv = jp.body["metadata"]["resourceVersion"].clone();
    let dry = api
        .patch(
            &format!("{AGENTS}/p1?dryRun=All"),
            "application/merge-patch+json",
            &json!({"spec": {"wanted": "Offline"}}),
        )
        .await;
    assert_eq!(dry.body["spec"]["wanted"], "Offline");
    let after = api.get(&format!("{AGENTS}/p1")).await;
    assert_eq!(after.body["spec"]["wanted"], "Up");
    assert_eq!(after.body["metadata"]["resourceVersion"], rv);
    let dry_delete = api.send("DELETE", &format!("{AGENTS}/p1?dryRun=All"), "", None).await;
    assert_eq!(dry_delete.code, 200);
    assert_eq!(api.get(&format!("{AGENTS}/p1")).await.code, 200);
}

#[tokio::test]
async fn server_side_apply_tracks_managers_and_conflicts() {
    let d = Daemon::start();
    let api = d.client();
    let path = format!("{AGENTS}/ssa");
    let manifest = agent("ssa");
    let no_manager =
        api.send("PATCH", &path, "application/apply-patch+yaml", Some(manifest.to_string())).await;
    assert_eq!(no_manager.code, 400);
    let created = api
        .send(
            "PATCH",
            &format!("{path}?fieldManager=alice"),
            "application/apply-patch+yaml",
            Some(manifest.to_string()),
        )
        .await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    assert_eq!(created.body["metadata"]["managedFields"][0]["manager"], "alice");
    let again = api
        .send(
            "PATCH",
            &format!("{path}?fieldManager=alice"),
            "application/apply-patch+yaml",
            Some(manifest.to_string()),
        )
        .await;
    assert_eq!(again.code, 200);
    assert_eq!(
        again.body["metadata"]["resourceVersion"], created.body["metadata"]["resourceVersion"],
        "identical apply is a no-op"
    );
    // bob changes a field alice owns → conflict unless forced.
    let mut bobs = agent("ssa");
    bobs["metadata"]["labels"]["app"] = json!("other");
    let conflict = api
        .send(
            "PATCH",
            &format!("{path}?fieldManager=bob"),
            "application/apply-patch+yaml",
            Some(bobs.to_string()),
        )
        .await;
    assert_eq!(conflict.code, 409, "{:?}", conflict.body);
    assert_eq!(conflict.body["details"]["causes"][0]["reason"], "FieldManagerConflict");
    let forced = api
        .send(
            "PATCH",
            &format!("{path}?fieldManager=bob&force=true"),
            "application/apply-patch+yaml",
            Some(bobs.to_string()),
        )
        .await;
    assert_eq!(forced.code, 200, "{:?}", forced.body);
    assert_eq!(forced.body["metadata"]["labels"]["app"], "other");
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let d = Daemon::start();
    let api = d.client();
    let mut obj = agent("f1");
    obj["metadata"]["finalizers"] = json!(["hive.dev/cleanup"]);
    api.post(AGENTS, &obj).await;
    let mut watch = api.watch(&format!("{AGENTS}?watch=true&fieldSelector=metadata.name%3Df1")).await;
    assert_eq!(watch.next(Duration::from_secs(5)).await.unwrap()["type"], "ADDED");
    let deleting = api.delete(&format!("{AGENTS}/f1")).await;
    assert_eq!(deleting.code, 200);
    assert!(deleting.body["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(api.get(&format!("{AGENTS}/f1")).await.code, 200);
    assert_eq!(watch.next(Duration::from_secs(5)).await.unwrap()["type"], "MODIFIED");
    let removed = api
        .patch(
            &format!("{AGENTS}/f1"),
            "application/merge-patch+json",
            &json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(removed.code, 200, "{:?}", removed.body);
    assert_eq!(api.get(&format!("{AGENTS}/f1")).await.code, 404);
    assert_eq!(watch.next(Duration::from_secs(5)).await.unwrap()["type"], "DELETED");
}

#[tokio::test]
async fn lists_page_and_select() {
    let d = Daemon::start();
    let api = d.client();
    for i in 0..5 {
        let mut a = agent(&format!("l{i}"));
        a["metadata"]["labels"] = json!({"tier": if i % 2 == 0 { "even" } else { "odd" }});
        api.post(AGENTS, &a).await;
    }
    let page1 = api.get(&format!("{AGENTS}?limit=2")).await;
    assert_eq!(page1.body["items"].as_array().unwrap().len(), 2);
    assert_eq!(page1.body["metadata"]["remainingItemCount"], 3);
    let token = page1.body["metadata"]["continue"].as_str().unwrap().to_string();
    let mut names = Vec::new();
    let mut next = Some(token);
    names.extend(
        page1.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string()),
    );
    while let Some(token) = next {
        let page = api.get(&format!("{AGENTS}?limit=2&continue={token}")).await;
        assert_eq!(page.body["metadata"]["resourceVersion"], page1.body["metadata"]["resourceVersion"]);
        names.extend(
            page.body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap().to_string()),
        );
        next = page.body["metadata"]["continue"].as_str().map(str::to_string);
    }
    assert_eq!(names, ["l0", "l1", "l2", "l3", "l4"]);
    // A forged token with a revision ahead of the store is a 400, never echoed as the
    // list's resourceVersion (issue 28, item 6).
    use base64::Engine as _;
    let forged = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&json!({"rv": u64::MAX, "start": "l1"})).unwrap());
    let refused = api.get(&format!("{AGENTS}?limit=2&continue={forged}")).await;
    assert_eq!(refused.code, 400, "{}", refused.body);
    assert!(refused.body["message"].as_str().unwrap().contains("ahead of the store"), "{}", refused.body);
    let cases = [
        ("tier%3Deven", vec!["l0", "l2", "l4"]),
        ("tier%21%3Deven", vec!["l1", "l3"]),
        ("tier%20in%20(odd)", vec!["l1", "l3"]),
        ("tier%20notin%20(odd)", vec!["l0", "l2", "l4"]),
        ("tier", vec!["l0", "l1", "l2", "l3", "l4"]),
        ("%21tier", vec![]),
    ];
    for (selector, want) in cases {
        let list = api.get(&format!("{AGENTS}?labelSelector={selector}")).await;
        let got: Vec<&str> = list.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["metadata"]["name"].as_str())
            .collect();
        assert_eq!(got, want, "{selector}");
    }
    let bad = api.get(&format!("{AGENTS}?labelSelector=a%20in%20(b")).await;
    assert_eq!(bad.code, 400);
    let by_name = api.get(&format!("{AGENTS}?fieldSelector=metadata.name%3Dl3")).await;
    assert_eq!(by_name.body["items"].as_array().unwrap().len(), 1);
}

/// Pages of one item under a label selector, over many Agents: the right items in
/// order, a continue token on every page but the last, no `remainingItemCount` (unknown
/// under a selector, as kube-apiserver answers), and labels changed between pages seen
/// by the pages after (issue 28, item 6: each such page parsed every later Agent).
#[tokio::test]
async fn label_selected_pages_of_one_follow_the_labels() {
    let d = Daemon::start();
    let api = d.client();
    let name = |i: usize| format!("p{i:02}");
    let tier = |i: usize| ["gold", "silver", ""][i % 3];
    for i in 0..45 {
        let mut a = agent(&name(i));
        a["metadata"]["labels"] = match tier(i) {
            "" => json!({}),
            "silver" => json!({"tier": "silver", "legacy": "yes"}),
            gold => json!({"tier": gold}),
        };
        assert_eq!(api.post(AGENTS, &a).await.code, 201);
    }
    // Labels written with JSON escapes are the labels they spell.
    let mut escaped = agent("p45").to_string();
    escaped = escaped
        .replace(r#""labels":{"app":"demo"}"#, r#""labels":{"ti\u0065r":"g\u006fld","hive.dev\/team":"a"}"#);
    assert!(escaped.contains("u0065r"), "{escaped}");
    assert_eq!(api.send("POST", AGENTS, "application/json", Some(escaped)).await.code, 201);

    let pages = |selector: String| {
        let api = &api;
        async move {
            let (mut names, mut token, mut rv) = (Vec::new(), String::new(), None);
            loop {
                let page =
                    api.get(&format!("{AGENTS}?labelSelector={selector}&limit=1&continue={token}")).await;
                assert_eq!(page.code, 200, "{selector}: {}", page.body);
                let meta = &page.body["metadata"];
                assert!(meta.get("remainingItemCount").is_none(), "{selector}: {meta}");
                assert_eq!(*rv.get_or_insert(meta["resourceVersion"].clone()), meta["resourceVersion"]);
                let items = page.body["items"].as_array().unwrap();
                names.extend(items.iter().map(|i| i["metadata"]["name"].as_str().unwrap().to_string()));
                match meta["continue"].as_str() {
                    Some(next) => {
                        assert_eq!(items.len(), 1, "{selector}: a page with a token is full");
                        token = next.to_string();
                    }
                    None => return names,
                }
            }
        }
    };
    let gold: Vec<String> = (0..45).filter(|&i| tier(i) == "gold").map(name).chain(["p45".into()]).collect();
    let model =
        |keep: &dyn Fn(usize) -> bool| -> Vec<String> { (0..45).filter(|&i| keep(i)).map(name).collect() };
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("tier%3Dgold", gold.clone()),
        ("%21legacy", model(&|i| tier(i) != "silver").into_iter().chain(["p45".into()]).collect()),
        (
            "tier%20in%20(gold,silver)",
            model(&|i| !tier(i).is_empty()).into_iter().chain(["p45".into()]).collect(),
        ),
        ("tier%20notin%20(gold)", model(&|i| tier(i) != "gold")),
        ("hive.dev/team%3Da", vec!["p45".into()]),
        ("tier%3Dgold,legacy", vec![]),
    ];
    for (selector, want) in cases {
        assert_eq!(pages(selector.to_string()).await, want, "{selector}");
    }

    // Between two pages: one Agent ahead stops matching, one ahead starts, and one
    // already passed changes too. Later pages read the live cache.
    let first = api.get(&format!("{AGENTS}?labelSelector=tier%3Dgold&limit=2")).await;
    let names: Vec<&str> = first.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["p00", "p03"]);
    let relabel = |who: &'static str, tier: &'static str| {
        let api = &api;
        async move {
            let patch = json!({"metadata": {"labels": {"tier": tier}}});
            let path = format!("{AGENTS}/{who}");
            assert_eq!(api.patch(&path, "application/merge-patch+json", &patch).await.code, 200);
        }
    };
    relabel("p06", "silver").await;
    relabel("p07", "gold").await;
    relabel("p00", "silver").await;
    let token = first.body["metadata"]["continue"].as_str().unwrap();
    let mut rest = Vec::new();
    let mut next = Some(token.to_string());
    while let Some(token) = next {
        let page = api.get(&format!("{AGENTS}?labelSelector=tier%3Dgold&limit=1&continue={token}")).await;
        rest.extend(
            page.body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap().to_string()),
        );
        next = page.body["metadata"]["continue"].as_str().map(str::to_string);
    }
    let mut want: Vec<String> =
        gold.iter().filter(|n| n.as_str() > "p03" && n.as_str() != "p06").cloned().collect();
    want.push("p07".into());
    want.sort();
    assert_eq!(rest, want);
}

#[tokio::test]
async fn watch_replays_resumes_bookmarks_and_initial_events() {
    let d = Daemon::start();
    let api = d.client();
    let first = api.post(AGENTS, &agent("w1")).await;
    let rv1 = first.body["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    api.post(AGENTS, &agent("w2")).await;

    // From rv1: exactly the later change, then live.
    let mut w =
        api.watch(&format!("{AGENTS}?watch=true&resourceVersion={rv1}&allowWatchBookmarks=true")).await;
    let e = w.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!((e["type"].as_str(), e["object"]["metadata"]["name"].as_str()), (Some("ADDED"), Some("w2")));
    api.patch(
        &format!("{AGENTS}/w1"),
        "application/merge-patch+json",
        &json!({"spec": {"wanted": "Offline"}}),
    )
    .await;
    let e = w.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(e["type"], "MODIFIED");
    // Bookmarks arrive (interval 1s in tests) and carry a revision.
    let b = w.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(b["type"], "BOOKMARK");
    let revision = |event: &Value| -> u64 {
        event["object"]["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
    };
    assert!(revision(&b) >= revision(&e), "a bookmark is at the last event sent or later: {b} after {e}");

    // Unset resourceVersion: synthetic ADDED for the current state.
    let mut w0 = api.watch(&format!("{AGENTS}?watch=true")).await;
    let names: Vec<String> =
        [w0.next(Duration::from_secs(5)).await.unwrap(), w0.next(Duration::from_secs(5)).await.unwrap()]
            .iter()
            .map(|e| e["object"]["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
    assert_eq!(names, ["w1", "w2"]);

    // sendInitialEvents: ADDED… then the annotated bookmark.
    let mut wi = api.watch(&format!("{AGENTS}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan")).await;
    assert_eq!(wi.next(Duration::from_secs(5)).await.unwrap()["type"], "ADDED");
    assert_eq!(wi.next(Duration::from_secs(5)).await.unwrap()["type"], "ADDED");
    let end = wi.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");

    // timeoutSeconds ends the stream.
    let mut wt = api.watch(&format!("{AGENTS}?watch=true&resourceVersion={rv1}&timeoutSeconds=1")).await;
    let started = std::time::Instant::now();
    let mut seen = 0;
    while wt.next(Duration::from_secs(5)).await.is_some() {
        seen += 1;
        assert!(seen < 10, "stream should end after timeoutSeconds");
    }
    assert_eq!(seen, 2, "the two changes after rv1");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "ended by timeoutSeconds, not by the reader's timeout"
    );
}

#[tokio::test]
async fn watch_from_compacted_revision_gets_410() {
    let d = Daemon::start_with(&["--retention-events", "3"]);
    let api = d.client();
    for i in 0..8 {
        api.post(AGENTS, &agent(&format!("c{i}"))).await;
    }
    let mut w = api.watch(&format!("{AGENTS}?watch=true&resourceVersion=1")).await;
    let e = w.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["code"], 410);
    assert_eq!(e["object"]["reason"], "Expired");
}

#[tokio::test]
async fn tables_for_get_list_and_watch() {
    let d = Daemon::start();
    let api = d.client();
    api.post(AGENTS, &agent("t1")).await;
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let resp = api
        .http
        .get(format!("{}{AGENTS}", api.base))
        .bearer_auth(&d.token)
        .header("accept", accept)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "application/json;as=Table;v=v1;g=meta.k8s.io");
    let table: Value = resp.json().await.unwrap();
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["columnDefinitions"][0]["name"], "Name");
    assert_eq!(table["rows"][0]["cells"][0], "t1");
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(table["rows"][0]["object"]["metadata"]["labels"]["app"], "demo");
}

#[tokio::test]
async fn approvals_resolve_once_and_node_specs_are_immutable() {
    let d = Daemon::start();
    let api = d.client();
    let approval = json!({
        "apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": "ap1"},
        "spec": {"kind": "ApplyCommit", "target": "a1", "payload": {"commit": "9f2c4e1a7b3d5f6e8a0c1b2d3e4f5a6b7c8d9e0f"},
                 "decision": {"state": "Pending"}}
    });
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("a1")).await.code, 201);
    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval).await.code, 201);
    let path = "/apis/hive.dev/v1/approvals/ap1";
    let approve = api
        .patch(path, "application/merge-patch+json", &json!({"spec": {"decision": {"state": "Approved"}}}))
        .await;
    assert_eq!(approve.code, 200, "{:?}", approve.body);
    let flip = api
        .patch(path, "application/merge-patch+json", &json!({"spec": {"decision": {"state": "Denied"}}}))
        .await;
    assert_eq!(flip.code, 422, "a decision is made once: {:?}", flip.body);
    assert_eq!(
        flip.body["details"]["causes"][0]["field"].as_str().map(|f| f.starts_with("spec.decision")),
        Some(true)
    );

    // A Node is created by its Provision command, never by hand.
    let node = json!({"apiVersion": "hive.dev/v1", "kind": "Node", "metadata": {"name": "node-1"},
                      "spec": {"logicalId": 1, "provider": "process", "command": "prov-1"}});
    assert_eq!(api.post("/apis/hive.dev/v1/nodes", &node).await.code, 403);
    let provision = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "prov-1"},
                           "spec": {"provision": {"provider": "process", "count": 1}}});
    assert_eq!(api.post("/apis/hive.dev/v1/fleetcommands", &provision).await.code, 201);
    let change = api
        .patch(
            "/apis/hive.dev/v1/nodes/node-1",
            "application/merge-patch+json",
            &json!({"spec": {"logicalId": 2}}),
        )
        .await;
    assert_eq!(change.code, 422, "{:?}", change.body);
    let labels = api
        .patch(
            "/apis/hive.dev/v1/nodes/node-1",
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"a": "b"}}}),
        )
        .await;
    assert_eq!(labels.code, 200, "metadata stays writable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_conflict_or_retry_correctly() {
    let d = Daemon::start();
    let api = d.client();
    let created = api.post(AGENTS, &agent("race")).await;
    let path = format!("{AGENTS}/race");

    // Merge patches re-read and retry on a lost race: all 24 land.
    let mut tasks = Vec::new();
    for i in 0..24 {
        let api = api.clone();
        let path = path.clone();
        tasks.push(tokio::spawn(async move {
            api.patch(
                &path,
                "application/merge-patch+json",
                &json!({"metadata": {"labels": {format!("k{i}"): "v"}}}),
            )
            .await
            .code
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let after = api.get(&path).await;
    let labels = after.body["metadata"]["labels"].as_object().unwrap();
    assert_eq!(labels.len(), 25, "every concurrent patch landed: {labels:?}");

    // PUTs carrying the same resourceVersion: exactly one wins, the rest get 409.
    let base = after.body.clone();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let api = api.clone();
        let path = path.clone();
        let mut obj = base.clone();
        obj["metadata"]["labels"]["winner"] = json!(format!("w{i}"));
        tasks.push(tokio::spawn(async move { api.put(&path, &obj).await.code }));
    }
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.unwrap());
    }
    assert_eq!(codes.iter().filter(|c| **c == 200).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 409).count(), 15, "{codes:?}");
    let _ = created;
}

#[tokio::test]
async fn reapplying_a_manifest_that_omits_defaults_changes_nothing_even_a_second_later() {
    let d = Daemon::start();
    let api = d.client();
    // `edge` defaults to AfterOk and is stored explicitly; the manifest leaves it out.
    let job = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "j1"},
                     "spec": {"template": "Rebuild", "nodes": [
                        {"id": "a", "kind": "Prebuild", "agent": "x"},
                        {"id": "b", "kind": "StopForUpdate", "agent": "x", "deps": [{"node": "a"}]}]}});
    let path = "/apis/hive.dev/v1/jobs/j1?fieldManager=hive";
    let first = api.send("PATCH", path, "application/apply-patch+yaml", Some(job.to_string())).await;
    assert_eq!(first.code, 201, "{:?}", first.body);
    // The daemon takes the Job and runs it (it fails: agent x does not exist); compare
    // with the settled object, whose status no one writes any more.
    let settled = crate::agents::wait_terminal(&api, "j1").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = api.send("PATCH", path, "application/apply-patch+yaml", Some(job.to_string())).await;
    assert_eq!(again.code, 200);
    assert_eq!(again.body["metadata"]["resourceVersion"], settled["metadata"]["resourceVersion"]);
}

/// Every event of `watch` (bookmarks aside) up to and including the one at revision
/// `last`, as (type, name, team label, resourceVersion).
async fn selected_events(
    watch: &mut crate::harness::WatchLines,
    last: u64,
) -> Vec<(String, String, String, u64)> {
    let mut seen = Vec::new();
    loop {
        let event =
            watch.next(Duration::from_secs(60)).await.expect("the watch delivers the event at `last`");
        if event["type"] == "BOOKMARK" {
            continue;
        }
        let object = &event["object"];
        let rv: u64 = object["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
        seen.push((
            event["type"].as_str().unwrap().to_owned(),
            object["metadata"]["name"].as_str().unwrap().to_owned(),
            object["metadata"]["labels"]["team"].as_str().unwrap_or("").to_owned(),
            rv,
        ));
        if rv >= last {
            return seen;
        }
    }
}

fn revision_of(reply: &crate::harness::Reply) -> u64 {
    assert!(reply.code < 300, "{reply:?}");
    reply.body["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
}

/// A `labelSelector` watch sees an object that stops matching as `DELETED` (its last
/// matching state at the change's revision) and one that starts matching as `ADDED`, as
/// kube-apiserver's watch cache sends them; objects that never match send nothing. The
/// same events come live, replayed from a past resourceVersion, and replayed after a
/// restart.
#[tokio::test]
async fn selector_watch_sends_deleted_and_added_when_an_object_stops_and_starts_matching() {
    let mut d = Daemon::start();
    let api = d.client();
    let team = |name: &str, team: &str| {
        let mut object = agent(name);
        object["metadata"]["labels"] = json!({"team": team});
        object["spec"]["wanted"] = json!("Offline");
        object
    };
    let relabel = |name: &str, team: &str| {
        let api = api.clone();
        let path = format!("{AGENTS}/{name}");
        let body = json!({"metadata": {"labels": {"team": team}}});
        async move { api.patch(&path, "application/merge-patch+json", &body).await }
    };
    let start = revision_of(&api.post(AGENTS, &team("s1", "a")).await);
    revision_of(&api.post(AGENTS, &team("outsider", "b")).await);
    let selector = "labelSelector=team%3Da";
    let mut live = api.watch(&format!("{AGENTS}?watch=true&{selector}&resourceVersion={start}")).await;

    let left = revision_of(&relabel("s1", "b").await);
    revision_of(&relabel("outsider", "c").await);
    let back = revision_of(&relabel("s1", "a").await);
    let marker = json!({"metadata": {"annotations": {"hive.dev/test": "last"}}});
    let last =
        revision_of(&api.patch(&format!("{AGENTS}/s1"), "application/merge-patch+json", &marker).await);

    let events = selected_events(&mut live, last).await;
    assert!(events.iter().all(|(_, name, _, _)| name == "s1"), "the outsider never matched: {events:?}");
    let at = |rv: u64| {
        events.iter().position(|e| e.3 == rv).unwrap_or_else(|| panic!("no event at {rv}: {events:?}"))
    };
    let (i_left, i_back) = (at(left), at(back));
    assert_eq!(events[i_left], ("DELETED".into(), "s1".into(), "a".into(), left), "{events:?}");
    assert_eq!(i_back, i_left + 1, "nothing while s1 did not match: {events:?}");
    assert_eq!(events[i_back], ("ADDED".into(), "s1".into(), "a".into(), back), "{events:?}");
    assert_eq!(events.last().unwrap().3, last, "{events:?}");
    for (type_, _, team, _) in events[..i_left].iter().chain(&events[i_back + 1..]) {
        assert_eq!((type_.as_str(), team.as_str()), ("MODIFIED", "a"), "{events:?}");
    }

    let mut replay = api.watch(&format!("{AGENTS}?watch=true&{selector}&resourceVersion={start}")).await;
    assert_eq!(selected_events(&mut replay, last).await, events, "a replay sends what the live watch sent");

    d.restart_with(&[]);
    let api = d.client();
    let mut reopened = api.watch(&format!("{AGENTS}?watch=true&{selector}&resourceVersion={start}")).await;
    assert_eq!(selected_events(&mut reopened, last).await, events, "and so does one after a restart");
}

/// kubectl 1.32 asks `/api` and `/apis` for aggregated discovery v2 first; both answer an
/// `APIGroupDiscoveryList` with its own content type, naming each resource with its verbs,
/// scope and subresources. Any other `Accept` still gets the legacy documents.
#[tokio::test]
async fn aggregated_discovery_v2_answers_kubectls_accept_header() {
    const ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
    let d = Daemon::start();
    let api = d.client();
    let get = |path: &'static str| {
        let api = api.clone();
        async move {
            let response = api
                .http
                .get(format!("{}{path}", api.base))
                .bearer_auth(api.token())
                .header("accept", ACCEPT)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 200, "{path}");
            let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
            (content_type, response.json::<Value>().await.unwrap())
        }
    };
    let (content_type, apis) = get("/apis").await;
    assert_eq!(content_type, "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList");
    assert_eq!(
        (&apis["kind"], &apis["apiVersion"]),
        (&json!("APIGroupDiscoveryList"), &json!("apidiscovery.k8s.io/v2"))
    );
    let group = &apis["items"][0];
    assert_eq!(group["metadata"]["name"], "hive.dev", "{apis}");
    assert_eq!(group["versions"][0]["version"], "v1", "{apis}");
    let resources = group["versions"][0]["resources"].as_array().unwrap();
    let resource = |plural: &str| {
        resources.iter().find(|r| r["resource"] == plural).unwrap_or_else(|| panic!("{plural}: {apis}"))
    };
    for plural in ["agents", "jobs", "approvals", "nodes", "fleetcommands", "providers"] {
        let r = resource(plural);
        assert_eq!(r["scope"], "Cluster", "{r}");
        assert_eq!(r["responseKind"]["group"], "hive.dev", "{r}");
        for verb in ["create", "delete", "get", "list", "patch", "update", "watch"] {
            assert!(r["verbs"].as_array().unwrap().contains(&json!(verb)), "{plural} lacks {verb}: {r}");
        }
        let status = r["subresources"].as_array().unwrap().iter().find(|s| s["subresource"] == "status");
        assert_eq!(
            status.unwrap_or_else(|| panic!("{r}"))["verbs"],
            json!(["get", "patch", "update"]),
            "{r}"
        );
    }
    let agents = resource("agents");
    assert_eq!((&agents["singularResource"], &agents["shortNames"]), (&json!("agent"), &json!(["ag"])));
    assert_eq!((&agents["responseKind"]["kind"], &agents["categories"]), (&json!("Agent"), &json!(["hive"])));
    let job_subresources: Vec<&Value> =
        resource("jobs")["subresources"].as_array().unwrap().iter().map(|s| &s["subresource"]).collect();
    assert_eq!(job_subresources, [&json!("status"), &json!("log"), &json!("cancel")]);

    let (content_type, core) = get("/api").await;
    assert_eq!(content_type, "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList");
    let core_version = &core["items"][0]["versions"][0];
    assert_eq!(core_version["version"], "v1", "{core}");
    assert_eq!(core_version["resources"][0]["resource"], "events", "{core}");
    assert_eq!(
        core_version["resources"][0]["responseKind"],
        json!({"group": "", "version": "v1", "kind": "Event"})
    );

    let legacy = api.get("/apis").await;
    assert_eq!(
        (legacy.body["kind"].as_str(), legacy.headers["content-type"].to_str().unwrap()),
        (Some("APIGroupList"), "application/json")
    );
    assert_eq!(api.get("/api").await.body["kind"], "APIVersions");
}

// Regression (issue 14, item 8): a list with `resourceVersion=abc` was silently accepted.
#[tokio::test]
async fn a_list_with_a_malformed_resource_version_is_a_400_naming_it() {
    let d = Daemon::start();
    let api = d.client();
    for query in ["resourceVersion=abc", "resourceVersion=-1", "resourceVersion=1.5"] {
        let reply = api.get(&format!("/apis/hive.dev/v1/agents?{query}")).await;
        assert_eq!(reply.code, 400, "{query}: {}", reply.body);
        assert!(reply.body["message"].as_str().unwrap().contains("resourceVersion"), "{}", reply.body);
    }
    for query in ["resourceVersion=0", "resourceVersion=", "resourceVersion=1"] {
        assert_eq!(api.get(&format!("/apis/hive.dev/v1/agents?{query}")).await.code, 200, "{query}");
    }
}

// Regression (issue 14, item 8): a patch changing `metadata.uid` answered 409 "too many
// concurrent writes" after 64 retries; a failed JSON-patch operation's cause named no field.
#[tokio::test]
async fn a_patch_of_the_uid_is_a_422_and_a_failed_json_patch_names_its_path() {
    let d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent("uid-1")).await.code, 201);
    let path = "/apis/hive.dev/v1/agents/uid-1";
    let before = api.get(path).await.body;
    let merge = json!({"metadata": {"uid": "00000000-0000-0000-0000-000000000000"}});
    let reply = api.patch(path, "application/merge-patch+json", &merge).await;
    assert_eq!(reply.code, 422, "{}", reply.body);
    assert_eq!(reply.body["details"]["causes"][0]["field"], "metadata.uid", "{}", reply.body);
    let ops = json!([{"op": "replace", "path": "/metadata/uid", "value": "x"}]);
    let reply = api.patch(path, "application/json-patch+json", &ops).await;
    assert_eq!(reply.code, 422, "{}", reply.body);
    assert_eq!(reply.body["details"]["causes"][0]["field"], "metadata.uid", "{}", reply.body);

    let ops = json!([{"op": "test", "path": "/spec/wanted", "value": "Offline"}]);
    let reply = api.patch(path, "application/json-patch+json", &ops).await;
    assert_eq!(reply.code, 422, "{}", reply.body);
    assert_eq!(reply.body["details"]["causes"][0]["field"], "spec.wanted", "{}", reply.body);
    let ops = json!([{"op": "remove", "path": "/spec/config/nope"}]);
    let reply = api.patch(path, "application/json-patch+json", &ops).await;
    assert_eq!(reply.body["details"]["causes"][0]["field"], "spec.config.nope", "{}", reply.body);
    // Nothing changed.
    assert_eq!(
        api.get(path).await.body["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
}
