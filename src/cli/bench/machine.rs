//! The machine a run is on, recorded beside its results.

use super::meters::status_kib;

/// The machine a run is on, for the record.
pub(super) struct Machine {
    pub(super) date: String,
    pub(super) cpus: usize,
    pub(super) cpu: String,
    pub(super) memory: String,
    pub(super) kernel: String,
    pub(super) load: String,
}

impl Machine {
    pub(super) fn read() -> Machine {
        let read = |path| std::fs::read_to_string(path).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, v)| v.trim().to_string()));
        let memory = status_kib(&read("/proc/meminfo"), "MemTotal")
            .map(|kib| format!("{:.1} GiB memory", kib as f64 / 1024.0 / 1024.0));
        Machine {
            date: crate::host::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu: cpu.unwrap_or_else(|| "unknown CPU".into()),
            memory: memory.unwrap_or_else(|| "unknown memory".into()),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            load: Machine::load_average(),
        }
    }

    /// The first three fields of `/proc/loadavg`.
    pub(super) fn load_average() -> String {
        let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    }
}
