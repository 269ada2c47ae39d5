//! The FleetCommand intake: a controller on the shared runtime (`hive_controllers`) that
//! takes every stored command, whatever wrote it, through two steps, each a
//! compare-and-swap on the command's `resourceVersion`:
//!
//! 1. **Record.** A command with an empty status (stored by `hive apply`, `kubectl
//!    apply`, server-side apply) is recorded by [`commands::intake`]: Pending, its Node
//!    intents, the counter and its retained record (the intents in more than one
//!    transaction when they do not fit one, see `intents.rs`). POST records its command
//!    itself ([`commands::record`]); either way the command is Pending next.
//! 2. **Claim.** A recorded Pending command is claimed for execution by [`claim`]. It
//!    first writes any Node intent the record names that is not stored yet (a recording
//!    cut off between its transactions; a node of another command at one of the names
//!    makes the command Failed instead, naming it), so no provider is called for a node
//!    without a record. Then one status write, conditional on the version read, moves it
//!    to `Running` and names this daemon run in `status.claim`. Of any number of claimers (two reconciles, two daemons
//!    sharing a store) exactly one wins; the others find it Running and leave it. Only
//!    the winner runs it (`Fleet::execute`, which takes the [`Claimed`] command), so a
//!    command's provider work runs once per id.
//!
//! **Order.** The commands of one file are recorded in the order they were written, so a
//! Kill of a node that the Provision before it creates finds that node: the controller
//! takes one name at a time, in the order the watch delivers them, and an unrecorded
//! command waits while one with a lower `resourceVersion` is still unrecorded (which
//! also holds after a relist, which lists by name, and while an earlier command backs
//! off).
//!
//! **This run's commands.** What tells this run's commands from an earlier run's is the
//! durable claim, not memory: `status.claim.run` is the fleet's run id (also kept in the
//! command's retained record, so it outlives a delete). An earlier run's unfinished
//! commands (Pending or Running) are made Failed at start before this controller lists
//! anything (`exec::fail_interrupted_commands`): an earlier run's Pending command is
//! never claimed, and a command that is not terminal is this run's even before it is
//! claimed. Recovery leaves the nodes of this run's commands alone ([`this_run`]).

use std::sync::Arc;
use std::time::Duration;

use hive_api::fleet_command::{FleetCommand, FleetCommandClaim, FleetCommandPhase};
use hive_api::meta::Time;
use hive_controllers::reflector::Store as Cache;
use hive_controllers::{Action, Config, Controller, Target};

use super::commands::{self, Intake as Recording, RecordError};
use super::{intents, retained, Fleet};
use crate::client::{self, Api};
use crate::store::{self, Store};

/// How often a claim is re-read and retried after losing a race to another writer of the
/// command's status (not another claimer: that one is found Running).
const RETRIES: usize = 8;

/// How soon an unrecorded command looks again while an earlier one is unrecorded.
const WAIT_FOR_EARLIER: Duration = Duration::from_millis(200);

/// Why taking a command failed for now; retried with backoff by the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Recording an unrecorded command failed (a read, the store, or every round lost a
    /// race with other recordings).
    #[error(transparent)]
    Record(#[from] RecordError),
    /// A read or an admitted write of the claim failed.
    #[error(transparent)]
    Client(#[from] client::Error),
    /// The store failed the claim's transaction.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// Writing the node intents a claimed command's record names failed (for now).
    #[error(transparent)]
    Intents(#[from] intents::Error),
    /// Every claim lost a race with another writer of the command's status.
    #[error("fleetcommands.hive.dev {0:?} kept changing: {RETRIES} claims in a row lost a race")]
    Contended(String),
}

/// A command this run claimed: the one thing `exec::execute` runs. Only [`claim`] makes
/// one, so nothing executes a command it did not win.
#[derive(Debug)]
pub(super) struct Claimed(Box<FleetCommand>);

impl Claimed {
    /// The command as claimed (Running, `status.claim` naming this run).
    pub(super) fn command(&self) -> &FleetCommand {
        &self.0
    }
}

/// The outcome of one [`claim`].
#[derive(Debug)]
pub(super) enum Claim {
    /// This run claimed it: it is Running, and this run executes it.
    Won(Claimed),
    /// Not Pending any more (claimed by another run or intake, finished, failed at
    /// start), being deleted, or gone.
    Lost,
    /// Pending, but never recorded (no retained record: its status was written by hand):
    /// never run.
    Unrecorded,
    /// Recorded, but a node its record names belongs to another command: made Failed,
    /// naming the node, and never run.
    Refused(Box<FleetCommand>),
}

/// Claims command `name` for daemon run `run`, exactly once across every claimer (see
/// the module documentation).
pub(super) async fn claim(store: &Store, run: &str, name: &str) -> Result<Claim, Error> {
    let commands = Api::<FleetCommand>::new(store);
    for _ in 0..RETRIES {
        let Some(command) = commands.get(name)? else { return Ok(Claim::Lost) };
        if command.status.phase != Some(FleetCommandPhase::Pending)
            || command.status.claim.is_some()
            || command.metadata.deletion_timestamp.is_some()
        {
            return Ok(Claim::Lost);
        }
        if retained::get(store, name).is_none() {
            return Ok(Claim::Unrecorded);
        }
        // Every node the record names exists before the command can run: a recording
        // cut off after its first transaction is completed here.
        match intents::complete(store, &command).await {
            Ok(_) => {}
            Err(err) if err.is_permanent() => return refuse(store, command, &err).await,
            Err(err) => return Err(err.into()),
        }
        let now = Time(store.now());
        let mut claimed = command;
        claimed.status.phase = Some(FleetCommandPhase::Running);
        claimed.status.started_at = Some(now);
        claimed.status.claim = Some(FleetCommandClaim { run: run.to_string(), at: now });
        // The status write carries the resourceVersion read above: the compare-and-swap.
        match store.commit(commands.status_mutation(&claimed)?, false).await {
            Ok(outcome) => {
                let won: FleetCommand = client::decode(outcome.object())?;
                retained::keep(store, &won).await;
                return Ok(Claim::Won(Claimed(Box::new(won))));
            }
            // Written since the read (claimed by another, or any other status write):
            // the next round reads what it is now.
            Err(store::Error::Conflict { .. }) => continue,
            Err(store::Error::NotFound { .. }) => return Ok(Claim::Lost),
            Err(err) => return Err(err.into()),
        }
    }
    Err(Error::Contended(name.to_string()))
}

/// Fails Pending `command`, whose node intents cannot all be written (`why` names the
/// node and the field), so it never runs: a compare-and-swap on the version read, as a
/// claim is. `Claim::Lost` when another writer was faster.
async fn refuse(store: &Store, command: FleetCommand, why: &intents::Error) -> Result<Claim, Error> {
    let mut failed = command;
    failed.status.phase = Some(FleetCommandPhase::Failed);
    failed.status.error = Some(format!("not run: {why}"));
    failed.status.finished_at = Some(Time(store.now()));
    match store.commit(Api::<FleetCommand>::new(store).status_mutation(&failed)?, false).await {
        Ok(outcome) => {
            let refused: FleetCommand = client::decode(outcome.object())?;
            retained::keep(store, &refused).await;
            Ok(Claim::Refused(Box::new(refused)))
        }
        Err(store::Error::Conflict { .. } | store::Error::NotFound { .. }) => Ok(Claim::Lost),
        Err(err) => Err(err.into()),
    }
}

/// Whether `command`'s nodes are this run's to follow, not recovery's to adopt: it is not
/// terminal (an earlier run's were made terminal at start), or this run claimed it.
pub(super) fn this_run(command: &FleetCommand, run: &str) -> bool {
    command.status.phase.is_some_and(|p| !p.is_terminal())
        || command.status.claim.as_ref().is_some_and(|c| c.run == run)
}

/// An unrecorded command written before `command` (a lower `resourceVersion`), if any
/// is cached: `command` is recorded after it.
fn earlier_unrecorded(cached: &[Arc<FleetCommand>], command: &FleetCommand) -> Option<String> {
    let revision =
        |c: &FleetCommand| c.metadata.resource_version.as_deref().and_then(|rv| rv.parse::<u64>().ok());
    let own = revision(command)?;
    cached
        .iter()
        .filter(|c| c.status.phase.is_none() && c.metadata.deletion_timestamp.is_none())
        .filter(|c| revision(c).is_some_and(|rv| rv < own))
        .min_by_key(|c| revision(c))
        .map(|c| c.metadata.name.clone())
}

/// What the controller takes commands with.
struct Context {
    fleet: Arc<Fleet>,
    /// The controller's cache of commands, for the order of recording.
    cache: Cache<FleetCommand>,
}

/// Starts the intake controller as one of `fleet`'s tasks (aborted at its shutdown).
pub(super) fn spawn(fleet: &Arc<Fleet>) {
    // One name at a time: the order of recording follows the watch's order.
    let config = Config { concurrency: 1, ..Config::default() };
    let controller = Controller::new(Api::<FleetCommand>::new(&fleet.store), config)
        .observed_by(fleet.config.controller_metrics.clone());
    let ctx = Arc::new(Context { fleet: fleet.clone(), cache: controller.store() });
    fleet.spawn(controller.run(
        reconcile,
        |target: &Target<FleetCommand>, err: &Error, ctx: &Context| {
            if ctx.fleet.store.is_shut_down() {
                tracing::debug!(command = target.name(), error = %err, "fleet: could not take the command: the daemon is stopping");
                return Action::backoff();
            }
            tracing::warn!(command = target.name(), error = %err, "fleet: could not take the command; backing off");
            Action::backoff()
        },
        ctx,
        std::future::pending::<()>(),
    ));
}

async fn reconcile(target: Target<FleetCommand>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(command) = target.object() else { return Ok(Action::await_change()) };
    let fleet = &ctx.fleet;
    if fleet.is_closing() {
        return Ok(Action::await_change());
    }
    let name = &command.metadata.name;
    match command.status.phase {
        None => {
            if let Some(earlier) = earlier_unrecorded(&ctx.cache.list(), command) {
                tracing::debug!(command = name, earlier, "fleet: recording an earlier command first");
                return Ok(Action::requeue(WAIT_FOR_EARLIER));
            }
            record(fleet, command).await?;
        }
        Some(FleetCommandPhase::Pending) => match claim(&fleet.store, &fleet.run_id, name).await? {
            Claim::Won(claimed) => {
                tracing::info!(command = name, run = fleet.run_id, "fleet command claimed");
                fleet.execute(claimed);
            }
            Claim::Lost => {}
            Claim::Refused(refused) => {
                tracing::warn!(command = name, error = ?refused.status.error, "fleet command not run: its node intents cannot be written")
            }
            Claim::Unrecorded => {
                tracing::warn!(command = name, "a Pending fleet command that was never recorded is not run")
            }
        },
        Some(_) => {}
    }
    Ok(Action::await_change())
}

/// Records a command another path than POST stored (its Pending write then brings it
/// back here to be claimed).
async fn record(fleet: &Fleet, command: &FleetCommand) -> Result<(), RecordError> {
    let name = &command.metadata.name;
    match commands::intake(&fleet.store, command, fleet.default_provider()).await? {
        Recording::Recorded(_) | Recording::Skipped => {}
        Recording::Restored(back) => {
            tracing::info!(command = name, phase = ?back.status.phase, "fleet command id already used: original record kept")
        }
        Recording::Refused(refused) => {
            tracing::warn!(command = name, error = ?refused.status.error, "fleet command not run")
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::StoreConfig;

    fn command(value: serde_json::Value) -> FleetCommand {
        serde_json::from_value(value).unwrap()
    }

    fn provision(id: &str) -> FleetCommand {
        command(json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id},
               "spec": {"provision": {"provider": "process", "count": 1}}}))
    }

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        (dir, store)
    }

    /// Two daemons (or two reconciles) that see one Pending command: exactly one runs it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn of_racing_claimers_exactly_one_wins() {
        let (_dir, store) = store().await;
        for round in 0..20 {
            let name = format!("c{round}");
            commands::record(&store, provision(&name), false).await.unwrap();
            let claimers: Vec<_> = (0..4)
                .map(|i| {
                    let (store, name) = (store.clone(), name.clone());
                    tokio::spawn(async move { claim(&store, &format!("run-{i}"), &name).await })
                })
                .collect();
            let mut winners = Vec::new();
            for (i, claimer) in claimers.into_iter().enumerate() {
                match claimer.await.unwrap().unwrap() {
                    Claim::Won(claimed) => winners.push((i, claimed)),
                    Claim::Lost => {}
                    Claim::Refused(refused) => panic!("round {round}: refused: {refused:?}"),
                    Claim::Unrecorded => panic!("round {round}: a recorded command is recorded"),
                }
            }
            assert_eq!(winners.len(), 1, "round {round}: exactly one claimer wins");
            let (i, won) = &winners[0];
            let stored = Api::<FleetCommand>::new(&store).get_existing(&name).unwrap();
            assert_eq!(&stored, won.command());
            assert_eq!(stored.status.phase, Some(FleetCommandPhase::Running));
            assert_eq!(stored.status.claim.as_ref().map(|c| c.run.clone()), Some(format!("run-{i}")));
            let kept = retained::get(&store, &name).unwrap();
            assert_eq!(kept.status.claim, stored.status.claim, "the retained record carries the claim");
            assert!(this_run(&stored, &format!("run-{i}")));
        }
    }

    #[tokio::test]
    async fn only_a_recorded_pending_command_is_claimed() {
        let (_dir, store) = store().await;
        let commands = Api::<FleetCommand>::new(&store);
        // Stored by apply: not recorded yet.
        commands.create(&provision("applied")).await.unwrap();
        assert!(matches!(claim(&store, "run-1", "applied").await.unwrap(), Claim::Lost));
        // Pending written by hand, never recorded: never run.
        commands.patch_status("applied", |s| s.phase = Some(FleetCommandPhase::Pending)).await.unwrap();
        assert!(matches!(claim(&store, "run-1", "applied").await.unwrap(), Claim::Unrecorded));
        // Failed at start (an earlier run's Pending): not claimed.
        commands::record(&store, provision("earlier"), false).await.unwrap();
        commands.patch_status("earlier", |s| s.phase = Some(FleetCommandPhase::Failed)).await.unwrap();
        assert!(matches!(claim(&store, "run-2", "earlier").await.unwrap(), Claim::Lost));
        let earlier = commands.get_existing("earlier").unwrap();
        assert!(!this_run(&earlier, "run-2"), "an earlier run's terminal command");
        assert!(matches!(claim(&store, "run-2", "gone").await.unwrap(), Claim::Lost));
    }

    #[test]
    fn an_unrecorded_command_waits_for_those_written_before_it() {
        let at = |name: &str, rv: u64, phase: Option<FleetCommandPhase>| {
            let mut c = provision(name);
            c.metadata.resource_version = Some(rv.to_string());
            c.status.phase = phase;
            Arc::new(c)
        };
        let provision = at("provision-b", 10, None);
        let kill = at("kill-a", 11, None);
        let cached = vec![kill.clone(), provision.clone(), at("old", 3, Some(FleetCommandPhase::Succeeded))];
        assert_eq!(earlier_unrecorded(&cached, &kill).as_deref(), Some("provision-b"));
        assert_eq!(earlier_unrecorded(&cached, &provision), None);
        let recorded = vec![kill.clone(), at("provision-b", 12, Some(FleetCommandPhase::Pending))];
        assert_eq!(earlier_unrecorded(&recorded, &kill), None, "recorded: no longer waited for");
        let mut deleting = (*provision).clone();
        deleting.metadata.deletion_timestamp = Some(Time(chrono::DateTime::UNIX_EPOCH));
        assert_eq!(earlier_unrecorded(&[kill.clone(), Arc::new(deleting)], &kill), None);
    }
}
