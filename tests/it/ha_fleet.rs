//! Agents on fleet nodes outlive the leader among replicas: three `hive serve` replicas on
//! a three-member etcd cluster, each with its own fleet endpoint (as on three hosts) and
//! every replica's address in `--fleet-advertise`; a Vast.ai node (the in-process
//! stand-in of the API, the instance's worker a real `hive fleet-worker` on this host, as
//! the instance's on-start runs it) runs an agent. The leader is killed with SIGKILL: the
//! worker redials the addresses it was given, rejoins whichever replica leads, and the new
//! leader adopts the agent as it runs (same process, same generation, nothing rebuilt) and
//! drives it from then on.

use std::time::Duration;

use hive::store::etcd::cluster::LocalCluster;
use serde_json::{json, Value};

use crate::agents::config_repo;
use crate::fleet_myelin::{instance_worker, recovered, Reap};
use crate::ha::{following, leading};
use crate::harness::{eventually, Daemon};
use crate::placement::{agents_under, placed};
use crate::placement_survival::{generation, jobs_of, running_under};
use crate::vastai::{offers, Stand, KEY};

const AGENTS: &str = "/apis/hive.dev/v1/agents";
const NODES: &str = "/apis/hive.dev/v1/nodes";

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A replica with the built-in `vastai` provider at `base`, its key in its environment
/// (what every replica is started with), its fleet endpoint on `port` and every
/// replica's in `advertise`.
fn replica(store: &str, base: &str, port: u16, advertise: &str) -> Daemon {
    let listen = format!("127.0.0.1:{port}");
    Daemon::start_with_env(
        &[
            "--store",
            store,
            "--provider",
            "vastai",
            "--vastai-base-url",
            base,
            "--fleet-listen",
            &listen,
            "--fleet-advertise",
            advertise,
            "--agent-controller=true",
            "--hive-rev",
            "base-1",
        ],
        &[("VASTAI_API_KEY", KEY)],
    )
}

fn provision(id: &str, offer: u64) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
           "spec": {"provision": {"provider": "vastai", "count": 1, "selectedOfferIds": [offer],
                                  "image": "example/node:cuda"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_on_a_fleet_node_keeps_running_through_a_failover_and_the_new_leader_adopts_it() {
    let (stand, base) = Stand::start(offers()).await;
    let cluster = LocalCluster::start(3).unwrap();
    let store = cluster.url();
    let ports = [free_udp_port(), free_udp_port(), free_udp_port()];
    let advertise = ports.map(|p| format!("127.0.0.1:{p}")).join(",");
    let mut leader = replica(&store, &base, ports[0], &advertise);
    leading(&leader).await;
    let followers =
        [replica(&store, &base, ports[1], &advertise), replica(&store, &base, ports[2], &advertise)];
    for follower in &followers {
        following(follower).await;
    }
    let api = leader.client();
    recovered(&leader, 1).await;

    // A Vast.ai node: its instance is told every replica's fleet address.
    assert_eq!(api.post("/apis/hive.dev/v1/fleetcommands", &provision("rent", 101)).await.code, 201);
    eventually("node-1's instance", || async {
        api.get(&format!("{NODES}/node-1")).await.body["status"]["providerRef"]["instanceId"].as_u64()
    })
    .await;
    let create = stand.lock().last_create.clone();
    let control = create["env"]["HIVE_CONTROL"].as_str().expect("the worker's HIVE_CONTROL").to_string();
    for port in ports {
        assert!(control.contains(&format!("127.0.0.1:{port}")), "every replica's address: {control}");
    }
    let machine = tempfile::tempdir().unwrap();
    let worker = Reap(instance_worker(&create, machine.path()));
    let worker_pid = worker.0.id();
    eventually("node-1 Running", || async {
        (api.get(&format!("{NODES}/node-1")).await.body["status"]["phase"] == "Running").then_some(())
    })
    .await;

    // An agent placed on it, created through a follower.
    let tmp = tempfile::tempdir().unwrap();
    let repo = config_repo(tmp.path());
    let created = followers[0].client().post(AGENTS, &placed("alpha", &repo, "node-1")).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    let pid = running_under(&api, "alpha", worker_pid).await;
    let first = generation(machine.path(), "alpha");
    let name = |job: &Value| job["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let before: Vec<String> = jobs_of(&api, "alpha").await.iter().map(name).collect();

    // The leader dies; a follower leads, recovers the instance, and the worker rejoins it.
    leader.kill9();
    let (new, other) = tokio::select! {
        _ = leading(&followers[0]) => (&followers[0], &followers[1]),
        _ = leading(&followers[1]) => (&followers[1], &followers[0]),
    };
    let api = new.client();
    recovered(new, 1).await;
    eventually("node-1 to rejoin the new leader", || async {
        let n = api.get(&format!("{NODES}/node-1")).await.body;
        (n["status"]["runtime"]["joinedBy"] == "Rejoin" && n["status"]["phase"] == "Running").then_some(())
    })
    .await;

    // Adopted as it runs: the same process, the same generation; the new leader built
    // and started nothing for it (a Reconcile that found it running at most).
    assert_eq!(running_under(&api, "alpha", worker_pid).await, pid, "the same process, not restarted");
    let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
    assert_eq!(agent["status"]["power"], "Running", "{agent}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(agents_under(worker_pid), vec![pid], "still the same process");
    assert_eq!(generation(machine.path(), "alpha"), first, "no new generation");
    for job in jobs_of(&api, "alpha").await {
        if !before.contains(&name(&job)) {
            assert_eq!(job["spec"]["template"], "Reconcile", "only a Reconcile after the failover: {job}");
        }
    }
    assert!(agents_under(new.pid()).is_empty() && agents_under(other.pid()).is_empty(), "no replica runs it");
    assert_eq!(stand.count("PUT /api/v0/asks/"), 1, "nothing was rented again");

    // The new leader drives it: taken Offline through the other replica, its process
    // on the node ends.
    let patched = other
        .client()
        .patch(
            &format!("{AGENTS}/alpha"),
            "application/merge-patch+json",
            &json!({"spec": {"wanted": "Offline"}}),
        )
        .await;
    assert_eq!(patched.code, 200, "{:?}", patched.body);
    eventually("alpha's process to end on the node", || {
        std::future::ready(agents_under(worker_pid).is_empty().then_some(()))
    })
    .await;
    eventually("alpha to be observed stopped", || async {
        let agent = api.get(&format!("{AGENTS}/alpha")).await.body;
        (agent["status"]["power"] == "Stopped").then_some(())
    })
    .await;
    drop(worker);
}
