//! Read-modify-write of one stored object, the way every in-daemon writer needs it: read
//! the current object, change it, commit with its `resourceVersion` as the
//! precondition, and on a lost race read again. A change that leaves the object as it
//! was writes nothing.

use serde_json::Value;

use crate::store::{self, Mutation, Obj, Store, Subresource};

/// How many times a write is re-read and re-applied after losing a race.
const RETRIES: usize = 8;

/// What became of an update.
#[derive(Debug)]
pub enum Updated {
    /// The object was changed and stored.
    Stored(Obj),
    /// The change left the object as it was; nothing was written.
    Unchanged(Obj),
    /// The object does not exist (any more).
    Missing,
    /// Every attempt lost a race with another writer.
    Contended,
}

/// Applies `change` to the object `kind/name` through `subresource`, retrying when a
/// concurrent write wins. `change` may run several times, each time on a fresh copy.
pub async fn update(
    store: &Store,
    kind: &'static str,
    name: &str,
    subresource: Subresource,
    mut change: impl FnMut(&mut Value),
) -> store::Result<Updated> {
    for _ in 0..RETRIES {
        let Some(current) = store.get(kind, name) else { return Ok(Updated::Missing) };
        let mut object = (*current).clone();
        if subresource == Subresource::Status && !object["status"].is_object() {
            object["status"] = Value::Object(Default::default());
        }
        change(&mut object);
        if object == *current {
            return Ok(Updated::Unchanged(current));
        }
        match store.commit(Mutation::Update { kind, object, subresource }, false).await {
            Ok(outcome) => return Ok(Updated::Stored(outcome.into_object())),
            Err(store::Error::Conflict { .. }) => continue,
            Err(store::Error::NotFound { .. }) => return Ok(Updated::Missing),
            Err(err) => return Err(err),
        }
    }
    Ok(Updated::Contended)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::StoreConfig;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_updates_all_land_and_no_ops_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let object = json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "a"}, "spec": {"n": 0}});
        store.commit(Mutation::Create { kind: "agents", object }, false).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..6 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                update(&store, "agents", "a", Subresource::Main, |o| {
                    o["metadata"]["labels"][format!("k{i}")] = json!("v")
                })
                .await
            }));
        }
        for t in tasks {
            assert!(matches!(t.await.unwrap().unwrap(), Updated::Stored(_)));
        }
        let labels = store.get("agents", "a").unwrap()["metadata"]["labels"].as_object().unwrap().len();
        assert_eq!(labels, 6);
        let before = store.revision();
        let same = update(&store, "agents", "a", Subresource::Main, |_| {}).await.unwrap();
        assert!(matches!(same, Updated::Unchanged(_)));
        assert_eq!(store.revision(), before);
        let status =
            update(&store, "agents", "a", Subresource::Status, |o| o["status"]["power"] = json!("Running"))
                .await;
        assert!(matches!(status.unwrap(), Updated::Stored(o) if o["status"]["power"] == "Running"));
        assert!(matches!(
            update(&store, "agents", "gone", Subresource::Main, |_| {}).await.unwrap(),
            Updated::Missing
        ));
    }
}
