//! Watches: the events a watcher receives, the stream it reads them from, and the
//! bounded per-watcher buffer the commit thread fills without ever waiting.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::Stream;
use tokio::sync::mpsc;

use super::error::{Error, Result};
use super::Obj;

/// What happened to an object at one revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// The object was created.
    Added,
    /// The object changed (including being marked for deletion).
    Modified,
    /// The object was removed; the event carries its last state.
    Deleted,
}

impl EventType {
    /// The Kubernetes wire name: `ADDED`, `MODIFIED` or `DELETED`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<EventType> {
        match s {
            "ADDED" => Some(EventType::Added),
            "MODIFIED" => Some(EventType::Modified),
            "DELETED" => Some(EventType::Deleted),
            _ => None,
        }
    }
}

/// One committed change, as the event log holds it and watchers receive it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreEvent {
    /// The revision of the write; equals the object's `metadata.resourceVersion`.
    pub revision: u64,
    /// Plural resource name of the object.
    pub kind: Arc<str>,
    /// What happened.
    pub type_: EventType,
    /// The object after the change (for `Deleted`, its last state).
    pub object: Obj,
    /// The object as it was just before this change: the very `Arc` the cache held
    /// (shared with the previous event of the object, so it costs no copy), or `None`
    /// for `Added` and for an event whose previous version had left the log before the
    /// store was reopened. Selector watches use it to tell an object that stopped (or
    /// started) matching from one that merely changed.
    pub previous: Option<Obj>,
    /// `object` as JSON, exactly as `serde_json::to_vec` writes it (and as redb stores
    /// it): encoded once when the change was committed.
    pub object_json: bytes::Bytes,
    /// A slot where the first consumer may keep this event's wire encoding, so that a
    /// thousand watchers of one kind serialize each event once, not a thousand times.
    pub encoded: Encoded,
}

/// A write-once cache of an event's encoding, shared by every clone of the event.
/// Ignored by equality and `Debug`: it is derived data.
#[derive(Clone, Default)]
pub struct Encoded(Arc<std::sync::OnceLock<bytes::Bytes>>);

impl Encoded {
    /// The cached encoding, computing it with `encode` on first use.
    pub fn get_or_init(&self, encode: impl FnOnce() -> bytes::Bytes) -> bytes::Bytes {
        self.0.get_or_init(encode).clone()
    }
}

impl PartialEq for Encoded {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Encoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Encoded")
    }
}

/// A stream of every event of one kind after a given revision: first the retained
/// events, then live ones, with no gap and no duplicate between them.
///
/// It ends (`None`) when the store shuts down. A watcher that falls `watch_buffer`
/// events behind is dropped by the store: it still yields the events it had buffered,
/// then one `Err(Error::WatchOverflow)`, then ends.
pub struct Watch {
    replay: VecDeque<StoreEvent>,
    live: mpsc::Receiver<StoreEvent>,
    overflowed: Arc<AtomicBool>,
    /// Live events at or below this revision are skipped (a watch from the future).
    after: u64,
    finished: bool,
}

impl Watch {
    pub(super) fn new(replay: VecDeque<StoreEvent>, buffer: usize, after: u64) -> (Watch, Watcher) {
        let (tx, live) = mpsc::channel(buffer.max(1));
        let overflowed = Arc::new(AtomicBool::new(false));
        let watcher = Watcher { tx, overflowed: overflowed.clone() };
        (Watch { replay, live, overflowed, after, finished: false }, watcher)
    }

    /// The next event; `None` once the watch has ended.
    pub async fn next(&mut self) -> Option<Result<StoreEvent>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<StoreEvent>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        if let Some(event) = self.replay.pop_front() {
            return Poll::Ready(Some(Ok(event)));
        }
        loop {
            match self.live.poll_recv(cx) {
                Poll::Ready(Some(event)) if event.revision <= self.after => continue,
                Poll::Ready(Some(event)) => return Poll::Ready(Some(Ok(event))),
                Poll::Ready(None) => {
                    self.finished = true;
                    // The flag is set before the store drops the sender, so it is
                    // visible once the channel reports closed.
                    return Poll::Ready(
                        self.overflowed.load(Ordering::Acquire).then_some(Err(Error::WatchOverflow)),
                    );
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Stream for Watch {
    type Item = Result<StoreEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx)
    }
}

/// The store's end of one watch.
pub(super) struct Watcher {
    tx: mpsc::Sender<StoreEvent>,
    overflowed: Arc<AtomicBool>,
}

impl Watcher {
    /// Hands `event` to the watcher without waiting. Returns false when the watcher is
    /// gone (its `Watch` was dropped) or has just overflowed; the caller then drops it,
    /// which closes the channel.
    pub(super) fn offer(&self, event: StoreEvent) -> bool {
        match self.tx.try_send(event) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.overflowed.store(true, Ordering::Release);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// True once the `Watch` has been dropped.
    pub(super) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}
