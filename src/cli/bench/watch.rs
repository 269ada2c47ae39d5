//! The watch phase: many watch streams open at the current revision while a writer
//! creates Agents that carry their send time; every watcher records receive − send.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::aim_text;
use super::api::{agent, snippet, wall_ns, Endpoint, AGENTS, REQUEST_TIMEOUT, SENT_ANNOTATION};
use super::creates::CreateRun;
use super::meters::{Cpu, CpuMeter};
use super::report::{fmt_count, summarize, Row};
use super::Plan;

/// How long watchers may take, after the last write, to receive everything.
pub(super) const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// Watch streams opened at the same time (each is a TLS handshake).
pub(super) const OPENING_AT_ONCE: usize = 32;

/// What the watch phase saw.
pub(super) struct WatchRun {
    pub(super) watchers: usize,
    pub(super) writes: usize,
    pub(super) deliveries: Vec<Delivery>,
    /// Watchers whose stream ended early, with the first reason.
    pub(super) broken: usize,
    pub(super) first_break: Option<String>,
    pub(super) writer: CreateRun,
    /// While writing and until every watcher had everything.
    pub(super) cpu: Option<Cpu>,
}

impl WatchRun {
    pub(super) fn rows(&self) -> Vec<Row> {
        let expected = self.writes * self.watchers;
        let mut result = format!(
            "{} of {} deliveries",
            fmt_count(self.deliveries.len() as u64),
            fmt_count(expected as u64)
        );
        if self.deliveries.len() < expected {
            result += &format!(" ({} missing)", fmt_count((expected - self.deliveries.len()) as u64));
        }
        if self.broken > 0 {
            result += &format!(
                "; {} streams broke, first: {}",
                self.broken,
                self.first_break.as_deref().unwrap_or("?")
            );
        }
        let latencies: Vec<Duration> = self.deliveries.iter().map(Delivery::latency).collect();
        let p99 = summarize(&latencies).map(|s| s.p99);
        vec![
            Row::new(
                format!("watch delivery, {} watchers, send → receive", self.watchers),
                result,
                Some(latencies.as_slice()),
                aim_text(p99.is_some_and(|p| p < Duration::from_millis(20)), "p99 < 20 ms"),
            )
            .with_cpu(self.cpu),
            Row::new(
                "watch fan-out, first → each watcher",
                "after the same write reached its first watcher",
                Some(fan_out(&self.deliveries).as_slice()),
                "",
            ),
            self.writer.row("the writer's creates meanwhile".to_string(), String::new()),
        ]
    }
}

/// Opens the watchers at the current revision, writes at a steady rate from one client,
/// and collects every watcher's receive − send times.
pub(super) async fn watch_phase(endpoint: &Endpoint, daemon_pid: u32, plan: &Plan) -> Result<WatchRun> {
    let writer = endpoint.api(Some(REQUEST_TIMEOUT))?;
    let (_, revision) = writer.list_head().await?;
    let writes = plan.watch_writes();
    let path = format!("{AGENTS}?watch=true&resourceVersion={revision}");

    // One client for all streams: its pool opens a new connection for each, since a
    // streaming HTTP/1.1 response holds its connection.
    let watch_client = Arc::new(endpoint.api(None)?);
    let opening = Arc::new(Semaphore::new(OPENING_AT_ONCE));
    let mut opened = JoinSet::new();
    for _ in 0..plan.watchers {
        let (client, opening, path) = (watch_client.clone(), opening.clone(), path.clone());
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
    let mut streams = Vec::with_capacity(plan.watchers);
    while let Some(joined) = opened.join_next().await {
        streams.push(joined.context("opening a watch panicked")??);
    }

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut readers = JoinSet::new();
    for resp in streams {
        readers.spawn(read_watch(resp, writes, stopped.clone()));
    }

    let mut run = CreateRun {
        clients: 1,
        created: 0,
        failed: 0,
        first_failure: None,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / plan.watch_rate as f64));
    let meter = CpuMeter::start(daemon_pid);
    let started = Instant::now();
    for i in 0..writes {
        ticker.tick().await;
        let sent = Instant::now();
        match writer.create(agent(&format!("watch-{i}"), Some(wall_ns()))).await? {
            (201, _) => {
                run.latencies.push(sent.elapsed());
                run.created += 1;
            }
            (code, body) => bail!("watch-phase create: HTTP {code}: {}", snippet(&body)),
        }
    }
    run.elapsed = started.elapsed();

    let mut watch = WatchRun {
        cpu: None,
        watchers: plan.watchers,
        writes,
        deliveries: Vec::new(),
        broken: 0,
        first_break: None,
        writer: run,
    };
    let mut collect = |seen: WatcherSaw| {
        watch.deliveries.extend(seen.deliveries);
        if let Some(why) = seen.broke {
            watch.broken += 1;
            watch.first_break.get_or_insert(why);
        }
    };
    let drained = tokio::time::timeout(DRAIN_GRACE, async {
        while let Some(joined) = readers.join_next().await {
            collect(joined.context("a watcher panicked")?);
        }
        anyhow::Ok(())
    })
    .await;
    if drained.is_err() {
        let _ = stop.send(true);
        while let Some(joined) = readers.join_next().await {
            collect(joined.context("a watcher panicked")?);
        }
    } else {
        drained??;
    }
    watch.cpu = meter.stop();
    Ok(watch)
}

/// One write seen by one watcher: when it was sent and when it arrived (Unix ns).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Delivery {
    pub(super) sent_ns: u128,
    pub(super) received_ns: u128,
}

impl Delivery {
    pub(super) fn latency(&self) -> Duration {
        Duration::from_nanos(self.received_ns.saturating_sub(self.sent_ns) as u64)
    }
}

/// For every delivery, how long after the first delivery of the same write it came:
/// the fan-out alone, without the durable commit every delivery waits for.
pub(super) fn fan_out(deliveries: &[Delivery]) -> Vec<Duration> {
    let mut first: std::collections::HashMap<u128, u128> = std::collections::HashMap::new();
    for d in deliveries {
        let earliest = first.entry(d.sent_ns).or_insert(d.received_ns);
        *earliest = (*earliest).min(d.received_ns);
    }
    deliveries
        .iter()
        .map(|d| Duration::from_nanos(d.received_ns.saturating_sub(first[&d.sent_ns]) as u64))
        .collect()
}

/// What one watcher received.
pub(super) struct WatcherSaw {
    pub(super) deliveries: Vec<Delivery>,
    pub(super) broke: Option<String>,
}

/// Reads one stream until it has seen `expected` bench writes, it ends, or `stop`.
pub(super) async fn read_watch(
    mut resp: reqwest::Response,
    expected: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> WatcherSaw {
    let mut saw = WatcherSaw { deliveries: Vec::with_capacity(expected), broke: None };
    let mut buffer: Vec<u8> = Vec::new();
    while saw.deliveries.len() < expected && saw.broke.is_none() {
        let chunk = tokio::select! {
            chunk = resp.chunk() => chunk,
            _ = stop.changed() => break,
        };
        // One receive time per chunk: parsing is the client's cost, not delivery.
        let received = wall_ns();
        match chunk {
            Ok(Some(bytes)) => buffer.extend_from_slice(&bytes),
            Ok(None) => saw.broke = Some("the server closed the stream".into()),
            Err(e) => saw.broke = Some(format!("{e}")),
        }
        let mut start = 0;
        while let Some(end) = buffer[start..].iter().position(|b| *b == b'\n') {
            match classify(&buffer[start..start + end]) {
                Line::Sent(sent_ns) => saw.deliveries.push(Delivery { sent_ns, received_ns: received }),
                Line::Error(why) => saw.broke = Some(why),
                Line::Other => {}
            }
            start += end + 1;
        }
        buffer.drain(..start);
    }
    saw
}

/// What a watch line is to the benchmark.
#[derive(Debug, PartialEq)]
pub(super) enum Line {
    /// A bench write, sent at this Unix nanosecond.
    Sent(u128),
    /// An `ERROR` event (the stream is over), or a line that is not an event.
    Error(String),
    /// Anything else: bookmarks, objects that are not bench writes.
    Other,
}

pub(super) fn classify(line: &[u8]) -> Line {
    #[derive(Deserialize)]
    struct Event {
        #[serde(rename = "type")]
        type_: String,
        object: Object,
    }
    #[derive(Deserialize)]
    struct Object {
        #[serde(default)]
        metadata: Metadata,
        #[serde(default)]
        message: String,
    }
    #[derive(Deserialize, Default)]
    struct Metadata {
        #[serde(default)]
        annotations: std::collections::HashMap<String, String>,
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Line::Other;
    }
    match serde_json::from_slice::<Event>(line) {
        Err(e) => Line::Error(format!("malformed event ({e}): {}", snippet(line))),
        Ok(event) if event.type_ == "ERROR" => Line::Error(format!("ERROR event: {}", event.object.message)),
        Ok(event) => match event.object.metadata.annotations.get(SENT_ANNOTATION).map(|v| v.parse()) {
            Some(Ok(ns)) => Line::Sent(ns),
            _ => Line::Other,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn watch_lines_are_classified() {
        let sent = br#"{"type":"ADDED","object":{"kind":"Agent","metadata":{"name":"w","annotations":{"bench.hive.dev/sent-ns":"42"}},"spec":{}}}"#;
        assert_eq!(classify(sent), Line::Sent(42));
        let other = br#"{"type":"ADDED","object":{"kind":"Agent","metadata":{"name":"x"}}}"#;
        assert_eq!(classify(other), Line::Other);
        let bookmark = br#"{"type":"BOOKMARK","object":{"kind":"Agent","metadata":{"resourceVersion":"9"}}}"#;
        assert_eq!(classify(bookmark), Line::Other);
        assert_eq!(classify(b"  "), Line::Other);
        let error = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}"#;
        assert_eq!(classify(error), Line::Error("ERROR event: too old".into()));
        assert!(matches!(classify(b"{nope"), Line::Error(_)));
    }

    #[test]
    fn fan_out_counts_from_the_first_watcher_of_each_write() {
        let d = |sent_ns, received_ns| Delivery { sent_ns, received_ns };
        let deliveries = [d(100, 5_000_000), d(100, 3_000_000), d(200, 9_000_000), d(200, 9_000_000)];
        assert_eq!(fan_out(&deliveries), vec![ms(2), ms(0), ms(0), ms(0)]);
        assert_eq!(deliveries[0].latency(), Duration::from_nanos(4_999_900));
    }
}
