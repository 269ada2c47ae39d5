//! The agent runtime protocol (`hive/fleet-runtime/0`): what the daemon asks a fleet
//! worker to do to an agent, and what the worker answers. One QUIC bi stream per call:
//! the daemon writes one [`Request`] (framed as every fleet protocol, `wire.rs`), for a
//! build followed by the config repository's git bundle as raw bytes (its length in the
//! request); the worker answers with build lines, then one final reply — or, for logs
//! and the watch, a stream of chunks or events until either side drops it.
//!
//! Every type here mirrors one of `crate::runtime`'s, which carry `std::io::Error`s and
//! paths and have no wire form of their own; an error crosses as its message.

use chrono::{DateTime, Utc};
use hive_api::agent::{Agent, Power};
use serde::{Deserialize, Serialize};

use crate::runtime::{self, Change, Exit, Generation, Kick, LogOptions, Observed, RuntimeEvent};

/// The ALPN of the agent runtime protocol, served by each worker to the daemon it joined.
pub const RUNTIME_ALPN: &[u8] = b"hive/fleet-runtime/0";

/// The largest git bundle a worker accepts for one build (1 GiB).
pub const MAX_BUNDLE: u64 = 1 << 30;

/// One call of the daemon to a worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// Build a new generation of `agent` at the commit `rev`, from the bundle that follows.
    Prebuild {
        /// The agent.
        agent: Box<Agent>,
        /// The full commit sha the daemon resolved `spec.config.rev` to.
        rev: String,
        /// How many bytes of git bundle follow the request.
        bundle: u64,
    },
    /// First build of `agent` at `rev`, installed as current, from the bundle that follows.
    Create {
        /// The agent.
        agent: Box<Agent>,
        /// The full commit sha.
        rev: String,
        /// How many bytes of git bundle follow the request.
        bundle: u64,
    },
    /// [`runtime::Runtime::stop_for_update`].
    StopForUpdate {
        /// The agent.
        agent: Box<Agent>,
    },
    /// [`runtime::Runtime::swap`] to a generation a prebuild on this worker made.
    Swap {
        /// The agent.
        agent: Box<Agent>,
        /// The generation.
        generation: WireGeneration,
    },
    /// [`runtime::Runtime::start_with`].
    Start {
        /// The agent.
        agent: Box<Agent>,
        /// With the cold-start fallback.
        cold_start: bool,
    },
    /// [`runtime::Runtime::stop`].
    Stop {
        /// The agent.
        agent: Box<Agent>,
    },
    /// [`runtime::Runtime::kill`].
    Kill {
        /// The agent.
        agent: Box<Agent>,
    },
    /// [`runtime::Runtime::signal`].
    Signal {
        /// The agent.
        agent: Box<Agent>,
    },
    /// [`runtime::Runtime::drain`].
    Drain {
        /// The agent.
        agent: Box<Agent>,
    },
    /// [`runtime::Runtime::write_limits`].
    WriteLimits {
        /// The agent.
        agent: Box<Agent>,
    },
    /// [`runtime::Runtime::write_permissions`].
    WritePermissions {
        /// The agent.
        agent: Box<Agent>,
    },
    /// [`runtime::Runtime::observed`].
    Observe {
        /// The agent.
        agent: Box<Agent>,
    },
    /// [`runtime::Runtime::destroy`].
    Destroy {
        /// The agent.
        agent: Box<Agent>,
    },
    /// [`runtime::Runtime::logs`]: answered by [`Reply::Logs`], then raw chunks.
    Logs {
        /// The agent's name.
        agent: String,
        /// The log options.
        options: WireLogOptions,
    },
    /// Every agent the worker knows ([`Reply::Agents`]), then each change as it happens
    /// ([`Reply::Event`]) until the stream is dropped.
    Watch,
}

impl Request {
    /// The agent the call is about, if one.
    pub fn agent(&self) -> Option<&str> {
        match self {
            Request::Prebuild { agent, .. }
            | Request::Create { agent, .. }
            | Request::StopForUpdate { agent }
            | Request::Swap { agent, .. }
            | Request::Start { agent, .. }
            | Request::Stop { agent }
            | Request::Kill { agent }
            | Request::Signal { agent }
            | Request::Drain { agent }
            | Request::WriteLimits { agent }
            | Request::WritePermissions { agent }
            | Request::Observe { agent }
            | Request::Destroy { agent } => Some(&agent.metadata.name),
            Request::Logs { agent, .. } => Some(agent),
            Request::Watch => None,
        }
    }
}

/// What a worker answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "camelCase")]
pub enum Reply {
    /// One line of build output (before the final reply of a build).
    Line {
        /// The line, without its newline.
        line: String,
    },
    /// The call succeeded and returns nothing.
    Done,
    /// A build succeeded with this generation.
    Generation(WireGeneration),
    /// A start succeeded.
    Started {
        /// The main pid, on the node.
        pid: u32,
        /// The first attempt's error when the cold-start fallback was needed.
        recovered_from: Option<String>,
    },
    /// What a signal did.
    Kick {
        /// `sent`, `notRunning`, or why it was withheld.
        kick: WireKick,
    },
    /// How a drain ended.
    Drain {
        /// True when the harness cleared the fence.
        drained: bool,
    },
    /// The limits applied.
    Limits {
        /// The CPU quota.
        cpu_quota: String,
        /// The memory cap.
        memory_max: String,
        /// Whether the node enforces them.
        enforced: bool,
        /// How, or why not.
        message: String,
    },
    /// The observed snapshot of an agent.
    Observed(WireObserved),
    /// Logs follow as raw chunks (`u32` length + bytes), until the stream ends.
    Logs,
    /// Every agent the worker has: the start of a watch.
    Agents {
        /// One state per agent.
        agents: Vec<AgentState>,
    },
    /// One change, on a watch.
    Event(WireEvent),
    /// The call failed: the worker's error, as text.
    Failed {
        /// The message.
        message: String,
        /// True when the agent had no previous run (logs with `previous`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        no_previous_run: bool,
    },
}

/// What a worker knows of one agent, without IO.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentState {
    /// The agent.
    pub agent: String,
    /// It has a current generation.
    pub installed: bool,
    /// It runs.
    pub running: bool,
}

/// [`Generation`] on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireGeneration {
    /// The generation id.
    pub id: String,
    /// The commit it was built from.
    pub rev: String,
}

impl From<&Generation> for WireGeneration {
    fn from(g: &Generation) -> Self {
        WireGeneration { id: g.id.clone(), rev: g.rev.clone() }
    }
}

impl From<WireGeneration> for Generation {
    fn from(g: WireGeneration) -> Self {
        Generation { id: g.id, rev: g.rev }
    }
}

/// [`Kick`] on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WireKick {
    /// Kicked.
    Sent,
    /// Withheld, and why.
    Withheld(String),
    /// Not running.
    NotRunning,
}

impl From<&Kick> for WireKick {
    fn from(k: &Kick) -> Self {
        match k {
            Kick::Sent => WireKick::Sent,
            Kick::Withheld(why) => WireKick::Withheld(why.clone()),
            Kick::NotRunning => WireKick::NotRunning,
        }
    }
}

impl From<WireKick> for Kick {
    fn from(k: WireKick) -> Self {
        match k {
            WireKick::Sent => Kick::Sent,
            WireKick::Withheld(why) => Kick::Withheld(why),
            WireKick::NotRunning => Kick::NotRunning,
        }
    }
}

/// [`Exit`] on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireExit {
    /// Exit code.
    pub code: Option<i32>,
    /// Signal.
    pub signal: Option<i32>,
    /// When.
    pub at: DateTime<Utc>,
    /// Ended on request.
    pub requested: bool,
    /// Its last stderr lines, as the worker's runtime kept them.
    pub stderr: Vec<String>,
}

impl From<&Exit> for WireExit {
    fn from(e: &Exit) -> Self {
        WireExit {
            code: e.code,
            signal: e.signal,
            at: e.at,
            requested: e.requested,
            stderr: e.stderr.clone(),
        }
    }
}

impl From<WireExit> for Exit {
    fn from(e: WireExit) -> Self {
        Exit { code: e.code, signal: e.signal, at: e.at, requested: e.requested, stderr: e.stderr }
    }
}

/// [`Observed`] on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireObserved {
    /// The agent.
    pub agent: String,
    /// Its power.
    pub power: Power,
    /// Main pid, on the node.
    pub pid: Option<u32>,
    /// Current generation.
    pub generation: Option<WireGeneration>,
    /// Since when.
    pub since: Option<DateTime<Utc>>,
    /// Last exit.
    pub last_exit: Option<WireExit>,
}

impl From<&Observed> for WireObserved {
    fn from(o: &Observed) -> Self {
        WireObserved {
            agent: o.agent.clone(),
            power: o.power,
            pid: o.pid,
            generation: o.generation.as_ref().map(WireGeneration::from),
            since: o.since,
            last_exit: o.last_exit.as_ref().map(WireExit::from),
        }
    }
}

impl From<WireObserved> for Observed {
    fn from(o: WireObserved) -> Self {
        Observed {
            agent: o.agent,
            power: o.power,
            pid: o.pid,
            generation: o.generation.map(Generation::from),
            since: o.since,
            last_exit: o.last_exit.map(Exit::from),
        }
    }
}

/// [`RuntimeEvent`] on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireEvent {
    /// The agent.
    pub agent: String,
    /// What happened.
    pub change: WireChange,
    /// When.
    pub at: DateTime<Utc>,
}

/// [`Change`] on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WireChange {
    /// Started with this pid.
    Started(u32),
    /// Exited.
    Exited(WireExit),
    /// Swapped to a generation.
    Swapped(WireGeneration),
    /// Destroyed.
    Destroyed,
    /// The daemon lost the node (never sent by a worker).
    NodeLost {
        /// The node.
        node: String,
        /// Why.
        why: String,
    },
    /// The node came back (never sent by a worker).
    NodeBack {
        /// The node.
        node: String,
    },
}

impl From<&RuntimeEvent> for WireEvent {
    fn from(e: &RuntimeEvent) -> Self {
        let change = match &e.change {
            Change::Started { pid } => WireChange::Started(*pid),
            Change::Exited(exit) => WireChange::Exited(exit.into()),
            Change::Swapped(g) => WireChange::Swapped(g.into()),
            Change::Destroyed => WireChange::Destroyed,
            Change::NodeLost { node, why } => WireChange::NodeLost { node: node.clone(), why: why.clone() },
            Change::NodeBack { node } => WireChange::NodeBack { node: node.clone() },
        };
        WireEvent { agent: e.agent.clone(), change, at: e.at }
    }
}

impl From<WireEvent> for RuntimeEvent {
    fn from(e: WireEvent) -> Self {
        let change = match e.change {
            WireChange::Started(pid) => Change::Started { pid },
            WireChange::Exited(exit) => Change::Exited(exit.into()),
            WireChange::Swapped(g) => Change::Swapped(g.into()),
            WireChange::Destroyed => Change::Destroyed,
            WireChange::NodeLost { node, why } => Change::NodeLost { node, why },
            WireChange::NodeBack { node } => Change::NodeBack { node },
        };
        RuntimeEvent { agent: e.agent, change, at: e.at }
    }
}

/// [`LogOptions`] on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireLogOptions {
    /// Follow.
    pub follow: bool,
    /// The last lines only.
    pub tail: Option<usize>,
    /// Since.
    pub since: Option<DateTime<Utc>>,
    /// Timestamps.
    pub timestamps: bool,
    /// The previous run.
    pub previous: bool,
}

impl From<LogOptions> for WireLogOptions {
    fn from(o: LogOptions) -> Self {
        WireLogOptions {
            follow: o.follow,
            tail: o.tail,
            since: o.since,
            timestamps: o.timestamps,
            previous: o.previous,
        }
    }
}

impl From<WireLogOptions> for LogOptions {
    fn from(o: WireLogOptions) -> Self {
        LogOptions {
            follow: o.follow,
            tail: o.tail,
            since: o.since,
            timestamps: o.timestamps,
            previous: o.previous,
        }
    }
}

/// The failure reply of a runtime error.
pub fn failed(err: &runtime::Error) -> Reply {
    Reply::Failed {
        message: err.to_string(),
        no_previous_run: matches!(err, runtime::Error::NoPreviousRun { .. }),
    }
}
