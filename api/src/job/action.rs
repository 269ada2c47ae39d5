//! The typed action of a Job node: what each [`JobNodeKind`] does and the params it
//! takes. A node's wire form stays `kind` + a `params` map (stored Jobs and clients
//! are unchanged); [`NodeAction::parse`] is the one place that reads that map — it
//! refuses an unknown key, a wrong type or a missing required param, naming the field,
//! and it holds every default — and [`NodeAction::params`] writes it back.
//!
//! The serde form of a `NodeAction` is that same wire form (`{"kind": …, "params":
//! {…}}`), read through the same parse, so whatever carries actions (a stored Job, the
//! remote runtime's protocol) reads them with the same rules.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::JobNodeKind;
use crate::agent::Wanted;
use crate::validation::{self, summary, Errors, Reason, ValidationError};

/// `Prebuild`'s `relock` when absent: resolve and lock the agent's wanted rev first.
pub const DEFAULT_RELOCK: bool = true;
/// `Reconcile`'s `kill` when absent: stop an agent wanted Offline gracefully.
pub const DEFAULT_KILL: bool = false;
/// `MetaLock`'s `nonFatal` when absent: a failed bump fails the node.
pub const DEFAULT_NON_FATAL: bool = false;

/// The most bytes of a key or value quoted in an error message; longer ones are cut.
const MAX_QUOTED: usize = 64;

/// What one Job node does, with its params typed. One variant per [`JobNodeKind`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WireAction", into = "WireAction")]
pub enum NodeAction {
    /// Writes the durable power intent (`spec.wanted`) when the Job is taken; reports
    /// it when it runs. Param `wanted` (`Up` or `Offline`, required).
    SetWanted {
        /// The intent the rest of the agent's chain converges to.
        wanted: Wanted,
    },
    /// Converges observed power to wanted. Param `kill` (default false).
    Reconcile {
        /// Stop an agent wanted Offline with a kill, not a graceful stop.
        kill: bool,
    },
    /// Stops the agent for a profile swap; never touches wanted.
    StopForUpdate,
    /// Sets the graceful fence and kicks the harness.
    Signal,
    /// Waits for the harness to clear the fence.
    Drain,
    /// Writes runtime flags and resource limits.
    WriteDropin,
    /// Commits the agent's tool groups and capabilities to the meta repo.
    WritePermFile,
    /// Builds the new generation while the running one serves. Param `relock`
    /// (default true).
    Prebuild {
        /// Resolve and lock the agent's wanted rev first; false builds what the meta
        /// lock already pins (a MetaLock's child must not revert the bump).
        relock: bool,
    },
    /// Flips the agent to the generation its Job's Prebuild built.
    Swap,
    /// First-spawn provisioning: the first generation on the agent's host. Param
    /// `relock` (default true).
    Create {
        /// Resolve and lock the agent's wanted rev first; false builds what the meta
        /// lock pins (a move rebuilds the reviewed commit on the new host, never a newer
        /// one of its branch).
        relock: bool,
    },
    /// Leaves the host an agent moves off: stops it there and removes its installation.
    /// Param `from` (the fleet Node it leaves; absent: the daemon's own host).
    Vacate {
        /// The Node the agent leaves; `None`: the daemon's host.
        from: Option<String>,
    },
    /// Bumps meta flake inputs, then fans out rebuilds. Params `inputs` (required, at
    /// least one), `agents` (optional), `nonFatal` (default false).
    MetaLock {
        /// The inputs to bump: `hive` (the hive base) or an agent's config input.
        inputs: Vec<String>,
        /// The exact agents to rebuild, in order; `None`: every installed agent whose
        /// input changed.
        agents: Option<Vec<String>>,
        /// A failed bump is reported and the rebuilds still fan out.
        non_fatal: bool,
    },
    /// Deploys an approved change. Param `approval` (required).
    ApprovalDeploy {
        /// The Approval whose change is deployed.
        approval: String,
    },
}

impl JobNodeKind {
    /// The params a node of this kind takes, as they are spelt in `params`.
    pub fn param_names(self) -> &'static [&'static str] {
        match self {
            JobNodeKind::SetWanted => &["wanted"],
            JobNodeKind::Reconcile => &["kill"],
            JobNodeKind::Prebuild | JobNodeKind::Create => &["relock"],
            JobNodeKind::MetaLock => &["inputs", "agents", "nonFatal"],
            JobNodeKind::ApprovalDeploy => &["approval"],
            JobNodeKind::Vacate => &["from"],
            JobNodeKind::StopForUpdate
            | JobNodeKind::Signal
            | JobNodeKind::Drain
            | JobNodeKind::WriteDropin
            | JobNodeKind::WritePermFile
            | JobNodeKind::Swap => &[],
        }
    }
}

/// Why a node's params do not make its action: every problem, each at its field
/// relative to the node (`params.relok`); [`ActionError::at`] places them in a Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionError {
    /// Each problem, e.g. at `params.relock` or `params.inputs[1]`.
    pub errors: Vec<ValidationError>,
}

impl ActionError {
    /// The problems at their place in a Job, under `node` (e.g. `spec.nodes[3]`).
    pub fn at(&self, node: &str) -> Vec<ValidationError> {
        self.errors
            .iter()
            .map(|e| ValidationError::new(format!("{node}.{}", e.field), e.reason, e.message.clone()))
            .collect()
    }
}

impl fmt::Display for ActionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&summary(&self.errors))
    }
}

impl std::error::Error for ActionError {}

impl NodeAction {
    /// Parses a node's `kind` and `params` into its action, with the defaults of the
    /// params left out. Refuses, naming each field: a key the kind does not take, a
    /// value of the wrong type or outside its values, a required param missing. Pure and
    /// total: no input panics.
    pub fn parse(kind: JobNodeKind, params: &Map<String, Value>) -> Result<NodeAction, ActionError> {
        let mut p = Params::new(kind, params);
        let action = match kind {
            JobNodeKind::SetWanted => p.wanted().map(|wanted| NodeAction::SetWanted { wanted }),
            JobNodeKind::Reconcile => Some(NodeAction::Reconcile { kill: p.bool("kill", DEFAULT_KILL) }),
            JobNodeKind::StopForUpdate => Some(NodeAction::StopForUpdate),
            JobNodeKind::Signal => Some(NodeAction::Signal),
            JobNodeKind::Drain => Some(NodeAction::Drain),
            JobNodeKind::WriteDropin => Some(NodeAction::WriteDropin),
            JobNodeKind::WritePermFile => Some(NodeAction::WritePermFile),
            JobNodeKind::Prebuild => Some(NodeAction::Prebuild { relock: p.bool("relock", DEFAULT_RELOCK) }),
            JobNodeKind::Swap => Some(NodeAction::Swap),
            JobNodeKind::Create => Some(NodeAction::Create { relock: p.bool("relock", DEFAULT_RELOCK) }),
            JobNodeKind::Vacate => p.from().map(|from| NodeAction::Vacate { from }),
            JobNodeKind::MetaLock => {
                let inputs = p.inputs();
                let agents = p.agents();
                let non_fatal = p.bool("nonFatal", DEFAULT_NON_FATAL);
                inputs.map(|inputs| NodeAction::MetaLock { inputs, agents, non_fatal })
            }
            JobNodeKind::ApprovalDeploy => {
                p.approval().map(|approval| NodeAction::ApprovalDeploy { approval })
            }
        };
        match action {
            Some(action) if p.errors.is_empty() => Ok(action),
            _ => Err(ActionError { errors: p.errors.0 }),
        }
    }

    /// The node kind that runs this action.
    pub fn kind(&self) -> JobNodeKind {
        match self {
            NodeAction::SetWanted { .. } => JobNodeKind::SetWanted,
            NodeAction::Reconcile { .. } => JobNodeKind::Reconcile,
            NodeAction::StopForUpdate => JobNodeKind::StopForUpdate,
            NodeAction::Signal => JobNodeKind::Signal,
            NodeAction::Drain => JobNodeKind::Drain,
            NodeAction::WriteDropin => JobNodeKind::WriteDropin,
            NodeAction::WritePermFile => JobNodeKind::WritePermFile,
            NodeAction::Prebuild { .. } => JobNodeKind::Prebuild,
            NodeAction::Swap => JobNodeKind::Swap,
            NodeAction::Create { .. } => JobNodeKind::Create,
            NodeAction::Vacate { .. } => JobNodeKind::Vacate,
            NodeAction::MetaLock { .. } => JobNodeKind::MetaLock,
            NodeAction::ApprovalDeploy { .. } => JobNodeKind::ApprovalDeploy,
        }
    }

    /// The action's wire `params`: every required param, and each optional one that
    /// differs from its default (so a node reads as hive has always written it).
    /// [`NodeAction::parse`] of it gives the action back.
    pub fn params(&self) -> Map<String, Value> {
        let mut params = Map::new();
        let mut put = |key: &str, value: Value| {
            params.insert(key.to_string(), value);
        };
        match self {
            NodeAction::SetWanted { wanted } => put("wanted", wanted.as_str().into()),
            NodeAction::Reconcile { kill } => {
                if *kill != DEFAULT_KILL {
                    put("kill", (*kill).into());
                }
            }
            NodeAction::Prebuild { relock } | NodeAction::Create { relock } => {
                if *relock != DEFAULT_RELOCK {
                    put("relock", (*relock).into());
                }
            }
            NodeAction::MetaLock { inputs, agents, non_fatal } => {
                put("inputs", inputs.clone().into());
                if let Some(agents) = agents {
                    put("agents", agents.clone().into());
                }
                if *non_fatal != DEFAULT_NON_FATAL {
                    put("nonFatal", (*non_fatal).into());
                }
            }
            NodeAction::ApprovalDeploy { approval } => put("approval", approval.clone().into()),
            NodeAction::Vacate { from } => {
                if let Some(from) = from {
                    put("from", from.clone().into());
                }
            }
            NodeAction::StopForUpdate
            | NodeAction::Signal
            | NodeAction::Drain
            | NodeAction::WriteDropin
            | NodeAction::WritePermFile
            | NodeAction::Swap => {}
        }
        params
    }
}

/// The serde form of an action: a Job node's `kind` and `params`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireAction {
    kind: JobNodeKind,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    params: Map<String, Value>,
}

impl TryFrom<WireAction> for NodeAction {
    type Error = ActionError;

    fn try_from(wire: WireAction) -> Result<NodeAction, ActionError> {
        NodeAction::parse(wire.kind, &wire.params)
    }
}

impl From<NodeAction> for WireAction {
    fn from(action: NodeAction) -> WireAction {
        WireAction { kind: action.kind(), params: action.params() }
    }
}

/// One node's params being read: the unknown keys are reported up front, then each
/// accessor reports what is wrong with its own param.
struct Params<'a> {
    map: &'a Map<String, Value>,
    errors: Errors,
}

impl<'a> Params<'a> {
    fn new(kind: JobNodeKind, map: &'a Map<String, Value>) -> Params<'a> {
        let mut errors = Errors::default();
        let takes = kind.param_names();
        for key in map.keys().filter(|k| !takes.contains(&k.as_str())) {
            let what = match takes {
                [] => format!("{} takes no params", kind.as_str()),
                names => format!("{} takes: {}", kind.as_str(), names.join(", ")),
            };
            errors.push(field(key), Reason::NotSupported, format!("{} ({what})", quoted(key)));
        }
        Params { map, errors }
    }

    fn bool(&mut self, key: &str, default: bool) -> bool {
        match self.map.get(key) {
            None => default,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                self.errors.push(
                    field(key),
                    Reason::Invalid,
                    format!("{}: must be true or false", shown(other)),
                );
                default
            }
        }
    }

    /// A required string, or `None` with the problem recorded (`missing` says what
    /// the param is for).
    fn string(&mut self, key: &str, missing: &str) -> Option<&'a str> {
        match self.map.get(key) {
            None => {
                self.errors.push(field(key), Reason::Required, missing);
                None
            }
            Some(Value::String(s)) => Some(s.as_str()),
            Some(other) => {
                self.errors.push(field(key), Reason::Invalid, format!("{}: must be a string", shown(other)));
                None
            }
        }
    }

    fn wanted(&mut self) -> Option<Wanted> {
        match self.string("wanted", "a SetWanted node names the intent it writes: Up or Offline")? {
            "Up" => Some(Wanted::Up),
            "Offline" => Some(Wanted::Offline),
            other => {
                let message = format!("{}: supported values: \"Offline\", \"Up\"", quoted(other));
                self.errors.push(field("wanted"), Reason::NotSupported, message);
                None
            }
        }
    }

    fn approval(&mut self) -> Option<String> {
        let approval = self.string("approval", "an ApprovalDeploy node names the Approval it deploys")?;
        let before = self.errors.0.len();
        validation::name(&mut self.errors, &field("approval"), approval);
        (self.errors.0.len() == before).then(|| approval.to_string())
    }

    /// Vacate's `from`: `Some(None)` when absent (the daemon's host), `Some(node)` for a
    /// valid Node name, `None` with the problem recorded.
    fn from(&mut self) -> Option<Option<String>> {
        if !self.map.contains_key("from") {
            return Some(None);
        }
        let node = self.string("from", "")?;
        let before = self.errors.0.len();
        validation::name(&mut self.errors, &field("from"), node);
        (self.errors.0.len() == before).then(|| Some(node.to_string()))
    }

    /// A list of strings, or `None` (absent, or wrong, with the problem recorded).
    fn strings(&mut self, key: &str) -> Option<Vec<String>> {
        let items = match self.map.get(key)? {
            Value::Array(items) => items,
            other => {
                let message = format!("{}: must be a list of strings", shown(other));
                self.errors.push(field(key), Reason::Invalid, message);
                return None;
            }
        };
        let before = self.errors.0.len();
        let mut strings = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) => strings.push(s.clone()),
                other => self.errors.push(
                    format!("{}[{i}]", field(key)),
                    Reason::Invalid,
                    format!("{}: must be a string", shown(other)),
                ),
            }
        }
        (self.errors.0.len() == before).then_some(strings)
    }

    fn inputs(&mut self) -> Option<Vec<String>> {
        if !self.map.contains_key("inputs") {
            let message = "a MetaLock node names the meta inputs it bumps (\"hive\" or agents' names)";
            self.errors.push(field("inputs"), Reason::Required, message);
            return None;
        }
        let inputs = self.strings("inputs")?;
        if inputs.is_empty() {
            self.errors.push(field("inputs"), Reason::Required, "must name at least one input");
            return None;
        }
        let before = self.errors.0.len();
        validation::tokens(&mut self.errors, &field("inputs"), &inputs);
        (self.errors.0.len() == before).then_some(inputs)
    }

    fn agents(&mut self) -> Option<Vec<String>> {
        let agents = self.strings("agents")?;
        for (i, agent) in agents.iter().enumerate() {
            validation::name(&mut self.errors, &format!("{}[{i}]", field("agents")), agent);
        }
        Some(agents)
    }
}

/// `params.<key>`, the key cut to a bounded length.
fn field(key: &str) -> String {
    format!("params.{}", cut(key))
}

/// A key or string value quoted for a message, cut to a bounded length.
fn quoted(text: &str) -> String {
    format!("{:?}", cut(text))
}

/// A JSON value as a message shows it, cut to a bounded length.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => quoted(s),
        other => cut(&other.to_string()).into_owned(),
    }
}

fn cut(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_QUOTED {
        return text.into();
    }
    let mut end = MAX_QUOTED;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end]).into()
}

#[cfg(test)]
mod tests;
