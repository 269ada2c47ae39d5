//! Recovery at daemon start: agent processes an earlier daemon left running.

use std::fs;

use rustix::process::Signal;

use super::generation::PID_FILE;
use super::supervisor::{self, signal_group};
use super::ProcessRuntime;

impl ProcessRuntime {
    /// Kills the process groups of agents left running by an earlier daemon, found
    /// through their `pid` files (`<pid> <start ticks>`). Such a process lost its log
    /// pipe and its supervisor, so it is not adopted: it is killed, and the boot
    /// reconcile starts again what is wanted. A pid whose recorded start time no longer
    /// matches belongs to another process now and is left alone. Call once at daemon
    /// start, before any start. Returns the agents and pids it killed.
    pub fn kill_orphans(&self) -> Vec<(String, u32)> {
        let mut killed = Vec::new();
        for entry in fs::read_dir(&self.inner.config.root).into_iter().flatten().flatten() {
            let Ok(name) = entry.file_name().into_string() else { continue };
            let pid_file = entry.path().join(PID_FILE);
            let Ok(text) = fs::read_to_string(&pid_file) else { continue };
            let mut fields = text.split_whitespace().map(str::parse::<u64>);
            if let (Some(Ok(pid)), Some(Ok(ticks))) = (fields.next(), fields.next()) {
                let pid = u32::try_from(pid).unwrap_or(0);
                if pid > 1 && supervisor::start_ticks(pid) == Some(ticks) {
                    match signal_group(pid, Signal::KILL) {
                        Ok(()) => {
                            tracing::warn!(agent = %name, pid, "killed an agent left running by an earlier daemon");
                            killed.push((name, pid));
                        }
                        Err(error) => {
                            tracing::warn!(agent = %name, pid, %error, "cannot kill orphaned agent")
                        }
                    }
                }
            }
            let _ = fs::remove_file(&pid_file);
        }
        killed
    }
}
