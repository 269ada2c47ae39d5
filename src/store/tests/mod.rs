//! Store tests: write semantics, group commit, durability and opening, watches, and a
//! proptest against a `BTreeMap` model.

mod batch;
mod durability;
mod log;
mod model;
mod pages;
mod semantics;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use serde_json::{json, Value};

use super::checkpoint::Checkpointer;
use super::commit::Log;
use super::shared::Shared;
use super::state::State;
use super::{disk, Clock, Mutation, Outcome, Store, StoreConfig, Subresource};

/// A wall clock the test moves by hand; starts at 2026-01-01T00:00:00Z.
#[derive(Clone)]
pub(super) struct TestClock(Arc<AtomicI64>);

impl TestClock {
    pub fn new() -> TestClock {
        TestClock(Arc::new(AtomicI64::new(1_767_225_600_000)))
    }

    pub fn clock(&self) -> Clock {
        let ms = self.0.clone();
        Clock::from_fn(move || Utc.timestamp_millis_opt(ms.load(Ordering::SeqCst)).unwrap())
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }
}

pub(super) fn db_path(dir: &Path) -> PathBuf {
    dir.join("state.redb")
}

/// Default settings on a test clock.
pub(super) fn config(dir: &Path, clock: &TestClock) -> StoreConfig {
    StoreConfig { clock: clock.clock(), ..StoreConfig::new(db_path(dir)) }
}

/// The commit thread's parts on the store in `dir`, without the thread: for driving
/// `commit_batch` by hand. Dropping the log checkpoints and closes the database.
pub(super) fn parts(dir: &Path, clock: &TestClock) -> (Arc<Shared>, Log) {
    let config = config(dir, clock);
    let (db, wal, state) = disk::open(&config.path, config.wal_bytes).unwrap();
    let revision = state.revision;
    let shared = Arc::new(Shared::new(state, config));
    let log = Log::new(wal, Checkpointer::start(shared.clone(), db, revision).unwrap());
    (shared, log)
}

/// What opening the store in `dir` loads.
pub(super) fn loaded(dir: &Path) -> State {
    disk::open(&db_path(dir), StoreConfig::new(db_path(dir)).wal_bytes).unwrap().2
}

pub(super) fn open(dir: &Path) -> Store {
    Store::open(config(dir, &TestClock::new())).unwrap()
}

pub(super) fn agent(name: &str, wanted: &str) -> Value {
    json!({
        "apiVersion": "hive.dev/v1",
        "kind": "Agent",
        "metadata": {"name": name},
        "spec": {"wanted": wanted},
    })
}

pub(super) fn create(object: Value) -> Mutation {
    Mutation::Create { kind: "agents", object }
}

pub(super) fn update(object: Value) -> Mutation {
    Mutation::Update { kind: "agents", object, subresource: Subresource::Main }
}

pub(super) fn update_status(object: Value) -> Mutation {
    Mutation::Update { kind: "agents", object, subresource: Subresource::Status }
}

pub(super) fn delete(name: &str) -> Mutation {
    Mutation::Delete { kind: "agents", name: name.into(), uid: None, resource_version: None }
}

/// `metadata.resourceVersion` as a number.
pub(super) fn rv(object: &super::Obj) -> u64 {
    object.value()["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
}

/// The object of an outcome, as an owned value to edit.
pub(super) fn owned(outcome: &Outcome) -> Value {
    outcome.object().value()
}

/// Asserts `Error` is usable with `anyhow` (Send + Sync + 'static).
#[test]
fn error_is_send_sync() {
    fn check<T: std::error::Error + Send + Sync + 'static>() {}
    check::<super::Error>();
}
