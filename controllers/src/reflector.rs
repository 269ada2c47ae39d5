//! The reflector: an in-memory cache of one kind, fed by the watcher. A single [`Writer`]
//! applies events; any number of cheap [`Store`] handles read the latest state by name.
//! A relist replaces the whole contents in one step, so readers never see a mix of old
//! and new state, and objects missing from the relist disappear.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use futures_util::stream::{Stream, StreamExt};
use hive_api::Object;
use tokio::sync::watch;

use crate::watcher::Event;

type Objects<K> = Arc<RwLock<BTreeMap<String, Arc<K>>>>;

/// A read handle on the cache: clone it freely. Reads never wait on the network.
pub struct Store<K> {
    objects: Objects<K>,
    ready: watch::Receiver<bool>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Store { objects: self.objects.clone(), ready: self.ready.clone() }
    }
}

/// The writer went away before the first list was applied, so the store will never be
/// ready.
#[derive(Debug, thiserror::Error)]
#[error("the reflector stopped before the store became ready")]
pub struct WriterDropped;

impl<K: Object> Store<K> {
    /// The cached object named `name`, if any.
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        self.objects.read().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
    }

    /// Every cached object, ordered by name.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.objects.read().unwrap_or_else(PoisonError::into_inner).values().cloned().collect()
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.objects.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once the first list has been applied: from then on the store holds the full
    /// state of the kind (possibly a little stale), not a partial one.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until [`Store::is_ready`].
    pub async fn wait_until_ready(&self) -> Result<(), WriterDropped> {
        let mut ready = self.ready.clone();
        ready.wait_for(|ready| *ready).await.map(|_| ()).map_err(|_| WriterDropped)
    }
}

/// The single writer of a cache.
pub struct Writer<K> {
    objects: Objects<K>,
    ready: watch::Sender<bool>,
}

impl<K: Object> Default for Writer<K> {
    fn default() -> Self {
        Writer::new()
    }
}

impl<K: Object> Writer<K> {
    /// An empty, not yet ready cache.
    pub fn new() -> Writer<K> {
        Writer { objects: Arc::default(), ready: watch::Sender::new(false) }
    }

    /// A read handle on this cache.
    pub fn store(&self) -> Store<K> {
        Store { objects: self.objects.clone(), ready: self.ready.subscribe() }
    }

    /// Applies one watcher event and returns the names whose cached state it may have
    /// changed: the object's name, or for a relist every name cached before or after it
    /// (so that objects deleted while the watch was down are noticed too).
    pub fn apply(&mut self, event: &Event<K>) -> Vec<String> {
        let touched = match event {
            Event::Applied(object) => {
                let name = object.metadata().name.clone();
                self.write().insert(name.clone(), Arc::new(object.clone()));
                vec![name]
            }
            Event::Deleted(object) => {
                let name = object.metadata().name.clone();
                self.write().remove(&name);
                vec![name]
            }
            Event::Restarted(objects) => {
                let fresh: BTreeMap<String, Arc<K>> = objects
                    .iter()
                    .map(|object| (object.metadata().name.clone(), Arc::new(object.clone())))
                    .collect();
                let stale = std::mem::replace(&mut *self.write(), fresh);
                let mut touched: Vec<String> = stale.into_keys().collect();
                touched.extend(objects.iter().map(|object| object.metadata().name.clone()));
                touched.sort_unstable();
                touched.dedup();
                self.ready.send_replace(true);
                touched
            }
        };
        touched
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Arc<K>>> {
        self.objects.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Passes a watcher stream through unchanged, applying each event to `writer` before it
/// is yielded (so a consumer that sees an event finds the store already updated).
pub fn reflector<K: Object, E>(
    mut writer: Writer<K>,
    events: impl Stream<Item = Result<Event<K>, E>>,
) -> impl Stream<Item = Result<Event<K>, E>> {
    events.map(move |item| {
        if let Ok(event) = &item {
            writer.apply(event);
        }
        item
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backoff::Backoff;
    use crate::testing::{next, widget, FakeClient, Widget};
    use crate::watcher::{self, watcher};

    fn specs(store: &Store<Widget>) -> Vec<(String, u32)> {
        store.list().iter().map(|w| (w.metadata.name.clone(), w.spec)).collect()
    }

    fn owned(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn applies_changes_and_reports_touched_names() {
        let mut writer = Writer::new();
        let store = writer.store();
        assert!(!store.is_ready());

        assert_eq!(writer.apply(&Event::Restarted(vec![widget("a", 1), widget("b", 1)])), owned(&["a", "b"]));
        assert!(store.is_ready());
        assert_eq!(writer.apply(&Event::Applied(widget("a", 2))), owned(&["a"]));
        assert_eq!(writer.apply(&Event::Applied(widget("c", 1))), owned(&["c"]));
        assert_eq!(writer.apply(&Event::Deleted(widget("b", 1))), owned(&["b"]));
        assert_eq!(specs(&store), [("a".into(), 2), ("c".into(), 1)]);
        assert_eq!(store.get("a").map(|w| w.spec), Some(2));
        assert!(store.get("b").is_none());
    }

    #[test]
    fn a_relist_replaces_everything_and_drops_vanished_objects() {
        let mut writer = Writer::new();
        let store = writer.store();
        writer.apply(&Event::Restarted(vec![widget("a", 1), widget("b", 1), widget("c", 1)]));

        // b vanished while the watch was down; d appeared. Both are touched.
        let touched = writer.apply(&Event::Restarted(vec![widget("a", 2), widget("c", 1), widget("d", 1)]));
        assert_eq!(touched, owned(&["a", "b", "c", "d"]));
        assert_eq!(specs(&store), [("a".into(), 2), ("c".into(), 1), ("d".into(), 1)]);
        assert_eq!(store.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_until_ready_returns_after_the_first_list_or_fails_without_writer() {
        let writer = Writer::<Widget>::new();
        let store = writer.store();
        drop(writer);
        assert!(store.wait_until_ready().await.is_err());

        let mut writer = Writer::<Widget>::new();
        let store = writer.store();
        let waiting = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await.is_ok() }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished());
        writer.apply(&Event::Restarted(vec![]));
        assert!(waiting.await.unwrap());
        drop(writer);
        assert!(store.wait_until_ready().await.is_ok(), "once ready, stays ready");
    }

    #[tokio::test(start_paused = true)]
    async fn fed_by_a_watcher_it_follows_deletes_and_expired_relists() {
        let client = FakeClient::new();
        client.put(widget("a", 1));
        client.put(widget("b", 1));
        let writer = Writer::new();
        let store = writer.store();
        let config =
            watcher::Config { backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(1)) };
        let mut events = Box::pin(reflector(writer, watcher(client.clone(), config)));

        next(&mut events).await.unwrap();
        store.wait_until_ready().await.unwrap();
        assert_eq!(specs(&store), [("a".into(), 1), ("b".into(), 1)]);

        client.remove("a");
        next(&mut events).await.unwrap();
        assert_eq!(specs(&store), [("b".into(), 1)]);

        // While disconnected, b is deleted and history is lost: the relist drops b.
        client.end_watches();
        client.remove("b");
        client.put(widget("c", 1));
        client.compact();
        assert!(next(&mut events).await.unwrap_err().is_expired());
        assert!(matches!(next(&mut events).await, Ok(Event::Restarted(_))));
        assert_eq!(specs(&store), [("c".into(), 1)]);
    }
}
