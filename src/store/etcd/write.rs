//! A write alone on etcd: planned on the cache, sent as one transaction guarded by the
//! revision of every key it read, planned again on what a failed guard read back, and,
//! when etcd's answer was lost, read back before it is answered (see the module doc of
//! [`super`]). The group commit ([`super::group`]) sends every write it cannot group
//! this way.

use std::collections::HashMap;
use std::sync::PoisonError;
use std::time::Duration;

use super::client::{ClientError, Compare, KeyValue, Op};
use super::{decode, restamp, unavailable, Backend, MAX_TXN_OPS};
use crate::store::error::{Error, Result};
use crate::store::mutation::{Mutation, Outcome};
use crate::store::Obj;

/// How long a write keeps being planned again while other writers keep changing what
/// it read (kube-apiserver's update loops until its request's deadline, too).
const CONTENDED_FOR: Duration = Duration::from_secs(30);

/// The longest pause between two attempts of a contended write.
const MAX_PAUSE: Duration = Duration::from_millis(50);

/// How long a writer waits for the cache to show a committed write before it answers
/// without it (the write stands; only read-your-writes is late).
pub(super) const APPLY_WAIT: Duration = Duration::from_secs(10);

impl Backend {
    /// Commits `mutations` as one etcd transaction of their own (see the module doc):
    /// plans them again when a guard fails, and reads back an unknown outcome.
    pub(super) async fn commit_alone(&self, mutations: Vec<Mutation>) -> Result<Vec<Outcome>> {
        let fence = self.fence.lock().unwrap_or_else(PoisonError::into_inner).clone();
        // Values a failed guard read back, newer than the cache until it catches up:
        // the next attempt plans on them at once instead of waiting for the feed.
        let mut fresh: HashMap<Vec<u8>, Option<Obj>> = HashMap::new();
        let mut fresh_at = 0;
        let started = std::time::Instant::now();
        for attempt in 0u32.. {
            if attempt > 1 {
                // Contended: a pause of random length, growing, lets the writers that
                // keep colliding come apart.
                if started.elapsed() > CONTENDED_FOR {
                    break;
                }
                let cap = MAX_PAUSE.min(Duration::from_micros(500u64 << attempt.min(10)));
                let spread = u64::try_from(cap.as_micros()).unwrap_or(u64::MAX).max(1);
                let jitter = uuid::Uuid::new_v4().as_u64_pair().0 % spread;
                tokio::time::sleep(Duration::from_micros(jitter)).await;
            }
            let (reads, planned) = {
                let state = self.shared.read();
                if state.closed {
                    return Err(Error::Closed);
                }
                let now = self.shared.config.clock.now();
                let use_fresh = state.revision < fresh_at;
                let lookup = |kind: &str, name: &str| match fresh.get(&self.keys.object(kind, name)) {
                    Some(object) if use_fresh => object.clone(),
                    _ => state.get(kind, name),
                };
                self.prepare(&lookup, mutations.clone(), state.revision + 1, now)
            };
            let (outcomes, ops) = match planned {
                Ok(planned) if !planned.ops.is_empty() => (planned.outcomes, planned.ops),
                // Nothing to write: an unchanged update, true only if the cache was
                // current for these keys.
                Ok(planned) => {
                    if self.confirm(&reads).await? {
                        return Ok(planned.outcomes);
                    }
                    continue;
                }
                Err(error) => {
                    // Found in the cache: true only if the cache was current for these keys.
                    if self.confirm(&reads).await? {
                        return Err(error);
                    }
                    continue;
                }
            };
            let mut compares: Vec<Compare> =
                reads.iter().map(|(key, revision)| Compare::ModRevision(key.clone(), *revision)).collect();
            if let Some(fence) = &fence {
                compares.push(fence.compare());
            }
            if compares.len() > MAX_TXN_OPS || ops.len() > MAX_TXN_OPS {
                return Err(Error::TooLarge {
                    message: format!(
                        "one write of {} objects is over etcd's {MAX_TXN_OPS} operations a transaction",
                        ops.len()
                    ),
                });
            }
            let mut failure: Vec<Op> = reads.iter().map(|(key, _)| Op::Get { key: key.clone() }).collect();
            failure.extend(fence.as_ref().map(|f| Op::Get { key: f.key.clone() }));
            let answer = match self.etcd.txn(&compares, &ops, &failure).await {
                Ok(answer) => answer,
                Err(e @ ClientError::Indeterminate { .. }) => match self.resolve(&reads, &ops, &e).await? {
                    Some(revision) => return Ok(self.answered(outcomes, revision).await),
                    None => continue,
                },
                Err(e) if e.is_too_large() => return Err(Error::TooLarge { message: e.to_string() }),
                Err(e) => return Err(unavailable(&e)),
            };
            if answer.succeeded {
                return Ok(self.answered(outcomes, answer.revision).await);
            }
            let mut gets = answer.gets.into_iter();
            // A guard failed: someone wrote one of these keys since the cache saw it.
            for ((key, _), current) in reads.iter().zip(gets.by_ref()) {
                let object = match current {
                    Some(kv) => Some(decode(&kv.value, kv.mod_revision).map_err(|e| Error::Unavailable {
                        message: format!(
                            "etcd holds a value that is not JSON at {}: {e}",
                            String::from_utf8_lossy(key)
                        ),
                    })?),
                    None => None,
                };
                fresh.insert(key.clone(), object);
            }
            fresh_at = answer.revision;
            if let Some(fence) = &fence {
                if !fence.holds(gets.next().flatten().as_ref()) {
                    return Err(Error::NotLeader { message: fence.lost() });
                }
            }
        }
        Err(Error::Unavailable {
            message: format!("other writers kept changing these objects for {CONTENDED_FOR:?}; retry"),
        })
    }

    /// Outcomes of a write committed at `revision`, once the cache shows it.
    pub(super) async fn answered(&self, outcomes: Vec<Outcome>, revision: u64) -> Vec<Outcome> {
        if !self.catch_up(revision).await {
            tracing::warn!(
                revision,
                "etcd committed a write the cache has not seen yet; answering without it"
            );
        }
        outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Outcome::Created(o) => Outcome::Created(restamp(&o, revision)),
                Outcome::Updated(o) => Outcome::Updated(restamp(&o, revision)),
                Outcome::Deleting(o) => Outcome::Deleting(restamp(&o, revision)),
                Outcome::Deleted(o) => Outcome::Deleted(restamp(&o, revision)),
                unchanged @ Outcome::Unchanged(_) => unchanged,
            })
            .collect()
    }

    /// Waits until the cache has applied `revision`; false after `APPLY_WAIT`.
    pub(super) async fn catch_up(&self, revision: u64) -> bool {
        let mut applied = self.shared.revision.subscribe();
        let reached = async move { applied.wait_for(|current| *current >= revision).await.is_ok() };
        matches!(tokio::time::timeout(APPLY_WAIT, reached).await, Ok(true))
    }

    /// Whether the cache had each of `reads` at its current revision in etcd; when not,
    /// waits for the cache to catch up before saying so.
    pub(super) async fn confirm(&self, reads: &[(Vec<u8>, u64)]) -> Result<bool> {
        let (revision, current) = self.read_back(reads.iter().map(|(k, _)| k.clone()).collect()).await?;
        let same = reads
            .iter()
            .zip(&current)
            .all(|((_, cached), now)| now.as_ref().map_or(0, |kv| kv.mod_revision) == *cached);
        if !same {
            self.catch_up(revision).await;
        }
        Ok(same)
    }

    /// The current values of `keys` (a quorum read) and the revision they are at.
    pub(super) async fn read_back(&self, keys: Vec<Vec<u8>>) -> Result<(u64, Vec<Option<KeyValue>>)> {
        let mut values = Vec::with_capacity(keys.len());
        let mut revision = 0;
        // No keys: one empty transaction, for the current revision alone.
        let chunks: Vec<&[Vec<u8>]> =
            if keys.is_empty() { vec![&[]] } else { keys.chunks(MAX_TXN_OPS).collect() };
        for chunk in chunks {
            let gets: Vec<Op> = chunk.iter().map(|key| Op::Get { key: key.clone() }).collect();
            let answer = self.etcd.txn(&[], &gets, &[]).await.map_err(|e| unavailable(&e))?;
            revision = revision.max(answer.revision);
            values.extend(answer.gets);
        }
        Ok((revision, values))
    }

    /// Finds out whether a transaction that timed out was applied: `Some(revision)` when
    /// every key holds what it wrote, `None` when every key is as it was read (it was
    /// not applied: the caller tries again). Anything else — another writer was faster,
    /// or etcd cannot be read — leaves the outcome unknown, which is an error.
    pub(super) async fn resolve(
        &self,
        reads: &[(Vec<u8>, u64)],
        ops: &[Op],
        cause: &ClientError,
    ) -> Result<Option<u64>> {
        let keys: Vec<Vec<u8>> = ops
            .iter()
            .map(|op| match op {
                Op::Put { key, .. }
                | Op::Delete { key }
                | Op::Get { key }
                | Op::DeleteRange { from: key, .. } => key.clone(),
            })
            .collect();
        let unknown = |why: String| Error::Unavailable {
            message: format!(
                "etcd may or may not have applied the write ({cause}); {why}: read the object and retry"
            ),
        };
        let mut tries = 0;
        let (_, now) = loop {
            match self.read_back(keys.clone()).await {
                Ok(read) => break read,
                Err(e) if tries < 3 => {
                    tries += 1;
                    tracing::warn!(error = %e, "reading back a write whose outcome is unknown");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(unknown(e.to_string())),
            }
        };
        let read_of = |key: &[u8]| reads.iter().find(|(k, _)| k.as_slice() == key).map_or(0, |(_, r)| *r);
        let (mut untouched, mut ours, mut revision) = (true, true, 0);
        for (op, current) in ops.iter().zip(&now) {
            let now_at = current.as_ref().map_or(0, |kv| kv.mod_revision);
            match (op, current) {
                (Op::Put { key, value, .. }, Some(kv)) => {
                    ours &= kv.value == *value && kv.mod_revision > read_of(key);
                    untouched &= now_at == read_of(key);
                    revision = revision.max(kv.mod_revision);
                }
                (Op::Delete { key }, None) => untouched &= read_of(key) == 0,
                (
                    Op::Put { key, .. }
                    | Op::Delete { key }
                    | Op::Get { key }
                    | Op::DeleteRange { from: key, .. },
                    _,
                ) => {
                    ours = false;
                    untouched &= now_at == read_of(key);
                }
            }
        }
        if untouched {
            return Ok(None);
        }
        if !ours {
            return Err(unknown("another writer changed the same objects since".into()));
        }
        if revision == 0 {
            // Deletes alone leave no revision to read: any revision since is past them.
            revision =
                self.read_back(Vec::new()).await.map_or(0, |(r, _)| r).max(self.shared.read().revision);
        }
        Ok(Some(revision))
    }
}
