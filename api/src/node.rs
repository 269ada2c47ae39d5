//! The `Node` kind: one fleet node (a local worker process, a Docker container or a
//! Vast.ai instance) created by a Provision command, with what is observed of it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::meta::{Condition, ConditionStatus, Time};
use crate::resource::{Column, Resource};
use crate::validation::{self, Errors, Reason};

crate::resource! {
    /// A fleet node. Its spec is written once, by the Provision command that creates it,
    /// and is durable before any provider call; nothing replaces or tears a node down
    /// unless a Kill command says so.
    Node, NodeList, NodeSpec, NodeStatus, plural = "nodes", singular = "node", short = ["nd"]
}

/// What was asked for when the node was provisioned. Immutable.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// Logical id: monotonic across the fleet and never reused.
    pub logical_id: u64,
    /// Name of the Provider that runs the node.
    #[serde(default)]
    pub provider: String,
    /// Name of the FleetCommand that created the node (its command id). Absent only for
    /// an `Orphaned` node, found at the provider without a record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The provider offer leased for this node (Vast.ai ask id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offer_id: Option<u64>,
    /// Image the node runs; unset means the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Bootstrap (on-start) script; unset means the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<String>,
    /// Labels the node's worker advertises.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// How many builds of the agents placed on this node run at once on it (1 to 64;
    /// unset: 1). The daemon's host keeps its own `--build-slots` for its agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_slots: Option<u32>,
}

/// The most build slots a node may have.
pub const MAX_BUILD_SLOTS: u32 = 64;

impl NodeSpec {
    /// The node's build slots: `spec.buildSlots`, else 1.
    pub fn build_slots(&self) -> usize {
        self.build_slots.unwrap_or(1).clamp(1, MAX_BUILD_SLOTS) as usize
    }
}

/// What is observed of a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// Where the node is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<NodePhase>,
    /// The provider's handle on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderRef>,
    /// The worker's iroh endpoint id (its public key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_id: Option<String>,
    /// Addresses the worker advertises (`ip:port`, relay URLs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// SSH address of the node (`host:port`), when the image's SSH bootstrap serves one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<String>,
    /// GPUs the worker reports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Gpu>,
    /// What the worker reported of its machine when it last joined or rejoined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeFacts>,
    /// Latest telemetry, summarized from the pull stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetrySummary>,
    /// The last provider or worker error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the provider acknowledged the create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned_at: Option<Time>,
    /// When the worker first announced readiness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<Time>,
    /// When the node stopped, was killed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// `Ready`: True while the node is Running, else False with its phase as the reason
    /// (what `kubectl wait --for=condition=Ready` waits for). Kept by
    /// [`NodeStatus::sync_ready`], which every writer of the phase calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The condition type that follows a node's phase.
pub const READY: &str = "Ready";

impl NodeStatus {
    /// Brings the `Ready` condition in line with the phase: True when Running, False
    /// otherwise with the phase (or `Unknown` before any) as its reason. `now` is the
    /// transition time when its status changes. Returns true when it changed.
    pub fn sync_ready(&mut self, now: Time) -> bool {
        let running = self.phase == Some(NodePhase::Running);
        let reason = self.phase.map_or("Unknown", NodePhase::as_str);
        let message = match self.phase {
            Some(NodePhase::Running) => "the worker joined and its telemetry flows".to_string(),
            Some(phase) => format!("the node is {phase}", phase = phase.as_str()),
            None => "the node has no phase yet".to_string(),
        };
        let condition = Condition {
            type_: READY.into(),
            status: if running { ConditionStatus::True } else { ConditionStatus::False },
            reason: reason.into(),
            message,
            last_transition_time: None,
            observed_generation: None,
        };
        crate::meta::set_condition(&mut self.conditions, condition, now)
    }

    /// Sets the phase and the `Ready` condition that follows it.
    pub fn set_phase(&mut self, phase: NodePhase, now: Time) {
        self.phase = Some(phase);
        self.sync_ready(now);
    }
}

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum NodePhase {
    /// The intent is recorded; no provider call has been made.
    Pending,
    /// The provider is creating the node, or its worker has not announced readiness.
    Provisioning,
    /// The worker joined and is ready; telemetry is pulled.
    Running,
    /// The record survived but the provider resource did not (found at recovery); the
    /// node is never recreated.
    Stopped,
    /// A Kill command is stopping or destroying the node.
    Killing,
    /// Killed by a command; the record is kept.
    Killed,
    /// Provisioning or the node failed; see `error`.
    Failed,
    /// Found at the provider without a record; reported and left untouched.
    Orphaned,
}

impl NodePhase {
    /// The serialized name, e.g. `Running`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodePhase::Pending => "Pending",
            NodePhase::Provisioning => "Provisioning",
            NodePhase::Running => "Running",
            NodePhase::Stopped => "Stopped",
            NodePhase::Killing => "Killing",
            NodePhase::Killed => "Killed",
            NodePhase::Failed => "Failed",
            NodePhase::Orphaned => "Orphaned",
        }
    }
}

/// The provider's handle on a node; the field of the node's provider type is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderRef {
    /// `process`: the worker's process id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// `docker`: the container id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// `vastai`: the instance (contract) id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<u64>,
}

/// What a node's worker reports of its machine when it joins or rejoins.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeFacts {
    /// The machine's host name.
    #[serde(default)]
    pub hostname: String,
    /// Logical CPUs available to the worker.
    #[serde(default)]
    pub cpus: u32,
    /// Memory installed, in bytes.
    #[serde(default)]
    pub memory_total_bytes: u64,
    /// The worker runs in agent-only mode (`MYELIN_AGENT_ONLY=1`): membership,
    /// readiness and telemetry, no application payload.
    #[serde(default)]
    pub agent_only: bool,
    /// When the worker process started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// `Join` (first contact) or `Rejoin` (back after a lost connection or a daemon
    /// restart).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub joined_by: String,
    /// When the daemon persisted these facts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined_at: Option<Time>,
    /// The daemon run's control generation the worker is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_generation: Option<u64>,
}

/// One GPU of a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// Model name, e.g. `RTX 4090`.
    pub name: String,
    /// Memory in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
}

/// A summary of a node's latest telemetry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TelemetrySummary {
    /// When the latest frame arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Time>,
    /// CPU use, in percent of one core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<f64>,
    /// Memory in use, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_bytes: Option<u64>,
    /// Memory installed, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_total_bytes: Option<u64>,
    /// Mean GPU utilization, in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_utilization_percent: Option<f64>,
    /// GPU memory in use across all GPUs, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_used_bytes: Option<u64>,
    /// Space in use on the root filesystem, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_used_bytes: Option<u64>,
    /// Size of the root filesystem, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_total_bytes: Option<u64>,
    /// Seconds since the node's machine booted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uptime_seconds: Option<u64>,
}

impl Resource for Node {
    fn validate_update(&self, old: &Self, errors: &mut Errors) {
        Node::validate_update(self, old, errors)
    }

    fn validate(&self, errors: &mut Errors) {
        let spec = &self.spec;
        validation::name(errors, "spec.provider", &spec.provider);
        if let Some(slots) = spec.build_slots.filter(|s| !(1..=MAX_BUILD_SLOTS).contains(s)) {
            errors.push(
                "spec.buildSlots",
                Reason::Invalid,
                format!("{slots}: must be 1 to {MAX_BUILD_SLOTS}"),
            );
        }
        match &spec.command {
            Some(command) => validation::name(errors, "spec.command", command),
            // An orphan was found at the provider without a record: no command made it,
            // and it stays commandless after a Kill (Killing, Killed) too.
            None if self.status.phase != Some(NodePhase::Orphaned)
                && self.metadata.labels.get(crate::names::ORPHAN_LABEL).map(String::as_str)
                    != Some("true") =>
            {
                errors.push(
                    "spec.command",
                    Reason::Required,
                    "the FleetCommand that created the node is required",
                )
            }
            None => {}
        }
        if let Some(image) = &spec.image {
            validation::argument(errors, "spec.image", image);
        }
        validation::labels(errors, "spec.labels", &spec.labels);
        for (i, gpu) in self.status.gpus.iter().enumerate() {
            if gpu.name.is_empty() {
                errors.push(format!("status.gpus[{i}].name"), Reason::Required, "must not be empty");
            }
        }
    }

    fn columns() -> Vec<Column> {
        vec![
            Column {
                name: "ID",
                type_: "integer",
                description: "The logical id, spec.logicalId.",
                priority: 0,
            },
            Column::new("Provider", "The Provider running the node, spec.provider."),
            Column::new("Phase", "Where the node is in its life, status.phase."),
            Column::new(
                "Endpoint",
                "The worker's iroh endpoint id, status.endpointId, in iroh's short form (its first 10 \
                 characters); the whole id with -o wide.",
            ),
            Column::wide("Endpoint ID", "The worker's whole iroh endpoint id, status.endpointId."),
            Column::wide("Addresses", "Addresses the worker advertises, status.addresses."),
            Column::wide("GPUs", "GPUs of the node, status.gpus."),
            Column::wide("Command", "The FleetCommand that created the node, spec.command."),
        ]
    }

    fn cells(&self) -> Vec<Value> {
        vec![
            self.spec.logical_id.into(),
            self.spec.provider.clone().into(),
            self.status.phase.map_or("", NodePhase::as_str).into(),
            short_endpoint(self.status.endpoint_id.as_deref().unwrap_or_default()).into(),
            self.status.endpoint_id.clone().unwrap_or_default().into(),
            self.status.addresses.join(",").into(),
            gpu_summary(&self.status.gpus).into(),
            self.spec.command.clone().unwrap_or_default().into(),
        ]
    }
}

impl Node {
    /// Checks an update against the stored object: the spec is written once.
    pub fn validate_update(&self, old: &Node, errors: &mut Errors) {
        validation::immutable(errors, "spec", &self.spec, &old.spec);
    }
}

/// The characters of an endpoint id the default table shows, as iroh's `fmt_short`.
const SHORT_ENDPOINT: usize = 10;

/// `ae58ff8833…`: an endpoint id (64 hex characters) in its short form; a short one as it is.
fn short_endpoint(id: &str) -> String {
    if id.chars().count() <= SHORT_ENDPOINT {
        return id.to_string();
    }
    id.chars().take(SHORT_ENDPOINT).chain(['…']).collect()
}

/// `2x RTX 4090, 1x A100`: GPUs counted per model, in order of first appearance.
fn gpu_summary(gpus: &[Gpu]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for gpu in gpus {
        match counts.iter_mut().find(|(name, _)| *name == gpu.name) {
            Some((_, n)) => *n += 1,
            None => counts.push((&gpu.name, 1)),
        }
    }
    counts.iter().map(|(name, n)| format!("{n}x {name}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resource::{decode, validate};
    use crate::testing::{error_fields, merge};

    fn valid() -> Value {
        json!({
            "apiVersion": "hive.dev/v1",
            "kind": "Node",
            "metadata": {"name": "node-7"},
            "spec": {
                "logicalId": 7,
                "provider": "vastai",
                "command": "3f6c1d2e-8a4b-4c3d-9e2f-1a2b3c4d5e6f",
                "offerId": 123456,
                "image": "ghcr.io/example/myelin-node:cuda",
                "labels": {"pool": "gpu"}
            },
            "status": {
                "phase": "Running",
                "providerRef": {"instanceId": 998877},
                "endpointId": "ae58ff8833241ac82d6ff7611046ed67b5072d142c588d0063e942d9a75502b6",
                "addresses": ["203.0.113.7:4433"],
                "gpus": [{"name": "RTX 4090", "memoryMib": 24564}, {"name": "RTX 4090", "memoryMib": 24564}],
                "telemetry": {"updatedAt": "2026-11-29T14:39:19Z", "cpuPercent": 12.5, "gpuUtilizationPercent": 80.0},
                "provisionedAt": "2026-11-29T14:30:00Z",
                "readyAt": "2026-11-29T14:35:00Z"
            }
        })
    }

    fn check(patch: Value) -> Vec<String> {
        let mut value = valid();
        merge(&mut value, patch);
        error_fields::<Node>(&value)
    }

    /// Regression (issue 32): the default table's Endpoint column held all 64 hex
    /// characters; it is short now, the whole id in the wide column beside it.
    #[test]
    fn the_endpoint_is_short_in_the_default_columns_and_whole_in_wide() {
        let (node, _) = decode::<Node>(&valid()).unwrap();
        let columns = Node::columns();
        let cells = node.cells();
        let at = |name: &str| columns.iter().position(|c| c.name == name).unwrap();
        assert_eq!(cells[at("Endpoint")], json!("ae58ff8833…"));
        assert_eq!(columns[at("Endpoint")].priority, 0);
        assert_eq!(cells[at("Endpoint ID")], json!(valid()["status"]["endpointId"]));
        assert_eq!(columns[at("Endpoint ID")].priority, 1);
        assert_eq!(short_endpoint(""), "");
    }

    #[test]
    fn valid_node_round_trips() {
        let (node, unknown) = decode::<Node>(&valid()).unwrap();
        assert!(unknown.is_empty());
        assert_eq!(validate(&node), vec![]);
        assert_eq!(serde_json::to_value(&node).unwrap(), valid());
    }

    #[test]
    fn validation_rules_name_their_fields() {
        let cases: Vec<(Value, &[&str])> = vec![
            (json!({}), &[]),
            (json!({"spec": {"provider": ""}}), &["spec.provider"]),
            (json!({"spec": {"command": "Not A Name"}}), &["spec.command"]),
            (json!({"spec": {"command": null}}), &["spec.command"]),
            (json!({"spec": {"command": null}, "status": {"phase": "Orphaned"}}), &[]),
            // A killed orphan keeps its label: its status writes stay valid.
            (
                json!({"metadata": {"labels": {"hive.dev/orphan": "true"}}, "spec": {"command": null},
                       "status": {"phase": "Killed"}}),
                &[],
            ),
            (json!({"spec": {"command": null}, "status": {"phase": "Killed"}}), &["spec.command"]),
            (json!({"spec": {"image": "-v"}}), &["spec.image"]),
            (json!({"spec": {"labels": {"pool": "-gpu"}}}), &["spec.labels.pool"]),
            (json!({"status": {"gpus": [{"name": ""}]}}), &["status.gpus[0].name"]),
        ];
        for (patch, want) in cases {
            assert_eq!(check(patch.clone()), want, "patch {patch}");
        }
    }

    #[test]
    fn the_spec_is_written_once() {
        let old = decode::<Node>(&valid()).unwrap().0;
        let mut new = old.clone();
        new.status.phase = Some(NodePhase::Killed);
        let mut errors = Errors::default();
        new.validate_update(&old, &mut errors);
        assert!(errors.is_empty());
        new.spec.offer_id = None;
        new.spec.logical_id = 8;
        new.validate_update(&old, &mut errors);
        let fields: Vec<_> = errors.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.logicalId", "spec.offerId"]);
    }

    #[test]
    fn unknown_fields_and_missing_logical_id() {
        let mut value = valid();
        value["spec"]["bogus"] = json!(1);
        value["status"]["providerRef"]["vmId"] = json!(1);
        let (_, mut unknown) = decode::<Node>(&value).unwrap();
        unknown.sort();
        assert_eq!(unknown, ["spec.bogus", "status.providerRef.vmId"]);

        let mut value = valid();
        value["spec"].as_object_mut().unwrap().remove("logicalId");
        assert_eq!(decode::<Node>(&value).unwrap_err().field, "spec");
    }

    #[test]
    fn ready_follows_the_phase() {
        let now = |s: i64| Time::from_unix(s).unwrap();
        let mut status = NodeStatus::default();
        status.set_phase(NodePhase::Provisioning, now(1));
        let ready = |s: &NodeStatus| {
            let c = crate::meta::find_condition(&s.conditions, READY).unwrap().clone();
            (c.status, c.reason, c.last_transition_time)
        };
        assert_eq!(ready(&status), (ConditionStatus::False, "Provisioning".into(), Some(now(1))));
        status.set_phase(NodePhase::Running, now(2));
        assert_eq!(ready(&status), (ConditionStatus::True, "Running".into(), Some(now(2))));
        assert!(!status.sync_ready(now(3)), "nothing changed");
        status.set_phase(NodePhase::Killing, now(4));
        status.set_phase(NodePhase::Killed, now(5));
        assert_eq!(ready(&status), (ConditionStatus::False, "Killed".into(), Some(now(4))));
        assert_eq!(status.conditions.len(), 1);
    }

    #[test]
    fn cells_match_columns() {
        let (node, _) = decode::<Node>(&valid()).unwrap();
        assert_eq!(Node::columns().len(), node.cells().len());
        assert_eq!(
            node.cells(),
            vec![
                json!(7),
                json!("vastai"),
                json!("Running"),
                json!("ae58ff8833…"),
                json!("ae58ff8833241ac82d6ff7611046ed67b5072d142c588d0063e942d9a75502b6"),
                json!("203.0.113.7:4433"),
                json!("2x RTX 4090"),
                json!("3f6c1d2e-8a4b-4c3d-9e2f-1a2b3c4d5e6f"),
            ]
        );
    }
}
