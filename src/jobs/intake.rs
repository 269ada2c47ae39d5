//! The one intake for Jobs: every Job in the store reaches the scheduler exactly once,
//! whatever wrote it — POST, `hive apply`, `kubectl apply` (client- or server-side),
//! `kubectl create`, the submit layer inside the daemon.
//!
//! Taking a Job is three steps. [`claim`] re-reads it and, if no one has claimed it and
//! it is not terminal, writes `status.claim` naming this daemon run with the
//! `resourceVersion` it read as precondition — a compare-and-swap: of any number of
//! racing claimers (the POST handler and the controller of one daemon, or two daemons
//! sharing a store) exactly one wins; the others see a conflict, re-read, and find it
//! claimed. A template Job (`spec.template` + `spec.agents`, no nodes) is expanded by the
//! submit layer in the same transaction: its nodes built from the agents' live state and
//! their intent (`spec.wanted`) written with the claim. Only the winner then hands the
//! Job to its scheduler ([`take`]). A Job that cannot run — its agents do not exist, its
//! template cannot be expanded, the scheduler refuses it — ends `Failed` with the reason
//! in `status.message`, never left waiting.
//!
//! The controller ([`spawn`]) watches Jobs and takes each one still waiting; in-daemon
//! submits and the POST handler take the Job they just stored themselves, through the
//! same [`take`], so whichever sees it first schedules it and the other finds it claimed.
//! A Job claimed by an earlier run and left unfinished is marked `Interrupted` at boot
//! (`mirror::mark_interrupted`), never run again; one written while no daemon ran
//! is unclaimed, and the controller's first list takes it.

use std::sync::Arc;

use hive_api::job::{Job, JobClaim, JobPhase};
use hive_api::Time;
use hive_controllers::{Action, Config, Controller, Target};

use crate::client::{self, Api};
use crate::scheduler::{self, SchedulerHandle};
use crate::store::{self, Store};
use crate::submit::{self, LiveState};

/// How often a claim is re-read and retried after losing a race to another writer of
/// the Job (or of an agent a template Job's intent changes).
const RETRIES: usize = 8;

/// How often a Job whose name an earlier, unsettled Job still holds looks again.
const WAIT_FOR_NAME: std::time::Duration = std::time::Duration::from_millis(500);

/// Why a Job could not run. It is marked `Failed` with this as its message.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The submit layer could not expand the template Job (an agent it names does not
    /// exist, it names none, the template is not built from agents).
    #[error(transparent)]
    Expand(submit::Error),
    /// The scheduler refused the claimed Job (an invalid DAG, a name it already holds).
    #[error("the scheduler refused it: {0}")]
    Schedule(scheduler::Error),
}

/// What taking a Job did.
#[derive(Debug)]
pub enum Taken {
    /// This run claimed it, and its scheduler has it.
    Scheduled(Job),
    /// Nothing to do: another claimer took it, or it is already terminal (cancelled
    /// before anyone claimed it, say).
    Elsewhere(Job),
    /// Not claimed yet: an earlier Job of the same name (its object deleted since) is
    /// still queued or running in this scheduler. It is taken once that one settles.
    Waiting(Job),
    /// It cannot run: it is now `Failed`, with why.
    Failed {
        /// The Job as marked.
        job: Job,
        /// Why.
        why: Refusal,
    },
}

/// Why taking a Job failed for now; retried with backoff by the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Job does not exist (any more).
    #[error("jobs.hive.dev {0:?} not found")]
    Gone(String),
    /// A read or write failed.
    #[error(transparent)]
    Client(#[from] client::Error),
    /// The store failed the claim's transaction.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// The scheduler could not take the claimed Job (it has shut down).
    #[error(transparent)]
    Scheduler(scheduler::Error),
    /// Every attempt lost a race with another writer.
    #[error("jobs.hive.dev {0:?} kept changing: {RETRIES} claims in a row lost a race")]
    Contended(String),
}

/// The outcome of one [`claim`].
#[derive(Debug)]
pub enum Claim {
    /// This run claimed it (and wrote a template Job's nodes and intent with the claim).
    Won(Job),
    /// Claimed by someone else, or terminal.
    Lost(Job),
    /// Its template could not be expanded: it is now `Failed`.
    Refused(Job, submit::Error),
}

/// True while a Job waits for an intake: nobody claimed it and it is not terminal.
pub fn waiting(job: &Job) -> bool {
    job.status.waiting()
}

/// Claims Job `name` for daemon run `run`, exactly once across every claimer (see the
/// module documentation). A template Job is expanded from its stored spec with `live`.
pub async fn claim(store: &Store, live: &dyn LiveState, run: &str, name: &str) -> Result<Claim, Error> {
    let jobs = Api::<Job>::new(store);
    for _ in 0..RETRIES {
        let job = jobs.get(name)?.ok_or_else(|| Error::Gone(name.to_string()))?;
        if !waiting(&job) {
            return Ok(Claim::Lost(job));
        }
        let claim = JobClaim { run: run.to_string(), at: Time(store.now()) };
        let (mut claimed, mut mutations) = if job.spec.nodes.is_empty() {
            match submit::expand(store, live, &job).await {
                Ok(expanded) => expanded,
                // The store failed or was busy: try again later.
                Err(submit::Error::Store(err) | submit::Error::Client(client::Error::Store(err))) => {
                    return Err(err.into())
                }
                Err(submit::Error::Contended | submit::Error::Client(client::Error::Contended { .. })) => {
                    return Err(Error::Contended(name.to_string()))
                }
                // Anything else is for good (an agent it names does not exist, the
                // expanded Job would be invalid, a stored agent does not decode).
                Err(refused) => {
                    let mut failed = job.clone();
                    failed.status.claim = Some(claim);
                    mark_failed(&mut failed.status, store, refused.to_string());
                    match store.commit(jobs.status_mutation(&failed)?, false).await {
                        Ok(outcome) => return Ok(Claim::Refused(client::decode(outcome.object())?, refused)),
                        Err(store::Error::Conflict { .. }) => continue,
                        Err(err) => return Err(err.into()),
                    }
                }
            }
        } else {
            // A custom DAG: the intent of its SetWanted nodes is written with the claim.
            match submit::dag_intents(store, &job) {
                Ok(intents) => (job.clone(), intents),
                Err(submit::Error::Store(err) | submit::Error::Client(client::Error::Store(err))) => {
                    return Err(err.into())
                }
                // An agent it names does not exist (its node fails, naming it).
                Err(_) => (job.clone(), Vec::new()),
            }
        };
        claimed.status.claim = Some(claim);
        if job.spec.nodes.is_empty() {
            // The spec write before it carries the precondition; this one follows it in
            // the same transaction, on the revision that write made.
            claimed.metadata.resource_version = None;
        }
        mutations.push(jobs.status_mutation(&claimed)?);
        match store.commit_all(mutations, false).await {
            Ok(outcomes) => {
                let stored =
                    outcomes.last().map(store::Outcome::object).ok_or(Error::Gone(name.to_string()))?;
                return Ok(Claim::Won(client::decode(stored)?));
            }
            // The Job (or an agent whose intent it changes) was written since the read.
            Err(store::Error::Conflict { .. }) => continue,
            Err(err) => return Err(err.into()),
        }
    }
    Err(Error::Contended(name.to_string()))
}

fn mark_failed(status: &mut hive_api::job::JobStatus, store: &Store, message: String) {
    status.phase = Some(JobPhase::Failed);
    status.message = Some(message);
    status.finished_at = Some(Time(store.now()));
}

/// Claims Job `name` and, if this run won, hands it to `scheduler`; a Job that cannot
/// run is marked `Failed` with why. The one way a Job reaches a scheduler.
pub async fn take(
    store: &Store,
    live: &dyn LiveState,
    scheduler: &SchedulerHandle,
    run: &str,
    name: &str,
) -> Result<Taken, Error> {
    if scheduler.holds_unsettled(name).await.map_err(Error::Scheduler)? {
        let job = Api::<Job>::new(store).get(name)?.ok_or_else(|| Error::Gone(name.to_string()))?;
        return Ok(if waiting(&job) { Taken::Waiting(job) } else { Taken::Elsewhere(job) });
    }
    let job = match claim(store, live, run, name).await? {
        Claim::Won(job) => job,
        Claim::Lost(job) => return Ok(Taken::Elsewhere(job)),
        Claim::Refused(job, why) => {
            scheduler.settled_elsewhere(vec![settled(&job)]);
            return Ok(Taken::Failed { job, why: Refusal::Expand(why) });
        }
    };
    match scheduler.submit(name, job.spec.clone()).await {
        Ok(()) => Ok(Taken::Scheduled(job)),
        Err(err @ (scheduler::Error::Invalid { .. } | scheduler::Error::AlreadyExists { .. })) => {
            let message = Refusal::Schedule(err.clone()).to_string();
            let marked = Api::<Job>::new(store)
                .patch_status(name, |status| mark_failed(status, store, message.clone()))
                .await?
                .into_inner();
            scheduler.settled_elsewhere(vec![settled(&marked)]);
            Ok(Taken::Failed { job: marked, why: Refusal::Schedule(err) })
        }
        Err(err) => Err(Error::Scheduler(err)),
    }
}

/// What the scheduler's history counts of a Job that settled without it.
pub fn settled(job: &Job) -> scheduler::SettledJob {
    scheduler::SettledJob { name: job.metadata.name.clone(), template: job.spec.template }
}

/// Cancels Job `name` if it is still waiting for an intake: a status write conditional
/// on the version read, so it either lands before any claim (and the Job never runs) or
/// loses to it (`Ok(None)`: the scheduler has it now, cancel it there). A Job that is
/// not waiting is `Ok(None)` too.
pub async fn cancel_unclaimed(store: &Store, name: &str) -> Result<Option<Job>, Error> {
    let jobs = Api::<Job>::new(store);
    let job = jobs.get(name)?.ok_or_else(|| Error::Gone(name.to_string()))?;
    if !waiting(&job) {
        return Ok(None);
    }
    let mut cancelled = job;
    cancelled.status.phase = Some(JobPhase::Cancelled);
    cancelled.status.message = Some("cancelled before a scheduler took it".into());
    cancelled.status.finished_at = Some(Time(store.now()));
    match store.commit(jobs.status_mutation(&cancelled)?, false).await {
        Ok(outcome) => Ok(Some(client::decode(outcome.object())?)),
        Err(store::Error::Conflict { .. }) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// What the controller takes Jobs with.
struct Intake {
    store: Store,
    live: Arc<dyn LiveState>,
    scheduler: SchedulerHandle,
    run: String,
}

/// Runs the controller until the process ends: every Job written to the store that is
/// still waiting is taken, one at a time in the order the watch delivers them (so Jobs
/// applied one after another queue in that order).
pub fn spawn(
    store: Store,
    live: Arc<dyn LiveState>,
    scheduler: SchedulerHandle,
    run: String,
    metrics: Arc<crate::metrics::ControllerMetrics>,
) {
    let controller = Controller::new(Api::<Job>::new(&store), Config { concurrency: 1, ..Config::default() })
        .observed_by(metrics);
    let ctx = Arc::new(Intake { store, live, scheduler, run });
    tokio::spawn(controller.run(
        reconcile,
        |target: &Target<Job>, err: &Error, ctx: &Intake| {
            if ctx.store.is_shut_down() {
                tracing::debug!(job = target.name(), error = %err, "could not take the Job: the daemon is stopping");
                return Action::backoff();
            }
            tracing::warn!(job = target.name(), error = %err, "could not take the Job; backing off");
            Action::backoff()
        },
        ctx,
        std::future::pending::<()>(),
    ));
}

async fn reconcile(target: Target<Job>, ctx: Arc<Intake>) -> Result<Action, Error> {
    let Some(job) = target.object() else { return Ok(Action::await_change()) };
    if !waiting(job) {
        return Ok(Action::await_change());
    }
    let name = &job.metadata.name;
    match take(&ctx.store, ctx.live.as_ref(), &ctx.scheduler, &ctx.run, name).await {
        Ok(Taken::Scheduled(_)) => {
            tracing::info!(job = name, run = ctx.run, "took a Job written to the store")
        }
        Ok(Taken::Elsewhere(_)) => {}
        Ok(Taken::Waiting(_)) => {
            tracing::info!(job = name, "an earlier Job of this name still runs; taking this one after it");
            return Ok(Action::requeue(WAIT_FOR_NAME));
        }
        Ok(Taken::Failed { why, .. }) => {
            tracing::warn!(job = name, reason = %why, "a Job cannot run: marked Failed")
        }
        Err(Error::Gone(_)) => {}
        Err(err) => return Err(err),
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::{Mutation, StoreConfig};

    struct NothingRuns;

    impl LiveState for NothingRuns {
        fn is_running(&self, _: &str) -> bool {
            false
        }
    }

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let agent = json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "a"},
               "spec": {"wanted": "Offline", "config": {"repo": "r"}, "runtime": {"type": "process", "process": {"command": ["x"]}}}});
        store.commit(Mutation::Create { kind: "agents", object: agent }, false).await.unwrap();
        (dir, store)
    }

    async fn put_job(store: &Store, name: &str, spec: serde_json::Value) {
        let job =
            json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec});
        store.commit(Mutation::Create { kind: "jobs", object: job }, false).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn of_racing_claimers_exactly_one_wins() {
        let (_dir, store) = store().await;
        for round in 0..20 {
            let name = format!("j{round}");
            let spec = if round % 2 == 0 {
                json!({"template": "Start", "agents": ["a"]})
            } else {
                json!({"template": "Reconcile", "nodes": [{"id": "r", "kind": "Reconcile", "agent": "a"}]})
            };
            put_job(&store, &name, spec).await;
            let claimers: Vec<_> = (0..4)
                .map(|i| {
                    let (store, name) = (store.clone(), name.clone());
                    tokio::spawn(async move { claim(&store, &NothingRuns, &format!("run-{i}"), &name).await })
                })
                .collect();
            let mut winners = Vec::new();
            for (i, claimer) in claimers.into_iter().enumerate() {
                match claimer.await.unwrap().unwrap() {
                    Claim::Won(job) => winners.push((i, job)),
                    Claim::Lost(job) => assert!(job.status.claim.is_some(), "lost to a claim"),
                    Claim::Refused(_, why) => panic!("refused: {why}"),
                }
            }
            assert_eq!(winners.len(), 1, "round {round}: exactly one claimer wins");
            let (i, won) = &winners[0];
            let stored = Api::<Job>::new(&store).get_existing(&name).unwrap();
            assert_eq!(stored.status.claim.as_ref().map(|c| c.run.clone()), Some(format!("run-{i}")));
            assert_eq!(&stored, won);
            assert!(!stored.spec.nodes.is_empty());
        }
    }

    #[tokio::test]
    async fn a_template_job_is_expanded_with_its_intent_in_the_claim() {
        let (_dir, store) = store().await;
        put_job(&store, "start-a", json!({"template": "Start", "agents": ["a", "a"]})).await;
        let before = store.revision();
        let Claim::Won(job) = claim(&store, &NothingRuns, "run-1", "start-a").await.unwrap() else {
            panic!("not won")
        };
        let ids: Vec<&str> = job.spec.nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["a/set-wanted", "a/reconcile"]);
        assert_eq!(job.spec.agents, ["a"]);
        assert_eq!(job.status.claim.as_ref().unwrap().run, "run-1");
        let agent = Api::<hive_api::Agent>::new(&store).get_existing("a").unwrap();
        assert_eq!(agent.spec.wanted, hive_api::agent::Wanted::Up);
        // One transaction: the intent, the spec, the claim.
        assert_eq!(store.revision(), before + 3);
        assert!(matches!(claim(&store, &NothingRuns, "run-2", "start-a").await.unwrap(), Claim::Lost(_)));
    }

    /// Issue 26, item 2: the intent is written once, with the Job — by the submit layer
    /// for its own Jobs, by the claim for a DAG given with its nodes — and a client's
    /// write between the submit and the claim stands.
    #[tokio::test]
    async fn the_claim_writes_a_custom_dags_intent_but_never_over_a_later_client_write() {
        let (_dir, store) = store().await;
        let agents = Api::<hive_api::Agent>::new(&store);
        let wanted = || agents.get_existing("a").unwrap().spec.wanted;
        put_job(
            &store,
            "custom",
            json!({"template": "Reconcile",
                   "nodes": [{"id": "w", "kind": "SetWanted", "agent": "a", "params": {"wanted": "Up"}}]}),
        )
        .await;
        assert_eq!(wanted(), hive_api::agent::Wanted::Offline);
        assert!(matches!(claim(&store, &NothingRuns, "run-1", "custom").await.unwrap(), Claim::Won(_)));
        assert_eq!(wanted(), hive_api::agent::Wanted::Up, "the claim wrote the DAG's intent");

        let request = submit::Request {
            template: hive_api::job::JobTemplate::Stop,
            agents: vec!["a".into()],
            source: hive_api::job::JobSource::Cli,
            reason: None,
            name: Some("stop-a".into()),
            scheduling: Default::default(),
        };
        submit::submit(&store, &NothingRuns, &request).await.unwrap();
        assert_eq!(wanted(), hive_api::agent::Wanted::Offline, "the submit wrote the Stop's intent");
        agents.patch("a", |a| a.spec.wanted = hive_api::agent::Wanted::Up).await.unwrap();
        assert!(matches!(claim(&store, &NothingRuns, "run-1", "stop-a").await.unwrap(), Claim::Won(_)));
        assert_eq!(wanted(), hive_api::agent::Wanted::Up, "the claim wrote over the client's later Up");
    }

    #[tokio::test]
    async fn a_job_for_a_missing_agent_fails_with_a_reason() {
        let (_dir, store) = store().await;
        put_job(&store, "stop-ghost", json!({"template": "Stop", "agents": ["ghost"]})).await;
        let Claim::Refused(job, _) = claim(&store, &NothingRuns, "run-1", "stop-ghost").await.unwrap() else {
            panic!("not refused")
        };
        assert_eq!(job.status.phase, Some(JobPhase::Failed));
        assert!(job.status.message.as_deref().unwrap_or("").contains("\"ghost\" not found"), "{job:?}");
        assert!(job.spec.nodes.is_empty());
    }

    #[tokio::test]
    async fn a_cancel_before_the_claim_wins_over_it() {
        let (_dir, store) = store().await;
        put_job(&store, "start-a", json!({"template": "Start", "agents": ["a"]})).await;
        let cancelled = cancel_unclaimed(&store, "start-a").await.unwrap().expect("cancelled");
        assert_eq!(cancelled.status.phase, Some(JobPhase::Cancelled));
        assert!(matches!(claim(&store, &NothingRuns, "run-1", "start-a").await.unwrap(), Claim::Lost(_)));
        let agent = Api::<hive_api::Agent>::new(&store).get_existing("a").unwrap();
        assert_eq!(agent.spec.wanted, hive_api::agent::Wanted::Offline, "a cancelled Job writes no intent");
        assert!(cancel_unclaimed(&store, "start-a").await.unwrap().is_none());
    }
}
