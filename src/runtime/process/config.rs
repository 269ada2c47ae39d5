//! Settings of the process runtime: where agents live and its timeouts and bounds.

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
        }
    }
}
