//! The daemon under test: `hive serve` started from this executable as a child process,
//! its temporary work directory, and the open-file limit a run needs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::api::Endpoint;
use super::meters::{status_kib, Memory};
use super::progress;

/// How long the daemon may take to print its URL (a restart loads every object first).
pub(super) const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the daemon may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// A temporary directory, removed (with everything in it) on drop.
pub(super) struct WorkDir(PathBuf);

impl WorkDir {
    pub(super) fn create(parent: Option<&Path>) -> Result<WorkDir> {
        let parent = parent.map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
        let path = parent.join(format!("hive-bench-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&path)
            .with_context(|| format!("creating a temporary directory in {}", parent.display()))?;
        Ok(WorkDir(path))
    }

    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `hive serve` running as a child process; killed when dropped.
pub(super) struct Daemon {
    pub(super) child: tokio::process::Child,
    pub(super) pid: u32,
    pub(super) endpoint: Endpoint,
    /// Its stderr (warnings and errors only).
    pub(super) log_path: PathBuf,
    /// When it was spawned, and how long after that it printed its URL.
    pub(super) spawned: Instant,
    pub(super) serving_line: Duration,
}

impl Daemon {
    /// Starts `hive serve` on the state in `work` (a new one, or what an earlier start
    /// left there); `generation` counts the starts and names the log.
    pub(super) async fn start(work: &Path, extra: &[String], generation: usize) -> Result<Daemon> {
        let state = work.join("state");
        let log_path = work.join(format!("daemon-{generation}.log"));
        let log =
            std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let exe = std::env::current_exe().context("cannot find this executable to start the daemon")?;
        let spawned = Instant::now();
        let mut child = tokio::process::Command::new(exe)
            // Without the Agent controller: it would give every benchmark Agent a spawn
            // Job, and this measures the API and the store, not agents starting.
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--fleet-listen",
                "127.0.0.1:0",
                "--log",
                "warn",
                "--agent-controller=false",
            ])
            .arg("--state-dir")
            .arg(&state)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start `hive serve`")?;
        let stdout = child.stdout.take().context("the daemon's stdout is not piped")?;
        let mut lines = BufReader::new(stdout).lines();
        let url = tokio::time::timeout(START_TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix("hive: serving ") {
                    return Some(url.to_string());
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        let serving_line = spawned.elapsed();
        let Some(url) = url else {
            let _ = child.kill().await;
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("the daemon did not start within {START_TIMEOUT:?}; its log:\n{log}");
        };
        // The daemon prints to stdout now and then; keep the pipe open and drained.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let kubeconfig = state.join(crate::auth::kubeconfig::FILE_NAME);
        let resolved = crate::auth::kubeconfig::load(&kubeconfig)
            .and_then(|k| k.current())
            .with_context(|| format!("reading the daemon's kubeconfig {}", kubeconfig.display()))?;
        let ca_pem = resolved.ca_pem.context("the daemon's kubeconfig has no CA")?;
        let token = resolved.token.context("the daemon's kubeconfig has no token")?;
        let endpoint = Endpoint { url: url.into(), ca_pem: ca_pem.into(), token: token.into() };
        let pid = child.id().context("the daemon exited at once")?;
        Ok(Daemon { child, pid, endpoint, log_path, spawned, serving_line })
    }

    /// Resident memory now and at its peak, from `/proc/<pid>/status`.
    pub(super) fn memory(&self) -> Result<Memory> {
        let path = format!("/proc/{}/status", self.pid);
        let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let kib = |key| status_kib(&status, key).with_context(|| format!("{path} has no {key}"));
        Ok(Memory { rss_kib: kib("VmRSS")?, hwm_kib: kib("VmHWM")? })
    }

    /// Kills the daemon and passes on what it logged: a warning during a run (a watcher
    /// dropped, a failed commit) changes what the numbers mean.
    pub(super) async fn stop(mut self) {
        let _ = self.child.kill().await;
        self.pass_on_log();
    }

    /// Stops the daemon as a supervisor does, with SIGTERM, and waits for it to exit;
    /// how long that took. Fails (after killing it) when it does not exit in time or
    /// exits with an error.
    pub(super) async fn stop_gracefully(mut self) -> Result<Duration> {
        let started = Instant::now();
        let pid = i32::try_from(self.pid).ok().and_then(rustix::process::Pid::from_raw);
        let pid = pid.context("the daemon's pid is not a pid")?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)
            .context("sending SIGTERM to the daemon")?;
        let exited = tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await;
        self.pass_on_log();
        match exited {
            Ok(Ok(status)) if status.success() => Ok(started.elapsed()),
            Ok(Ok(status)) => bail!("the daemon exited with {status} after SIGTERM"),
            Ok(Err(e)) => Err(e).context("waiting for the daemon to exit"),
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("the daemon did not exit within {STOP_TIMEOUT:?} of SIGTERM")
            }
        }
    }

    fn pass_on_log(&self) {
        let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        if !log.trim().is_empty() {
            let first: Vec<&str> = log.lines().take(5).collect();
            progress(format_args!(
                "the daemon logged {} line(s); the first:\n{}",
                log.lines().count(),
                first.join("\n")
            ));
        }
    }
}

/// The soft limit on open files of this process (the daemon inherits it).
pub(super) fn open_files_limit() -> Result<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").context("reading /proc/self/limits")?;
    parse_open_files(&limits).context("/proc/self/limits has no readable `Max open files` line")
}

pub(super) fn parse_open_files(limits: &str) -> Option<u64> {
    let rest = limits.lines().find_map(|line| line.strip_prefix("Max open files"))?;
    match rest.split_whitespace().next()? {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_files_limit_is_parsed() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_open_files(limits), Some(1024));
        assert_eq!(parse_open_files("Max open files  unlimited  unlimited  files"), Some(u64::MAX));
    }
}
