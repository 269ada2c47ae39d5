//! The runtime executor: one function per [`NodeAction`], run against a real agent
//! through the [`Runtime`] driver — power (`power.rs`: SetWanted, Reconcile,
//! StopForUpdate, Signal, Drain), builds (`build.rs`: Prebuild, Swap, Create,
//! WriteDropin) — and against the meta repo (`meta.rs`: lock registration, MetaLock,
//! WritePermFile, ApprovalDeploy).

mod build;
mod meta;
mod power;
pub(crate) use meta::pr_ref;

pub(crate) use meta::locked_inputs;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::client::Api;
use crate::runtime::{BuildLog, Generation, Limits, Runtime, Unanswerable};
use crate::scheduler::{Executor, NodeContext, NodeError, NodeOutcome, NodeRun};
use crate::store::Store;
use hive_api::agent::Agent;
use hive_api::job::{JobNodeKind, NodeAction};

/// How long an action on a placed agent waits for its node's worker to answer (to join,
/// or to rejoin after a daemon restart) before it fails: a boot sweep or a Reconcile
/// submitted at boot waits out the workers' redial instead of failing at once.
const NODE_WAIT: std::time::Duration = std::time::Duration::from_secs(120);
/// How long a move waits for the node it leaves to answer before leaving it as it is.
const VACATE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// How often those waits ask again.
const NODE_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// What the executor deploys through: the meta repo, the rev resolver, the applied-rev
/// markers, and the hive base rev this daemon locks.
#[derive(Clone)]
pub struct Deploy {
    /// The meta repo.
    pub meta: crate::meta::Meta,
    /// Resolves config revs to commits.
    pub resolver: crate::meta::resolve::Resolver,
    /// Applied-rev markers.
    pub markers: crate::meta::applied::Markers,
    /// The hive base input's current rev (what a boot sweep bumps the lock to).
    pub hive_rev: String,
}

/// Runs nodes against a runtime driver, reading agents from the store.
pub struct RuntimeExecutor {
    store: Store,
    agents: Api<Agent>,
    recorder: crate::client::events::Recorder,
    runtime: Arc<dyn Runtime>,
    deploy: Deploy,
    /// The generation each DAG's Prebuild produced for an agent, keyed by (Job, agent),
    /// for that same DAG's Swap: two rebuilds of one agent whose Prebuilds (lease-exempt)
    /// interleave each deploy their own build.
    prebuilt: Mutex<HashMap<(String, String), Generation>>,
}

impl RuntimeExecutor {
    /// An executor over `runtime`, deploying through `deploy`.
    pub fn new(store: Store, runtime: Arc<dyn Runtime>, deploy: Deploy) -> RuntimeExecutor {
        let recorder = crate::client::events::Recorder::new(store.clone(), "hive-scheduler");
        RuntimeExecutor {
            agents: Api::new(&store),
            store,
            recorder,
            runtime,
            deploy,
            prebuilt: Mutex::new(HashMap::new()),
        }
    }

    /// Applies the agent's limits and records whether the host enforces them in its
    /// `LimitsEnforced` condition.
    async fn write_limits(&self, agent: &Agent) -> Result<Limits, NodeError> {
        use hive_api::meta::{set_condition, Condition, ConditionStatus, Time};
        let limits = self.runtime.write_limits(agent).await.map_err(failed)?;
        let (status, reason) = if limits.enforced {
            (ConditionStatus::True, "Enforced")
        } else {
            (ConditionStatus::False, "NotEnforced")
        };
        let condition = Condition {
            type_: hive_api::agent::CONDITION_LIMITS_ENFORCED.into(),
            status,
            reason: reason.into(),
            message: format!("cpu {} memory {}: {}", limits.cpu_quota, limits.memory_max, limits.message),
            observed_generation: agent.metadata.generation,
            ..Default::default()
        };
        let name = agent.metadata.name.as_str();
        // Said once per agent and cause: not again while its condition already says so.
        let already = hive_api::meta::find_condition(&agent.status.conditions, &condition.type_)
            .is_some_and(|c| c.status == condition.status && c.message == condition.message);
        let now = Time(self.store.now());
        let result = self.agents.patch_status(name, |status| {
            set_condition(&mut status.conditions, condition.clone(), now);
        });
        if let Err(err) = result.await {
            tracing::warn!(agent = name, error = %err, "LimitsEnforced condition not written");
        }
        if !limits.enforced && !already {
            let message = format!("limits not enforced: {}", limits.message);
            let _ = self
                .recorder
                .record(agent, crate::client::events::EventType::Warning, "LimitsNotEnforced", &message)
                .await;
        }
        Ok(limits)
    }

    fn agent(&self, name: &str) -> Result<Agent, NodeError> {
        self.agents.get_existing(name).map_err(failed)
    }

    /// Waits while the runtime cannot answer for `name` yet (a placed agent whose node's
    /// worker has not joined, or not rejoined since this daemon started), at most
    /// [`NODE_WAIT`]; fails at once when its node is lost. An agent on this host, or one
    /// that is gone (the action reports that), passes straight through.
    async fn reachable(&self, ctx: &NodeContext, name: &str) -> Result<(), NodeError> {
        let Ok(agent) = self.agent(name) else { return Ok(()) };
        self.wait_answerable(ctx, &agent, NODE_WAIT).await.map_err(failed)
    }

    /// Waits while the runtime answers [`Unanswerable::Waiting`] for `agent`, at most
    /// `bound`, saying so in the node's step; the reason when it is lost or the wait ran out.
    async fn wait_answerable(
        &self,
        ctx: &NodeContext,
        agent: &Agent,
        bound: std::time::Duration,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + bound;
        let mut said = String::new();
        loop {
            match self.runtime.answerable(agent) {
                Ok(()) => return Ok(()),
                Err(Unanswerable::Lost(why)) => return Err(why),
                Err(Unanswerable::Waiting(why)) if tokio::time::Instant::now() >= deadline => {
                    return Err(format!("{why} (waited {}s)", bound.as_secs()))
                }
                Err(Unanswerable::Waiting(why)) => {
                    if why != said {
                        ctx.set_step(format!("waiting for the node: {why}"));
                        said = why;
                    }
                    tokio::time::sleep(NODE_POLL).await;
                }
            }
        }
    }
}

/// Streams build output into the node's log, a line at a time.
struct NodeLines<'a>(&'a NodeContext);

impl BuildLog for NodeLines<'_> {
    fn line(&self, line: &str) {
        self.0.log(line.as_bytes());
        self.0.log(b"\n");
    }
}

fn failed(err: impl std::fmt::Display) -> NodeError {
    NodeError::Failed(err.to_string())
}

impl Executor for RuntimeExecutor {
    async fn run(&self, node: NodeRun) -> Result<NodeOutcome, NodeError> {
        let kind = node.kind();
        let agent = node.agent().map(str::to_string);
        let job = node.job.clone();
        if node.attempt > 1 {
            self.record_retry(&node).await;
        }
        if self.store.etcd().is_some() {
            self.record_start(&node).await?;
        }
        let result = self.execute(node).await;
        // Lifecycle outcomes become Events on the agent, as kubectl describe shows them.
        if let Some(stored) = agent.as_deref().and_then(|a| self.agents.get(a).ok().flatten()) {
            use crate::client::events::EventType::{Normal, Warning};
            let outcome = match (&result, kind) {
                (Ok(o), JobNodeKind::Create) => Some((
                    Normal,
                    "Spawned",
                    format!("{} by Job {job}", o.step.as_deref().unwrap_or("first generation created")),
                )),
                (Ok(o), JobNodeKind::Vacate) => {
                    Some((Normal, "Moving", format!("{} (Job {job})", o.step.as_deref().unwrap_or_default())))
                }
                (Ok(o), JobNodeKind::Prebuild) => Some((Normal, "Built", o.step.clone().unwrap_or_default())),
                (Err(e), _) => Some((Warning, "Failed", format!("{kind:?} in Job {job} failed: {e}"))),
                _ => None,
            };
            if let Some((type_, reason, message)) = outcome {
                if let Err(err) = self.recorder.record(&stored, type_, reason, &message).await {
                    tracing::warn!(error = %err, reason, "event not recorded");
                }
            }
        }
        result
    }
}

impl RuntimeExecutor {
    /// A node runs again after a failed try: a `Retrying` Event on its Job says which
    /// try and why the last one failed.
    async fn record_retry(&self, node: &NodeRun) {
        let Ok(Some(job)) = Api::<hive_api::Job>::new(&self.store).get(&node.job) else { return };
        let message = format!(
            "node {}: attempt {} of {} ({})",
            node.id(),
            node.attempt,
            node.attempts,
            node.retry_of.as_deref().unwrap_or("the last try failed")
        );
        let warning = crate::client::events::EventType::Warning;
        if let Err(err) = self.recorder.record(&job, warning, "Retrying", &message).await {
            tracing::warn!(error = %err, "retry event not recorded");
        }
    }

    /// Among replicas, a node's start is recorded before it acts: a `NodeStarted` Event
    /// on its Job naming the node and the attempt, written under the leader's fence. A
    /// replica that no longer leads cannot write it, so it starts nothing; and the Events
    /// show each (Job, node, attempt) started at most once across leaders (a second
    /// start would count 2).
    async fn record_start(&self, node: &NodeRun) -> Result<(), NodeError> {
        let job = Api::<hive_api::Job>::new(&self.store)
            .get(&node.job)
            .map_err(|err| failed(format!("not started: reading its Job: {err}")))?
            .ok_or_else(|| failed("not started: its Job is gone"))?;
        let message = format!("node {} attempt {} started", node.id(), node.attempt);
        let normal = crate::client::events::EventType::Normal;
        self.recorder
            .record(&job, normal, "NodeStarted", &message)
            .await
            .map_err(|err| failed(format!("not started: its start could not be recorded: {err}")))
    }

    /// Runs the node's action: one function each. The action was parsed when the
    /// scheduler took the Job; a node whose params do not parse fails here, naming why.
    async fn execute(&self, node: NodeRun) -> Result<NodeOutcome, NodeError> {
        let ctx = &node.ctx;
        // Every action but MetaLock acts on an agent (admission requires it).
        let agent = || {
            node.agent()
                .ok_or_else(|| failed(format!("{} node {} names no agent", node.kind().as_str(), node.id())))
        };
        let action = node.action()?;
        if !matches!(
            action,
            NodeAction::SetWanted { .. } | NodeAction::MetaLock { .. } | NodeAction::Vacate { .. }
        ) {
            self.reachable(ctx, agent()?).await?;
        }
        let step = match action {
            NodeAction::SetWanted { wanted } => self.set_wanted(agent()?, *wanted)?,
            NodeAction::Reconcile { kill } => self.reconcile(ctx, agent()?, *kill).await?,
            NodeAction::StopForUpdate => self.stop_for_update(ctx, agent()?).await?,
            NodeAction::Signal => self.signal(&node, agent()?).await?,
            NodeAction::Drain => self.drain(&node, agent()?).await?,
            NodeAction::WriteDropin => self.write_dropin(agent()?).await?,
            NodeAction::WritePermFile => {
                ctx.set_step("committing permissions");
                self.write_perm_file(agent()?).await?
            }
            NodeAction::Prebuild { relock } => self.prebuild(&node, agent()?, *relock).await?,
            NodeAction::Swap => self.swap(&node, agent()?).await?,
            NodeAction::Create { relock } => self.create(ctx, agent()?, *relock).await?,
            NodeAction::Vacate { from } => self.vacate(ctx, agent()?, from.as_deref()).await?,
            NodeAction::MetaLock { inputs, agents, non_fatal } => {
                self.meta_lock(ctx, inputs, agents.as_deref(), *non_fatal).await?
            }
            NodeAction::ApprovalDeploy { approval } => {
                self.approval_deploy(&node, agent()?, approval).await?
            }
        };
        ctx.set_step(step.clone());
        Ok(NodeOutcome { step: Some(step) })
    }
}

#[cfg(test)]
mod tests;
