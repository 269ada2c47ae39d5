//! The idempotent command record behind `POST /apis/hive.dev/v1/fleetcommands` (its HTTP
//! half is `server/fleet.rs`): a command and the Node intent it causes are recorded in
//! one durable store transaction, before any provider call. The object name
//! is the caller's command id, and creation is idempotent on it: the same id with the
//! same spec returns the stored record (200) without writing anything; the same id with
//! a different spec is a 409 Conflict; nothing changes either way.
//!
//! Node logical ids come from a high-water mark kept in an internal store object
//! ([`COUNTER_KIND`]/[`COUNTER_NAME`], not served by the API, so no client can delete
//! it), advanced in the same transaction as the nodes it numbers: an id is never
//! reused, even after the highest node is deleted and the daemon restarts.

use std::collections::BTreeMap;

use crate::client::{self, Api};
use crate::store::{self, Mutation, Store, Subresource};
use hive_api::fleet_command::{FleetCommand, FleetCommandPhase, FleetCommandStatus};
use hive_api::node::{Node, NodePhase, NodeSpec};
use hive_api::provider::{Provider, ProviderType};
use hive_api::validation::{Errors, Reason, ValidationError};
use serde::{Deserialize, Serialize};

/// The internal (unserved) store kind holding the fleet's counters.
pub const COUNTER_KIND: &str = "fleetcounters";
/// The logical-id high-water mark, an object of [`COUNTER_KIND`].
pub const COUNTER_NAME: &str = "logical-ids";
/// The control generation of the latest daemon run, an object of [`COUNTER_KIND`].
pub const GENERATION_NAME: &str = "control-generation";
pub use hive_api::names::KILLED_BY;
/// The provider name that needs no Provider object: local worker processes.
pub const DEFAULT_PROVIDER: &str = "process";

/// Serializes command creation in this daemon: the replay check, the id allocation and
/// the commit happen as one step, so concurrent identical POSTs create one command.
static CREATE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One of the fleet's counters, an object of [`COUNTER_KIND`]: the logical-id high-water
/// mark (`highWater`) or the control generation (`generation`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Counter {
    metadata: CounterMeta,
    /// The highest logical id ever allocated ([`COUNTER_NAME`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    high_water: Option<u64>,
    /// The latest daemon run's control generation ([`GENERATION_NAME`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    generation: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CounterMeta {
    name: String,
    /// Kept from the read, so an update is conditional on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resource_version: Option<String>,
}

impl Counter {
    /// The counter `name` as stored, if it is and decodes.
    fn get(store: &Store, name: &str) -> Option<Counter> {
        let object = store.get(COUNTER_KIND, name)?;
        match Counter::deserialize(&*object) {
            Ok(counter) => Some(counter),
            Err(err) => {
                tracing::warn!(counter = name, %err, "fleet counter does not decode; starting it afresh");
                None
            }
        }
    }

    /// The write that stores `self`: an update conditional on the revision it was read
    /// at, or a create when it was not stored.
    fn mutation(&self) -> Mutation {
        let object = serde_json::to_value(self).expect("a counter encodes");
        if self.metadata.resource_version.is_some() {
            Mutation::Update { kind: COUNTER_KIND, object, subresource: Subresource::Main }
        } else {
            Mutation::Create { kind: COUNTER_KIND, object }
        }
    }

    fn named(name: &str) -> Counter {
        Counter {
            metadata: CounterMeta { name: name.to_string(), resource_version: None },
            ..Default::default()
        }
    }
}

/// The name of the node with logical id `id`.
pub fn node_name(id: u64) -> String {
    format!("node-{id}")
}

/// Why a command was not recorded. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The command breaks a rule that needs the store to check (its Provider, its node).
    #[error("FleetCommand \"{name}\" is invalid: {}", .errors.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Invalid {
        /// The command id.
        name: String,
        /// Every problem, each naming its field.
        errors: Vec<ValidationError>,
    },
    /// The id was used before with another body, or is being created concurrently.
    #[error("{message}")]
    Conflict {
        /// The command id.
        name: String,
        /// What happened, for the caller.
        message: String,
    },
    /// The typed client refused or failed a read or write.
    #[error(transparent)]
    Client(#[from] client::Error),
    /// The store failed the transaction.
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// What recording a command did.
#[derive(Debug)]
pub enum Recorded {
    /// A new command (and its node intents) was recorded.
    Created(FleetCommand),
    /// The id was used before with the same body: the original record, nothing written.
    Replayed(FleetCommand),
}

fn invalid(name: &str, field: &str, reason: Reason, message: impl Into<String>) -> RecordError {
    RecordError::Invalid { name: name.into(), errors: vec![ValidationError::new(field, reason, message)] }
}

/// Records the admitted `command` (and its node intent); see the module docs. With
/// `dry_run`, says what it would record and writes nothing.
pub async fn record(store: &Store, command: FleetCommand, dry_run: bool) -> Result<Recorded, RecordError> {
    let commands = Api::<FleetCommand>::new(store);
    let id = command.metadata.name.clone();
    if id.is_empty() {
        return Err(invalid("", "metadata.name", Reason::Required, "the command id is required"));
    }
    let _serial = CREATE.lock().await;
    if let Some(stored) = commands.get(&id)? {
        return replay(&id, stored, &command);
    }
    let mutations = plan(store, command.clone())?;
    match store.commit_all(mutations, dry_run).await {
        // The command is the first of the writes.
        Ok(outcomes) => {
            let created = outcomes.into_iter().next().expect("the command is one of the writes");
            Ok(Recorded::Created(client::decode(&created.into_object())?))
        }
        // Created meanwhile by another path (e.g. another writer than this handler).
        Err(store::Error::AlreadyExists { kind, .. }) if kind == "fleetcommands" => {
            let stored = commands.get(&id)?.ok_or_else(|| RecordError::Conflict {
                name: id.clone(),
                message: format!("fleet command {id:?} is being created concurrently; retry"),
            })?;
            replay(&id, stored, &command)
        }
        Err(err) => Err(err.into()),
    }
}

/// A command id seen before: the stored record when the spec matches, else a conflict.
fn replay(id: &str, stored: FleetCommand, incoming: &FleetCommand) -> Result<Recorded, RecordError> {
    if stored.spec == incoming.spec {
        return Ok(Recorded::Replayed(stored));
    }
    Err(RecordError::Conflict {
        name: id.into(),
        message: format!(
            "fleet command id {id:?} was already used with a different body; the stored command is \
             unchanged. Reuse an id only to retry the same command; use a new id for a new command"
        ),
    })
}

/// The provider type a Provision names: the Provider object's, or `process` for the
/// built-in default.
pub fn provider_type(store: &Store, name: &str) -> Option<ProviderType> {
    match Api::<Provider>::new(store).get(name) {
        Ok(Some(provider)) => Some(provider.spec.type_),
        Ok(None) => (name == DEFAULT_PROVIDER).then_some(ProviderType::Process),
        Err(err) => {
            tracing::warn!(provider = name, %err, "a Provider that does not decode has no type");
            None
        }
    }
}

/// Advances and returns the control generation: one more than the previous daemon
/// run's, durable before the control endpoint binds, so a surviving worker always sees
/// a changed `myelin.manual-control` binding after a restart.
pub async fn next_control_generation(store: &Store) -> store::Result<u64> {
    let mut counter = Counter::get(store, GENERATION_NAME).unwrap_or_else(|| Counter::named(GENERATION_NAME));
    let next = counter.generation.unwrap_or(0) + 1;
    counter.generation = Some(next);
    store.commit(counter.mutation(), false).await?;
    Ok(next)
}

/// The next unused logical id: above the persisted high-water mark and above every
/// existing node's id. Returns it with the counter as currently stored.
pub fn next_logical_id(store: &Store) -> (u64, Counter) {
    let counter = Counter::get(store, COUNTER_NAME).unwrap_or_else(|| Counter::named(COUNTER_NAME));
    let high_water = counter.high_water.unwrap_or(0);
    let (_, nodes) = Api::<Node>::new(store).list();
    let max_node = nodes.iter().map(|n| n.spec.logical_id).max().unwrap_or(0);
    (high_water.max(max_node) + 1, counter)
}

/// The writes that record `command`: the command first, and for a Provision the
/// high-water mark and every node's intent; for a Kill, the mark on the target node.
/// Each is admitted as the API admits it.
fn plan(store: &Store, command: FleetCommand) -> Result<Vec<Mutation>, RecordError> {
    let nodes = Api::<Node>::new(store);
    let id = command.metadata.name.clone();
    let mut record = command.clone();
    record.metadata.resource_version = None;
    let mut mutations = Vec::new();
    let mut touched = Vec::new();
    if let Some(provision) = &command.spec.provision {
        let Some(type_) = provider_type(store, &provision.provider) else {
            return Err(invalid(
                &id,
                "spec.provision.provider",
                Reason::Invalid,
                format!("{:?}: no such Provider", provision.provider),
            ));
        };
        let mut errors = Errors::default();
        provision.validate_for(type_, &mut errors);
        if !errors.is_empty() {
            return Err(RecordError::Invalid { name: id, errors: errors.0 });
        }
        let (first, mut counter) = next_logical_id(store);
        let last = first + u64::from(provision.count) - 1;
        counter.high_water = Some(last);
        mutations.push(counter.mutation());
        for (i, logical_id) in (first..=last).enumerate() {
            let name = node_name(logical_id);
            let mut node = Node::new(
                name.clone(),
                NodeSpec {
                    logical_id,
                    provider: provision.provider.clone(),
                    command: Some(id.clone()),
                    offer_id: provision.selected_offer_ids.get(i).copied(),
                    image: provision.image.clone(),
                    bootstrap: provision.bootstrap.clone(),
                    labels: provision.labels.clone(),
                },
            );
            node.metadata.labels =
                BTreeMap::from([(hive_api::names::FLEET_COMMAND_LABEL.to_string(), id.clone())]);
            node.status.phase = Some(NodePhase::Pending);
            mutations.push(nodes.create_mutation(&node)?);
            touched.push(name);
        }
    }
    if let Some(kill) = &command.spec.kill {
        let Some(node) = nodes.get(&kill.node)? else {
            return Err(invalid(
                &id,
                "spec.kill.node",
                Reason::Invalid,
                format!("{:?}: no such Node", kill.node),
            ));
        };
        let mut marked = node.clone();
        marked.metadata.annotations.insert(KILLED_BY.to_string(), id.clone());
        // No resourceVersion precondition: status writes racing this one must not fail
        // the command (a Main update keeps the stored status).
        marked.metadata.resource_version = None;
        mutations.push(nodes.replace_mutation(&marked, &node)?);
        touched.push(kill.node.clone());
    }
    record.status =
        FleetCommandStatus { phase: Some(FleetCommandPhase::Pending), nodes: touched, ..Default::default() };
    mutations.insert(0, Api::<FleetCommand>::new(store).create_mutation(&record)?);
    Ok(mutations)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::store::StoreConfig;

    use serde_json::json;

    fn command(value: Value) -> FleetCommand {
        serde_json::from_value(value).unwrap()
    }

    fn provision(id: &str, count: u32) -> FleetCommand {
        command(json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
               "spec": {"provision": {"provider": "process", "count": count}}, "status": {}}))
    }

    fn ids(store: &Store) -> Vec<u64> {
        store.list("nodes").1.iter().filter_map(|n| n["spec"]["logicalId"].as_u64()).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_replays_record_one_command_and_its_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move { record(&store, provision("c1", 3), false).await.unwrap() })
            })
            .collect();
        let mut codes = Vec::new();
        for task in tasks {
            codes.push(task.await.unwrap());
        }
        assert_eq!(codes.iter().filter(|c| matches!(c, Recorded::Created(_))).count(), 1);
        assert_eq!(store.list("fleetcommands").1.len(), 1);
        let mut got = ids(&store);
        got.sort();
        assert_eq!(got, [1, 2, 3]);
        let command = store.get("fleetcommands", "c1").unwrap();
        assert_eq!(command["status"]["phase"], "Pending");
        assert_eq!(command["status"]["nodes"], json!(["node-1", "node-2", "node-3"]));
        let node = store.get("nodes", "node-2").unwrap();
        assert_eq!(
            (node["spec"]["command"].as_str(), node["status"]["phase"].as_str()),
            (Some("c1"), Some("Pending"))
        );
    }

    #[tokio::test]
    async fn a_different_body_conflicts_and_ids_are_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        record(&store, provision("a", 2), false).await.unwrap();
        let before = store.revision();
        let err = record(&store, provision("a", 1), false).await.unwrap_err().to_string();
        assert!(err.contains("\"a\" was already used with a different body"), "{err}");
        assert_eq!(store.revision(), before, "nothing written");
        let delete =
            Mutation::Delete { kind: "nodes", name: "node-2".into(), uid: None, resource_version: None };
        store.commit(delete, false).await.unwrap();
        record(&store, provision("b", 1), false).await.unwrap();
        assert!(store.get("nodes", "node-3").is_some(), "the deleted node's id is not reused");
        let err = record(
            &store,
            {
                let mut c = provision("c", 1);
                c.spec.provision.as_mut().unwrap().provider = "nope".into();
                c
            },
            false,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("spec.provision.provider"), "{err}");
        let kill = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": "k"},
                          "spec": {"kill": {"node": "node-1"}}, "status": {}});
        record(&store, command(kill), false).await.unwrap();
        assert_eq!(store.get("nodes", "node-1").unwrap()["metadata"]["annotations"][KILLED_BY], "k");
    }
}
