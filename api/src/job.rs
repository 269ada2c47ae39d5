//! The `Job` kind: one DAG of primitive nodes submitted to the scheduler, and the
//! pure checks of its graph (unique node ids, no dangling deps, no cycles).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::meta::Time;
use crate::resource::{Column, Resource};
use crate::validation::{self, Errors, Reason};

mod dag;

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
}

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
    /// Kind-specific parameters, e.g. `{"wanted": "Offline"}` for `SetWanted`.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, Value>,
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
        }
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

/// What is observed of a Job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    /// Roll-up of the node states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobPhase>,
    /// Per-node state, keyed by node id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<JobNodeStatus>,
    /// When the scheduler accepted the Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_at: Option<Time>,
    /// When the first node started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the Job settled: every node terminal (a `Failed` Job may still run an
    /// AfterAny node until then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Human-readable summary, e.g. why the Job failed or was interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Names of the child Jobs this one fanned out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
    /// Which daemon run took the Job to its scheduler. Set exactly once, by a write
    /// conditional on the resourceVersion it read, so no two runs (a restart, a second
    /// daemon) ever run one Job. Absent while the Job waits for an intake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<JobClaim>,
}

/// The claim of a Job by one daemon run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobClaim {
    /// The claiming daemon run, unique per start of a daemon.
    pub run: String,
    /// When it claimed the Job.
    pub at: Time,
}

impl JobStatus {
    /// The status of the node with the given id, if reported.
    pub fn node(&self, id: &str) -> Option<&JobNodeStatus> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Whether the Job will not change any more: its phase is terminal and, for a
    /// `Failed` Job (failed as soon as one node failed), every node is terminal too
    /// (`finishedAt` is set then, or every reported node is terminal).
    pub fn settled(&self) -> bool {
        match self.phase {
            None => false,
            Some(JobPhase::Failed) => {
                self.finished_at.is_some() || self.nodes.iter().all(|n| n.state.is_terminal())
            }
            Some(phase) => phase.is_terminal(),
        }
    }
}

/// Roll-up state of a Job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum JobPhase {
    /// No node has started.
    Queued,
    /// Some node has started and some node is not terminal.
    Running,
    /// Every node succeeded.
    Done,
    /// At least one node failed. An AfterAny node (the Reconcile after a failed Swap) may
    /// still run; `finishedAt` is set once every node is terminal.
    Failed,
    /// Every node is terminal, none failed, at least one was cancelled.
    Cancelled,
    /// The daemon restarted while the Job was unfinished; the boot reconcile re-derives
    /// the work.
    Interrupted,
}

impl JobPhase {
    /// The serialized name, e.g. `Running`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobPhase::Queued => "Queued",
            JobPhase::Running => "Running",
            JobPhase::Done => "Done",
            JobPhase::Failed => "Failed",
            JobPhase::Cancelled => "Cancelled",
            JobPhase::Interrupted => "Interrupted",
        }
    }

    /// True once the phase will not change any more. A `Failed` Job may still have nodes
    /// running: [`JobStatus::settled`] says when the Job itself is over.
    pub fn is_terminal(self) -> bool {
        !matches!(self, JobPhase::Queued | JobPhase::Running)
    }

    /// The roll-up of node states, as the coordinator document has it: `Failed` as soon
    /// as any node failed (even while an AfterAny Reconcile still runs after a failed
    /// Swap; leases are held until every node is terminal), else `Running` while some
    /// node started and some is not terminal, else `Queued`, `Cancelled` if any was
    /// cancelled, else `Done`.
    pub fn roll_up(states: impl IntoIterator<Item = JobNodeState>) -> JobPhase {
        let (mut any, mut pending, mut started, mut failed, mut cancelled) =
            (false, false, false, false, false);
        for state in states {
            any = true;
            match state {
                JobNodeState::Queued => pending = true,
                JobNodeState::Running => (pending, started) = (true, true),
                JobNodeState::Done => started = true,
                JobNodeState::Failed => (started, failed) = (true, true),
                JobNodeState::Cancelled => cancelled = true,
            }
        }
        match () {
            _ if !any => JobPhase::Done,
            _ if failed => JobPhase::Failed,
            _ if pending && started => JobPhase::Running,
            _ if pending => JobPhase::Queued,
            _ if cancelled => JobPhase::Cancelled,
            _ => JobPhase::Done,
        }
    }
}

/// What is observed of one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobNodeStatus {
    /// The node's `id` in `spec.nodes`.
    pub id: String,
    /// Where the node is in its life.
    #[serde(default)]
    pub state: JobNodeState,
    /// Label of the step the node is on, e.g. `building toplevel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// When the node started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the node became terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Why the node failed (or which dep cancelled it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Reference to the node's build log, which `hive logs -f` follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_ref: Option<String>,
}

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum JobNodeState {
    /// Waiting for its deps and resources.
    #[default]
    Queued,
    /// Executing.
    Running,
    /// Succeeded.
    Done,
    /// Ran and failed.
    Failed,
    /// Never ran: an AfterOk dep failed or was cancelled, or the Job was cancelled while
    /// queued. Distinct from `Failed`.
    Cancelled,
}

impl JobNodeState {
    /// The serialized name, e.g. `Done`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobNodeState::Queued => "Queued",
            JobNodeState::Running => "Running",
            JobNodeState::Done => "Done",
            JobNodeState::Failed => "Failed",
            JobNodeState::Cancelled => "Cancelled",
        }
    }

    /// True once the node will not change any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobNodeState::Done | JobNodeState::Failed | JobNodeState::Cancelled)
    }
}

impl Resource for Job {
    fn validate(&self, errors: &mut Errors) {
        let spec = &self.spec;
        if let Some(parent) = &spec.parent {
            validation::name(errors, "spec.parent", parent);
        }
        if let Some(approval) = &spec.approval {
            validation::name(errors, "spec.approval", approval);
        }
        if let Some(reason) = &spec.reason {
            validation::text(errors, "spec.reason", reason);
        }
        validation::tokens(errors, "spec.inputs", &spec.inputs);
        for (i, agent) in spec.agents.iter().enumerate() {
            validation::name(errors, &format!("spec.agents[{i}]"), agent);
        }
        if spec.nodes.is_empty() {
            if spec.agents.is_empty() {
                errors.push(
                    "spec.nodes",
                    Reason::Required,
                    "a Job needs at least one node, or spec.agents for a template Job",
                );
            } else if !spec.template.builds_from_agents() {
                errors.push(
                    "spec.template",
                    Reason::Invalid,
                    format!("{:?} is not built from agents; give spec.nodes instead", spec.template.as_str()),
                );
            }
        }
        dag::validate(errors, &spec.nodes);

        let ids: BTreeSet<&str> = spec.nodes.iter().map(|n| n.id.as_str()).collect();
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
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resource::{decode, validate};

    /// A stop of two agents, one online (graceful) and one offline: one Job, one subgraph
    /// per agent.
    fn valid() -> Value {
        json!({
            "apiVersion": "hive.dev/v1",
            "kind": "Job",
            "metadata": {"name": "stop-1"},
            "spec": {
                "template": "Stop",
                "reason": "operator stop",
                "source": "Cli",
                "nodes": [
                    {"id": "a-wanted", "kind": "SetWanted", "agent": "alpha", "params": {"wanted": "Offline"}},
                    {"id": "a-signal", "kind": "Signal", "agent": "alpha", "deps": [{"node": "a-wanted", "edge": "AfterOk"}]},
                    {"id": "a-drain", "kind": "Drain", "agent": "alpha", "deps": [{"node": "a-signal", "edge": "AfterOk"}]},
                    {"id": "a-reconcile", "kind": "Reconcile", "agent": "alpha", "deps": [{"node": "a-drain", "edge": "AfterOk"}]},
                    {"id": "b-wanted", "kind": "SetWanted", "agent": "beta", "params": {"wanted": "Offline"}},
                    {"id": "b-reconcile", "kind": "Reconcile", "agent": "beta", "deps": [{"node": "b-wanted", "edge": "AfterOk"}]}
                ]
            }
        })
    }

    fn job(nodes: Value) -> Value {
        json!({"metadata": {"name": "j"}, "spec": {"template": "Rebuild", "nodes": nodes}})
    }

    fn node(id: &str, deps: &[&str]) -> Value {
        let deps: Vec<Value> = deps.iter().map(|d| json!({"node": d})).collect();
        json!({"id": id, "kind": "Reconcile", "agent": "alpha", "deps": deps})
    }

    #[test]
    fn valid_job_round_trips() {
        let (job, unknown) = decode::<Job>(&valid()).unwrap();
        assert!(unknown.is_empty());
        assert_eq!(validate(&job), vec![]);
        let mut want = valid();
        want["status"] = json!({});
        assert_eq!(serde_json::to_value(&job).unwrap(), want);
        assert_eq!(job.agents(), ["alpha", "beta"]);
    }

    #[test]
    fn edge_defaults_to_after_ok() {
        let (job, _) = decode::<Job>(&job(json!([node("a", &[]), node("b", &["a"])]))).unwrap();
        assert_eq!(job.spec.nodes[1].deps, [Dep { node: "a".into(), edge: Edge::AfterOk }]);
        assert_eq!(job.spec.source, JobSource::Api);
    }

    #[test]
    fn spec_and_status_references_are_checked() {
        let mut value = valid();
        value["spec"]["parent"] = json!("Parent");
        value["spec"]["inputs"] = json!(["hyperhive", "hyperhive"]);
        value["status"] = json!({"phase": "Running", "nodes": [{"id": "a-wanted", "state": "Done"},
            {"id": "zz"}, {"id": "a-wanted"}], "children": ["ok", "Not_ok"]});
        let fields: Vec<String> =
            validate(&decode::<Job>(&value).unwrap().0).into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "spec.parent",
                "spec.inputs[1]",
                "status.nodes[1].id",
                "status.nodes[2].id",
                "status.children[1]"
            ]
        );
    }

    #[test]
    fn unknown_fields_and_bad_kinds() {
        let mut value = valid();
        value["spec"]["bogus"] = json!(1);
        value["spec"]["nodes"][1]["deps"][0]["weight"] = json!(2);
        let (_, mut unknown) = decode::<Job>(&value).unwrap();
        unknown.sort();
        assert_eq!(unknown, ["spec.bogus", "spec.nodes[1].deps[0].weight"]);

        let mut value = valid();
        value["spec"]["nodes"][2]["kind"] = json!("Teleport");
        assert_eq!(decode::<Job>(&value).unwrap_err().field, "spec.nodes[2].kind");
    }

    #[test]
    fn a_template_job_names_agents_instead_of_nodes() {
        let fields = |spec: Value| -> Vec<String> {
            let value = json!({"metadata": {"name": "j"}, "spec": spec});
            validate(&decode::<Job>(&value).unwrap().0).into_iter().map(|e| e.field).collect()
        };
        assert_eq!(fields(json!({"template": "Restart", "agents": ["alpha"]})), Vec::<String>::new());
        assert_eq!(fields(json!({"template": "Restart"})), ["spec.nodes"]);
        assert_eq!(fields(json!({"template": "MetaUpdate", "agents": ["alpha"]})), ["spec.template"]);
        assert_eq!(fields(json!({"template": "Stop", "agents": ["alpha", "Not_ok"]})), ["spec.agents[1]"]);
    }

    #[test]
    fn the_spec_is_fixed_once_claimed() {
        let (old, _) = decode::<Job>(&valid()).unwrap();
        let mut new = old.clone();
        new.spec.reason = Some("edited".into());
        let errors = |old: &Job| {
            let mut errors = Errors::default();
            new.validate_update(old, &mut errors);
            errors.0.into_iter().map(|e| e.field).collect::<Vec<_>>()
        };
        assert_eq!(errors(&old), Vec::<String>::new(), "unclaimed: the intake may still expand it");
        let mut claimed = old.clone();
        claimed.status.claim = Some(JobClaim { run: "run-1".into(), at: Time(chrono::DateTime::UNIX_EPOCH) });
        assert_eq!(errors(&claimed), ["spec.reason"]);
    }

    #[test]
    fn roll_up() {
        use JobNodeState::*;
        let cases: &[(&[JobNodeState], JobPhase)] = &[
            (&[Queued, Queued], JobPhase::Queued),
            (&[Running, Queued], JobPhase::Running),
            (&[Done, Queued], JobPhase::Running),
            (&[Failed, Running], JobPhase::Failed),
            (&[Failed, Queued], JobPhase::Failed),
            (&[Done, Done], JobPhase::Done),
            (&[Done, Failed, Cancelled], JobPhase::Failed),
            (&[Done, Cancelled], JobPhase::Cancelled),
            (&[Cancelled, Cancelled], JobPhase::Cancelled),
        ];
        for (states, want) in cases {
            assert_eq!(JobPhase::roll_up(states.iter().copied()), *want, "{states:?}");
        }
    }

    #[test]
    fn cells_match_columns() {
        let (mut job, _) = decode::<Job>(&valid()).unwrap();
        job.status.phase = Some(JobPhase::Running);
        job.status.nodes = vec![
            JobNodeStatus { id: "a-wanted".into(), state: JobNodeState::Done, ..Default::default() },
            JobNodeStatus { id: "b-wanted".into(), state: JobNodeState::Done, ..Default::default() },
            JobNodeStatus { id: "a-signal".into(), state: JobNodeState::Running, ..Default::default() },
        ];
        assert_eq!(Job::columns().len(), job.cells().len());
        assert_eq!(
            job.cells(),
            vec![
                json!("Stop"),
                json!("Running"),
                json!("2/6"),
                json!("alpha,beta"),
                json!("Cli"),
                json!("operator stop")
            ]
        );
    }
}
