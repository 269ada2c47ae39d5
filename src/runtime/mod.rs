//! Runtime drivers: the one trait for the node primitives the scheduler runs against an
//! agent (prebuild, stop-for-update, swap, create, start with the cold-start fallback,
//! stop, kill, signal, drain, write limits, write permissions, is-running, observed),
//! the observed snapshot they publish, and the drivers themselves (`process`, the
//! embedded default).
//!
//! The trait is shaped after the coordinator document's container lifecycle so the
//! `nixos-container` driver maps onto it one call per command: [`Runtime::prebuild`] ≈
//! `nix build <meta>#nixosConfigurations.<name>.config.system.build.toplevel` (the
//! returned [`Generation::id`] is then the toplevel store path), [`Runtime::swap`] ≈
//! `nixos-container update <name> --flake <meta>#<name>`, [`Runtime::create`] ≈
//! `nixos-container create`, [`Runtime::start`] / [`Runtime::stop`] ≈
//! `nixos-container start|stop`, [`Runtime::kill`] ≈ `systemctl kill --signal=KILL
//! container@<name>`, [`Runtime::write_limits`] ≈ the `CPUQuota=`/`MemoryMax=` drop-in
//! plus `systemctl daemon-reload`. Every input is the [`Agent`] object itself, so a
//! driver reads the settings block of its own `spec.runtime.type`.
//!
//! Methods return boxed futures so a daemon can hold drivers as `Arc<dyn Runtime>` and
//! pick one per agent by `spec.runtime.type`.

pub mod nixos;
pub mod placed;
pub mod process;
pub mod usage;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use hive_api::agent::{Agent, Power};
use tokio::sync::broadcast;

/// A runtime result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The node primitives of DESIGN.md ("Runtime drivers"), one method each. Every
/// method names the agent it acts on through the [`Agent`] object (its
/// `metadata.name` and `spec`). Implementations serialize nothing across agents; the
/// scheduler's per-agent lease serializes the container-affecting calls of one agent.
pub trait Runtime: Send + Sync {
    /// Materializes the agent's wanted config (`spec.config.repo` at `spec.config.rev`)
    /// into a NEW generation and builds it, while the current generation keeps running.
    /// Build output goes to `log` line by line. A failure leaves no half-built
    /// generation and never touches the running agent.
    fn prebuild<'a>(&'a self, agent: &'a Agent, log: &'a dyn BuildLog) -> BoxFuture<'a, Result<Generation>>;

    /// Stops the agent for a generation swap: a plain stop that never touches the
    /// power intent. A no-op when the agent is already stopped.
    fn stop_for_update<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>>;

    /// Makes a prebuilt generation the agent's current one, atomically. The agent must
    /// be stopped ([`Error::NotStopped`] otherwise).
    fn swap<'a>(&'a self, agent: &'a Agent, generation: &'a Generation) -> BoxFuture<'a, Result<()>>;

    /// First spawn: materializes, builds and installs the agent's first generation as
    /// current, without starting it. Atomic: a failed create leaves nothing behind.
    fn create<'a>(&'a self, agent: &'a Agent, log: &'a dyn BuildLog) -> BoxFuture<'a, Result<Generation>>;

    /// Starts the agent on its current generation, with the cold-start fallback
    /// ([`Fallback::ColdStart`]): Reconcile's start, which may follow an update.
    fn start<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Started>> {
        self.start_with(agent, Fallback::ColdStart)
    }

    /// Starts the agent on its current generation. With [`Fallback::ColdStart`], when
    /// the start fails the agent is stopped gracefully, killed, and started clean once
    /// more; if that fails too, [`Error::ColdStart`] carries both errors. With
    /// [`Fallback::Never`] a failed start is the one attempt's error. A no-op returning
    /// the running pid when the agent already runs.
    fn start_with<'a>(&'a self, agent: &'a Agent, fallback: Fallback) -> BoxFuture<'a, Result<Started>>;

    /// Graceful stop: SIGTERM to the agent's process group, then SIGKILL once the
    /// graceful-stop timeout (`spec.runtime.gracefulStopSeconds`, else the driver's
    /// default) has passed. A no-op when the agent is stopped.
    fn stop<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>>;

    /// SIGKILL to the agent's whole process group, without a graceful phase. A no-op
    /// when the agent is stopped.
    fn kill<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>>;

    /// Sets the graceful fence and kicks the agent's harness so it runs one
    /// stop-checkpoint turn and clears the fence. The kick ([`process::FENCE_SIGNAL`],
    /// SIGUSR1) is only a wake-up: it is sent only to a main process that catches or
    /// ignores it, since its default action ends the process; an agent that does not
    /// handle it is left to find the fence file itself, or to be stopped once the drain
    /// runs out. Says whether the harness was kicked.
    fn signal<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Kick>>;

    /// Waits for the harness to clear the fence, bounded by the graceful-stop timeout.
    /// Resolves `Ok` either way and says which happened.
    fn drain<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Drain>>;

    /// Writes the agent's resource limits (`spec.resources`, else the hive-wide
    /// defaults) where the driver applies them: a systemd drop-in plus daemon-reload for
    /// containers; the agent's own cgroup v2 (`cpu.max`, `memory.max`) for processes.
    /// Says whether they are enforced; a driver that cannot enforce them returns
    /// [`Limits::enforced`] false with the reason, never silently ignores them.
    fn write_limits<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Limits>>;

    /// Writes the agent's permissions (`spec.permissions`) where its harness reads them.
    fn write_permissions<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>>;

    /// Whether the agent runs right now.
    fn is_running<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<bool>>;

    /// The observed snapshot of the agent: running, pid, current generation, since
    /// when, and how it last exited.
    fn observed<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Observed>>;

    /// Removes everything the runtime keeps for a deleted agent (after stopping it):
    /// generations, logs, fence. A no-op for an unknown agent.
    fn destroy<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>>;

    /// Observed changes (starts, exits, swaps, destroys) of every agent this runtime
    /// runs, as they happen. Exits are published the moment the runtime reaps them.
    /// A subscriber that falls behind the channel's buffer gets `Lagged` and should
    /// re-read [`Runtime::observed`] for the agents it tracks.
    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent>;

    /// Whether the agent has a built, installed generation (a process agent's `current`
    /// link; a container's `/etc/nixos-containers/<c>.conf`, which `create` writes).
    fn installed(&self, agent: &str) -> bool;

    /// Every agent with an installed generation on this host, from one listing (the
    /// boot sweep asks once instead of [`Runtime::installed`] per stored Agent, which at
    /// a million of them was most of the start); `None` when the runtime can only be
    /// asked agent by agent.
    fn installed_here(&self) -> Option<std::collections::BTreeSet<String>> {
        None
    }

    /// Whether the agent runs, as this runtime observes it now: no IO, so the submit
    /// layer and the controllers can ask on every decision.
    fn running_now(&self, agent: &str) -> bool;

    /// The agent's output (stdout and stderr): what it printed so far (its last `tail`
    /// lines, when given), then, with `follow`, what it prints next, until the receiver
    /// is dropped. A runtime whose output lives elsewhere says where, as an error.
    fn logs<'a>(&'a self, agent: &'a str, options: LogOptions) -> BoxFuture<'a, Result<LogStream>>;

    /// Takes over at daemon start, for the stored agents (`agents` lists them, decoding
    /// every one, so only a runtime that needs them calls it): the process runtime kills
    /// the processes a previous daemon left (they lost their supervisor and log pipe); the
    /// container runtime asks systemd once about each agent and starts its rescan.
    fn attach<'a>(&'a self, agents: &'a (dyn Fn() -> Vec<Agent> + Send + Sync)) -> BoxFuture<'a, ()>;

    /// Whether [`Runtime::installed`] and [`Runtime::running_now`] can answer for `agent`
    /// now: always for a local driver; for a fleet node's, once its worker was reached
    /// and listed its agents. An `Err` says what is awaited; the Agent controller decides
    /// nothing for the agent meanwhile.
    fn answerable(&self, _agent: &Agent) -> std::result::Result<(), Unanswerable> {
        Ok(())
    }

    /// Whether agents keep running when the daemon stops (containers, systemd units) or
    /// are stopped with it (processes, which a next daemon cannot adopt).
    fn agents_outlive_daemon(&self) -> bool;
}

/// Why a runtime cannot answer for an agent yet ([`Runtime::answerable`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unanswerable {
    /// Not yet: its node is coming up, or its worker has not been reached since the
    /// daemon started. Nothing is known of the agent, nothing is concluded.
    Waiting(String),
    /// Its node is gone (killed, stopped, failed, deleted) or stopped answering: what ran
    /// there is lost.
    Lost(String),
}

impl fmt::Display for Unanswerable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unanswerable::Waiting(why) | Unanswerable::Lost(why) => f.write_str(why),
        }
    }
}

/// What [`Runtime::logs`] returns, as kubectl's pod-log options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Keep sending what the agent prints next.
    pub follow: bool,
    /// Only the last this many lines of what it printed so far.
    pub tail: Option<usize>,
    /// Only lines written at or after this time.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Prefix each line with the time it was written (RFC 3339, nanoseconds).
    pub timestamps: bool,
    /// The run before the current one (its lines only, never followed).
    pub previous: bool,
}

/// An agent's output as it arrives, chunk by chunk.
pub type LogStream = tokio::sync::mpsc::Receiver<bytes::Bytes>;

/// Where a prebuild or create writes its build output, one line at a time (without
/// the trailing newline). The scheduler hands in the node's build log; any
/// `Fn(&str) + Send + Sync` closure is one.
pub trait BuildLog: Send + Sync {
    /// Appends one line.
    fn line(&self, line: &str);
}

impl<F: Fn(&str) + Send + Sync> BuildLog for F {
    fn line(&self, line: &str) {
        self(line)
    }
}

/// A built generation of an agent's config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// The driver's name for it: `<n>-<shortrev>` for processes, the toplevel store
    /// path for NixOS containers.
    pub id: String,
    /// The config commit it was built from (a full sha).
    pub rev: String,
}

/// The limits a driver applied, as [`Runtime::write_limits`] reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The CPU quota applied, as in the spec (e.g. `200%`).
    pub cpu_quota: String,
    /// The memory cap applied, as in the spec (e.g. `4G`).
    pub memory_max: String,
    /// True when the host enforces them.
    pub enforced: bool,
    /// How they are enforced, or why they cannot be (e.g. `cgroup v2 is not mounted at
    /// /sys/fs/cgroup`). Shown as the message of the Agent's `LimitsEnforced` condition.
    pub message: String,
}

/// Whether a failed start gets the cold-start fallback (the coordinator document's
/// "Cold-start fallback": stop, kill, start clean).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Retry once cleanly: a start after an update can fail on the old generation's
    /// leftovers (Reconcile's start, the approval deploy's inline start).
    ColdStart,
    /// One attempt only: crash-watch's restart, which has its own backoff and must
    /// launch the agent once per try.
    Never,
}

/// What a successful [`Runtime::start`] reports.
#[derive(Debug)]
pub struct Started {
    /// Pid of the agent's main process (also its process group id).
    pub pid: u32,
    /// The error of the first attempt when the cold-start fallback was needed.
    pub recovered_from: Option<Box<Error>>,
}

/// What [`Runtime::signal`] did besides setting the fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kick {
    /// The harness was kicked: its main process catches (or ignores) the kick signal.
    Sent,
    /// The kick was withheld, and why (most often: the main process does not handle it,
    /// so it would have ended the agent). The fence is set all the same.
    Withheld(String),
    /// The agent does not run: the fence alone.
    NotRunning,
}

impl fmt::Display for Kick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kick::Sent => f.write_str("harness kicked with SIGUSR1"),
            Kick::Withheld(why) => write!(f, "SIGUSR1 withheld: {why}"),
            Kick::NotRunning => f.write_str("not running, nothing to kick"),
        }
    }
}

/// How a [`Runtime::drain`] ended; both are success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drain {
    /// The harness cleared the fence (or the agent was not running, or exited).
    Drained,
    /// The timeout passed with the fence still set.
    TimedOut,
}

/// How an agent's process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    /// The exit code, when it exited by itself.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// When the runtime reaped it.
    pub at: DateTime<Utc>,
    /// True when the runtime ended it on request (stop, kill, stop-for-update,
    /// destroy); false for a crash or an exit of the agent's own accord.
    pub requested: bool,
    /// The last lines it wrote to stderr, bounded and with the state directory written
    /// as `$STATE_DIR` ([`hive_api::agent::stderr_tail`]); empty when the runtime keeps
    /// no stderr of its own.
    pub stderr: Vec<String>,
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(signal)) => write!(f, "killed by signal {signal}"),
            (None, None) => f.write_str("unknown exit status"),
        }
    }
}

/// The observed snapshot of one agent ("Container view").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The agent's name.
    pub agent: String,
    /// Running or stopped; the runtime reports nothing in between for processes.
    pub power: Power,
    /// Pid of the main process while running; `None` once stopped.
    pub pid: Option<u32>,
    /// The current generation, if one is installed.
    pub generation: Option<Generation>,
    /// Since when the agent has been in its current power state (start or exit time);
    /// `None` when the runtime has not seen it start or stop since the daemon started.
    pub since: Option<DateTime<Utc>>,
    /// How the agent last exited, if it has since the daemon started.
    pub last_exit: Option<Exit>,
}

impl Observed {
    /// True when the agent runs.
    pub fn running(&self) -> bool {
        self.power == Power::Running
    }
}

/// One observed change, published on [`Runtime::subscribe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeEvent {
    /// The agent it happened to.
    pub agent: String,
    /// What happened.
    pub change: Change,
    /// When.
    pub at: DateTime<Utc>,
}

/// What changed in a [`RuntimeEvent`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The agent was started with this main pid.
    Started {
        /// Pid of the main process.
        pid: u32,
    },
    /// The agent's main process exited (crash or requested stop; see
    /// [`Exit::requested`]).
    Exited(Exit),
    /// A new generation became current.
    Swapped(Generation),
    /// The agent's runtime state was removed.
    Destroyed,
    /// The fleet node the agent is placed on went away or cannot be reached: nothing is
    /// known of the agent until it is back.
    NodeLost {
        /// The node.
        node: String,
        /// Why it is lost.
        why: String,
    },
    /// The node is reachable again and listed the agent's state.
    NodeBack {
        /// The node.
        node: String,
    },
}

/// Why a runtime operation failed. Every variant names the agent; those about a
/// command or a file name it too.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The agent's spec lacks what this driver needs (e.g. `spec.runtime.process`).
    #[error("agent {agent:?}: {field}: {message}")]
    Config {
        /// The agent.
        agent: String,
        /// Field path in the Agent, e.g. `spec.runtime.process.command`.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A command could not be launched at all (missing program, bad directory). Said
    /// without the directory, which is in the state dir.
    #[error("agent {agent:?}: cannot run `{command}`: {source}")]
    Spawn {
        /// The agent.
        agent: String,
        /// The command line.
        command: String,
        /// Its working directory.
        dir: PathBuf,
        /// The launch error.
        #[source]
        source: std::io::Error,
    },
    /// The runtime keeps no output of the agent itself; `hint` says where it is.
    #[error("agent {agent:?} {hint}")]
    LogsElsewhere {
        /// The agent.
        agent: String,
        /// Where its output is, e.g. the container's journal.
        hint: String,
    },
    /// The previous run's output was asked for, and the retained log holds only one run.
    #[error("agent {agent:?} has no previous run in its retained log")]
    NoPreviousRun {
        /// The agent.
        agent: String,
    },
    /// A command ran and failed (git, the build command, `nixos-container`, …).
    #[error("agent {agent:?}: `{command}` in {} failed: {status}{}", dir.display(), tail(output))]
    Command {
        /// The agent.
        agent: String,
        /// The command line.
        command: String,
        /// Its working directory.
        dir: PathBuf,
        /// Its exit status, as text.
        status: String,
        /// The last lines it printed (stderr for git), possibly empty.
        output: String,
    },
    /// A file operation of the runtime failed.
    #[error("agent {agent:?}: {action} {}", path.display())]
    Io {
        /// The agent.
        agent: String,
        /// What was being done, e.g. `cannot create`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// Swap needs the agent stopped, and it runs.
    #[error("agent {agent:?} is running (pid {pid}); swap requires it stopped")]
    NotStopped {
        /// The agent.
        agent: String,
        /// Its main pid.
        pid: u32,
    },
    /// A swap named a generation that is not built (pruned, failed, never built).
    #[error("agent {agent:?}: generation {generation:?} is not built ({})", path.display())]
    UnknownGeneration {
        /// The agent.
        agent: String,
        /// The generation id asked for.
        generation: String,
        /// Where it was expected.
        path: PathBuf,
    },
    /// A start found no current generation (create or swap first).
    #[error("agent {agent:?} has no current generation at {}", path.display())]
    NoGeneration {
        /// The agent.
        agent: String,
        /// The `current` link that is missing.
        path: PathBuf,
    },
    /// The agent's command started but exited within the start grace period. Said
    /// without the directories (which are in the state dir): the command, how it exited
    /// and the last line of its stderr.
    #[error("agent {agent:?}: `{command}` exited during start: {exit}{}", last_stderr(exit))]
    StartExited {
        /// The agent.
        agent: String,
        /// The command line.
        command: String,
        /// Its working directory.
        dir: PathBuf,
        /// How it exited.
        exit: Box<Exit>,
        /// The agent's log file, which holds its output.
        log: PathBuf,
    },
    /// The start failed, and so did the clean cold start after stop and kill. The
    /// second error is said only where it differs from the first.
    #[error("agent {agent:?}: {}", cold_start(agent, first, second))]
    ColdStart {
        /// The agent.
        agent: String,
        /// Why the first start failed.
        first: Box<Error>,
        /// Why the cold start failed.
        second: Box<Error>,
    },
    /// A signal could not be delivered.
    #[error("agent {agent:?}: cannot send {signal} to pid {pid}")]
    Signal {
        /// The agent.
        agent: String,
        /// The signal's name, e.g. `SIGTERM`.
        signal: &'static str,
        /// The target pid (the process group id for group signals).
        pid: u32,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The agent's processes did not go away after SIGKILL within the bound.
    #[error("agent {agent:?}: pid {pid} still running {after:?} after SIGKILL")]
    Unkillable {
        /// The agent.
        agent: String,
        /// Its main pid.
        pid: u32,
        /// How long the runtime waited.
        after: Duration,
    },
    /// The agent's fleet node failed the call, or could not be reached.
    #[error("agent {agent:?} on node {node}: {message}")]
    Remote {
        /// The agent.
        agent: String,
        /// The node it is placed on.
        node: String,
        /// What the node's worker said, or why it could not be asked.
        message: String,
    },
    /// The driver does not support the operation for this agent (e.g. a runtime type
    /// handled by another driver).
    #[error("agent {agent:?}: the {driver} runtime cannot {operation}: {message}")]
    Unsupported {
        /// The agent.
        agent: String,
        /// The driver, e.g. `process`.
        driver: &'static str,
        /// The operation, e.g. `start`.
        operation: &'static str,
        /// Why.
        message: String,
    },
}

impl Error {
    /// The agent the error is about.
    pub fn agent(&self) -> &str {
        match self {
            Error::Config { agent, .. }
            | Error::Spawn { agent, .. }
            | Error::Command { agent, .. }
            | Error::Io { agent, .. }
            | Error::NotStopped { agent, .. }
            | Error::UnknownGeneration { agent, .. }
            | Error::NoGeneration { agent, .. }
            | Error::StartExited { agent, .. }
            | Error::ColdStart { agent, .. }
            | Error::Signal { agent, .. }
            | Error::Unkillable { agent, .. }
            | Error::Unsupported { agent, .. }
            | Error::Remote { agent, .. }
            | Error::LogsElsewhere { agent, .. }
            | Error::NoPreviousRun { agent } => agent,
        }
    }
}

/// `": <output>"` for a non-empty command output, else nothing.
fn tail(output: &str) -> String {
    let output = output.trim();
    if output.is_empty() {
        String::new()
    } else {
        format!(": {output}")
    }
}

/// `"; stderr: <its last line>"` when the exit carries stderr, else nothing.
fn last_stderr(exit: &Exit) -> String {
    match exit.stderr.last() {
        Some(line) => format!("; stderr: {line}"),
        None => String::new(),
    }
}

/// Both attempts of a cold-start fallback, each without the `agent "x": ` both start
/// with, the second only when it says something else.
fn cold_start(agent: &str, first: &Error, second: &Error) -> String {
    let prefix = format!("agent {agent:?}: ");
    let (first, second) = (first.to_string(), second.to_string());
    let strip = |text: &str| text.strip_prefix(&prefix).unwrap_or(text).to_string();
    let (first, second) = (strip(&first), strip(&second));
    if first == second {
        format!("start failed, and again after a cold start: {first}")
    } else {
        format!("start failed: {first}; the cold start after it failed too: {second}")
    }
}
