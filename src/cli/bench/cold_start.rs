//! The cold-start phase: the filled daemon is stopped gracefully (SIGTERM) and started
//! again on the same state, `--restarts` times. Each restart is timed from the spawn to
//! the first full list answering with every object (what shows it really serves), and
//! its resident memory is read right after that list: a daemon that holds more after a
//! restart than live, or more after each restart, shows here.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};

use super::aim_text;
use super::api::REQUEST_TIMEOUT;
use super::daemon::{Daemon, START_TIMEOUT};
use super::list::{list_all, Listed};
use super::meters::{Memory, PerObject};
use super::report::Row;
use super::units::{fmt_count, fmt_duration};

/// The goal of issue 13: spawn → serving every object.
const AIM: Duration = Duration::from_secs(2);
/// The goal of issue 13 for memory beyond the objects' JSON, in bytes per object.
pub(super) const MEMORY_AIM_BYTES: f64 = 2048.0;

/// One restart.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Restart {
    /// SIGTERM → the old daemon exited.
    pub(super) stopped_in: Duration,
    /// Spawn → the daemon printed its URL.
    pub(super) serving_line: Duration,
    /// Spawn → a full list answered with every object.
    pub(super) serving: Duration,
    /// Right after that list.
    pub(super) memory: Memory,
    pub(super) listed: Listed,
}

/// Stops `daemon` with SIGTERM, starts a new one on the same state in `work`, and waits
/// until a full list answers with `expected` objects.
pub(super) async fn restart(
    daemon: Daemon,
    work: &Path,
    serve_args: &[String],
    generation: usize,
    expected: usize,
) -> Result<(Daemon, Restart)> {
    let stopped_in = daemon.stop_gracefully().await?;
    let daemon = Daemon::start(work, serve_args, generation).await?;
    let api = daemon.endpoint.api(Some(REQUEST_TIMEOUT))?;
    let listed = loop {
        match list_all(&api).await {
            Ok(listed) if listed.items == expected => break listed,
            Ok(listed) => bail!(
                "after restart {generation} the daemon lists {} of the {} objects it held",
                listed.items,
                expected
            ),
            // Serving its URL but not yet answering (a 503 while it loads): ask again.
            Err(_) if daemon.spawned.elapsed() < START_TIMEOUT => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => {
                return Err(e.context(format!("restart {generation}: no full list within {START_TIMEOUT:?}")))
            }
        }
    };
    let serving = daemon.spawned.elapsed();
    let memory = daemon.memory()?;
    let serving_line = daemon.serving_line;
    Ok((daemon, Restart { stopped_in, serving_line, serving, memory, listed }))
}

/// The table's rows for all restarts: one for the cold start (the spawn → full list of
/// each as latencies), one per restart for memory.
pub(super) fn rows(restarts: &[Restart], idle: &Memory) -> Vec<Row> {
    let Some(first) = restarts.first() else { return Vec::new() };
    let times = |f: fn(&Restart) -> Duration| -> String {
        restarts.iter().map(|r| fmt_duration(f(r))).collect::<Vec<_>>().join(", ")
    };
    let serving: Vec<Duration> = restarts.iter().map(|r| r.serving).collect();
    let slowest = serving.iter().max().copied().unwrap_or_default();
    let mut rows = vec![Row::new(
        format!("cold start, {} objects, spawn → full list", fmt_count(first.listed.items as u64)),
        format!(
            "{} restart(s): {}; URL printed after {}; SIGTERM → exit {}",
            restarts.len(),
            times(|r| r.serving),
            times(|r| r.serving_line),
            times(|r| r.stopped_in)
        ),
        Some(serving.as_slice()),
        aim_text(slowest < AIM, "< 2 s"),
    )];
    for (n, restart) in restarts.iter().enumerate() {
        rows.push(memory_row(
            format!("daemon memory after restart {} of {}", n + 1, restarts.len()),
            &restart.memory,
            idle,
            &restart.listed,
            String::new(),
        ));
    }
    rows
}

/// A memory row with the memory per object: `extra` is appended to the result.
pub(super) fn memory_row(
    measurement: String,
    memory: &Memory,
    idle: &Memory,
    listed: &Listed,
    extra: String,
) -> Row {
    let per = PerObject::new(memory, idle, listed.items, listed.bytes);
    let mut result = memory.to_string();
    if let Some(per) = per {
        result += &format!("; {per}");
    }
    result += &extra;
    let aim = per.map(|p| aim_text(p.beyond_json() <= MEMORY_AIM_BYTES, "≤ 2 KiB/object beyond the JSON"));
    Row::new(measurement, result, None, aim.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn restarts_render_one_cold_start_row_and_a_memory_row_each() {
        let mib = |n: u64| Memory { rss_kib: n * 1024, hwm_kib: n * 1024 };
        let listed = Listed { items: 1000, bytes: 700_000 };
        let restart = |serving, rss| Restart {
            stopped_in: s(300),
            serving_line: s(serving - 100),
            serving: s(serving),
            memory: mib(rss),
            listed,
        };
        let rows = rows(&[restart(1500, 51), restart(2500, 52)], &mib(50));
        let summary: Vec<(&str, &str, &str)> =
            rows.iter().map(|r| (r.measurement.as_str(), r.result.as_str(), r.aim.as_str())).collect();
        assert_eq!(
            summary,
            [
                (
                    "cold start, 1,000 objects, spawn → full list",
                    "2 restart(s): 1.50 s, 2.50 s; URL printed after 1.40 s, 2.40 s; SIGTERM → exit 300.0 ms, 300.0 ms",
                    "< 2 s: missed"
                ),
                (
                    "daemon memory after restart 1 of 2",
                    "VmRSS 51 MiB (peak 51 MiB); 1.0 KiB/object, 349 B beyond its 700 B of JSON",
                    "≤ 2 KiB/object beyond the JSON: met"
                ),
                (
                    "daemon memory after restart 2 of 2",
                    "VmRSS 52 MiB (peak 52 MiB); 2.0 KiB/object, 1.4 KiB beyond its 700 B of JSON",
                    "≤ 2 KiB/object beyond the JSON: met"
                ),
            ]
        );
        assert_eq!(rows[0].latency.map(|l| l.max), Some(s(2500)));
        assert!(super::rows(&[], &mib(50)).is_empty());
    }
}
