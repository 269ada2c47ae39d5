//! The command record's tests (`commands.rs`): replays, races between recordings, reused ids.

use std::collections::BTreeMap;

use serde_json::Value;

use super::*;
use crate::store::StoreConfig;

use serde_json::json;

fn command(value: Value) -> FleetCommand {
    serde_json::from_value(value).unwrap()
}

fn provision(id: &str, count: u32) -> FleetCommand {
    command(json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
           "spec": {"provision": {"provider": "process", "count": count}}, "status": {}}))
}

fn ids(store: &Store) -> Vec<u64> {
    store.list("nodes").1.iter().filter_map(|n| n.value()["spec"]["logicalId"].as_u64()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_replays_record_one_command_and_its_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { record(&store, provision("c1", 3), false).await.unwrap() })
        })
        .collect();
    let mut codes = Vec::new();
    for task in tasks {
        codes.push(task.await.unwrap());
    }
    assert_eq!(codes.iter().filter(|c| matches!(c, Recorded::Created(_))).count(), 1);
    assert_eq!(store.list("fleetcommands").1.len(), 1);
    let mut got = ids(&store);
    got.sort();
    assert_eq!(got, [1, 2, 3]);
    let command = store.get("fleetcommands", "c1").unwrap();
    assert_eq!(command.value()["status"]["phase"], "Pending");
    assert_eq!(command.value()["status"]["nodes"], json!(["node-1", "node-2", "node-3"]));
    let node = store.get("nodes", "node-2").unwrap();
    assert_eq!(
        (node.value()["spec"]["command"].as_str(), node.value()["status"]["phase"].as_str()),
        (Some("c1"), Some("Pending"))
    );
}

/// No lock orders recordings (a process-wide one did until issue 29): concurrent
/// POSTs and intakes of different ids each land, on distinct logical ids, by planning
/// again after a lost race.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_recordings_of_different_ids_all_land_on_distinct_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
    let commands = Api::<FleetCommand>::new(&store);
    let mut applied = Vec::new();
    for i in 0..8 {
        applied.push(commands.create(&provision(&format!("applied-{i}"), 2)).await.unwrap());
    }
    let posts = (0..8).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            matches!(
                record(&store, provision(&format!("posted-{i}"), 2), false).await.unwrap(),
                Recorded::Created(_)
            )
        })
    });
    let intakes = applied.into_iter().map(|seen| {
        let store = store.clone();
        tokio::spawn(
            async move { matches!(intake(&store, &seen, "process").await.unwrap(), Intake::Recorded(_)) },
        )
    });
    let tasks: Vec<_> = posts.chain(intakes).collect();
    for task in tasks {
        assert!(task.await.unwrap(), "every command recorded");
    }
    let mut got = ids(&store);
    got.sort();
    assert_eq!(got, (1..=32).collect::<Vec<u64>>(), "two nodes each, no id twice");
}

#[tokio::test]
async fn a_different_body_replays_the_original_and_ids_are_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
    record(&store, provision("a", 2), false).await.unwrap();
    let before = store.revision();
    let Recorded::Replayed(replay) = record(&store, provision("a", 1), false).await.unwrap() else {
        panic!("a used id is replayed")
    };
    assert_eq!(replay.command.spec.provision.as_ref().map(|p| p.count), Some(2), "the original");
    assert!(replay.warning().unwrap().contains("\"a\" was already used with a different body"));
    assert_eq!(store.revision(), before, "nothing written");
    let delete = Mutation::Delete { kind: "nodes", name: "node-2".into(), uid: None, resource_version: None };
    store.commit(delete, false).await.unwrap();
    record(&store, provision("b", 1), false).await.unwrap();
    assert!(store.get("nodes", "node-3").is_some(), "the deleted node's id is not reused");
    let err = record(
        &store,
        {
            let mut c = provision("c", 1);
            c.spec.provision.as_mut().unwrap().provider = "nope".into();
            c
        },
        false,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("spec.provision.provider"), "{err}");
    let kill = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "k"},
                      "spec": {"kill": {"node": "node-1"}}, "status": {}});
    record(&store, command(kill), false).await.unwrap();
    assert_eq!(store.get("nodes", "node-1").unwrap().value()["metadata"]["annotations"][KILLED_BY], "k");
}

#[tokio::test]
async fn a_deleted_id_comes_back_as_its_original_record_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
    record(&store, provision("a", 1), false).await.unwrap();
    let delete =
        Mutation::Delete { kind: "fleetcommands", name: "a".into(), uid: None, resource_version: None };
    store.commit(delete.clone(), false).await.unwrap();
    let Recorded::Replayed(replay) = record(&store, provision("a", 3), false).await.unwrap() else {
        panic!("a deleted id is replayed")
    };
    assert!(replay.restored && replay.differs);
    assert_eq!(replay.command.status.nodes, ["node-1"]);
    assert_eq!(ids(&store), [1], "nothing recorded");
    // Stored by another path (apply) after the delete: the intake restores the original.
    store.commit(delete, false).await.unwrap();
    let applied = Api::<FleetCommand>::new(&store).create(&provision("a", 2)).await.unwrap();
    let Intake::Restored(back) = intake(&store, &applied, "process").await.unwrap() else {
        panic!("the intake restores a used id")
    };
    assert_eq!(back.spec.provision.as_ref().map(|p| p.count), Some(1));
    assert_eq!(ids(&store), [1]);
    // A new id stored by apply is recorded by the intake, once.
    let fresh = Api::<FleetCommand>::new(&store).create(&provision("b", 2)).await.unwrap();
    assert!(matches!(intake(&store, &fresh, "process").await.unwrap(), Intake::Recorded(_)));
    assert!(matches!(intake(&store, &fresh, "process").await.unwrap(), Intake::Skipped));
    let mut got = ids(&store);
    got.sort();
    assert_eq!(got, [1, 2, 3]);
}

/// A store on a fresh one-member etcd cluster (kept alive by the returned cluster).
async fn on_etcd(prefix: &str) -> (crate::store::etcd::cluster::LocalCluster, Store) {
    let cluster = crate::store::etcd::cluster::LocalCluster::start(1).unwrap();
    let etcd = crate::store::etcd::EtcdConfig { endpoints: cluster.endpoints(), prefix: prefix.into() };
    let store = Store::open_etcd(StoreConfig::new("/nonexistent/not-used-on-etcd"), &etcd).await.unwrap();
    (cluster, store)
}

/// Every node of command `id`, by name, with its logical id.
fn nodes_of(store: &Store, id: &str) -> BTreeMap<String, u64> {
    let (_, nodes) = Api::<Node>::new(store).list();
    nodes
        .iter()
        .filter(|n| {
            n.metadata.labels.get(hive_api::names::FLEET_COMMAND_LABEL).map(String::as_str) == Some(id)
        })
        .map(|n| (n.metadata.name.clone(), n.spec.logical_id))
        .collect()
}

/// The nodes `command` names are exactly the stored nodes of its id, on distinct logical
/// ids `first..first + count`.
fn assert_complete(store: &Store, command: &FleetCommand, first: u64, count: u64) {
    let id = &command.metadata.name;
    let stored = nodes_of(store, id);
    let named: Vec<String> = (first..first + count).map(node_name).collect();
    assert_eq!(command.status.nodes, named, "{id}: status.nodes lists every node");
    assert_eq!(
        stored.keys().cloned().collect::<std::collections::BTreeSet<_>>(),
        named.iter().cloned().collect()
    );
    let mut ids: Vec<u64> = stored.values().copied().collect();
    ids.sort_unstable();
    assert_eq!(ids, (first..first + count).collect::<Vec<_>>(), "{id}: distinct logical ids");
}

/// Issue 30 ("txn limits"): a Provision of the most nodes a command may ask for is
/// recorded on etcd, whose transactions take at most 128 operations and 1.5 MiB, by POST
/// and by the intake alike; so is one whose nodes are too large together for one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provision_of_the_most_nodes_a_command_may_ask_for_is_recorded_on_etcd() {
    let (_cluster, store) = on_etcd("/provision-max/").await;
    let max = hive_api::fleet_command::MAX_COUNT;
    let Recorded::Created(posted) = record(&store, provision("posted", max), false).await.unwrap() else {
        panic!("a new id is created")
    };
    assert_complete(&store, &posted, 1, max.into());
    let applied = Api::<FleetCommand>::new(&store).create(&provision("applied", max)).await.unwrap();
    let Intake::Recorded(taken) = intake(&store, &applied, "process").await.unwrap() else {
        panic!("an applied command is recorded")
    };
    assert_complete(&store, &taken, u64::from(max) + 1, max.into());
    // 40 nodes of 60 KiB each: 2.4 MB, over etcd's 1.5 MiB a request.
    let mut fat = provision("fat", 40);
    fat.spec.provision.as_mut().unwrap().bootstrap = Some("x".repeat(60 * 1024));
    let Recorded::Created(fat) = record(&store, fat, false).await.unwrap() else { panic!("created") };
    assert_complete(&store, &fat, 2 * u64::from(max) + 1, 40);
    assert_eq!(next_logical_id(&store).0, 2 * u64::from(max) + 41, "the counter is above them all");
}

/// A recording that stopped after its first transaction (a crash, a failover, etcd gone):
/// the command is Pending and names nodes that were never written. Claiming it for
/// execution writes them first, so no provider is called for a node without a record.
#[tokio::test]
async fn a_claim_completes_the_node_intents_a_crash_left_unwritten() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
    let Recorded::Created(recorded) = record(&store, provision("c", 300), false).await.unwrap() else {
        panic!("created")
    };
    // What the first of several transactions leaves: the command, its claim, the counter
    // and the first nodes; the rest were never written.
    for name in &recorded.status.nodes[100..] {
        let delete =
            Mutation::Delete { kind: "nodes", name: name.clone(), uid: None, resource_version: None };
        store.commit(delete, false).await.unwrap();
    }
    assert_eq!(nodes_of(&store, "c").len(), 100);
    let claim = super::super::intake::claim(&store, "run-1", "c").await.unwrap();
    assert!(matches!(claim, super::super::intake::Claim::Won(_)), "{claim:?}");
    assert_complete(&store, &recorded, 1, 300);
}

/// The crash, on etcd: only a recording's first transaction landed (written here as
/// `record` writes it, and nothing after). The claim, through another replica, writes
/// the other 876 intents before the command can run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_a_claim_completes_a_recording_cut_off_after_its_first_transaction() {
    let (cluster, recorder) = on_etcd("/provision-cut/").await;
    let planned = plan(&recorder, provision("cut", 1000)).unwrap();
    let commands = Api::<FleetCommand>::new(&recorder);
    let mut lead = vec![commands.create_mutation(&planned.record).unwrap(), retained::claim(&planned.record)];
    lead.extend(planned.writes);
    let first = intents::first_group(&recorder, lead, planned.nodes);
    assert_eq!(first.len(), crate::store::etcd::GROUP_LIMIT.writes, "the first transaction is full");
    recorder.commit_all(first, false).await.unwrap();
    assert_eq!(nodes_of(&recorder, "cut").len(), 124, "command, id record, counter and 124 nodes");
    assert_eq!(next_logical_id(&recorder).0, 1001, "the counter is advanced over every node");
    let etcd =
        crate::store::etcd::EtcdConfig { endpoints: cluster.endpoints(), prefix: "/provision-cut/".into() };
    let leader = Store::open_etcd(StoreConfig::new("/nonexistent/not-used-on-etcd"), &etcd).await.unwrap();
    let claim = super::super::intake::claim(&leader, "run-1", "cut").await.unwrap();
    assert!(matches!(claim, super::super::intake::Claim::Won(_)), "{claim:?}");
    assert_complete(&leader, &planned.record, 1, 1000);
}

/// The claimer (the leader) may see a command as soon as its first transaction lands,
/// while the recorder (another replica) still writes the other groups: both write the
/// same intents, each tolerating the other's, and the command runs with all its nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_a_claim_racing_the_later_groups_of_a_recording_completes_them_once() {
    let (cluster, recorder) = on_etcd("/provision-race/").await;
    let etcd =
        crate::store::etcd::EtcdConfig { endpoints: cluster.endpoints(), prefix: "/provision-race/".into() };
    let leader = Store::open_etcd(StoreConfig::new("/nonexistent/not-used-on-etcd"), &etcd).await.unwrap();
    let recording = {
        let recorder = recorder.clone();
        tokio::spawn(async move { record(&recorder, provision("race", 1000), false).await.unwrap() })
    };
    let claimed = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            match super::super::intake::claim(&leader, "run-1", "race").await.unwrap() {
                super::super::intake::Claim::Won(won) => break won,
                // Not recorded yet.
                super::super::intake::Claim::Lost => {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await
                }
                other => panic!("{other:?}"),
            }
        }
    })
    .await
    .expect("claimed in time");
    // Everything the claim saw was written before it answered.
    assert_complete(&leader, claimed.command(), 1, 1000);
    let Recorded::Created(recorded) = recording.await.unwrap() else { panic!("created") };
    assert!(recorder.wait_for_revision(leader.revision(), std::time::Duration::from_secs(10)).await);
    assert_complete(&recorder, &recorded, 1, 1000);
}

/// A node of another command at a name the record gives is reported, never overwritten:
/// the command is Failed, naming the field and the node, and never claimed.
#[tokio::test]
async fn a_node_of_another_command_at_a_recorded_name_fails_the_command_and_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
    record(&store, provision("c", 5), false).await.unwrap();
    let delete = Mutation::Delete { kind: "nodes", name: "node-5".into(), uid: None, resource_version: None };
    store.commit(delete, false).await.unwrap();
    let mut other = Api::<Node>::new(&store).get_existing("node-4").unwrap();
    other.metadata = hive_api::ObjectMeta { name: "node-5".into(), ..Default::default() };
    other.metadata.labels.insert(hive_api::names::FLEET_COMMAND_LABEL.into(), "other".into());
    other.spec.command = Some("other".into());
    Api::<Node>::new(&store).create(&other).await.unwrap();
    let claim = super::super::intake::claim(&store, "run-1", "c").await.unwrap();
    let super::super::intake::Claim::Refused(refused) = claim else { panic!("{claim:?}") };
    assert_eq!(refused.status.phase, Some(FleetCommandPhase::Failed));
    let error = refused.status.error.unwrap_or_default();
    assert!(
        error.contains("status.nodes[4]")
            && error.contains("\"node-5\"")
            && error.contains("command \"other\""),
        "{error}"
    );
    assert_eq!(nodes_of(&store, "other").len(), 1, "the other command's node is kept");
    assert_eq!(retained::get(&store, "c").unwrap().status.phase, Some(FleetCommandPhase::Failed));
    let again = super::super::intake::claim(&store, "run-1", "c").await.unwrap();
    assert!(matches!(again, super::super::intake::Claim::Lost), "{again:?}");
}
