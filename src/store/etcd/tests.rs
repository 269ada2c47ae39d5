//! The store on a real etcd cluster (Debian's `etcd`, three members on 127.0.0.1): three
//! stores stand for three replicas.

use std::time::Duration;

use serde_json::{json, Value};

use super::cluster::LocalCluster;
use super::lease::{Election, ElectionConfig, Leadership};
use super::EtcdConfig;
use crate::store::{Error, EventType, Mutation, Outcome, Store, StoreConfig, Subresource};

fn agent(name: &str, replicas: u64) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name}, "spec": {"n": replicas}})
}

fn create(name: &str) -> Mutation {
    Mutation::Create { kind: "agents", object: agent(name, 0) }
}

/// A replica's store on `cluster`, talking to member `first` first, under `prefix`.
async fn replica(
    cluster: &LocalCluster,
    first: usize,
    prefix: &str,
    tune: impl FnOnce(&mut StoreConfig),
) -> Store {
    let mut endpoints = cluster.endpoints();
    endpoints.rotate_left(first);
    let mut config = StoreConfig::new("/nonexistent/not-used-on-etcd");
    tune(&mut config);
    Store::open_etcd(config, &EtcdConfig { endpoints, prefix: prefix.into() }).await.unwrap()
}

async fn replicas(cluster: &LocalCluster, prefix: &str) -> Vec<Store> {
    let mut stores = Vec::new();
    for i in 0..cluster.members.len() {
        stores.push(replica(cluster, i, prefix, |_| {}).await);
    }
    stores
}

async fn next_event(watch: &mut crate::store::Watch) -> crate::store::StoreEvent {
    tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("an event in time")
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_every_replica_reach_every_replicas_watch_in_the_same_order() {
    let cluster = LocalCluster::start(3).unwrap();
    let stores = replicas(&cluster, "/t1/").await;
    let mut watches: Vec<_> = stores.iter().map(|s| s.watch("agents", s.revision()).unwrap()).collect();
    let mut writers = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let store = store.clone();
        writers.push(tokio::spawn(async move {
            for j in 0..10 {
                store.commit(create(&format!("r{i}-{j}")), false).await.unwrap();
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let mut seen: Vec<Vec<(u64, String)>> = Vec::new();
    for watch in &mut watches {
        let mut events = Vec::new();
        while events.len() < 30 {
            let event = next_event(watch).await;
            assert_eq!(event.type_, EventType::Added);
            events.push((event.revision, event.object.name()));
        }
        assert!(events.windows(2).all(|w| w[0].0 < w[1].0), "revisions rise: {events:?}");
        seen.push(events);
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0], seen[2]);
    for store in &stores {
        assert_eq!(store.list("agents").1.len(), 30, "every replica's cache has every object");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_resource_version_is_a_conflict_on_every_replica() {
    let cluster = LocalCluster::start(3).unwrap();
    let stores = replicas(&cluster, "/t2/").await;
    let created = stores[0].commit(create("a"), false).await.unwrap().into_object();
    let stale = created.value();
    let mut newer = stale.clone();
    newer["spec"]["n"] = json!(1);
    let updated = stores[1]
        .commit(Mutation::Update { kind: "agents", object: newer, subresource: Subresource::Main }, false)
        .await
        .unwrap();
    assert!(matches!(updated, Outcome::Updated(_)));
    assert!(updated.object().revision() > created.revision());
    for store in &stores {
        // Replica 0 may not have seen the update yet: etcd's guard catches it all the same.
        let mut again = stale.clone();
        again["spec"]["n"] = json!(7);
        let result = store
            .commit(Mutation::Update { kind: "agents", object: again, subresource: Subresource::Main }, false)
            .await;
        assert!(matches!(result, Err(Error::Conflict { .. })), "{result:?}");
    }
    assert_eq!(stores[2].get("agents", "a").unwrap().value()["spec"]["n"], json!(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_planned_on_a_stale_cache_is_planned_again_not_lost() {
    let cluster = LocalCluster::start(1).unwrap();
    let (a, b) = (replica(&cluster, 0, "/t3/", |_| {}).await, replica(&cluster, 0, "/t3/", |_| {}).await);
    a.commit(create("x"), false).await.unwrap();
    // Both replicas update without preconditions, racing: every write lands, in some order.
    let mut writers = Vec::new();
    for (store, tag) in [(a.clone(), "a"), (b.clone(), "b")] {
        writers.push(tokio::spawn(async move {
            for i in 0..20 {
                let mut object = store.get("agents", "x").map(|o| o.value()).unwrap_or_else(|| agent("x", 0));
                object["metadata"].as_object_mut().unwrap().remove("resourceVersion");
                object["metadata"]["labels"] = json!({ tag: i.to_string() });
                store
                    .commit(
                        Mutation::Update { kind: "agents", object, subresource: Subresource::Main },
                        false,
                    )
                    .await
                    .unwrap();
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let (_, objects) = b.list("agents");
    assert_eq!(objects.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_is_one_transaction_and_a_resumed_watch_gets_all_of_its_revision() {
    let cluster = LocalCluster::start(1).unwrap();
    let store = replica(&cluster, 0, "/t4/", |_| {}).await;
    let start = store.revision();
    let outcomes = store.commit_all(vec![create("g1"), create("g2"), create("g3")], false).await.unwrap();
    let revisions: Vec<u64> = outcomes.iter().map(|o| o.object().revision()).collect();
    assert!(revisions.iter().all(|r| *r == revisions[0] && *r > start), "{revisions:?}");
    for (outcome, name) in outcomes.iter().zip(["g1", "g2", "g3"]) {
        assert_eq!(outcome.object().value()["metadata"]["resourceVersion"], json!(revisions[0].to_string()));
        assert_eq!(
            store.get("agents", name).unwrap().json(),
            outcome.object().json(),
            "the answer is what is cached"
        );
    }
    // A watcher that saw g1 at that revision and resumes from it misses neither g2 nor g3.
    let mut resumed = store.watch("agents", revisions[0]).unwrap();
    let mut names = Vec::new();
    for _ in 0..3 {
        names.push(next_event(&mut resumed).await.object.name());
    }
    names.sort();
    assert_eq!(names, ["g1", "g2", "g3"]);
    // A failing group writes nothing.
    let failed = store.commit_all(vec![create("g4"), create("g1")], false).await;
    assert!(matches!(failed, Err(Error::AlreadyExists { .. })), "{failed:?}");
    assert!(store.get("agents", "g4").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_before_retention_is_expired() {
    let cluster = LocalCluster::start(1).unwrap();
    let store = replica(&cluster, 0, "/t5/", |c| c.retention_events = 4).await;
    let start = store.revision();
    for i in 0..10 {
        store.commit(create(&format!("e{i}")), false).await.unwrap();
    }
    assert!(matches!(store.watch("agents", start), Err(Error::Expired { .. })));
    let recent = store.revision();
    assert!(store.watch("agents", recent).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_drops_etcds_history_to_what_the_event_log_retains_and_a_lagging_replica_reloads() {
    let cluster = LocalCluster::start(1).unwrap();
    let store = replica(&cluster, 0, "/t9/", |c| c.retention_events = 4).await;
    let start = store.revision();
    for i in 0..10 {
        store.commit(create(&format!("c{i}")), false).await.unwrap();
    }
    let backend = store.etcd().unwrap();
    let compacted = backend.compact().await.unwrap().expect("history to drop");
    assert_eq!(compacted, store.stats().compacted);
    assert!(compacted > start);
    assert_eq!(backend.compact().await.unwrap(), None, "nothing more to drop");
    let old = backend.client().range(b"/t9/", b"/t90", 0, start + 1).await;
    assert!(old.is_err_and(|e| e.is_compacted()), "etcd has dropped the old revisions");
    // A replica started now loads every object and follows new writes.
    let late = replica(&cluster, 0, "/t9/", |_| {}).await;
    assert_eq!(late.list("agents").1.len(), 10);
    let written = store.commit(create("c10"), false).await.unwrap();
    assert!(late.wait_for_revision(written.object().revision(), Duration::from_secs(5)).await);
    assert!(late.get("agents", "c10").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_and_finalizers_reach_other_replicas() {
    let cluster = LocalCluster::start(1).unwrap();
    let (a, b) = (replica(&cluster, 0, "/t6/", |_| {}).await, replica(&cluster, 0, "/t6/", |_| {}).await);
    let mut object = agent("f", 0);
    object["metadata"]["finalizers"] = json!(["hive.dev/test"]);
    let created = a.commit(Mutation::Create { kind: "agents", object }, false).await.unwrap();
    assert!(b.wait_for_revision(created.object().revision(), Duration::from_secs(5)).await);
    let mut watch = b.watch("agents", b.revision()).unwrap();
    let deleting = a
        .commit(
            Mutation::Delete { kind: "agents", name: "f".into(), uid: None, resource_version: None },
            false,
        )
        .await
        .unwrap();
    assert!(matches!(deleting, Outcome::Deleting(_)));
    // The watch from the create's revision gets the create again first (see `Store::watch`).
    let mut events = vec![next_event(&mut watch).await, next_event(&mut watch).await];
    let mut last = b.get("agents", "f").unwrap().value();
    last["metadata"]["finalizers"] = json!([]);
    let gone = a
        .commit(Mutation::Update { kind: "agents", object: last, subresource: Subresource::Main }, false)
        .await;
    assert!(matches!(gone, Ok(Outcome::Deleted(_))), "{gone:?}");
    events.push(next_event(&mut watch).await);
    let types: Vec<EventType> = events.iter().map(|e| e.type_).collect();
    assert_eq!(types, [EventType::Added, EventType::Modified, EventType::Deleted]);
    assert_eq!(events[0].revision, created.object().revision());
    tokio::time::timeout(Duration::from_secs(5), async {
        while b.get("agents", "f").is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_over_etcds_transaction_limit_is_refused_whole() {
    let cluster = LocalCluster::start(1).unwrap();
    let store = replica(&cluster, 0, "/t7/", |_| {}).await;
    let many: Vec<Mutation> = (0..=super::MAX_TXN_OPS).map(|i| create(&format!("n{i}"))).collect();
    let result = store.commit_all(many, false).await;
    assert!(matches!(result, Err(Error::TooLarge { .. })), "{result:?}");
    assert!(store.list("agents").1.is_empty());
}

/// The fence of the election `state` follows, once it leads (within 10 s).
async fn elected(state: &mut tokio::sync::watch::Receiver<Leadership>) -> super::lease::Fence {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Leadership::Leader(fence) = state.borrow_and_update().clone() {
                return fence;
            }
            state.changed().await.unwrap();
        }
    })
    .await
    .expect("elected within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_fenced_writes_fail_and_another_replica_leads() {
    let cluster = LocalCluster::start(1).unwrap();
    let (a, b) = (replica(&cluster, 0, "/t8/", |_| {}).await, replica(&cluster, 0, "/t8/", |_| {}).await);
    let config = |who: &str| ElectionConfig {
        ttl: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(700),
        identity: who.into(),
    };
    let key = a.etcd().unwrap().internal_key("leader");
    let first = Election::new(a.etcd().unwrap().client().clone(), key.clone(), config("a"));
    let mut first_state = first.subscribe();
    let (stop_first, stopped_first) = tokio::sync::watch::channel(false);
    let first_task = tokio::spawn(async move { first.run(stopped_first).await });
    let fence = elected(&mut first_state).await;
    a.etcd().unwrap().set_fence(Some(fence.clone()));
    a.commit(create("led"), false).await.unwrap();

    let second = Election::new(b.etcd().unwrap().client().clone(), key, config("b"));
    let mut second_state = second.subscribe();
    let (_stop_second, stopped_second) = tokio::sync::watch::channel(false);
    tokio::spawn(async move { second.run(stopped_second).await });
    // The first resigns; the second takes over with a higher epoch.
    stop_first.send(true).unwrap();
    first_task.await.unwrap();
    let second_fence = elected(&mut second_state).await;
    assert!(second_fence.epoch > fence.epoch);
    let refused = a.commit(create("after"), false).await;
    assert!(matches!(refused, Err(Error::NotLeader { .. })), "{refused:?}");
    assert!(b.get("agents", "after").is_none());
    b.etcd().unwrap().set_fence(Some(second_fence));
    b.commit(create("after"), false).await.unwrap();
}

#[test]
fn a_store_url_names_every_member_and_a_bad_one_says_what_is_wrong() {
    let config = EtcdConfig::parse("etcd://10.0.0.1:2379,10.0.0.2:2379").unwrap();
    assert_eq!(config.endpoints, ["10.0.0.1:2379", "10.0.0.2:2379"]);
    assert_eq!(config.prefix, "/hive/");
    assert_eq!(EtcdConfig::parse("etcd://h:1/prod").unwrap().prefix, "/prod/");
    for (bad, says) in [
        ("http://h:2379", "not an etcd URL"),
        ("etcd://h", "has no port"),
        ("etcd://h:port", "is not HOST:PORT"),
        ("etcd://:2379", "is not HOST:PORT"),
        ("etcd://h:1,", "has no port"),
    ] {
        let error = EtcdConfig::parse(bad).unwrap_err();
        assert!(error.contains(says), "{bad}: {error}");
    }
}

/// A TCP proxy in front of one etcd member that can lose what etcd answers: while
/// `lossy` is set, an answer's first bytes are thrown away and both connections closed,
/// so the request was applied but its sender never hears of it.
struct LossyProxy {
    port: u16,
    lossy: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl LossyProxy {
    async fn start(upstream: String) -> LossyProxy {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let lossy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = lossy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { continue };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                tokio::spawn(async move { tokio::io::copy(&mut client_read, &mut server_write).await });
                let flag = flag.clone();
                tokio::spawn(async move {
                    let mut buffer = vec![0; 64 << 10];
                    loop {
                        let Ok(n) = server_read.read(&mut buffer).await else { return };
                        if n == 0 || flag.load(Ordering::SeqCst) {
                            // Lost on the way back: the client sees the connection close.
                            let _ = client_write.shutdown().await;
                            return;
                        }
                        if client_write.write_all(&buffer[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        LossyProxy { port, lossy }
    }

    fn lose_answers(&self, lose: bool) {
        self.lossy.store(lose, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_was_lost_is_read_back_and_answered_once() {
    let cluster = LocalCluster::start(1).unwrap();
    let proxy = LossyProxy::start(cluster.endpoints()[0].clone()).await;
    // The proxy first, the member itself second: what the proxy loses is read back there.
    let endpoints = vec![format!("127.0.0.1:{}", proxy.port), cluster.endpoints()[0].clone()];
    let store = Store::open_etcd(
        StoreConfig::new("/nonexistent/not-used-on-etcd"),
        &EtcdConfig { endpoints, prefix: "/t10/".into() },
    )
    .await
    .unwrap();
    let mut watch = store.watch("agents", store.revision()).unwrap();
    proxy.lose_answers(true);
    let created = store.commit(create("once"), false).await;
    proxy.lose_answers(false);
    let created = created.expect("the write is found applied and answered as such");
    assert!(matches!(created, Outcome::Created(_)), "{created:?}");
    assert_eq!(store.get("agents", "once").unwrap().json(), created.object().json());
    // Exactly one write happened: one event, and an update from the answer works.
    let event = next_event(&mut watch).await;
    assert_eq!((event.type_, event.revision), (EventType::Added, created.object().revision()));
    let mut next = created.object().value();
    next["spec"]["n"] = json!(2);
    let updated = store
        .commit(Mutation::Update { kind: "agents", object: next, subresource: Subresource::Main }, false)
        .await;
    assert!(matches!(updated, Ok(Outcome::Updated(_))), "{updated:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_document_is_swapped_only_from_what_was_read_and_reaches_every_replica() {
    let cluster = LocalCluster::start(1).unwrap();
    let stores = [replica(&cluster, 0, "/docs/", |_| {}).await, replica(&cluster, 0, "/docs/", |_| {}).await];
    let a = stores[0].etcd().unwrap().doc("tokens").await.unwrap();
    let b = stores[1].etcd().unwrap().doc("tokens").await.unwrap();
    assert_eq!(a.current(), None);
    let mut b_changes = b.changes();

    let first = a.swap(None, b"one".to_vec()).await.unwrap().expect("created while absent");
    tokio::time::timeout(Duration::from_secs(10), b_changes.wait_for(|v| v.as_ref() == Some(&first)))
        .await
        .expect("the other replica hears of the document")
        .unwrap();

    // A swap from a stale reading (absent) changes nothing and says what is there now.
    let moved = b.swap(None, b"two".to_vec()).await.unwrap().expect_err("the document exists");
    assert_eq!(moved.0.as_ref(), Some(&first));
    let second =
        b.swap(Some(first.revision), b"two".to_vec()).await.unwrap().expect("swapped from what was read");
    assert!(second.revision > first.revision);
    let mut a_changes = a.changes();
    tokio::time::timeout(Duration::from_secs(10), a_changes.wait_for(|v| v.as_ref() == Some(&second)))
        .await
        .expect("the first replica hears of the change")
        .unwrap();
    for store in stores {
        store.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_through_another_replica_right_after_a_write_sees_it() {
    let cluster = LocalCluster::start(1).unwrap();
    let stores = [replica(&cluster, 0, "/rw/", |_| {}).await, replica(&cluster, 0, "/rw/", |_| {}).await];
    for i in 0..200 {
        let name = format!("a{i}");
        stores[0].commit(create(&name), false).await.unwrap();
        // Linearizable: the write was acknowledged before this read began, on any replica.
        let read = stores[1].get_consistent("agents", &name).await.unwrap();
        assert!(read.is_some(), "read {i} through the other replica missed an acknowledged write");
        let deleted =
            Mutation::Delete { kind: "agents", name: name.clone(), uid: None, resource_version: None };
        stores[1].commit(deleted, false).await.unwrap();
        assert!(
            stores[0].get_consistent("agents", &name).await.unwrap().is_none(),
            "read {i} saw a deleted object"
        );
    }
    for store in stores {
        store.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synced_list_holds_every_write_acknowledged_before_it_whatever_else_etcd_holds() {
    let cluster = LocalCluster::start(1).unwrap();
    let stores = [replica(&cluster, 0, "/sy/", |_| {}).await, replica(&cluster, 0, "/sy/", |_| {}).await];
    let elsewhere = replica(&cluster, 0, "/elsewhere/", |_| {}).await;
    for i in 0..100 {
        let name = format!("a{i}");
        stores[0].commit(create(&name), false).await.unwrap();
        stores[1].sync().await.unwrap();
        let (_, listed) = stores[1].list("agents");
        assert_eq!(listed.len(), i + 1, "list {i} through the other replica missed an acknowledged write");
        // Revisions this replica's feed never sees (another prefix's writes): the sync
        // cannot wait for them, and must not fail.
        elsewhere.commit(create(&name), false).await.unwrap();
        stores[1].sync().await.expect("a sync past revisions of keys outside the prefix");
    }
    for store in stores {
        store.shutdown().await;
    }
    elsewhere.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_campaigns_when_its_feed_sees_the_leader_key_go_not_at_its_next_poll() {
    let cluster = LocalCluster::start(1).unwrap();
    let (a, b) = (replica(&cluster, 0, "/wake/", |_| {}).await, replica(&cluster, 0, "/wake/", |_| {}).await);
    // A follower polls every quarter TTL: ten minutes here, longer than this test waits.
    let config = |who: &str| ElectionConfig {
        ttl: Duration::from_secs(2400),
        renew_deadline: Duration::from_secs(60),
        identity: who.into(),
    };
    let first = a.etcd().unwrap().election(config("a"));
    let mut first_state = first.subscribe();
    let (stop_first, stopped_first) = tokio::sync::watch::channel(false);
    let first_task = tokio::spawn(async move { first.run(stopped_first).await });
    let fence = elected(&mut first_state).await;

    let second = b.etcd().unwrap().election(config("b"));
    let mut second_state = second.subscribe();
    let (_stop_second, stopped_second) = tokio::sync::watch::channel(false);
    tokio::spawn(async move { second.run(stopped_second).await });
    tokio::time::timeout(
        Duration::from_secs(10),
        second_state.wait_for(|s| *s == Leadership::Follower(Some("a".into()))),
    )
    .await
    .expect("the second follows the first")
    .unwrap();
    // The first resigns (its key is deleted): the second's feed hears it and campaigns.
    stop_first.send(true).unwrap();
    first_task.await.unwrap();
    let second_fence = elected(&mut second_state).await;
    assert!(second_fence.epoch > fence.epoch);
}

/// Writes that arrive together through one replica share etcd transactions (a group
/// commit): each is answered as it would be alone — every create of a new name is
/// durable at the revision it was answered with, the second create of a name is
/// AlreadyExists, an update at a stale resourceVersion is a Conflict, and one that
/// another replica's stale cache planned wrong is sorted out alone — and every replica's
/// watch sees every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_arrive_together_share_a_transaction_and_each_is_answered_as_alone() {
    let cluster = LocalCluster::start(1).unwrap();
    let stores =
        [replica(&cluster, 0, "/group/", |_| {}).await, replica(&cluster, 0, "/group/", |_| {}).await];
    let (a, b) = (&stores[0], &stores[1]);
    let old = a.commit(create("old"), false).await.unwrap().into_object();
    let mut newer = old.value();
    newer["spec"]["n"] = json!(1);
    b.commit(Mutation::Update { kind: "agents", object: newer, subresource: Subresource::Main }, false)
        .await
        .unwrap();
    let mut watch = b.watch("agents", b.revision()).unwrap();

    let mut writes = tokio::task::JoinSet::new();
    for i in 0..96 {
        let store = a.clone();
        writes.spawn(async move { (format!("n{i}"), store.commit(create(&format!("n{i}")), false).await) });
    }
    for _ in 0..2 {
        let store = a.clone();
        writes.spawn(async move { ("dup".to_string(), store.commit(create("dup"), false).await) });
    }
    let mut stale = old.value();
    stale["spec"]["n"] = json!(9);
    let store = a.clone();
    writes.spawn(async move {
        let update = Mutation::Update { kind: "agents", object: stale, subresource: Subresource::Main };
        ("old".to_string(), store.commit(update, false).await)
    });
    let (mut revisions, mut dups, mut created) = (std::collections::BTreeSet::new(), Vec::new(), Vec::new());
    while let Some(joined) = writes.join_next().await {
        let (name, result) = joined.unwrap();
        match (name.as_str(), result) {
            ("dup", result) => dups.push(result),
            ("old", result) => assert!(matches!(result, Err(Error::Conflict { .. })), "{result:?}"),
            (_, Ok(Outcome::Created(object))) => {
                revisions.insert(object.revision());
                created.push((name, object.revision()));
            }
            (_, other) => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(dups.iter().filter(|r| matches!(r, Ok(Outcome::Created(_)))).count(), 1, "{dups:?}");
    assert_eq!(dups.iter().filter(|r| matches!(r, Err(Error::AlreadyExists { .. }))).count(), 1, "{dups:?}");
    assert!(revisions.len() < created.len(), "96 creates in {} transactions: none shared", revisions.len());
    for (name, revision) in &created {
        // Durable at the revision answered, as another replica reads it from etcd.
        let stored = b.get_consistent("agents", name).await.unwrap().expect("a created object");
        assert_eq!(stored.revision(), *revision, "{name}");
    }
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 97 {
        let event = next_event(&mut watch).await;
        if event.object.name() == "old" {
            continue; // the update at the watch's first revision, again
        }
        assert_eq!(event.type_, EventType::Added, "{}", event.object.name());
        seen.insert(event.object.name());
    }
    assert!(created.iter().all(|(name, _)| seen.contains(name)) && seen.contains("dup"));
    assert_eq!(b.get_consistent("agents", "old").await.unwrap().unwrap().value()["spec"]["n"], json!(1));
    for store in stores {
        store.shutdown().await;
    }
}
