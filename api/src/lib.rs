//! hive-api: the `hive.dev/v1` resource types and their pure validation. Nothing in
//! this crate does IO; the server, the controllers and the CLI all build on it.

// `resource!` names helpers by absolute path (`::hive_api::…`, as serde attributes
// cannot take `$crate`); this makes that path resolve inside the crate too.
extern crate self as hive_api;

pub mod admit;
pub mod age;
pub mod meta;
pub mod names;
pub mod resource;
pub mod role;
pub mod selector;
pub mod validation;

pub mod agent;
pub mod approval;
pub mod event;
pub mod fleet_command;
pub mod job;
pub mod node;
pub mod provider;
pub mod usage;

pub use admit::{
    admit, admit_apply_configuration, admit_body, AdmitError, Admitted, Duplicates, FieldValidation,
};
pub use agent::{Agent, AgentList, AgentSpec, AgentStatus};
pub use approval::{Approval, ApprovalList, ApprovalSpec, ApprovalStatus};
pub use fleet_command::{FleetCommand, FleetCommandList, FleetCommandSpec, FleetCommandStatus};
pub use job::{Job, JobList, JobSpec, JobStatus};
pub use meta::{Condition, ConditionStatus, ListMeta, MicroTime, ObjectMeta, Status, Time, WatchEvent};
pub use node::{Node, NodeList, NodeSpec, NodeStatus};
pub use provider::{Provider, ProviderList, ProviderSpec, ProviderStatus};
pub use resource::{Column, HasSpec, HasStatus, KindInfo, Object, Resource};
pub use role::{Role, Verb};

static KINDS: [KindInfo; 6] = [
    KindInfo::of::<Agent>(),
    KindInfo::of::<Job>(),
    KindInfo::of::<Approval>(),
    KindInfo::of::<Node>(),
    KindInfo::of::<FleetCommand>(),
    KindInfo::of::<Provider>(),
];

/// Every kind of `hive.dev/v1`, in discovery order.
pub fn kinds() -> &'static [KindInfo] {
    &KINDS
}

/// The kind served under a plural resource name, e.g. `agents` (as in URLs).
pub fn kind_by_plural(plural: &str) -> Option<&'static KindInfo> {
    KINDS.iter().find(|k| k.plural == plural)
}

/// The kind with the given kind name, e.g. `Agent` (as in a manifest's `kind`).
pub fn kind_by_kind(kind: &str) -> Option<&'static KindInfo> {
    KINDS.iter().find(|k| k.kind == kind)
}

/// The kind a command-line argument means, as kubectl resolves it: the plural, the
/// singular, a short name or the kind name, case-insensitively (`agents`, `agent`,
/// `ag`, `Agent`).
pub fn resolve_kind(name: &str) -> Option<&'static KindInfo> {
    let name = name.to_ascii_lowercase();
    KINDS.iter().find(|k| {
        k.plural == name
            || k.singular == name
            || k.kind.eq_ignore_ascii_case(&name)
            || k.short_names.contains(&name.as_str())
    })
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers shared by the kinds' unit tests.

    use serde_json::Value;

    use crate::resource::{decode, validate, Resource};

    /// Applies a JSON merge patch (RFC 7386): objects merge, `null` removes a key.
    pub fn merge(target: &mut Value, patch: Value) {
        match (target, patch) {
            (Value::Object(t), Value::Object(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(&k);
                    } else {
                        merge(t.entry(k).or_insert(Value::Null), v);
                    }
                }
            }
            (t, p) => *t = p,
        }
    }

    /// Decodes `value` as `K` (asserting it has no unknown fields) and returns the field
    /// paths of its validation errors, in order.
    pub fn error_fields<K: Resource>(value: &Value) -> Vec<String> {
        let (object, unknown) = decode::<K>(value).expect("decodes");
        assert!(unknown.is_empty(), "unknown fields {unknown:?}");
        validate(&object).into_iter().map(|e| e.field).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_lookups() {
        let names: Vec<_> = kinds().iter().map(|k| k.kind).collect();
        assert_eq!(names, ["Agent", "Job", "Approval", "Node", "FleetCommand", "Provider"]);
        assert_eq!(kind_by_plural("fleetcommands").map(|k| k.kind), Some("FleetCommand"));
        assert_eq!(kind_by_plural("FleetCommands").map(|k| k.kind), None);
        assert_eq!(kind_by_kind("Approval").map(|k| k.plural), Some("approvals"));
        for arg in ["agents", "agent", "ag", "Agent", "AGENTS"] {
            assert_eq!(resolve_kind(arg).map(|k| k.kind), Some("Agent"), "{arg}");
        }
        assert_eq!(resolve_kind("fc").map(|k| k.kind), Some("FleetCommand"));
        assert_eq!(resolve_kind("pods").map(|k| k.kind), None);
    }

    #[test]
    fn names_are_unique_across_kinds() {
        let mut all: Vec<&str> = kinds()
            .iter()
            .flat_map(|k| [k.plural, k.singular].into_iter().chain(k.short_names.iter().copied()))
            .collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    /// The example manifests a new user applies first: every document decodes with no
    /// unknown fields and validates clean, and each file holds the kind it is named for.
    #[test]
    fn example_manifests_are_valid() {
        let files = [
            ("agent.yaml", include_str!("../../manifests/agent.yaml"), "Agent"),
            ("job.yaml", include_str!("../../manifests/job.yaml"), "Job"),
            ("approval.yaml", include_str!("../../manifests/approval.yaml"), "Approval"),
            ("node.yaml", include_str!("../../docs/examples/node.yaml"), "Node"),
            ("fleet-command.yaml", include_str!("../../manifests/fleet-command.yaml"), "FleetCommand"),
            ("provider.yaml", include_str!("../../manifests/provider.yaml"), "Provider"),
        ];
        for (file, text, want_kind) in files {
            let mut count = 0;
            for doc in serde_yaml_ng::Deserializer::from_str(text) {
                let value: serde_json::Value =
                    serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{file}: {e}"));
                let kind = kind_by_kind(value["kind"].as_str().unwrap_or_default())
                    .unwrap_or_else(|| panic!("{file}: unknown kind {}", value["kind"]));
                assert_eq!(kind.kind, want_kind, "{file}");
                assert_eq!(value["apiVersion"], meta::API_VERSION, "{file}");
                let decoded = (kind.decode)(&value).unwrap_or_else(|e| panic!("{file}: {e:?}"));
                assert!(
                    decoded.unknown_fields.is_empty(),
                    "{file}: unknown fields {:?}",
                    decoded.unknown_fields
                );
                let errors = (kind.validate)(&value);
                assert!(errors.is_empty(), "{file}: {errors:?}");
                count += 1;
            }
            assert!(count > 0, "{file} holds no documents");
        }
    }

    #[test]
    fn every_kind_has_one_cell_per_column() {
        for kind in kinds() {
            let empty = serde_json::json!({"metadata": {"name": "x"}, "spec": {}});
            let columns = (kind.columns)();
            assert_eq!((kind.cells)(&empty).len(), columns.len(), "{}", kind.kind);
            assert!(columns.iter().all(|c| c.priority == 0 || c.priority == 1));
        }
    }
}
