//! Supervising one agent process: spawning it in its own process group with its output
//! piped into the rotating log, a task that awaits the child so an exit is noticed the
//! moment the kernel reports it (no polling), and process-group signals.
//!
//! Signals go through `rustix::process::kill_process_group` (the `kill(2)` syscall with
//! a negative pid): `rustix` with only its `process` feature is small and safe, where
//! `nix` is large and shelling out to `kill(1)` costs a fork per signal and loses the
//! error kind (`ESRCH` is "already gone", not a failure).
//!
//! An agent whose limits are enforced joins its cgroup before any of its code runs:
//! it is spawned as `/bin/sh -c 'echo $$ >> <cgroup.procs> && exec <command>'`, so the
//! process writes its own pid (the agent's pid, as `exec` keeps it) and only then
//! becomes the agent. A `pre_exec` hook would do the same without the shell, but it is
//! `unsafe`, and the workspace forbids `unsafe_code`. When the join fails, the shell
//! says why in the agent's log and exits [`CGROUP_JOIN_FAILED`] before the command
//! runs, so the agent never runs outside its limits.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::sync::watch;

use super::log_format::{self, Stream};
use super::logs::RotatingLog;
use crate::runtime::{Error, Exit, Generation, Result};

/// A running agent process, as its supervisor task sees it.
#[derive(Clone, Debug)]
pub struct Running {
    /// Pid of the main process; also the process group id.
    pub pid: u32,
    /// When it was spawned.
    pub since: DateTime<Utc>,
    /// Its start time in clock ticks after boot ([`start_ticks`]), read while the
    /// supervisor still held it unreaped: with `pid` it names this process and no later
    /// one that reuses the pid.
    pub start_ticks: Option<u64>,
    /// The generation it runs.
    pub generation: Option<Generation>,
    /// Set before the runtime signals it to stop, so its exit counts as requested.
    pub stop_requested: Arc<AtomicBool>,
    /// Becomes `Some` once the supervisor has reaped it.
    pub exited: watch::Receiver<Option<Exit>>,
}

impl Running {
    /// Waits up to `within` for the process to be reaped; its exit, or `None` when it
    /// still runs.
    pub async fn wait_exit(&self, within: Duration) -> Option<Exit> {
        let mut exited = self.exited.clone();
        let waited = tokio::time::timeout(within, exited.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(exit)) => exit.clone(),
            _ => None,
        }
    }
}

/// What to spawn.
pub struct SpawnRequest<'a> {
    /// The agent's name (`HIVE_AGENT`).
    pub agent: &'a str,
    /// Program and arguments.
    pub argv: &'a [String],
    /// Working directory.
    pub dir: &'a Path,
    /// Environment of the agent, on top of the daemon's.
    pub env: &'a BTreeMap<String, String>,
    /// The fence file (`HIVE_FENCE`).
    pub fence: &'a Path,
    /// The agent's log directory.
    pub logs: &'a Path,
    /// Size bound of one log file.
    pub log_max_bytes: u64,
    /// Number of log files kept.
    pub log_files: usize,
    /// The generation being started.
    pub generation: Option<Generation>,
    /// `cgroup.procs` of the agent's cgroup when its limits are enforced: the process
    /// joins it before it runs the command.
    pub cgroup_procs: Option<&'a Path>,
    /// Ticked after each append to the log, for the readers following it.
    pub appended: watch::Sender<()>,
    /// The daemon's state directory, written as `$STATE_DIR` in the stderr lines an
    /// exit carries ([`Exit::stderr`]).
    pub state_dir: Option<&'a Path>,
}

/// How much of its stderr the supervisor keeps in memory for the exit's last lines:
/// twice what `status.lastExit` keeps, so lines cut at the start of the window are
/// whole by the time the tail is bounded again.
const STDERR_KEPT: usize = 2 * hive_api::agent::LAST_EXIT_BYTES;

/// The newest bytes the agent wrote to stderr, at most [`STDERR_KEPT`].
#[derive(Default)]
struct StderrTail(Mutex<std::collections::VecDeque<u8>>);

impl StderrTail {
    fn push(&self, bytes: &[u8]) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.extend(bytes.iter().rev().take(STDERR_KEPT).rev());
        let over = kept.len().saturating_sub(STDERR_KEPT);
        kept.drain(..over);
    }

    fn lines(&self, state_dir: Option<&str>) -> Vec<String> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (front, back) = kept.as_slices();
        let text = String::from_utf8_lossy(&[front, back].concat()).into_owned();
        hive_api::agent::stderr_tail(&text, state_dir)
    }
}

/// How long the supervisor waits, after the process group is gone, for the stderr pipe
/// to drain (a process that left the group may hold it open).
const STDERR_DRAIN: Duration = Duration::from_millis(250);

/// The exit code of an agent process that could not join its cgroup (and so never ran
/// its command).
pub const CGROUP_JOIN_FAILED: i32 = 125;

/// The shell that joins the cgroup named by `$0`, then becomes the command `$@`.
/// (`exit 125` is [`CGROUP_JOIN_FAILED`].)
const JOIN_CGROUP: &str = concat!(
    r#"if ! echo $$ >> "$0"; then "#,
    r#"echo "hive: cannot join the agent's cgroup ($0); not starting it outside its limits" >&2; "#,
    r#"exit 125; fi; exec "$@""#,
);

/// Spawns the agent process and its supervisor task. `on_exit` runs in that task once
/// the process is reaped and its remaining group killed, before the exit is published
/// on [`Running::exited`], so whoever waits there sees the runtime's state updated.
pub fn spawn(request: SpawnRequest<'_>, on_exit: impl FnOnce(Exit) + Send + 'static) -> Result<Running> {
    let SpawnRequest {
        agent,
        argv,
        dir,
        env,
        fence,
        logs,
        log_max_bytes,
        log_files,
        generation,
        cgroup_procs,
        appended,
        state_dir,
    } = request;
    let state_dir = state_dir.map(|d| d.to_string_lossy().into_owned());
    let command = argv.join(" ");
    let log = RotatingLog::open(logs, log_max_bytes, log_files).map_err(|source| Error::Io {
        agent: agent.into(),
        action: "cannot open log in",
        path: logs.into(),
        source,
    })?;
    let log = Arc::new(Log { file: Mutex::new(log), appended });
    let mut command_line = match cgroup_procs {
        Some(procs) => {
            let mut shell = Command::new("/bin/sh");
            shell.arg("-c").arg(JOIN_CGROUP).arg(procs).args(argv);
            shell
        }
        None => {
            let mut plain = Command::new(&argv[0]);
            plain.args(&argv[1..]);
            plain
        }
    };
    let mut child = command_line
        .current_dir(dir)
        .envs(env)
        .env("HIVE_AGENT", agent)
        .env("HIVE_FENCE", fence)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so stop and kill reach every process it started.
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn { agent: agent.into(), command, dir: dir.into(), source })?;
    let pid = child.id().expect("a freshly spawned child has a pid");
    // Unreaped, the pid is still this child's.
    let start_ticks = start_ticks(pid);
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    // The run's mark goes in before anything it prints, so `--previous` can tell runs apart.
    let mark = match &generation {
        Some(generation) => format!("pid {pid} generation {}", generation.id),
        None => format!("pid {pid}"),
    };
    append(&log, &log_format::encode(crate::host::now(), Stream::Run, mark.as_bytes()));
    let stderr_tail = Arc::new(StderrTail::default());
    tokio::spawn(pump(stdout, Stream::Stdout, log.clone(), None));
    let stderr_pump = tokio::spawn(pump(stderr, Stream::Stderr, log, Some(stderr_tail.clone())));
    let stop_requested = Arc::new(AtomicBool::new(false));
    let (tx, exited) = watch::channel(None);
    let requested = stop_requested.clone();
    tokio::spawn(async move {
        let status = child.wait().await;
        // Leftovers of the group (children of a crashed harness) go with it.
        let _ = signal_group(pid, Signal::KILL);
        let (code, signal) = match status {
            Ok(status) => (status.code(), status.signal()),
            Err(_) => (None, None),
        };
        let at = crate::host::now();
        // What it printed last, once the pipe drained (bounded: a survivor of the group
        // may hold it open).
        let _ = tokio::time::timeout(STDERR_DRAIN, stderr_pump).await;
        let stderr = stderr_tail.lines(state_dir.as_deref());
        let exit = Exit { code, signal, at, requested: requested.load(Ordering::SeqCst), stderr };
        on_exit(exit.clone());
        let _ = tx.send(Some(exit));
    });
    Ok(Running { pid, since: crate::host::now(), start_ticks, generation, stop_requested, exited })
}

/// Copies everything `reader` yields into the log until end of file, each line stamped
/// with the time it was read and `stream` (see `log_format.rs`), and into `tail` when
/// given.
async fn pump(
    mut reader: impl AsyncRead + Unpin,
    stream: Stream,
    log: Arc<Log>,
    tail: Option<Arc<StderrTail>>,
) {
    let mut buf = vec![0; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if let Some(tail) = &tail {
                    tail.push(&buf[..n]);
                }
                append(&log, &log_format::encode(crate::host::now(), stream, &buf[..n]))
            }
        }
    }
}

/// The agent's log as its two pumps share it.
struct Log {
    file: Mutex<RotatingLog>,
    appended: watch::Sender<()>,
}

fn append(log: &Log, entries: &[u8]) {
    let written = log.file.lock().unwrap_or_else(|e| e.into_inner()).write(entries);
    if let Err(error) = written {
        tracing::warn!(%error, "cannot write agent log");
    }
    // Written (or not) in full: a follower reads to the end of the file.
    log.appended.send_replace(());
}

/// Sends `signal` to process group `pgid`; a group that is already gone is fine. (The
/// one signal for a single process, the fence kick, goes through [`super::kick`].)
pub fn signal_group(pgid: u32, signal: Signal) -> io::Result<()> {
    let Some(pid) = i32::try_from(pgid).ok().and_then(Pid::from_raw) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a valid pid"));
    };
    match rustix::process::kill_process_group(pid, signal) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(errno) => Err(errno.into()),
    }
}

/// The start time of process `pid` in clock ticks after boot (field 22 of
/// `/proc/<pid>/stat`): with the pid it identifies one process, so a pid reused by a
/// later process is told apart. `None` when the process is gone (or there is no
/// `/proc`).
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; what follows the
    // last `)` is plain space-separated fields, starting with field 3.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split(' ').nth(19)?.parse().ok()
}

/// The signal error of `agent` for `pid`.
pub fn signal_error(agent: &str, signal: &'static str, pid: u32, source: io::Error) -> Error {
    Error::Signal { agent: agent.into(), signal, pid, source }
}

/// The working directory of a generation: its tree, or `config.dir` inside it.
pub fn workdir(generation_dir: &Path, subdir: Option<&str>) -> PathBuf {
    match subdir {
        Some(sub) => generation_dir.join(sub),
        None => generation_dir.to_path_buf(),
    }
}
