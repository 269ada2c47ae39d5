//! Settings of the process runtime: where agents live, its timeouts and bounds, and the
//! hive-wide resource limits with where it enforces them.

use std::path::PathBuf;
use std::time::Duration;

/// Settings of the process runtime.
#[derive(Clone, Debug)]
pub struct ProcessConfig {
    /// Where agents live; the daemon passes `<state-dir>/agents`.
    pub root: PathBuf,
    /// Graceful-stop timeout when the agent sets no `spec.runtime.gracefulStopSeconds`:
    /// how long drain waits for the fence and stop waits after SIGTERM. Default 3 min.
    pub graceful_stop: Duration,
    /// A started process that exits within this time has failed to start (and gets
    /// the cold-start fallback). Default 1 s.
    pub start_grace: Duration,
    /// How long to wait for a process group to vanish after SIGKILL. Default 10 s.
    pub kill_wait: Duration,
    /// Complete generations kept per agent (the current one is never pruned).
    /// Default 3.
    pub keep_generations: usize,
    /// Size bound of one log file. Default 5 MiB.
    pub log_max_bytes: u64,
    /// Log files kept per agent, the live one included. Default 2.
    pub log_files: usize,
    /// The hive-wide CPU cap (`agentCpuQuota`), for agents whose `spec.resources` sets
    /// none: a percentage of one core. Default `200%`.
    pub default_cpu_quota: String,
    /// The hive-wide memory cap (`agentMemoryMax`), for agents whose `spec.resources`
    /// sets none: bytes with an optional K, M, G or T suffix, or `infinity`. Default `4G`.
    pub default_memory_max: String,
    /// Where the cgroup v2 hierarchy is mounted. Default `/sys/fs/cgroup`; tests point it
    /// at a tree of plain files laid out the same way.
    pub cgroup_root: PathBuf,
    /// Where the daemon reads its own cgroup (the `0::<path>` line). Default
    /// `/proc/self/cgroup`.
    pub self_cgroup: PathBuf,
}

impl ProcessConfig {
    /// The defaults, with agents under `root`.
    pub fn new(root: impl Into<PathBuf>) -> ProcessConfig {
        ProcessConfig {
            root: root.into(),
            graceful_stop: Duration::from_secs(180),
            start_grace: Duration::from_secs(1),
            kill_wait: Duration::from_secs(10),
            keep_generations: 3,
            log_max_bytes: 5 << 20,
            log_files: 2,
            default_cpu_quota: "200%".into(),
            default_memory_max: "4G".into(),
            cgroup_root: "/sys/fs/cgroup".into(),
            self_cgroup: "/proc/self/cgroup".into(),
        }
    }
}
