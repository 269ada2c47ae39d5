//! The daemon's `vastai` provider end to end, against the in-process stand-in of the
//! documented Vast.ai API (`vastai.rs`): it starts Unconfigured, takes a key at runtime
//! (a refused key changes nothing), searches offers, leases exactly the selected offers
//! once however often a command is replayed, destroys once, never lets the key out, and
//! recovers after a restart (adopt / stopped / orphan).

use serde_json::{json, Value};

use crate::harness::{eventually, fails, ok, Api, Daemon};
use crate::vastai::{offers, Stand, KEY};

const COMMANDS: &str = "/apis/hive.dev/v1/fleetcommands";
const NODES: &str = "/apis/hive.dev/v1/nodes";

async fn provider_state(api: &Api) -> String {
    let p = api.get("/apis/hive.dev/v1/providers/vastai").await.body;
    p["status"]["state"].as_str().unwrap_or("").to_string()
}

async fn wait_state(api: &Api, state: &str) {
    eventually(&format!("provider vastai {state}"), || async {
        (provider_state(api).await == state).then_some(())
    })
    .await;
}

async fn node(api: &Api, name: &str) -> Value {
    api.get(&format!("{NODES}/{name}")).await.body
}

async fn wait_phase(api: &Api, name: &str, phase: &str) -> Value {
    eventually(&format!("{name} {phase}"), || async {
        let n = node(api, name).await;
        (n["status"]["phase"] == phase).then_some(n)
    })
    .await
}

fn provision(id: &str, offers: &[u64]) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
           "spec": {"provision": {"provider": "vastai", "count": offers.len(), "selectedOfferIds": offers}}})
}

fn kill(id: &str, node: &str) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
           "spec": {"kill": {"node": node}}})
}

/// POSTs `body` `n` times at once; every answer is the one record (201 once, else 200).
async fn replay(api: &Api, body: &Value, n: usize) -> Vec<u16> {
    let posts = (0..n).map(|_| api.post(COMMANDS, body));
    futures_util::future::join_all(posts).await.into_iter().map(|r| r.code).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vastai_from_unconfigured_to_leases_kill_and_recovery() {
    let (stand, base) = Stand::start(offers()).await;
    let dir = tempfile::tempdir().unwrap();
    let (good, bad) = (dir.path().join("key"), dir.path().join("bad-key"));
    std::fs::write(&good, format!("{KEY}\n")).unwrap();
    std::fs::write(&bad, "not-the-key-0000").unwrap();
    let flags = ["--provider", "vastai", "--vastai-base-url", base.as_str()];
    let mut d = Daemon::start_with(&flags);
    let api = d.client();
    let mut seen = String::new();

    // No key: Unconfigured, and the daemon runs; offers say what to do.
    wait_state(&api, "Unconfigured").await;
    let err = fails(d.hive(&["fleet", "offers"]));
    assert!(err.contains("Unconfigured") && err.contains("hive fleet configure vastai"), "{err}");

    // A refused key changes nothing and is named by its field, never quoted.
    let err = fails(d.hive(&["fleet", "configure", "vastai", "--api-key-file", bad.to_str().unwrap()]));
    assert!(
        err.contains("apiKey") && err.contains("refused the API key") && !err.contains("not-the-key"),
        "{err}"
    );
    assert_eq!(provider_state(&api).await, "Unconfigured");
    let out = ok(d.hive(&[
        "fleet",
        "configure",
        "vastai",
        "--api-key-file",
        good.to_str().unwrap(),
        "--image",
        "example/node:cuda",
    ]));
    assert!(out.contains("provider vastai: Ready"), "{out}");
    let provider = api.get("/apis/hive.dev/v1/providers/vastai").await;
    assert_eq!(provider.body["spec"]["vastai"]["image"], "example/node:cuda");
    seen += &provider.body.to_string();

    // SearchOffers leases nothing.
    let out = ok(d.hive(&["fleet", "offers", "--gpu", "RTX 4090", "--max-price", "0.5", "--num-gpus", "1"]));
    let ids: Vec<&str> = out.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(ids, ["101", "102"], "{out}");
    assert!(stand.rentals().is_empty());
    let bad_query = api.get("/hive/v1/fleet/offers?maxPrice=-1").await;
    assert_eq!(bad_query.code, 400, "{:?}", bad_query.body);

    // Vast.ai needs the exact offers, one per node.
    let mut no_offers = provision("no-offers", &[]);
    no_offers["spec"]["provision"]["count"] = json!(1);
    let none = api.post(COMMANDS, &no_offers).await;
    assert_eq!(none.code, 422, "{:?}", none.body);
    assert!(none.body["message"].as_str().unwrap().contains("selectedOfferIds"), "{:?}", none.body);

    // One command id replayed 100 times at once: one create per node, exactly the offers.
    let codes = replay(&api, &provision("rent", &[101, 102]), 100).await;
    assert_eq!(codes.iter().filter(|c| **c == 201).count(), 1, "{codes:?}");
    assert!(codes.iter().all(|c| *c == 201 || *c == 200), "{codes:?}");
    let n1 = eventually("node-1's instance", || async {
        let n = node(&api, "node-1").await;
        n["status"]["providerRef"]["instanceId"].is_u64().then_some(n)
    })
    .await;
    eventually("both instances", || async { (stand.rentals().len() == 2).then_some(()) }).await;
    let mut rentals = stand.rentals();
    rentals.sort();
    // hive:<fleet>:<command>:<node>
    let fleet = rentals[0].1.split(':').nth(1).unwrap().to_string();
    let label = |c: &str, n: &str| format!("hive:{fleet}:{c}:{n}");
    assert_eq!(rentals, [(101, label("rent", "node-1")), (102, label("rent", "node-2"))]);
    assert_eq!(n1["status"]["phase"], "Provisioning", "no worker has joined: {n1}");
    let created = stand.lock().last_create.clone();
    assert_eq!(created["image"], "example/node:cuda");
    assert_eq!(created["env"]["MYELIN_AGENT_ONLY"], "1");
    assert!(created["env"]["HIVE_CONTROL"].as_str().unwrap().contains('@'), "{created}");
    assert_eq!(replay(&api, &provision("rent", &[101, 102]), 10).await, [200; 10]);
    assert_eq!(stand.count("PUT /api/v0/asks/"), 2, "a replay never rents again");

    // Kill destroys once and keeps the record.
    let codes = replay(&api, &kill("kill-1", "node-1"), 100).await;
    assert_eq!(codes.iter().filter(|c| **c == 201).count(), 1, "{codes:?}");
    let killed = wait_phase(&api, "node-1", "Killed").await;
    let instance = killed["status"]["providerRef"]["instanceId"].as_u64().unwrap();
    assert_eq!(stand.count("DELETE /api/v0/instances/"), 1);
    assert!(!stand.lock().instances.contains_key(&instance));
    // The Provision the Kill interrupted (waiting for node-1's worker to join) sees the kill
    // within its 500 ms poll and goes to destroy too: it must find the work done. (It used
    // to destroy again, a second DELETE whenever the restart below came later than the poll.)
    eventually("the interrupted Provision to reach node-1's kill", || async {
        let log = d.log();
        let kills = log.lines().filter(|l| {
            (l.contains("fleet node killed") || l.contains("fleet node already killed"))
                && l.contains("node-1")
        });
        (kills.count() >= 2).then_some(())
    })
    .await;
    assert_eq!(stand.count("DELETE /api/v0/instances/"), 1, "one destroy for one kill");

    // A record whose instance vanished, and an instance without a record.
    assert_eq!(api.post(COMMANDS, &provision("rent2", &[104])).await.code, 201);
    let n3 = eventually("node-3's instance", || async {
        let n = node(&api, "node-3").await;
        n["status"]["providerRef"]["instanceId"].as_u64()
    })
    .await;
    stand.lock().instances.remove(&n3);
    stand.lock().instances.insert(
        9001,
        json!({"id": 9001, "label": label("lost", "node-50"), "actual_status": "running", "gpu_name": "RTX 4090"}),
    );
    // Another daemon's instance on the same account: not ours to adopt or report.
    stand.lock().instances.insert(
        9002,
        json!({"id": 9002, "label": "hive:0ther0ne:x:node-2", "actual_status": "running", "gpu_name": "RTX 4090"}),
    );

    // Restart: the key was in memory only, so recovery waits for it.
    d.restart_with(&flags);
    let api = d.client();
    wait_state(&api, "Unconfigured").await;
    assert_eq!(node(&api, "node-2").await["status"]["phase"], "Provisioning");
    ok(d.hive(&["fleet", "configure", "vastai", "--api-key-file", good.to_str().unwrap()]));
    let n3 = wait_phase(&api, "node-3", "Stopped").await;
    assert!(n3["status"]["error"].as_str().unwrap().contains("not recreated"), "{n3}");
    let orphan = wait_phase(&api, "orphan-vastai-9001", "Orphaned").await;
    assert!(orphan["status"]["error"].as_str().unwrap().contains("node node-50 of command lost"), "{orphan}");
    assert!(stand.lock().instances.contains_key(&9001), "the orphan is left untouched");
    assert_eq!(api.get(&format!("{NODES}/orphan-vastai-9002")).await.code, 404, "another fleet's instance");
    let n2 = eventually("node-2 adopted", || async {
        let n = node(&api, "node-2").await;
        n["status"]["error"].as_str().is_some_and(|e| e.contains("adopted")).then_some(n)
    })
    .await;
    assert_eq!(n2["status"]["phase"], "Provisioning", "{n2}");
    assert_eq!(stand.count("DELETE /api/v0/instances/"), 1, "recovery destroys nothing");
    assert_eq!(stand.count("PUT /api/v0/asks/"), 3, "recovery creates nothing");
    let status = ok(d.hive(&["fleet", "status"]));
    assert!(status.contains("orphan-vastai-9001") && status.contains("Orphaned"), "{status}");

    // The key appears in no response and no log line.
    for path in ["/apis/hive.dev/v1/providers", NODES, COMMANDS] {
        seen += &api.get(path).await.body.to_string();
    }
    seen += &status;
    seen += &d.log();
    assert!(!seen.contains(KEY), "the Vast.ai key leaked");
    assert!(!stand.lock().key_in_url);
}
