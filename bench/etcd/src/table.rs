//! The rows this tool prints, in the same columns as `hive bench` so both land in one
//! table: percentiles, number formats, CPU shares read from `/proc`, and rendering.

use std::time::{Duration, Instant};

/// One line of the table.
pub struct Row {
    pub measurement: String,
    pub result: String,
    pub latency: Option<Summary>,
    pub cpu: Option<Cpu>,
    pub aim: String,
}

impl Row {
    pub fn new(
        measurement: impl Into<String>,
        result: impl Into<String>,
        latencies: Option<&[Duration]>,
    ) -> Row {
        Row {
            measurement: measurement.into(),
            result: result.into(),
            latency: latencies.and_then(summarize),
            cpu: None,
            aim: String::new(),
        }
    }

    pub fn with_cpu(mut self, cpu: Option<Cpu>) -> Row {
        self.cpu = cpu;
        self
    }

    pub fn with_aim(mut self, aim: impl Into<String>) -> Row {
        self.aim = aim.into();
        self
    }

    fn cells(&self) -> [String; 7] {
        let lat = |f: fn(&Summary) -> Duration| {
            self.latency.as_ref().map(|s| fmt_duration(f(s))).unwrap_or_default()
        };
        [
            self.measurement.clone(),
            self.result.clone(),
            lat(|s| s.p50),
            lat(|s| s.p99),
            lat(|s| s.max),
            self.cpu
                .map(|c| {
                    let steal = match c.steal {
                        Some(steal) if steal >= 0.005 => format!(", steal {:.0}%", steal * 100.0),
                        _ => String::new(),
                    };
                    format!("{:.0}% / {:.0}%{steal}", c.server * 100.0, c.bench * 100.0)
                })
                .unwrap_or_default(),
            self.aim.clone(),
        ]
    }
}

const HEADER: [&str; 7] = ["measurement", "result", "p50", "p99", "max", "CPU daemon/bench", "aim"];

/// Columns padded to their widest cell, as `hive bench` prints them.
pub fn render_text(rows: &[Row]) -> String {
    let cells: Vec<[String; 7]> =
        std::iter::once(HEADER.map(String::from)).chain(rows.iter().map(Row::cells)).collect();
    let mut widths = [0; 7];
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &cells {
        let padded: Vec<String> = row.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out += padded.join("  ").trim_end();
        out.push('\n');
    }
    out
}

/// The rows as Markdown, to paste under `hive bench --markdown`'s table.
pub fn render_markdown(rows: &[Row]) -> String {
    let mut out = format!("| {} |\n|{}\n", HEADER.join(" | "), "---|".repeat(HEADER.len()));
    for row in rows {
        out += &format!("| {} |\n", row.cells().map(|c| c.replace('|', "\\|")).join(" | "));
    }
    out
}

/// p50, p99 and max, by nearest rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

pub fn summarize(latencies: &[Duration]) -> Option<Summary> {
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    let at = |p: f64| {
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
    };
    Some(Summary { p50: at(50.0)?, p99: at(99.0)?, max: *sorted.last()? })
}

/// `0.42 ms`, `12.3 ms`, `1.25 s`, as `hive bench` writes them.
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

/// `12,345`.
pub fn fmt_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// CPU used by etcd and by this process during a phase, as shares of one core.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cpu {
    pub server: f64,
    pub bench: f64,
    /// The share of the machine's CPU time its hypervisor gave to others meanwhile.
    pub steal: Option<f64>,
}

/// Measures [`Cpu`] over one phase; without etcd's pid there is nothing to measure.
pub struct CpuMeter {
    server_pid: Option<u32>,
    started: Instant,
    server: Option<Duration>,
    bench: Option<Duration>,
    machine: Option<(u64, u64)>,
}

impl CpuMeter {
    pub fn start(server_pid: Option<u32>) -> CpuMeter {
        let server = server_pid.and_then(|pid| cpu_time(&pid.to_string()));
        CpuMeter {
            server_pid,
            started: Instant::now(),
            server,
            bench: cpu_time("self"),
            machine: machine_ticks(),
        }
    }

    pub fn stop(self) -> Option<Cpu> {
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        let server = cpu_time(&self.server_pid?.to_string())?.checked_sub(self.server?)?;
        let bench = cpu_time("self")?.checked_sub(self.bench?)?;
        let steal = self.machine.zip(machine_ticks()).and_then(|((total0, steal0), (total1, steal1))| {
            let total = total1.checked_sub(total0)?;
            (total > 0).then(|| steal1.saturating_sub(steal0) as f64 / total as f64)
        });
        Some(Cpu { server: server.as_secs_f64() / wall, bench: bench.as_secs_f64() / wall, steal })
    }
}

/// The machine's CPU ticks so far and those its hypervisor stole (`/proc/stat`'s
/// `cpu` line: the sum of its first eight fields, and the eighth), as hive bench reads them.
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    (fields.len() == 8).then(|| (fields.iter().sum(), fields[7]))
}

/// `utime + stime` of `/proc/<pid>/stat`, in ticks of 1/100 s.
fn cpu_time(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some(Duration::from_millis((ticks(14)? + ticks(15)?) * 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_render_in_the_columns_of_hive_bench() {
        let ms = Duration::from_millis;
        let rows = [Row::new("durable puts, 1 client(s)", "10/s", Some(&[ms(1), ms(3)][..]))
            .with_cpu(Some(Cpu { server: 1.0, bench: 0.25, steal: None }))];
        assert_eq!(
            render_markdown(&rows),
            "| measurement | result | p50 | p99 | max | CPU daemon/bench | aim |\n\
             |---|---|---|---|---|---|---|\n\
             | durable puts, 1 client(s) | 10/s | 1.00 ms | 3.00 ms | 3.00 ms | 100% / 25% |  |\n"
        );
        assert_eq!(fmt_count(1_234_567), "1,234,567");
        assert_eq!(summarize(&[]), None);
    }
}
