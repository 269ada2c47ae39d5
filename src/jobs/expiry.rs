//! Jobs that age out: a terminal Job is deleted `spec.ttlSecondsAfterFinished` seconds
//! after it finished (`status.finishedAt`), or, with no TTL of its own, once it is older
//! than the daemon's `--job-history-max-age` ([`Job::expires_at`] is the rule). This is
//! besides the scheduler's bound of the 5 most recent terminal Jobs per template
//! (`scheduler/history.rs`), never instead of it: a Job goes at whichever comes first.
//!
//! One task ([`spawn`]) watches the Jobs and keeps when each terminal one expires,
//! earliest first ([`Schedule`]). It sleeps until the earliest, deletes at most [`BATCH`]
//! Jobs that are due, each by a delete conditional on the uid and resourceVersion it
//! judged (a Job changed or written again under its name meanwhile is judged again, never
//! deleted on the old judgement), and sleeps again. The deletes are ordinary store
//! deletes: every watcher of Jobs sees `DELETED`.
//!
//! Expiry is computed from the stored finish time on the store's clock, never from when
//! this task first saw the Job: a restarted daemon picks up where the last run left off
//! (a Job that expired while no daemon ran goes at once), and a test moves time by moving
//! the store's clock.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt as _;
use hive_api::job::Job;
use hive_api::ObjectMeta;
use hive_controllers::Event;

use crate::client::Api;
use crate::store::Store;

/// Deletes at most this many Jobs per wake, so a backlog (a max age turned on over a
/// long history) is worked off in bounded steps between the watch's events. The deletes
/// of one wake are committed together, as one group.
pub const BATCH: usize = 128;

/// The longest the task sleeps before it looks at the clock again. The store's clock is
/// the wall clock, and tokio's timers run on a monotonic one: after a suspended host or
/// an NTP step the two disagree, and a Job expires at most this late.
const RECHECK: Duration = Duration::from_secs(60);

/// How long a Job whose delete failed (the store refused the write) waits to be tried
/// again.
const RETRY: Duration = Duration::from_secs(5);

/// Starts the task that deletes terminal Jobs of `store` as they expire, `max_age` (the
/// daemon's `--job-history-max-age`) after they finished for Jobs without a TTL of their
/// own (`None`: those are kept). It runs until the runtime ends.
pub fn spawn(store: Store, max_age: Option<Duration>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(store, max_age))
}

async fn run(store: Store, max_age: Option<Duration>) {
    let jobs = Api::<Job>::new(&store);
    let mut events = std::pin::pin!(hive_controllers::watcher(Api::<Job>::new(&store), Default::default()));
    let mut schedule = Schedule::new(max_age);
    loop {
        let wake = schedule.next().map(|at| (at - store.now()).to_std().unwrap_or_default().min(RECHECK));
        tokio::select! {
            item = events.next() => match item {
                Some(Ok(event)) => schedule.apply(event),
                Some(Err(err)) => tracing::debug!(error = %err, "the Job expiry's watch retries"),
                None => return,
            },
            () = sleep(wake) => {
                let now = store.now();
                let due = schedule.take_due(now, BATCH);
                if !due.is_empty() {
                    delete(&jobs, &mut schedule, due, now).await;
                }
            }
        }
    }
}

/// Deletes the `due` Jobs, together; one whose delete failed is tried again later.
async fn delete(
    jobs: &Api<Job>,
    schedule: &mut Schedule,
    due: Vec<(DateTime<Utc>, ObjectMeta)>,
    now: DateTime<Utc>,
) {
    let deletes = due.iter().map(|(_, meta)| jobs.delete_exact(meta));
    let results = futures_util::future::join_all(deletes).await;
    let mut deleted = 0;
    for ((at, meta), result) in due.into_iter().zip(results) {
        match result {
            Ok(true) => {
                deleted += 1;
                tracing::debug!(job = meta.name, expired = %at, "deleted a finished Job past its time to live");
            }
            // Gone or changed since it was judged: the watch brings what it is now.
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(job = meta.name, error = %err, "could not delete an expired Job; trying again");
                let later = now + chrono::Duration::from_std(RETRY).unwrap_or_default();
                schedule.insert(later, meta);
            }
        }
    }
    if deleted > 0 {
        tracing::info!(deleted, "deleted finished Jobs past their time to live");
    }
}

/// Sleeps for `wake`, or forever without one.
async fn sleep(wake: Option<Duration>) {
    match wake {
        Some(wake) => tokio::time::sleep(wake).await,
        None => std::future::pending().await,
    }
}

/// The terminal Jobs that expire, by when, earliest first; each Job once, as it was last
/// seen (name, uid and resourceVersion: what its delete is conditional on).
#[derive(Debug)]
pub struct Schedule {
    max_age: Option<Duration>,
    order: BTreeSet<(DateTime<Utc>, String)>,
    jobs: HashMap<String, (DateTime<Utc>, ObjectMeta)>,
}

impl Schedule {
    /// An empty schedule; Jobs without a TTL of their own expire `max_age` after they
    /// finished (`None`: never).
    pub fn new(max_age: Option<Duration>) -> Schedule {
        Schedule { max_age, order: BTreeSet::new(), jobs: HashMap::new() }
    }

    /// Takes one event of the Jobs' watch: a relist replaces everything.
    pub fn apply(&mut self, event: Event<Job>) {
        match event {
            Event::Applied(job) => self.observe(&job),
            Event::Deleted(job) => self.forget(&job.metadata.name),
            Event::Restarted(jobs) => {
                self.order.clear();
                self.jobs.clear();
                jobs.iter().for_each(|job| self.observe(job));
            }
        }
    }

    /// Judges `job` as it is now: scheduled if it will expire, else forgotten.
    pub fn observe(&mut self, job: &Job) {
        match job.expires_at(self.max_age) {
            Some(at) => {
                let meta = ObjectMeta {
                    name: job.metadata.name.clone(),
                    uid: job.metadata.uid.clone(),
                    resource_version: job.metadata.resource_version.clone(),
                    ..Default::default()
                };
                self.insert(at.0, meta);
            }
            None => self.forget(&job.metadata.name),
        }
    }

    fn insert(&mut self, at: DateTime<Utc>, meta: ObjectMeta) {
        self.forget(&meta.name);
        self.order.insert((at, meta.name.clone()));
        self.jobs.insert(meta.name.clone(), (at, meta));
    }

    /// Drops Job `name` from the schedule.
    pub fn forget(&mut self, name: &str) {
        if let Some((at, _)) = self.jobs.remove(name) {
            self.order.remove(&(at, name.to_string()));
        }
    }

    /// When the earliest Job expires.
    pub fn next(&self) -> Option<DateTime<Utc>> {
        self.order.first().map(|(at, _)| *at)
    }

    /// Takes at most `limit` Jobs that expired by `now`, earliest first, each with when it
    /// expired.
    pub fn take_due(&mut self, now: DateTime<Utc>, limit: usize) -> Vec<(DateTime<Utc>, ObjectMeta)> {
        let mut due = Vec::new();
        while due.len() < limit {
            let Some((at, _)) = self.order.first().filter(|(at, _)| *at <= now) else { break };
            let at = *at;
            let Some((_, name)) = self.order.pop_first() else { break };
            if let Some((_, meta)) = self.jobs.remove(&name) {
                due.push((at, meta));
            }
        }
        due
    }

    /// How many Jobs are scheduled to expire.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether no Job is scheduled to expire.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

#[cfg(test)]
mod tests;
