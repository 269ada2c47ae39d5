//! Watches: the events a watcher receives, the stream it reads them from, and the
//! bounded per-watcher buffer the commit thread fills without ever waiting.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use futures_util::task::AtomicWaker;
use futures_util::Stream;

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
    live: Arc<Mailbox>,
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

/// Room for live events a watch keeps once it has taken them all.
const SPARE_EVENTS: usize = 64;

/// Watches whose lines leave together: the server makes one for each connection and
/// registers the connection's watches in it (`Store::watch_grouped`). An event is handed
/// to a kind's watchers group by group, and the group counts its watches that were handed
/// events and have not yet said they sent on all they took ([`Watch::sent`]); when that
/// count falls to none, the group is settled and whoever waits for it is woken. The
/// connection holds a flush while its watches still owe lines, and writes once they are
/// settled rather than when every ready task of its worker has run
/// (`server/serve/connection.rs`). A watch that takes events and does not send them on
/// (its stream out of flow-control window) keeps the group owing: the writer bounds its
/// own wait (1 ms there), so the count delays nothing for good.
pub struct Group {
    id: u64,
    /// Watches of the group that were handed events and have not sent on them. A watch
    /// may say so between an offer's mark and its count, so this dips below zero for a
    /// moment: it settles only on falling from one to none.
    owing: AtomicIsize,
    /// Set when `owing` fell to none; taken by the writer when it writes.
    settled: AtomicBool,
    /// The writer waiting for the group to settle.
    waiter: AtomicWaker,
}

/// Groups made so far: each takes the next number, so a later group's watchers come
/// after an earlier one's.
static GROUPS: AtomicU64 = AtomicU64::new(0);

impl Group {
    /// A new group, numbered after every group made before it.
    pub fn new() -> Arc<Group> {
        Arc::new(Group {
            id: GROUPS.fetch_add(1, Ordering::Relaxed) + 1,
            owing: AtomicIsize::new(0),
            settled: AtomicBool::new(false),
            waiter: AtomicWaker::new(),
        })
    }

    /// The group's number (from 1): a kind's watchers are kept in this order.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether the group settled since this was last asked: every watch of it that was
    /// handed events has sent on them. Clears the mark.
    pub fn take_settled(&self) -> bool {
        self.settled.swap(false, Ordering::AcqRel)
    }

    /// Wakes `waker` when the group next settles (in place of a waker given before).
    pub fn wake_when_settled(&self, waker: &Waker) {
        self.waiter.register(waker);
    }

    /// Whether some watch of the group was handed events it has not sent on.
    pub fn owes_lines(&self) -> bool {
        self.owing.load(Ordering::Acquire) > 0
    }

    fn owe(&self) {
        self.owing.fetch_add(1, Ordering::AcqRel);
    }

    fn paid(&self) {
        if self.owing.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.settled.store(true, Ordering::Release);
            self.waiter.wake();
        }
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("id", &self.id).field("owing", &self.owing).finish_non_exhaustive()
    }
}

/// The live events handed to one watch and not yet taken, shared by both ends.
///
/// Handing an event over and waking the watch's task are apart: the commit thread puts
/// a batch's events in every mailbox under the cache's lock, and the wakes are owed
/// ([`Woken`]) until the lock is released, then given all at once from one task of the
/// runtime (`Shared::hand`). Woken from a worker, the watches' tasks go to that worker's
/// own queue and run one after another, which is what the connection's held flush
/// waits for (`server/serve/connection.rs`); woken from the commit thread they go
/// through the runtime's shared queue as they come. What it buys is the writer's time:
/// the commit thread answers a batch's writers without first waking every watch
/// (docs/benchmarks.md: at 1,000 watchers × 10 writes a second the writer's creates
/// p50 went from 5.7–6.9 to 1.7–1.9 ms; the deliveries and the writes did not move).
struct Mailbox {
    queue: Mutex<Queue>,
    /// The watch's task, while it waits for events.
    task: AtomicWaker,
    /// Set by the first event handed over since the watch was last woken: whoever
    /// handed it owes the wake.
    owed: AtomicBool,
    /// Bytes of events pending (`event_cost`), against `max_bytes`.
    bytes: AtomicUsize,
    max_bytes: usize,
    /// Events pending at most.
    capacity: usize,
    /// Set when the store dropped the watcher for falling behind.
    overflowed: AtomicBool,
    /// Set when the `Watch` is dropped: the store drops its end at the next event.
    gone: AtomicBool,
    /// The group the watch is in, if any.
    group: Option<Arc<Group>>,
    /// Set while the watch counts in its group as owing lines: from an event handed over
    /// to the reader's [`Watch::sent`].
    owing: AtomicBool,
}

struct Queue {
    events: VecDeque<StoreEvent>,
    /// The store dropped its end: nothing more will come.
    ended: bool,
}

impl Mailbox {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The reader sent on what it took: the watch no longer owes its group.
    fn paid(&self) {
        if let Some(group) = &self.group {
            if self.owing.swap(false, Ordering::AcqRel) {
                group.paid();
            }
        }
    }

    fn wake(&self) {
        // Cleared first: an event handed over after this owes a wake of its own.
        self.owed.store(false, Ordering::Release);
        self.task.wake();
    }
}

/// Wakes owed to watches that were handed events: given when this is dropped (or by
/// [`Woken::wake`]), so a wake is never lost, only late.
#[derive(Default)]
pub(super) struct Woken(Vec<Arc<Mailbox>>);

impl Woken {
    /// Whether no wake is owed.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Gives every owed wake (as dropping it does).
    pub(super) fn wake(self) {
        drop(self);
    }
}

impl Drop for Woken {
    fn drop(&mut self) {
        for mailbox in self.0.drain(..) {
            mailbox.wake();
        }
    }
}

impl Watch {
    pub(super) fn new(
        history: Arc<dyn History>,
        kind: Arc<str>,
        after: u64,
        replay_end: u64,
        limits: (usize, usize),
        group: Option<Arc<Group>>,
    ) -> (Watch, Watcher) {
        let (buffer, max_bytes) = limits;
        let mailbox = Arc::new(Mailbox {
            queue: Mutex::new(Queue { events: VecDeque::new(), ended: false }),
            task: AtomicWaker::new(),
            owed: AtomicBool::new(false),
            bytes: AtomicUsize::new(0),
            max_bytes,
            capacity: buffer.max(1),
            overflowed: AtomicBool::new(false),
            gone: AtomicBool::new(false),
            owing: AtomicBool::new(false),
            group: group.clone(),
        });
        let watcher = Watcher { mailbox: mailbox.clone(), group: group.map_or(0, |g| g.id) };
        let watch = Watch {
            kind,
            history,
            replay: VecDeque::new(),
            replay_cursor: after,
            replay_end,
            live: mailbox,
            after,
            finished: false,
        };
        (watch, watcher)
    }

    /// Says the reader has sent on every event it took (it found none ready): the watch
    /// no longer owes its group lines (see [`Group`]). Harmless when it owed none.
    pub fn sent(&self) {
        self.live.paid();
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
        let mut registered = false;
        loop {
            let (next, ended) = {
                let mut queue = self.live.queue();
                let next = queue.events.pop_front();
                if queue.events.is_empty() && queue.events.capacity() > SPARE_EVENTS {
                    // A burst is over: the room it took is not kept (up to the buffer's
                    // length for each watcher).
                    queue.events.shrink_to(SPARE_EVENTS);
                }
                (next, queue.ended)
            };
            match next {
                Some(event) => {
                    self.live.bytes.fetch_sub(event.cost, Ordering::AcqRel);
                    if event.revision <= self.after {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(event)));
                }
                None if ended => {
                    self.finished = true;
                    // The flag is set before the store drops its end, which ends the
                    // queue under its lock.
                    return Poll::Ready(
                        self.live.overflowed.load(Ordering::Acquire).then_some(Err(Error::WatchOverflow)),
                    );
                }
                // Looked again after registering: an event handed over in between
                // found no task to wake.
                None if registered => return Poll::Pending,
                None => {
                    self.live.task.register(cx.waker());
                    registered = true;
                }
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

impl Drop for Watch {
    fn drop(&mut self) {
        self.live.gone.store(true, Ordering::Release);
        // It sends nothing more.
        self.live.paid();
        // What was pending is freed now, not when the store next drops its end.
        let pending = std::mem::take(&mut self.live.queue().events);
        drop(pending);
    }
}

/// The store's end of one watch. Dropping it ends the watch (after what it had
/// pending).
pub(super) struct Watcher {
    mailbox: Arc<Mailbox>,
    /// The watch's group (`Store::watch_grouped`): watchers of a kind are kept in group
    /// order, so an event wakes one group's watchers one after another.
    pub(super) group: u64,
}

impl Watcher {
    /// Hands `event` to the watcher without waiting, and adds its wake to `woken` when
    /// it is owed one. Returns false when the watcher is gone (its `Watch` was dropped)
    /// or has just overflowed — its buffer is full by count, or its pending events
    /// would cost more than its byte budget; the caller then drops it, which ends the
    /// watch.
    pub(super) fn offer(&self, event: StoreEvent, woken: &mut Woken) -> bool {
        let mailbox = &self.mailbox;
        if mailbox.gone.load(Ordering::Acquire) {
            return false;
        }
        let cost = event.cost;
        let pending = mailbox.bytes.fetch_add(cost, Ordering::AcqRel) + cost;
        // One event is always let through, so an object larger than the budget is
        // delivered to a watcher that keeps up.
        if pending > mailbox.max_bytes && pending != cost {
            mailbox.overflowed.store(true, Ordering::Release);
            return false;
        }
        {
            let mut queue = mailbox.queue();
            if queue.events.len() >= mailbox.capacity {
                mailbox.overflowed.store(true, Ordering::Release);
                return false;
            }
            queue.events.push_back(event);
        }
        if let Some(group) = &mailbox.group {
            if !mailbox.owing.swap(true, Ordering::AcqRel) {
                group.owe();
            }
        }
        if !mailbox.owed.swap(true, Ordering::AcqRel) {
            woken.0.push(mailbox.clone());
        }
        true
    }

    /// Ends the watch as overflowed: its reader gets `Error::WatchOverflow` after what
    /// it has buffered, and lists again.
    pub(super) fn overflow(self) {
        self.mailbox.overflowed.store(true, Ordering::Release);
    }

    /// True once the `Watch` has been dropped.
    pub(super) fn is_closed(&self) -> bool {
        self.mailbox.gone.load(Ordering::Acquire)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.mailbox.queue().ended = true;
        // Rare (an overflow, a reload, shutdown): woken at once.
        self.mailbox.wake();
    }
}

/// What one event costs to keep: the event, its object's JSON (shared with the cache
/// while current), and room for its watch line (built once, shared).
pub(super) fn event_cost(json_len: usize) -> usize {
    std::mem::size_of::<StoreEvent>() + 2 * json_len + 64
}
