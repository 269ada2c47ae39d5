//! The retained record of every command id: the tombstone a deleted FleetCommand leaves.
//!
//! A command id names one command forever (the Myelin document: "reusing an ID returns
//! the original record and never repeats create or destroy"). So the transaction that
//! records a command also creates its retained record, an object of the internal store
//! kind [`KIND`] (not served by the API, so no client can delete it), holding a copy of
//! the command. Creating it is the claim on the id: it fails if the id was ever recorded,
//! by any path, in any run. The copy's status is kept current by the fleet's command
//! status writes (`Fleet::command_status`), and carries on alone once the command object
//! is deleted; a later create of the id finds it and gets the original record back.
//!
//! Why here and not a tombstone written by DELETE: the record exists from the moment the
//! id is used, so no delete path (DELETE, a finalizer's last removal, a future pruner) can
//! skip it, and no crash between a delete and its tombstone can free the id.

use hive_api::fleet_command::{FleetCommand, FleetCommandStatus};
use serde::{Deserialize, Serialize};

use crate::store::{self, Mutation, Store, Subresource};

/// The internal (unserved) store kind of retained command records.
pub const KIND: &str = "fleetcommandids";

/// One retained record: the command as last known, under the id's name.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Retained {
    metadata: Meta,
    command: FleetCommand,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: String,
    /// Kept from the read, so an update is conditional on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resource_version: Option<String>,
}

fn read(store: &Store, id: &str) -> Option<Retained> {
    let object = store.get(KIND, id)?;
    match object.decode::<Retained>() {
        Ok(retained) => Some(retained),
        Err(err) => {
            // Still a claim on the id: the caller sees a record with what is known.
            tracing::warn!(command = id, %err, "a retained command record does not decode");
            let mut command = FleetCommand::new(id, Default::default());
            command.status.error = Some(format!("the retained record of this id does not decode: {err}"));
            Some(Retained { metadata: Meta { name: id.into(), resource_version: None }, command })
        }
    }
}

/// The retained command of `id`, if the id was ever recorded.
pub fn get(store: &Store, id: &str) -> Option<FleetCommand> {
    read(store, id).map(|r| r.command)
}

/// Every retained command.
pub fn list(store: &Store) -> Vec<FleetCommand> {
    let (_, objects) = store.list(KIND);
    objects.iter().filter_map(|o| o.decode::<Retained>().ok()).map(|r| r.command).collect()
}

/// The write that claims `command`'s id and retains it: a create, so it fails with
/// `AlreadyExists` when the id was recorded before. Part of the recording transaction.
pub fn claim(command: &FleetCommand) -> Mutation {
    let retained = Retained {
        metadata: Meta { name: command.metadata.name.clone(), resource_version: None },
        command: command.clone(),
    };
    Mutation::Create { kind: KIND, object: serde_json::to_value(&retained).expect("a record encodes") }
}

/// The stored command's resourceVersion as a number (0 when absent).
fn revision(command: &FleetCommand) -> u64 {
    command.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Copies the status of the live `command` into its retained record, unless the record
/// already holds a later revision of it (two writers never move it backwards).
pub async fn keep(store: &Store, command: &FleetCommand) {
    update(store, &command.metadata.name, |retained| {
        if revision(retained) >= revision(command) || retained.status == command.status {
            return false;
        }
        retained.status = command.status.clone();
        retained.metadata.resource_version = command.metadata.resource_version.clone();
        true
    })
    .await;
}

/// Applies `change` to the retained status of `id`, for a command whose object is gone
/// (deleted while it ran): the record carries the outcome on. Returns the new copy.
pub async fn patch_status(
    store: &Store,
    id: &str,
    mut change: impl FnMut(&mut FleetCommandStatus),
) -> Option<FleetCommand> {
    update(store, id, |retained| {
        let before = retained.status.clone();
        change(&mut retained.status);
        retained.status != before
    })
    .await
}

/// Read-modify-write of the retained command of `id`, conditional on the revision read
/// and retried on a lost race; `change` says whether it changed anything. Returns the
/// command as retained after it (`None` when the id was never recorded).
async fn update(
    store: &Store,
    id: &str,
    mut change: impl FnMut(&mut FleetCommand) -> bool,
) -> Option<FleetCommand> {
    for _ in 0..8 {
        let mut retained = read(store, id)?;
        if !change(&mut retained.command) {
            return Some(retained.command);
        }
        let command = retained.command.clone();
        let object = serde_json::to_value(&retained).expect("a record encodes");
        let update = Mutation::Update { kind: KIND, object, subresource: Subresource::Main };
        match store.commit(update, false).await {
            Ok(_) => return Some(command),
            Err(store::Error::Conflict { .. }) => continue,
            Err(err) => {
                tracing::warn!(command = id, %err, "updating a retained command record failed");
                return Some(command);
            }
        }
    }
    tracing::warn!(command = id, "updating a retained command record kept losing races");
    read(store, id).map(|r| r.command)
}

/// Retains every recorded command that has no retained record yet (recorded by a hive
/// that predates them), so that deleting it cannot free its id either.
pub async fn backfill(store: &Store) {
    let (_, commands) = crate::client::Api::<FleetCommand>::new(store).list();
    for command in commands {
        if command.status.phase.is_none() || store.get(KIND, &command.metadata.name).is_some() {
            continue;
        }
        match store.commit(claim(&command), false).await {
            Ok(_) | Err(store::Error::AlreadyExists { .. }) => {}
            Err(err) => tracing::warn!(command = command.metadata.name, %err, "retaining a command failed"),
        }
    }
}
