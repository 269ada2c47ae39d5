//! One intake for FleetCommands: a command runs once per id whatever created it (POST,
//! `hive apply`, `kubectl apply` / `create`, server-side apply); a deleted command's id
//! stays used (its retained record survives a restart) so it never provisions or destroys
//! again; a reused id answers the original record (with a `Warning` when the body
//! differs); duplicate offers are refused on every path; a Node's `Ready` condition
//! follows its phase, and Nodes are not created by hand.

use serde_json::{json, Value};

use crate::harness::{eventually, fails, ok, Api, Daemon};
use crate::vastai::{offers, Stand, KEY};

const COMMANDS: &str = "/apis/hive.dev/v1/fleetcommands";
const NODES: &str = "/apis/hive.dev/v1/nodes";
const APPLY: &str = "application/apply-patch+yaml";

fn manifest(name: &str) -> String {
    std::fs::read_to_string(format!("{}/manifests/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

async fn names(api: &Api, path: &str) -> Vec<String> {
    let reply = api.get(path).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    let items = reply.body["items"].as_array().cloned().unwrap_or_default();
    items.iter().map(|i| i["metadata"]["name"].as_str().unwrap_or_default().to_string()).collect()
}

/// Waits until command `id` is terminal; returns it.
async fn finished(api: &Api, id: &str) -> Value {
    eventually(&format!("command {id} to finish"), || async {
        let c = api.get(&format!("{COMMANDS}/{id}")).await.body;
        matches!(c["status"]["phase"].as_str(), Some("Succeeded" | "Failed")).then_some(c)
    })
    .await
}

async fn phase_of(api: &Api, node: &str) -> String {
    api.get(&format!("{NODES}/{node}")).await.body["status"]["phase"].as_str().unwrap_or("").to_string()
}

/// Applies manifests/fleet-command.yaml twice with `apply` and checks that it did what its
/// comment says: two nodes provisioned once, Running.
async fn applied_twice_provisions_once(d: &Daemon, apply: impl Fn(&str) -> String) {
    let api = d.client();
    let file = d.dir.join("fleet-command.yaml");
    std::fs::write(&file, manifest("fleet-command.yaml")).unwrap();
    let f = file.to_str().unwrap();
    apply(f);
    let provision = finished(&api, "provision-3f6c1d2e").await;
    assert_eq!(provision["status"]["phase"], "Succeeded", "{provision}");
    assert_eq!(provision["status"]["nodes"], json!(["node-1", "node-2"]), "{provision}");
    assert_eq!(provision["spec"]["provision"]["provider"], "process", "the default provider: {provision}");
    for node in ["node-1", "node-2"] {
        assert_eq!(phase_of(&api, node).await, "Running");
    }
    apply(f);
    // Give a wrongly repeated provision every chance to show.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(names(&api, NODES).await, ["node-1", "node-2"], "applied twice, provisioned once");
    let again = api.get(&format!("{COMMANDS}/provision-3f6c1d2e")).await.body;
    assert_eq!(again["status"], provision["status"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_command_applied_twice_with_hive_apply_provisions_once() {
    let d = Daemon::start();
    applied_twice_provisions_once(&d, |f| ok(d.hive(&["apply", "-f", f]))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_command_applied_twice_with_kubectl_apply_provisions_once() {
    let d = Daemon::start();
    applied_twice_provisions_once(&d, |f| ok(d.kubectl(&["apply", "-f", f]))).await;
}

fn provision(id: &str, count: u32) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
           "spec": {"provision": {"count": count}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_command_created_by_kubectl_create_or_server_side_apply_runs_once() {
    let d = Daemon::start();
    let api = d.client();
    let file = d.dir.join("c.json");
    std::fs::write(&file, provision("by-create", 1).to_string()).unwrap();
    ok(d.kubectl(&["create", "-f", file.to_str().unwrap()]));
    let ssa =
        api.patch(&format!("{COMMANDS}/by-ssa?fieldManager=test"), APPLY, &provision("by-ssa", 1)).await;
    assert_eq!(ssa.code, 201, "{:?}", ssa.body);
    for id in ["by-create", "by-ssa"] {
        let c = finished(&api, id).await;
        assert_eq!(c["status"]["phase"], "Succeeded", "{c}");
        assert_eq!(c["status"]["nodes"].as_array().map(Vec::len), Some(1), "{c}");
    }
    // kubectl's server-side apply too.
    let file = d.dir.join("ssa.json");
    std::fs::write(&file, provision("by-kubectl-ssa", 1).to_string()).unwrap();
    ok(d.kubectl(&["apply", "--server-side", "-f", file.to_str().unwrap()]));
    let c = finished(&api, "by-kubectl-ssa").await;
    assert_eq!(c["status"]["phase"], "Succeeded", "{c}");
    // A PUT never creates: nothing to run.
    let put = api.put(&format!("{COMMANDS}/by-put"), &provision("by-put", 1)).await;
    assert_eq!(put.code, 404, "{:?}", put.body);
    // Applying again (same body) changes nothing.
    let again =
        api.patch(&format!("{COMMANDS}/by-ssa?fieldManager=test"), APPLY, &provision("by-ssa", 1)).await;
    assert_eq!(again.code, 200, "{:?}", again.body);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(names(&api, NODES).await, ["node-1", "node-2", "node-3"]);
    for node in ["node-1", "node-2", "node-3"] {
        assert_eq!(phase_of(&api, node).await, "Running");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reused_command_id_with_another_body_answers_the_original_with_a_warning() {
    let d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post(COMMANDS, &provision("same", 1)).await.code, 201);
    let original = finished(&api, "same").await;
    let reply = api.post(COMMANDS, &provision("same", 3)).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    assert_eq!(reply.body, original, "the original record");
    let warning = reply.headers.get("warning").map(|w| w.to_str().unwrap().to_string()).unwrap_or_default();
    assert!(warning.starts_with("299 - ") && warning.contains("different"), "{warning:?}");
    let same = api.post(COMMANDS, &provision("same", 1)).await;
    assert_eq!((same.code, same.headers.get("warning")), (200, None), "{:?}", same.body);
    // kubectl create prints the warning.
    let file = d.dir.join("c.json");
    std::fs::write(&file, provision("same", 2).to_string()).unwrap();
    let out = d.kubectl(&["create", "-f", file.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("Warning:"), "{out:?}");
    assert_eq!(names(&api, NODES).await, ["node-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_offers_are_refused_on_every_create_path() {
    let d = Daemon::start();
    let api = d.client();
    let body = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "dup"},
                      "spec": {"provision": {"provider": "vastai", "count": 2, "selectedOfferIds": [7, 7]}}});
    let field = "spec.provision.selectedOfferIds[1]";
    let check = |reply: crate::harness::Reply, path: &str| {
        assert_eq!(reply.code, 422, "{path}: {:?}", reply.body);
        assert_eq!(reply.body["details"]["causes"][0]["field"], field, "{path}: {:?}", reply.body);
    };
    check(api.post(COMMANDS, &body).await, "POST");
    check(api.put(&format!("{COMMANDS}/dup"), &body).await, "PUT");
    check(api.patch(&format!("{COMMANDS}/dup?fieldManager=t"), APPLY, &body).await, "server-side apply");
    let file = d.dir.join("dup.json");
    std::fs::write(&file, body.to_string()).unwrap();
    let f = file.to_str().unwrap();
    assert!(fails(d.hive(&["apply", "-f", f])).contains(field));
    assert!(fails(d.kubectl(&["apply", "-f", f])).contains(field));
    assert_eq!(api.get(&format!("{COMMANDS}/dup")).await.code, 404, "nothing stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_node_is_ready_and_nodes_are_not_created_by_hand() {
    let d = Daemon::start();
    let api = d.client();
    assert_eq!(api.post(COMMANDS, &provision("p", 1)).await.code, 201);
    ok(d.kubectl(&["wait", "--for=condition=Ready", "node/node-1", "--timeout=90s"]));
    let node = api.get(&format!("{NODES}/node-1")).await.body;
    assert_eq!(node["status"]["phase"], "Running", "{node}");
    assert_eq!(
        api.post(
            COMMANDS,
            &json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand",
        "metadata": {"name": "k"}, "spec": {"kill": {"node": "node-1"}}})
        )
        .await
        .code,
        201
    );
    let killed = eventually("node-1 not Ready", || async {
        let n = api.get(&format!("{NODES}/node-1")).await.body;
        let ready = n["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?.clone();
        // Killing (on its way) is not Ready either; wait for where it ends.
        (ready["status"] == "False" && ready["reason"] != "Killing").then_some(ready)
    })
    .await;
    assert_eq!(killed["reason"], "Killed", "{killed}");

    // docs/examples/node.yaml: refused, saying how nodes are made; nothing is stored.
    let file = d.dir.join("node.yaml");
    std::fs::write(
        &file,
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/examples/node.yaml"))
            .unwrap()
            .replace("node-1", "node-7"),
    )
    .unwrap();
    let f = file.to_str().unwrap();
    for err in [fails(d.kubectl(&["apply", "-f", f])), fails(d.hive(&["apply", "-f", f]))] {
        assert!(err.contains("Forbidden") || err.contains("forbidden"), "{err}");
        assert!(err.contains("Nodes are created by Provision FleetCommands"), "{err}");
    }
    let post = api
        .post(
            NODES,
            &json!({"apiVersion": "hive.dev/v1", "kind": "Node", "metadata": {"name": "node-8"},
        "spec": {"logicalId": 8, "provider": "process", "command": "p"}}),
        )
        .await;
    assert_eq!(post.code, 403, "{:?}", post.body);
    assert_eq!(names(&api, NODES).await, ["node-1"], "no phantom node");
}

async fn vast_ready(d: &Daemon, key: &std::path::Path) {
    let key = key.to_str().unwrap();
    ok(d.hive(&["fleet", "configure", "vastai", "--api-key-file", key, "--image", "example/node:cuda"]));
    let api = d.client();
    eventually("provider vastai Ready", || async {
        let p = api.get("/apis/hive.dev/v1/providers/vastai").await.body;
        (p["status"]["state"] == "Ready").then_some(())
    })
    .await;
}

fn vast_provision(id: &str, offers: &[u64]) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
           "spec": {"provision": {"provider": "vastai", "count": offers.len(), "selectedOfferIds": offers}}})
}

/// The answer to a re-created deleted id: the original record (spec, nodes).
fn assert_original(reply: &crate::harness::Reply, offers: &[u64], nodes: &[&str]) {
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    assert_eq!(reply.body["spec"]["provision"]["selectedOfferIds"], json!(offers), "{:?}", reply.body);
    assert_eq!(reply.body["status"]["nodes"], json!(nodes), "{:?}", reply.body);
}

fn warned(reply: &crate::harness::Reply) -> bool {
    reply.headers.get("warning").is_some_and(|w| w.to_str().unwrap_or("").starts_with("299 - "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_command_id_never_provisions_or_destroys_again() {
    let (stand, base) = Stand::start(offers()).await;
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), format!("{KEY}\n")).unwrap();
    let flags = ["--provider", "vastai", "--vastai-base-url", base.as_str()];
    let mut d = Daemon::start_with(&flags);
    vast_ready(&d, key.path()).await;
    let api = d.client();
    let rents = || stand.count("PUT /api/v0/asks/");
    let destroys = || stand.count("DELETE /api/v0/instances/");

    assert_eq!(api.post(COMMANDS, &vast_provision("rent", &[101])).await.code, 201);
    eventually("one rental", || async {
        let c = api.get(&format!("{COMMANDS}/rent")).await.body;
        assert_ne!(c["status"]["phase"], "Failed", "{c}");
        (stand.rentals().len() == 1).then_some(())
    })
    .await;
    let path = format!("{COMMANDS}/rent");
    assert_eq!(api.delete(&path).await.code, 200);
    assert_eq!(api.get(&path).await.code, 404);
    let same = api.post(COMMANDS, &vast_provision("rent", &[101])).await;
    assert_original(&same, &[101], &["node-1"]);
    assert_eq!(api.delete(&path).await.code, 200);
    let other = api.post(COMMANDS, &vast_provision("rent", &[102])).await;
    assert_original(&other, &[101], &["node-1"]);
    assert!(warned(&other), "{:?}", other.headers);
    // Applied (server-side) under the deleted id with another body: the original record
    // replaces the applied one.
    assert_eq!(api.delete(&path).await.code, 200);
    let file = d.dir.join("rent.json");
    std::fs::write(&file, vast_provision("rent", &[104]).to_string()).unwrap();
    ok(d.hive(&["apply", "-f", file.to_str().unwrap()]));
    eventually("the original record back", || async {
        let c = api.get(&path).await.body;
        (c["spec"]["provision"]["selectedOfferIds"] == json!([101])
            && c["status"]["nodes"] == json!(["node-1"]))
        .then_some(())
    })
    .await;

    // A kill, deleted and sent again, destroys once.
    let kill = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "kill-1"},
                      "spec": {"kill": {"node": "node-1"}}});
    assert_eq!(api.post(COMMANDS, &kill).await.code, 201);
    eventually("node-1 Killed", || async { (phase_of(&api, "node-1").await == "Killed").then_some(()) })
        .await;
    finished(&api, "kill-1").await;
    assert_eq!(api.delete(&format!("{COMMANDS}/kill-1")).await.code, 200);
    assert_eq!(api.post(COMMANDS, &kill).await.code, 200);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!((rents(), destroys()), (1, 1), "one create, one destroy");

    // After a restart the ids are still used.
    assert_eq!(api.delete(&path).await.code, 200);
    assert_eq!(api.delete(&format!("{COMMANDS}/kill-1")).await.code, 200);
    d.restart_with(&flags);
    vast_ready(&d, key.path()).await;
    let api = d.client();
    let after = api.post(COMMANDS, &vast_provision("rent", &[102])).await;
    assert_original(&after, &[101], &["node-1"]);
    assert!(warned(&after), "{:?}", after.headers);
    assert_eq!(api.post(COMMANDS, &kill).await.code, 200);
    let ssa = api.patch(&format!("{COMMANDS}/kill-1?fieldManager=t&force=true"), APPLY, &kill).await;
    assert!(ssa.code == 200 || ssa.code == 201, "{:?}", ssa.body);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!((rents(), destroys()), (1, 1), "nothing repeated after the restart");
    assert_eq!(names(&api, NODES).await, ["node-1"]);
}
