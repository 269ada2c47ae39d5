//! The watch phase's writer: creates `rate` Agents a second, each stamped with its load,
//! number and send time. Open-loop (the default) sends on a fixed schedule, each create
//! in its own task, as independent clients do, so a daemon that falls behind sees its
//! load keep coming; closed-loop (the old writer) waits for each answer before the next
//! tick, so a slow daemon quietly slows its own load down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::cli::bench::api::{agent, wall_ns, Api, Stamp};
use crate::cli::bench::creates::CreateRun;
use crate::cli::bench::report::Row;
use crate::cli::bench::units::fmt_count;

/// How the watch phase's writer paces its creates.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriterMode {
    /// A fixed schedule: each create is sent on its tick in its own task, whether or
    /// not earlier ones have been answered (up to `--watch-in-flight` at once).
    Open,
    /// One create at a time: the next tick waits for the previous answer.
    Closed,
}

impl WriterMode {
    pub(in crate::cli::bench) fn name(self) -> &'static str {
        match self {
            WriterMode::Open => "open",
            WriterMode::Closed => "closed",
        }
    }
}

/// The connections the watch phase's writer sends its creates over.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriterTransport {
    /// One HTTP/2 connection, each create a stream on it.
    Http2,
    /// HTTP/1.1, one connection per create in flight.
    Http1,
}

impl WriterTransport {
    pub(in crate::cli::bench) fn name(self) -> &'static str {
        match self {
            WriterTransport::Http2 => "http2",
            WriterTransport::Http1 => "http1",
        }
    }
}

/// What the writer asked for and did.
pub(in crate::cli::bench) struct Writes {
    pub(in crate::cli::bench) mode: WriterMode,
    /// Writes a second asked for.
    pub(in crate::cli::bench) rate: u32,
    /// Creates sent (all of the planned ones, unless the phase failed).
    pub(in crate::cli::bench) sent: usize,
    /// From the first tick to the last send, plus one period: `sent / sending` is the
    /// rate achieved (exactly `rate` when every create left on its tick).
    pub(in crate::cli::bench) sending: Duration,
    /// Created, failed and latencies; `elapsed` runs until the last answer.
    pub(in crate::cli::bench) run: CreateRun,
    /// By write number: whether its create was acknowledged (`201`).
    pub(in crate::cli::bench) acked: Vec<bool>,
    /// The most creates in flight at once.
    pub(in crate::cli::bench) max_in_flight: usize,
    /// The open-loop cap on creates in flight, and how many ticks found it full (and
    /// so sent late).
    pub(in crate::cli::bench) cap: usize,
    pub(in crate::cli::bench) cap_hits: usize,
    /// Whether the creates went over one HTTP/2 connection (`--watch-writer-transport http2`).
    pub(in crate::cli::bench) http2: bool,
}

impl Writes {
    fn new(mode: WriterMode, rate: u32, planned: usize, cap: usize) -> Writes {
        Writes {
            mode,
            rate,
            sent: 0,
            sending: Duration::ZERO,
            run: CreateRun::new(1),
            acked: vec![false; planned],
            max_in_flight: 0,
            cap,
            cap_hits: 0,
            http2: false,
        }
    }

    /// Sends per second achieved.
    pub(in crate::cli::bench) fn send_rate(&self) -> f64 {
        self.sent as f64 / self.sending.as_secs_f64().max(1e-9)
    }

    fn record(&mut self, seq: usize, latency: Duration, outcome: Result<(u16, bytes::Bytes)>) {
        self.acked[seq] = self.run.record(latency, outcome);
    }

    pub(in crate::cli::bench) fn row(&self) -> Row {
        let mut result = format!(
            "{}/s sent of {}/s asked ({} in {:.1}s); {} created",
            fmt_count(self.send_rate().round() as u64),
            fmt_count(u64::from(self.rate)),
            fmt_count(self.sent as u64),
            self.sending.as_secs_f64(),
            fmt_count(self.run.created as u64),
        );
        if self.run.failed > 0 {
            result += &format!(
                ", {} failed, first: {}",
                fmt_count(self.run.failed as u64),
                self.run.first_failure.as_deref().unwrap_or("?")
            );
        }
        match self.mode {
            WriterMode::Closed => result += "; one in flight",
            WriterMode::Open if self.cap_hits == 0 => {
                result += &format!("; at most {} in flight (cap {})", self.max_in_flight, self.cap)
            }
            WriterMode::Open => {
                result += &format!(
                    "; in-flight cap {} hit: {} sends late",
                    self.cap,
                    fmt_count(self.cap_hits as u64)
                )
            }
        }
        Row::new(
            format!(
                "the writer's creates meanwhile, {}-loop{}",
                self.mode.name(),
                if self.http2 { ", one HTTP/2 connection" } else { "" }
            ),
            result,
            Some(self.run.latencies.as_slice()),
            "",
        )
    }
}

#[cfg(test)]
impl Writes {
    /// Writes whose outcome by write number is `acked`.
    pub(in crate::cli::bench) fn for_test(mode: WriterMode, rate: u32, acked: &[bool]) -> Writes {
        let mut writes = Writes::new(mode, rate, acked.len(), 8);
        writes.acked = acked.to_vec();
        writes
    }
}

/// The tick schedule: one every `1 / rate` s from now; ticks missed while the writer
/// waited are sent at once, so the schedule, not the daemon, sets the load.
fn schedule(rate: u32) -> (tokio::time::Interval, Duration) {
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Burst);
    (ticker, period)
}

fn name(load: usize, seq: usize) -> String {
    format!("watch-{load}-{seq}")
}

/// One create at a time, on the schedule while the daemon keeps up.
pub(super) async fn closed(api: &Api, load: usize, rate: u32, planned: usize) -> Writes {
    let mut writes = Writes::new(WriterMode::Closed, rate, planned, 1);
    let (mut ticker, period) = schedule(rate);
    let started = Instant::now();
    for seq in 0..planned {
        ticker.tick().await;
        let sent = Instant::now();
        writes.sending = sent - started + period;
        writes.sent += 1;
        writes.max_in_flight = 1;
        let stamp = Stamp { load, seq, sent_ns: wall_ns() };
        let outcome = api.create(agent(&name(load, seq), Some(&stamp))).await;
        writes.record(seq, sent.elapsed(), outcome);
    }
    writes.run.elapsed = started.elapsed();
    writes
}

/// Each create in its own task on its tick, at most `cap` in flight: when the cap is
/// full the tick waits (counted in `cap_hits`) and the schedule catches up after.
pub(super) async fn open(api: &Api, load: usize, rate: u32, planned: usize, cap: usize) -> Result<Writes> {
    let mut writes = Writes::new(WriterMode::Open, rate, planned, cap);
    let in_flight = Arc::new(Semaphore::new(cap));
    let mut tasks = JoinSet::new();
    let (mut ticker, period) = schedule(rate);
    let started = Instant::now();
    for seq in 0..planned {
        ticker.tick().await;
        let permit = match in_flight.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                writes.cap_hits += 1;
                in_flight.clone().acquire_owned().await.context("the in-flight cap closed")?
            }
        };
        writes.max_in_flight = writes.max_in_flight.max(cap - in_flight.available_permits());
        let api = api.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let sent = Instant::now();
            let stamp = Stamp { load, seq, sent_ns: wall_ns() };
            let outcome = api.create(agent(&name(load, seq), Some(&stamp))).await;
            (seq, sent.elapsed(), outcome)
        });
        writes.sending = started.elapsed() + period;
        writes.sent += 1;
        // Collect what is done as it goes, so finished tasks do not pile up.
        while let Some(done) = tasks.try_join_next() {
            let (seq, latency, outcome) = done.context("a create task panicked")?;
            writes.record(seq, latency, outcome);
        }
    }
    while let Some(done) = tasks.join_next().await {
        let (seq, latency, outcome) = done.context("a create task panicked")?;
        writes.record(seq, latency, outcome);
    }
    writes.run.elapsed = started.elapsed();
    Ok(writes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_row_says_how_it_paced() {
        let mut writes = Writes::new(WriterMode::Open, 1000, 4, 8);
        writes.sent = 4;
        writes.sending = Duration::from_millis(4);
        writes.max_in_flight = 3;
        writes.record(0, Duration::from_millis(1), Ok((201, bytes::Bytes::new())));
        writes.record(1, Duration::from_millis(1), Ok((409, bytes::Bytes::from_static(b"taken"))));
        assert_eq!(writes.acked, [true, false, false, false]);
        let row = writes.row();
        assert_eq!(row.measurement, "the writer's creates meanwhile, open-loop");
        assert_eq!(
            row.result,
            "1,000/s sent of 1,000/s asked (4 in 0.0s); 1 created, 1 failed, first: HTTP 409: taken; \
             at most 3 in flight (cap 8)"
        );
        writes.cap_hits = 2;
        assert!(
            writes.row().result.ends_with("; in-flight cap 8 hit: 2 sends late"),
            "{}",
            writes.row().result
        );
    }
}
