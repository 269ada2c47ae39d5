//! Watches: the events a watcher receives, the stream it reads them from, and the
//! bounded per-watcher buffer the commit thread fills without ever waiting.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// The object after the change (for `Deleted`, its last state), as JSON exactly as
    /// `serde_json::to_vec` writes it (and as redb stores it): encoded once when the
    /// change was committed, shared with the cache while it is current.
    pub object: Obj,
    /// The object as it was just before this change: the very bytes the cache held
    /// (shared with the previous event of the object, so it costs no copy), or `None`
    /// for `Added` and for an event whose previous version had left the log before the
    /// store was reopened. Selector watches use it to tell an object that stopped (or
    /// started) matching from one that merely changed.
    pub previous: Option<Obj>,
    /// A slot where the first consumer may keep this event's wire encoding, so that a
    /// thousand watchers of one kind serialize each event once, not a thousand times.
    pub encoded: Encoded,
    /// About how many bytes of memory the event holds (`event_cost`): what retention's
    /// and each watcher's byte budgets count.
    pub cost: usize,
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
/// It ends (`None`) when the store shuts down. The retained events are read from the
/// store's log a few at a time as the watcher consumes them, so a watch never copies
/// the history and pins nothing retention has dropped; a watcher that reads slower than
/// retention drops its history gets `Err(Error::Expired)` and ends. A watcher that falls
/// `watch_buffer` live events, or `watch_buffer_bytes` of them, behind is dropped by the
/// store: it still yields the events it had buffered, then one
/// `Err(Error::WatchOverflow)`, then ends.
pub struct Watch {
    kind: Arc<str>,
    history: Arc<dyn History>,
    /// Retained events read but not yet yielded.
    replay: VecDeque<StoreEvent>,
    /// The last revision the replay has read up to, and the last one it covers (the
    /// store's revision when the watch began; later ones arrive live).
    replay_cursor: u64,
    replay_end: u64,
    live: mpsc::Receiver<StoreEvent>,
    budget: Arc<Budget>,
    /// Live events at or below this revision are skipped (a watch from the future).
    after: u64,
    finished: bool,
}

/// Where a watch reads the retained events from: the store's log.
pub(super) trait History: Send + Sync {
    /// Up to `max` retained events of `kind` after revision `cursor`, up to `end`, and
    /// the revision read up to; `Expired` once retention dropped what follows `cursor`.
    fn retained(&self, kind: &str, cursor: u64, end: u64, max: usize) -> Result<(Vec<StoreEvent>, u64)>;
}

/// Retained events a watch reads from the log at a time.
const REPLAY_CHUNK: usize = 64;

/// What a watcher has pending, shared by both ends, and whether it overflowed.
struct Budget {
    bytes: AtomicUsize,
    max_bytes: usize,
    overflowed: AtomicBool,
}

impl Watch {
    pub(super) fn new(
        history: Arc<dyn History>,
        kind: Arc<str>,
        after: u64,
        replay_end: u64,
        limits: (usize, usize),
        group: u64,
    ) -> (Watch, Watcher) {
        let (buffer, max_bytes) = limits;
        let (tx, live) = mpsc::channel(buffer.max(1));
        let budget =
            Arc::new(Budget { bytes: AtomicUsize::new(0), max_bytes, overflowed: AtomicBool::new(false) });
        let watcher = Watcher { tx, budget: budget.clone(), group };
        let watch = Watch {
            kind,
            history,
            replay: VecDeque::new(),
            replay_cursor: after,
            replay_end,
            live,
            budget,
            after,
            finished: false,
        };
        (watch, watcher)
    }

    /// The next event; `None` once the watch has ended.
    pub async fn next(&mut self) -> Option<Result<StoreEvent>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<StoreEvent>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        while self.replay.is_empty() && self.replay_cursor < self.replay_end {
            let read = self.history.retained(&self.kind, self.replay_cursor, self.replay_end, REPLAY_CHUNK);
            match read {
                Ok((events, cursor)) => {
                    self.replay.extend(events);
                    self.replay_cursor = cursor;
                }
                Err(err) => {
                    self.finished = true;
                    return Poll::Ready(Some(Err(err)));
                }
            }
        }
        if let Some(event) = self.replay.pop_front() {
            return Poll::Ready(Some(Ok(event)));
        }
        loop {
            match self.live.poll_recv(cx) {
                Poll::Ready(Some(event)) => {
                    self.budget.bytes.fetch_sub(event.cost, Ordering::AcqRel);
                    if event.revision <= self.after {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(event)));
                }
                Poll::Ready(None) => {
                    self.finished = true;
                    // The flag is set before the store drops the sender, so it is
                    // visible once the channel reports closed.
                    return Poll::Ready(
                        self.budget.overflowed.load(Ordering::Acquire).then_some(Err(Error::WatchOverflow)),
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
    budget: Arc<Budget>,
    /// The watch's group (`Store::watch_grouped`): watchers of a kind are kept in group
    /// order, so an event wakes one group's watchers one after another.
    pub(super) group: u64,
}

impl Watcher {
    /// Hands `event` to the watcher without waiting. Returns false when the watcher is
    /// gone (its `Watch` was dropped) or has just overflowed — its buffer is full by
    /// count, or its pending events would cost more than its byte budget; the caller
    /// then drops it, which closes the channel.
    pub(super) fn offer(&self, event: StoreEvent) -> bool {
        let cost = event.cost;
        let pending = self.budget.bytes.fetch_add(cost, Ordering::AcqRel) + cost;
        // One event is always let through, so an object larger than the budget is
        // delivered to a watcher that keeps up.
        if pending > self.budget.max_bytes && pending != cost {
            self.budget.overflowed.store(true, Ordering::Release);
            return false;
        }
        match self.tx.try_send(event) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.budget.overflowed.store(true, Ordering::Release);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Ends the watch as overflowed: its reader gets `Error::WatchOverflow` after what
    /// it has buffered, and lists again.
    pub(super) fn overflow(self) {
        self.budget.overflowed.store(true, Ordering::Release);
    }

    /// True once the `Watch` has been dropped.
    pub(super) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// What one event costs to keep: the event, its object's JSON (shared with the cache
/// while current), and room for its watch line (built once, shared).
pub(super) fn event_cost(json_len: usize) -> usize {
    std::mem::size_of::<StoreEvent>() + 2 * json_len + 64
}
