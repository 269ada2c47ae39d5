//! Hive's own documents beside the objects: one value under `<prefix>_<name>` that
//! every replica shares — the token file, the CA — read once, replaced only by a
//! compare-and-swap on the revision it was read at, and followed through the store's
//! feed, so a change written through one replica reaches every other one as fast as an
//! object's does.
//!
//! A document is not an object: it has no kind, no resourceVersion a client sees, no
//! watch of its own and no fence (any replica may write one; the swap keeps concurrent
//! writers from losing each other's changes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::client::{Client, ClientError, Compare, KeyValue, Op};

/// A document's value and the etcd revision that wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub value: Vec<u8>,
    pub revision: u64,
}

/// What a [`Doc::swap`] found instead of the revision it expected: the document as it
/// is now (`None`: absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved(pub Option<Version>);

/// What hears every change of hive's own keys under a prefix: the rest of the key and
/// the new value (`None`: deleted). Called from the feed: it must be quick.
pub type Hearing = Box<dyn Fn(&[u8], Option<&[u8]>) + Send + Sync>;

/// The documents this replica follows, by key: the feed tells each of every change.
#[derive(Default)]
pub(super) struct Docs {
    followed: Mutex<HashMap<Vec<u8>, tokio::sync::watch::Sender<Option<Version>>>>,
    /// Followers of every key under a prefix (not one document: the dashboard's sessions).
    prefixes: Mutex<Vec<(Vec<u8>, Hearing)>>,
}

impl Docs {
    /// The feed saw `key` change at `revision` (`None`: deleted). Older news than what a
    /// follower holds is ignored, so a read and the feed may race in either order.
    pub(super) fn saw(&self, key: &[u8], value: Option<&[u8]>, revision: u64) {
        let followed = self.followed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = followed.get(key) {
            publish(sender, value.map(|value| Version { value: value.to_vec(), revision }), revision);
        }
        let prefixes = self.prefixes.lock().unwrap_or_else(PoisonError::into_inner);
        for (prefix, hear) in prefixes.iter() {
            if let Some(rest) = key.strip_prefix(prefix.as_slice()) {
                hear(rest, value);
            }
        }
    }

    /// Has `hear` told of every later change of a key under `prefix`.
    pub(super) fn follow_prefix(&self, prefix: Vec<u8>, hear: Hearing) {
        self.prefixes.lock().unwrap_or_else(PoisonError::into_inner).push((prefix, hear));
    }

    pub(super) fn follow(&self, key: &[u8]) -> tokio::sync::watch::Sender<Option<Version>> {
        let mut followed = self.followed.lock().unwrap_or_else(PoisonError::into_inner);
        followed.entry(key.to_vec()).or_insert_with(|| tokio::sync::watch::channel(None).0).clone()
    }
}

/// Keeps the newer of what a follower holds and `next` (seen at `revision`).
fn publish(sender: &tokio::sync::watch::Sender<Option<Version>>, next: Option<Version>, revision: u64) {
    sender.send_if_modified(|held| {
        let newer = match held {
            Some(held) => revision > held.revision,
            // Nothing held: a value is news; an absence at any revision changes nothing.
            None => next.is_some(),
        };
        if newer {
            *held = next;
        }
        newer
    });
}

/// One shared document (see the module documentation).
#[derive(Clone)]
pub struct Doc {
    etcd: Arc<Client>,
    key: Vec<u8>,
    latest: tokio::sync::watch::Sender<Option<Version>>,
}

impl std::fmt::Debug for Doc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value: a document may hold keys or token hashes.
        f.debug_struct("Doc").field("key", &String::from_utf8_lossy(&self.key)).finish_non_exhaustive()
    }
}

impl Doc {
    /// Follows `key` and reads it once from etcd (a quorum read).
    pub(super) async fn open(etcd: Arc<Client>, docs: &Docs, key: Vec<u8>) -> Result<Doc, ClientError> {
        let latest = docs.follow(&key);
        let doc = Doc { etcd, key, latest };
        doc.refresh().await?;
        Ok(doc)
    }

    /// The document as this replica last saw it.
    pub fn current(&self) -> Option<Version> {
        self.latest.borrow().clone()
    }

    /// Every later change, from any replica.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<Option<Version>> {
        self.latest.subscribe()
    }

    /// Reads the document from etcd now (a quorum read), and returns it.
    pub async fn refresh(&self) -> Result<Option<Version>, ClientError> {
        let page = self.etcd.range(&self.key, &[], 1, 0).await?;
        let found = page.kvs.into_iter().next().map(version);
        publish(&self.latest, found.clone(), found.as_ref().map_or(page.revision, |v| v.revision));
        Ok(found)
    }

    /// Writes `value` if the document is still as written at `expected` (`None`: if it
    /// does not exist); otherwise changes nothing and says what it is now. A write whose
    /// answer was lost is read back: it took effect if the document holds `value`.
    pub async fn swap(
        &self,
        expected: Option<u64>,
        value: Vec<u8>,
    ) -> Result<Result<Version, Moved>, ClientError> {
        let compare = [Compare::ModRevision(self.key.clone(), expected.unwrap_or(0))];
        let put = [Op::Put { key: self.key.clone(), value: value.clone(), lease: 0 }];
        let get = [Op::Get { key: self.key.clone() }];
        match self.etcd.txn(&compare, &put, &get).await {
            Ok(answer) if answer.succeeded => {
                let written = Version { value, revision: answer.revision };
                publish(&self.latest, Some(written.clone()), written.revision);
                Ok(Ok(written))
            }
            Ok(answer) => {
                let now = answer.gets.into_iter().next().flatten().map(version);
                publish(&self.latest, now.clone(), now.as_ref().map_or(answer.revision, |v| v.revision));
                Ok(Err(Moved(now)))
            }
            Err(ClientError::Indeterminate { .. }) => match self.refresh().await? {
                Some(now) if now.value == value => Ok(Ok(now)),
                now => Ok(Err(Moved(now))),
            },
            Err(e) => Err(e),
        }
    }
}

fn version(kv: KeyValue) -> Version {
    Version { value: kv.value, revision: kv.mod_revision }
}
