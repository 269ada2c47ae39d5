//! Opening and surviving: reopen keeps everything, damaged or foreign files are
//! `Corrupt` naming the path, `reset` removes only the file, a second opener is
//! refused, and acknowledged writes survive `kill -9`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use redb::Database;

use super::super::tables::{META, META_SCHEMA};
use super::super::{Error, Store};
use super::{agent, config, create, db_path, open, update, TestClock};

#[tokio::test]
async fn reopen_keeps_objects_revision_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let created = store.commit(create(agent("a1", "Up")), false).await.unwrap().into_object();
    let mut respec = created.value();
    respec["spec"]["wanted"] = "Offline".into();
    store.commit(update(respec), false).await.unwrap();
    store.commit(create(agent("a2", "Up")), false).await.unwrap();
    store.commit(super::delete("a2"), false).await.unwrap();
    let before = store.list("agents");
    let mut watch = store.watch("agents", 0).unwrap();
    let mut events = Vec::new();
    for _ in 0..4 {
        events.push(watch.next().await.unwrap().unwrap());
    }
    store.shutdown().await;

    let store = open(dir.path());
    assert_eq!(store.list("agents"), before);
    assert_eq!(store.revision(), 4);
    let mut watch = store.watch("agents", 0).unwrap();
    for event in events {
        assert_eq!(watch.next().await.unwrap().unwrap(), event);
    }
    let next = store.commit(create(agent("a3", "Up")), false).await.unwrap();
    assert_eq!(next.object().value()["metadata"]["resourceVersion"], "5", "revisions continue");
}

/// Every cached object's JSON (and every event's) must be byte for byte what
/// `serde_json::to_vec` makes of the object, as committed and after a reopen: lists,
/// reads and watch lines send these bytes instead of encoding the object. The cache and
/// the latest event of an object share one copy of them, after a reopen too.
#[tokio::test]
async fn stored_json_equals_serde_json_and_is_shared_before_and_after_reopen() {
    async fn check(store: &Store) {
        let (revision, named) = store.list_after("agents", None);
        assert_eq!(revision, store.revision());
        assert_eq!(named.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(), store.list("agents").1);
        assert_eq!(named.iter().map(|(n, _)| &**n).collect::<Vec<_>>(), ["a1", "a2"]);
        for (name, object) in &named {
            assert_eq!(object.json()[..], serde_json::to_vec(&object.value()).unwrap(), "{object:?}");
            assert!(store.get("agents", name).unwrap().is(object), "one copy");
        }
        assert!(store.get("agents", "gone").is_none());
        assert_eq!(store.list_after("agents", Some("a1")).1.len(), 1, "a page after a1");
        let mut watch = store.watch("agents", 0).unwrap();
        let mut last = std::collections::HashMap::new();
        for _ in 0..5 {
            let event = watch.next().await.unwrap().unwrap();
            assert_eq!(event.object.json()[..], serde_json::to_vec(&event.object.value()).unwrap());
            last.insert(hive_api::meta::name_of(&event.object.value()).to_string(), event.object);
        }
        for (name, object) in &named {
            assert!(last[&**name].is(object), "the cache and {name}'s latest event share its JSON");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let created = store.commit(create(agent("a1", "Up")), false).await.unwrap().into_object();
    let mut respec = created.value();
    respec["spec"]["wanted"] = "Offline".into();
    respec["metadata"]["annotations"] = serde_json::json!({"note": "quotes \" and \u{e9} and \n"});
    store.commit(update(respec), false).await.unwrap();
    store.commit(create(agent("a2", "Up")), false).await.unwrap();
    store.commit(create(agent("gone", "Up")), false).await.unwrap();
    store.commit(super::delete("gone"), false).await.unwrap();
    check(&store).await;
    store.shutdown().await;

    let store = open(dir.path());
    check(&store).await;
}

fn assert_corrupt(dir: &std::path::Path, what: &str) {
    let path = db_path(dir);
    let err = Store::open(config(dir, &TestClock::new())).err().unwrap_or_else(|| panic!("{what}: opened"));
    assert!(matches!(err, Error::Corrupt { .. }), "{what}: {err:?}");
    assert!(err.to_string().contains(&path.display().to_string()), "{what}: {err}");
    assert!(path.exists(), "{what}: the file is left alone");
}

#[test]
fn random_bytes_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let bytes: Vec<u8> = (0..65_536)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(db_path(dir.path()), bytes).unwrap();
    assert_corrupt(dir.path(), "random bytes");
}

#[test]
fn an_empty_file_is_corrupt_not_a_new_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(db_path(dir.path()), b"").unwrap();
    assert_corrupt(dir.path(), "empty file");
}

#[tokio::test]
async fn a_truncated_file_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for i in 0..50 {
        store.commit(create(agent(&format!("agent-{i}"), &"x".repeat(500))), false).await.unwrap();
    }
    store.shutdown().await;
    let path = db_path(dir.path());
    for keep in [4096, 512, 100] {
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..keep.min(bytes.len() / 2)]).unwrap();
        assert_corrupt(dir.path(), &format!("truncated to {keep}"));
    }
}

#[tokio::test]
async fn a_foreign_redb_file_or_unknown_schema_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    drop(Database::create(&path).unwrap());
    assert_corrupt(dir.path(), "redb without hive tables");

    std::fs::remove_file(&path).unwrap();
    Store::open(config(dir.path(), &TestClock::new())).unwrap().shutdown().await;
    let db = Database::open(&path).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(META).unwrap().insert(META_SCHEMA, 99).unwrap();
    txn.commit().unwrap();
    drop(db);
    let err = Store::open(config(dir.path(), &TestClock::new())).err().unwrap();
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(source.contains("unknown schema version 99"), "{source}");
    assert_corrupt(dir.path(), "schema 99");
}

#[tokio::test]
async fn reset_empties_only_the_database_file_and_revisions_continue_above_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::new();
    let store = open(dir.path());
    store.commit(create(agent("a1", "Up")), false).await.unwrap();
    store.commit(create(agent("a2", "Up")), false).await.unwrap();
    store.shutdown().await;
    let neighbour = dir.path().join("kubeconfig.yaml");
    std::fs::write(&neighbour, "keep me").unwrap();

    assert_eq!(Store::reset(&db_path(dir.path()), &clock.clock()).unwrap(), 2);
    assert!(neighbour.exists());
    let store = open(dir.path());
    assert_eq!((store.revision(), store.list("agents").1.len()), (2, 0));
    // A watcher resuming from the old run is told to list again, not left silent.
    let err = store.watch("agents", 1).err().unwrap();
    assert!(matches!(err, Error::Expired { requested: 1, oldest: 2 }), "{err:?}");
    store.commit(create(agent("a3", "Up")), false).await.unwrap();
    assert_eq!(store.revision(), 3);
    store.shutdown().await;

    // Again: the floor is the last run's revision, not the first's.
    assert_eq!(Store::reset(&db_path(dir.path()), &clock.clock()).unwrap(), 3);
    let store = open(dir.path());
    assert_eq!(store.revision(), 3);
    store.shutdown().await;

    // No file: nothing to continue from.
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(Store::reset(&db_path(empty.path()), &clock.clock()).unwrap(), 0);
    assert!(!db_path(empty.path()).exists());
}

#[tokio::test]
async fn reset_of_an_unreadable_file_continues_above_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(db_path(dir.path()), b"not a database at all").unwrap();
    let clock = TestClock::new();
    let floor = Store::reset(&db_path(dir.path()), &clock.clock()).unwrap();
    assert_eq!(floor, u64::try_from(clock.clock().now().timestamp_micros()).unwrap());
    let store = open(dir.path());
    assert_eq!(store.revision(), floor);
    store.shutdown().await;
}

#[tokio::test]
async fn a_second_open_of_the_same_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let err = Store::open(config(dir.path(), &TestClock::new())).err().unwrap();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
    store.shutdown().await;
    drop(open(dir.path()));
}

const CRASH_DIR: &str = "HIVE_STORE_CRASH_TEST_DIR";

/// Runs in a child process (see below): writes until killed, printing each
/// acknowledged revision.
#[test]
#[ignore = "child process of acknowledged_writes_survive_kill_9"]
fn crash_child_writer() {
    let Some(dir) = crate::host::env::var(CRASH_DIR) else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    runtime.block_on(async {
        let store = Store::open(config(std::path::Path::new(&dir), &TestClock::new())).unwrap();
        let tasks: Vec<_> = (0..4)
            .map(|w| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0.. {
                        let name = format!("w{w}-{i}");
                        let outcome = store.commit(create(agent(&name, "Up")), false).await.unwrap();
                        let mut out = std::io::stdout().lock();
                        writeln!(
                            out,
                            "acked {name} {}",
                            outcome.object().value()["metadata"]["resourceVersion"]
                        )
                        .unwrap();
                        out.flush().unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["store::tests::durability::crash_child_writer", "--exact", "--ignored", "--nocapture"])
        .env(CRASH_DIR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut acked = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("acked ") {
            let (name, revision) = rest.split_once(' ').unwrap();
            acked.push((name.to_owned(), revision.trim_matches('"').parse::<u64>().unwrap()));
            if acked.len() == 200 {
                child.kill().unwrap(); // SIGKILL
                break;
            }
        }
    }
    child.wait().unwrap();
    assert_eq!(acked.len(), 200, "the child stopped early");

    let store = Store::open(config(dir.path(), &TestClock::new())).unwrap();
    let max_acked = acked.iter().map(|(_, r)| *r).max().unwrap();
    assert!(store.revision() >= max_acked, "revision went backwards");
    for (name, revision) in &acked {
        let object = store.get("agents", name).unwrap_or_else(|| panic!("acknowledged {name} lost"));
        assert_eq!(object.value()["metadata"]["resourceVersion"], revision.to_string());
    }
}
