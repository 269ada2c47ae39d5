//! `LocalClient`: the controller runtime's [`Client`] over the in-process store, for
//! the controllers that run inside the daemon. It reads exactly what the API serves:
//! the cache for lists, the event log for watches (with the same 410 on a compacted
//! revision), so a controller behaves the same in-process as over HTTP.

use std::marker::PhantomData;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use hive_api::Object;
use hive_controllers::{Client, ClientError, ObjectList, WatchEvent};

use crate::store::{self, EventType, Obj, Store};

/// A [`Client`] of kind `K` over a [`Store`].
pub struct LocalClient<K> {
    store: Store,
    kind: PhantomData<fn() -> K>,
}

impl<K> LocalClient<K> {
    /// A client reading `store`.
    pub fn new(store: Store) -> Self {
        LocalClient { store, kind: PhantomData }
    }
}

fn decode<K: Object>(object: &Obj) -> Result<K, ClientError> {
    K::deserialize(object.as_ref()).map_err(|e| {
        let name = object["metadata"]["name"].as_str().unwrap_or("");
        ClientError::transport(format!("stored {} {name:?} does not decode: {e}", K::KIND))
    })
}

impl<K: Object> Client<K> for LocalClient<K> {
    async fn list(&self) -> Result<ObjectList<K>, ClientError> {
        let (revision, objects) = self.store.list(K::PLURAL);
        let items = objects.iter().map(decode::<K>).collect::<Result<_, _>>()?;
        Ok(ObjectList { items, resource_version: revision.to_string() })
    }

    async fn watch(
        &self,
        resource_version: &str,
    ) -> Result<BoxStream<'static, Result<WatchEvent<K>, ClientError>>, ClientError> {
        let after: u64 = resource_version
            .parse()
            .map_err(|_| ClientError::transport(format!("invalid resourceVersion {resource_version:?}")))?;
        let watch = self.store.watch(K::PLURAL, after).map_err(|e| match e {
            store::Error::Expired { requested, oldest } => {
                ClientError::Expired(format!("too old resource version: {requested} ({oldest})"))
            }
            other => ClientError::transport(other.to_string()),
        })?;
        Ok(watch
            .map(|event| match event {
                Ok(event) => Ok(match event.type_ {
                    EventType::Added => WatchEvent::Added(decode(&event.object)?),
                    EventType::Modified => WatchEvent::Modified(decode(&event.object)?),
                    EventType::Deleted => WatchEvent::Deleted(decode(&event.object)?),
                }),
                // A watcher that fell behind must re-list, exactly as after a 410.
                Err(store::Error::WatchOverflow) => {
                    Ok(WatchEvent::Error(ClientError::Expired("the watch fell behind".into())))
                }
                Err(other) => Err(ClientError::transport(other.to_string())),
            })
            .boxed())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use hive_api::Agent;
    use hive_controllers::{Action, Config, Controller, Target};
    use serde_json::json;

    use super::*;
    use crate::store::{Mutation, StoreConfig};

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
        let controller =
            Controller::<Agent, _>::new(LocalClient::<Agent>::new(store.clone()), Config::default());
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
        store.commit(Mutation::Create { kind: "agents", object: agent("after") }, false).await.unwrap();
        store
            .commit(
                Mutation::Delete { kind: "agents", name: "before".into(), uid: None, resource_version: None },
                false,
            )
            .await
            .unwrap();

        let want = ["present before gen 1", "present after gen 1", "absent before"];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let got = seen.lock().unwrap().clone();
            if want.iter().all(|w| got.iter().any(|g| g == w)) {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "reconciles seen: {got:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop_tx.send(());
        run.await.unwrap();
    }
}
