use std::time::Duration;

use chrono::{DateTime, Utc};
use hive_api::job::{JobNode, JobNodeKind, JobPhase, JobSpec, JobTemplate};
use hive_api::Time;

use super::*;
use crate::host::Clock;
use crate::store::{EventType, StoreConfig};

const HOUR: Duration = Duration::from_secs(3600);

fn base() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().with_timezone(&Utc)
}

fn secs(seconds: i64) -> chrono::Duration {
    chrono::Duration::seconds(seconds)
}

fn job(name: &str, ttl: Option<i64>) -> Job {
    let nodes = vec![JobNode::new("r", JobNodeKind::Reconcile, Some("a"))];
    Job::new(
        name,
        JobSpec {
            template: JobTemplate::Reconcile,
            nodes,
            ttl_seconds_after_finished: ttl,
            ..Default::default()
        },
    )
}

/// `job` as stored: a uid and a resourceVersion, settled `phase` at `finished`.
fn stored(name: &str, ttl: Option<i64>, rv: u64, finished: Option<DateTime<Utc>>) -> Job {
    let mut job = job(name, ttl);
    job.metadata.uid = Some(format!("uid-{name}"));
    job.metadata.resource_version = Some(rv.to_string());
    job.status.phase = Some(if finished.is_some() { JobPhase::Done } else { JobPhase::Running });
    job.status.finished_at = finished.map(Time);
    job
}

fn names(due: &[(DateTime<Utc>, ObjectMeta)]) -> Vec<(&str, &str)> {
    due.iter().map(|(_, m)| (m.name.as_str(), m.resource_version.as_deref().unwrap_or(""))).collect()
}

#[test]
fn the_schedule_hands_out_what_is_due_earliest_first_a_batch_at_a_time() {
    let t0 = base();
    let mut schedule = Schedule::new(Some(HOUR));
    schedule.apply(Event::Restarted(vec![
        stored("late", Some(600), 1, Some(t0)),
        stored("soon", Some(10), 2, Some(t0)),
        stored("aged", None, 3, Some(t0)),
        stored("running", Some(0), 4, None),
        stored("sooner", Some(5), 5, Some(t0)),
    ]));
    assert_eq!(schedule.len(), 4, "the running Job is not scheduled");
    assert_eq!(schedule.next(), Some(t0 + secs(5)));
    assert!(schedule.take_due(t0 + secs(4), BATCH).is_empty(), "nothing before its time");
    // Earliest first, at most `limit` a time.
    let due = schedule.take_due(t0 + secs(700), 2);
    assert_eq!(names(&due), [("sooner", "5"), ("soon", "2")]);
    assert_eq!(due[0].0, t0 + secs(5), "with when it expired");
    // A change is judged again: a new version, a later TTL, or not terminal any more.
    schedule.apply(Event::Applied(stored("late", Some(600), 9, Some(t0))));
    schedule.apply(Event::Applied(stored("aged", Some(7200), 10, Some(t0))));
    assert_eq!(names(&schedule.take_due(t0 + secs(3600), BATCH)), [("late", "9")]);
    schedule.apply(Event::Applied(stored("aged", None, 11, None)));
    assert!(schedule.is_empty(), "a Job that is not terminal is never scheduled");
    // A deleted Job is forgotten; a relist replaces what was held.
    schedule.apply(Event::Applied(stored("gone", Some(0), 12, Some(t0))));
    schedule.apply(Event::Deleted(stored("gone", Some(0), 12, Some(t0))));
    assert!(schedule.is_empty());
    schedule.apply(Event::Applied(stored("old", Some(0), 13, Some(t0))));
    schedule.apply(Event::Restarted(vec![stored("new", Some(0), 14, Some(t0))]));
    assert_eq!(names(&schedule.take_due(t0, BATCH)), [("new", "14")]);
}

/// A store clock that follows tokio's (paused) clock from `base()`, on any thread (the
/// store's commit thread stamps objects with it too): time moves for the store and the
/// task's timers alike, whether a test advances it or the paused runtime does when idle.
fn tokio_clock() -> Clock {
    let runtime = tokio::runtime::Handle::current();
    let start = tokio::time::Instant::now();
    Clock::from_fn(move || {
        let _in = runtime.enter();
        base() + chrono::Duration::from_std(start.elapsed()).unwrap()
    })
}

fn open(dir: &std::path::Path) -> Store {
    Store::open(StoreConfig { clock: tokio_clock(), ..StoreConfig::new(dir.join("hive.redb")) }).unwrap()
}

/// Stores Job `name` with `ttl`, settled as `phase` now (`None`: left running).
async fn put(store: &Store, name: &str, ttl: Option<i64>, phase: Option<JobPhase>) {
    let jobs = Api::<Job>::new(store);
    jobs.create(&job(name, ttl)).await.unwrap();
    let now = Time(store.now());
    jobs.patch_status(name, |status| {
        status.phase = Some(phase.unwrap_or(JobPhase::Running));
        status.finished_at = phase.map(|_| now);
    })
    .await
    .unwrap();
}

/// The names of the next `n` Jobs the watch reports deleted, in order.
async fn deleted(watch: &mut crate::store::Watch, n: usize) -> Vec<String> {
    let mut names = Vec::new();
    while names.len() < n {
        let event = watch.next().await.unwrap().unwrap();
        if event.type_ == EventType::Deleted {
            names.push(event.object.value()["metadata"]["name"].as_str().unwrap().to_string());
        }
    }
    names
}

#[tokio::test(start_paused = true)]
async fn finished_jobs_are_deleted_as_they_expire_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut watch = store.watch("jobs", store.revision()).unwrap();
    put(&store, "running", Some(0), None).await;
    put(&store, "ttl-100", Some(100), Some(JobPhase::Done)).await;
    put(&store, "no-ttl", None, Some(JobPhase::Done)).await;
    put(&store, "ttl-5", Some(5), Some(JobPhase::Failed)).await;
    put(&store, "ttl-10", Some(10), Some(JobPhase::Cancelled)).await;
    put(&store, "ttl-0", Some(0), Some(JobPhase::Interrupted)).await;
    let finished = store.now();
    spawn(store.clone(), Some(Duration::from_secs(60)));

    // In the order they expire: their own TTL, else the max age of 60 s; a TTL of 100 s
    // outlives the max age. The watch sees each deleted.
    assert_eq!(deleted(&mut watch, 5).await, ["ttl-0", "ttl-5", "ttl-10", "no-ttl", "ttl-100"]);
    assert!(store.now() >= finished + secs(100), "not before its time: {}", store.now());
    // A Job that is not terminal stays, however long.
    tokio::time::advance(10 * HOUR).await;
    put(&store, "marker", Some(0), Some(JobPhase::Done)).await;
    assert_eq!(deleted(&mut watch, 1).await, ["marker"]);
    let running = Api::<Job>::new(&store).get("running").unwrap().expect("the running Job is kept");
    assert_eq!(running.status.phase, Some(JobPhase::Running));
    // Once it finishes it ages out like any other.
    Api::<Job>::new(&store)
        .patch_status("running", |s| {
            s.phase = Some(JobPhase::Done);
            s.finished_at = Some(Time(store.now()));
        })
        .await
        .unwrap();
    assert_eq!(deleted(&mut watch, 1).await, ["running"]);
}

/// The expiry counts from the finish time in the store, not from when a daemon first saw
/// the Job: a restart neither forgets a Job nor grants it a new lease of life.
#[tokio::test(start_paused = true)]
async fn a_restarted_daemon_expires_jobs_from_their_stored_finish_times() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    put(&store, "kept-an-hour", Some(3600), Some(JobPhase::Done)).await;
    tokio::time::advance(Duration::from_secs(3000)).await;
    // Finished 3000 s ago with no TTL, and the max age is 1000 s: expired while no daemon ran.
    put(&store, "overdue", None, Some(JobPhase::Done)).await;
    Api::<Job>::new(&store).patch_status("overdue", |s| s.finished_at = Some(Time(base()))).await.unwrap();
    let mut watch = store.watch("jobs", store.revision()).unwrap();

    let started = tokio::time::Instant::now();
    spawn(store.clone(), Some(Duration::from_secs(1000)));
    assert_eq!(deleted(&mut watch, 1).await, ["overdue"]);
    assert!(started.elapsed() < Duration::from_secs(600), "at once: {:?}", started.elapsed());
    // 600 s after the start, not the hour a timer begun at the start would wait.
    assert_eq!(deleted(&mut watch, 1).await, ["kept-an-hour"]);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(600) && waited < HOUR, "{waited:?}");
}
