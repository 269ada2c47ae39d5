//! Reads "at the most recent revision" through any replica: a list or a watch without a
//! resourceVersion is served from this replica's cache once the cache holds every write
//! etcd acknowledged before the request came (see [`Backend::sync`]).

use super::client::Op;
use super::write::APPLY_WAIT;
use super::{unavailable, Backend};
use crate::store::error::{Error, Result};

/// Sentinel writes, one at a time, each shared by every caller that arrived before it
/// was sent.
#[derive(Default)]
pub(super) struct Sentinel {
    /// How many sentinel writes were sent.
    sent: std::sync::atomic::AtomicU64,
    /// The number and revision of the last one etcd acknowledged; held while one is
    /// in flight.
    last: tokio::sync::Mutex<(u64, u64)>,
}

impl Backend {
    /// Waits until this replica's cache holds every write etcd acknowledged before the
    /// call began, through whichever replica: what a list or watch "at the most recent
    /// revision" needs to be linearizable (kube-apiserver's consistent reads from cache).
    ///
    /// One quorum read gives etcd's current revision; a cache at it or past it is
    /// current. A cache behind it may only be waiting for the feed, or the revisions
    /// after it may belong to keys outside the prefix, which the feed never sees: a
    /// write of `<prefix>_sync` then gives a revision the feed will bring, and the cache
    /// is current once it has applied it. Concurrent callers share one such write.
    pub(in crate::store) async fn sync(&self) -> Result<()> {
        let (now, _) = self.read_back(Vec::new()).await?;
        if self.shared.read().revision >= now {
            return Ok(());
        }
        let revision = self.sentinel().await?;
        if self.catch_up(revision).await {
            Ok(())
        } else {
            Err(Error::Unavailable {
                message: format!(
                    "this replica's cache has not reached etcd's revision {revision} after {APPLY_WAIT:?}; retry"
                ),
            })
        }
    }

    /// The revision of a write of `<prefix>_sync` sent after this call began.
    async fn sentinel(&self) -> Result<u64> {
        use std::sync::atomic::Ordering;
        let arrived = self.sentinel.sent.load(Ordering::SeqCst);
        let mut last = self.sentinel.last.lock().await;
        // One sent after this caller arrived covers it.
        if last.0 > arrived {
            return Ok(last.1);
        }
        let number = self.sentinel.sent.fetch_add(1, Ordering::SeqCst) + 1;
        let put = Op::Put { key: self.keys.internal("sync"), value: Vec::new(), lease: 0 };
        let answer = self.etcd.txn(&[], &[put], &[]).await.map_err(|e| unavailable(&e))?;
        *last = (number, answer.revision);
        Ok(answer.revision)
    }
}
