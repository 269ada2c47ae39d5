//! The `Agent` kind: a supervised workload whose configuration lives in git, with a
//! durable power intent (`spec.wanted`) that Reconcile nodes converge the observed
//! power (`status.power`) to.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::meta::{Condition, ConditionStatus};
use crate::resource::{Column, Resource};
use crate::validation::{self, Errors, Reason};

mod phase;
pub use phase::{
    bad_when_true, phase, stderr_tail, AgentPhase, LastExit, LAST_EXIT_BYTES, LAST_EXIT_LINES,
    REASON_BUILD_FAILED, REASON_START_FAILED, REASON_STOP_FAILED,
};

crate::resource! {
    /// An agent: a supervised workload (a local process tree, a NixOS container or a
    /// Docker container) whose configuration lives in a git repository. `spec.wanted` is
    /// the durable power intent; the Agent controller and the scheduler's Reconcile nodes
    /// converge the observed power to it.
    Agent, AgentList, AgentSpec, AgentStatus, plural = "agents", singular = "agent", short = ["ag"]
}

/// The `Ready` condition: the agent runs its applied config and answers.
pub const CONDITION_READY: &str = "Ready";
/// The `Converged` condition: observed power and applied rev match the spec.
pub const CONDITION_CONVERGED: &str = "Converged";
/// The `Crashed` condition: the agent stopped without being asked to.
pub const CONDITION_CRASHED: &str = "Crashed";
/// The `Building` condition: True while a spawn, rebuild or move Job builds the agent;
/// False with reason `BuildFailed` when its newest build failed.
pub const CONDITION_BUILDING: &str = "Building";
/// The `LimitsEnforced` condition: whether the host enforces `spec.resources` (False
/// carries the reason; limits are never silently ignored).
pub const CONDITION_LIMITS_ENFORCED: &str = "LimitsEnforced";
/// The `Placed` condition of an agent with `spec.placement`: True once its node runs and
/// serves its runtime; False (with the reason) while it waits for the node.
pub const CONDITION_PLACED: &str = "Placed";
/// The `NodeLost` condition of a placed agent: True while its node is gone or cannot be
/// reached (its observed power is then `Lost`). Nothing moves the agent by itself.
pub const CONDITION_NODE_LOST: &str = "NodeLost";

/// What is wanted of an agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// Power intent: `Up` (the default) or `Offline`. Power verbs write it through the
    /// submit layer together with their Job, so rapid toggles are last-writer-wins.
    #[serde(default)]
    pub wanted: Wanted,
    /// Where the agent's configuration lives and which revision to apply.
    #[serde(default)]
    pub config: ConfigSource,
    /// How the agent runs, and the settings of that runtime.
    #[serde(default)]
    pub runtime: AgentRuntime,
    /// Resource limits; unset fields take the host defaults (`200%` CPU, `4G` memory).
    #[serde(default, skip_serializing_if = "Resources::is_empty")]
    pub resources: Resources,
    /// Tool groups and capabilities granted to the agent.
    #[serde(default, skip_serializing_if = "Permissions::is_empty")]
    pub permissions: Permissions,
    /// Name of the parent agent in the agent hierarchy, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Where the agent runs: absent, on the daemon's own host; with `node`, on that fleet
    /// Node, whose worker serves the agent's runtime. Changing it moves the agent: one
    /// `Move` Job stops it where it was (when that host can be reached), builds it on the
    /// new host, and starts it there if wanted Up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// Where an agent runs (`spec.placement`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The fleet Node (a DNS-1123 label) whose worker runs the agent. A Node that does
    /// not exist or is not Running yet is accepted: the agent waits for it, with its
    /// `Placed` condition False saying why. Nothing moves an agent by itself.
    pub node: String,
}

impl AgentSpec {
    /// The fleet Node the agent is placed on, if any.
    pub fn node(&self) -> Option<&str> {
        self.placement.as_ref().map(|p| p.node.as_str())
    }
}

/// Power intent of an agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum Wanted {
    /// The agent should run.
    #[default]
    Up,
    /// The agent should be stopped.
    Offline,
}

impl Wanted {
    /// The serialized name, e.g. `Up`.
    pub fn as_str(self) -> &'static str {
        match self {
            Wanted::Up => "Up",
            Wanted::Offline => "Offline",
        }
    }
}

/// The git repository holding an agent's configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigSource {
    /// The repository: a URL (`https://…`, `ssh://…`, `file://…`, `git@host:path`) or a
    /// local path (a relative one is resolved against the daemon's working directory).
    /// Required unless the runtime is `docker`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repo: String,
    /// Revision to apply: a commit, tag or branch. Unset means the head of the default
    /// branch at the time of the build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rev: Option<String>,
    /// Subdirectory of the repository that holds the configuration (relative, without
    /// `..`). Unset means the repository root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

/// Which runtime runs an agent, and its settings. Only the settings block named by
/// `type` may be set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRuntime {
    /// The runtime: `process` (the default), `nixosContainer` or `docker`.
    #[serde(default, rename = "type")]
    pub type_: RuntimeType,
    /// How long a graceful stop waits for the agent's harness to clear the fence before
    /// stopping it anyway, in seconds. Defaults to 180.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_stop_seconds: Option<u32>,
    /// Settings of the `process` runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessRuntime>,
    /// Settings of the `nixosContainer` runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nixos_container: Option<NixosContainerRuntime>,
    /// Settings of the `docker` runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docker: Option<DockerRuntime>,
}

/// The runtime of an agent. Each value is also the name of the `spec.runtime` field
/// that holds its settings, so it is written in camelCase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum RuntimeType {
    /// A supervised local process tree (the embedded default).
    #[default]
    Process,
    /// A NixOS container built from the meta flake (`nixos-container`, systemd).
    NixosContainer,
    /// A Docker container.
    Docker,
}

impl RuntimeType {
    /// The serialized name, which is also the settings field it selects.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeType::Process => "process",
            RuntimeType::NixosContainer => "nixosContainer",
            RuntimeType::Docker => "docker",
        }
    }
}

/// Settings of the `process` runtime: a generation of the config repository is checked
/// out and built, then the command runs in it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessRuntime {
    /// Command (program and arguments) that builds a checked-out generation, run in its
    /// directory by Prebuild. Unset means the generation needs no build.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub build: Vec<String>,
    /// Command (program and arguments) that runs the agent, started in the current
    /// generation's directory. Required.
    #[serde(default)]
    pub command: Vec<String>,
    /// Environment variables of the agent process.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// Settings of the `nixosContainer` runtime.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NixosContainerRuntime {
    /// Extra `systemd-nspawn` flags (`EXTRA_NSPAWN_FLAGS`), written by WriteDropin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nspawn_flags: Vec<String>,
}

/// Settings of the `docker` runtime.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DockerRuntime {
    /// Image to run, e.g. `ghcr.io/example/agent:1.2`. Required.
    #[serde(default)]
    pub image: String,
    /// Command overriding the image's entrypoint arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Environment variables of the container.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Docker network to attach the container to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

/// Resource limits of an agent, as systemd `CPUQuota=` and `MemoryMax=` take them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// CPU cap as a percentage of one core, e.g. `200%` for two cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_quota: Option<String>,
    /// Memory cap in bytes with an optional K, M, G or T suffix, e.g. `4G`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<String>,
}

impl Resources {
    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        self.cpu_quota.is_none() && self.memory_max.is_none()
    }
}

/// What an agent may do; WritePermFile commits these to the meta repo.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Permissions {
    /// Tool groups the agent may use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_groups: Vec<String>,
    /// Capabilities granted to the agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

impl Permissions {
    /// True when nothing is granted.
    pub fn is_empty(&self) -> bool {
        self.tool_groups.is_empty() && self.capabilities.is_empty()
    }
}

/// What is observed of an agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// Where the agent stands, in one word (`Running`, `Stopped`, `CrashLoopBackOff`,
    /// `BuildFailed` …): worked out from `spec.wanted` and the rest of the status by the
    /// daemon with each status write of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AgentPhase>,
    /// How the agent's process last ended on its own (a crash, or an exit nobody asked
    /// for): exit code or signal, when, and the last lines of its stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<LastExit>,
    /// Observed power state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<Power>,
    /// The config revision (a commit) the agent currently runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_rev: Option<String>,
    /// The fleet Node the agent's installation is on (absent: the daemon's host), as its
    /// spawn or its last move left it. It differs from `spec.placement.node` while a move
    /// is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Name of the Job currently holding or waiting for this agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_job: Option<String>,
    /// The `metadata.generation` the controller last acted on: a Job covering it has
    /// been submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Fingerprint of `spec.config` and `spec.runtime` that the last spawn or rebuild
    /// Job was submitted for; when the spec's fingerprint differs, the Agent controller
    /// rebuilds the agent (once per change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_fingerprint: Option<String>,
    /// How many times crash-watch restarted the agent after it crashed (exited on its
    /// own, or died within the start grace, while wanted Up), as a pod's
    /// `restartCount`: kept across daemon restarts and never reset.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// `Ready`, `Converged` and `Crashed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Observed power state of an agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum Power {
    /// The agent runs.
    Running,
    /// The agent is being started.
    Starting,
    /// The agent is being stopped.
    Stopping,
    /// The agent is not running.
    Stopped,
    /// The runtime could not tell.
    #[default]
    Unknown,
    /// The agent's fleet node is gone or cannot be reached: what runs there is unknown.
    Lost,
}

impl Power {
    /// The serialized name, e.g. `Running`.
    pub fn as_str(self) -> &'static str {
        match self {
            Power::Running => "Running",
            Power::Starting => "Starting",
            Power::Stopping => "Stopping",
            Power::Stopped => "Stopped",
            Power::Unknown => "Unknown",
            Power::Lost => "Lost",
        }
    }
}

impl AgentStatus {
    /// The condition of the given type, if reported.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// Agent names ordered parents before children (`spec.parent`), otherwise by name. A
/// parent outside the set is ignored; a cycle (which validation should prevent) is
/// broken at the first name reached.
pub fn parents_first(agents: &[Agent]) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let parent: BTreeMap<&str, Option<&str>> =
        agents.iter().map(|a| (a.metadata.name.as_str(), a.spec.parent.as_deref())).collect();
    let mut done = BTreeSet::new();
    let mut order = Vec::with_capacity(agents.len());
    for &name in parent.keys() {
        // Walk up to the highest unplaced ancestor in the set, then place downwards.
        let mut chain = vec![name];
        let mut seen: BTreeSet<&str> = [name].into();
        while let Some(Some(up)) = parent.get(chain.last().unwrap()) {
            if done.contains(up) || !parent.contains_key(up) || !seen.insert(up) {
                break;
            }
            chain.push(up);
        }
        for n in chain.into_iter().rev() {
            if done.insert(n) {
                order.push(n.to_string());
            }
        }
    }
    order
}

/// A stable fingerprint of what a build depends on: `spec.config`, `spec.runtime`,
/// `spec.resources` (the drop-in a swap rewrites) and `spec.permissions` (a change is
/// the perm-change shape: WritePermFile, then a rebuild). Stored in
/// `status.configFingerprint`, so it must not change between releases.
pub fn fingerprint(agent: &Agent) -> String {
    let text = serde_json::json!({"config": agent.spec.config, "runtime": agent.spec.runtime,
                                  "resources": agent.spec.resources, "permissions": agent.spec.permissions})
    .to_string();
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref()[..12].iter().map(|b| format!("{b:02x}")).collect()
}

impl Resource for Agent {
    fn validate(&self, errors: &mut Errors) {
        let spec = &self.spec;
        let config = &spec.config;
        if config.repo.is_empty() {
            if spec.runtime.type_ != RuntimeType::Docker {
                errors.push("spec.config.repo", Reason::Required, "a config repository is required");
            }
        } else {
            validation::argument(errors, "spec.config.repo", &config.repo);
        }
        if let Some(rev) = &config.rev {
            validation::argument(errors, "spec.config.rev", rev);
        }
        if let Some(dir) = &config.dir {
            let bad = dir.is_empty() || dir.starts_with('/') || dir.split('/').any(|part| part == "..");
            if dir.chars().any(char::is_control) {
                no_control_characters(errors, "spec.config.dir", dir);
            } else if bad {
                errors.push(
                    "spec.config.dir",
                    Reason::Invalid,
                    format!("{dir:?}: must be a relative path inside the repository, without '..'"),
                );
            }
        }
        validate_runtime(errors, &spec.runtime);
        if let Some(cpu) = &spec.resources.cpu_quota {
            validation::percent(errors, "spec.resources.cpuQuota", cpu);
        }
        if let Some(mem) = &spec.resources.memory_max {
            validation::byte_size(errors, "spec.resources.memoryMax", mem);
        }
        validation::tokens(errors, "spec.permissions.toolGroups", &spec.permissions.tool_groups);
        validation::tokens(errors, "spec.permissions.capabilities", &spec.permissions.capabilities);
        if let Some(parent) = &spec.parent {
            validation::name(errors, "spec.parent", parent);
            if *parent == self.metadata.name {
                errors.push(
                    "spec.parent",
                    Reason::Invalid,
                    format!("{parent:?}: an agent cannot be its own parent"),
                );
            }
        }
        if let Some(placement) = &spec.placement {
            validation::name(errors, "spec.placement.node", &placement.node);
            if spec.runtime.type_ != RuntimeType::Process {
                errors.push(
                    "spec.placement",
                    Reason::Forbidden,
                    format!(
                        "a fleet node's worker runs process agents only, not spec.runtime.type {:?}",
                        spec.runtime.type_.as_str()
                    ),
                );
            }
        }
        if let Some(job) = &self.status.active_job {
            validation::name(errors, "status.activeJob", job);
        }
        if let Some(node) = &self.status.node {
            validation::name(errors, "status.node", node);
        }
        validation::conditions(errors, "status.conditions", &self.status.conditions);
        if let Some(exit) = &self.status.last_exit {
            exit.validate(errors, "status.lastExit");
        }
    }

    fn derive_status(&mut self) {
        self.status.phase = Some(phase(self));
    }

    fn columns() -> Vec<Column> {
        vec![
            Column::new("Wanted", "The power intent, spec.wanted."),
            Column::new("Observed", "The observed power, status.power."),
            Column::new(
                "Status",
                "Where it stands in one word (Running, Stopped, CrashLoopBackOff, BuildFailed …), status.phase.",
            ),
            Column::new("Ready", "Status of the Ready condition."),
            Column { type_: "integer", ..Column::new("Restarts", "Crash restarts, status.restarts.") },
            Column::new("Rev", "The applied config revision, status.appliedRev."),
            Column::wide("Runtime", "The runtime, spec.runtime.type."),
            Column::wide("Active Job", "The Job holding the agent, status.activeJob."),
            Column::wide("Parent", "The parent agent, spec.parent."),
            Column::wide("Node", "The fleet node it is placed on, spec.placement.node."),
        ]
    }

    fn cells(&self) -> Vec<Value> {
        let ready = match self.status.condition(CONDITION_READY).map(|c| c.status) {
            Some(ConditionStatus::True) => "True",
            Some(ConditionStatus::False) => "False",
            Some(ConditionStatus::Unknown) => "Unknown",
            None => "",
        };
        vec![
            self.spec.wanted.as_str().into(),
            self.status.power.map_or("", Power::as_str).into(),
            phase(self).as_str().into(),
            ready.into(),
            self.status.restarts.into(),
            self.status.applied_rev.as_deref().map_or("", short_rev).into(),
            self.spec.runtime.type_.as_str().into(),
            self.status.active_job.clone().unwrap_or_default().into(),
            self.spec.parent.clone().unwrap_or_default().into(),
            self.spec.node().unwrap_or_default().into(),
        ]
    }
}

/// A full commit hash is cut to 12 characters for tables; anything else (a tag, a
/// branch) is shown whole.
fn short_rev(rev: &str) -> &str {
    if rev.len() > 12 && rev.bytes().all(|b| b.is_ascii_hexdigit()) {
        &rev[..12]
    } else {
        rev
    }
}

fn validate_runtime(errors: &mut Errors, runtime: &AgentRuntime) {
    let chosen = runtime.type_;
    let blocks = [
        (RuntimeType::Process, runtime.process.is_some()),
        (RuntimeType::NixosContainer, runtime.nixos_container.is_some()),
        (RuntimeType::Docker, runtime.docker.is_some()),
    ];
    for (type_, present) in blocks {
        if present && type_ != chosen {
            errors.push(
                format!("spec.runtime.{}", type_.as_str()),
                Reason::Forbidden,
                format!("may only be set when spec.runtime.type is {:?}", type_.as_str()),
            );
        }
    }
    match chosen {
        RuntimeType::Process => match &runtime.process {
            None => {
                errors.push("spec.runtime.process", Reason::Required, "the process runtime needs a command")
            }
            Some(process) => {
                if process.command.is_empty() {
                    errors.push("spec.runtime.process.command", Reason::Required, "a command is required");
                } else {
                    validation::argument(errors, "spec.runtime.process.command[0]", &process.command[0]);
                }
                if let Some(program) = process.build.first() {
                    validation::argument(errors, "spec.runtime.process.build[0]", program);
                }
                arguments(errors, "spec.runtime.process.command", &process.command, 1);
                arguments(errors, "spec.runtime.process.build", &process.build, 1);
                validation::env(errors, "spec.runtime.process.env", &process.env);
            }
        },
        RuntimeType::NixosContainer => {
            for (i, flag) in runtime.nixos_container.iter().flat_map(|n| &n.nspawn_flags).enumerate() {
                if flag.chars().any(char::is_control) {
                    no_control_characters(
                        errors,
                        &format!("spec.runtime.nixosContainer.nspawnFlags[{i}]"),
                        flag,
                    );
                } else if flag.trim().is_empty() {
                    errors.push(
                        format!("spec.runtime.nixosContainer.nspawnFlags[{i}]"),
                        Reason::Required,
                        "must not be empty",
                    );
                }
            }
        }
        RuntimeType::Docker => match &runtime.docker {
            None => errors.push("spec.runtime.docker", Reason::Required, "the docker runtime needs an image"),
            Some(docker) => {
                validation::argument(errors, "spec.runtime.docker.image", &docker.image);
                arguments(errors, "spec.runtime.docker.command", &docker.command, 0);
                validation::env(errors, "spec.runtime.docker.env", &docker.env);
                if let Some(network) = &docker.network {
                    validation::argument(errors, "spec.runtime.docker.network", network);
                }
            }
        },
    }
}

/// Arguments from index `from` on (a program, index 0, is checked whole by
/// [`validation::argument`]): any text but a control character — a NUL cannot reach
/// `exec`, and an escape sequence would reach the operator's terminal in every listing.
fn arguments(errors: &mut Errors, field: &str, args: &[String], from: usize) {
    for (i, arg) in args.iter().enumerate().skip(from) {
        if arg.chars().any(char::is_control) {
            no_control_characters(errors, &format!("{field}[{i}]"), arg);
        }
    }
}

/// Refuses a path or argument holding a control character (a NUL byte cuts a path short
/// where the runtime opens it), naming `field`.
fn no_control_characters(errors: &mut Errors, field: &str, value: &str) {
    errors.push(field, Reason::Invalid, format!("{value:?}: must not contain control characters"));
}

#[cfg(test)]
mod tests {
    fn family(name: &str, parent: Option<&str>) -> Agent {
        let mut agent = Agent::new(name, Default::default());
        agent.spec.parent = parent.map(str::to_string);
        agent
    }

    #[test]
    fn parents_come_first() {
        let cases: Vec<(Vec<Agent>, &str)> = vec![
            (vec![family("b", None), family("a", None)], "a b"),
            (vec![family("child", Some("root")), family("root", None)], "root child"),
            (vec![family("a", Some("m")), family("m", Some("z")), family("z", None)], "z m a"),
            (vec![family("a", Some("gone"))], "a"),
            (vec![family("a", Some("b")), family("b", Some("a"))], "b a"),
        ];
        for (agents, want) in cases {
            assert_eq!(parents_first(&agents).join(" "), want);
        }
    }

    /// The fingerprint is stored in status: a release that changed it would rebuild
    /// every agent once. Pinned, and moved by what a build depends on only.
    #[test]
    fn the_fingerprint_is_stable_and_follows_build_inputs() {
        let agent = family("a", None);
        assert_eq!(fingerprint(&agent), "c6cbe51151906c966e95d532");
        let mut labelled = agent.clone();
        labelled.metadata.labels.insert("k".into(), "v".into());
        labelled.spec.wanted = Wanted::Offline;
        assert_eq!(fingerprint(&labelled), fingerprint(&agent));
        let mut moved = agent.clone();
        moved.spec.config.rev = Some("v2".into());
        assert_ne!(fingerprint(&moved), fingerprint(&agent));
    }

    use serde_json::json;

    use super::*;
    use crate::resource::{decode, validate};
    use crate::testing::{error_fields, merge};

    fn valid() -> Value {
        json!({
            "apiVersion": "hive.dev/v1",
            "kind": "Agent",
            "metadata": {"name": "alpha"},
            "spec": {
                "wanted": "Up",
                "config": {"repo": "https://git.example.com/agents/alpha.git", "rev": "main"},
                "runtime": {"type": "process", "process": {"command": ["./run"]}},
                "resources": {"cpuQuota": "200%", "memoryMax": "4G"},
                "permissions": {"toolGroups": ["git"], "capabilities": ["spawn"]},
                "parent": "root"
            }
        })
    }

    fn check(patch: Value) -> Vec<String> {
        let mut value = valid();
        merge(&mut value, patch);
        error_fields::<Agent>(&value)
    }

    #[test]
    fn valid_agent_round_trips() {
        let (agent, unknown) = decode::<Agent>(&valid()).unwrap();
        assert!(unknown.is_empty());
        assert_eq!(validate(&agent), vec![]);
        let mut want = valid();
        want["status"] = json!({});
        assert_eq!(serde_json::to_value(&agent).unwrap(), want);
    }

    #[test]
    fn defaults_fill_in_and_empty_fields_are_omitted() {
        let value = json!({"metadata": {"name": "a"}, "spec": {"config": {"repo": "/srv/a"},
            "runtime": {"process": {"command": ["run"]}}}});
        let (agent, _) = decode::<Agent>(&value).unwrap();
        assert_eq!(agent.spec.wanted, Wanted::Up);
        assert_eq!(agent.spec.runtime.type_, RuntimeType::Process);
        let out = serde_json::to_value(&agent).unwrap();
        assert_eq!(
            out["spec"],
            json!({"wanted": "Up", "config": {"repo": "/srv/a"},
            "runtime": {"type": "process", "process": {"command": ["run"]}}})
        );
        assert_eq!(out["status"], json!({}));
    }

    #[test]
    fn validation_rules_name_their_fields() {
        let cases: &[(Value, &[&str])] = &[
            (json!({}), &[]),
            (json!({"spec": {"resources": {"memoryMax": "4GB"}}}), &["spec.resources.memoryMax"]),
            (json!({"spec": {"resources": {"cpuQuota": "2"}}}), &["spec.resources.cpuQuota"]),
            (json!({"spec": {"config": {"repo": ""}}}), &["spec.config.repo"]),
            (json!({"spec": {"config": {"rev": "--upload-pack=x"}}}), &["spec.config.rev"]),
            (json!({"spec": {"config": {"dir": "../etc"}}}), &["spec.config.dir"]),
            (json!({"spec": {"config": {"dir": "a\u{0}b"}}}), &["spec.config.dir"]),
            (
                json!({"spec": {"runtime": {"process": {"command": ["sh", "ok arg", "x\u{1b}[31m"]}}}}),
                &["spec.runtime.process.command[2]"],
            ),
            (json!({"spec": {"parent": "Root"}}), &["spec.parent"]),
            (json!({"spec": {"parent": "alpha"}}), &["spec.parent"]),
            (
                json!({"spec": {"permissions": {"toolGroups": ["git", "git"]}}}),
                &["spec.permissions.toolGroups[1]"],
            ),
            (json!({"spec": {"permissions": {"capabilities": [""]}}}), &["spec.permissions.capabilities[0]"]),
            (json!({"spec": {"runtime": {"process": {"command": []}}}}), &["spec.runtime.process.command"]),
            (
                json!({"spec": {"runtime": {"process": {"env": {"1X": "y"}}}}}),
                &["spec.runtime.process.env.1X"],
            ),
            (
                json!({"spec": {"runtime": {"type": "docker"}}}),
                &["spec.runtime.process", "spec.runtime.docker"],
            ),
            (
                json!({"spec": {"runtime": {"type": "docker", "process": null, "docker": {"image": ""}}}}),
                &["spec.runtime.docker.image"],
            ),
            (
                json!({"spec": {"config": {"repo": null, "rev": null},
                    "runtime": {"type": "docker", "process": null, "docker": {"image": "agent:1"}}}}),
                &[],
            ),
            (json!({"status": {"activeJob": "Job_1"}}), &["status.activeJob"]),
            (
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"},
                    {"type": "Ready", "status": "False"}]}}),
                &["status.conditions[1].type"],
            ),
        ];
        for (patch, want) in cases {
            assert_eq!(check(patch.clone()), *want, "patch {patch}");
        }
    }

    #[test]
    fn unknown_fields_are_reported_with_their_path() {
        let mut value = valid();
        merge(&mut value, json!({"spec": {"bogus": 1, "runtime": {"process": {"extra": true}}}}));
        let (_, mut unknown) = decode::<Agent>(&value).unwrap();
        unknown.sort();
        assert_eq!(unknown, ["spec.bogus", "spec.runtime.process.extra"]);
    }

    #[test]
    fn bad_enum_values_fail_decoding_at_their_field() {
        let mut value = valid();
        merge(&mut value, json!({"spec": {"wanted": "Sideways"}}));
        let err = decode::<Agent>(&value).unwrap_err();
        assert_eq!(err.field, "spec.wanted");
    }

    #[test]
    fn cells_match_columns() {
        let (mut agent, _) = decode::<Agent>(&valid()).unwrap();
        agent.status.power = Some(Power::Running);
        agent.status.applied_rev = Some("0123456789abcdef0123456789abcdef01234567".into());
        agent.status.conditions.push(Condition {
            type_: CONDITION_READY.into(),
            status: ConditionStatus::True,
            ..Default::default()
        });
        assert_eq!(Agent::columns().len(), agent.cells().len());
        assert_eq!(
            agent.cells(),
            vec![
                json!("Up"),
                json!("Running"),
                json!("Running"),
                json!("True"),
                json!(0),
                json!("0123456789ab"),
                json!("process"),
                json!(""),
                json!("root"),
                json!("")
            ]
        );
        agent.spec.placement = Some(Placement { node: "node-1".into() });
        assert_eq!(agent.cells().last(), Some(&json!("node-1")));
    }
}
