//! Watches: replay then live with nothing lost or repeated, `Expired` after retention
//! (by count, by age, across a reopen), overflow of a slow watcher, and shutdown.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;

use super::super::{Error, EventType, Mutation, Store, StoreConfig, Watch};
use super::{agent, config, create, open, update, TestClock};

/// Reads events until one at `last` arrives; panics on an error or a stalled watch.
async fn collect_until(watch: &mut Watch, last: u64) -> Vec<u64> {
    let mut seen = Vec::new();
    while seen.last() != Some(&last) {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next()).await.expect("watch stalled");
        seen.push(event.expect("watch ended").expect("watch failed").revision);
    }
    seen
}

#[tokio::test]
async fn replay_then_live_filters_by_kind() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.commit(create(agent("a1", "Up")), false).await.unwrap(); // 1
    let job = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "j1"}});
    store.commit(Mutation::Create { kind: "jobs", object: job }, false).await.unwrap(); // 2
    store.commit(create(agent("a2", "Up")), false).await.unwrap(); // 3

    let mut from_start = store.watch("agents", 0).unwrap();
    let mut from_one = store.watch("agents", 1).unwrap();
    let mut jobs = store.watch("jobs", 0).unwrap();
    store.commit(super::delete("a1"), false).await.unwrap(); // 4

    let first = from_start.next().await.unwrap().unwrap();
    assert_eq!((first.revision, &*first.kind, first.type_), (1, "agents", EventType::Added));
    assert_eq!(first.object.value()["metadata"]["name"], "a1");
    assert_eq!(collect_until(&mut from_start, 4).await, [3, 4]);
    assert_eq!(collect_until(&mut from_one, 4).await, [3, 4]);
    assert_eq!(jobs.next().await.unwrap().unwrap().revision, 2);
}

/// Watches registered while a writer is busy each see exactly the revisions after
/// their starting point: the replay/live hand-over neither drops nor repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_started_during_writes_have_no_gaps_or_duplicates() {
    const WRITES: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let created = store.commit(create(agent("a1", "0")), false).await.unwrap();
    let writer = {
        let store = store.clone();
        let mut object = created.object().value();
        tokio::spawn(async move {
            for i in 1..WRITES {
                object["spec"]["wanted"] = json!(i);
                object = store.commit(update(object), false).await.unwrap().object().value();
            }
        })
    };
    let mut watches = Vec::new();
    while !writer.is_finished() {
        let now = store.revision();
        // Alternate between "from now" and "from a bit back" (replay + live).
        let after = if watches.len() % 2 == 0 { now } else { now.saturating_sub(7) };
        watches.push((after, store.watch("agents", after).unwrap()));
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    writer.await.unwrap();
    assert!(watches.len() > 2, "the writer finished too fast to interleave");
    for (after, mut watch) in watches {
        let seen = if after == WRITES { Vec::new() } else { collect_until(&mut watch, WRITES).await };
        assert_eq!(seen, (after + 1..=WRITES).collect::<Vec<_>>(), "watch after {after}");
    }
}

#[tokio::test]
async fn a_watch_from_the_future_starts_after_that_revision() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut watch = store.watch("agents", 2).unwrap();
    for i in 0..4 {
        store.commit(create(agent(&format!("a{i}"), "Up")), false).await.unwrap();
    }
    assert_eq!(collect_until(&mut watch, 4).await, [3, 4]);
}

#[tokio::test]
async fn retention_by_count_expires_old_watches_also_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::new();
    let cfg = StoreConfig { retention_events: 5, ..config(dir.path(), &clock) };
    let store = Store::open(cfg.clone()).unwrap();
    for i in 0..10 {
        store.commit(create(agent(&format!("a{i}"), "Up")), false).await.unwrap();
    }
    let stats = store.stats();
    assert_eq!((stats.events, stats.compacted, stats.revision, stats.objects), (5, 5, 10, 10));
    let err = store.watch("agents", 4).err().unwrap();
    assert!(matches!(err, Error::Expired { requested: 4, oldest: 5 }), "{err:?}");
    assert_eq!(err.to_string(), "too old resource version: 4 (5)");
    let mut watch = store.watch("agents", 5).unwrap();
    assert_eq!(collect_until(&mut watch, 10).await, [6, 7, 8, 9, 10]);
    store.shutdown().await;

    let store = Store::open(cfg).unwrap();
    assert_eq!(store.stats().compacted, 5);
    assert!(matches!(store.watch("agents", 0), Err(Error::Expired { requested: 0, oldest: 5 })));
    let mut watch = store.watch("agents", 7).unwrap();
    assert_eq!(collect_until(&mut watch, 10).await, [8, 9, 10]);
}

#[tokio::test]
async fn retention_by_age_drops_old_events_at_the_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::new();
    let cfg = StoreConfig { retention_age: Duration::from_secs(60), ..config(dir.path(), &clock) };
    let store = Store::open(cfg.clone()).unwrap();
    for i in 0..3 {
        store.commit(create(agent(&format!("a{i}"), "Up")), false).await.unwrap();
    }
    clock.advance(Duration::from_secs(30));
    store.commit(create(agent("b", "Up")), false).await.unwrap(); // 4, young
    assert_eq!(store.stats().compacted, 0);
    clock.advance(Duration::from_secs(45));
    store.commit(create(agent("c", "Up")), false).await.unwrap(); // 5; 1..=3 are 75 s old
    assert_eq!((store.stats().compacted, store.stats().events), (3, 2));
    assert!(matches!(store.watch("agents", 2), Err(Error::Expired { requested: 2, oldest: 3 })));
    store.shutdown().await;
    let store = Store::open(cfg).unwrap();
    let mut watch = store.watch("agents", 3).unwrap();
    assert_eq!(collect_until(&mut watch, 5).await, [4, 5]);
}

#[tokio::test]
async fn a_slow_watcher_overflows_without_blocking_writers() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig { watch_buffer: 4, ..config(dir.path(), &TestClock::new()) };
    let store = Store::open(cfg).unwrap();
    let mut slow = store.watch("agents", 0).unwrap();
    let mut fast = store.watch("agents", 0).unwrap();
    for i in 0..10 {
        store.commit(create(agent(&format!("a{i}"), "Up")), false).await.unwrap();
        assert_eq!(fast.next().await.unwrap().unwrap().revision, i + 1);
    }
    // The slow watcher gets what it had buffered, then the overflow, then the end.
    for revision in 1..=4 {
        assert_eq!(slow.next().await.unwrap().unwrap().revision, revision);
    }
    assert!(matches!(slow.next().await, Some(Err(Error::WatchOverflow))));
    assert!(slow.next().await.is_none());
    assert!(slow.next().await.is_none());
    // A replay longer than the buffer is fine: the buffer only bounds live events.
    let mut late = store.watch("agents", 0).unwrap();
    assert_eq!(collect_until(&mut late, 10).await, (1..=10).collect::<Vec<_>>());
}

#[tokio::test]
async fn shutdown_ends_watches_and_refuses_new_work() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.commit(create(agent("a1", "Up")), false).await.unwrap();
    let mut watch = store.watch("agents", 0).unwrap();
    let clone = store.clone();
    store.shutdown().await;
    // As a Stream, too.
    assert_eq!(StreamExt::next(&mut watch).await.unwrap().unwrap().revision, 1);
    assert!(StreamExt::next(&mut watch).await.is_none());
    assert!(matches!(clone.watch("agents", 0), Err(Error::Closed)));
    assert!(matches!(clone.commit(create(agent("a2", "Up")), false).await, Err(Error::Closed)));
    assert_eq!(clone.get("agents", "a1").unwrap().value()["metadata"]["name"], "a1");
    clone.shutdown().await;
}

/// An event is handed to a kind's watchers group by group, each group's in the order its
/// watches began, whatever order the groups' watches began in: on a current-thread
/// runtime the watches' tasks, woken from the commit thread, run in the order they were
/// handed the event.
#[tokio::test]
async fn an_event_reaches_the_watchers_of_one_group_one_after_another() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let begun = [(2, "2a"), (1, "1a"), (0, "0a"), (2, "2b"), (3, "3a"), (1, "1b"), (0, "0b"), (1, "1c")];
    // Groups numbered in the order they are made: 1, 2, 3 here.
    let groups: Vec<_> = (0..3).map(|_| crate::store::Group::new()).collect();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (group, name) in begun {
        let watch = match group {
            0 => store.watch("agents", 0),
            n => store.watch_grouped("agents", 0, Some(groups[n - 1].clone())),
        };
        let mut watch = watch.unwrap();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let event = watch.next().await.unwrap().unwrap();
            order.lock().unwrap().push((name, event.revision));
        }));
    }
    // Every task waits on its watch before the event exists.
    tokio::task::yield_now().await;
    store.commit(create(agent("a1", "Up")), false).await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let names: Vec<_> =
        order.lock().unwrap().iter().map(|&(name, revision)| (revision == 1).then_some(name)).collect();
    let expected = ["0a", "0b", "1a", "1b", "1c", "2a", "2b", "3a"].map(Some);
    assert_eq!(names, expected);
}

/// A group settles when every watch of it that was handed an event has said it sent on
/// it, and wakes its waiter then, not before; a watch with nothing handed to it, or one
/// dropped, owes nothing.
#[tokio::test]
async fn a_group_settles_once_each_of_its_watches_handed_an_event_sent_it() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct Count(AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let group = crate::store::Group::new();
    let woken = std::sync::Arc::new(Count(AtomicUsize::new(0)));
    group.wake_when_settled(&std::task::Waker::from(woken.clone()));
    let mut watches: Vec<_> =
        (0..3).map(|_| store.watch_grouped("agents", 0, Some(group.clone())).unwrap()).collect();
    // A watch of another kind in the same group is handed nothing.
    let other = store.watch_grouped("approvals", 0, Some(group.clone())).unwrap();
    let dropped = watches.pop().unwrap();
    store.commit(create(agent("a1", "Up")), false).await.unwrap();
    assert!(!group.take_settled(), "settled before any watch took the event");
    drop(dropped);
    other.sent();
    let first = watches[0].next().await.unwrap().unwrap();
    assert_eq!(first.revision, 1);
    watches[0].sent();
    // Saying it twice counts once.
    watches[0].sent();
    assert!(!group.take_settled(), "settled while a watch still owes its line");
    assert_eq!(woken.0.load(Ordering::SeqCst), 0);
    watches[1].next().await.unwrap().unwrap();
    watches[1].sent();
    assert!(group.take_settled(), "every watch handed the event sent it");
    assert_eq!(woken.0.load(Ordering::SeqCst), 1, "the waiter is woken once");
    assert!(!group.take_settled(), "taking the mark clears it");
    // The next event owes again.
    store.commit(create(agent("a2", "Up")), false).await.unwrap();
    watches[0].next().await.unwrap().unwrap();
    watches[0].sent();
    assert!(!group.take_settled());
    drop(watches.pop());
    assert!(group.take_settled(), "a watch dropped owes nothing");
}

/// The wakes a batch owes its watches are given by a task of the runtime the store was
/// opened on; once that runtime has ended, the commit thread gives them itself, so a
/// store outliving it still wakes its watches.
#[test]
fn watches_are_woken_after_the_runtime_the_store_was_opened_on_has_ended() {
    let dir = tempfile::tempdir().unwrap();
    let first = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = first.block_on(async { open(dir.path()) });
    // A watch waiting in a task of its own on `runtime` before the write: only a wake
    // brings it the event.
    let woken = |runtime: &tokio::runtime::Runtime, name: &'static str| {
        let store = store.clone();
        runtime.block_on(async move {
            let mut watch = store.watch("agents", store.revision()).unwrap();
            let waiting = tokio::spawn(async move {
                // The timer first: polled again at the deadline, the watch would find the
                // event without having been woken.
                tokio::select! {
                    biased;
                    () = tokio::time::sleep(Duration::from_secs(10)) => panic!("the watch was never woken"),
                    event = watch.next() => event.unwrap().unwrap().revision,
                }
            });
            tokio::task::yield_now().await;
            let revision = store.commit(create(agent(name, "Up")), false).await.unwrap().object().revision();
            assert_eq!(waiting.await.unwrap(), revision);
        })
    };
    // While the first runtime is driven, its task gives the wakes.
    woken(&first, "a0");
    drop(first);
    let second = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    woken(&second, "a1");
    woken(&second, "a2");
}

/// An agent carrying an annotation of `size` bytes.
fn big_agent(name: &str, size: usize) -> serde_json::Value {
    let mut object = agent(name, "Up");
    object["metadata"]["annotations"] = json!({"blob": "x".repeat(size)});
    object
}

#[tokio::test]
async fn retention_by_bytes_keeps_the_history_under_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::new();
    let store = Store::open(StoreConfig { retention_bytes: 1 << 20, ..config(dir.path(), &clock) }).unwrap();
    // 40 events of ~100 KB of JSON each: ~4 MB written, at most ~1 MiB kept.
    for i in 0..40 {
        store.commit(create(big_agent(&format!("a{i}"), 100_000)), false).await.unwrap();
    }
    let stats = store.stats();
    assert!(stats.event_bytes <= 1 << 20, "{stats:?}");
    assert!(stats.events >= 2 && stats.events < 10, "{stats:?}");
    assert_eq!(stats.compacted + stats.events as u64, stats.revision);
    let err = store.watch("agents", 1).err().unwrap();
    assert!(matches!(err, Error::Expired { requested: 1, .. }), "{err:?}");
    // Reopened, the same history is there and counted the same.
    store.shutdown().await;
    let store = Store::open(StoreConfig { retention_bytes: 1 << 20, ..config(dir.path(), &clock) }).unwrap();
    assert_eq!(store.stats(), stats);
}

#[tokio::test]
async fn a_watcher_over_its_byte_budget_overflows_and_one_that_keeps_up_never_does() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig { watch_buffer_bytes: 1 << 20, ..config(dir.path(), &TestClock::new()) };
    let store = Store::open(config).unwrap();
    let mut slow = store.watch("agents", 0).unwrap();
    let mut keeping_up = store.watch("agents", 0).unwrap();
    for i in 0..30u64 {
        store.commit(create(big_agent(&format!("a{i}"), 100_000)), false).await.unwrap();
        let event = keeping_up.next().await.unwrap().unwrap();
        assert_eq!(event.revision, i + 1);
    }
    // The slow one gets what fitted in its budget (far fewer than its 1024 by count),
    // then the overflow, then the end.
    let mut delivered = 0;
    let ended = loop {
        match slow.next().await {
            Some(Ok(_)) => delivered += 1,
            Some(Err(e)) => break e,
            None => panic!("ended without the overflow"),
        }
    };
    assert!(matches!(ended, Error::WatchOverflow), "{ended:?}");
    assert!((1..15).contains(&delivered), "{delivered}");
    assert!(slow.next().await.is_none());
    // One event larger than the whole budget still reaches a watcher that keeps up.
    store.commit(create(big_agent("huge", 2 << 20)), false).await.unwrap();
    assert_eq!(keeping_up.next().await.unwrap().unwrap().object.value()["metadata"]["name"], "huge");
}

#[tokio::test]
async fn a_watch_replaying_slower_than_retention_expires_instead_of_pinning_history() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig { retention_events: 100, ..config(dir.path(), &TestClock::new()) };
    let store = Store::open(config).unwrap();
    for i in 0..100 {
        store.commit(create(agent(&format!("a{i}"), "Up")), false).await.unwrap();
    }
    let mut watch = store.watch("agents", 0).unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap().revision, 1);
    // While the watcher reads its first events, 200 more writes push retention past
    // where its replay stands: it is told so, not fed events from a copy.
    for i in 100..300 {
        store.commit(create(agent(&format!("a{i}"), "Up")), false).await.unwrap();
    }
    let mut last = 1;
    let ended = loop {
        match watch.next().await {
            Some(Ok(event)) => {
                assert_eq!(event.revision, last + 1);
                last = event.revision;
            }
            Some(Err(e)) => break e,
            None => panic!("ended without an error"),
        }
    };
    assert!(matches!(ended, Error::Expired { .. }), "{ended:?}");
    assert!(last < 200, "{last}");
}
