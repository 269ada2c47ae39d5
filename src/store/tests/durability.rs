//! Opening and surviving: reopen keeps everything, damaged or foreign files are
//! `Corrupt` naming the path, `reset` removes only the file, a second opener is
//! refused, and acknowledged writes survive `kill -9`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use redb::Database;

use super::super::tables::{META, META_SCHEMA};
use super::super::{Error, Store, StoreConfig};
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
        let first = store.page("agents", None, Some(1));
        assert_eq!((first.revision, first.items.len(), first.remaining), (revision, 1, Some(1)));
        assert!(first.items[0].is(&named[0].1), "the page shares the cache's copy");
        assert_eq!(first.last.as_deref(), Some("a1"));
        let rest = store.page("agents", first.last.as_deref(), Some(5));
        assert_eq!((rest.items.len(), rest.remaining, rest.last.as_deref()), (1, Some(0), Some("a2")));
        let none = store.page("agents", Some("a2"), None);
        assert_eq!((none.items.len(), none.remaining, none.last), (0, Some(0), None));
        assert_eq!(store.page("nothing", None, None).items.len(), 0);
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

/// A chunk damaged on disk is `Corrupt`, naming the file and the chunk, and the file is
/// left alone: a length its block does not hold, a cut block, a length no LZ4 block of
/// its size could unpack to (never allocated).
#[tokio::test]
async fn a_damaged_chunk_is_corrupt_naming_it() {
    use super::super::tables::CHUNKS;
    use redb::ReadableTable;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for i in 0..20 {
        store.commit(create(agent(&format!("agent-{i}"), "Up")), false).await.unwrap();
    }
    store.shutdown().await;
    let path = db_path(dir.path());
    let pristine = std::fs::read(&path).unwrap();
    type Damage = fn(&mut Vec<u8>);
    let damages: [(&str, Damage); 3] = [
        ("a longer length", |chunk| {
            let len = u32::from_le_bytes(chunk[..4].try_into().unwrap());
            chunk[..4].copy_from_slice(&(len + 1).to_le_bytes());
        }),
        ("a cut block", |chunk| chunk.truncate(chunk.len() - 3)),
        ("a length past what LZ4 packs", |chunk| chunk[..4].copy_from_slice(&u32::MAX.to_le_bytes())),
    ];
    for (what, damage) in damages {
        std::fs::write(&path, &pristine).unwrap();
        {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(CHUNKS).unwrap();
                let (key, mut chunk) = {
                    let (key, chunk) = table.first().unwrap().unwrap();
                    (key.value(), chunk.value().to_vec())
                };
                damage(&mut chunk);
                table.insert(key, chunk.as_slice()).unwrap();
            }
            txn.commit().unwrap();
        }
        assert_corrupt(dir.path(), what);
        let err = Store::open(config(dir.path(), &TestClock::new())).err().unwrap();
        let source = std::error::Error::source(&err).map(ToString::to_string).unwrap_or_default();
        assert!(format!("{err} {source}").contains("the chunk at 1"), "{what}: {err} {source}");
    }
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

/// Set for the child of `acknowledged_writes_survive_kill_9_with_only_the_log_holding_them`.
const CRASH_LOGGED_ONLY: &str = "HIVE_STORE_CRASH_LOGGED_ONLY";

/// The crash child's store: the defaults, or (with `CRASH_LOGGED_ONLY`) the smallest log
/// files and no checkpoint but those a switch of files or a large entry forces.
fn crash_config(dir: &std::path::Path) -> StoreConfig {
    let config = config(dir, &TestClock::new());
    if crate::host::env::var(CRASH_LOGGED_ONLY).is_none() {
        return config;
    }
    StoreConfig {
        wal_bytes: super::super::wal::HEADER + (64 << 10),
        checkpoint_interval: std::time::Duration::from_secs(3600),
        checkpoint_bytes: usize::MAX,
        ..config
    }
}

/// Runs in a child process (see below): writes until killed, printing each
/// acknowledged revision. Every 25th write of a writer is larger than the smallest log
/// file.
#[test]
#[ignore = "child process of acknowledged_writes_survive_kill_9"]
fn crash_child_writer() {
    let Some(dir) = crate::host::env::var(CRASH_DIR) else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    runtime.block_on(async {
        let store = Store::open(crash_config(std::path::Path::new(&dir))).unwrap();
        let tasks: Vec<_> = (0..4)
            .map(|w| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0.. {
                        let name = format!("w{w}-{i}");
                        let mut object = agent(&name, "Up");
                        if i % 25 == 24 {
                            object["metadata"]["annotations"] =
                                serde_json::json!({"blob": "z".repeat(80_000)});
                        }
                        let outcome = store.commit(create(object), false).await.unwrap();
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
    kill_9_while_writing(false);
}

/// The same with log files that fill every few writes and no checkpoint on a timer: most
/// acknowledged writes are in the log alone when the child dies, some in the file, some
/// written to it directly for being larger than a log file.
#[test]
fn acknowledged_writes_survive_kill_9_with_only_the_log_holding_them() {
    kill_9_while_writing(true);
}

fn kill_9_while_writing(logged_only: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(["store::tests::durability::crash_child_writer", "--exact", "--ignored", "--nocapture"]);
    if logged_only {
        command.env(CRASH_LOGGED_ONLY, "1");
    }
    let mut child =
        command.env(CRASH_DIR, dir.path()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
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

/// The bytes of keys and values in the file, across every table.
fn stored_bytes(dir: &std::path::Path) -> u64 {
    let db = Database::open(db_path(dir)).unwrap();
    let txn = db.begin_write().unwrap();
    let bytes = txn.stats().unwrap().stored_bytes();
    txn.abort().unwrap();
    bytes
}

/// A create writes its object's JSON once: the object and its retained event are one
/// row, as etcd keeps one copy per revision.
#[tokio::test]
async fn each_revision_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut json = 0;
    for i in 0..40 {
        let created = store.commit(create(agent(&format!("a{i}"), &"x".repeat(4000))), false).await.unwrap();
        json += created.object().len() as u64;
    }
    assert_eq!(store.stats().events, 40, "every create is retained as an event");
    store.shutdown().await;
    let stored = stored_bytes(dir.path());
    // Keys, counters and the rows' heads are a few percent; a second copy would be 100%.
    assert!(stored < json * 11 / 10, "{stored} bytes stored for {json} bytes of JSON");
}

/// With retention of two events, updates and deletes leave in the file only what a
/// reopen needs: each live object's current revision and the retained log. A stale row
/// would fail the load (it checks that nothing else is there), and so would a missing one.
#[tokio::test]
async fn rows_retention_passed_are_removed_unless_an_object_is_at_them() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::new();
    let small = || StoreConfig { retention_events: 2, ..config(dir.path(), &clock) };
    let store = Store::open(small()).unwrap();
    let mut live = std::collections::BTreeMap::new();
    for i in 0..6 {
        let name = format!("a{i}");
        let created = store.commit(create(agent(&name, "Up")), false).await.unwrap();
        live.insert(name, created.into_object());
    }
    // a0 and a1 are updated long after retention passed their creates; a2 twice in one
    // group; a3 deleted; a4 updated then deleted in one group.
    for name in ["a0", "a1"] {
        let mut respec = live[name].value();
        respec["spec"]["wanted"] = "Offline".into();
        live.insert(name.into(), store.commit(update(respec), false).await.unwrap().into_object());
    }
    let mut first = live["a2"].value();
    first["spec"]["wanted"] = "Offline".into();
    let mut second = first.clone();
    second["spec"]["wanted"] = "Down".into();
    second["metadata"]["resourceVersion"] = "".into();
    let outcomes = store.commit_all(vec![update(first), update(second)], false).await.unwrap();
    live.insert("a2".into(), outcomes.last().unwrap().object().clone());
    store.commit(super::delete("a3"), false).await.unwrap();
    live.remove("a3");
    let mut respec = live["a4"].value();
    respec["spec"]["wanted"] = "Offline".into();
    store.commit_all(vec![update(respec), super::delete("a4")], false).await.unwrap();
    live.remove("a4");
    let listed = store.list("agents").1;
    assert_eq!(listed, live.values().cloned().collect::<Vec<_>>());
    let revision = store.revision();
    store.shutdown().await;

    for _ in 0..2 {
        let store = Store::open(small()).unwrap();
        assert_eq!(store.list("agents").1, listed, "every live object as it was");
        assert_eq!((store.revision(), store.stats().events), (revision, 2));
        store.shutdown().await;
    }
}

/// A file written by a build of schema version 1 (an object table and an event table with
/// a second copy of each retained object) opens as it was, and is upgraded in place.
#[tokio::test]
async fn a_schema_1_file_is_upgraded_and_keeps_objects_revision_and_events() {
    use super::super::tables::{v1, META_COMPACTED, META_REVISION, SCHEMA_VERSION};
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str, wanted: &str, rv: u64| {
        let mut object = agent(name, wanted);
        object["metadata"]["resourceVersion"] = rv.to_string().into();
        object
    };
    // old@1 (its event compacted), gone@2 (compacted), a1 created at 3 and changed at 4,
    // gone deleted at 5; retained: 3..=5.
    let (old, a1_created, a1, gone) =
        (at("old", "Up", 1), at("a1", "Up", 3), at("a1", "Down", 4), at("gone", "Up", 5));
    let event = |type_: &str, time: i64, object: &serde_json::Value| {
        serde_json::to_vec(
            &serde_json::json!({"type": type_, "kind": "agents", "time": time, "object": object}),
        )
        .unwrap()
    };
    {
        let db = Database::create(db_path(dir.path())).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            meta.insert(META_SCHEMA, v1::SCHEMA_VERSION).unwrap();
            meta.insert(META_REVISION, 5).unwrap();
            meta.insert(META_COMPACTED, 2).unwrap();
            let mut objects = txn.open_table(v1::OBJECTS).unwrap();
            objects.insert("agents/old", serde_json::to_vec(&old).unwrap().as_slice()).unwrap();
            objects.insert("agents/a1", serde_json::to_vec(&a1).unwrap().as_slice()).unwrap();
            let mut events = txn.open_table(v1::EVENTS).unwrap();
            events.insert(3, event("ADDED", 1_000, &a1_created).as_slice()).unwrap();
            events.insert(4, event("MODIFIED", 2_000, &a1).as_slice()).unwrap();
            events.insert(5, event("DELETED", 3_000, &gone).as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }

    for round in 0..2 {
        let store = open(dir.path());
        let listed: Vec<_> = store.list("agents").1.iter().map(|o| o.value()).collect();
        assert_eq!(listed, [a1.clone(), old.clone()], "round {round}");
        assert_eq!(store.get("agents", "old").unwrap().revision(), 1);
        assert_eq!(store.revision(), 5);
        assert!(matches!(store.watch("agents", 1).err(), Some(Error::Expired { requested: 1, oldest: 2 })));
        let mut watch = store.watch("agents", 2).unwrap();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let event = watch.next().await.unwrap().unwrap();
            seen.push((event.type_.as_str(), event.revision, event.object.value()));
        }
        assert_eq!(
            seen,
            [("ADDED", 3, a1_created.clone()), ("MODIFIED", 4, a1.clone()), ("DELETED", 5, gone.clone())]
        );
        if round == 1 {
            let next = store.commit(create(agent("a2", "Up")), false).await.unwrap();
            assert_eq!(next.object().revision(), 6, "revisions continue");
        }
        store.shutdown().await;
    }
    let db = Database::open(db_path(dir.path())).unwrap();
    let read = db.begin_read().unwrap();
    assert_eq!(read.open_table(META).unwrap().get(META_SCHEMA).unwrap().unwrap().value(), SCHEMA_VERSION);
    assert!(read.open_table(v1::OBJECTS).is_err(), "the old tables are gone");
    assert!(read.open_table(super::super::tables::v3::REVISIONS).is_err(), "and so is the one of version 3");
}

/// A file of schema version 3 (one row per revision) opens as it was, its rows packed
/// into compressed chunks in place; the file that results is smaller for many small
/// objects.
#[tokio::test]
async fn a_schema_3_file_is_upgraded_into_chunks_and_keeps_everything() {
    upgraded_into_chunks_keeps_everything(3).await;
}

/// A file of schema version 4 (chunks not compressed) opens as it was, its chunks
/// compressed in place.
#[tokio::test]
async fn a_schema_4_file_is_upgraded_into_compressed_chunks_and_keeps_everything() {
    upgraded_into_chunks_keeps_everything(4).await;
}

/// Writes a file of schema `schema` (3 or 4) by hand, opens it twice, and checks that it
/// holds what it held, in compressed chunks, and nothing of its old table.
async fn upgraded_into_chunks_keeps_everything(schema: u64) {
    use super::super::chunk;
    use super::super::record::Record;
    use super::super::tables::{v3, v4, CHUNKS, META_COMPACTED, META_REVISION, SCHEMA_VERSION};
    use super::super::watch::EventType;
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str, rv: u64| {
        let mut object = agent(name, "Up");
        object["metadata"]["resourceVersion"] = rv.to_string().into();
        object
    };
    // 100 objects created at 1..=100, then a7 changed at 101; retained: 51..=101.
    let mut live: Vec<_> = (1..=100).map(|i| at(&format!("a{i}"), i)).collect();
    live[6] = at("a7", 101);
    let mut rows: Vec<(u64, Vec<u8>)> = live
        .iter()
        .map(|object| {
            let revision = object["metadata"]["resourceVersion"].as_str().unwrap().parse::<u64>().unwrap();
            let type_ = if revision == 101 { EventType::Modified } else { EventType::Added };
            let json = serde_json::to_vec(object).unwrap();
            (revision, Record { type_, time_ms: 1, kind: "agents", object: &json }.encode())
        })
        .collect();
    rows.sort();
    let held: usize = rows.iter().map(|(_, row)| row.len()).sum();
    {
        let db = Database::create(db_path(dir.path())).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            meta.insert(META_SCHEMA, schema).unwrap();
            meta.insert(META_REVISION, 101).unwrap();
            meta.insert(META_COMPACTED, 50).unwrap();
            if schema == 3 {
                let mut revisions = txn.open_table(v3::REVISIONS).unwrap();
                for (revision, row) in &rows {
                    revisions.insert(revision, row.as_slice()).unwrap();
                }
            } else {
                // Version 4's chunks: records as they are, up to a page each.
                let mut chunks = txn.open_table(v4::CHUNKS).unwrap();
                for group in rows.chunks(5) {
                    let mut records = Vec::new();
                    for (revision, row) in group {
                        chunk::push(&mut records, *revision, row);
                    }
                    chunks.insert(group[0].0, records.as_slice()).unwrap();
                }
            }
        }
        txn.commit().unwrap();
    }
    live.sort_by(|a, b| a["metadata"]["name"].as_str().cmp(&b["metadata"]["name"].as_str()));
    for round in 0..2 {
        let store = open(dir.path());
        let listed: Vec<_> = store.list("agents").1.iter().map(|o| o.value()).collect();
        assert_eq!(listed, live, "round {round}");
        assert_eq!((store.revision(), store.stats().events), (101, 51));
        store.shutdown().await;
    }
    let db = Database::open(db_path(dir.path())).unwrap();
    let read = db.begin_read().unwrap();
    assert_eq!(read.open_table(META).unwrap().get(META_SCHEMA).unwrap().unwrap().value(), SCHEMA_VERSION);
    assert!(read.open_table(v3::REVISIONS).is_err(), "the old table is gone");
    assert!(read.open_table(v4::CHUNKS).is_err(), "the old table is gone");
    use redb::{ReadableTable, ReadableTableMetadata};
    let table = read.open_table(CHUNKS).unwrap();
    let chunks = table.len().unwrap();
    let stored: usize = table.iter().unwrap().map(|entry| entry.unwrap().1.value().len()).sum();
    assert!(chunks < 20, "100 small revisions in {chunks} chunks");
    assert!(stored * 2 < held, "{held} bytes of revisions stored in {stored}");
}

/// An upgrade writes every revision again; the pages the old chunks took are given back
/// to the file system (redb keeps a file's length by itself), and what the file held is
/// all still there.
#[tokio::test]
async fn an_upgraded_file_gives_back_the_pages_its_old_chunks_took() {
    const OBJECTS: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let before = schema_4_file(dir.path(), OBJECTS);
    let store = open(dir.path());
    assert_eq!(store.list("agents").1.len() as u64, OBJECTS);
    store.shutdown().await;
    let after = std::fs::metadata(db_path(dir.path())).unwrap().len();
    assert!(after * 2 < before, "the file was {before} bytes long before its upgrade and {after} after");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!names.iter().any(|n| n.to_string_lossy().ends_with(".rewriting")), "{names:?}");
}

/// When the upgraded file cannot be written again (here a directory squats the temporary
/// name), the start goes on with the file as the upgrade left it: everything is there.
#[tokio::test]
async fn an_upgraded_file_that_cannot_be_written_again_opens_as_it_is() {
    const OBJECTS: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let before = schema_4_file(dir.path(), OBJECTS);
    let mut squatter = db_path(dir.path()).into_os_string();
    squatter.push(".rewriting");
    std::fs::create_dir_all(std::path::Path::new(&squatter).join("in-the-way")).unwrap();
    for _ in 0..2 {
        // The second start finds the file upgraded and opens it as it is.
        let store = open(dir.path());
        assert_eq!((store.list("agents").1.len() as u64, store.revision()), (OBJECTS, OBJECTS));
        store.shutdown().await;
    }
    let after = std::fs::metadata(db_path(dir.path())).unwrap().len();
    assert!(after >= before, "the file was written again: {before} bytes, then {after}");
}

/// Writes a database of schema 4 holding `objects` Agents created at revisions
/// `1..=objects`, in chunks of about a page, not compressed; its length.
fn schema_4_file(dir: &std::path::Path, objects: u64) -> u64 {
    use super::super::chunk;
    use super::super::record::Record;
    use super::super::tables::{v4, META_COMPACTED, META_REVISION};
    use super::super::watch::EventType;
    let db = Database::create(db_path(dir)).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut meta = txn.open_table(META).unwrap();
        meta.insert(META_SCHEMA, 4).unwrap();
        meta.insert(META_REVISION, objects).unwrap();
        meta.insert(META_COMPACTED, 0).unwrap();
        let mut chunks = txn.open_table(v4::CHUNKS).unwrap();
        let mut records = Vec::new();
        let mut first = 1;
        for revision in 1..=objects {
            let mut object = agent(&format!("a{revision}"), "Up");
            object["metadata"]["resourceVersion"] = revision.to_string().into();
            let json = serde_json::to_vec(&object).unwrap();
            let row = Record { type_: EventType::Added, time_ms: 1, kind: "agents", object: &json }.encode();
            chunk::push(&mut records, revision, &row);
            if records.len() > 3500 || revision == objects {
                chunks.insert(first, records.as_slice()).unwrap();
                records.clear();
                first = revision + 1;
            }
        }
    }
    txn.commit().unwrap();
    drop(db);
    std::fs::metadata(db_path(dir)).unwrap().len()
}
