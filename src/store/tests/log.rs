//! The write-ahead log: what only the log holds comes back after a crash, exactly; a
//! record cut short or left by an earlier use of a file is not read; a log that skips
//! revisions is `Corrupt`; a failed append never comes back; files are reused in turn,
//! and an entry too large for them goes to redb at once.
//!
//! A "crash" here is `crash_on_stop`: the checkpointer skips its last checkpoint, so the
//! redb file is as the last checkpoint left it and everything after is in the log alone.
//! (`durability::acknowledged_writes_survive_kill_9` does the same with a real SIGKILL.)

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redb::Database;
use serde_json::{json, Value};

use super::super::tables::{META, META_REVISION};
use super::super::wal::{self, HEADER, RECORD_HEAD};
use super::super::{Error, Store, StoreConfig};
use super::{agent, config, create, db_path, delete, update, TestClock};

/// A store that checkpoints only when it must (a log file is needed back, or an entry is
/// too large for one), with log files of `wal_bytes`.
fn logged_only(dir: &Path, wal_bytes: u64) -> StoreConfig {
    StoreConfig {
        wal_bytes,
        checkpoint_interval: Duration::from_secs(3600),
        checkpoint_bytes: usize::MAX,
        ..config(dir, &TestClock::new())
    }
}

/// Stops `store` as a crash would (see the module's doc).
async fn crash(store: Store) {
    store.inner.shared.crash_on_stop.store(true, Ordering::SeqCst);
    store.shutdown().await;
}

/// The revision the redb file itself is at, without its log.
fn file_revision(dir: &Path) -> u64 {
    let db = Database::open(db_path(dir)).unwrap();
    let read = db.begin_read().unwrap();
    let revision = read.open_table(META).unwrap().get(META_REVISION).unwrap().unwrap().value();
    revision
}

/// Everything a client can see of a store: its revision, every object, every retained
/// event.
async fn seen(store: &Store) -> (u64, Vec<Value>, Vec<(String, u64, Value)>) {
    let objects = store.list("agents").1.iter().map(|o| o.value()).collect();
    let mut watch = store.watch("agents", store.stats().compacted).unwrap();
    let mut events = Vec::new();
    for _ in 0..store.stats().events {
        let event = watch.next().await.unwrap().unwrap();
        events.push((event.type_.as_str().to_owned(), event.revision, event.object.value()));
    }
    (store.revision(), objects, events)
}

/// Creates, updates and deletes: every kind of entry.
async fn some_writes(store: &Store, prefix: &str) {
    for i in 0..5 {
        store.commit(create(agent(&format!("{prefix}{i}"), "Up")), false).await.unwrap();
    }
    let mut respec = store.get("agents", &format!("{prefix}1")).unwrap().value();
    respec["spec"]["wanted"] = "Offline".into();
    store.commit(update(respec), false).await.unwrap();
    store.commit(delete(&format!("{prefix}2")), false).await.unwrap();
}

#[tokio::test]
async fn writes_only_the_log_holds_come_back_after_a_crash_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(logged_only(dir.path(), 16 << 20)).unwrap();
    some_writes(&store, "a").await;
    let before = seen(&store).await;
    crash(store).await;
    assert_eq!(file_revision(dir.path()), 0, "no checkpoint ran: the file has none of it");

    let store = Store::open(logged_only(dir.path(), 16 << 20)).unwrap();
    assert_eq!(seen(&store).await, before);
    crash(store).await;
    assert_eq!(file_revision(dir.path()), 7, "opening applied the log to the file");
    // And again, with writes after the replay in a log that started over.
    let store = Store::open(logged_only(dir.path(), 16 << 20)).unwrap();
    assert_eq!(seen(&store).await, before);
    some_writes(&store, "b").await;
    let before = seen(&store).await;
    crash(store).await;
    let store = Store::open(logged_only(dir.path(), 16 << 20)).unwrap();
    assert_eq!(seen(&store).await, before);
    assert_eq!(store.revision(), 14);
    store.shutdown().await;
    assert_eq!(file_revision(dir.path()), 14, "a clean stop checkpoints everything");
}

/// Each record in `path` under the file's current generation: where it starts and how
/// long it is, read by its length fields alone.
fn records(path: &Path) -> Vec<(usize, usize)> {
    let bytes = std::fs::read(path).unwrap();
    let mut at = HEADER as usize;
    let mut found = Vec::new();
    while at + RECORD_HEAD <= bytes.len() {
        let n = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if n == 0 || at + RECORD_HEAD + n > bytes.len() {
            break;
        }
        found.push((at, RECORD_HEAD + n));
        at += RECORD_HEAD + n;
    }
    found
}

#[tokio::test]
async fn a_record_cut_short_or_damaged_by_a_crash_is_where_the_log_ends() {
    for damage in ["flip a byte", "cut the file"] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(logged_only(dir.path(), 16 << 20)).unwrap();
        some_writes(&store, "a").await;
        let before = seen(&store).await;
        store.commit(create(agent("torn", "Up")), false).await.unwrap();
        crash(store).await;

        // The active file is the second one (a new log starts there); its last record is
        // the create of "torn", as if the crash hit while it was written.
        let path = &wal::paths(&db_path(dir.path()))[1];
        let (at, len) = *records(path).last().unwrap();
        let mut bytes = std::fs::read(path).unwrap();
        match damage {
            "flip a byte" => bytes[at + len - 3] ^= 0x20,
            _ => bytes.truncate(at + len - 10),
        }
        std::fs::write(path, &bytes).unwrap();

        let store = Store::open(logged_only(dir.path(), 16 << 20)).unwrap();
        assert_eq!(seen(&store).await, before, "{damage}");
        assert!(store.get("agents", "torn").is_none(), "{damage}");
        // Revisions go on from the last whole record.
        let next = store.commit(create(agent("next", "Up")), false).await.unwrap();
        assert_eq!(next.object().revision(), before.0 + 1, "{damage}");
        crash(store).await;
        let store = Store::open(logged_only(dir.path(), 16 << 20)).unwrap();
        assert!(store.get("agents", "next").is_some(), "{damage}");
        store.shutdown().await;
    }
}

/// The smallest log files there are: a few dozen small writes fill one.
const TINY: u64 = HEADER + (64 << 10);

#[tokio::test]
async fn log_files_are_reused_in_turn_and_what_an_earlier_use_left_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(logged_only(dir.path(), TINY)).unwrap();
    let padding = "x".repeat(3000);
    for i in 0..200 {
        let mut object = agent(&format!("a{i:03}"), "Up");
        object["metadata"]["annotations"] = json!({ "padding": padding });
        store.commit(create(object), false).await.unwrap();
        if i % 7 == 0 {
            store.commit(delete(&format!("a{i:03}")), false).await.unwrap();
        }
    }
    let before = seen(&store).await;
    crash(store).await;
    // 200 creates of 3 KB are ~9 log files' worth: each file was used several times, and
    // a file was reused only once the checkpointer had all it held.
    let file = file_revision(dir.path());
    assert!(file > 0 && file < before.0, "the file is at {file}, the store at {}", before.0);
    for path in wal::paths(&db_path(dir.path())) {
        assert!(std::fs::metadata(&path).unwrap().len() <= TINY, "{} grew past its capacity", path.display());
    }

    let store = Store::open(logged_only(dir.path(), TINY)).unwrap();
    assert_eq!(seen(&store).await, before);
    store.shutdown().await;
}

#[tokio::test]
async fn a_log_that_skips_revisions_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(logged_only(dir.path(), TINY)).unwrap();
    let padding = "x".repeat(3000);
    // Enough to fill the second file and go on in the first: the second one's records
    // are not checkpointed yet (nothing needed it back).
    for i in 0..30 {
        let mut object = agent(&format!("a{i:03}"), "Up");
        object["metadata"]["annotations"] = json!({ "padding": padding });
        store.commit(create(object), false).await.unwrap();
    }
    crash(store).await;
    let paths = wal::paths(&db_path(dir.path()));
    assert!(!records(&paths[0]).is_empty() && !records(&paths[1]).is_empty());
    assert_eq!(file_revision(dir.path()), 0);
    std::fs::remove_file(&paths[1]).unwrap();

    let err = Store::open(logged_only(dir.path(), TINY)).err().unwrap();
    let Error::Corrupt { path, source } = &err else { panic!("{err:?}") };
    assert_eq!(path, &paths[0]);
    assert!(source.to_string().contains("where revision 1 comes next"), "{source}");
}

#[tokio::test]
async fn an_entry_too_large_for_a_log_file_goes_to_redb_at_once_and_the_log_goes_on_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(logged_only(dir.path(), TINY)).unwrap();
    store.commit(create(agent("small", "Up")), false).await.unwrap();
    let mut big = agent("big", "Up");
    big["metadata"]["annotations"] = json!({ "blob": "y".repeat(100_000) });
    store.commit(create(big), false).await.unwrap();
    store.commit(create(agent("after", "Up")), false).await.unwrap();
    let before = seen(&store).await;
    crash(store).await;
    assert_eq!(file_revision(dir.path()), 2, "the large entry and everything before it are in the file");

    let store = Store::open(logged_only(dir.path(), TINY)).unwrap();
    assert_eq!(seen(&store).await, before);
    store.shutdown().await;
}

#[tokio::test]
async fn a_failed_append_never_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(logged_only(dir.path(), 16 << 20)).unwrap();
    store.commit(create(agent("before", "Up")), false).await.unwrap();
    // The record reaches the file, but its sync fails: the writer is told it failed.
    store.inner.shared.fail_next_append.store(true, Ordering::SeqCst);
    let err = store.commit(create(agent("failed", "Up")), false).await.unwrap_err();
    assert!(matches!(err, Error::Log { .. }), "{err:?}");
    // The next write recovers (the log starts over) and takes the same revision.
    let next = store.commit(create(agent("next", "Up")), false).await.unwrap();
    assert_eq!(next.object().revision(), 2);
    let before = seen(&store).await;
    crash(store).await;

    let store = Store::open(logged_only(dir.path(), 16 << 20)).unwrap();
    assert!(store.get("agents", "failed").is_none(), "a write its writer was told failed came back");
    assert_eq!(seen(&store).await, before);
    store.shutdown().await;
}

#[tokio::test]
async fn reset_continues_above_what_only_the_log_holds_and_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(logged_only(dir.path(), 16 << 20)).unwrap();
    some_writes(&store, "a").await;
    crash(store).await;
    assert_eq!(file_revision(dir.path()), 0);

    let floor = Store::reset(&db_path(dir.path()), &TestClock::new().clock()).unwrap();
    assert_eq!(floor, 7, "the log's revisions count");
    for path in wal::paths(&db_path(dir.path())) {
        assert!(!path.exists(), "{} was kept", path.display());
    }
    let store = Store::open(logged_only(dir.path(), 16 << 20)).unwrap();
    assert_eq!((store.revision(), store.list("agents").1.len()), (7, 0));
    store.shutdown().await;
}
