//! `POST /apis/hive.dev/v1/fleetcommands`: records a command and the Node intent it
//! causes in one durable store transaction, before any provider call. The object name
//! is the caller's command id, and creation is idempotent on it: the same id with the
//! same spec returns the stored record (200) without writing anything; the same id with
//! a different spec is a 409 Conflict; nothing changes either way.
//!
//! Node logical ids come from a high-water mark kept in an internal store object
//! ([`COUNTER_KIND`]/[`COUNTER_NAME`], not served by the API, so no client can delete
//! it), advanced in the same transaction as the nodes it numbers: an id is never
//! reused, even after the highest node is deleted and the daemon restarts.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use hive_api::fleet_command::{FleetCommand, FleetCommandPhase};
use hive_api::node::{Node, NodePhase, NodeSpec};
use hive_api::provider::ProviderType;
use hive_api::validation::{Errors, Reason, ValidationError};
use serde_json::{json, Value};

use crate::server::body::{self, MediaType};
use crate::server::error::{ApiError, ApiResult};
use crate::server::params::Params;
use crate::server::resources::admit;
use crate::server::AppState;
use crate::store::{self, Mutation, Store, Subresource};

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

/// The name of the node with logical id `id`.
pub fn node_name(id: u64) -> String {
    format!("node-{id}")
}

fn kind_info() -> &'static hive_api::KindInfo {
    hive_api::kind_by_kind("FleetCommand").expect("FleetCommand is registered")
}

fn invalid(name: &str, field: &str, reason: Reason, message: impl Into<String>) -> ApiError {
    ApiError::Invalid {
        kind: "FleetCommand".into(),
        name: name.into(),
        errors: vec![ValidationError::new(field, reason, message)],
    }
}

/// The handler `kinds.rs` routes `POST fleetcommands` to.
pub async fn create(state: AppState, headers: HeaderMap, uri: Uri, body: Body) -> ApiResult<Response> {
    let params = Params::from_uri(&uri)?;
    let bytes = body::read(body).await?;
    let value = body::parse_object(MediaType::of(&headers), &bytes)?;
    let (mut object, warnings) = admit(kind_info(), value, params.field_validation()?)?;
    if object["spec"]["provision"]["provider"].as_str() == Some("") {
        let default = state.fleet.as_ref().map_or(DEFAULT_PROVIDER, |f| f.default_provider());
        object["spec"]["provision"]["provider"] = json!(default);
    }
    let dry_run = params.dry_run()?;
    let (code, stored) = submit(&state.store, object, dry_run).await?;
    Ok(crate::server::resources::json_response(code, &stored, &warnings))
}

/// Records the admitted command `object` (and its node intent); see the module docs.
/// Returns 201 and the new command, or 200 and the stored one for a replay.
pub async fn submit(store: &Store, object: Value, dry_run: bool) -> ApiResult<(StatusCode, Value)> {
    let command: FleetCommand = serde_json::from_value(object.clone())
        .map_err(|e| ApiError::BadRequest(format!("FleetCommand cannot be decoded: {e}")))?;
    let id = command.metadata.name.clone();
    if id.is_empty() {
        return Err(invalid("", "metadata.name", Reason::Required, "the command id is required"));
    }
    let _serial = CREATE.lock().await;
    if let Some(stored) = store.get("fleetcommands", &id) {
        return replay(&id, &stored, &object);
    }
    let mutations = plan(store, command, &object)?;
    match store.commit_all(mutations, dry_run).await {
        Ok(outcomes) => {
            let created = outcomes
                .into_iter()
                .map(store::Outcome::into_object)
                .find(|o| o["kind"] == "FleetCommand")
                .expect("the command is one of the writes");
            Ok((StatusCode::CREATED, (*created).clone()))
        }
        // Created meanwhile by another path (e.g. another writer than this handler).
        Err(store::Error::AlreadyExists { kind, .. }) if kind == "fleetcommands" => {
            let stored = store.get("fleetcommands", &id).ok_or_else(|| ApiError::Conflict {
                plural: "fleetcommands".into(),
                name: id.clone(),
                message: format!("fleet command {id:?} is being created concurrently; retry"),
            })?;
            replay(&id, &stored, &object)
        }
        Err(err) => Err(err.into()),
    }
}

/// A command id seen before: the stored record when the spec matches, else a conflict.
fn replay(id: &str, stored: &Value, incoming: &Value) -> ApiResult<(StatusCode, Value)> {
    if stored["spec"] == incoming["spec"] {
        return Ok((StatusCode::OK, stored.clone()));
    }
    Err(ApiError::Conflict {
        plural: "fleetcommands".into(),
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
    match store.get("providers", name) {
        Some(provider) => serde_json::from_value(provider["spec"]["type"].clone()).ok(),
        None => (name == DEFAULT_PROVIDER).then_some(ProviderType::Process),
    }
}

/// Advances and returns the control generation: one more than the previous daemon
/// run's, durable before the control endpoint binds, so a surviving worker always sees
/// a changed `myelin.manual-control` binding after a restart.
pub async fn next_control_generation(store: &Store) -> store::Result<u64> {
    let current = store.get(COUNTER_KIND, GENERATION_NAME).map(|c| (*c).clone());
    let next = current.as_ref().and_then(|c| c["generation"].as_u64()).unwrap_or(0) + 1;
    let mutation = match current {
        Some(mut counter) => {
            counter["generation"] = json!(next);
            Mutation::Update { kind: COUNTER_KIND, object: counter, subresource: Subresource::Main }
        }
        None => Mutation::Create {
            kind: COUNTER_KIND,
            object: json!({"metadata": {"name": GENERATION_NAME}, "generation": next}),
        },
    };
    store.commit(mutation, false).await?;
    Ok(next)
}

/// The next unused logical id: above the persisted high-water mark and above every
/// existing node's id. Returns it with the counter object as currently stored.
pub fn next_logical_id(store: &Store) -> (u64, Option<Value>) {
    let counter = store.get(COUNTER_KIND, COUNTER_NAME).map(|c| (*c).clone());
    let high_water = counter.as_ref().and_then(|c| c["highWater"].as_u64()).unwrap_or(0);
    let (_, nodes) = store.list("nodes");
    let max_node = nodes.iter().filter_map(|n| n["spec"]["logicalId"].as_u64()).max().unwrap_or(0);
    (high_water.max(max_node) + 1, counter)
}

/// The writes that record `command`: the command, and for a Provision the high-water
/// mark and every node's intent; for a Kill, the mark on the target node.
fn plan(store: &Store, command: FleetCommand, object: &Value) -> ApiResult<Vec<Mutation>> {
    let id = command.metadata.name.clone();
    let mut record = object.clone();
    if let Some(meta) = record["metadata"].as_object_mut() {
        meta.remove("managedFields");
        meta.remove("resourceVersion");
    }
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
            return Err(ApiError::Invalid { kind: "FleetCommand".into(), name: id, errors: errors.0 });
        }
        let (first, counter) = next_logical_id(store);
        let last = first + u64::from(provision.count) - 1;
        mutations.push(match counter {
            Some(mut counter) => {
                counter["highWater"] = json!(last);
                Mutation::Update { kind: COUNTER_KIND, object: counter, subresource: Subresource::Main }
            }
            None => Mutation::Create {
                kind: COUNTER_KIND,
                object: json!({"metadata": {"name": COUNTER_NAME}, "highWater": last}),
            },
        });
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
            let node = serde_json::to_value(node).map_err(|e| ApiError::Internal(e.into()))?;
            mutations.push(Mutation::Create { kind: "nodes", object: node });
            touched.push(name);
        }
    }
    if let Some(kill) = &command.spec.kill {
        let Some(node) = store.get("nodes", &kill.node) else {
            return Err(invalid(
                &id,
                "spec.kill.node",
                Reason::Invalid,
                format!("{:?}: no such Node", kill.node),
            ));
        };
        let mut marked = (*node).clone();
        marked["metadata"]["annotations"][KILLED_BY] = json!(id);
        // No resourceVersion precondition: status writes racing this one must not fail
        // the command (a Main update keeps the stored status).
        if let Some(meta) = marked["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        mutations.push(Mutation::Update { kind: "nodes", object: marked, subresource: Subresource::Main });
        touched.push(kill.node.clone());
    }
    record["status"] = json!({"phase": FleetCommandPhase::Pending, "nodes": touched});
    mutations.insert(0, Mutation::Create { kind: "fleetcommands", object: record });
    Ok(mutations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreConfig;

    fn provision(id: &str, count: u32) -> Value {
        json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
               "spec": {"provision": {"provider": "process", "count": count}}, "status": {}})
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
                tokio::spawn(async move { submit(&store, provision("c1", 3), false).await.unwrap().0 })
            })
            .collect();
        let mut codes = Vec::new();
        for task in tasks {
            codes.push(task.await.unwrap());
        }
        assert_eq!(codes.iter().filter(|c| **c == StatusCode::CREATED).count(), 1);
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
        submit(&store, provision("a", 2), false).await.unwrap();
        let before = store.revision();
        let err = submit(&store, provision("a", 1), false).await.unwrap_err().to_string();
        assert!(err.contains("\"a\" was already used with a different body"), "{err}");
        assert_eq!(store.revision(), before, "nothing written");
        let delete =
            Mutation::Delete { kind: "nodes", name: "node-2".into(), uid: None, resource_version: None };
        store.commit(delete, false).await.unwrap();
        submit(&store, provision("b", 1), false).await.unwrap();
        assert!(store.get("nodes", "node-3").is_some(), "the deleted node's id is not reused");
        let err = submit(
            &store,
            {
                let mut c = provision("c", 1);
                c["spec"]["provision"]["provider"] = json!("nope");
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
        submit(&store, kill, false).await.unwrap();
        assert_eq!(store.get("nodes", "node-1").unwrap()["metadata"]["annotations"][KILLED_BY], "k");
    }
}
