//! The Node intents of a recorded Provision, written in groups the store takes.
//!
//! A Provision's record (`commands.rs`) names every node it creates in `status.nodes`,
//! and its first transaction holds the command, its retained record, the logical-id
//! counter advanced over all of those nodes, and as many node intents as fit in one store
//! transaction ([`Store::group_limit`]: etcd's `--max-txn-ops` and request size; the
//! embedded store takes any number, so there the first transaction is the whole record).
//! [`complete`] writes the rest, one group at a time. The recording calls it before it
//! answers, and the claim of a command for execution calls it before the claim
//! (`intake::claim`), so a recording cut off between groups (a crash, a failover, etcd
//! unreachable) is completed before any provider call for that command.
//!
//! Every intent is derived from the recorded command alone ([`nodes`]), so the recorder,
//! its retry, another replica and the claimer all write the same nodes: a node already
//! there with the same command label is that intent, and is left as it is; a node of
//! another command at one of the names is [`Error::Taken`], never overwritten.
//!
//! Architecture Invariant: a command is claimed (the one way it runs) only after every
//! node its record names exists.

use std::collections::BTreeMap;

use hive_api::fleet_command::FleetCommand;
use hive_api::meta::Time;
use hive_api::names::FLEET_COMMAND_LABEL;
use hive_api::node::{Node, NodePhase, NodeSpec};
use hive_api::resource::Object as _;

use crate::client::{self, Api};
use crate::store::{self, Mutation, Store};

/// The name of the node with logical id `id`.
pub fn node_name(id: u64) -> String {
    format!("node-{id}")
}

/// The logical id a node name made by [`node_name`] carries.
fn logical_id(name: &str) -> Option<u64> {
    name.strip_prefix("node-")?.parse().ok()
}

/// Why a command's node intents could not all be written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The record names a node no Provision of this fleet would name (`node-<logical
    /// id>`): it was not recorded by `commands.rs`, and nothing of it is written.
    #[error(
        "fleetcommands.hive.dev {command:?}: status.nodes[{index}]: {node:?} is not a node name the fleet \
         gives (node-<logical id>)"
    )]
    NotANodeName {
        /// The command id.
        command: String,
        /// Where in `status.nodes`.
        index: usize,
        /// The name found there.
        node: String,
    },
    /// A node the command names exists and belongs to another command (or to none): it
    /// is left as it is, and the command cannot run.
    #[error(
        "fleetcommands.hive.dev {command:?}: status.nodes[{index}]: node {node:?} already exists and belongs to \
         {}; it was not overwritten",
        .owner.as_deref().map_or_else(|| "no command".to_string(), |o| format!("command {o:?}"))
    )]
    Taken {
        /// The command id.
        command: String,
        /// Where in `status.nodes`.
        index: usize,
        /// The node's name.
        node: String,
        /// The command its `hive.dev/fleet-command` label names, if any.
        owner: Option<String>,
    },
    /// A read or an admitted write failed.
    #[error(transparent)]
    Client(#[from] client::Error),
    /// The store failed a group's transaction; the groups before it are written.
    #[error(transparent)]
    Store(#[from] store::Error),
}

impl Error {
    /// Whether the command can never run as recorded (retrying changes nothing).
    pub fn is_permanent(&self) -> bool {
        matches!(self, Error::NotANodeName { .. } | Error::Taken { .. })
    }
}

/// Every node a recorded Provision names, in the order of `status.nodes`: the intent
/// the recording writes for each (Pending, labelled with the command). None for a Kill.
pub fn nodes(command: &FleetCommand, now: Time) -> Result<Vec<Node>, Error> {
    let Some(provision) = &command.spec.provision else { return Ok(Vec::new()) };
    let id = &command.metadata.name;
    let mut nodes = Vec::with_capacity(command.status.nodes.len());
    for (index, name) in command.status.nodes.iter().enumerate() {
        let Some(logical_id) = logical_id(name).filter(|l| node_name(*l) == *name) else {
            return Err(Error::NotANodeName { command: id.clone(), index, node: name.clone() });
        };
        let mut node = Node::new(
            name.clone(),
            NodeSpec {
                logical_id,
                provider: provision.provider.clone(),
                command: Some(id.clone()),
                offer_id: provision.selected_offer_ids.get(index).copied(),
                image: provision.image.clone(),
                bootstrap: provision.bootstrap.clone(),
                labels: provision.labels.clone(),
                build_slots: provision.build_slots,
            },
        );
        node.metadata.labels = BTreeMap::from([(FLEET_COMMAND_LABEL.to_string(), id.clone())]);
        node.status.set_phase(NodePhase::Pending, now);
        nodes.push(node);
    }
    Ok(nodes)
}

/// The first transaction of a recording: `lead` (the command, its retained record, the
/// counter: writes that must land together) and as many of `intents` after it as the
/// store takes in one transaction; [`complete`] writes the others.
pub fn first_group(store: &Store, lead: Vec<Mutation>, intents: Vec<Mutation>) -> Vec<Mutation> {
    let Some(limit) = store.group_limit() else {
        return lead.into_iter().chain(intents).collect();
    };
    let mut bytes: usize = lead.iter().map(Mutation::size).sum();
    let mut group = lead;
    for intent in intents {
        let size = intent.size();
        if !limit.admits(group.len() + 1, bytes + size) {
            break;
        }
        bytes += size;
        group.push(intent);
    }
    group
}

/// Writes every node intent `command`'s record names that is not stored yet, in groups
/// of at most what the store takes in one transaction, and returns how many it wrote.
/// Safe to run any number of times, concurrently, here or on another replica (see the
/// module docs). On a store error the groups before it are written and the rest are
/// left to the next call: a command runs only once this returned `Ok`.
pub async fn complete(store: &Store, command: &FleetCommand) -> Result<usize, Error> {
    let id = &command.metadata.name;
    let nodes = Api::<Node>::new(store);
    let taken = |index: usize, node: &Node| Error::Taken {
        command: id.clone(),
        index,
        node: node.metadata.name.clone(),
        owner: node.metadata.labels.get(FLEET_COMMAND_LABEL).cloned(),
    };
    let ours = |node: &Node| node.metadata.labels.get(FLEET_COMMAND_LABEL) == Some(id);
    // Index in `status.nodes` → the intent still to write.
    let mut missing: BTreeMap<usize, Node> =
        self::nodes(command, Time(store.now()))?.into_iter().enumerate().collect();
    let mut written = 0;
    loop {
        // What the cache shows stored now: every group another writer of this record
        // landed meanwhile, not only the node a failed create named.
        let mut stored_now = Vec::new();
        for (index, intent) in &missing {
            match nodes.get(&intent.metadata.name)? {
                Some(node) if ours(&node) => stored_now.push(*index),
                Some(node) => return Err(taken(*index, &node)),
                None => {}
            }
        }
        for index in stored_now {
            missing.remove(&index);
        }
        if missing.is_empty() {
            break;
        }
        let limit = store.group_limit();
        let mut group = Vec::new();
        let mut bytes = 0;
        for (index, intent) in &missing {
            let mutation = nodes.create_mutation(intent)?;
            let size = mutation.size();
            // A group holds at least one node, whatever its size.
            if !group.is_empty() && limit.is_some_and(|l| !l.admits(group.len() + 1, bytes + size)) {
                break;
            }
            bytes += size;
            group.push((*index, mutation));
        }
        let indexes: Vec<usize> = group.iter().map(|(index, _)| *index).collect();
        match store.commit_all(group.into_iter().map(|(_, m)| m).collect(), false).await {
            Ok(_) => {
                written += indexes.len();
                for index in indexes {
                    missing.remove(&index);
                }
            }
            // Another writer of this record (a retry, another replica) was faster with
            // this group, or another command took one of its names. A quorum read of the
            // name tells which (this replica's cache may not show it yet).
            Err(store::Error::AlreadyExists { name, .. }) => {
                let Some(index) = indexes.into_iter().find(|i| missing[i].metadata.name == name) else {
                    return Err(store::Error::AlreadyExists { kind: Node::PLURAL.into(), name }.into());
                };
                let object = store.get_consistent(Node::PLURAL, &name).await?;
                match object.map(|o| client::decode::<Node>(&o)).transpose()? {
                    Some(node) if ours(&node) => {
                        missing.remove(&index);
                    }
                    Some(node) => return Err(taken(index, &node)),
                    // Created and deleted since: the caller tries again.
                    None => {
                        return Err(store::Error::AlreadyExists { kind: Node::PLURAL.into(), name }.into())
                    }
                }
            }
            Err(err) => return Err(err.into()),
        }
    }
    if written > 0 {
        tracing::info!(
            command = id,
            written,
            "fleet command: node intents written after its first transaction"
        );
    }
    Ok(written)
}
