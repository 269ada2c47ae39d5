//! Leader election on etcd, and the fence that makes a deposed leader's writes fail.
//!
//! Each replica holds a lease (a short TTL, renewed well before it ends) and campaigns
//! for one key, `<prefix>_leader`: a transaction puts it, bound to the lease, only if
//! it does not exist. The replica that put it leads; its epoch is the key's
//! `create_revision`, which no later leader can have. Every write of a leader carries
//! "the leader key was created at my epoch" in the same transaction ([`Fence`]), so once
//! its lease has ended (and etcd deleted the key) nothing it writes lands, even if it
//! was paused and does not know yet.
//!
//! A leader also stops itself: when no renewal was acknowledged for `renew_deadline`,
//! measured from when the last acknowledged one was sent, it gives up leadership before
//! etcd can have ended the lease (etcd only ever extends a lease, never shortens it).
//! Effects outside etcd (starting a process, a provider call) cannot be fenced; this is
//! what bounds them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::{Client, ClientError, Compare, KeyValue, Op};
use super::docs::Docs;

/// The proof of leadership a write carries: the leader key and the revision it was
/// created at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub key: Vec<u8>,
    pub epoch: u64,
}

impl Fence {
    /// The transaction guard: the leader key is still the one created at `epoch`.
    pub fn compare(&self) -> Compare {
        Compare::CreateRevision(self.key.clone(), self.epoch)
    }

    /// Whether `holder` (the leader key as read) is still this fence's.
    pub fn holds(&self, holder: Option<&KeyValue>) -> bool {
        holder.is_some_and(|kv| kv.create_revision == self.epoch)
    }

    /// What a fenced write that failed says.
    pub fn lost(&self) -> String {
        format!("this replica no longer leads (its leadership of epoch {} ended)", self.epoch)
    }
}

/// How an election runs.
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    /// The lease's TTL (etcd's minimum is 1.5× its election timeout).
    pub ttl: Duration,
    /// A leader with no acknowledged renewal for this long stops leading.
    pub renew_deadline: Duration,
    /// What the leader key holds: who leads (a replica name and its API URL).
    pub identity: String,
}

impl ElectionConfig {
    /// TTL 3 s, renew deadline 2 s: a failover within 5 s, as `deploy/ha.md` says.
    pub fn new(identity: impl Into<String>) -> ElectionConfig {
        ElectionConfig {
            ttl: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            identity: identity.into(),
        }
    }
}

/// What an election tells the replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// Someone else leads (their identity, if known), or nobody yet.
    Follower(Option<String>),
    /// This replica leads, under this fence.
    Leader(Fence),
}

/// One replica's campaign: call [`Election::run`] and follow the watch channel.
pub struct Election {
    etcd: Arc<Client>,
    key: Vec<u8>,
    config: ElectionConfig,
    state: tokio::sync::watch::Sender<Leadership>,
    /// The store's feed, which hears the leader key's delete when a lease ends: a
    /// follower campaigns then, not at its next poll.
    docs: Option<Arc<Docs>>,
}

impl Election {
    pub fn new(etcd: Arc<Client>, key: Vec<u8>, config: ElectionConfig) -> Election {
        let (state, _) = tokio::sync::watch::channel(Leadership::Follower(None));
        Election { etcd, key, config, state, docs: None }
    }

    /// The same election, woken by the store's feed (see [`super::Backend::election`]).
    pub(super) fn woken_by(mut self, docs: Arc<Docs>) -> Election {
        self.docs = Some(docs);
        self
    }

    /// Waits a quarter TTL while `holder` leads, or less: until the store's feed says
    /// the leader key is gone.
    async fn pause(&self, holder: Option<&KeyValue>) {
        let Some(docs) = &self.docs else {
            tokio::time::sleep(self.config.ttl / 4).await;
            return;
        };
        // Followed first, so the feed keeps what it is told of the holder from now on.
        let followed = docs.follow(&self.key);
        if let Some(kv) = holder {
            docs.saw(&self.key, Some(&kv.value), kv.mod_revision);
        }
        let mut changes = followed.subscribe();
        let gone = async {
            while changes.changed().await.is_ok() {
                if changes.borrow_and_update().is_none() {
                    return;
                }
            }
            std::future::pending::<()>().await;
        };
        let _ = tokio::time::timeout(self.config.ttl / 4, gone).await;
    }

    /// Follows leadership changes.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Leadership> {
        self.state.subscribe()
    }

    /// Campaigns until `stop` is set, leads while it can, and resigns (revokes the lease)
    /// when stopped while leading, so the next leader need not wait for the TTL.
    pub async fn run(&self, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                return;
            }
            let lease = tokio::select! {
                lease = self.campaign() => lease,
                _ = stop.changed() => return,
            };
            match lease {
                Ok(Some((lease, fence, renewed_at))) => {
                    tracing::info!(epoch = fence.epoch, identity = %self.config.identity, "leading");
                    self.state.send_replace(Leadership::Leader(fence.clone()));
                    let stopped = self.lead(lease, renewed_at, &mut stop).await;
                    self.state.send_replace(Leadership::Follower(None));
                    if stopped {
                        let _ = self.etcd.revoke(lease).await;
                        return;
                    }
                    tracing::warn!(epoch = fence.epoch, "leadership lost");
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "campaign for leadership failed; retrying");
                    self.state.send_replace(Leadership::Follower(None));
                    tokio::select! {
                        _ = tokio::time::sleep(self.config.ttl / 4) => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
    }

    /// One try: a fresh lease, then the leader key if it is free. `None` when someone
    /// else leads (after waiting a quarter TTL, or until its key is deleted).
    async fn campaign(&self) -> Result<Option<(i64, Fence, Instant)>, ClientError> {
        // A read first: a lease is taken only when the key looks free.
        let current = self.etcd.range(&self.key, &[], 1, 0).await?;
        if let Some(kv) = current.kvs.first() {
            self.follow(Some(String::from_utf8_lossy(&kv.value).into_owned()));
            self.pause(Some(kv)).await;
            return Ok(None);
        }
        let sent = Instant::now();
        let (lease, _) = self.etcd.grant(self.config.ttl.as_secs().max(1)).await?;
        let put = Op::Put { key: self.key.clone(), value: self.config.identity.clone().into_bytes(), lease };
        let answer = self
            .etcd
            .txn(
                &[Compare::CreateRevision(self.key.clone(), 0)],
                &[put],
                &[Op::Get { key: self.key.clone() }],
            )
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                let _ = self.etcd.revoke(lease).await;
                return Err(e);
            }
        };
        if answer.succeeded {
            return Ok(Some((lease, Fence { key: self.key.clone(), epoch: answer.revision }, sent)));
        }
        let _ = self.etcd.revoke(lease).await;
        let holder = answer.gets.first().cloned().flatten();
        self.follow(holder.as_ref().map(|kv| String::from_utf8_lossy(&kv.value).into_owned()));
        self.pause(holder.as_ref()).await;
        Ok(None)
    }

    /// Records that `holder` leads (if it changed).
    fn follow(&self, holder: Option<String>) {
        self.state.send_if_modified(|state| {
            let new = Leadership::Follower(holder);
            let changed = *state != new;
            *state = new;
            changed
        });
    }

    /// Renews the lease every third of the renew deadline until a renewal fails for
    /// `renew_deadline` (false) or `stop` is set (true).
    async fn lead(
        &self,
        lease: i64,
        mut renewed_at: Instant,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        let every = self.config.renew_deadline / 3;
        loop {
            let deadline = renewed_at + self.config.renew_deadline;
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            tokio::select! {
                _ = tokio::time::sleep(every.min(deadline - now)) => {}
                _ = stop.changed() => return true,
            }
            let sent = Instant::now();
            let left = deadline.saturating_duration_since(sent);
            match tokio::time::timeout(left, self.etcd.keep_alive(lease)).await {
                Ok(Ok(ttl)) if ttl > 0 => renewed_at = sent,
                Ok(Ok(_)) => return false,
                Ok(Err(e)) => tracing::warn!(error = %e, "renewing the leader's lease failed"),
                Err(_) => tracing::warn!("renewing the leader's lease timed out"),
            }
        }
    }
}
