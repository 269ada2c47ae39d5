//! How users name kinds and objects on the command line: `agents`, `agent`, `ag`,
//! `Agent`, `agents.hive.dev`, `all`/`hive` for every kind, `KIND NAME…` and
//! `KIND/NAME` forms, and how objects are named back (`agent.hive.dev/a1`).

use anyhow::{bail, Result};
use hive_api::meta::{API_VERSION, GROUP};
use hive_api::KindInfo;

use super::client::encode;

/// Every kind the API serves, in discovery order: the `hive.dev` kinds, then core
/// events.
pub fn all() -> Vec<KindInfo> {
    let mut kinds = hive_api::kinds().to_vec();
    kinds.push(hive_api::event::EVENT_KIND);
    kinds
}

/// Whether `kind` belongs to the `hive.dev` group (what `all` and `hive` mean).
fn in_hive_group(kind: &KindInfo) -> bool {
    kind.api_version == API_VERSION
}

/// Resolves a user's name for a kind (plural, singular, short name or Kind, any case,
/// optionally qualified as `.hive.dev` or `.v1.hive.dev`).
pub fn resolve(kinds: &[KindInfo], name: &str) -> Result<KindInfo> {
    let lower = name.to_ascii_lowercase();
    let base = lower
        .strip_suffix(&format!(".v1.{GROUP}"))
        .or_else(|| lower.strip_suffix(&format!(".{GROUP}")))
        .unwrap_or(&lower);
    kinds
        .iter()
        .find(|k| {
            base == k.plural
                || base == k.singular
                || base == k.kind.to_ascii_lowercase()
                || k.short_names.iter().any(|s| base == s.to_ascii_lowercase())
        })
        .copied()
        .ok_or_else(|| anyhow::anyhow!("the server doesn't have a resource type {name:?} ({})", known(kinds)))
}

/// The kind a manifest's `kind:` names (exact, as the API spells it).
pub fn by_kind(kinds: &[KindInfo], kind: &str) -> Option<KindInfo> {
    kinds.iter().find(|k| k.kind == kind).copied()
}

/// `valid kinds: agents (ag), jobs, …`, for error messages.
pub fn known(kinds: &[KindInfo]) -> String {
    let names: Vec<String> = kinds
        .iter()
        .map(|k| {
            if k.short_names.is_empty() {
                k.plural.to_string()
            } else {
                format!("{} ({})", k.plural, k.short_names.join(", "))
            }
        })
        .collect();
    format!("valid kinds: {}", names.join(", "))
}

/// `agent.hive.dev`: how kubectl names a kind in output (`-o name`, `deleted`); core
/// kinds have no group (`event`).
pub fn qualified(kind: &KindInfo) -> String {
    if in_hive_group(kind) {
        format!("{}.{GROUP}", kind.kind.to_ascii_lowercase())
    } else {
        kind.kind.to_ascii_lowercase()
    }
}

/// `agent.hive.dev/a1`.
pub fn object_ref(kind: &KindInfo, name: &str) -> String {
    format!("{}/{name}", qualified(kind))
}

/// `/apis/hive.dev/v1/agents`, or `/api/v1/events` for the core group.
pub fn collection_path(kind: &KindInfo) -> String {
    if in_hive_group(kind) {
        format!("/apis/{}/{}", kind.api_version, kind.plural)
    } else {
        format!("/api/{}/{}", kind.api_version, kind.plural)
    }
}

/// `/apis/hive.dev/v1/agents/a1` (the name percent-encoded).
pub fn object_path(kind: &KindInfo, name: &str) -> String {
    format!("{}/{}", collection_path(kind), encode(name))
}

/// One kind and the names asked for (none = every object of the kind).
#[derive(Debug, Clone)]
pub struct Target {
    /// The kind.
    pub kind: KindInfo,
    /// Object names, in the order given.
    pub names: Vec<String>,
}

/// Parses `KIND[,KIND…] [NAME…]` or `KIND/NAME…` into targets, grouped by kind in the
/// order first mentioned. `all` and `hive` stand for every kind.
pub fn parse_targets(kinds: &[KindInfo], args: &[String], verb: &str) -> Result<Vec<Target>> {
    let Some(first) = args.first() else {
        bail!(
            "you must specify the type of resource to {verb}, e.g. `hive {verb} agents` ({}; \
             \"all\" means every kind)",
            known(kinds)
        );
    };
    let mut targets: Vec<Target> = Vec::new();
    if args.iter().any(|a| a.contains('/')) {
        for arg in args {
            let Some((kind, name)) = arg.split_once('/') else {
                bail!(
                    "there is no need to specify a resource type as a separate argument when passing \
                     arguments in resource/name form (e.g. 'hive {verb} agent/a1' instead of \
                     'hive {verb} agent agent/a1')"
                );
            };
            if kind.is_empty() || name.is_empty() || name.contains('/') {
                bail!("arguments in resource/name form must have a single resource and name, got {arg:?}");
            }
            let kind = resolve(kinds, kind)?;
            push(&mut targets, kind, Some(name));
        }
        return Ok(targets);
    }
    for word in first.split(',').filter(|w| !w.is_empty()) {
        let group: Vec<KindInfo> = match word.to_ascii_lowercase().as_str() {
            "all" | "hive" => kinds.iter().filter(|k| in_hive_group(k)).copied().collect(),
            _ => vec![resolve(kinds, word)?],
        };
        for kind in group {
            if !targets.iter().any(|t| t.kind.plural == kind.plural) {
                targets.push(Target { kind, names: Vec::new() });
            }
        }
    }
    if targets.is_empty() {
        bail!("no resource type given in {first:?}");
    }
    for target in &mut targets {
        target.names = args[1..].to_vec();
    }
    Ok(targets)
}

fn push(targets: &mut Vec<Target>, kind: KindInfo, name: Option<&str>) {
    let index = match targets.iter().position(|t| t.kind.plural == kind.plural) {
        Some(i) => i,
        None => {
            targets.push(Target { kind, names: Vec::new() });
            targets.len() - 1
        }
    };
    if let Some(name) = name {
        targets[index].names.push(name.to_string());
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Stand-in kinds for the CLI's unit tests, so they do not depend on what the real
    //! kinds' specs look like this week.

    use hive_api::validation::Errors;
    use hive_api::{Column, KindInfo, Resource};
    use serde::{Deserialize, Serialize};
    use serde_json::Value;

    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct TestSpec {
        #[serde(default)]
        pub wanted: String,
        #[serde(default)]
        pub replicas: Option<i64>,
    }

    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct TestStatus {
        #[serde(default)]
        pub observed_generation: Option<i64>,
        #[serde(default)]
        pub phase: Option<String>,
        #[serde(default)]
        pub conditions: Vec<hive_api::Condition>,
    }

    hive_api::resource! {
        /// A test agent.
        Agent, AgentList, TestSpec, TestStatus, plural = "agents", singular = "agent", short = ["ag"]
    }
    hive_api::resource! {
        /// A test fleet command.
        FleetCommand, FleetCommandList, TestSpec, TestStatus,
        plural = "fleetcommands", singular = "fleetcommand", short = ["fc"]
    }
    hive_api::resource! {
        /// A test job.
        Job, JobList, TestSpec, TestStatus, plural = "jobs", singular = "job", short = []
    }

    macro_rules! test_resource {
        ($($kind:ident),*) => {$(
            impl Resource for $kind {
                fn validate(&self, _errors: &mut Errors) {}
                fn columns() -> Vec<Column> {
                    vec![Column::new("Wanted", "spec.wanted")]
                }
                fn cells(&self) -> Vec<Value> {
                    vec![self.spec.wanted.clone().into()]
                }
            }
        )*};
    }
    test_resource!(Agent, FleetCommand, Job);

    /// Agent, FleetCommand and Job.
    pub fn kinds() -> Vec<KindInfo> {
        vec![KindInfo::of::<Agent>(), KindInfo::of::<FleetCommand>(), KindInfo::of::<Job>()]
    }

    /// The Agent kind.
    pub fn agent() -> KindInfo {
        KindInfo::of::<Agent>()
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::kinds;
    use super::*;

    #[test]
    fn resolves_every_spelling() {
        let kinds = kinds();
        for name in [
            "agents",
            "agent",
            "ag",
            "Agent",
            "AGENTS",
            "agents.hive.dev",
            "Agent.hive.dev",
            "agent.v1.hive.dev",
            "AG",
        ] {
            assert_eq!(resolve(&kinds, name).unwrap().kind, "Agent", "{name}");
        }
        assert_eq!(resolve(&kinds, "fc").unwrap().kind, "FleetCommand");
        assert_eq!(resolve(&kinds, "fleetcommand").unwrap().kind, "FleetCommand");
    }

    #[test]
    fn unknown_kinds_list_the_valid_ones() {
        let err = resolve(&kinds(), "pods").unwrap_err().to_string();
        assert_eq!(
            err,
            "the server doesn't have a resource type \"pods\" \
             (valid kinds: agents (ag), fleetcommands (fc), jobs)"
        );
        assert!(resolve(&kinds(), "agents.apps").is_err());
    }

    #[test]
    fn names_and_paths() {
        let agent = super::fixtures::agent();
        assert_eq!(object_ref(&agent, "a1"), "agent.hive.dev/a1");
        assert_eq!(collection_path(&agent), "/apis/hive.dev/v1/agents");
        assert_eq!(object_path(&agent, "a b/c"), "/apis/hive.dev/v1/agents/a%20b%2Fc");
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    fn summary(targets: &[Target]) -> Vec<String> {
        targets.iter().map(|t| format!("{}:{}", t.kind.plural, t.names.join(","))).collect()
    }

    #[test]
    fn targets_from_kind_and_names() {
        let kinds = kinds();
        let t = parse_targets(&kinds, &strings(&["ag", "a1", "a2"]), "get").unwrap();
        assert_eq!(summary(&t), ["agents:a1,a2"]);
        let t = parse_targets(&kinds, &strings(&["agents,jobs,ag"]), "get").unwrap();
        assert_eq!(summary(&t), ["agents:", "jobs:"]);
        let t = parse_targets(&kinds, &strings(&["all"]), "get").unwrap();
        assert_eq!(summary(&t), ["agents:", "fleetcommands:", "jobs:"]);
        let t = parse_targets(&kinds, &strings(&["hive", "x"]), "get").unwrap();
        assert_eq!(summary(&t), ["agents:x", "fleetcommands:x", "jobs:x"]);
    }

    #[test]
    fn targets_in_slash_form() {
        let kinds = kinds();
        let t = parse_targets(&kinds, &strings(&["agent/a1", "job/j1", "ag/a2"]), "get").unwrap();
        assert_eq!(summary(&t), ["agents:a1,a2", "jobs:j1"]);
        let err = parse_targets(&kinds, &strings(&["agent", "agent/a1"]), "get").unwrap_err();
        assert!(err.to_string().starts_with("there is no need to specify a resource type"), "{err}");
        assert!(parse_targets(&kinds, &strings(&["agent/"]), "get").is_err());
        assert!(parse_targets(&kinds, &strings(&["nope/a1"]), "get").is_err());
    }

    #[test]
    fn targets_need_a_kind() {
        let err = parse_targets(&kinds(), &[], "describe").unwrap_err().to_string();
        assert!(err.starts_with("you must specify the type of resource to describe"), "{err}");
    }
}
