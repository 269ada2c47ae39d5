//! Watch delivery, as `hive bench` measures it: for one load, `watchers` watches on a key
//! prefix from the current revision, while an open-loop writer puts `rate` new keys a
//! second, each put in its own task on a fixed schedule (at most `in_flight` at once). A
//! value starts with its send time; every watcher records receive − send, and which
//! acknowledged puts it never received.
//!
//! The watches are spread over a pool of `clients` gRPC connections, each watch its own
//! stream on one of them, as informers in several processes watch one etcd (kube-apiserver
//! itself multiplexes all of its watches over a few connections). One connection per watch
//! made etcd hold 1,000 HTTP/2 connections and the generator 1,000 tonic channels, which
//! measured the generator's and the kernel's connection cost, not etcd's fan-out. Each
//! event is decoded as little as the bench needs: the key's number and the value's stamp
//! read as ASCII digits in place, the latency worked out after the run.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use etcd_client::{Client, WatchOptions};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::table::{fmt_count, CpuMeter, Row};

/// How long watchers may take, after the last put was answered, to receive everything.
const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// Connections opened at the same time.
const OPENING_AT_ONCE: usize = 32;
/// Digits of the send time at the start of each value.
const STAMP_DIGITS: usize = 20;

/// One load: `watchers` watches while the writer puts `rate` keys a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    pub watchers: usize,
    pub rate: u32,
}

impl Load {
    pub fn parse(text: &str) -> Result<Load, String> {
        let (w, r) = text.split_once(['x', '×']).ok_or_else(|| format!("`{text}` is not WATCHERSxRATE"))?;
        let watchers = w.parse().map_err(|_| format!("`{w}` is not a number of watchers"))?;
        let rate = r.parse().map_err(|_| format!("`{r}` is not a number of writes a second"))?;
        if watchers == 0 || rate == 0 {
            return Err(format!("{text}: both must be more than 0"));
        }
        Ok(Load { watchers, rate })
    }
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// One write seen by one watcher: which put, when it was sent and when it arrived (Unix ns).
struct Delivery {
    seq: usize,
    sent_ns: u64,
    received_ns: u64,
}

impl Delivery {
    fn latency(&self) -> Duration {
        Duration::from_nanos(self.received_ns.saturating_sub(self.sent_ns))
    }
}

/// The number `digits` spell, read as ASCII digits in place (no UTF-8 check, no string):
/// `None` when a byte is not a digit, there are none, or it overflows.
fn digits(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

/// What one watcher received, and how its stream ended if it ended early.
struct Saw {
    deliveries: Vec<Delivery>,
    canceled: Option<String>,
    broke: Option<String>,
}

/// The value of put `seq`: its send time, then padding to `bytes`.
fn value(sent_ns: u64, bytes: usize) -> Vec<u8> {
    let mut v = format!("{sent_ns:0STAMP_DIGITS$}").into_bytes();
    v.resize(bytes.max(STAMP_DIGITS), b'x');
    v
}

/// Reads one watch until it has each of the `expected` puts once, it ends, or `stop`.
async fn read(
    mut etcd: Client,
    prefix: String,
    revision: i64,
    expected: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Saw {
    let mut saw = Saw { deliveries: Vec::with_capacity(expected), canceled: None, broke: None };
    let options = WatchOptions::new().with_prefix().with_start_revision(revision);
    let mut stream = match etcd.watch(prefix.clone(), Some(options)).await {
        Ok(stream) => stream,
        Err(e) => {
            saw.broke = Some(format!("opening the watch: {e}"));
            return saw;
        }
    };
    let mut seen = vec![false; expected];
    let mut distinct = 0;
    while distinct < expected {
        let message = tokio::select! {
            message = stream.message() => message,
            _ = stop.changed() => break,
        };
        let received_ns = wall_ns();
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => {
                saw.broke = Some("etcd closed the stream".into());
                break;
            }
            Err(e) => {
                saw.broke = Some(e.to_string());
                break;
            }
        };
        if response.canceled() {
            saw.canceled = Some(format!(
                "canceled: {} (compacted at {})",
                response.cancel_reason(),
                response.compact_revision()
            ));
            break;
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let seq = kv.key().strip_prefix(prefix.as_bytes()).and_then(digits);
            let sent = kv.value().get(..STAMP_DIGITS).and_then(digits);
            let (Some(seq), Some(sent_ns)) = (seq, sent) else { continue };
            let Ok(seq) = usize::try_from(seq) else { continue };
            if seen.get(seq) == Some(&false) {
                seen[seq] = true;
                distinct += 1;
            }
            saw.deliveries.push(Delivery { seq, sent_ns, received_ns });
        }
    }
    saw
}

/// How one load is run: the writer's pace and values, the watchers' connections.
pub struct Settings {
    pub duration: Duration,
    /// Most puts in flight at once.
    pub in_flight: usize,
    pub value_bytes: usize,
    /// gRPC connections the watches are spread over (at most one per watch).
    pub clients: usize,
    /// etcd's pid, for the CPU column.
    pub pid: Option<u32>,
}

/// Measures one load (number `index`); its three rows.
pub async fn load(endpoint: &str, index: usize, load: Load, settings: &Settings) -> Result<Vec<Row>> {
    let Settings { duration, in_flight, value_bytes, pid, .. } = *settings;
    let planned = ((f64::from(load.rate) * duration.as_secs_f64()).round() as usize).max(1);
    let prefix = format!("/bench/watch/{index}/");
    let mut writer = Client::connect([endpoint], None).await.context("connecting to etcd")?;
    writer
        .put(format!("/bench/watch/{index}-warm"), value(wall_ns(), value_bytes), None)
        .await
        .context("warm-up put")?;
    let head = writer.get("/bench/none", None).await.context("reading the revision")?;
    let revision = head.header().context("a get answer has no header")?.revision() + 1;

    // A pool of clients (connections); watch i is a stream on client i mod the pool.
    let pool_size = settings.clients.clamp(1, load.watchers);
    let opening = Arc::new(Semaphore::new(OPENING_AT_ONCE));
    let mut connecting = JoinSet::new();
    for _ in 0..pool_size {
        let (opening, endpoint) = (opening.clone(), endpoint.to_string());
        connecting.spawn(async move {
            let _permit = opening.acquire().await?;
            Client::connect([endpoint], None).await.context("connecting a watcher to etcd")
        });
    }
    let mut pool = Vec::with_capacity(pool_size);
    while let Some(connected) = connecting.join_next().await {
        pool.push(connected.context("connecting panicked")??);
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut readers = JoinSet::new();
    for i in 0..load.watchers {
        let etcd = pool[i % pool_size].clone();
        readers.spawn(read(etcd, prefix.clone(), revision, planned, stopped.clone()));
    }
    // A watch is open once its first answer (created) is back; with a start revision
    // nothing is missed either way, so the writer does not wait for it.

    let meter = CpuMeter::start(pid);
    let cap = Arc::new(Semaphore::new(in_flight));
    let period = Duration::from_secs_f64(1.0 / f64::from(load.rate));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut puts = JoinSet::new();
    let (mut cap_hits, mut max_in_flight) = (0usize, 0usize);
    let started = Instant::now();
    let mut sending = Duration::ZERO;
    for seq in 0..planned {
        ticker.tick().await;
        let permit = match cap.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                cap_hits += 1;
                cap.clone().acquire_owned().await?
            }
        };
        max_in_flight = max_in_flight.max(in_flight - cap.available_permits());
        let mut kv = writer.kv_client();
        let key = format!("{prefix}{seq}");
        puts.spawn(async move {
            let _permit = permit;
            let sent = Instant::now();
            let outcome = kv.put(key, value(wall_ns(), value_bytes), None).await;
            (seq, sent.elapsed(), outcome.map(|_| ()))
        });
        sending = started.elapsed() + period;
    }
    let mut acked = vec![false; planned];
    let (mut latencies, mut failed, mut first_failure) = (Vec::with_capacity(planned), 0, None);
    while let Some(done) = puts.join_next().await {
        let (seq, latency, outcome) = done.context("a put task panicked")?;
        match outcome {
            Ok(()) => {
                acked[seq] = true;
                latencies.push(latency);
            }
            Err(e) => {
                failed += 1;
                first_failure.get_or_insert_with(|| e.to_string());
            }
        }
    }
    let acknowledged = latencies.len();
    if acknowledged == 0 {
        bail!("every put failed; first: {}", first_failure.unwrap_or_default());
    }

    let mut saws = Vec::with_capacity(load.watchers);
    let drained = tokio::time::timeout(DRAIN_GRACE, async {
        while let Some(joined) = readers.join_next().await {
            saws.push(joined?);
        }
        anyhow::Ok(())
    })
    .await;
    if drained.is_err() {
        let _ = stop.send(true);
        while let Some(joined) = readers.join_next().await {
            saws.push(joined?);
        }
    }
    let cpu = meter.stop();

    // Losses, ends, latencies and the fan-out (receive − first receipt of the same put).
    let (mut lost, mut losing, mut canceled, mut broke) = (0, 0, 0, 0);
    let (mut first_canceled, mut first_broke) = (None, None);
    let mut first_receipt = vec![u64::MAX; planned];
    let mut delivery_latencies = Vec::new();
    for saw in &saws {
        let mut got = vec![false; planned];
        for d in &saw.deliveries {
            got[d.seq] = true;
            first_receipt[d.seq] = first_receipt[d.seq].min(d.received_ns);
            delivery_latencies.push(d.latency());
        }
        let missing = acked.iter().zip(&got).filter(|(a, g)| **a && !**g).count();
        lost += missing;
        losing += usize::from(missing > 0);
        if let Some(why) = &saw.canceled {
            canceled += 1;
            first_canceled.get_or_insert(why.clone());
        }
        if let Some(why) = &saw.broke {
            broke += 1;
            first_broke.get_or_insert(why.clone());
        }
    }
    let fan_out: Vec<Duration> = saws
        .iter()
        .flat_map(|saw| saw.deliveries.iter())
        .map(|d| Duration::from_nanos(d.received_ns.saturating_sub(first_receipt[d.seq])))
        .collect();

    let expected = acknowledged * load.watchers;
    let mut result = format!(
        "{} of {} deliveries",
        fmt_count(delivery_latencies.len() as u64),
        fmt_count(expected as u64)
    );
    if lost == 0 {
        result += "; nothing lost";
    } else {
        result += &format!("; {} lost at {} watchers", fmt_count(lost as u64), fmt_count(losing as u64));
    }
    if canceled > 0 {
        result += &format!("; {canceled} watches canceled, first: {}", first_canceled.unwrap_or_default());
    }
    if broke > 0 {
        result += &format!("; {broke} streams broke, first: {}", first_broke.unwrap_or_default());
    }
    let what = format!(
        "{} watchers × {}/s ({pool_size} conn.)",
        fmt_count(load.watchers as u64),
        fmt_count(load.rate.into())
    );
    let mut writer_result = format!(
        "{}/s sent of {}/s asked ({} in {:.1}s); {} acknowledged",
        fmt_count((planned as f64 / sending.as_secs_f64().max(1e-9)).round() as u64),
        fmt_count(load.rate.into()),
        fmt_count(planned as u64),
        sending.as_secs_f64(),
        fmt_count(acknowledged as u64)
    );
    if failed > 0 {
        writer_result += &format!(", {failed} failed, first: {}", first_failure.unwrap_or_default());
    }
    writer_result += &if cap_hits == 0 {
        format!("; at most {max_in_flight} in flight (cap {in_flight})")
    } else {
        format!("; in-flight cap {in_flight} hit: {} sends late", fmt_count(cap_hits as u64))
    };
    Ok(vec![
        Row::new(
            format!("etcd watch delivery, {what}, open-loop, send → receive"),
            result,
            Some(&delivery_latencies),
        )
        .with_cpu(cpu)
        .with_aim(if lost == 0 && canceled == 0 {
            "nothing lost: met"
        } else {
            "nothing lost: missed"
        }),
        Row::new(
            format!("etcd watch fan-out, {what}, first → each watcher"),
            "after the same put reached its first watcher",
            Some(&fan_out),
        ),
        Row::new("etcd: the writer's puts meanwhile, open-loop", writer_result, Some(&latencies)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_start_with_their_send_time_and_loads_parse() {
        let v = value(42, 512);
        assert_eq!(v.len(), 512);
        assert_eq!(digits(&v[..STAMP_DIGITS]), Some(42));
        assert_eq!(digits(b"0123"), Some(123));
        assert_eq!(digits(b""), None);
        assert_eq!(digits(b"12x"), None);
        assert_eq!(digits(b"99999999999999999999"), None, "overflow is not a stamp");
        assert_eq!(Load::parse("1000x10"), Ok(Load { watchers: 1000, rate: 10 }));
        assert!(Load::parse("0x10").is_err());
        assert!(Load::parse("10").is_err());
    }
}
