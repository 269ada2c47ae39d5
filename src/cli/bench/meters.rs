//! What the bench reads from `/proc` and the disk beside the phases: CPU time of the
//! daemon and of this process, resident memory, and the cost of one `fdatasync`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use super::units::fmt_bytes;

/// CPU time used by the daemon and by this process while one phase ran, as a share of
/// one core (1.0 = one core busy the whole time; this machine's maximum is its core
/// count). Tells whether a phase was limited by CPU or by waiting (fsync). `steal` is
/// the share of the machine's CPU time its hypervisor gave to others meanwhile
/// (`/proc/stat`): on a shared VM, the cores a phase did not get.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Cpu {
    pub(super) daemon: f64,
    pub(super) bench: f64,
    pub(super) steal: Option<f64>,
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.0}% / {:.0}%", self.daemon * 100.0, self.bench * 100.0)?;
        match self.steal {
            Some(steal) if steal >= 0.005 => write!(f, ", steal {:.0}%", steal * 100.0),
            _ => Ok(()),
        }
    }
}

/// Starts measuring [`Cpu`] for one phase.
pub(super) struct CpuMeter {
    pub(super) daemon_pid: u32,
    pub(super) started: Instant,
    pub(super) daemon: Option<Duration>,
    pub(super) bench: Option<Duration>,
    pub(super) machine: Option<MachineTicks>,
}

impl CpuMeter {
    pub(super) fn start(daemon_pid: u32) -> CpuMeter {
        let daemon = cpu_time(&daemon_pid.to_string());
        let machine = MachineTicks::read();
        CpuMeter { daemon_pid, started: Instant::now(), daemon, bench: cpu_time("self"), machine }
    }

    /// `None` when `/proc` cannot tell (not Linux, or the daemon is gone).
    pub(super) fn stop(self) -> Option<Cpu> {
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        let daemon = cpu_time(&self.daemon_pid.to_string())?.checked_sub(self.daemon?)?;
        let bench = cpu_time("self")?.checked_sub(self.bench?)?;
        let steal =
            self.machine.zip(MachineTicks::read()).and_then(|(before, after)| after.steal_since(&before));
        Some(Cpu { daemon: daemon.as_secs_f64() / wall, bench: bench.as_secs_f64() / wall, steal })
    }
}

/// The machine's CPU time so far, from the first line of `/proc/stat`: all of it and
/// what the hypervisor stole, in ticks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct MachineTicks {
    total: u64,
    steal: u64,
}

impl MachineTicks {
    fn read() -> Option<MachineTicks> {
        parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The share of the machine's CPU time stolen since `before`.
    fn steal_since(&self, before: &MachineTicks) -> Option<f64> {
        let total = self.total.checked_sub(before.total)?;
        let steal = self.steal.checked_sub(before.steal)?;
        (total > 0).then(|| steal as f64 / total as f64)
    }
}

/// `cpu  user nice system idle iowait irq softirq steal …`: the sum of the first eight
/// fields, and the eighth.
pub(super) fn parse_proc_stat(stat: &str) -> Option<MachineTicks> {
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    (fields.len() == 8).then(|| MachineTicks { total: fields.iter().sum(), steal: fields[7] })
}

/// User plus system CPU time of every thread of process `pid` (or `self`) so far.
pub(super) fn cpu_time(pid: &str) -> Option<Duration> {
    parse_stat_cpu(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `utime + stime` of a `/proc/<pid>/stat` line. They count clock ticks of 1/100 s:
/// `USER_HZ` is 100 on every Linux architecture hive runs on.
pub(super) fn parse_stat_cpu(stat: &str) -> Option<Duration> {
    // The command name (field 2) may hold spaces; fields after its `)` start at 3.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some(Duration::from_millis((ticks(14)? + ticks(15)?) * 10))
}

/// A process's resident set size, now and at its peak.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Memory {
    pub(super) rss_kib: u64,
    pub(super) hwm_kib: u64,
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VmRSS {:.0} MiB (peak {:.0} MiB)",
            self.rss_kib as f64 / 1024.0,
            self.hwm_kib as f64 / 1024.0
        )
    }
}

/// The kB value of `key` in a `/proc/<pid>/status` text (`VmRSS:   123 kB`).
pub(super) fn status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The daemon's resident memory per object, above what it held idle after its first
/// start, and the average size of one object's JSON (a full list's bytes per item):
/// what is beyond the JSON is the cost of how the daemon holds an object.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct PerObject {
    /// (VmRSS − VmRSS idle) / objects, in bytes.
    pub(super) bytes: f64,
    /// List body bytes / items.
    pub(super) json: f64,
}

impl PerObject {
    /// `None` without objects.
    pub(super) fn new(
        rss: &Memory,
        idle: &Memory,
        listed_items: usize,
        list_bytes: usize,
    ) -> Option<PerObject> {
        (listed_items > 0).then(|| {
            let above = rss.rss_kib as f64 * 1024.0 - idle.rss_kib as f64 * 1024.0;
            PerObject { bytes: above / listed_items as f64, json: list_bytes as f64 / listed_items as f64 }
        })
    }

    pub(super) fn beyond_json(&self) -> f64 {
        self.bytes - self.json
    }
}

impl std::fmt::Display for PerObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/object, {} beyond its {} of JSON",
            fmt_bytes(self.bytes),
            fmt_bytes(self.beyond_json()),
            fmt_bytes(self.json)
        )
    }
}

/// `n` writes of 4 KiB at offset 0 of one file, each followed by `fdatasync`: the floor
/// under any durable commit on this disk.
pub(super) fn fdatasync_latencies(dir: &Path, n: usize) -> Result<Vec<Duration>> {
    use std::io::{Seek, SeekFrom, Write};
    let path = dir.join("fdatasync-bench");
    let mut file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let block = [b'x'; 4096];
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&block)?;
        file.sync_data().with_context(|| format!("fdatasync of {}", path.display()))?;
        latencies.push(started.elapsed());
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    Ok(latencies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_parsed() {
        let status = "Name:\thive\nVmHWM:\t  20480 kB\nVmRSS:\t  10240 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(10240));
        assert_eq!(status_kib(status, "VmHWM"), Some(20480));
        assert_eq!(status_kib(status, "VmSwap"), None);
        let memory = Memory { rss_kib: 10240, hwm_kib: 20480 };
        assert_eq!(memory.to_string(), "VmRSS 10 MiB (peak 20 MiB)");
        let stat = "4242 (hive serve) S 1 4242 4242 0 -1 4194560 900 0 0 0 150 25 0 0 20 0 9 0 77 0 0";
        assert_eq!(parse_stat_cpu(stat), Some(Duration::from_millis(1750)));
        assert_eq!(Cpu { daemon: 1.354, bench: 0.5, steal: None }.to_string(), "135% / 50%");
        assert_eq!(Cpu { daemon: 1.0, bench: 0.5, steal: Some(0.172) }.to_string(), "100% / 50%, steal 17%");
        assert_eq!(Cpu { daemon: 1.0, bench: 0.5, steal: Some(0.001) }.to_string(), "100% / 50%");
        let before = parse_proc_stat("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 1 2 3\n").unwrap();
        let after = parse_proc_stat("cpu  200 0 100 900 10 0 10 80 0 0\n").unwrap();
        assert_eq!(after.steal_since(&before), Some(45.0 / 300.0));
        assert_eq!(parse_proc_stat("cpu0 1 2 3"), None);
        assert_eq!(parse_proc_stat("cpu  1 2 x 4 5 6 7 8"), None);
    }

    #[test]
    fn memory_per_object_is_above_idle_and_beyond_the_json() {
        let mib = |n: u64| Memory { rss_kib: n * 1024, hwm_kib: n * 1024 };
        // 100,000 objects took 1,000 MiB above an idle 50 MiB; each is 700 B of JSON.
        let per = PerObject::new(&mib(1050), &mib(50), 100_000, 70_000_000).unwrap();
        assert_eq!(per.bytes, 1000.0 * 1024.0 * 1024.0 / 100_000.0);
        assert_eq!(per.json, 700.0);
        assert_eq!(per.beyond_json(), per.bytes - 700.0);
        assert_eq!(per.to_string(), "10.2 KiB/object, 9.6 KiB beyond its 700 B of JSON");
        // A daemon that gave memory back shows it as negative, not as a wrapped number.
        let shrunk = PerObject::new(&mib(40), &mib(50), 10, 1000).unwrap();
        assert!(shrunk.bytes < 0.0);
        assert_eq!(PerObject::new(&mib(60), &mib(50), 0, 0), None);
    }
}
