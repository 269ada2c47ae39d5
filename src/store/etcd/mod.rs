//! The store on etcd: the same cache, watches, lists and 410s as the embedded store,
//! with etcd as the durable copy that several `hive serve` replicas share.
//!
//! Every object is one key, `<prefix><plural>/<name>`, whose value is the object's JSON
//! without its `resourceVersion`: that is the key's `mod_revision`, as kube-apiserver
//! does it. A write plans against this replica's cache exactly as the embedded store
//! does (`mutation::plan`), then sends one transaction guarded by a comparison per key
//! it read (the revision the cache had, or "absent"). If a guard fails the cache was
//! stale: it catches up and the write is planned again. An error the plan found in the
//! cache (a conflict, a missing object) is returned only after etcd confirmed the cache
//! was current for those keys.
//!
//! The cache is fed by one etcd watch over the prefix ([`feed`]), so every replica sees
//! every write, its own too: a write is answered once the cache has applied its
//! revision, so a writer reads its own write on the replica it wrote through.
//!
//! What differs from the embedded store, by nature: a transaction gets one revision
//! whatever it writes, so objects written together share one `resourceVersion`, and
//! revisions have gaps (leader election and other keys take some). A watch resumed
//! "after R" replays the events *at* R too, so a client cut off in the middle of a
//! revision's events misses none (a repeated ADDED or MODIFIED is an upsert to it).
//!
//! Architecture Invariant: a write is answered only after etcd acknowledged it and this
//! replica's cache applied it; a write whose outcome is unknown (etcd timed out) is
//! resolved by reading it back before it is answered.

pub mod client;
pub mod cluster;
mod consistent;
pub mod docs;
mod feed;
mod group;
mod grpc;
pub mod lease;
mod proto;
mod write;

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;

use super::error::{Error, Result};
use super::mutation::{metadata_mut, Change, GroupLimit};
use super::shared::Shared;
use super::watch::EventType;
use super::Obj;
use client::{Client, ClientError, KeyValue};

pub use client::ClientError as EtcdError;

/// Where the store on etcd lives.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// The cluster's members, `host:port` (or `http://host:port`).
    pub endpoints: Vec<String>,
    /// Every key hive writes starts with this (default `/hive/`).
    pub prefix: String,
}

impl EtcdConfig {
    /// Parses `etcd://host:port,host:port[/prefix]`.
    pub fn parse(url: &str) -> std::result::Result<EtcdConfig, String> {
        let rest = url.strip_prefix("etcd://").ok_or_else(|| {
            format!("{url:?} is not an etcd URL: write etcd://HOST:PORT[,HOST:PORT…][/PREFIX]")
        })?;
        let (hosts, prefix) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash..]),
            None => (rest, "/hive/"),
        };
        let endpoints: Vec<String> = hosts.split(',').map(str::trim).map(str::to_owned).collect();
        for endpoint in &endpoints {
            let Some((host, port)) = endpoint.rsplit_once(':') else {
                return Err(format!("etcd member {endpoint:?} in {url:?} has no port: write HOST:PORT"));
            };
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(format!("etcd member {endpoint:?} in {url:?} is not HOST:PORT"));
            }
        }
        let mut prefix = prefix.to_owned();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        if prefix.len() < 2 {
            return Err(format!("the key prefix of {url:?} must not be empty (default /hive/)"));
        }
        Ok(EtcdConfig { endpoints, prefix })
    }
}

/// Writes one group may take at most: etcd's default `--max-txn-ops` is 128.
pub const MAX_TXN_OPS: usize = 128;

/// What one `Store::commit_all` on etcd may hold: one write fewer than [`MAX_TXN_OPS`]
/// (a leader's fence takes a compare and a failure get), and 1 MiB of objects under
/// etcd's default `--max-request-bytes` of 1.5 MiB (keys and stamps take the rest).
pub const GROUP_LIMIT: GroupLimit = GroupLimit { writes: MAX_TXN_OPS - 1, bytes: 1024 * 1024 };

/// The store's link to etcd: its client, the key layout, and the feed's task.
pub struct Backend {
    etcd: Arc<Client>,
    keys: Keys,
    shared: Arc<Shared>,
    feed: Mutex<Option<tokio::task::JoinHandle<()>>>,
    stop: tokio::sync::watch::Sender<bool>,
    /// Set while the feed cannot reach etcd: why.
    health: Arc<Mutex<Option<String>>>,
    /// The leader's fence, added to every write when set (see [`lease::Fence`]).
    fence: Mutex<Option<lease::Fence>>,
    /// The revision this replica last compacted etcd's history to.
    compacted: Mutex<u64>,
    /// The shared documents this replica follows (see [`docs`]).
    docs: Arc<docs::Docs>,
    /// The writes of `<prefix>_sync` that bring the cache up to now (see
    /// [`Backend::sync`]).
    sentinel: consistent::Sentinel,
    /// Writes waiting to share a transaction (see [`group`]).
    grouper: group::Grouper,
}

/// How objects map to keys.
#[derive(Clone, Debug)]
pub(super) struct Keys {
    prefix: Vec<u8>,
}

impl Keys {
    fn new(prefix: &str) -> Keys {
        Keys { prefix: prefix.as_bytes().to_vec() }
    }

    fn object(&self, kind: &str, name: &str) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.prefix.len() + kind.len() + 1 + name.len());
        key.extend_from_slice(&self.prefix);
        key.extend_from_slice(kind.as_bytes());
        key.push(b'/');
        key.extend_from_slice(name.as_bytes());
        key
    }

    /// The kind and name of an object's key; `None` for hive's own keys (`_…`) and
    /// anything not under the prefix.
    fn parse<'k>(&self, key: &'k [u8]) -> Option<(&'k str, &'k str)> {
        let rest = std::str::from_utf8(key.strip_prefix(self.prefix.as_slice())?).ok()?;
        let (kind, name) = rest.split_once('/')?;
        (!kind.is_empty() && !kind.starts_with('_') && !name.is_empty()).then_some((kind, name))
    }

    /// A key of hive's own under the prefix (`_leader`, …), never an object's.
    pub fn internal(&self, name: &str) -> Vec<u8> {
        let mut key = self.prefix.clone();
        key.push(b'_');
        key.extend_from_slice(name.as_bytes());
        key
    }

    /// The end of the prefix's key range.
    fn range_end(&self) -> Vec<u8> {
        prefix_end(&self.prefix)
    }
}

/// The first key after every key starting with `prefix`.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A plural name as the store's `Change` holds it: interned for the process's life
/// (there are a handful of kinds).
fn static_kind(kind: &str) -> &'static str {
    static KINDS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut kinds = KINDS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(known) = kinds.iter().find(|k| **k == kind) {
        return known;
    }
    let leaked: &'static str = Box::leak(kind.to_owned().into_boxed_str());
    kinds.push(leaked);
    leaked
}

/// An object as the cache holds it: the stored JSON with `resourceVersion` set to the
/// key's `mod_revision`.
fn decode(value: &[u8], revision: u64) -> std::result::Result<Obj, serde_json::Error> {
    let mut object: Value = serde_json::from_slice(value)?;
    metadata_mut(&mut object).insert("resourceVersion".into(), Value::String(revision.to_string()));
    Ok(Obj::encode(&object, revision))
}

/// An object as etcd stores it: its JSON without `resourceVersion`.
fn encode(object: &Obj) -> Vec<u8> {
    let mut value = object.value();
    metadata_mut(&mut value).remove("resourceVersion");
    serde_json::to_vec(&value).expect("a serde_json::Value always serializes")
}

/// The same object stamped with the revision its write got.
fn restamp(object: &Obj, revision: u64) -> Obj {
    let mut value = object.value();
    metadata_mut(&mut value).insert("resourceVersion".into(), Value::String(revision.to_string()));
    Obj::encode(&value, revision)
}

fn unavailable(e: &ClientError) -> Error {
    Error::Unavailable { message: e.to_string() }
}

impl Backend {
    /// Connects to etcd, loads every object under the prefix into a cache and starts
    /// the feed that keeps it current.
    pub(super) async fn open(
        config: &EtcdConfig,
        store_config: super::StoreConfig,
    ) -> Result<(Arc<Backend>, Arc<Shared>)> {
        let etcd = Arc::new(Client::new(&config.endpoints).map_err(|e| unavailable(&e))?);
        let keys = Keys::new(&config.prefix);
        let state = feed::load(&etcd, &keys).await.map_err(|e| unavailable(&e))?;
        let shared = Arc::new(Shared::new(state, store_config));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let health = Arc::new(Mutex::new(None));
        let docs = Arc::new(docs::Docs::default());
        let task = tokio::spawn(feed::run(
            etcd.clone(),
            keys.clone(),
            shared.clone(),
            docs.clone(),
            stopped,
            health.clone(),
        ));
        let backend = Backend {
            etcd,
            keys,
            shared: shared.clone(),
            feed: Mutex::new(Some(task)),
            stop,
            health,
            fence: Mutex::new(None),
            compacted: Mutex::new(0),
            docs,
            sentinel: consistent::Sentinel::default(),
            grouper: group::Grouper::default(),
        };
        Ok((Arc::new(backend), shared))
    }

    /// The client of etcd, for leader election and hive's own keys beside the store.
    pub fn client(&self) -> &Arc<Client> {
        &self.etcd
    }

    /// An election for `<prefix>_leader` whose followers campaign as soon as this
    /// store's feed sees the key deleted (a lease ended, a leader resigned).
    pub fn election(&self, config: lease::ElectionConfig) -> lease::Election {
        lease::Election::new(self.etcd.clone(), self.keys.internal("leader"), config)
            .woken_by(self.docs.clone())
    }

    /// The key of hive's own `name` under the prefix.
    pub fn internal_key(&self, name: &str) -> Vec<u8> {
        self.keys.internal(name)
    }

    /// The shared document `name` (`<prefix>_<name>`), read now and followed after.
    pub async fn doc(&self, name: &str) -> Result<docs::Doc> {
        docs::Doc::open(self.etcd.clone(), &self.docs, self.keys.internal(name))
            .await
            .map_err(|e| unavailable(&e))
    }

    /// Has `hear` told of every later change of a key under `<prefix>_<name>` (the rest of
    /// the key, and the value; `None`: deleted), from any replica, as the feed sees it.
    pub fn follow_internal(&self, name: &str, hear: docs::Hearing) {
        self.docs.follow_prefix(self.keys.internal(name), hear);
    }

    /// Makes every later write of this store carry `fence` (the leader's): a write
    /// after the leadership is gone fails with `Error::NotLeader`.
    pub fn set_fence(&self, fence: Option<lease::Fence>) {
        *self.fence.lock().unwrap_or_else(PoisonError::into_inner) = fence;
    }

    /// The fence this store's writes carry now (the leader's), for a write beside the
    /// store's own (the meta repo's journal).
    pub fn fence(&self) -> Option<lease::Fence> {
        self.fence.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Drops etcd's history up to the revision this replica's event log has dropped (by
    /// `retention_events`, `retention_age`, `retention_bytes`), so etcd keeps what hive
    /// serves watches from and no more. The leader calls it now and then (see
    /// `daemon::leader`); returns the revision compacted to, if it moved.
    pub async fn compact(&self) -> Result<Option<u64>> {
        let target = self.shared.read().compacted;
        if target <= *self.compacted.lock().unwrap_or_else(PoisonError::into_inner) {
            return Ok(None);
        }
        match self.etcd.compact(target).await {
            Ok(()) => {}
            // Another replica (an earlier leader) got there first: as good.
            Err(e) if e.is_compacted() => {}
            Err(e) => return Err(unavailable(&e)),
        }
        *self.compacted.lock().unwrap_or_else(PoisonError::into_inner) = target;
        Ok(Some(target))
    }

    /// The object `kind`/`name` as etcd holds it now (a quorum read), not as this
    /// replica's cache may still hold it.
    pub(super) async fn get_consistent(&self, kind: &str, name: &str) -> Result<Option<Obj>> {
        let key = self.keys.object(kind, name);
        let page = self.etcd.range(&key, &[], 1, 0).await.map_err(|e| unavailable(&e))?;
        let Some(kv) = page.kvs.into_iter().next() else { return Ok(None) };
        decode(&kv.value, kv.mod_revision).map(Some).map_err(|e| Error::Unavailable {
            message: format!("etcd holds {kind}/{name} as something that is not JSON: {e}"),
        })
    }

    /// Why the store cannot follow etcd right now, if it cannot.
    pub fn health(&self) -> Option<String> {
        self.health.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stops the feed and ends every watch.
    /// Whether [`Backend::shutdown`] began.
    pub(super) fn is_shut_down(&self) -> bool {
        *self.stop.borrow()
    }

    pub(super) async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let task = self.feed.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        self.shared.write().close();
    }
}

/// Builds the `Change` a watch event of `kind`/`name` makes, or `None` for a delete
/// whose old value etcd no longer had.
pub(super) fn change_of(
    kind: &str,
    name: &str,
    deleted: bool,
    kv: &KeyValue,
    prev: Option<&KeyValue>,
) -> std::result::Result<Option<Change>, serde_json::Error> {
    let revision = kv.mod_revision;
    let (type_, object) = if deleted {
        let Some(prev) = prev else { return Ok(None) };
        (EventType::Deleted, decode(&prev.value, revision)?)
    } else if kv.create_revision == kv.mod_revision {
        (EventType::Added, decode(&kv.value, revision)?)
    } else {
        (EventType::Modified, decode(&kv.value, revision)?)
    };
    let cost = super::watch::event_cost(object.len());
    Ok(Some(Change {
        kind: static_kind(kind),
        name: name.to_owned(),
        revision,
        type_,
        object,
        cost,
        supersedes: None,
    }))
}
