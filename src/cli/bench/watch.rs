//! The watch phase: for each `--watch-loads` entry, that many watch streams open at the
//! current revision while a writer creates that many stamped Agents a second; every
//! watcher records receive − send for each write, and which acknowledged writes it never
//! received (lost) before its stream ended or the drain grace ran out.

mod stream;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context as _, Result};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

pub use self::writer::{WriterMode, WriterTransport};

use self::stream::{read_watch, Delivery, StreamEnd, WatcherSaw};
use self::writer::Writes;
use super::aim_text;
use super::api::{snippet, Api, Endpoint, AGENTS, REQUEST_TIMEOUT};
use super::creates::warm;
use super::meters::{Cpu, CpuMeter};
use super::report::Row;
use super::units::fmt_count;
use super::Plan;

/// How long watchers may take, after the last write was answered, to receive everything.
const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// Watch streams opened at the same time (each is a TLS handshake).
const OPENING_AT_ONCE: usize = 32;
/// Watch streams one HTTP/2 connection carries with `--watch-http2` (the daemon allows 250).
const STREAMS_PER_CONNECTION: usize = 200;
/// Connections the open-loop writer opens before the clock starts (at most its cap), so
/// its first creates do not pay TLS handshakes.
const WRITER_WARM_CONNECTIONS: usize = 8;

/// One watch load: `watchers` streams while the writer creates `rate` Agents a second.
/// Written `WATCHERSxRATE`, e.g. `1000x10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchLoad {
    pub watchers: usize,
    pub rate: u32,
}

impl WatchLoad {
    /// Parses `1000x10` (also `1000×10`).
    pub fn parse(text: &str) -> Result<WatchLoad, String> {
        let (watchers, rate) = text
            .split_once(['x', '×'])
            .ok_or_else(|| format!("`{text}` is not WATCHERSxRATE, e.g. 1000x10"))?;
        let number = |what: &str, n: &str| -> Result<u64, String> {
            n.trim().parse().map_err(|_| format!("`{n}` in `{text}` is not a number of {what}"))
        };
        let watchers = usize::try_from(number("watchers", watchers)?).map_err(|e| e.to_string())?;
        let rate = u32::try_from(number("writes a second", rate)?).map_err(|e| e.to_string())?;
        WatchLoad::new(watchers, rate)
    }

    /// A load within the bounds that keep a run bounded.
    pub fn new(watchers: usize, rate: u32) -> Result<WatchLoad, String> {
        if !(1..=100_000).contains(&watchers) {
            return Err(format!("{watchers}x{rate}: watchers must be between 1 and 100000"));
        }
        if !(1..=10_000).contains(&rate) {
            return Err(format!("{watchers}x{rate}: writes a second must be between 1 and 10000"));
        }
        Ok(WatchLoad { watchers, rate })
    }

    /// Writes made in `duration`, at least one.
    pub(super) fn writes(&self, duration: Duration) -> usize {
        ((f64::from(self.rate) * duration.as_secs_f64()).round() as usize).max(1)
    }
}

impl std::fmt::Display for WatchLoad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.watchers, self.rate)
    }
}

/// What the watch phase saw for one load.
pub(super) struct WatchRun {
    load: WatchLoad,
    writes: Writes,
    deliveries: Vec<Delivery>,
    lost: Lost,
    /// Streams ended by an in-stream 410 (the daemon dropped the watcher).
    gone: usize,
    first_gone: Option<String>,
    /// Streams that ended early for another reason, with the first.
    broken: usize,
    first_break: Option<String>,
    /// While writing and until every watcher had everything.
    cpu: Option<Cpu>,
    /// Over HTTP/2, on this many connections (else one HTTP/1.1 connection each).
    http2_connections: Option<usize>,
}

/// Acknowledged writes that watchers never received.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Lost {
    /// (write, watcher) pairs missing.
    events: usize,
    /// Watchers missing at least one.
    watchers: usize,
}

impl Lost {
    fn add(&mut self, missing: usize) {
        self.events += missing;
        self.watchers += usize::from(missing > 0);
    }
}

/// How many of the `acked` writes (by write number) are not among `received`.
fn missing(acked: &[bool], received: &[Delivery]) -> usize {
    let mut seen = vec![false; acked.len()];
    for d in received {
        if let Some(s) = seen.get_mut(d.seq) {
            *s = true;
        }
    }
    acked.iter().zip(&seen).filter(|(acked, seen)| **acked && !**seen).count()
}

impl WatchRun {
    fn new(load: WatchLoad, writes: Writes) -> WatchRun {
        WatchRun {
            load,
            writes,
            deliveries: Vec::new(),
            lost: Lost::default(),
            gone: 0,
            first_gone: None,
            broken: 0,
            first_break: None,
            cpu: None,
            http2_connections: None,
        }
    }

    /// Takes in what one watcher saw: its deliveries, what it lost, how it ended.
    fn collect(&mut self, saw: WatcherSaw) {
        self.lost.add(missing(&self.writes.acked, &saw.deliveries));
        self.deliveries.extend(saw.deliveries);
        match saw.end {
            Some(StreamEnd::Gone(why)) => {
                self.gone += 1;
                self.first_gone.get_or_insert(why);
            }
            Some(StreamEnd::Broke(why)) => {
                self.broken += 1;
                self.first_break.get_or_insert(why);
            }
            None => {}
        }
    }

    pub(super) fn rows(&self) -> Vec<Row> {
        let expected = self.writes.run.created * self.load.watchers;
        let mut result = format!(
            "{} of {} deliveries",
            fmt_count(self.deliveries.len() as u64),
            fmt_count(expected as u64)
        );
        if self.lost.events == 0 {
            result += "; nothing lost";
        } else {
            result += &format!(
                "; {} lost at {} watchers",
                fmt_count(self.lost.events as u64),
                fmt_count(self.lost.watchers as u64)
            );
        }
        if self.gone > 0 {
            result += &format!(
                "; {} streams ended by 410, first: {}",
                self.gone,
                self.first_gone.as_deref().unwrap_or("?")
            );
        }
        if self.broken > 0 {
            result += &format!(
                "; {} streams broke, first: {}",
                self.broken,
                self.first_break.as_deref().unwrap_or("?")
            );
        }
        let latencies: Vec<Duration> = self.deliveries.iter().map(Delivery::latency).collect();
        let mut what = format!(
            "{} watchers × {}/s",
            fmt_count(self.load.watchers as u64),
            fmt_count(self.load.rate.into())
        );
        if let Some(connections) = self.http2_connections {
            what += &format!(" over HTTP/2 ({connections} conn.)");
        }
        vec![
            Row::new(
                format!("watch delivery, {what}, {}-loop, send → receive", self.writes.mode.name()),
                result,
                Some(latencies.as_slice()),
                aim_text(self.lost.events == 0 && self.gone == 0, "nothing lost"),
            )
            .with_cpu(self.cpu),
            Row::new(
                format!("watch fan-out, {what}, first → each watcher"),
                "after the same write reached its first watcher",
                Some(fan_out(&self.deliveries).as_slice()),
                "",
            ),
            self.writes.row(),
        ]
    }
}

/// Runs load number `index` of the plan: opens its watchers at the current revision,
/// writes at its rate (open- or closed-loop), and collects every watcher's receive −
/// send times and losses.
pub(super) async fn watch_phase(
    endpoint: &Endpoint,
    daemon_pid: u32,
    plan: &Plan,
    index: usize,
) -> Result<WatchRun> {
    let load = plan.watch_loads[index];
    let planned = load.writes(plan.watch_duration);
    let http2 = plan.watch_writer_transport == WriterTransport::Http2;
    let writer = if http2 {
        endpoint.api_http2(Some(REQUEST_TIMEOUT))?
    } else {
        endpoint.api(Some(REQUEST_TIMEOUT))?
    };
    // Open the writer's connections outside the clock (and before the watchers, so the
    // warm-up creates are not events they see).
    let warm_connections = match plan.watch_writer {
        _ if http2 => 1,
        WriterMode::Open => plan.watch_in_flight.min(WRITER_WARM_CONNECTIONS),
        WriterMode::Closed => 1,
    };
    let mut warming = JoinSet::new();
    for n in 0..warm_connections {
        let (writer, name) = (writer.clone(), format!("watch-{index}-warm-{n}"));
        warming.spawn(async move { warm(&writer, &name).await });
    }
    while let Some(warmed) = warming.join_next().await {
        warmed.context("a warm-up create panicked")??;
    }
    let (_, revision) = writer.list_head().await?;
    let path = format!("{AGENTS}?watch=true&resourceVersion={revision}");

    // HTTP/1.1: one client for all streams; its pool opens a new connection for each,
    // since a streaming HTTP/1.1 response holds its connection. HTTP/2: one client (one
    // connection) per STREAMS_PER_CONNECTION streams, below the daemon's 250, or as many
    // as --watch-connections asks, the streams dealt among them in turn.
    let clients: Vec<Arc<Api>> = if plan.watch_http2 {
        let needed = load.watchers.div_ceil(STREAMS_PER_CONNECTION).max(1);
        let connections = plan.watch_connections.map_or(needed, |n| n.clamp(needed, load.watchers.max(1)));
        (0..connections).map(|_| endpoint.api_http2(None).map(Arc::new)).collect::<Result<_>>()?
    } else {
        vec![Arc::new(endpoint.api(None)?)]
    };
    let opening = Arc::new(Semaphore::new(OPENING_AT_ONCE));
    let mut opened = JoinSet::new();
    for i in 0..load.watchers {
        let client = clients[i % clients.len()].clone();
        let (opening, path) = (opening.clone(), path.clone());
        opened.spawn(async move {
            let _permit = opening.acquire().await?;
            let resp = client.request(reqwest::Method::GET, &path).send().await.context("opening a watch")?;
            let code = resp.status().as_u16();
            ensure!(
                code == 200,
                "opening a watch: HTTP {code}: {}",
                snippet(&resp.bytes().await.unwrap_or_default())
            );
            anyhow::Ok(resp)
        });
    }
    let mut streams = Vec::with_capacity(load.watchers);
    while let Some(joined) = opened.join_next().await {
        streams.push(joined.context("opening a watch panicked")??);
    }

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut readers = JoinSet::new();
    for resp in streams {
        readers.spawn(read_watch(resp, index, planned, stopped.clone()));
    }

    let meter = CpuMeter::start(daemon_pid);
    let writes = match plan.watch_writer {
        WriterMode::Open => writer::open(&writer, index, load.rate, planned, plan.watch_in_flight).await?,
        WriterMode::Closed => writer::closed(&writer, index, load.rate, planned).await,
    };
    if writes.run.created == 0 {
        bail!(
            "every watch-phase create failed; first: {}",
            writes.run.first_failure.as_deref().unwrap_or("?")
        );
    }

    let mut watch = WatchRun::new(load, writes);
    watch.http2_connections = plan.watch_http2.then_some(clients.len());
    watch.writes.http2 = http2;
    let drained = tokio::time::timeout(DRAIN_GRACE, async {
        while let Some(joined) = readers.join_next().await {
            watch.collect(joined.context("a watcher panicked")?);
        }
        anyhow::Ok(())
    })
    .await;
    match drained {
        Ok(done) => done?,
        Err(_) => {
            // Whoever has not had every write by now has lost the rest.
            let _ = stop.send(true);
            while let Some(joined) = readers.join_next().await {
                watch.collect(joined.context("a watcher panicked")?);
            }
        }
    }
    watch.cpu = meter.stop();
    Ok(watch)
}

/// For every delivery, how long after the first delivery of the same write it came:
/// the fan-out alone, without the durable commit every delivery waits for.
fn fan_out(deliveries: &[Delivery]) -> Vec<Duration> {
    let mut first: std::collections::HashMap<usize, u128> = std::collections::HashMap::new();
    for d in deliveries {
        let earliest = first.entry(d.seq).or_insert(d.received_ns);
        *earliest = (*earliest).min(d.received_ns);
    }
    deliveries
        .iter()
        .map(|d| Duration::from_nanos(d.received_ns.saturating_sub(first[&d.seq]) as u64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn d(seq: usize, sent_ns: u128, received_ns: u128) -> Delivery {
        Delivery { seq, sent_ns, received_ns }
    }

    #[test]
    fn fan_out_counts_from_the_first_watcher_of_each_write() {
        let deliveries =
            [d(0, 100, 5_000_000), d(0, 100, 3_000_000), d(1, 200, 9_000_000), d(1, 200, 9_000_000)];
        assert_eq!(fan_out(&deliveries), vec![ms(2), ms(0), ms(0), ms(0)]);
        assert_eq!(deliveries[0].latency(), Duration::from_nanos(4_999_900));
    }

    #[test]
    fn loads_parse_as_watchers_x_rate() {
        assert_eq!(WatchLoad::parse("1000x10"), Ok(WatchLoad { watchers: 1000, rate: 10 }));
        assert_eq!(WatchLoad::parse("100×1000"), Ok(WatchLoad { watchers: 100, rate: 1000 }));
        assert_eq!(WatchLoad { watchers: 100, rate: 1000 }.to_string(), "100x1000");
        for bad in ["1000", "x10", "10x", "ax1", "0x10", "10x0", "10x20000", "-1x5"] {
            assert!(WatchLoad::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(WatchLoad { watchers: 1, rate: 10 }.writes(Duration::from_secs(5)), 50);
        assert_eq!(WatchLoad { watchers: 1, rate: 1 }.writes(ms(100)), 1);
    }

    #[test]
    fn lost_events_are_acknowledged_writes_a_watcher_never_received() {
        let acked = [true, true, false, true];
        // Everything acknowledged arrived; the unacknowledged write 2 is not expected.
        assert_eq!(missing(&acked, &[d(0, 0, 1), d(1, 0, 1), d(3, 0, 1)]), 0);
        // A write received twice does not make up for one never received.
        assert_eq!(missing(&acked, &[d(0, 0, 1), d(0, 0, 1), d(3, 0, 1)]), 1);
        // A stream that ended early lost the rest; an out-of-range number is ignored.
        assert_eq!(missing(&acked, &[d(0, 0, 1), d(9, 0, 1)]), 2);
        assert_eq!(missing(&acked, &[]), 3);

        let mut lost = Lost::default();
        for m in [0, 2, 0, 1] {
            lost.add(m);
        }
        assert_eq!(lost, Lost { events: 3, watchers: 2 });
    }

    #[test]
    fn a_watcher_ended_by_410_counts_as_gone_and_its_rest_as_lost() {
        let mut writes = Writes::for_test(WriterMode::Open, 10, &[true, true, true]);
        writes.run.created = 3;
        let mut run = WatchRun::new(WatchLoad { watchers: 2, rate: 10 }, writes);
        run.collect(WatcherSaw { deliveries: vec![d(0, 0, 1), d(1, 0, 1), d(2, 0, 1)], end: None });
        run.collect(WatcherSaw {
            deliveries: vec![d(0, 0, 1)],
            end: Some(StreamEnd::Gone("410: too slow".into())),
        });
        assert_eq!((run.lost, run.gone, run.broken), (Lost { events: 2, watchers: 1 }, 1, 0));
        let rows = run.rows();
        assert_eq!(rows[0].measurement, "watch delivery, 2 watchers × 10/s, open-loop, send → receive");
        assert_eq!(
            rows[0].result,
            "4 of 6 deliveries; 2 lost at 1 watchers; 1 streams ended by 410, first: 410: too slow"
        );
        assert_eq!(rows[0].aim, "nothing lost: missed");
    }
}
