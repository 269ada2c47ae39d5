//! The typed client against a real store: admission, retries, no-op detection, watches.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hive_api::Agent;
use hive_controllers::{Action, Config, Controller, Target};
use serde_json::json;

use super::*;
use crate::store::{Mutation, Store, StoreConfig};

fn agent(name: &str) -> serde_json::Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
           "spec": {"config": {"repo": "r"}, "runtime": {"type": "process", "process": {"command": ["x"]}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_reconciles_real_store_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
    store.commit(Mutation::Create { kind: "agents", object: agent("before") }, false).await.unwrap();

    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let controller = Controller::<Agent, _>::new(Api::<Agent>::new(&store), Config::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let recorder = seen.clone();
    let run = tokio::spawn(controller.run(
        move |target: Target<Agent>, _ctx: Arc<()>| {
            let recorder = recorder.clone();
            async move {
                let entry = match &target {
                    Target::Present(a) => {
                        format!("present {} gen {}", a.metadata.name, a.metadata.generation.unwrap_or(0))
                    }
                    Target::Absent(name) => format!("absent {name}"),
                };
                recorder.lock().unwrap().push(entry);
                Ok::<_, std::convert::Infallible>(Action::await_change())
            }
        },
        |_, _, _| Action::await_change(),
        Arc::new(()),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let saw = |want: &'static [&'static str]| {
        let seen = seen.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let got = seen.lock().unwrap().clone();
                if want.iter().all(|w| got.iter().any(|g| g == w)) {
                    return;
                }
                assert!(tokio::time::Instant::now() < deadline, "reconciles seen: {got:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    // The object that was there first is reconciled from the first list. (Deleting it
    // before that list ran, or before its reconcile, would rightly show it only absent:
    // a loaded machine once did.)
    saw(&["present before gen 1"]).await;
    store.commit(Mutation::Create { kind: "agents", object: agent("after") }, false).await.unwrap();
    store
        .commit(
            Mutation::Delete { kind: "agents", name: "before".into(), uid: None, resource_version: None },
            false,
        )
        .await
        .unwrap();
    saw(&["present after gen 1", "absent before"]).await;
    let _ = stop_tx.send(());
    run.await.unwrap();
}

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
    (dir, store)
}

fn typed_agent(name: &str) -> Agent {
    super::decode_value(&agent(name)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_patches_all_land_and_no_ops_write_nothing() {
    let (_dir, store) = open();
    let agents = Api::<Agent>::new(&store);
    agents.create(&typed_agent("a")).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let agents = agents.clone();
        tasks.push(tokio::spawn(async move {
            agents
                .patch("a", |a| {
                    a.metadata.labels.insert(format!("k{i}"), "v".into());
                })
                .await
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap().unwrap().stored());
    }
    assert_eq!(agents.get_existing("a").unwrap().metadata.labels.len(), 6);

    let before = store.revision();
    assert!(matches!(agents.patch("a", |_| {}).await.unwrap(), Patched::Unchanged(_)));
    assert!(matches!(agents.patch_status("a", |_| {}).await.unwrap(), Patched::Unchanged(_)));
    assert_eq!(store.revision(), before);

    let stored = agents.patch_status("a", |s| s.power = Some(hive_api::agent::Power::Running)).await.unwrap();
    assert!(stored.stored());
    assert_eq!(agents.get_existing("a").unwrap().status.power, Some(hive_api::agent::Power::Running));
    // A status write never touches the spec, and a spec write never touches the status.
    agents.patch("a", |a| a.status = Default::default()).await.unwrap();
    assert!(agents.get_existing("a").unwrap().status.power.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_is_validated_and_a_refused_one_changes_nothing() {
    let (_dir, store) = open();
    let agents = Api::<Agent>::new(&store);
    let mut bad = typed_agent("Not_A_Name");
    let err = agents.create(&bad).await.unwrap_err();
    assert!(
        matches!(&err, Error::Invalid { errors, .. } if errors.iter().any(|e| e.field == "metadata.name")),
        "{err}"
    );
    bad.metadata.name = "a".into();
    agents.create(&bad).await.unwrap();

    let before = store.revision();
    let err = agents.patch("a", |a| a.spec.config.repo.clear()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Invalid { errors, .. } if errors.iter().any(|e| e.field == "spec.config.repo")),
        "{err}"
    );
    let err = agents
        .patch_status("a", |s| {
            s.conditions.push(hive_api::Condition { type_: String::new(), ..Default::default() })
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
    assert_eq!(store.revision(), before, "a refused write stores nothing");

    // The kind's update rules hold as over HTTP: a FleetCommand's spec is immutable.
    let commands = Api::<hive_api::FleetCommand>::new(&store);
    let command: hive_api::FleetCommand = super::decode_value(&json!({"metadata": {"name": "c"},
        "spec": {"provision": {"provider": "process", "count": 1}}}))
    .unwrap();
    commands.create(&command).await.unwrap();
    let err = commands.patch("c", |c| c.spec = Default::default()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Invalid { errors, .. } if errors.iter().any(|e| e.field.starts_with("spec"))),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_objects_are_not_found() {
    let (_dir, store) = open();
    let agents = Api::<Agent>::new(&store);
    assert!(agents.get("gone").unwrap().is_none());
    assert!(agents.patch("gone", |_| {}).await.unwrap_err().is_not_found());
    assert!(agents.patch_status("gone", |_| {}).await.unwrap_err().is_not_found());
    assert!(agents.delete("gone").await.unwrap().is_none());
    agents.create(&typed_agent("a")).await.unwrap();
    assert_eq!(agents.delete("a").await.unwrap().map(|a| a.metadata.name), Some("a".into()));
    assert!(agents.get("a").unwrap().is_none());
}
