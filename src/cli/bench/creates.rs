//! The create phases: N clients, each on its own connection, POST Agents for a while or
//! until a count is reached; only `201 Created` counts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use bytes::Bytes;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::api::{agent, snippet, Api, Endpoint, REQUEST_TIMEOUT};
use super::daemon::Daemon;
use super::meters::CpuMeter;
use super::progress;
use super::report::Row;
use super::units::fmt_count;

/// When a create run stops.
#[derive(Clone)]
pub(super) enum Until {
    /// Each client creates until this long has passed.
    Elapsed(Duration),
    /// Clients take numbers from `next` until `total` are taken.
    Count { next: Arc<AtomicUsize>, total: usize },
}

/// What a create run did.
pub(super) struct CreateRun {
    pub(super) clients: usize,
    pub(super) created: usize,
    pub(super) failed: usize,
    pub(super) first_failure: Option<String>,
    pub(super) elapsed: Duration,
    pub(super) latencies: Vec<Duration>,
}

impl CreateRun {
    /// Nothing done yet, by `clients` clients.
    pub(super) fn new(clients: usize) -> CreateRun {
        CreateRun {
            clients,
            created: 0,
            failed: 0,
            first_failure: None,
            elapsed: Duration::ZERO,
            latencies: Vec::new(),
        }
    }

    /// Counts one create that took `latency` and answered `outcome`; whether it was
    /// created (`201`).
    pub(super) fn record(&mut self, latency: Duration, outcome: Result<(u16, Bytes)>) -> bool {
        self.record_as(201, latency, outcome)
    }

    /// Counts one write that took `latency` and answered `outcome`; whether it answered
    /// `done`, the status of a write that took.
    pub(super) fn record_as(&mut self, done: u16, latency: Duration, outcome: Result<(u16, Bytes)>) -> bool {
        match outcome {
            Ok((code, _)) if code == done => {
                self.latencies.push(latency);
                self.created += 1;
                true
            }
            failure => {
                self.failed += 1;
                self.first_failure.get_or_insert_with(|| match failure {
                    Ok((code, body)) => format!("HTTP {code}: {}", snippet(&body)),
                    Err(e) => format!("{e:#}"),
                });
                false
            }
        }
    }

    /// Adds what another client's run did (its clients are already counted).
    pub(super) fn merge(&mut self, run: CreateRun) {
        self.created += run.created;
        self.failed += run.failed;
        self.first_failure = self.first_failure.take().or(run.first_failure);
        self.latencies.extend(run.latencies);
    }

    pub(super) fn rate(&self) -> f64 {
        self.created as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub(super) fn row(&self, measurement: String, aim: String) -> Row {
        let mut result = format!(
            "{}/s ({} in {:.1}s)",
            fmt_count(self.rate() as u64),
            fmt_count(self.created as u64),
            self.elapsed.as_secs_f64()
        );
        if self.failed > 0 {
            result +=
                &format!("; {} failed, first: {}", self.failed, self.first_failure.as_deref().unwrap_or("?"));
        }
        Row::new(measurement, result, Some(self.latencies.as_slice()), aim)
    }
}

/// `clients` tasks, each with its own client, POST Agents until `until`; only 201s
/// count as created. With `warm_up`, each first creates one Agent outside the clock, so
/// connection setup is not measured.
pub(super) async fn create_with(
    endpoint: &Endpoint,
    clients: usize,
    until: Until,
    prefix: &str,
    warm_up: bool,
) -> Result<CreateRun> {
    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut tasks = JoinSet::new();
    for client in 0..clients {
        let api = endpoint.api(Some(REQUEST_TIMEOUT))?;
        let (barrier, until, prefix) = (barrier.clone(), until.clone(), prefix.to_string());
        tasks.spawn(async move {
            let warmed = if warm_up { warm(&api, &format!("{prefix}-w{client}")).await } else { Ok(()) };
            barrier.wait().await;
            warmed?;
            let started = Instant::now();
            let mut run = CreateRun::new(1);
            for seq in 0.. {
                let name = match &until {
                    Until::Elapsed(d) if started.elapsed() >= *d => break,
                    Until::Elapsed(_) => format!("{prefix}-{client}-{seq}"),
                    Until::Count { next, total } => match next.fetch_add(1, Ordering::Relaxed) {
                        i if i >= *total => break,
                        i => format!("{prefix}-{i}"),
                    },
                };
                let sent = Instant::now();
                let outcome = api.create(agent(&name, None)).await;
                run.record(sent.elapsed(), outcome);
            }
            anyhow::Ok(run)
        });
    }
    gather(&barrier, tasks, clients, "create").await
}

/// Starts the clock once every one of the `clients` tasks has passed `barrier` (their
/// warm-up done), then adds up what each did; fails when a task panicked or failed, or
/// when every one of its writes (`what`) did.
pub(super) async fn gather(
    barrier: &Barrier,
    mut tasks: JoinSet<Result<CreateRun>>,
    clients: usize,
    what: &str,
) -> Result<CreateRun> {
    barrier.wait().await;
    let started = Instant::now();
    let mut total = CreateRun::new(clients);
    while let Some(joined) = tasks.join_next().await {
        total.merge(joined.with_context(|| format!("a {what} client panicked"))??);
    }
    total.elapsed = started.elapsed();
    ensure!(
        total.created > 0 || total.failed == 0,
        "every {what} failed; first: {}",
        total.first_failure.unwrap_or_default()
    );
    Ok(total)
}

pub(super) async fn warm(api: &Api, name: &str) -> Result<()> {
    match api.create(agent(name, None)).await.context("warm-up create")? {
        (201, _) => Ok(()),
        (code, body) => bail!("warm-up create of {name}: HTTP {code}: {}", snippet(&body)),
    }
}
/// Durable creates at each `--clients` level.
pub(super) async fn levels(daemon: &Daemon, levels: &[usize], duration: Duration) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &clients in levels {
        progress(format_args!("creates c={clients} for {:?}", duration));
        let until = Until::Elapsed(duration);
        let meter = CpuMeter::start(daemon.pid);
        let run = create_with(&daemon.endpoint, clients, until, &format!("c{clients}"), true).await?;
        // Issue 13's goal is relative: etcd's puts/s on the same machine, in the same run.
        let aim = (run.clients == 64).then(|| "≥ etcd's puts/s (bench/etcd/run.sh)".to_string());
        let measurement = format!("durable creates, {} client(s)", run.clients);
        rows.push(run.row(measurement, aim.unwrap_or_default()).with_cpu(meter.stop()));
    }
    Ok(rows)
}
