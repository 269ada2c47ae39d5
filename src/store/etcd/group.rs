//! Group commit on etcd: writes that arrive while others are in flight share one etcd
//! transaction.
//!
//! Each transaction costs etcd a raft entry, an fsync and a request's decoding whatever
//! it holds, so 64 clients each sending its own measured well under what the same writes
//! reach grouped (docs/benchmarks.md, issue 30). A write that finds a slot free (at
//! most [`IN_FLIGHT`] transactions at once) goes alone at once; the others wait, and
//! one task takes the writes waiting when a slot frees, plans each against the cache as [`Backend::commit_alone`] does, and sends those that
//! fit etcd's limits as one transaction: every write's guards (the revision of each key
//! it read) among its compares, every write's puts and deletes among its operations.
//! All of them land at one revision, or none does.
//!
//! What does not go into a group takes the path of a write alone, which plans again,
//! retries a guard that failed, and reads back an outcome that is unknown: a write that
//! failed its plan (it may be a stale cache), that writes nothing, that touches a key
//! another write of the group touches, or that would take the group past etcd's limits;
//! and every write of a group whose transaction failed a guard, timed out without an
//! outcome, or was refused (none of it was applied: a transaction is all or nothing).
//! So a grouped write is answered exactly as it would have been alone, with the group's
//! revision as its `resourceVersion` (objects written in one transaction share one, as
//! an intent and its Job do).

use std::collections::HashSet;
use std::sync::{Arc, Weak};

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::client::{ClientError, Compare, Op};
use super::{encode, Backend, MAX_TXN_OPS};
use crate::store::error::{Error, Result};
use crate::store::mutation::{plan, Mutation, Outcome};
use crate::store::watch::EventType;
use crate::store::Obj;

/// Transactions of grouped writes in flight at once. While they are, new writes wait and
/// form the next group. A group's slot frees once etcd answered its transaction, before
/// its writes wait for the cache to show them (the feed's latency would otherwise hold
/// the next group back: 36% of the machine sat idle at 64 clients).
const IN_FLIGHT: usize = 8;

/// Bytes of values one group may carry: etcd's default `--max-request-bytes` is 1.5 MiB
/// (keys, guards and framing take the rest).
const GROUP_BYTES: usize = 1024 * 1024;

/// One write's plan against the cache.
pub(super) struct Planned {
    /// What the write answers once committed.
    pub outcomes: Vec<Outcome>,
    /// Its puts and deletes (none: it changes nothing).
    pub ops: Vec<Op>,
    /// The bytes of the values it puts.
    pub bytes: usize,
}

/// A write waiting for its group.
pub(super) struct Waiting {
    mutations: Vec<Mutation>,
    reply: oneshot::Sender<Result<Vec<Outcome>>>,
}

/// The queue of writes, the task that groups them, and the slots of transactions in
/// flight.
pub(super) struct Grouper {
    queue: std::sync::OnceLock<mpsc::UnboundedSender<Waiting>>,
    slots: Arc<Semaphore>,
}

impl Default for Grouper {
    fn default() -> Grouper {
        Grouper { queue: std::sync::OnceLock::new(), slots: Arc::new(Semaphore::new(IN_FLIGHT)) }
    }
}

impl Backend {
    /// Plans `mutations` on the objects `lookup` sees: the keys they read with the
    /// revisions the plan took them at (the write's guards), and what the write answers
    /// and does, or why it fails.
    pub(super) fn prepare(
        &self,
        lookup: &dyn Fn(&str, &str) -> Option<Obj>,
        mutations: Vec<Mutation>,
        next_revision: u64,
        now: DateTime<Utc>,
    ) -> (Vec<(Vec<u8>, u64)>, Result<Planned>) {
        let mut reads: Vec<(Vec<u8>, u64)> = Vec::with_capacity(mutations.len());
        for mutation in &mutations {
            let Ok(name) = mutation.name() else { continue };
            let key = self.keys.object(mutation.kind(), &name);
            if !reads.iter().any(|(k, _)| *k == key) {
                let revision = lookup(mutation.kind(), &name).map_or(0, |o| o.revision());
                reads.push((key, revision));
            }
        }
        let applied = match plan(lookup, mutations, next_revision, now) {
            Ok(applied) => applied,
            Err(error) => return (reads, Err(error)),
        };
        let mut outcomes = Vec::with_capacity(applied.len());
        let mut finals = Vec::new();
        for one in applied {
            if let Some(change) = one.change {
                finals.retain(|c: &crate::store::mutation::Change| {
                    !(c.kind == change.kind && c.name == change.name)
                });
                finals.push(change);
            }
            outcomes.push(one.outcome);
        }
        let mut bytes = 0;
        let ops = finals
            .iter()
            .map(|change| {
                let key = self.keys.object(change.kind, &change.name);
                match change.type_ {
                    EventType::Deleted => Op::Delete { key },
                    _ => {
                        let value = encode(&change.object);
                        bytes += value.len();
                        Op::Put { key, value, lease: 0 }
                    }
                }
            })
            .collect();
        (reads, Ok(Planned { outcomes, ops, bytes }))
    }

    /// Commits `mutations` as one etcd transaction, in a group with the writes that
    /// wait beside it (see the module doc).
    pub(in crate::store) async fn commit(self: &Arc<Self>, mutations: Vec<Mutation>) -> Result<Vec<Outcome>> {
        // A slot free while no write waits for one (a slot is handed to a waiter as it
        // frees, so none is free then): this write is a group of one, sent from here
        // rather than through the grouping task (two hand-overs fewer).
        if let Ok(slot) = self.grouper.slots.clone().try_acquire_owned() {
            let answer = self.commit_alone(mutations).await;
            drop(slot);
            return answer;
        }
        let queue = self.grouper.queue.get_or_init(|| {
            let (queue, waiting) = mpsc::unbounded_channel();
            tokio::spawn(group_writes(Arc::downgrade(self), self.grouper.slots.clone(), waiting));
            queue
        });
        let (reply, answer) = oneshot::channel();
        queue.send(Waiting { mutations, reply }).map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    /// Commits the writes of `group`, together where they can be (see the module doc).
    async fn commit_group(self: &Arc<Self>, group: Vec<Waiting>, slot: OwnedSemaphorePermit) {
        let mut slot = Some(slot);
        if let [_] = group.as_slice() {
            let Some(one) = group.into_iter().next() else { return };
            let _ = one.reply.send(self.commit_alone(one.mutations).await);
            return;
        }
        let fence = self.fence();
        let (mut together, alone) = match self.gather(group, fence.is_some()) {
            Some(sorted) => sorted,
            None => return,
        };
        // A guard that failed names the write it guards: that one goes alone, and the
        // rest are sent again once.
        let mut alone = alone;
        for attempt in 0..2 {
            if together.len() < 2 {
                break;
            }
            let mut compares: Vec<Compare> = Vec::new();
            let mut ops: Vec<Op> = Vec::new();
            let mut failure: Vec<Op> = Vec::new();
            let mut guards: Vec<(Vec<u8>, u64)> = Vec::new();
            for member in &together {
                compares.extend(
                    member.reads.iter().map(|(key, revision)| Compare::ModRevision(key.clone(), *revision)),
                );
                failure.extend(member.reads.iter().map(|(key, _)| Op::Get { key: key.clone() }));
                guards.extend(member.reads.iter().cloned());
                ops.extend(member.ops.iter().cloned());
            }
            if let Some(fence) = &fence {
                compares.push(fence.compare());
                failure.push(Op::Get { key: fence.key.clone() });
            }
            let committed = match self.etcd.txn(&compares, &ops, &failure).await {
                Ok(answer) if answer.succeeded => Ok(Some(answer.revision)),
                // A guard failed: nothing of it was applied. Those whose keys moved go
                // alone; the others are tried again (unless the fence failed: then each
                // alone finds that out).
                Ok(answer) => {
                    let mut gets = answer.gets.into_iter();
                    let mut kept = Vec::with_capacity(together.len());
                    for member in together {
                        let moved =
                            member.reads.iter().zip(gets.by_ref()).fold(false, |moved, ((_, at), now)| {
                                moved || now.as_ref().map_or(0, |kv| kv.mod_revision) != *at
                            });
                        if moved || attempt == 1 {
                            alone.push(member.waiting);
                        } else {
                            kept.push(member);
                        }
                    }
                    let fence_holds = fence.as_ref().is_none_or(|f| f.holds(gets.next().flatten().as_ref()));
                    if !fence_holds {
                        alone.extend(kept.drain(..).map(|member| member.waiting));
                    }
                    together = kept;
                    continue;
                }
                // Maybe applied: read back whether it was, as a write alone does.
                Err(e @ ClientError::Indeterminate { .. }) => self.resolve(&guards, &ops, &e).await,
                // Refused or unreachable: nothing was applied; each alone says why.
                Err(_) => Ok(None),
            };
            match committed {
                Ok(Some(revision)) => {
                    drop(slot.take());
                    let answers = together.drain(..).map(|member| async move {
                        let _ = member.waiting.reply.send(Ok(self.answered(member.outcomes, revision).await));
                    });
                    futures_util::future::join_all(answers).await;
                }
                Ok(None) => alone.extend(together.drain(..).map(|member| member.waiting)),
                // Still unknown: every write of the group says so.
                Err(error) => {
                    let message = error.to_string();
                    for member in together.drain(..) {
                        let _ =
                            member.waiting.reply.send(Err(Error::Unavailable { message: message.clone() }));
                    }
                }
            }
            break;
        }
        alone.extend(together.into_iter().map(|member| member.waiting));
        // After the group: a write that shares a key with it plans on what it did.
        let alone = alone.into_iter().map(|waiting| async move {
            let _ = waiting.reply.send(self.commit_alone(waiting.mutations).await);
        });
        futures_util::future::join_all(alone).await;
    }

    /// Plans each write of `group` on the cache: those that can share one transaction
    /// within etcd's limits, and those that go alone (`None`: the store is closed, and
    /// every write was told so).
    fn gather(&self, group: Vec<Waiting>, fenced: bool) -> Option<(Vec<Member>, Vec<Waiting>)> {
        let state = self.shared.read();
        if state.closed {
            for waiting in group {
                let _ = waiting.reply.send(Err(Error::Closed));
            }
            return None;
        }
        let now = self.shared.config.clock.now();
        let lookup = |kind: &str, name: &str| state.get(kind, name);
        // One compare and one failure get are the fence's.
        let room = MAX_TXN_OPS - usize::from(fenced);
        let (mut together, mut alone) = (Vec::<Member>::new(), Vec::new());
        let mut touched: HashSet<Vec<u8>> = HashSet::new();
        let (mut guards, mut writes, mut bytes) = (0, 0, 0);
        for waiting in group {
            let (reads, planned) = self.prepare(&lookup, waiting.mutations.clone(), state.revision + 1, now);
            match planned {
                Ok(planned)
                    if !planned.ops.is_empty()
                        && reads.iter().all(|(key, _)| !touched.contains(key))
                        && guards + reads.len() <= room
                        && writes + planned.ops.len() <= MAX_TXN_OPS
                        && bytes + planned.bytes <= GROUP_BYTES =>
                {
                    touched.extend(reads.iter().map(|(key, _)| key.clone()));
                    (guards, writes, bytes) =
                        (guards + reads.len(), writes + planned.ops.len(), bytes + planned.bytes);
                    together.push(Member { waiting, outcomes: planned.outcomes, reads, ops: planned.ops });
                }
                _ => alone.push(waiting),
            }
        }
        Some((together, alone))
    }
}

/// A write in a group: what it answers, the keys it read at their revisions (its
/// guards), and its operations.
struct Member {
    waiting: Waiting,
    outcomes: Vec<Outcome>,
    reads: Vec<(Vec<u8>, u64)>,
    ops: Vec<Op>,
}

/// Takes the waiting writes as groups, at most [`IN_FLIGHT`] groups in flight, until the
/// store is dropped.
async fn group_writes(
    backend: Weak<Backend>,
    slots: Arc<Semaphore>,
    mut waiting: mpsc::UnboundedReceiver<Waiting>,
) {
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let Some(first) = waiting.recv().await else { return };
        let mut group = vec![first];
        while group.len() < MAX_TXN_OPS {
            match waiting.try_recv() {
                Ok(next) => group.push(next),
                Err(_) => break,
            }
        }
        let Some(backend) = backend.upgrade() else { return };
        tokio::spawn(async move { backend.commit_group(group, slot).await });
    }
}
