//! The store against a `BTreeMap` model: random sequences of create, update, status
//! update and delete (with stale or missing resourceVersions, wrong uids, finalizers),
//! with reopens and crash-like stops in between (the checkpointer skips its last
//! checkpoint, so what it had not written comes back from the log). After every step the objects and the revision must match
//! the model; at the end the event log must be exactly the model's.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use futures_util::FutureExt;
use proptest::prelude::*;
use serde_json::{json, Value};

use super::super::{Error, EventType, Mutation, Outcome, Result, Store, StoreConfig, Subresource};
use super::{config, TestClock};

const KINDS: [&str; 2] = ["agents", "jobs"];
const NAMES: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Copy, Debug)]
enum Precondition {
    Current,
    Stale,
    Absent,
}

#[derive(Clone, Debug)]
enum Op {
    Create { kind: usize, name: usize, spec: u8, finalizer: bool },
    Update { kind: usize, name: usize, spec: u8, label: u8, finalizer: Option<bool>, rv: Precondition },
    Status { kind: usize, name: usize, status: u8, rv: Precondition },
    Delete { kind: usize, name: usize, rv: Precondition, wrong_uid: bool },
    Reopen,
    Crash,
}

fn precondition() -> impl Strategy<Value = Precondition> {
    prop_oneof![4 => Just(Precondition::Current), 1 => Just(Precondition::Stale), 2 => Just(Precondition::Absent)]
}

fn op() -> impl Strategy<Value = Op> {
    let target = (0..KINDS.len(), 0..NAMES.len());
    prop_oneof![
        3 => (target.clone(), 0..3u8, any::<bool>())
            .prop_map(|((kind, name), spec, finalizer)| Op::Create { kind, name, spec, finalizer }),
        4 => (target.clone(), 0..3u8, 0..2u8, proptest::option::of(any::<bool>()), precondition()).prop_map(
            |((kind, name), spec, label, finalizer, rv)| Op::Update { kind, name, spec, label, finalizer, rv }
        ),
        2 => (target.clone(), 0..2u8, precondition())
            .prop_map(|((kind, name), status, rv)| Op::Status { kind, name, status, rv }),
        3 => (target, precondition(), proptest::bool::weighted(0.2))
            .prop_map(|((kind, name), rv, wrong_uid)| Op::Delete { kind, name, rv, wrong_uid }),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
    ]
}

/// What the model keeps of an object; the store's objects are projected onto this.
#[derive(Clone, Debug, PartialEq)]
struct ModelObject {
    uid: String,
    rv: u64,
    generation: i64,
    spec: u64,
    label: Option<u64>,
    status: Option<u64>,
    finalizer: bool,
    deleting: bool,
}

impl ModelObject {
    fn of(object: &Value) -> ModelObject {
        let meta = &object["metadata"];
        let finalizers = meta.get("finalizers").and_then(Value::as_array);
        ModelObject {
            uid: meta["uid"].as_str().unwrap().to_owned(),
            rv: meta["resourceVersion"].as_str().unwrap().parse().unwrap(),
            generation: meta["generation"].as_i64().unwrap(),
            spec: object["spec"]["n"].as_u64().unwrap(),
            label: meta.get("labels").map(|l| l["l"].as_u64().unwrap()),
            status: object.get("status").map(|s| s["s"].as_u64().unwrap()),
            finalizer: finalizers.is_some_and(|f| !f.is_empty()),
            deleting: meta.get("deletionTimestamp").is_some(),
        }
    }
}

#[derive(Debug, PartialEq)]
enum Expect {
    Created,
    Updated,
    Unchanged,
    Deleting,
    Deleted,
    NotFound,
    AlreadyExists,
    Conflict,
}

fn observed(result: &Result<Outcome>) -> Expect {
    match result {
        Ok(Outcome::Created(_)) => Expect::Created,
        Ok(Outcome::Updated(_)) => Expect::Updated,
        Ok(Outcome::Unchanged(_)) => Expect::Unchanged,
        Ok(Outcome::Deleting(_)) => Expect::Deleting,
        Ok(Outcome::Deleted(_)) => Expect::Deleted,
        Err(Error::NotFound { .. }) => Expect::NotFound,
        Err(Error::AlreadyExists { .. }) => Expect::AlreadyExists,
        Err(Error::Conflict { .. }) => Expect::Conflict,
        Err(e) => panic!("unexpected error {e:?}"),
    }
}

#[derive(Default)]
struct Model {
    objects: BTreeMap<(usize, usize), ModelObject>,
    revision: u64,
    /// (revision, kind, type) of every event.
    events: Vec<(u64, usize, EventType)>,
    uids: HashSet<String>,
}

impl Model {
    fn stale(&self, key: (usize, usize)) -> String {
        match self.objects.get(&key) {
            Some(o) if o.rv > 1 => (o.rv - 1).to_string(),
            Some(o) => (o.rv + 1).to_string(),
            None => "1".into(),
        }
    }

    fn rv(&self, key: (usize, usize), rv: Precondition) -> Option<String> {
        match rv {
            Precondition::Current => self.objects.get(&key).map(|o| o.rv.to_string()),
            Precondition::Stale => Some(self.stale(key)),
            Precondition::Absent => None,
        }
    }

    /// Records a write of `key` as `type_` and returns its revision.
    fn write(&mut self, key: (usize, usize), type_: EventType) -> u64 {
        self.revision += 1;
        self.events.push((self.revision, key.0, type_));
        self.revision
    }
}

/// The incoming object of an update: the stored one (or a fresh one) with edits.
fn base(store: &Store, key: (usize, usize)) -> Value {
    store.get(KINDS[key.0], NAMES[key.1]).map(|o| o.value()).unwrap_or_else(|| {
        json!({"apiVersion": "hive.dev/v1", "kind": "Thing", "metadata": {"name": NAMES[key.1]}, "spec": {"n": 0}})
    })
}

fn set_rv(object: &mut Value, rv: Option<String>) {
    let meta = object["metadata"].as_object_mut().unwrap();
    match rv {
        Some(rv) => meta.insert("resourceVersion".into(), rv.into()),
        None => meta.remove("resourceVersion"),
    };
}

/// Applies `op` to store and model; checks the outcome kind and the written object.
async fn step(store: &mut Store, model: &mut Model, op: &Op, dir: &std::path::Path, retention: usize) {
    let (key, mutation, expect) = match *op {
        Op::Reopen | Op::Crash => {
            let crash = matches!(op, Op::Crash);
            store.inner.shared.crash_on_stop.store(crash, std::sync::atomic::Ordering::SeqCst);
            store.shutdown().await;
            *store = Store::open(retained(dir, retention)).unwrap();
            return;
        }
        Op::Create { kind, name, spec, finalizer } => {
            let key = (kind, name);
            let mut object = json!({
                "apiVersion": "hive.dev/v1", "kind": "Thing",
                "metadata": {"name": NAMES[name], "resourceVersion": "12345"},
                "spec": {"n": spec},
            });
            if finalizer {
                object["metadata"]["finalizers"] = json!(["f"]);
            }
            let expect =
                if model.objects.contains_key(&key) { Expect::AlreadyExists } else { Expect::Created };
            (key, Mutation::Create { kind: KINDS[kind], object }, expect)
        }
        Op::Update { kind, name, spec, label, finalizer, rv } => {
            let key = (kind, name);
            let mut object = base(store, key);
            object["spec"] = json!({"n": spec});
            object["metadata"]["labels"] = json!({"l": label});
            match finalizer {
                Some(true) => object["metadata"]["finalizers"] = json!(["f"]),
                Some(false) => drop(object["metadata"].as_object_mut().unwrap().remove("finalizers")),
                None => {}
            }
            set_rv(&mut object, model.rv(key, rv));
            let expect = match model.objects.get(&key) {
                None => Expect::NotFound,
                Some(_) if matches!(rv, Precondition::Stale) => Expect::Conflict,
                Some(cur) => {
                    let finalizer = finalizer.unwrap_or(cur.finalizer);
                    let same = cur.spec == u64::from(spec)
                        && cur.label == Some(u64::from(label))
                        && cur.finalizer == finalizer;
                    if same {
                        Expect::Unchanged
                    } else if cur.deleting && !finalizer {
                        Expect::Deleted
                    } else {
                        Expect::Updated
                    }
                }
            };
            let mutation = Mutation::Update { kind: KINDS[kind], object, subresource: Subresource::Main };
            (key, mutation, expect)
        }
        Op::Status { kind, name, status, rv } => {
            let key = (kind, name);
            let mut object = base(store, key);
            object["status"] = json!({"s": status});
            object["spec"] = json!({"n": 99}); // ignored by a status write
            set_rv(&mut object, model.rv(key, rv));
            let expect = match model.objects.get(&key) {
                None => Expect::NotFound,
                Some(_) if matches!(rv, Precondition::Stale) => Expect::Conflict,
                Some(cur) if cur.status == Some(u64::from(status)) => Expect::Unchanged,
                Some(_) => Expect::Updated,
            };
            let mutation = Mutation::Update { kind: KINDS[kind], object, subresource: Subresource::Status };
            (key, mutation, expect)
        }
        Op::Delete { kind, name, rv, wrong_uid } => {
            let key = (kind, name);
            let expect = match model.objects.get(&key) {
                None => Expect::NotFound,
                Some(_) if wrong_uid || matches!(rv, Precondition::Stale) => Expect::Conflict,
                Some(cur) if cur.finalizer => Expect::Deleting,
                Some(_) => Expect::Deleted,
            };
            let mutation = Mutation::Delete {
                kind: KINDS[kind],
                name: NAMES[name].into(),
                uid: wrong_uid.then(|| "wrong".into()),
                resource_version: model.rv(key, rv),
            };
            (key, mutation, expect)
        }
    };

    let result = store.commit(mutation, false).await;
    assert_eq!(observed(&result), expect, "{op:?}");
    let Ok(outcome) = result else { return };
    let written = ModelObject::of(&outcome.object().value());
    let before = model.objects.get(&key).cloned();
    match (&outcome, op) {
        (Outcome::Created(_), _) => {
            let revision = model.write(key, EventType::Added);
            assert!(model.uids.insert(written.uid.clone()), "uid reused");
            assert_eq!((written.rv, written.generation, written.deleting), (revision, 1, false));
            model.objects.insert(key, written);
        }
        (Outcome::Unchanged(_), _) => assert_eq!(Some(written), before),
        (Outcome::Deleting(_), _) if before.as_ref().is_some_and(|b| b.deleting) => {
            assert_eq!(Some(written), before)
        }
        (Outcome::Updated(_) | Outcome::Deleting(_), _) | (Outcome::Deleted(_), Op::Update { .. }) => {
            let before = before.unwrap();
            let type_ = match outcome {
                Outcome::Deleted(_) => EventType::Deleted,
                _ => EventType::Modified,
            };
            let revision = model.write(key, type_);
            let mut expected = before.clone();
            expected.rv = revision;
            match *op {
                Op::Update { spec, label, finalizer, .. } => {
                    expected.generation += i64::from(u64::from(spec) != before.spec);
                    expected.spec = spec.into();
                    expected.label = Some(label.into());
                    expected.finalizer = finalizer.unwrap_or(before.finalizer);
                }
                Op::Status { status, .. } => expected.status = Some(status.into()),
                _ => expected.deleting = true,
            }
            assert_eq!(written, expected, "{op:?}");
            if type_ == EventType::Deleted {
                model.objects.remove(&key);
            } else {
                model.objects.insert(key, written);
            }
        }
        (Outcome::Deleted(_), _) => {
            let revision = model.write(key, EventType::Deleted);
            let mut expected = model.objects.remove(&key).unwrap();
            expected.rv = revision;
            assert_eq!(written, expected);
        }
    }
}

fn check_state(store: &Store, model: &Model) {
    assert_eq!(store.revision(), model.revision);
    for (k, kind) in KINDS.iter().enumerate() {
        let (revision, objects) = store.list(kind);
        assert_eq!(revision, model.revision);
        let stored: BTreeMap<_, _> = objects
            .iter()
            .map(|o| {
                (
                    NAMES.iter().position(|n| o.value()["metadata"]["name"] == *n).unwrap(),
                    ModelObject::of(&o.value()),
                )
            })
            .collect();
        let wanted: BTreeMap<_, _> =
            model.objects.iter().filter(|((kk, _), _)| *kk == k).map(|((_, n), o)| (*n, o.clone())).collect();
        assert_eq!(stored, wanted, "{kind}");
    }
}

/// The test store's settings, retaining `retention` events. The checkpointer runs after
/// every few writes, so a crash leaves some of them in the file and the rest in the log.
fn retained(dir: &std::path::Path, retention: usize) -> StoreConfig {
    StoreConfig {
        retention_events: retention,
        checkpoint_interval: Duration::from_secs(3600),
        checkpoint_bytes: 2 << 10,
        ..config(dir, &TestClock::new())
    }
}

/// The retained events (the last `retention` of them) must be exactly the model's.
async fn check_events(store: &Store, model: &Model, retention: usize) {
    let after = model.revision.saturating_sub(retention as u64);
    for (k, kind) in KINDS.iter().enumerate() {
        let mut watch = store.watch(kind, after).unwrap();
        for &(revision, _, type_) in model.events.iter().filter(|(r, kk, _)| *kk == k && *r > after) {
            let event =
                tokio::time::timeout(Duration::from_secs(5), watch.next()).await.unwrap().unwrap().unwrap();
            assert_eq!((event.revision, event.type_), (revision, type_), "{kind}");
            assert_eq!(event.object.value()["metadata"]["resourceVersion"], revision.to_string());
        }
        assert!(watch.next().now_or_never().is_none(), "{kind}: an event the model does not have");
    }
}

/// Runs `ops` against a store retaining `retention` events, reopening it at the end.
fn run(ops: &[Op], retention: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(retained(dir.path(), retention)).unwrap();
        let mut model = Model::default();
        for op in ops {
            step(&mut store, &mut model, op, dir.path(), retention).await;
            check_state(&store, &model);
        }
        check_events(&store, &model, retention).await;
        store.shutdown().await;
        let store = Store::open(retained(dir.path(), retention)).unwrap();
        check_state(&store, &model);
        check_events(&store, &model, retention).await;
        store.shutdown().await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
        run(&ops, 100_000);
    }

    /// Retention drops nearly every event, so most writes replace or delete an object
    /// whose row only the object kept alive: every reopen checks the file holds exactly
    /// each object's current revision and the retained log.
    #[test]
    fn store_matches_model_when_retention_keeps_two_events(ops in proptest::collection::vec(op(), 1..40)) {
        run(&ops, 2);
    }
}
