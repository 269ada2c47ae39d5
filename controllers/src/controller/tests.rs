//! Controller tests: a [`FakeClient`] feeds a real controller whose reconcile records each
//! run (name, spec seen, time) through a [`Harness`] context.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::*;
use crate::testing::{widget, FakeClient, Widget};

/// One reconcile run as the harness saw it start.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Run {
    name: String,
    /// The spec of the object handed in; `None` for [`Target::Absent`].
    spec: Option<u32>,
    /// Seconds of (paused) time since the harness was made.
    at: u64,
}

fn run(name: &str, spec: Option<u32>, at: u64) -> Run {
    Run { name: name.to_string(), spec, at }
}

#[derive(Debug)]
struct Failed;

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("scripted failure")
    }
}

/// The reconcile context of the tests.
struct Harness {
    start: Instant,
    runs: mpsc::UnboundedSender<Run>,
    in_flight: Mutex<HashSet<String>>,
    max_in_flight: AtomicUsize,
    /// Set if one name was ever reconciled twice at once.
    overlapped: AtomicBool,
    /// While set, the next run to start waits for a permit of `gate`.
    hold_next: AtomicBool,
    gate: Semaphore,
    /// How many of the next runs fail.
    failures_left: AtomicUsize,
}

impl Harness {
    fn new() -> (Arc<Harness>, mpsc::UnboundedReceiver<Run>) {
        let (runs, received) = mpsc::unbounded_channel();
        let harness = Harness {
            start: Instant::now(),
            runs,
            in_flight: Mutex::default(),
            max_in_flight: AtomicUsize::new(0),
            overlapped: AtomicBool::new(false),
            hold_next: AtomicBool::new(false),
            gate: Semaphore::new(0),
            failures_left: AtomicUsize::new(0),
        };
        (Arc::new(harness), received)
    }

    /// Records the start of a run; the run lasts until the returned guard drops.
    fn enter(self: &Arc<Self>, target: &Target<Widget>) -> Entered {
        let name = target.name().to_string();
        let mut in_flight = self.in_flight.lock().unwrap();
        if !in_flight.insert(name.clone()) {
            self.overlapped.store(true, Ordering::SeqCst);
        }
        self.max_in_flight.fetch_max(in_flight.len(), Ordering::SeqCst);
        let at = (Instant::now() - self.start).as_secs();
        let spec = target.object().map(|w| w.spec);
        self.runs.send(Run { name: name.clone(), spec, at }).unwrap();
        Entered { harness: self.clone(), name }
    }

    /// Waits for a gate permit if this run was told to hold.
    async fn hold_if_asked(&self) {
        if self.hold_next.swap(false, Ordering::SeqCst) {
            self.gate.acquire().await.unwrap().forget();
        }
    }

    fn should_fail(&self) -> bool {
        self.failures_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

struct Entered {
    harness: Arc<Harness>,
    name: String,
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.harness.in_flight.lock().unwrap().remove(&self.name);
    }
}

/// A boxed reconcile future, as the tests' shared reconcile returns.
type Reconciling = std::pin::Pin<Box<dyn Future<Output = Result<Action, Failed>> + Send>>;

/// The common reconcile: record, maybe hold, maybe fail, else return `action`.
fn reconcile_with(action: Action) -> impl Fn(Target<Widget>, Arc<Harness>) -> Reconciling + Send + Sync {
    move |target, harness| {
        Box::pin(async move {
            let _entered = harness.enter(&target);
            harness.hold_if_asked().await;
            if harness.should_fail() {
                return Err(Failed);
            }
            Ok(action)
        })
    }
}

struct Running {
    handle: JoinHandle<()>,
    stop: oneshot::Sender<()>,
}

fn config(concurrency: usize) -> Config {
    Config {
        concurrency,
        backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
        watcher: watcher::Config { backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(1)) },
    }
}

fn start<R, F>(
    client: &FakeClient<Widget>,
    concurrency: usize,
    harness: &Arc<Harness>,
    reconcile: R,
) -> Running
where
    R: Fn(Target<Widget>, Arc<Harness>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Action, Failed>> + Send + 'static,
{
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = Controller::new(client.clone(), config(concurrency));
    let error_policy = |_: &Target<Widget>, _: &Failed, _: &Harness| Action::backoff();
    let shutdown = async {
        let _ = stopped.await;
    };
    let handle = tokio::spawn(controller.run(reconcile, error_policy, harness.clone(), shutdown));
    Running { handle, stop }
}

async fn recv(runs: &mut mpsc::UnboundedReceiver<Run>) -> Run {
    tokio::time::timeout(Duration::from_secs(3600), runs.recv())
        .await
        .expect("no run within an hour")
        .expect("controller gone")
}

/// The next `n` runs, sorted (their order among concurrent workers is not fixed).
async fn recv_sorted(runs: &mut mpsc::UnboundedReceiver<Run>, n: usize) -> Vec<Run> {
    let mut got = Vec::new();
    for _ in 0..n {
        got.push(recv(runs).await);
    }
    got.sort();
    got
}

async fn quiet(runs: &mut mpsc::UnboundedReceiver<Run>) {
    if let Ok(run) = tokio::time::timeout(Duration::from_secs(3600), runs.recv()).await {
        panic!("unexpected run {run:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn reconciles_each_changed_object_on_its_latest_state() {
    let client = FakeClient::new();
    client.put(widget("a", 1));
    client.put(widget("b", 1));
    let (harness, mut runs) = Harness::new();
    let running = start(&client, 2, &harness, reconcile_with(Action::await_change()));

    assert_eq!(recv_sorted(&mut runs, 2).await, [run("a", Some(1), 0), run("b", Some(1), 0)]);
    quiet(&mut runs).await;

    client.put(widget("a", 2));
    assert_eq!(recv(&mut runs).await, run("a", Some(2), 3600));
    client.remove("b");
    assert_eq!(recv(&mut runs).await, run("b", None, 3600));
    quiet(&mut runs).await;

    running.stop.send(()).unwrap();
    running.handle.await.unwrap();
    assert!(!harness.overlapped.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn a_name_changed_during_its_reconcile_runs_again_after_and_never_concurrently() {
    let client = FakeClient::new();
    client.put(widget("a", 1));
    let (harness, mut runs) = Harness::new();
    harness.hold_next.store(true, Ordering::SeqCst);
    let _running = start(&client, 4, &harness, reconcile_with(Action::await_change()));
    assert_eq!(recv(&mut runs).await, run("a", Some(1), 0));

    // a changes twice while its first run is held; b is free to run on another worker.
    client.put(widget("a", 2));
    client.put(widget("a", 3));
    client.put(widget("b", 1));
    assert_eq!(recv(&mut runs).await, run("b", Some(1), 0));
    quiet(&mut runs).await;

    // Released, a runs once more, on its latest state.
    harness.gate.add_permits(1);
    assert_eq!(recv(&mut runs).await, run("a", Some(3), 3600));
    quiet(&mut runs).await;
    assert!(!harness.overlapped.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn errors_back_off_exponentially_and_success_resets_the_backoff() {
    let client = FakeClient::new();
    client.put(widget("a", 1));
    let (harness, mut runs) = Harness::new();
    harness.failures_left.store(3, Ordering::SeqCst);
    let _running = start(&client, 1, &harness, reconcile_with(Action::await_change()));

    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(recv(&mut runs).await.at);
    }
    assert_eq!(seen, [0, 1, 3, 7], "three failures, retried after 1 s, 2 s, 4 s");
    quiet(&mut runs).await;

    // The success forgot the backoff: a new failure is retried after 1 s again.
    harness.failures_left.store(1, Ordering::SeqCst);
    client.put(widget("a", 2));
    let failed = recv(&mut runs).await.at;
    assert_eq!(recv(&mut runs).await.at, failed + 1);
}

#[tokio::test(start_paused = true)]
async fn requeue_runs_again_after_the_delay_or_sooner_on_change() {
    let client = FakeClient::new();
    client.put(widget("a", 1));
    let (harness, mut runs) = Harness::new();
    let _running = start(&client, 1, &harness, reconcile_with(Action::requeue(Duration::from_secs(30))));

    assert_eq!(recv(&mut runs).await.at, 0);
    assert_eq!(recv(&mut runs).await.at, 30);
    tokio::time::sleep_until(harness.start + Duration::from_secs(40)).await;
    client.put(widget("a", 2));
    assert_eq!(recv(&mut runs).await, run("a", Some(2), 40));
    assert_eq!(recv(&mut runs).await.at, 70);
}

#[tokio::test(start_paused = true)]
async fn concurrency_is_bounded() {
    let client = FakeClient::new();
    for name in ["a", "b", "c", "d", "e"] {
        client.put(widget(name, 1));
    }
    let (harness, mut runs) = Harness::new();
    let slow = |target: Target<Widget>, harness: Arc<Harness>| async move {
        let _entered = harness.enter(&target);
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok::<_, Failed>(Action::await_change())
    };
    let _running = start(&client, 2, &harness, slow);

    let at: Vec<u64> = recv_sorted(&mut runs, 5).await.iter().map(|r| r.at).collect();
    assert_eq!(at, [0, 0, 10, 10, 20]);
    assert_eq!(harness.max_in_flight.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_runs_in_progress_and_starts_no_more() {
    let client = FakeClient::new();
    client.put(widget("a", 1));
    let (harness, mut runs) = Harness::new();
    harness.hold_next.store(true, Ordering::SeqCst);
    let running = start(&client, 2, &harness, reconcile_with(Action::requeue(Duration::from_secs(1))));
    recv(&mut runs).await;

    running.stop.send(()).unwrap();
    client.put(widget("b", 1));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!running.handle.is_finished(), "a's run is still in progress");

    harness.gate.add_permits(1);
    tokio::time::timeout(Duration::from_secs(1), running.handle).await.unwrap().unwrap();
    assert!(runs.try_recv().is_err(), "no run after shutdown (not even a's requeue, nor b)");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_reconcile_is_retried_with_backoff() {
    let client = FakeClient::new();
    client.put(widget("a", 1));
    let (harness, mut runs) = Harness::new();
    let panics = Arc::new(AtomicBool::new(true));
    let reconcile = move |target: Target<Widget>, harness: Arc<Harness>| {
        let panics = panics.clone();
        async move {
            let _entered = harness.enter(&target);
            if panics.swap(false, Ordering::SeqCst) {
                panic!("scripted panic");
            }
            Ok::<_, Failed>(Action::await_change())
        }
    };
    let _running = start(&client, 1, &harness, reconcile);
    assert_eq!(recv(&mut runs).await.at, 0);
    assert_eq!(recv(&mut runs).await.at, 1);
    quiet(&mut runs).await;
}

#[tokio::test(start_paused = true)]
async fn a_deletion_missed_while_disconnected_is_reconciled_after_the_relist() {
    let client = FakeClient::new();
    client.put(widget("a", 1));
    client.put(widget("b", 1));
    let (harness, mut runs) = Harness::new();
    let _running = start(&client, 1, &harness, reconcile_with(Action::await_change()));
    recv_sorted(&mut runs, 2).await;

    client.end_watches();
    client.remove("b");
    client.compact();
    let after_relist = recv_sorted(&mut runs, 2).await;
    let seen: Vec<(&str, Option<u32>)> = after_relist.iter().map(|r| (r.name.as_str(), r.spec)).collect();
    assert_eq!(seen, [("a", Some(1)), ("b", None)]);
    quiet(&mut runs).await;
}
