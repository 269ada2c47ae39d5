//! The `Job` kind: one DAG of primitive nodes submitted to the scheduler, the pure
//! checks of its graph (`dag.rs`: unique node ids, no dangling deps, no cycles), each
//! node's typed action (`action.rs`: its params parsed, with their defaults) and what
//! is observed of a Job (`status.rs`).

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::resource::{Column, Resource};
use crate::validation::{self, Errors, Reason};

mod action;
mod dag;
mod status;

pub use action::{ActionError, NodeAction, DEFAULT_KILL, DEFAULT_NON_FATAL, DEFAULT_RELOCK};
pub use status::{JobClaim, JobNodeState, JobNodeStatus, JobPhase, JobStatus};

crate::resource! {
    /// A Job: one DAG of primitive nodes (prebuild, swap, reconcile …) run by the
    /// scheduler. Any write path creates one (POST, apply, server-side apply); the
    /// daemon's intake claims each exactly once (`status.claim`), expanding a template
    /// Job's nodes first, and hands it to the scheduler. Its spec is fixed once claimed;
    /// its status mirrors the scheduler's in-memory state for clients.
    Job, JobList, JobSpec, JobStatus, plural = "jobs", singular = "job", short = ["jb"]
}

/// The most nodes one Job may have: a hive-wide operation on a thousand agents is about
/// four thousand. Admission refuses more at `spec.nodes` before looking at any of them,
/// so a refusal costs no more than counting.
pub const MAX_NODES: usize = 5_000;

/// What a Job is: its template, why and by whom it was submitted, and its nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    /// The operation this DAG implements, e.g. `Rebuild` or `Stop`.
    pub template: JobTemplate,
    /// Human-readable reason, e.g. the boot sweep's rebuild / deferred / up-to-date counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Which surface submitted the Job.
    #[serde(default)]
    pub source: JobSource,
    /// Name of the Job whose completion fanned out this one (e.g. a MetaLock's rebuilds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Name of the Approval this Job resolves, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
    /// Meta flake inputs the Job bumps (`MetaUpdate`, `BootSweep`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// The agents a template Job acts on. Write a Job with `template` and `agents` (and
    /// no `nodes`), by POST or apply, and the submit layer builds one subgraph per agent
    /// from their live state when the Job is claimed; the stored Job keeps the list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
    /// The nodes of the DAG, at most 5000. Edges are intra-Job only; cross-Job ordering
    /// comes from the per-agent lease. Empty in a template Job that names `agents`
    /// instead, until the intake expands it.
    #[serde(default)]
    pub nodes: Vec<JobNode>,
    /// Orders this Job's ready nodes against other Jobs' for a build slot or an agent's
    /// lease: higher first, submit order within a priority, and a waiting Job gains one
    /// point per minute since it was submitted, so nothing waits forever. -1000 to 1000;
    /// default 0. The boot sweep runs at -10 ([`BOOT_PRIORITY`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// The retries of every node of a kind that may be retried (Prebuild, Create,
    /// MetaLock) that names none itself; other kinds never retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// How long the Job may run, in seconds from when the scheduler took it: past it,
    /// its queued nodes are cancelled, a running build is stopped, and the Job ends
    /// `Failed` with reason `DeadlineExceeded`; its tail Reconciles still converge the
    /// agents. 1 to 31536000 (a year); absent: no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<u64>,
    /// How long the Job is kept once it finished (`Done`, `Failed`, `Cancelled` or
    /// `Interrupted`), in seconds from `status.finishedAt`: then the daemon deletes it.
    /// 0 to 31536000 (a year); absent: the daemon's `--job-history-max-age`, if it has
    /// one, else it is kept. Either way at most the 5 most recent terminal Jobs of a
    /// template are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i64>,
}

fn is_zero(value: &i32) -> bool {
    *value == 0
}

/// What a Job asks of the scheduler besides its nodes, and how long it is kept after:
/// the fields of [`JobSpec`] a template Job keeps when the submit layer builds its nodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scheduling {
    /// `spec.priority`.
    pub priority: i32,
    /// `spec.activeDeadlineSeconds`.
    pub active_deadline_seconds: Option<u64>,
    /// `spec.retry`.
    pub retry: Option<Retry>,
    /// `spec.ttlSecondsAfterFinished`.
    pub ttl_seconds_after_finished: Option<i64>,
}

impl JobSpec {
    /// What this spec asks of the scheduler besides its nodes.
    pub fn scheduling(&self) -> Scheduling {
        Scheduling {
            priority: self.priority,
            active_deadline_seconds: self.active_deadline_seconds,
            retry: self.retry.clone(),
            ttl_seconds_after_finished: self.ttl_seconds_after_finished,
        }
    }

    /// Sets what this spec asks of the scheduler besides its nodes.
    pub fn set_scheduling(&mut self, scheduling: &Scheduling) {
        self.priority = scheduling.priority;
        self.active_deadline_seconds = scheduling.active_deadline_seconds;
        self.retry.clone_from(&scheduling.retry);
        self.ttl_seconds_after_finished = scheduling.ttl_seconds_after_finished;
    }
}

/// The lowest [`JobSpec::priority`].
pub const MIN_PRIORITY: i32 = -1000;
/// The highest [`JobSpec::priority`].
pub const MAX_PRIORITY: i32 = 1000;
/// The priority of the Jobs the boot sweep submits: below an operator's command (0), so
/// a restart typed during a big sweep does not wait behind it.
pub const BOOT_PRIORITY: i32 = -10;
/// The longest [`JobSpec::active_deadline_seconds`]: a year.
pub const MAX_DEADLINE_SECONDS: u64 = 365 * 24 * 3600;
/// The longest [`JobSpec::ttl_seconds_after_finished`]: a year.
pub const MAX_TTL_SECONDS: i64 = 365 * 24 * 3600;
/// `status.reason` of a Job that ran past `spec.activeDeadlineSeconds`.
pub const REASON_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// The operation a Job implements; each has one DAG shape (see the coordinator
/// document's "Every operation as a DAG").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum JobTemplate {
    /// Prebuild → StopForUpdate → Swap →(AfterAny) Reconcile.
    Rebuild,
    /// SetWanted(Up) → Reconcile, or a rebuild-then-start for a stale agent.
    Start,
    /// SetWanted(Offline) → [Signal → Drain] → Reconcile.
    Stop,
    /// SetWanted(Up) → [Signal → Drain] → StopForUpdate → Reconcile.
    Restart,
    /// SetWanted(Offline) → Reconcile, without a graceful drain.
    Kill,
    /// Create → WriteDropin → Reconcile.
    Spawn,
    /// A lone Reconcile converging observed power to wanted.
    #[default]
    Reconcile,
    /// MetaLock, fanning out child rebuilds for the affected agents.
    MetaUpdate,
    /// WritePermFile → rebuild.
    PermChange,
    /// The boot reconcile: MetaLock fanning out rebuilds of stale agents.
    BootSweep,
    /// A single ApprovalDeploy node applying an approved commit or config PR.
    ApprovalDeploy,
    /// Vacate(the host it leaves) → Create → WriteDropin → Reconcile: moves an agent to
    /// the host its `spec.placement` now names.
    Move,
}

impl JobTemplate {
    /// The serialized name, e.g. `MetaUpdate`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobTemplate::Rebuild => "Rebuild",
            JobTemplate::Start => "Start",
            JobTemplate::Stop => "Stop",
            JobTemplate::Restart => "Restart",
            JobTemplate::Kill => "Kill",
            JobTemplate::Spawn => "Spawn",
            JobTemplate::Reconcile => "Reconcile",
            JobTemplate::MetaUpdate => "MetaUpdate",
            JobTemplate::PermChange => "PermChange",
            JobTemplate::BootSweep => "BootSweep",
            JobTemplate::ApprovalDeploy => "ApprovalDeploy",
            JobTemplate::Move => "Move",
        }
    }

    /// Whether the submit layer builds this operation's DAG from the state of the agents
    /// in `spec.agents` (a template Job); the others are written with their `nodes`.
    pub fn builds_from_agents(self) -> bool {
        matches!(
            self,
            JobTemplate::Rebuild
                | JobTemplate::Start
                | JobTemplate::Stop
                | JobTemplate::Restart
                | JobTemplate::Kill
                | JobTemplate::Spawn
                | JobTemplate::Reconcile
                | JobTemplate::PermChange
                | JobTemplate::Move
        )
    }
}

/// The surface a Job came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum JobSource {
    /// A REST client (kubectl, an OpenAPI client).
    #[default]
    Api,
    /// The `hive` command line.
    Cli,
    /// The web dashboard.
    Dashboard,
    /// An MCP client.
    Mcp,
    /// A controller reconciling a resource.
    Controller,
    /// The boot reconcile.
    Boot,
    /// The scheduler, fanning out children of a finished parent Job.
    FanOut,
}

impl JobSource {
    /// The serialized name, e.g. `Cli`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobSource::Api => "Api",
            JobSource::Cli => "Cli",
            JobSource::Dashboard => "Dashboard",
            JobSource::Mcp => "Mcp",
            JobSource::Controller => "Controller",
            JobSource::Boot => "Boot",
            JobSource::FanOut => "FanOut",
        }
    }
}

/// One node of a Job: the unit of scheduling, execution, step label and build log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobNode {
    /// Identifier, unique within the Job; deps refer to it. 1–253 characters: letters,
    /// digits, '-', '_', '.', ':' or '/'.
    #[serde(default)]
    pub id: String,
    /// The primitive this node runs.
    pub kind: JobNodeKind,
    /// The agent the node acts on (a DAG can span agents). Required for every kind but
    /// `MetaLock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Nodes of this Job that must finish first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<Dep>,
    /// Kind-specific parameters, e.g. `{"wanted": "Offline"}` for `SetWanted`. Each
    /// kind takes only its own (any other key, a wrong type or a missing required one is
    /// refused, naming `spec.nodes[i].params.<key>`): `SetWanted`: `wanted` (`Up` or
    /// `Offline`, required). `Reconcile`: `kill` (boolean, default false: stop an agent
    /// wanted Offline gracefully). `Prebuild` and `Create`: `relock` (boolean, default
    /// true: lock the agent's wanted rev first; false builds what the meta lock pins). `MetaLock`:
    /// `inputs` (the meta inputs to bump, `hive` or agents' names, required),
    /// `agents` (the agents to rebuild, in order; default every installed agent whose
    /// input changed), `nonFatal` (boolean, default false: a failed bump still fans out
    /// the rebuilds). `ApprovalDeploy`: `approval` (the Approval's name, required).
    /// `Vacate`: `from` (the fleet Node the agent leaves; absent: the daemon's host).
    /// `StopForUpdate`, `Signal`, `Drain`, `WriteDropin`, `WritePermFile` and `Swap` take
    /// none.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, Value>,
    /// Runs the node again when it fails, after a backoff: only for the kinds whose
    /// failure leaves nothing done (Prebuild, Create, MetaLock); any other kind is
    /// refused at `spec.nodes[i].retry`. Overrides the Job's `spec.retry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
}

/// How a failed node is tried again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    /// Tries after the first, 0 to 20: a node runs at most `limit + 1` times.
    pub limit: u32,
    /// The wait before each retry; absent: 10s, doubling, at most 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Backoff>,
}

/// The wait before a retry: `initial` before the first, multiplied by `factor` for each
/// one after, never more than `max`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Backoff {
    /// The first wait, a duration such as `10s`, `500ms`, `2m` (at most 1h); default
    /// `10s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial: Option<String>,
    /// The longest wait, at least `initial` and at most 1h; default `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// What each wait is multiplied by for the next, 1 to 10; default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
}

/// The most retries a node may have.
pub const MAX_RETRIES: u32 = 20;
/// The longest backoff.
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// The first backoff when none is given.
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
/// The longest backoff when none is given.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// The backoff factor when none is given.
pub const DEFAULT_BACKOFF_FACTOR: f64 = 2.0;

/// A [`Retry`] read, with its defaults: what the scheduler follows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Tries after the first.
    pub limit: u32,
    /// The first wait.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
    /// Each wait times this is the next.
    pub factor: f64,
}

impl RetryPolicy {
    /// The wait before try `attempt + 1`, after try `attempt` (1-based) failed.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.factor.powi(attempt.saturating_sub(1).min(64) as i32);
        let wait = self.initial.as_secs_f64() * exp;
        if !wait.is_finite() || wait >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::from_secs_f64(wait)
        }
    }
}

impl Retry {
    /// The policy, every default filled in; values out of range (a Job stored before
    /// they were checked) are brought into it.
    pub fn policy(&self) -> RetryPolicy {
        let backoff = self.backoff.clone().unwrap_or_default();
        let initial = backoff.initial.as_deref().and_then(parse_duration).unwrap_or(DEFAULT_BACKOFF_INITIAL);
        let max = backoff.max.as_deref().and_then(parse_duration).unwrap_or(DEFAULT_BACKOFF_MAX);
        let initial = initial.min(MAX_BACKOFF);
        RetryPolicy {
            limit: self.limit.min(MAX_RETRIES),
            initial,
            max: max.clamp(initial, MAX_BACKOFF),
            factor: backoff.factor.filter(|f| (1.0..=10.0).contains(f)).unwrap_or(DEFAULT_BACKOFF_FACTOR),
        }
    }

    fn validate(&self, errors: &mut Errors, at: &str) {
        if self.limit > MAX_RETRIES {
            let message = format!("{}: must be between 0 and {MAX_RETRIES}", self.limit);
            errors.push(format!("{at}.limit"), Reason::Invalid, message);
        }
        let Some(backoff) = &self.backoff else { return };
        let mut duration = |field: &str, value: &Option<String>| {
            let value = value.as_deref()?;
            match parse_duration(value) {
                Some(d) if !d.is_zero() && d <= MAX_BACKOFF => Some(d),
                _ => {
                    let message = format!(
                        "{value:?}: must be a duration such as 10s, 500ms or 2m, above 0 and at most 1h"
                    );
                    errors.push(format!("{at}.backoff.{field}"), Reason::Invalid, message);
                    None
                }
            }
        };
        let initial = duration("initial", &backoff.initial);
        let max = duration("max", &backoff.max);
        if let (Some(initial), Some(max)) = (initial.or(Some(DEFAULT_BACKOFF_INITIAL)), max) {
            if max < initial {
                errors.push(format!("{at}.backoff.max"), Reason::Invalid, "must be at least backoff.initial");
            }
        }
        if let Some(factor) = backoff.factor {
            if !(1.0..=10.0).contains(&factor) {
                errors.push(
                    format!("{at}.backoff.factor"),
                    Reason::Invalid,
                    format!("{factor}: must be between 1 and 10"),
                );
            }
        }
    }
}

/// A duration such as `500ms`, `10s`, `2m` or `1h`: a whole number and its unit.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    let millis = match unit {
        "ms" => n,
        "s" => n.checked_mul(1000)?,
        "m" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        _ => return None,
    };
    Some(Duration::from_millis(millis))
}

impl JobNode {
    /// A node with no deps and no params.
    pub fn new(id: impl Into<String>, kind: JobNodeKind, agent: Option<&str>) -> JobNode {
        JobNode {
            id: id.into(),
            kind,
            agent: agent.map(str::to_string),
            deps: Vec::new(),
            params: Default::default(),
            retry: None,
        }
    }

    /// A node that runs `action`, with no deps: its kind and params are the action's
    /// wire form ([`NodeAction::params`]).
    pub fn from_action(id: impl Into<String>, agent: Option<&str>, action: &NodeAction) -> JobNode {
        JobNode {
            id: id.into(),
            kind: action.kind(),
            agent: agent.map(str::to_string),
            deps: Vec::new(),
            params: action.params(),
            retry: None,
        }
    }

    /// What the node does: its kind and params parsed ([`NodeAction::parse`]).
    pub fn action(&self) -> Result<NodeAction, ActionError> {
        NodeAction::parse(self.kind, &self.params)
    }

    /// How the node is retried when it fails, if it is: its own `retry`, else the Job's
    /// `default`, for a kind that may be retried ([`JobNodeKind::retry_safe`]).
    pub fn retry_policy(&self, default: Option<&Retry>) -> Option<RetryPolicy> {
        if !self.kind.retry_safe() {
            return None;
        }
        self.retry.as_ref().or(default).map(Retry::policy).filter(|p| p.limit > 0)
    }

    /// Adds a dep on `node` with the given edge.
    pub fn after(mut self, node: impl Into<String>, edge: Edge) -> JobNode {
        self.deps.push(Dep { node: node.into(), edge });
        self
    }
}

/// The primitives a Job is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum JobNodeKind {
    /// Writes the durable power intent (`spec.wanted`); takes the agent lease so intent
    /// and reconcile are atomic per agent.
    SetWanted,
    /// Idempotent power converge: start if wanted Up and down, stop if Offline and up.
    Reconcile,
    /// Stops the agent for a profile swap; never touches wanted; noop when stopped.
    StopForUpdate,
    /// Sets the graceful fence and kicks the harness into a stop-checkpoint turn.
    Signal,
    /// Waits for the harness to clear the fence, bounded by the graceful-stop timeout.
    Drain,
    /// Writes runtime flags and resource limits (drop-in) and reloads.
    WriteDropin,
    /// Commits the agent's tool groups and capabilities to the meta repo.
    WritePermFile,
    /// Builds the new generation while the running one keeps serving.
    Prebuild,
    /// Flips the agent to the prebuilt generation (requires it stopped).
    Swap,
    /// First-spawn provisioning: creates the agent's runtime instance.
    Create,
    /// Bumps meta flake inputs (commit fused); fans out child rebuild Jobs.
    MetaLock,
    /// The two-phase apply-commit / merge-config-PR deploy of an approval.
    ApprovalDeploy,
    /// Stops the agent on the host it moves off and removes its installation there;
    /// a host that cannot be reached is left as it is.
    Vacate,
}

impl JobNodeKind {
    /// The serialized name, e.g. `StopForUpdate`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobNodeKind::SetWanted => "SetWanted",
            JobNodeKind::Reconcile => "Reconcile",
            JobNodeKind::StopForUpdate => "StopForUpdate",
            JobNodeKind::Signal => "Signal",
            JobNodeKind::Drain => "Drain",
            JobNodeKind::WriteDropin => "WriteDropin",
            JobNodeKind::WritePermFile => "WritePermFile",
            JobNodeKind::Prebuild => "Prebuild",
            JobNodeKind::Swap => "Swap",
            JobNodeKind::Create => "Create",
            JobNodeKind::MetaLock => "MetaLock",
            JobNodeKind::ApprovalDeploy => "ApprovalDeploy",
            JobNodeKind::Vacate => "Vacate",
        }
    }

    /// Heavy nodes hold a build slot for their whole run.
    pub fn is_heavy(self) -> bool {
        matches!(
            self,
            JobNodeKind::Prebuild
                | JobNodeKind::Swap
                | JobNodeKind::Create
                | JobNodeKind::MetaLock
                | JobNodeKind::ApprovalDeploy
        )
    }

    /// Whether the node takes its agent's lease. Prebuild, MetaLock and WritePermFile
    /// touch the store or meta repo, not the running agent, so they are exempt.
    pub fn takes_lease(self) -> bool {
        !matches!(self, JobNodeKind::Prebuild | JobNodeKind::MetaLock | JobNodeKind::WritePermFile)
    }

    /// Whether a failed node of this kind may run again: its failure leaves nothing done
    /// that a second try would do twice. A Prebuild builds a new generation the running
    /// agent does not use (a failed fetch or build is just tried again); a Create makes
    /// the first generation, atomically; a MetaLock's bump is one fused commit. Every
    /// other kind may have changed the agent or the meta repo before it failed (a Swap
    /// half done, a stop, a deploy), so it never retries.
    pub fn retry_safe(self) -> bool {
        matches!(self, JobNodeKind::Prebuild | JobNodeKind::Create | JobNodeKind::MetaLock)
    }

    /// Whether the node must name an agent. Only MetaLock acts on the meta flake alone.
    pub fn needs_agent(self) -> bool {
        self != JobNodeKind::MetaLock
    }
}

/// A dependency of a node on another node of the same Job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Dep {
    /// The `id` of the node depended on.
    pub node: String,
    /// When the dependent may run: `AfterOk` (the default) or `AfterAny`.
    #[serde(default)]
    pub edge: Edge,
}

/// How a node depends on another.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum Edge {
    /// Runs only after the dep succeeded; a failed or cancelled dep cancels the dependent.
    #[default]
    AfterOk,
    /// Runs once the dep is terminal, whatever its outcome (Swap → Reconcile brings an
    /// agent back on its old config).
    AfterAny,
}

impl JobSpec {
    /// Every check of a spec but its nodes' params: the references, the reason, the
    /// template's shape and the graph (ids, agents, deps, no cycles). What a scheduler
    /// needs to hold the DAG; the params are parsed per node into [`NodeAction`]s, and a
    /// node whose params do not parse fails alone.
    pub fn validate_graph(&self, errors: &mut Errors) {
        if let Some(parent) = &self.parent {
            validation::name(errors, "spec.parent", parent);
        }
        if let Some(approval) = &self.approval {
            validation::name(errors, "spec.approval", approval);
        }
        if let Some(reason) = &self.reason {
            validation::text(errors, "spec.reason", reason);
        }
        validation::tokens(errors, "spec.inputs", &self.inputs);
        if !(MIN_PRIORITY..=MAX_PRIORITY).contains(&self.priority) {
            errors.push(
                "spec.priority",
                Reason::Invalid,
                format!("{}: must be between {MIN_PRIORITY} and {MAX_PRIORITY}", self.priority),
            );
        }
        if let Some(retry) = &self.retry {
            retry.validate(errors, "spec.retry");
        }
        for (i, node) in self.nodes.iter().enumerate().take(MAX_NODES) {
            let Some(retry) = &node.retry else { continue };
            let at = format!("spec.nodes[{i}].retry");
            if !node.kind.retry_safe() {
                errors.push(
                    at.as_str(),
                    Reason::Invalid,
                    format!(
                        "a {} node may have taken effect when it fails: only Prebuild, Create and MetaLock nodes retry",
                        node.kind.as_str()
                    ),
                );
            }
            retry.validate(errors, &at);
        }
        if let Some(seconds) = self.active_deadline_seconds {
            if !(1..=MAX_DEADLINE_SECONDS).contains(&seconds) {
                errors.push(
                    "spec.activeDeadlineSeconds",
                    Reason::Invalid,
                    format!("{seconds}: must be between 1 and {MAX_DEADLINE_SECONDS} (a year)"),
                );
            }
        }
        if let Some(seconds) = self.ttl_seconds_after_finished {
            if !(0..=MAX_TTL_SECONDS).contains(&seconds) {
                errors.push(
                    "spec.ttlSecondsAfterFinished",
                    Reason::Invalid,
                    format!("{seconds}: must be between 0 and {MAX_TTL_SECONDS} (a year)"),
                );
            }
        }
        for (i, agent) in self.agents.iter().enumerate() {
            validation::name(errors, &format!("spec.agents[{i}]"), agent);
        }
        if self.nodes.is_empty() {
            if self.agents.is_empty() {
                errors.push(
                    "spec.nodes",
                    Reason::Required,
                    "a Job needs at least one node, or spec.agents for a template Job",
                );
            } else if !self.template.builds_from_agents() {
                errors.push(
                    "spec.template",
                    Reason::Invalid,
                    format!("{:?} is not built from agents; give spec.nodes instead", self.template.as_str()),
                );
            }
        }
        dag::validate(errors, &self.nodes);
    }

    /// Parses every node's params into its action ([`JobNode::action`]), each problem
    /// at its field in the spec, e.g. `spec.nodes[3].params.relok`. A spec of more than
    /// [`MAX_NODES`] nodes is refused by [`JobSpec::validate_graph`] alone.
    pub fn validate_params(&self, errors: &mut Errors) {
        if self.nodes.len() > MAX_NODES {
            return;
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if let Err(err) = node.action() {
                errors.0.extend(err.at(&format!("spec.nodes[{i}]")));
            }
        }
    }
}

impl Resource for Job {
    fn validate(&self, errors: &mut Errors) {
        self.spec.validate_graph(errors);
        // The params are checked while the Job may still be taken. Once claimed its spec
        // is fixed and the scheduler's: checking it again on each status write would
        // leave a Job stored before a check existed unclaimable, its progress unwritable.
        // Its scheduler fails the node whose params do not parse instead, naming why.
        if self.status.waiting() {
            self.spec.validate_params(errors);
        }

        let ids: BTreeSet<&str> = self.spec.nodes.iter().map(|n| n.id.as_str()).collect();
        let mut seen = BTreeSet::new();
        for (i, node) in self.status.nodes.iter().enumerate() {
            let at = format!("status.nodes[{i}].id");
            if !ids.contains(node.id.as_str()) {
                errors.push(
                    at,
                    Reason::Invalid,
                    format!("{:?}: no node with this id in spec.nodes", node.id),
                );
            } else if !seen.insert(node.id.as_str()) {
                errors.push(at, Reason::Duplicate, format!("{:?}", node.id));
            }
        }
        for (i, child) in self.status.children.iter().enumerate() {
            validation::name(errors, &format!("status.children[{i}]"), child);
        }
    }

    /// Once claimed, the spec is the one the scheduler runs: it is fixed. Before that
    /// the intake writes the nodes it expanded from a template Job.
    fn validate_update(&self, old: &Self, errors: &mut Errors) {
        if old.status.claim.is_some() {
            validation::immutable(errors, "spec", &self.spec, &old.spec);
        }
    }

    fn columns() -> Vec<Column> {
        vec![
            Column::new("Template", "The operation, spec.template."),
            Column::new("Phase", "Roll-up state, status.phase."),
            Column::new("Nodes", "Nodes done of nodes in the DAG."),
            Column::new("Priority", "Where its nodes compete for build slots and leases, spec.priority."),
            Column::new(
                "Attempts",
                "The most tries any node took, status.nodes[].attempt (above 1: it retried).",
            ),
            Column::new("Agents", "Agents the nodes act on."),
            Column::wide("Source", "Where the Job came from, spec.source."),
            Column::wide("Reason", "Why the Job was submitted, spec.reason."),
        ]
    }

    fn cells(&self) -> Vec<Value> {
        let done = self.status.nodes.iter().filter(|n| n.state == JobNodeState::Done).count();
        vec![
            self.spec.template.as_str().into(),
            self.status.phase.map_or("", JobPhase::as_str).into(),
            format!("{done}/{}", self.spec.nodes.len()).into(),
            self.spec.priority.into(),
            self.status.nodes.iter().filter_map(|n| n.attempt).max().unwrap_or(0).into(),
            self.agents().join(",").into(),
            self.spec.source.as_str().into(),
            self.spec.reason.clone().unwrap_or_default().into(),
        ]
    }
}

impl Job {
    /// The agents the Job's nodes act on, each once, in node order. A Job has no agent of
    /// its own: a DAG can span agents.
    pub fn agents(&self) -> Vec<&str> {
        let mut seen = BTreeSet::new();
        self.spec.nodes.iter().filter_map(|n| n.agent.as_deref()).filter(|a| seen.insert(*a)).collect()
    }

    /// When the daemon deletes this Job: `spec.ttlSecondsAfterFinished` after
    /// `status.finishedAt`, or without a TTL of its own `max_age` (the daemon's
    /// `--job-history-max-age`) after it. `None` while the Job has not settled (a
    /// `Failed` Job may still run an AfterAny node; `finishedAt` is set once it is over),
    /// while it is being deleted, and when neither applies: it is kept.
    pub fn expires_at(&self, max_age: Option<Duration>) -> Option<crate::meta::Time> {
        if self.metadata.deletion_timestamp.is_some() || !self.status.settled() {
            return None;
        }
        let finished = self.status.finished_at?;
        let keep = match self.spec.ttl_seconds_after_finished {
            Some(seconds) => chrono::Duration::seconds(seconds.max(0)),
            None => chrono::Duration::from_std(max_age?).ok()?,
        };
        finished.0.checked_add_signed(keep).map(crate::meta::Time)
    }
}

#[cfg(test)]
mod tests;
