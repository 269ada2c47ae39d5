//! The submit layer: the only producer of Jobs. It builds an operation's DAG from the
//! agents' live state ([`shapes`]), and writes the intent (`spec.wanted`) and the Job
//! in ONE store transaction, so intent and its DAG are atomic and rapid toggles are
//! last-writer-wins. A multi-agent operation is one Job with a subgraph per agent.
//!
//! Handing the Job to the scheduler is the caller's next step (the daemon wires it).

pub mod shapes;

use std::collections::BTreeSet;

use hive_api::agent::Agent;
use hive_api::job::{Job, JobSource, JobSpec, JobTemplate, NodeAction, Scheduling};

use crate::client::{self, Api};
use crate::store::{self, Outcome, Store};
use shapes::AgentState;

/// How often a submit is retried when an agent changed between read and commit.
const RETRIES: usize = 8;

/// What the submit layer needs to know that the store does not hold: whether an agent
/// runs right now (the runtime's observed view).
pub trait LiveState: Send + Sync {
    /// Whether `agent` is running.
    fn is_running(&self, agent: &str) -> bool;

    /// Whether the agent is stale in the coordinator document's sense: its applied-rev
    /// marker (the commit and hive base its current generation was built from) differs
    /// from what the meta lock pins and the daemon runs, or it has none. A start of a
    /// stopped stale agent rebuilds first, as the boot sweep's deferred agents need. A
    /// branch or tag in `spec.config.rev` is never compared with a commit: a new commit
    /// on the branch moves nothing until a rebuild or meta-update bumps the lock.
    fn is_stale<'a>(&'a self, _agent: &'a str) -> futures_util::future::BoxFuture<'a, bool> {
        Box::pin(async { false })
    }

    /// How many times the builds (Prebuild, Create) of a Job built from a template retry
    /// (`hive serve --build-retries`); a Job that names its own `spec.retry` keeps it.
    fn build_retries(&self) -> u32 {
        0
    }
}

/// One operation to submit.
#[derive(Clone, Debug)]
pub struct Request {
    /// The operation, e.g. `Stop`.
    pub template: JobTemplate,
    /// The agents it acts on, in order (duplicates are ignored).
    pub agents: Vec<String>,
    /// Which surface asked.
    pub source: JobSource,
    /// Why, for the Job's `spec.reason`.
    pub reason: Option<String>,
    /// The Job's name; `None` names it `<template>-<random>`.
    pub name: Option<String>,
    /// Its priority, deadline …, as the Job's spec has them.
    pub scheduling: Scheduling,
}

/// Why a submit was refused. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request names no agent.
    #[error("no agents given: name at least one agent")]
    NoAgents,
    /// A named agent does not exist.
    #[error("agents.hive.dev \"{0}\" not found")]
    UnknownAgent(String),
    /// The template is not built from agent state (e.g. `MetaUpdate`).
    #[error("template {0:?} is not an agent operation; submit it as a custom DAG")]
    NotAgentTemplate(JobTemplate),
    /// A write was refused (the built Job or the new agent is invalid, or a stored
    /// agent does not decode); nothing was written.
    #[error(transparent)]
    Client(#[from] client::Error),
    /// The agents kept changing under the submit.
    #[error("the agents changed during the submit {RETRIES} times in a row; try again")]
    Contended,
    /// The store refused or failed the write.
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// Result of the submit layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Builds and stores the Job for `request`, with the intent change of every agent it
/// names, atomically. Returns the stored Job.
pub async fn submit(store: &Store, live: &dyn LiveState, request: &Request) -> Result<Job> {
    if !shapes::is_agent_template(request.template) {
        return Err(Error::NotAgentTemplate(request.template));
    }
    let mut seen = BTreeSet::new();
    let names: Vec<&String> = request.agents.iter().filter(|a| seen.insert(a.as_str())).collect();
    if names.is_empty() {
        return Err(Error::NoAgents);
    }
    let (agents, jobs) = (Api::<Agent>::new(store), Api::<Job>::new(store));
    for _ in 0..RETRIES {
        let mut states = Vec::with_capacity(names.len());
        let mut mutations = Vec::new();
        for name in &names {
            let agent = agents.get(name)?.ok_or_else(|| Error::UnknownAgent(name.to_string()))?;
            states.push(agent_state(&agent, live).await);
            if let Some(wanted) = shapes::intent(request.template) {
                if agent.spec.wanted != wanted {
                    let mut changed = agent.clone();
                    changed.spec.wanted = wanted;
                    mutations.push(agents.replace_mutation(&changed, &agent)?);
                }
            }
        }
        let mut job = job_object(request, &states);
        shapes::retry_builds(&mut job.spec, live.build_retries());
        mutations.push(jobs.create_mutation(&job)?);
        match store.commit_all(mutations, false).await {
            Ok(outcomes) => return stored_job(outcomes),
            // An agent changed between the read and the commit: read again.
            Err(store::Error::Conflict { .. }) => continue,
            Err(err) => return Err(err.into()),
        }
    }
    Err(Error::Contended)
}

/// What the shapes need to know of one agent: its stored spec and status, and what the
/// runtime observes of it now.
async fn agent_state(agent: &Agent, live: &dyn LiveState) -> AgentState {
    let name = &agent.metadata.name;
    AgentState {
        name: name.clone(),
        running: live.is_running(name),
        stale: live.is_stale(name).await,
        graceful: agent.spec.runtime.graceful_stop_seconds.is_some_and(|s| s > 0),
        on: agent.status.node.clone(),
    }
}

/// Expands a stored template Job (one that names `spec.agents` and no nodes), as
/// [`submit`] builds one: the nodes from the agents' live state, and the intent change
/// of every agent it names. Returns the expanded Job and the writes that store it — the
/// intent changes, then the Job's spec, conditional on the `resourceVersion` `job` was
/// read at — for the caller to commit in ONE transaction with what must land with
/// them (the intake's claim). Nothing is written here.
pub async fn expand(store: &Store, live: &dyn LiveState, job: &Job) -> Result<(Job, Vec<store::Mutation>)> {
    let template = job.spec.template;
    if !shapes::is_agent_template(template) {
        return Err(Error::NotAgentTemplate(template));
    }
    let mut seen = BTreeSet::new();
    let names: Vec<&String> = job.spec.agents.iter().filter(|a| seen.insert(a.as_str())).collect();
    if names.is_empty() {
        return Err(Error::NoAgents);
    }
    let agents = Api::<Agent>::new(store);
    let mut states = Vec::with_capacity(names.len());
    let mut mutations = Vec::new();
    for name in names {
        let agent = agents.get(name)?.ok_or_else(|| Error::UnknownAgent(name.to_string()))?;
        states.push(agent_state(&agent, live).await);
        if let Some(wanted) = shapes::intent(template) {
            if agent.spec.wanted != wanted {
                let mut changed = agent.clone();
                changed.spec.wanted = wanted;
                mutations.push(agents.replace_mutation(&changed, &agent)?);
            }
        }
    }
    let mut expanded = job.clone();
    expanded.spec.agents = states.iter().map(|s| s.name.clone()).collect();
    expanded.spec.nodes = shapes::build(template, &states);
    shapes::retry_builds(&mut expanded.spec, live.build_retries());
    mutations.push(Api::<Job>::new(store).replace_mutation(&expanded, job)?);
    Ok((expanded, mutations))
}

/// The intent writes of a custom DAG (one given with its nodes, not by [`submit`], which
/// wrote the intent with the Job and marked it `hive.dev/intent-written`): for each
/// agent one of its SetWanted nodes names, `spec.wanted` as the last of them says, where
/// it differs.
/// The caller commits them in ONE transaction with the Job's claim, as [`submit`] writes
/// a template's intent with its Job: the intent is written when the Job is taken, never
/// when its SetWanted finally runs (which would overwrite a later client's write).
pub fn dag_intents(store: &Store, job: &Job) -> Result<Vec<store::Mutation>> {
    if job.metadata.annotations.contains_key(hive_api::names::INTENT_WRITTEN) {
        return Ok(Vec::new()); // written with the Job by `submit`
    }
    let mut wanted: Vec<(&str, hive_api::agent::Wanted)> = Vec::new();
    for node in &job.spec.nodes {
        if node.kind != hive_api::job::JobNodeKind::SetWanted {
            continue;
        }
        let (Some(agent), Ok(NodeAction::SetWanted { wanted: value })) =
            (node.agent.as_deref(), node.action())
        else {
            continue; // the scheduler refuses or the node fails it, naming why
        };
        match wanted.iter_mut().find(|(a, _)| *a == agent) {
            Some(entry) => entry.1 = value,
            None => wanted.push((agent, value)),
        }
    }
    let agents = Api::<Agent>::new(store);
    let mut mutations = Vec::new();
    for (name, value) in wanted {
        let agent = agents.get(name)?.ok_or_else(|| Error::UnknownAgent(name.to_string()))?;
        if agent.spec.wanted != value {
            let mut changed = agent.clone();
            changed.spec.wanted = value;
            mutations.push(agents.replace_mutation(&changed, &agent)?);
        }
    }
    Ok(mutations)
}

/// The Job a transaction wrote last.
fn stored_job(outcomes: Vec<Outcome>) -> Result<Job> {
    let job = outcomes.into_iter().last().map(Outcome::into_object).expect("the Job was written");
    Ok(client::decode(&job)?)
}

/// A DAG the caller shaped itself (with [`shapes`]): an approval deploy, a
/// meta-update, the boot sweep.
#[derive(Clone, Debug, Default)]
pub struct DagRequest {
    /// The operation.
    pub template: JobTemplate,
    /// The nodes.
    pub nodes: Vec<hive_api::job::JobNode>,
    /// Which surface asked.
    pub source: JobSource,
    /// Why, for `spec.reason`.
    pub reason: Option<String>,
    /// The Job's name; `None` names it `<template>-<random>`.
    pub name: Option<String>,
    /// The Approval the Job resolves.
    pub approval: Option<String>,
    /// Meta inputs it bumps.
    pub inputs: Vec<String>,
    /// The agents it acts on (for display and `in flight` checks).
    pub agents: Vec<String>,
    /// Its priority, deadline …
    pub scheduling: Scheduling,
}

/// Validates and stores a shaped DAG (a cycle or a bad node is refused with nothing
/// written). Every agent a node names must exist.
pub async fn submit_dag(store: &Store, request: &DagRequest) -> Result<Job> {
    let agents = Api::<Agent>::new(store);
    for node in &request.nodes {
        if let Some(agent) = &node.agent {
            if agents.get(agent)?.is_none() {
                return Err(Error::UnknownAgent(agent.clone()));
            }
        }
    }
    let spec = JobSpec {
        template: request.template,
        reason: request.reason.clone(),
        source: request.source,
        approval: request.approval.clone(),
        inputs: request.inputs.clone(),
        agents: request.agents.clone(),
        nodes: request.nodes.clone(),
        ..Default::default()
    };
    let mut spec = spec;
    spec.set_scheduling(&request.scheduling);
    let job = named_job(request.template, request.name.as_deref(), spec);
    Ok(Api::<Job>::new(store).create(&job).await?)
}

/// Creates a new agent and its Spawn Job in ONE transaction (an approved `Spawn`
/// approval), so the Agent controller never sees the agent without the Job that spawns
/// it and submits a second one. An existing agent of that name is an error.
pub async fn spawn_new(store: &Store, agent: &Agent, request: &Request) -> Result<Job> {
    let name = agent.metadata.name.clone();
    let state = AgentState {
        name: name.clone(),
        running: false,
        stale: false,
        graceful: agent.spec.runtime.graceful_stop_seconds.is_some_and(|s| s > 0),
        on: None,
    };
    let request = Request { template: JobTemplate::Spawn, agents: vec![name], ..request.clone() };
    let job = job_object(&request, std::slice::from_ref(&state));
    let mutations =
        vec![Api::<Agent>::new(store).create_mutation(agent)?, Api::<Job>::new(store).create_mutation(&job)?];
    stored_job(store.commit_all(mutations, false).await?)
}

fn job_object(request: &Request, states: &[AgentState]) -> Job {
    let spec = JobSpec {
        template: request.template,
        reason: request.reason.clone(),
        source: request.source,
        agents: states.iter().map(|s| s.name.clone()).collect(),
        nodes: shapes::build(request.template, states),
        ..Default::default()
    };
    let mut spec = spec;
    spec.set_scheduling(&request.scheduling);
    let mut job = named_job(request.template, request.name.as_deref(), spec);
    job.metadata.annotations.insert(hive_api::names::INTENT_WRITTEN.into(), "true".into());
    job
}

/// A Job of `spec` called `name`, or `<template>-<random>`.
fn named_job(template: JobTemplate, name: Option<&str>, spec: JobSpec) -> Job {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let name = match name {
        Some(name) => name.to_string(),
        None => format!("{}-{}", template.as_str().to_lowercase(), &suffix[..8]),
    };
    Job::new(name, spec)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use serde_json::json;

    use super::*;
    use crate::store::{Mutation, StoreConfig};

    struct Running(HashSet<&'static str>);

    impl LiveState for Running {
        fn is_running(&self, agent: &str) -> bool {
            self.0.contains(agent)
        }
    }

    /// Stopped, with a marker that differs from the lock.
    struct StaleStopped;

    impl LiveState for StaleStopped {
        fn is_running(&self, _agent: &str) -> bool {
            false
        }

        fn is_stale<'a>(&'a self, _agent: &'a str) -> futures_util::future::BoxFuture<'a, bool> {
            Box::pin(async { true })
        }
    }

    fn agent(name: &str) -> serde_json::Value {
        json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
               "spec": {"wanted": "Up", "config": {"repo": "r", "rev": "main"},
                        "runtime": {"type": "process", "gracefulStopSeconds": 30, "process": {"command": ["x"]}}},
               "status": {"appliedRev": "0123456789abcdef0123456789abcdef01234567"}})
    }

    async fn store_with(names: &[&str]) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        for name in names {
            store.commit(Mutation::Create { kind: "agents", object: agent(name) }, false).await.unwrap();
        }
        (dir, store)
    }

    #[tokio::test]
    async fn a_multi_agent_stop_is_one_job_written_with_its_intent() {
        let (_dir, store) = store_with(&["a", "b"]).await;
        let before = store.revision();
        let live = Running(["a"].into());
        let request = Request {
            template: JobTemplate::Stop,
            agents: vec!["a".into(), "b".into(), "a".into()],
            source: JobSource::Cli,
            reason: None,
            name: None,
            scheduling: Default::default(),
        };
        let job = submit(&store, &live, &request).await.unwrap();
        assert!(job.metadata.name.starts_with("stop-"));
        let ids: Vec<&str> = job.spec.nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(
            ids,
            ["a/set-wanted", "a/signal", "a/drain", "a/reconcile", "b/set-wanted", "b/reconcile"]
        );
        for name in ["a", "b"] {
            let stored = store.get("agents", name).unwrap();
            assert_eq!(stored.value()["spec"]["wanted"], "Offline");
            assert_eq!(stored.value()["metadata"]["generation"], 2);
        }
        // One transaction: two intent writes and the Job, consecutive revisions.
        assert_eq!(store.revision(), before + 3);
        assert_eq!(store.list("jobs").1.len(), 1);
    }

    #[tokio::test]
    async fn an_unchanged_intent_is_not_rewritten_and_a_stale_start_rebuilds() {
        let (_dir, store) = store_with(&["a"]).await;
        let request = Request {
            template: JobTemplate::Start,
            agents: vec!["a".into()],
            source: JobSource::Api,
            reason: None,
            name: None,
            scheduling: Default::default(),
        };
        // A branch name in the spec beside a commit in the status is not stale: only the
        // marker against the lock says so.
        let fresh = submit(&store, &Running(HashSet::new()), &request).await.unwrap();
        let kinds: Vec<&str> = fresh.spec.nodes.iter().map(|n| n.kind.as_str()).collect();
        assert_eq!(kinds, ["SetWanted", "Reconcile"]);
        let before = store.revision();
        let job = submit(&store, &StaleStopped, &request).await.unwrap();
        assert_eq!(store.revision(), before + 1, "wanted was already Up: only the Job is written");
        let kinds: Vec<&str> = job.spec.nodes.iter().map(|n| n.kind.as_str()).collect();
        assert_eq!(kinds, ["SetWanted", "Prebuild", "StopForUpdate", "Swap", "Reconcile"]);
    }

    #[tokio::test]
    async fn refusals_write_nothing() {
        let (_dir, store) = store_with(&["a"]).await;
        let before = store.revision();
        let live = Running(HashSet::new());
        let unknown = Request {
            template: JobTemplate::Stop,
            agents: vec!["a".into(), "ghost".into()],
            source: JobSource::Api,
            reason: None,
            name: None,
            scheduling: Default::default(),
        };
        assert!(matches!(submit(&store, &live, &unknown).await, Err(Error::UnknownAgent(n)) if n == "ghost"));
        let empty = Request { agents: vec![], ..unknown.clone() };
        assert!(matches!(submit(&store, &live, &empty).await, Err(Error::NoAgents)));
        let meta = Request { template: JobTemplate::MetaUpdate, ..unknown };
        assert!(matches!(submit(&store, &live, &meta).await, Err(Error::NotAgentTemplate(_))));
        assert_eq!(store.revision(), before);
        assert_eq!(store.get("agents", "a").unwrap().value()["spec"]["wanted"], "Up");
    }
}
