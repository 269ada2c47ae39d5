//! The `FleetCommand` kind: an explicit, idempotent Provision or Kill of fleet nodes. The
//! object name is the caller-generated command id, so re-submitting a command finds the
//! original record instead of repeating a create or destroy.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::meta::Time;
use crate::provider::ProviderType;
use crate::resource::{Column, Resource};
use crate::validation::{self, Errors, Reason};

/// The most nodes one Provision may create.
pub const MAX_COUNT: u32 = 1000;

crate::resource! {
    /// A fleet command: provision nodes or kill one. Its name is the command id; the
    /// command and the Node intent it creates are durable before any provider call, and
    /// reusing the id returns the original record without repeating provider work.
    FleetCommand, FleetCommandList, FleetCommandSpec, FleetCommandStatus,
    plural = "fleetcommands", singular = "fleetcommand", short = ["fc"]
}

/// The command: exactly one of `provision` and `kill` is set. Immutable.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetCommandSpec {
    /// Create nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provision: Option<Provision>,
    /// Stop or destroy one node, keeping its record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill: Option<Kill>,
}

/// Create `count` nodes with a provider.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Provision {
    /// Name of the Provider to create the nodes with. Empty (unset) means the daemon's
    /// default (`hive serve --provider`), filled in when the command is recorded.
    #[serde(default)]
    pub provider: String,
    /// How many nodes to create; 1 to 1000.
    #[serde(default)]
    pub count: u32,
    /// The offers to lease, one per node. Vast.ai requires them and leases exactly these;
    /// the process and docker providers take none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selected_offer_ids: Vec<u64>,
    /// Image for the nodes; unset means the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Bootstrap (on-start) script; unset means the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<String>,
    /// Labels given to every node created.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Build slots of every node created (their `spec.buildSlots`): how many builds of
    /// the agents placed on one node run at once there. 1 to 64; unset: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_slots: Option<u32>,
}

impl Provision {
    /// The checks that need the provider's type, which the command only names: Vast.ai
    /// leases exactly the selected offers, one per node; the other providers take none.
    /// Called by admission once it has resolved `provider`.
    pub fn validate_for(&self, provider: ProviderType, errors: &mut Errors) {
        let offers = self.selected_offer_ids.len();
        match provider {
            ProviderType::Vastai if offers == 0 => errors.push(
                "spec.provision.selectedOfferIds",
                Reason::Required,
                "Vast.ai provisions only explicitly selected offers",
            ),
            ProviderType::Vastai if offers != self.count as usize => errors.push(
                "spec.provision.count",
                Reason::Invalid,
                format!("{}: must equal the number of selected offers ({offers})", self.count),
            ),
            ProviderType::Process | ProviderType::Docker if offers > 0 => errors.push(
                "spec.provision.selectedOfferIds",
                Reason::Forbidden,
                format!("the {} provider takes no offers", provider.as_str()),
            ),
            _ => {}
        }
    }
}

/// Kill one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Kill {
    /// Name of the Node to kill.
    #[serde(default)]
    pub node: String,
}

/// What is observed of a command.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetCommandStatus {
    /// Where the command is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<FleetCommandPhase>,
    /// Names of the Nodes the command created or killed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Why the command failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When provider work began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the command became terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Which daemon run took the command for execution: written with `phase: Running` by
    /// a compare-and-swap on the command's `resourceVersion`, so of any number of daemons
    /// or intakes that see it Pending exactly one runs it. Absent until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<FleetCommandClaim>,
}

/// The claim of a command for execution by one daemon run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetCommandClaim {
    /// The claiming daemon run, unique per start of a daemon.
    pub run: String,
    /// When it claimed the command.
    pub at: Time,
}

/// Where a command is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum FleetCommandPhase {
    /// Recorded; provider work has not started.
    Pending,
    /// Provider work is in progress.
    Running,
    /// Done.
    Succeeded,
    /// Failed; see `error`.
    Failed,
}

impl FleetCommandPhase {
    /// The serialized name, e.g. `Succeeded`.
    pub fn as_str(self) -> &'static str {
        match self {
            FleetCommandPhase::Pending => "Pending",
            FleetCommandPhase::Running => "Running",
            FleetCommandPhase::Succeeded => "Succeeded",
            FleetCommandPhase::Failed => "Failed",
        }
    }

    /// True once the command will not change any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, FleetCommandPhase::Succeeded | FleetCommandPhase::Failed)
    }
}

impl FleetCommand {
    /// `Provision` or `Kill`, by which half of the spec is set (empty when neither is).
    pub fn action(&self) -> &'static str {
        match (&self.spec.provision, &self.spec.kill) {
            (Some(_), None) => "Provision",
            (None, Some(_)) => "Kill",
            _ => "",
        }
    }

    /// Checks an update against the stored object: the command is written once.
    pub fn validate_update(&self, old: &FleetCommand, errors: &mut Errors) {
        validation::immutable(errors, "spec", &self.spec, &old.spec);
    }
}

impl Resource for FleetCommand {
    fn validate_update(&self, old: &Self, errors: &mut Errors) {
        FleetCommand::validate_update(self, old, errors)
    }

    fn validate(&self, errors: &mut Errors) {
        match (&self.spec.provision, &self.spec.kill) {
            (None, None) => {
                errors.push("spec", Reason::Required, "exactly one of provision and kill is required")
            }
            (Some(_), Some(_)) => {
                errors.push("spec.kill", Reason::Forbidden, "exactly one of provision and kill may be set")
            }
            _ => {}
        }
        if let Some(p) = &self.spec.provision {
            if !p.provider.is_empty() {
                validation::name(errors, "spec.provision.provider", &p.provider);
            }
            if let Some(slots) = p.build_slots.filter(|s| !(1..=crate::node::MAX_BUILD_SLOTS).contains(s)) {
                let max = crate::node::MAX_BUILD_SLOTS;
                errors.push(
                    "spec.provision.buildSlots",
                    Reason::Invalid,
                    format!("{slots}: must be 1 to {max}"),
                );
            }
            if p.count == 0 {
                errors.push("spec.provision.count", Reason::Invalid, "0: must be at least 1");
            }
            if p.count > MAX_COUNT {
                errors.push(
                    "spec.provision.count",
                    Reason::Invalid,
                    format!("{}: at most {MAX_COUNT} nodes per command", p.count),
                );
            }
            let offers = p.selected_offer_ids.len();
            if offers > 0 && offers != p.count as usize {
                errors.push(
                    "spec.provision.count",
                    Reason::Invalid,
                    format!("{}: must equal the number of selected offers ({offers})", p.count),
                );
            }
            let mut seen = std::collections::BTreeSet::new();
            for (i, id) in p.selected_offer_ids.iter().enumerate() {
                if !seen.insert(id) {
                    errors.push(
                        format!("spec.provision.selectedOfferIds[{i}]"),
                        Reason::Duplicate,
                        id.to_string(),
                    );
                }
            }
            if let Some(image) = &p.image {
                validation::argument(errors, "spec.provision.image", image);
            }
            validation::labels(errors, "spec.provision.labels", &p.labels);
        }
        if let Some(k) = &self.spec.kill {
            validation::name(errors, "spec.kill.node", &k.node);
        }
        for (i, node) in self.status.nodes.iter().enumerate() {
            validation::name(errors, &format!("status.nodes[{i}]"), node);
        }
    }

    fn columns() -> Vec<Column> {
        vec![
            Column::new("Action", "Provision or Kill."),
            Column::new("Phase", "Where the command is in its life, status.phase."),
            Column::new("Nodes", "Nodes created or killed, status.nodes (the target, for a kill)."),
            Column::wide("Provider", "The Provider provisioned with, spec.provision.provider."),
            Column::wide("Error", "Why the command failed, status.error."),
        ]
    }

    fn cells(&self) -> Vec<Value> {
        let nodes = match (&self.spec.kill, self.status.nodes.is_empty()) {
            (Some(kill), true) => kill.node.clone(),
            _ => self.status.nodes.join(","),
        };
        vec![
            self.action().into(),
            self.status.phase.map_or("", FleetCommandPhase::as_str).into(),
            nodes.into(),
            self.spec.provision.as_ref().map(|p| p.provider.clone()).unwrap_or_default().into(),
            self.status.error.clone().unwrap_or_default().into(),
        ]
    }
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
            "kind": "FleetCommand",
            "metadata": {"name": "3f6c1d2e-8a4b-4c3d-9e2f-1a2b3c4d5e6f"},
            "spec": {"provision": {"provider": "vastai", "count": 2, "selectedOfferIds": [123456, 123457]}}
        })
    }

    fn check(patch: Value) -> Vec<String> {
        let mut value = valid();
        merge(&mut value, patch);
        error_fields::<FleetCommand>(&value)
    }

    #[test]
    fn valid_command_round_trips() {
        let (command, unknown) = decode::<FleetCommand>(&valid()).unwrap();
        assert!(unknown.is_empty());
        assert_eq!(validate(&command), vec![]);
        let mut want = valid();
        want["status"] = json!({});
        assert_eq!(serde_json::to_value(&command).unwrap(), want);
    }

    #[test]
    fn validation_rules_name_their_fields() {
        let cases: Vec<(Value, &[&str])> = vec![
            (json!({}), &[]),
            (json!({"spec": {"provision": null}}), &["spec"]),
            (json!({"spec": {"kill": {"node": "node-1"}}}), &["spec.kill"]),
            (json!({"spec": {"provision": null, "kill": {"node": "node-1"}}}), &[]),
            (json!({"spec": {"provision": null, "kill": {"node": ""}}}), &["spec.kill.node"]),
            (json!({"spec": {"provision": {"count": 0, "selectedOfferIds": []}}}), &["spec.provision.count"]),
            (json!({"spec": {"provision": {"count": 3}}}), &["spec.provision.count"]),
            (
                json!({"spec": {"provision": {"selectedOfferIds": [1, 1]}}}),
                &["spec.provision.selectedOfferIds[1]"],
            ),
            (json!({"spec": {"provision": {"provider": "Vast AI"}}}), &["spec.provision.provider"]),
            (
                json!({"spec": {"provision": {"count": 1001, "selectedOfferIds": []}}}),
                &["spec.provision.count"],
            ),
            (
                json!({"spec": {"provision": {"selectedOfferIds": [7, 7]}}}),
                &["spec.provision.selectedOfferIds[1]"],
            ),
            // Empty: the daemon fills in its default provider when it records the command.
            (json!({"spec": {"provision": {"provider": ""}}}), &[]),
            (json!({"spec": {"provision": {"count": 5, "selectedOfferIds": []}}}), &[]),
            (json!({"status": {"nodes": ["node-1", "Node 2"]}}), &["status.nodes[1]"]),
        ];
        for (patch, want) in cases {
            assert_eq!(check(patch.clone()), want, "patch {patch}");
        }
    }

    #[test]
    fn provider_specific_offer_rules() {
        let provision = |count: u32, offers: &[u64]| Provision {
            provider: "p".into(),
            count,
            selected_offer_ids: offers.to_vec(),
            ..Default::default()
        };
        let fields = |p: Provision, t: ProviderType| {
            let mut errors = Errors::default();
            p.validate_for(t, &mut errors);
            errors.0.into_iter().map(|e| e.field).collect::<Vec<_>>()
        };
        assert!(fields(provision(2, &[1, 2]), ProviderType::Vastai).is_empty());
        assert_eq!(fields(provision(2, &[]), ProviderType::Vastai), ["spec.provision.selectedOfferIds"]);
        assert_eq!(fields(provision(3, &[1, 2]), ProviderType::Vastai), ["spec.provision.count"]);
        assert!(fields(provision(3, &[]), ProviderType::Docker).is_empty());
        assert_eq!(fields(provision(1, &[1]), ProviderType::Process), ["spec.provision.selectedOfferIds"]);
    }

    #[test]
    fn unknown_fields_are_reported() {
        let mut value = valid();
        value["spec"]["restart"] = json!({});
        value["spec"]["provision"]["gpu"] = json!("any");
        let (_, mut unknown) = decode::<FleetCommand>(&value).unwrap();
        unknown.sort();
        assert_eq!(unknown, ["spec.provision.gpu", "spec.restart"]);
    }

    #[test]
    fn the_command_is_written_once() {
        let old = decode::<FleetCommand>(&valid()).unwrap().0;
        let mut new = old.clone();
        new.status.phase = Some(FleetCommandPhase::Running);
        let mut errors = Errors::default();
        new.validate_update(&old, &mut errors);
        assert!(errors.is_empty());
        new.spec.kill = Some(Kill { node: "node-1".into() });
        new.validate_update(&old, &mut errors);
        assert_eq!(errors.0.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(), ["spec.kill"]);
    }

    #[test]
    fn cells_match_columns() {
        let (mut command, _) = decode::<FleetCommand>(&valid()).unwrap();
        command.status.phase = Some(FleetCommandPhase::Succeeded);
        command.status.nodes = vec!["node-7".into(), "node-8".into()];
        assert_eq!(FleetCommand::columns().len(), command.cells().len());
        assert_eq!(
            command.cells(),
            vec![json!("Provision"), json!("Succeeded"), json!("node-7,node-8"), json!("vastai"), json!("")]
        );
        let kill = FleetCommand::new(
            "k1",
            FleetCommandSpec { kill: Some(Kill { node: "node-7".into() }), provision: None },
        );
        assert_eq!(kill.cells(), vec![json!("Kill"), json!(""), json!("node-7"), json!(""), json!("")]);
    }
}
