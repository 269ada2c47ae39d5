//! The bounded build log of one node: what its executor wrote so far, and a live feed
//! for followers while the node runs.
//!
//! Appends go straight from the executor to the log (not through the scheduler task), so
//! a chatty build never slows scheduling down. The log keeps at most `limit` bytes; when
//! it is full the oldest bytes are dropped and a reader sees a marker line saying how
//! many were dropped.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use tokio::sync::broadcast;

/// How many chunks a follower may fall behind before it skips ahead (and sees a marker).
const FOLLOW_BUFFER: usize = 256;

/// The build log of one node. Cheap to share: the scheduler, the executor's
/// [`NodeContext`](super::NodeContext) and every reader hold the same `Arc`.
#[derive(Debug)]
pub struct NodeLog {
    limit: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    buf: VecDeque<u8>,
    /// Bytes dropped from the front to stay within the limit.
    dropped: u64,
    /// Created at the first follow, so nodes nobody follows pay for no channel.
    feed: Option<broadcast::Sender<Bytes>>,
    /// Set when the node is terminal: nothing more will be written, followers end.
    closed: bool,
}

impl NodeLog {
    /// An empty, open log keeping at most `limit` bytes (at least 1).
    pub(crate) fn new(limit: usize) -> Arc<NodeLog> {
        Arc::new(NodeLog {
            limit: limit.max(1),
            inner: Mutex::new(Inner { buf: VecDeque::new(), dropped: 0, feed: None, closed: false }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the buffer inconsistent in a way
        // that matters more than losing the log, so recover the guard.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends `data`, dropping the oldest bytes beyond the limit. Writes after the
    /// node is terminal are ignored.
    pub fn append(&self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let mut inner = self.lock();
        if inner.closed {
            return;
        }
        // Keep only the tail of an oversized chunk.
        let skip = data.len().saturating_sub(self.limit);
        inner.dropped += skip as u64;
        let data = &data[skip..];
        let overflow = (inner.buf.len() + data.len()).saturating_sub(self.limit);
        if overflow > 0 {
            inner.buf.drain(..overflow);
            inner.dropped += overflow as u64;
        }
        inner.buf.extend(data);
        if let Some(feed) = &inner.feed {
            // No receivers is fine: followers come and go.
            let _ = feed.send(Bytes::copy_from_slice(data));
        }
    }

    /// Marks the log finished: followers drain what they have and then end.
    pub(crate) fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        inner.feed = None;
    }

    /// The log so far (with a marker line first if old bytes were dropped), and a
    /// follower receiving every later append — `None` when the node is already
    /// terminal. Reading and subscribing happen under one lock, so no append falls
    /// between them.
    pub fn read(&self) -> (Vec<u8>, Option<LogFollower>) {
        let mut inner = self.lock();
        let mut out = Vec::with_capacity(inner.buf.len() + 48);
        if inner.dropped > 0 {
            out.extend_from_slice(dropped_marker(inner.dropped).as_bytes());
        }
        let (front, back) = inner.buf.as_slices();
        out.extend_from_slice(front);
        out.extend_from_slice(back);
        let follower = if inner.closed {
            None
        } else {
            let feed = inner.feed.get_or_insert_with(|| broadcast::channel(FOLLOW_BUFFER).0);
            Some(LogFollower { rx: feed.subscribe() })
        };
        (out, follower)
    }

    /// Bytes currently held (without the marker).
    pub fn len(&self) -> usize {
        self.lock().buf.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn dropped_marker(bytes: u64) -> String {
    format!("[hive: {bytes} earlier bytes of this log were dropped]\n")
}

/// Receives a running node's log appends. Ends (`None`) when the node is terminal.
#[derive(Debug)]
pub struct LogFollower {
    rx: broadcast::Receiver<Bytes>,
}

impl LogFollower {
    /// The next chunk, or `None` once the node is terminal and everything was received.
    /// A follower that fell more than a few hundred chunks behind gets a marker line in
    /// place of what it missed.
    pub async fn recv(&mut self) -> Option<Bytes> {
        match self.rx.recv().await {
            Ok(chunk) => Some(chunk),
            Err(broadcast::error::RecvError::Closed) => None,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                Some(Bytes::from(format!("[hive: follower fell behind; {n} chunks skipped]\n")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_tail_with_a_marker() {
        let log = NodeLog::new(8);
        log.append(b"abcdef");
        log.append(b"ghij");
        let (text, _) = log.read();
        assert_eq!(String::from_utf8(text).unwrap(), format!("{}cdefghij", dropped_marker(2)));
        log.append(b"0123456789ab");
        let (text, _) = log.read();
        assert_eq!(String::from_utf8(text).unwrap(), format!("{}456789ab", dropped_marker(14)));
        assert_eq!(log.len(), 8);
    }

    #[tokio::test]
    async fn a_follower_sees_later_appends_and_ends_on_close() {
        let log = NodeLog::new(1024);
        log.append(b"one\n");
        let (so_far, follower) = log.read();
        assert_eq!(so_far, b"one\n");
        let mut follower = follower.unwrap();
        log.append(b"two\n");
        log.close();
        log.append(b"ignored");
        assert_eq!(follower.recv().await.unwrap(), &b"two\n"[..]);
        assert!(follower.recv().await.is_none());
        let (all, none) = log.read();
        assert_eq!(all, b"one\ntwo\n");
        assert!(none.is_none());
    }
}
