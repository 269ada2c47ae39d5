//! What a worker measures about its machine: the parsers of `/proc/stat`,
//! `/proc/meminfo` and `nvidia-smi` output (pure, tested on fixed text), the
//! [`Sampler`] that turns successive readings into telemetry values, and the
//! [`RuntimeFacts`] a worker reports when it joins.
//!
//! Disk use comes from `statvfs` of the root filesystem, uptime from `/proc/uptime`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::control::{GpuFact, RuntimeFacts};
use super::telemetry::ChannelDescriptor;

pub use super::telemetry::{
    CPU_PERCENT, DISK_TOTAL, DISK_USED, GPU_MEMORY_TOTAL, GPU_MEMORY_USED, GPU_UTILIZATION, MEMORY_TOTAL,
    MEMORY_USED, UPTIME,
};

/// How long one `nvidia-smi` call may take.
const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(5);

/// The aggregate CPU counters of `/proc/stat`, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks spent doing work (everything but idle and iowait).
    pub busy: u64,
    /// All ticks.
    pub total: u64,
    /// The number of `cpuN` lines (logical CPUs).
    pub cpus: u32,
}

/// Reads the `cpu` line (and counts the `cpuN` lines) of `/proc/stat`.
pub fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let mut times = None;
    let mut cpus = 0;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("cpu") => {
                let values: Vec<u64> = fields.map_while(|f| f.parse().ok()).collect();
                if values.len() < 4 {
                    return None;
                }
                // user nice system idle iowait irq softirq steal (guest time is already
                // counted in user and nice, so it is left out of the total).
                let total: u64 = values.iter().take(8).sum();
                let idle = values[3] + values.get(4).copied().unwrap_or(0);
                times = Some((total.saturating_sub(idle), total));
            }
            Some(name) if name.starts_with("cpu") => cpus += 1,
            _ => {}
        }
    }
    times.map(|(busy, total)| CpuTimes { busy, total, cpus: cpus.max(1) })
}

/// CPU use between two readings, in percent of one core.
pub fn cpu_percent(before: CpuTimes, after: CpuTimes) -> Option<f64> {
    let total = after.total.checked_sub(before.total)?;
    let busy = after.busy.checked_sub(before.busy)?;
    if total == 0 {
        return None;
    }
    Some(busy as f64 / total as f64 * 100.0 * f64::from(after.cpus))
}

/// Memory from `/proc/meminfo`, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// `MemTotal`.
    pub total: u64,
    /// `MemTotal − MemAvailable` (or − `MemFree` on kernels without `MemAvailable`).
    pub used: u64,
}

/// Reads `MemTotal` and `MemAvailable` of `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> Option<Memory> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
            Some(kib * 1024)
        })
    };
    let total = field("MemTotal")?;
    let available = field("MemAvailable").or_else(|| field("MemFree"))?;
    Some(Memory { total, used: total.saturating_sub(available) })
}

/// One GPU as `nvidia-smi` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuReading {
    /// Utilization, in percent.
    pub utilization_percent: f64,
    /// Memory in use, in MiB.
    pub memory_used_mib: u64,
    /// Memory installed, in MiB.
    pub memory_total_mib: u64,
    /// The product name.
    pub name: String,
}

/// The arguments given to `nvidia-smi`; [`parse_nvidia_smi`] reads their output.
pub const NVIDIA_SMI_ARGS: [&str; 2] =
    ["--query-gpu=utilization.gpu,memory.used,memory.total,name", "--format=csv,noheader,nounits"];

/// Reads `utilization.gpu, memory.used, memory.total, name` lines; unreadable lines
/// (e.g. `[N/A]`) are skipped.
pub fn parse_nvidia_smi(text: &str) -> Vec<GpuReading> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(4, ',').map(str::trim);
            Some(GpuReading {
                utilization_percent: fields.next()?.parse().ok()?,
                memory_used_mib: fields.next()?.parse().ok()?,
                memory_total_mib: fields.next()?.parse().ok()?,
                name: fields.next()?.to_string(),
            })
        })
        .collect()
}

/// Runs `nvidia-smi`; `None` when it is absent or fails.
pub async fn read_gpus() -> Option<Vec<GpuReading>> {
    let run = tokio::process::Command::new("nvidia-smi").args(NVIDIA_SMI_ARGS).kill_on_drop(true).output();
    let output = tokio::time::timeout(NVIDIA_SMI_TIMEOUT, run).await.ok()?.ok()?;
    if !output.status.success() {
        return None;
    }
    Some(parse_nvidia_smi(&String::from_utf8_lossy(&output.stdout)))
}

/// The seconds since boot in `/proc/uptime` text (its first number).
pub fn parse_uptime(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok().filter(|s: &f64| s.is_finite() && *s >= 0.0)
}

/// Used and total bytes of the filesystem holding `path`.
pub fn disk_usage(path: &Path) -> Option<(u64, u64)> {
    let st = rustix::fs::statvfs(path).ok()?;
    let block = if st.f_frsize > 0 { st.f_frsize } else { st.f_bsize };
    let total = st.f_blocks.saturating_mul(block);
    let used = st.f_blocks.saturating_sub(st.f_bfree).saturating_mul(block);
    Some((used, total))
}

/// Turns successive readings of one machine into telemetry values.
#[derive(Debug)]
pub struct Sampler {
    proc_root: PathBuf,
    disk: PathBuf,
    gpus: bool,
    last_cpu: Option<CpuTimes>,
}

impl Sampler {
    /// A sampler reading `/proc`; it samples GPUs when `nvidia-smi` answers now. The
    /// first CPU reading is taken here, so the first sample already has `cpu.percent`.
    pub async fn new() -> Sampler {
        let gpus = read_gpus().await.is_some_and(|g| !g.is_empty());
        Sampler::with_root(Path::new("/proc"), gpus)
    }

    /// A sampler reading `proc_root` instead of `/proc` (for tests), with or without GPUs.
    pub fn with_root(proc_root: &Path, gpus: bool) -> Sampler {
        let mut sampler =
            Sampler { proc_root: proc_root.to_path_buf(), disk: PathBuf::from("/"), gpus, last_cpu: None };
        sampler.last_cpu = sampler.read_cpu();
        sampler
    }

    fn read_cpu(&self) -> Option<CpuTimes> {
        parse_proc_stat(&std::fs::read_to_string(self.proc_root.join("stat")).ok()?)
    }

    /// The channels this sampler produces.
    pub fn descriptors(&self) -> Vec<ChannelDescriptor> {
        let mut channels = vec![
            ChannelDescriptor::new(CPU_PERCENT, "percent", "CPU use, in percent of one core"),
            ChannelDescriptor::new(MEMORY_USED, "bytes", "memory in use (total minus available)"),
            ChannelDescriptor::new(MEMORY_TOTAL, "bytes", "memory installed"),
            ChannelDescriptor::new(DISK_USED, "bytes", "space in use on the root filesystem"),
            ChannelDescriptor::new(DISK_TOTAL, "bytes", "size of the root filesystem"),
            ChannelDescriptor::new(UPTIME, "seconds", "time since the machine booted"),
        ];
        if self.gpus {
            channels.extend([
                ChannelDescriptor::new(GPU_UTILIZATION, "percent", "mean utilization over all GPUs"),
                ChannelDescriptor::new(GPU_MEMORY_USED, "bytes", "GPU memory in use, summed over all GPUs"),
                ChannelDescriptor::new(
                    GPU_MEMORY_TOTAL,
                    "bytes",
                    "GPU memory installed, summed over all GPUs",
                ),
            ]);
        }
        channels
    }

    /// One reading of every channel that could be read now.
    pub async fn sample(&mut self) -> Vec<(&'static str, f64)> {
        let mut values = Vec::new();
        let cpu = self.read_cpu();
        if let (Some(before), Some(after)) = (self.last_cpu, cpu) {
            if let Some(percent) = cpu_percent(before, after) {
                values.push((CPU_PERCENT, percent));
            }
        }
        if cpu.is_some() {
            self.last_cpu = cpu;
        }
        let meminfo = std::fs::read_to_string(self.proc_root.join("meminfo")).ok();
        if let Some(memory) = meminfo.as_deref().and_then(parse_meminfo) {
            values.push((MEMORY_USED, memory.used as f64));
            values.push((MEMORY_TOTAL, memory.total as f64));
        }
        if let Some((used, total)) = disk_usage(&self.disk) {
            values.push((DISK_USED, used as f64));
            values.push((DISK_TOTAL, total as f64));
        }
        let uptime = std::fs::read_to_string(self.proc_root.join("uptime")).ok();
        if let Some(seconds) = uptime.as_deref().and_then(parse_uptime) {
            values.push((UPTIME, seconds));
        }
        if self.gpus {
            if let Some(gpus) = read_gpus().await.filter(|g| !g.is_empty()) {
                let mean = gpus.iter().map(|g| g.utilization_percent).sum::<f64>() / gpus.len() as f64;
                let used: u64 = gpus.iter().map(|g| g.memory_used_mib * 1024 * 1024).sum();
                let total: u64 = gpus.iter().map(|g| g.memory_total_mib * 1024 * 1024).sum();
                values.push((GPU_UTILIZATION, mean));
                values.push((GPU_MEMORY_USED, used as f64));
                values.push((GPU_MEMORY_TOTAL, total as f64));
            }
        }
        values
    }
}

/// Gathers the facts a worker reports when it joins or rejoins.
pub async fn runtime_facts(started_at: chrono::DateTime<chrono::Utc>) -> RuntimeFacts {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let memory_total_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .as_deref()
        .and_then(parse_meminfo)
        .map_or(0, |m| m.total);
    let gpus = read_gpus()
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|g| GpuFact { name: g.name, memory_mib: g.memory_total_mib })
        .collect();
    let agent_only = crate::host::env::var("MYELIN_AGENT_ONLY").is_some_and(|v| v == "1");
    RuntimeFacts { hostname, cpus, memory_total_bytes, gpus, agent_only, started_at }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_BEFORE: &str = "cpu  100 0 100 700 100 0 0 0 0 0\n\
        cpu0 50 0 50 350 50 0 0 0 0 0\n\
        cpu1 50 0 50 350 50 0 0 0 0 0\n\
        intr 12345 0 0\nctxt 999\nbtime 1700000000\n";
    const STAT_AFTER: &str = "cpu  250 0 150 800 100 0 0 0 0 0\n\
        cpu0 125 0 75 400 50 0 0 0 0 0\n\
        cpu1 125 0 75 400 50 0 0 0 0 0\n";

    #[test]
    fn proc_stat_counts_busy_ticks_and_cpus() {
        assert_eq!(parse_proc_stat(STAT_BEFORE), Some(CpuTimes { busy: 200, total: 1000, cpus: 2 }));
        assert_eq!(parse_proc_stat(STAT_AFTER), Some(CpuTimes { busy: 400, total: 1300, cpus: 2 }));
        assert_eq!(parse_proc_stat("intr 1 2\n"), None);
        assert_eq!(parse_proc_stat("cpu 1 2\n"), None);
    }

    #[test]
    fn cpu_percent_is_per_core() {
        let before = parse_proc_stat(STAT_BEFORE).unwrap();
        let after = parse_proc_stat(STAT_AFTER).unwrap();
        // 200 busy of 300 ticks over 2 CPUs: 2/3 of the machine, 133% of one core.
        let percent = cpu_percent(before, after).unwrap();
        assert!((percent - 133.333).abs() < 0.01, "{percent}");
        assert_eq!(cpu_percent(before, before), None);
        assert_eq!(cpu_percent(after, before), None);
    }

    #[test]
    fn meminfo_used_is_total_minus_available() {
        let text = "MemTotal:       16318460 kB\nMemFree:         1000000 kB\n\
            MemAvailable:   12000000 kB\nBuffers:          500000 kB\n";
        let memory = parse_meminfo(text).unwrap();
        assert_eq!(memory.total, 16318460 * 1024);
        assert_eq!(memory.used, (16318460 - 12000000) * 1024);
        let old_kernel = "MemTotal: 2000 kB\nMemFree: 500 kB\n";
        assert_eq!(parse_meminfo(old_kernel), Some(Memory { total: 2000 * 1024, used: 1500 * 1024 }));
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn nvidia_smi_lines_become_readings_and_bad_lines_are_skipped() {
        let text =
            "37, 1024, 81920, NVIDIA A100-SXM4-80GB\n[N/A], 0, 1, Broken\n0, 5, 24576, NVIDIA L4, rev b\n";
        let gpus = parse_nvidia_smi(text);
        assert_eq!(gpus.len(), 2);
        assert_eq!(
            gpus[0],
            GpuReading {
                utilization_percent: 37.0,
                memory_used_mib: 1024,
                memory_total_mib: 81920,
                name: "NVIDIA A100-SXM4-80GB".into()
            }
        );
        assert_eq!(gpus[1].name, "NVIDIA L4, rev b");
        assert!(parse_nvidia_smi("").is_empty());
    }

    #[tokio::test]
    async fn a_sampler_over_a_fixed_proc_reports_the_delta() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stat"), STAT_BEFORE).unwrap();
        std::fs::write(dir.path().join("meminfo"), "MemTotal: 4000 kB\nMemAvailable: 1000 kB\n").unwrap();
        std::fs::write(dir.path().join("uptime"), "3600.25 7000.50\n").unwrap();
        let mut sampler = Sampler::with_root(dir.path(), false);
        std::fs::write(dir.path().join("stat"), STAT_AFTER).unwrap();
        let values = sampler.sample().await;
        let names: Vec<&str> = values.iter().map(|(c, _)| *c).collect();
        let all = [CPU_PERCENT, MEMORY_USED, MEMORY_TOTAL, DISK_USED, DISK_TOTAL, UPTIME];
        assert_eq!(names, all);
        assert_eq!(values[1].1, 3000.0 * 1024.0);
        // The root filesystem of this machine: some space used, less than its size.
        assert!(values[3].1 > 0.0 && values[3].1 <= values[4].1, "{values:?}");
        assert_eq!(values[5].1, 3600.25);
        let described: Vec<String> = sampler.descriptors().into_iter().map(|d| d.channel).collect();
        assert_eq!(described, all);
    }

    #[test]
    fn uptime_is_the_first_number() {
        assert_eq!(parse_uptime("12.5 40.0\n"), Some(12.5));
        assert_eq!(parse_uptime(""), None);
        assert_eq!(parse_uptime("-3 1"), None);
        assert_eq!(parse_uptime("up 1"), None);
    }
}
