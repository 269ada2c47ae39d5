//! The idempotent command record: every FleetCommand, whatever created it, is recorded
//! here once per id, before any provider call. Its first durable store transaction holds
//! the command (Pending, `status.nodes` naming every node it touches), the id's retained
//! record ([`super::retained`]), the logical-id counter advanced over all those nodes, a
//! Kill's mark on its node, and as many of a Provision's Node intents as the store takes
//! in one transaction: all of them on the embedded store; on etcd, up to its request
//! limits (`--max-txn-ops`, the request size), so a Provision of the most nodes a command
//! may ask for (1,000) needs several. The other intents are written after it, in groups
//! ([`super::intents`]), before the recording answers. If a later group fails (etcd
//! down, the daemon killed) the command is still recorded: the answer is the recorded
//! command all the same, and the claim that must precede any run of it
//! (`super::intake`) writes the missing intents first. The object name is the caller's
//! command id.
//!
//! - [`record`] is `POST /apis/hive.dev/v1/fleetcommands` (its HTTP half is
//!   `server/fleet.rs`): a new id is recorded and created together (201).
//! - [`intake`] takes a command some other path stored unrecorded (`hive apply`,
//!   `kubectl apply`, server-side apply: `status` empty) and records it, claimed by a
//!   compare-and-swap on its resourceVersion; the fleet's intake controller
//!   (`super::intake`) calls it, then claims and runs what either recorded.
//!
//! Recording takes no lock: every transaction is conditional (see [`RETRIES`]), so two
//! recordings in one daemon race exactly as two daemons sharing a store do.
//!
//! A used id is never run again. A create of an id that exists answers the stored record
//! (200), with a warning when the body differs; a create of an id whose command was
//! deleted brings its retained record back and answers it, on every path, after any
//! number of restarts. Nothing is provisioned or destroyed twice.
//!
//! Node logical ids come from a high-water mark kept in an internal store object
//! ([`COUNTER_KIND`]/[`COUNTER_NAME`], not served by the API, so no client can delete
//! it), advanced in the same transaction as the nodes it numbers: an id is never
//! reused, even after the highest node is deleted and the daemon restarts. The counter is
//! advanced over every node of a Provision in its first transaction, so a recording cut
//! off between groups has still taken all of its ids.

pub use super::intents::node_name;
use super::{intents, retained};
use crate::client::{self, Api};
use crate::store::{self, Mutation, Store, Subresource};
use hive_api::fleet_command::{FleetCommand, FleetCommandPhase, FleetCommandStatus};
use hive_api::node::Node;
use hive_api::provider::{Provider, ProviderType};
use hive_api::resource::Object as _;
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

/// How many times one recording is planned again after losing a race to another.
///
/// No lock serializes recordings: each one's transaction is its own compare-and-swap.
/// The command's create fails when its id was recorded meanwhile (the next round answers
/// that record), the logical-id counter's update is conditional on the revision it was
/// read at (a concurrent Provision moved it: the next round plans above its nodes), and
/// the intake's status write on the command's. So concurrent identical creates record
/// one command here as across daemons sharing a store, and of N concurrent recordings
/// each loses at most N - 1 rounds (every lost round is another one's win).
const RETRIES: usize = 32;

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
        match object.decode::<Counter>() {
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
    /// Every attempt lost a race with a concurrent recording (see [`RETRIES`]); the
    /// caller may retry.
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
    /// The id was used before: the original record; nothing was run again.
    Replayed(Replay),
}

/// The original record a used id answers.
#[derive(Debug)]
pub struct Replay {
    /// The original record, as stored (brought back from its retained record when the
    /// command had been deleted).
    pub command: FleetCommand,
    /// The incoming spec is not the original's (the caller is warned: the id names the
    /// original command, and the new body was not run).
    pub differs: bool,
    /// The command had been deleted; its record was brought back.
    pub restored: bool,
}

impl Replay {
    /// The `Warning` a client is shown, if any.
    pub fn warning(&self) -> Option<String> {
        let id = &self.command.metadata.name;
        let deleted = if self.restored { " (and deleted since; its record is back)" } else { "" };
        self.differs.then(|| {
            format!(
                "fleet command id {id:?} was already used with a different body{deleted}: this is the original \
                 record, unchanged, and the new body was not run; use a new id for a new command"
            )
        })
    }
}

fn invalid(name: &str, field: &str, reason: Reason, message: impl Into<String>) -> RecordError {
    RecordError::Invalid { name: name.into(), errors: vec![ValidationError::new(field, reason, message)] }
}

/// Records the admitted `command` (and its node intents) for `POST`; see the module
/// docs. With `dry_run`, says what it would record and writes nothing.
pub async fn record(store: &Store, command: FleetCommand, dry_run: bool) -> Result<Recorded, RecordError> {
    let commands = Api::<FleetCommand>::new(store);
    let id = command.metadata.name.clone();
    if id.is_empty() {
        return Err(invalid("", "metadata.name", Reason::Required, "the command id is required"));
    }
    for _ in 0..RETRIES {
        if let Some(stored) = commands.get(&id)? {
            return Ok(replay(stored, &command, false));
        }
        if let Some(original) = retained::get(store, &id) {
            return restore(store, original, &command, dry_run).await;
        }
        let planned = plan(store, command.clone())?;
        let mut lead = vec![commands.create_mutation(&planned.record)?, retained::claim(&planned.record)];
        lead.extend(planned.writes);
        let mutations = if dry_run {
            // Computed in memory: no transaction, so no limit.
            lead.into_iter().chain(planned.nodes).collect()
        } else {
            intents::first_group(store, lead, planned.nodes)
        };
        match store.commit_all(mutations, dry_run).await {
            // The command is the first of the writes.
            Ok(outcomes) => {
                let created = outcomes.into_iter().next().expect("the command is one of the writes");
                let created: FleetCommand = client::decode(&created.into_object())?;
                if !dry_run {
                    // The retained copy gains what the store stamped (uid, creation time).
                    retained::keep(store, &created).await;
                    complete(store, &created).await;
                }
                return Ok(Recorded::Created(created));
            }
            // Another recording landed since the reads above: this id's (the next round
            // answers it), or another command's that took the counter or the node names
            // (the next round plans above them).
            Err(store::Error::AlreadyExists { .. } | store::Error::Conflict { .. }) => continue,
            Err(err) => return Err(err.into()),
        }
    }
    Err(contended(&id))
}

/// Writes the node intents of a just recorded command that did not fit in its first
/// transaction ([`intents::complete`]), before the recording answers. A failure here
/// (etcd down, a node of another command at one of the names) is logged and not the
/// caller's: the command is recorded, and its claim completes (or fails) it before it
/// runs.
async fn complete(store: &Store, recorded: &FleetCommand) {
    if let Err(err) = intents::complete(store, recorded).await {
        tracing::warn!(
            command = recorded.metadata.name,
            %err,
            "fleet command recorded, but not all its node intents yet: its claim writes the rest before it runs"
        );
    }
}

/// The answer after [`RETRIES`] lost races in a row.
fn contended(id: &str) -> RecordError {
    RecordError::Conflict {
        name: id.to_string(),
        message: format!(
            "fleet command {id:?}: {RETRIES} recordings in a row lost a race with others; retry"
        ),
    }
}

/// A command id seen before: the stored record, whatever the incoming body.
fn replay(stored: FleetCommand, incoming: &FleetCommand, restored: bool) -> Recorded {
    let differs = stored.spec != incoming.spec;
    Recorded::Replayed(Replay { command: stored, differs, restored })
}

/// The object of a retained record, ready to be created again: what the store stamps
/// afresh is left out.
fn revived(original: &FleetCommand) -> FleetCommand {
    let mut object = original.clone();
    object.metadata.resource_version = None;
    object.metadata.uid = None;
    object.metadata.deletion_timestamp = None;
    object
}

/// A deleted command's id created again: its retained record comes back as the object,
/// and is the answer. Nothing is recorded or run.
async fn restore(
    store: &Store,
    original: FleetCommand,
    incoming: &FleetCommand,
    dry_run: bool,
) -> Result<Recorded, RecordError> {
    let commands = Api::<FleetCommand>::new(store);
    let id = original.metadata.name.clone();
    tracing::info!(command = id, "fleet command id reused after its delete: its record is brought back");
    match commands.create_opts(&revived(&original), dry_run).await {
        Ok(back) => Ok(replay(back, incoming, true)),
        Err(client::Error::Store(store::Error::AlreadyExists { .. })) => {
            let stored = commands.get_existing(&id)?;
            Ok(replay(stored, incoming, false))
        }
        Err(err) => Err(err.into()),
    }
}

/// What the intake did with a stored, unrecorded command.
#[derive(Debug)]
pub enum Intake {
    /// Recorded (Pending, its node intents written): the fleet runs it next.
    Recorded(FleetCommand),
    /// Its id was used by a command since deleted: the original record replaced it, and
    /// nothing runs.
    Restored(FleetCommand),
    /// It breaks a rule that needs the store (no such Provider, no such Node): marked
    /// Failed, naming the field; the id stays free, as after a refused POST.
    Refused(FleetCommand),
    /// Recorded, changed or deleted meanwhile (by this intake, POST, or another daemon):
    /// nothing to do.
    Skipped,
}

/// Records `seen`, a command stored without going through [`record`] (its status is
/// empty), so that it runs as if POSTed: the default provider is filled in, and the
/// command's status, node intents, counter and retained record are written in one
/// transaction, conditional on the command's resourceVersion as read here (the claim:
/// a second intake, here or in another daemon, finds it changed and skips it). A round
/// lost to another command's recording (the counter moved) is read and planned again.
pub async fn intake(
    store: &Store,
    seen: &FleetCommand,
    default_provider: &str,
) -> Result<Intake, RecordError> {
    let id = seen.metadata.name.clone();
    for _ in 0..RETRIES {
        if let Some(done) = intake_once(store, &id, default_provider).await? {
            return Ok(done);
        }
    }
    Err(contended(&id))
}

/// One round of [`intake`]: `None` when its transaction lost a race (the command, the
/// counter or a node changed since the read), to be read and planned again.
async fn intake_once(store: &Store, id: &str, default_provider: &str) -> Result<Option<Intake>, RecordError> {
    let commands = Api::<FleetCommand>::new(store);
    let id = id.to_string();
    let Some(current) = commands.get(&id)? else { return Ok(Some(Intake::Skipped)) };
    if current.status.phase.is_some() || current.metadata.deletion_timestamp.is_some() {
        return Ok(Some(Intake::Skipped));
    }
    if let Some(original) = retained::get(store, &id) {
        // This exact version goes, the original comes back: one transaction.
        let replaced = Mutation::Delete {
            kind: FleetCommand::PLURAL,
            name: id.clone(),
            uid: current.metadata.uid.clone(),
            resource_version: current.metadata.resource_version.clone(),
        };
        tracing::warn!(
            command = id,
            "fleet command id reused after its delete: the original record replaces the new one; nothing runs"
        );
        let mutations = vec![replaced, commands.create_mutation(&revived(&original))?];
        return match store.commit_all(mutations, false).await {
            Ok(outcomes) => {
                let back = outcomes.into_iter().nth(1).expect("the restore is one of the writes");
                Ok(Some(Intake::Restored(client::decode(&back.into_object())?)))
            }
            Err(store::Error::Conflict { .. } | store::Error::NotFound { .. }) => Ok(None),
            Err(err) => Err(err.into()),
        };
    }
    let mut command = current.clone();
    if let Some(provision) = command.spec.provision.as_mut().filter(|p| p.provider.is_empty()) {
        provision.provider = default_provider.to_string();
    }
    let Plan { record: recorded, writes, nodes } = match plan(store, command.clone()) {
        Ok(planned) => planned,
        Err(RecordError::Invalid { errors, .. }) => {
            let why = errors.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            tracing::warn!(command = id, why, "fleet command refused at intake");
            let now = hive_api::meta::Time(store.now());
            let written = commands
                .patch_status(&id, |s| {
                    if s.phase.is_none() {
                        s.phase = Some(FleetCommandPhase::Failed);
                        s.error = Some(format!("not run: {why}"));
                        s.finished_at = Some(now);
                    }
                })
                .await?;
            return Ok(Some(Intake::Refused(written.into_inner())));
        }
        Err(err) => return Err(err),
    };
    // The status write carries the resourceVersion read above: the compare-and-swap.
    let mut claimed = recorded.clone();
    claimed.metadata.resource_version = current.metadata.resource_version.clone();
    let mut mutations = vec![Mutation::Update {
        kind: FleetCommand::PLURAL,
        object: serde_json::to_value(&claimed).map_err(|source| client::Error::Decode {
            kind: FleetCommand::KIND,
            name: id.clone(),
            source,
        })?,
        subresource: Subresource::Status,
    }];
    if command.spec != current.spec {
        // The default provider, filled in as POST fills it in; the fleet's own write of
        // an otherwise immutable spec, once, before the command is recorded.
        let mut filled = recorded.clone();
        filled.metadata.resource_version = None;
        mutations.push(Mutation::Update {
            kind: FleetCommand::PLURAL,
            object: serde_json::to_value(&filled).map_err(|source| client::Error::Decode {
                kind: FleetCommand::KIND,
                name: id.clone(),
                source,
            })?,
            subresource: Subresource::Main,
        });
    }
    mutations.push(retained::claim(&recorded));
    mutations.extend(writes);
    match store.commit_all(intents::first_group(store, mutations, nodes), false).await {
        Ok(_) => {
            let stored = commands.get_existing(&id)?;
            retained::keep(store, &stored).await;
            complete(store, &stored).await;
            tracing::info!(command = id, action = stored.action(), "fleet command recorded at intake");
            Ok(Some(Intake::Recorded(stored)))
        }
        // The next round reads the command again: changed or gone, it is skipped then.
        Err(
            store::Error::Conflict { .. }
            | store::Error::NotFound { .. }
            | store::Error::AlreadyExists { .. },
        ) => Ok(None),
        Err(err) => Err(err.into()),
    }
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

/// What recording a command writes ([`plan`]).
struct Plan {
    /// The command as recorded: Pending, naming every node it touches.
    record: FleetCommand,
    /// The writes that land with the command, in its first transaction: for a Provision
    /// the high-water mark advanced over all its nodes, for a Kill the mark on the node.
    writes: Vec<Mutation>,
    /// A Provision's node intents ([`intents::nodes`]), as many in the first transaction
    /// as fit, the rest after it ([`intents::complete`]).
    nodes: Vec<Mutation>,
}

/// What recording `command` writes (see [`Plan`]). Each write is admitted as the API
/// admits it.
fn plan(store: &Store, command: FleetCommand) -> Result<Plan, RecordError> {
    let nodes = Api::<Node>::new(store);
    let id = command.metadata.name.clone();
    let mut record = command.clone();
    record.metadata.resource_version = None;
    let mut writes = Vec::new();
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
        writes.push(counter.mutation());
        touched.extend((first..=last).map(node_name));
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
        writes.push(nodes.replace_mutation(&marked, &node)?);
        touched.push(kill.node.clone());
    }
    record.status =
        FleetCommandStatus { phase: Some(FleetCommandPhase::Pending), nodes: touched, ..Default::default() };
    // Names made by `node_name` just above: a failure here would be a bug of this file.
    let intents = intents::nodes(&record, hive_api::meta::Time(store.now()))
        .map_err(|err| invalid(&id, "status.nodes", Reason::Invalid, err.to_string()))?;
    let nodes = intents.iter().map(|node| nodes.create_mutation(node)).collect::<Result<_, _>>()?;
    Ok(Plan { record, writes, nodes })
}

#[cfg(test)]
mod tests;
