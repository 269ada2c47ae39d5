//! The cache's feed on etcd: a consistent load of every object under the prefix, then
//! one watch from the revision after it, applied a message at a time. A message holds
//! every event of the revisions it carries, so the cache and every watcher take one
//! transaction's writes together.
//!
//! When the watch breaks it is opened again (on the next member that answers) from the
//! revision after the last one applied, so nothing is missed or applied twice. If etcd
//! has compacted past that revision the cache is loaded afresh and every watch is ended
//! as overflowed: their clients list again (a 410 to HTTP watchers), as they would
//! after any gap.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::client::{Client, ClientError, WatchResponse};
use super::docs::Docs;
use super::{change_of, Keys};
use crate::store::commit::compacted_after;
use crate::store::shared::Shared;
use crate::store::state::State;

/// Objects read a page at a time when loading.
const LOAD_PAGE: usize = 1000;

/// The longest wait between attempts to reopen a broken watch.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Every object under the prefix at one revision: a cache to start from.
pub(super) async fn load(etcd: &Client, keys: &Keys) -> Result<State, ClientError> {
    let end = keys.range_end();
    let mut from = keys.prefix.clone();
    let mut revision = 0;
    let mut objects = Vec::new();
    loop {
        let page = etcd.range(&from, &end, LOAD_PAGE, revision).await?;
        if revision == 0 {
            revision = page.revision;
        }
        let last = page.kvs.last().map(|kv| kv.key.clone());
        objects.extend(page.kvs);
        match last {
            Some(mut key) if page.more => {
                key.push(0);
                from = key;
            }
            _ => break,
        }
    }
    let mut state = State::new(revision, revision);
    for kv in objects {
        let Some((kind, name)) = keys.parse(&kv.key) else { continue };
        match super::decode(&kv.value, kv.mod_revision) {
            Ok(object) => state.load_object(kind, name, object),
            Err(e) => {
                tracing::warn!(key = %String::from_utf8_lossy(&kv.key), error = %e, "skipping an etcd value that is not JSON")
            }
        }
    }
    Ok(state)
}

/// Keeps the cache current until `stop` is set.
pub(super) async fn run(
    etcd: Arc<Client>,
    keys: Keys,
    shared: Arc<Shared>,
    docs: Arc<Docs>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    health: Arc<Mutex<Option<String>>>,
) {
    let end = keys.range_end();
    let mut backoff = Duration::from_millis(50);
    let set_health = |why: Option<String>| *health.lock().unwrap_or_else(PoisonError::into_inner) = why;
    loop {
        if *stop.borrow() {
            return;
        }
        let from = shared.read().revision + 1;
        let opened = tokio::select! {
            opened = etcd.watch(&keys.prefix, &end, from) => opened,
            _ = stop.changed() => return,
        };
        let mut stream = match opened {
            Ok(stream) => stream,
            Err(e) => {
                set_health(Some(format!("cannot watch etcd: {e}")));
                tracing::warn!(error = %e, "cannot open the store's etcd watch; retrying");
                if wait(&mut stop, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        loop {
            let message = tokio::select! {
                message = stream.next() => message,
                _ = stop.changed() => return,
            };
            match message {
                Some(Ok(message)) if message.canceled => {
                    if message.compact_revision > 0 {
                        tracing::warn!(
                            from,
                            compacted = message.compact_revision,
                            "etcd compacted past the cache's revision; loading every object again"
                        );
                        reload(&etcd, &keys, &shared).await;
                    } else {
                        tracing::warn!(reason = %message.cancel_reason, "etcd cancelled the store's watch; reopening");
                    }
                    break;
                }
                Some(Ok(message)) => {
                    if message.created {
                        set_health(None);
                        backoff = Duration::from_millis(50);
                    }
                    apply(&keys, &shared, &docs, message);
                }
                Some(Err(e)) => {
                    tracing::warn!(endpoint = stream.endpoint(), error = %e, "the store's etcd watch broke; reopening");
                    break;
                }
                None => {
                    tracing::debug!(endpoint = stream.endpoint(), "the store's etcd watch ended; reopening");
                    break;
                }
            }
        }
        if wait(&mut stop, backoff).await {
            return;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Sleeps `delay`; true if the store stopped meanwhile.
async fn wait(stop: &mut tokio::sync::watch::Receiver<bool>, delay: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => *stop.borrow(),
        _ = stop.changed() => true,
    }
}

/// Applies one watch message to the cache, its log and its watchers.
fn apply(keys: &Keys, shared: &Shared, docs: &Docs, message: WatchResponse) {
    let time_ms = shared.config.clock.now().timestamp_millis();
    let (revision, woken) = {
        let mut state = shared.write();
        // Events of revisions applied already (a watch reopened on another member may
        // repeat some); a transaction's events share one revision, all applied here.
        let applied = state.revision;
        for event in &message.events {
            if event.kv.mod_revision <= applied {
                continue;
            }
            let Some((kind, name)) = keys.parse(&event.kv.key) else {
                // One of hive's own keys: a shared document's followers hear of it;
                // its revision is passed all the same.
                docs.saw(
                    &event.kv.key,
                    (!event.deleted).then_some(&event.kv.value[..]),
                    event.kv.mod_revision,
                );
                state.revision = event.kv.mod_revision;
                continue;
            };
            match change_of(kind, name, event.deleted, &event.kv, event.prev.as_ref()) {
                Ok(Some(change)) => state.apply(&change, time_ms),
                Ok(None) => {
                    // A delete whose old value etcd no longer has: gone all the same.
                    state.remove_object(kind, name);
                    state.revision = event.kv.mod_revision;
                }
                Err(e) => {
                    tracing::warn!(kind, name, error = %e, "skipping an etcd value that is not JSON");
                    state.revision = event.kv.mod_revision;
                }
            }
        }
        if message.events.is_empty() && !message.created {
            // A progress notice: every event up to its revision has been sent.
            state.revision = state.revision.max(message.revision);
        }
        let compacted = compacted_after(&state, &shared.config, &[], time_ms);
        state.compact(compacted);
        (state.revision, state.take_woken())
    };
    // This runs on the runtime already: the watches' tasks go to this worker's queue.
    woken.wake();
    shared.revision.send_replace(revision);
}

/// Loads every object again after etcd compacted past the cache: the objects are
/// replaced, the log starts over and every watch ends as overflowed.
async fn reload(etcd: &Client, keys: &Keys, shared: &Shared) {
    loop {
        match load(etcd, keys).await {
            Ok(fresh) => {
                let revision = {
                    let mut state = shared.write();
                    state.replace(fresh);
                    state.revision
                };
                shared.revision.send_replace(revision);
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot load the store from etcd; retrying");
                tokio::time::sleep(MAX_BACKOFF).await;
            }
        }
    }
}
