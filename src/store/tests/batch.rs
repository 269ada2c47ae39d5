//! Group commit: a batch planned as a whole, failures confined to their writer, a failed
//! transaction failing everyone, and many concurrent writers.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::json;
use tokio::sync::oneshot;

use super::super::commit::{commit_batch, Request};
use super::super::{Error, Mutation, Outcome, Result, Store};
use super::{agent, config, create, loaded, open, parts, rv, update, TestClock};

fn request(mutations: Vec<Mutation>) -> (Request, oneshot::Receiver<Result<Vec<Outcome>>>) {
    let (reply, answer) = oneshot::channel();
    (Request { mutations, reply }, answer)
}

fn answers(receivers: Vec<oneshot::Receiver<Result<Vec<Outcome>>>>) -> Vec<Result<Vec<Outcome>>> {
    receivers.into_iter().map(|mut r| r.try_recv().unwrap()).collect()
}

#[test]
fn one_batch_sees_its_own_writes_and_fails_only_the_invalid_writer() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::new();
    let (shared, mut log) = parts(dir.path(), &clock);
    let mut respec = agent("a1", "Offline");
    respec["metadata"]["resourceVersion"] = json!("1");
    let (requests, receivers): (Vec<_>, Vec<_>) = [
        vec![create(agent("a1", "Up"))],
        vec![update(respec)],
        vec![create(agent("a1", "Up"))],
        vec![update(agent("missing", "Up"))],
        vec![create(agent("a2", "Up"))],
    ]
    .into_iter()
    .map(request)
    .unzip();
    commit_batch(&shared, &mut log, requests);

    let answers = answers(receivers);
    assert!(matches!(&answers[0], Ok(o) if matches!(&o[0], Outcome::Created(x) if rv(x) == 1)));
    let Ok(updated) = &answers[1] else { panic!("{:?}", answers[1]) };
    assert_eq!(rv(updated[0].object()), 2, "the update saw the create of the same batch");
    assert_eq!(updated[0].object().value()["metadata"]["generation"], 2);
    assert!(matches!(answers[2], Err(Error::AlreadyExists { .. })));
    assert!(matches!(answers[3], Err(Error::NotFound { .. })));
    assert!(matches!(&answers[4], Ok(o) if rv(o[0].object()) == 3));
    assert_eq!(shared.read().revision, 3);

    drop(log);
    let state = loaded(dir.path());
    assert_eq!(state.revision, 3);
    assert_eq!(state.get("agents", "a1").unwrap().value()["spec"]["wanted"], "Offline");
    assert_eq!(state.log.len(), 3);
}

#[test]
fn a_failed_transaction_fails_every_writer_and_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (shared, mut log) = parts(dir.path(), &TestClock::new());
    shared.fail_next_append.store(true, Ordering::SeqCst);
    let (requests, receivers): (Vec<_>, Vec<_>) =
        [vec![create(agent("a1", "Up"))], vec![create(agent("a2", "Up"))], vec![update(agent("x", "Up"))]]
            .into_iter()
            .map(request)
            .unzip();
    commit_batch(&shared, &mut log, requests);
    for answer in answers(receivers) {
        assert!(matches!(answer, Err(Error::Log { .. })), "{answer:?}");
    }
    assert!(shared.unhealthy().is_some());
    assert_eq!(shared.read().revision, 0);
    assert!(shared.read().get("agents", "a1").is_none());
    assert!(shared.read().log.is_empty());
    drop(log);
    let state = loaded(dir.path());
    assert_eq!((state.revision, state.object_count()), (0, 0));
}

#[tokio::test]
async fn the_store_recovers_after_a_failed_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut watch = store.watch("agents", 0).unwrap();
    store.inner.shared.fail_next_append.store(true, Ordering::SeqCst);
    let err = store.commit(create(agent("a1", "Up")), false).await.unwrap_err();
    assert!(matches!(err, Error::Log { .. }), "{err:?}");
    assert!(store.get("agents", "a1").is_none());
    let created = store.commit(create(agent("a1", "Up")), false).await.unwrap();
    assert_eq!(rv(created.object()), 1);
    assert_eq!(watch.next().await.unwrap().unwrap().revision, 1);
}

/// A writer told its commit failed finds the store unhealthy at once: `/readyz` asked the
/// moment a client got its 507 must not answer "ok". (The commit thread used to mark
/// the store unhealthy only after answering the batch, so a quick probe slipped in.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_is_unhealthy_before_its_writers_hear_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.inner.shared.dawdle_after_failure.store(true, Ordering::SeqCst);
    for round in 0..5 {
        store.inner.shared.fail_next_append.store(true, Ordering::SeqCst);
        let err = store.commit(create(agent(&format!("a{round}"), "Up")), false).await.unwrap_err();
        assert!(matches!(err, Error::Log { .. }), "{err:?}");
        assert!(store.health().is_err(), "round {round}: healthy right after a failed commit");
        // The next batch reopens the database.
        store.commit(create(agent(&format!("b{round}"), "Up")), false).await.unwrap();
        assert!(store.health().is_ok());
    }
}

/// 50 writers × 20 writes each: every write acknowledged with a unique revision,
/// revisions increase per writer, and everything is there after reopening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_are_all_durable_with_unique_revisions() {
    const WRITERS: usize = 50;
    const WRITES: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let started = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let name = format!("a{w}");
                let created = store.commit(create(agent(&name, "0")), false).await.unwrap();
                let mut revisions = vec![rv(created.object())];
                let mut object = created.object().value();
                for i in 1..WRITES {
                    object["spec"]["wanted"] = json!(i.to_string());
                    let updated = store.commit(update(object), false).await.unwrap();
                    revisions.push(rv(updated.object()));
                    object = updated.object().value();
                }
                revisions
            })
        })
        .collect();
    let mut all = HashSet::new();
    for task in tasks {
        let revisions = task.await.unwrap();
        assert!(revisions.windows(2).all(|w| w[0] < w[1]), "{revisions:?}");
        all.extend(revisions);
    }
    let elapsed = started.elapsed();
    let total = (WRITERS * WRITES) as u64;
    assert_eq!(all.len() as u64, total);
    assert_eq!(all.iter().max(), Some(&total));
    eprintln!(
        "{total} writes from {WRITERS} concurrent writers in {elapsed:?} ({:.0} commits/s)",
        total as f64 / elapsed.as_secs_f64()
    );
    store.shutdown().await;

    let store = Store::open(config(dir.path(), &TestClock::new())).unwrap();
    assert_eq!(store.revision(), total);
    let (_, objects) = store.list("agents");
    assert_eq!(objects.len(), WRITERS);
    for object in objects {
        assert_eq!(object.value()["spec"]["wanted"], (WRITES - 1).to_string());
        assert_eq!(object.value()["metadata"]["generation"], WRITES as i64);
    }
}

/// The same writes one at a time, to compare with the batched rate above.
#[tokio::test]
async fn sequential_commit_rate() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let started = Instant::now();
    for i in 0..100 {
        store.commit(create(agent(&format!("a{i}"), "Up")), false).await.unwrap();
    }
    let elapsed = started.elapsed();
    eprintln!("100 sequential commits in {elapsed:?} ({:.0} commits/s)", 100.0 / elapsed.as_secs_f64());
    assert_eq!(store.stats().revision, 100);
}

/// A full disk: every write is `DiskFull` with nothing applied or half-applied, the
/// store says it is unhealthy, and once space returns it reopens the file by itself:
/// the next write works, and everything acknowledged before is there after a reopen.
#[tokio::test]
async fn a_full_disk_refuses_writes_until_space_returns_and_then_recovers_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut watch = store.watch("agents", 0).unwrap();
    store.commit(create(agent("a1", "Up")), false).await.unwrap();
    assert_eq!(store.health(), Ok(()));

    store.inner.shared.disk_full.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let err = store.commit(create(agent("a2", "Up")), false).await.unwrap_err();
        assert!(matches!(err, Error::DiskFull { .. }), "{err:?}");
    }
    let why = store.health().unwrap_err();
    assert!(why.contains("disk holding the state database is full"), "{why}");
    assert!(store.probe().await.is_err());
    assert!(store.get("agents", "a2").is_none());
    assert_eq!(store.revision(), 1);

    store.inner.shared.disk_full.store(false, Ordering::SeqCst);
    assert_eq!(store.probe().await, Ok(()));
    store.commit(create(agent("a2", "Up")), false).await.unwrap();
    assert_eq!(store.revision(), 2);
    // The watcher saw exactly the two acknowledged writes, in order.
    assert_eq!(watch.next().await.unwrap().unwrap().revision, 1);
    assert_eq!(watch.next().await.unwrap().unwrap().revision, 2);
    store.shutdown().await;
    let state = loaded(dir.path());
    assert_eq!((state.revision, state.object_count()), (2, 2));
}
