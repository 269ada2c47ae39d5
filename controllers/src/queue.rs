//! The work queue: which keys (object names) need a reconcile, and when.
//!
//! - **Dedup.** A key added while it is already queued stays queued once, at the earlier
//!   of its two due times.
//! - **One run per key at a time.** A key handed out by [`WorkQueue::next`] is held by
//!   its [`Claim`]; while held, it is never handed out again. Added meanwhile, it is
//!   queued and becomes eligible when the claim is dropped.
//! - **Delays.** [`WorkQueue::add_after`] makes a key due later;
//!   [`WorkQueue::add_rate_limited`] delays it by an exponential [`Backoff`] that grows
//!   with each consecutive call for that key until [`WorkQueue::forget`] resets it.
//!
//! Concurrency is bounded by the number of workers calling [`WorkQueue::next`]. Time comes
//! from `tokio::time`, so tests run it paused.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backoff::Backoff;

/// A shared handle on one queue: clone it freely.
#[derive(Clone)]
pub struct WorkQueue {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Woken on every change that may make a key eligible, and on shutdown.
    changed: Notify,
    backoff: Backoff,
}

#[derive(Default)]
struct State {
    /// Queued keys and the (due time, insertion number) they are filed under in `order`.
    queued: HashMap<String, (Instant, u64)>,
    /// Queued keys, earliest due first; ties in insertion order.
    order: BTreeSet<(Instant, u64, String)>,
    /// Keys held by a claim.
    claimed: HashSet<String>,
    /// Consecutive rate-limited requeues per key.
    failures: HashMap<String, u32>,
    next_insertion: u64,
    shut_down: bool,
}

/// What the queue holds for a worker asking for work.
enum Lookup {
    /// This key, now claimed.
    Claimed(String),
    /// Nothing eligible before this instant.
    Until(Instant),
    /// Nothing eligible until something changes.
    Idle,
    /// The queue is shut down.
    ShutDown,
}

impl State {
    fn schedule(&mut self, key: String, due: Instant) {
        if self.shut_down {
            return;
        }
        if let Some(&(current, insertion)) = self.queued.get(&key) {
            if current <= due {
                return;
            }
            self.order.remove(&(current, insertion, key.clone()));
        }
        let insertion = self.next_insertion;
        self.next_insertion += 1;
        self.order.insert((due, insertion, key.clone()));
        self.queued.insert(key, (due, insertion));
    }

    fn lookup(&mut self, now: Instant) -> Lookup {
        if self.shut_down {
            return Lookup::ShutDown;
        }
        let Some(entry) = self.order.iter().find(|(_, _, key)| !self.claimed.contains(key)).cloned() else {
            return Lookup::Idle;
        };
        let (due, _, key) = &entry;
        if *due > now {
            return Lookup::Until(*due);
        }
        self.order.remove(&entry);
        self.queued.remove(key);
        self.claimed.insert(key.clone());
        Lookup::Claimed(entry.2)
    }
}

impl WorkQueue {
    /// An empty queue whose rate-limited requeues follow `backoff`.
    pub fn new(backoff: Backoff) -> WorkQueue {
        WorkQueue { shared: Arc::new(Shared { state: Mutex::default(), changed: Notify::new(), backoff }) }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn schedule(&self, key: String, due: Instant) {
        self.state().schedule(key, due);
        self.shared.changed.notify_waiters();
    }

    /// Queues `key` to run as soon as possible.
    pub fn add(&self, key: impl Into<String>) {
        self.schedule(key.into(), Instant::now());
    }

    /// Queues `key` to run once `delay` has passed (or earlier, if it is or gets queued
    /// for earlier).
    pub fn add_after(&self, key: impl Into<String>, delay: Duration) {
        self.schedule(key.into(), Instant::now() + delay);
    }

    /// Queues `key` after its next backoff delay: the initial delay the first time, twice
    /// as long each further time, until [`WorkQueue::forget`].
    pub fn add_rate_limited(&self, key: impl Into<String>) {
        let key = key.into();
        let mut state = self.state();
        let failures = state.failures.entry(key.clone()).or_default();
        let delay = self.shared.backoff.delay(*failures);
        *failures = failures.saturating_add(1);
        state.schedule(key, Instant::now() + delay);
        drop(state);
        self.shared.changed.notify_waiters();
    }

    /// Resets the backoff of `key` (after a successful run).
    pub fn forget(&self, key: &str) {
        self.state().failures.remove(key);
    }

    /// How many rate-limited requeues `key` had since it was last forgotten.
    pub fn failures(&self, key: &str) -> u32 {
        self.state().failures.get(key).copied().unwrap_or(0)
    }

    /// How many keys are queued (due or not), not counting claimed ones.
    pub fn len(&self) -> usize {
        self.state().queued.len()
    }

    /// True when no key is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for a due key that is not claimed, and claims it. Returns `None` once the
    /// queue is shut down.
    pub async fn next(&self) -> Option<Claim> {
        loop {
            // Register for wake-ups before looking, so a change made right after the
            // look is not missed.
            let mut changed = pin!(self.shared.changed.notified());
            changed.as_mut().enable();
            let lookup = self.state().lookup(Instant::now());
            match lookup {
                Lookup::Claimed(key) => return Some(Claim { queue: self.clone(), key }),
                Lookup::ShutDown => return None,
                Lookup::Idle => changed.await,
                Lookup::Until(due) => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(due) => {}
                    }
                }
            }
        }
    }

    /// Stops handing out keys: pending and future [`WorkQueue::next`] calls return `None`,
    /// and adds are ignored. Claims already out stay valid.
    pub fn shutdown(&self) {
        self.state().shut_down = true;
        self.shared.changed.notify_waiters();
    }

    fn release(&self, key: &str) {
        let queued = {
            let mut state = self.state();
            state.claimed.remove(key);
            state.queued.contains_key(key)
        };
        if queued {
            self.shared.changed.notify_waiters();
        }
    }
}

/// The right to work on one key. While it lives the key is not handed to anyone else;
/// dropping it releases the key (and makes it eligible again if it was re-added).
pub struct Claim {
    queue: WorkQueue,
    key: String,
}

impl Claim {
    /// The claimed key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Claim").field(&self.key).finish()
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.queue.release(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> WorkQueue {
        WorkQueue::new(Backoff::new(Duration::from_secs(1), Duration::from_secs(60)))
    }

    async fn take(queue: &WorkQueue) -> Claim {
        tokio::time::timeout(Duration::from_secs(3600), queue.next())
            .await
            .expect("nothing due within an hour")
            .expect("queue shut down")
    }

    async fn nothing_within(queue: &WorkQueue, within: Duration) {
        if let Ok(claim) = tokio::time::timeout(within, queue.next()).await {
            panic!("unexpected {claim:?}");
        }
    }

    /// Seconds of (paused) time since `start`.
    fn since(start: Instant) -> u64 {
        (Instant::now() - start).as_secs()
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_queued_is_queued_once() {
        let queue = queue();
        queue.add("a");
        queue.add("b");
        queue.add("a");
        assert_eq!(queue.len(), 2);
        assert_eq!(take(&queue).await.key(), "a");
        assert_eq!(take(&queue).await.key(), "b");
        nothing_within(&queue, Duration::from_secs(60)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_claimed_key_is_not_handed_out_again_until_released() {
        let queue = queue();
        queue.add("a");
        let claim = take(&queue).await;
        queue.add("a");
        queue.add("a");
        queue.add("b");
        // b is handed out; a waits for its claim although it is due and first in line.
        assert_eq!(take(&queue).await.key(), "b");
        nothing_within(&queue, Duration::from_secs(60)).await;

        // A worker already waiting is woken by the release.
        let waiting = tokio::spawn({
            let queue = queue.clone();
            async move { take(&queue).await.key().to_string() }
        });
        tokio::task::yield_now().await;
        drop(claim);
        assert_eq!(waiting.await.unwrap(), "a");
        nothing_within(&queue, Duration::from_secs(60)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_delays_and_the_earlier_due_time_wins() {
        let queue = queue();
        let start = Instant::now();
        queue.add_after("a", Duration::from_secs(10));
        queue.add_after("a", Duration::from_secs(20)); // later: ignored
        assert_eq!(take(&queue).await.key(), "a");
        assert_eq!(since(start), 10);

        queue.add_after("b", Duration::from_secs(30));
        queue.add("b"); // earlier: moves b forward
        assert_eq!(take(&queue).await.key(), "b");
        assert_eq!(since(start), 10);
        nothing_within(&queue, Duration::from_secs(3600)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_requeues_back_off_exponentially_until_forgotten() {
        let queue = queue();
        queue.add("a");
        let mut at = Vec::new();
        let start = Instant::now();
        for _ in 0..4 {
            let claim = take(&queue).await;
            at.push(since(start));
            queue.add_rate_limited(claim.key());
        }
        take(&queue).await;
        at.push(since(start));
        assert_eq!(at, [0, 1, 3, 7, 15]);
        assert_eq!(queue.failures("a"), 4);

        // Other keys have their own backoff.
        let b_start = Instant::now();
        queue.add_rate_limited("b");
        take(&queue).await;
        assert_eq!(since(b_start), 1);

        queue.forget("a");
        let again = Instant::now();
        queue.add_rate_limited("a");
        take(&queue).await;
        assert_eq!(since(again), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_requeue_made_during_a_claim_waits_for_both() {
        let queue = queue();
        queue.add("a");
        let start = Instant::now();
        let claim = take(&queue).await;
        queue.add_after("a", Duration::from_secs(5));
        tokio::time::sleep(Duration::from_secs(8)).await;
        drop(claim); // due for 3 s already: eligible at once
        take(&queue).await;
        assert_eq!(since(start), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_wakes_waiting_workers_and_ignores_adds() {
        let queue = queue();
        let waiting = tokio::spawn({
            let queue = queue.clone();
            async move { queue.next().await.is_none() }
        });
        tokio::task::yield_now().await;
        queue.shutdown();
        assert!(waiting.await.unwrap());
        queue.add("a");
        assert!(queue.is_empty());
        assert!(queue.next().await.is_none());
    }
}
