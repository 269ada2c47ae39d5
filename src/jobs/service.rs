//! [`JobService`]: what the server asks of Jobs, as plain data in and out — a POSTed
//! Job, names, log options; Jobs, names, byte streams and typed errors back. The
//! server holds an `Arc<dyn JobService>` and never the engine, so a replica that does not
//! lead can answer through an implementation that reaches the leader (issue 30, high
//! availability); the one implementation today is the [`Engine`] of this process.
//!
//! Errors are [`Error`] (`error.rs`): the API's vocabulary (invalid, not found, already
//! exists, conflict, bad request) without HTTP, which the server maps onto its `Status`
//! once.

use std::time::Duration;

use futures_util::future::BoxFuture;
use hive_api::agent::Agent;
use hive_api::usage::AgentUsageList;

use super::engine::Engine;
pub use super::error::{Error, Result};
use super::post::{Posted, PostedJob};
use crate::meta::AuditEntry;
use crate::runtime::process::git::DiffSummary;
use crate::runtime::{LogOptions, LogStream};

/// What the server asks of Jobs and of the runtime behind them (see the module
/// documentation). Every argument and answer is plain data, so the answer may come from
/// another process.
pub trait JobService: Send + Sync {
    /// `POST /apis/hive.dev/v1/jobs`: a template Job through the submit layer, a Job
    /// with its nodes validated and stored as it is, then taken by the intake; the
    /// answer is the claimed Job (or, for a dry run, the Job as it would be stored).
    fn post(&self, job: PostedJob) -> BoxFuture<'_, Result<Posted>>;

    /// Cancels Job `name` (with `children`, the Jobs it started too) while none of its
    /// nodes has started, whatever wrote it; a cancelled power Job reverts its agents'
    /// intent to what they are observed doing. The names cancelled; none when the Job
    /// cannot be cancelled now.
    fn cancel(&self, name: String, children: bool) -> BoxFuture<'_, Result<Vec<String>>>;

    /// The log of node `node` of Job `job`: what it wrote so far, then, with `follow`,
    /// what it writes next until it ends.
    fn job_log(&self, job: String, node: String, follow: bool) -> BoxFuture<'_, Result<LogStream>>;

    /// The output of agent `agent`'s process, as kubectl's pod log.
    fn agent_log(&self, agent: String, options: LogOptions) -> BoxFuture<'_, Result<LogStream>>;

    /// What `agent`'s config repository would change going from commit `base` to what
    /// `head` names (fetched into the daemon's mirror first): the resolved head and the
    /// summary.
    fn diff(&self, agent: Agent, base: String, head: String) -> BoxFuture<'_, Result<(String, DiffSummary)>>;

    /// The deploy audit trail: the meta repo's log, newest first, at most `limit`
    /// entries, only `agent`'s when given.
    fn audit(&self, agent: Option<String>, limit: usize) -> BoxFuture<'_, Result<Vec<AuditEntry>>>;

    /// What each of `agents` uses now (`hive top`), measured over `window`.
    fn agent_usage(&self, agents: Vec<Agent>, window: Duration) -> BoxFuture<'_, Result<AgentUsageList>>;
}

impl JobService for Engine {
    fn post(&self, job: PostedJob) -> BoxFuture<'_, Result<Posted>> {
        Box::pin(super::post::post(self, job))
    }

    fn cancel(&self, name: String, children: bool) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(async move { super::cancel::cancel(self, &name, children).await })
    }

    fn job_log(&self, job: String, node: String, follow: bool) -> BoxFuture<'_, Result<LogStream>> {
        Box::pin(async move {
            let (so_far, follower) = self.scheduler.log(&job, &node).await?;
            let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
            tokio::spawn(async move {
                if tx.send(bytes::Bytes::from(so_far)).await.is_err() {
                    return;
                }
                if let (true, Some(mut follower)) = (follow, follower) {
                    while let Some(chunk) = follower.recv().await {
                        if tx.send(chunk).await.is_err() {
                            return;
                        }
                    }
                }
            });
            Ok(rx)
        })
    }

    fn agent_log(&self, agent: String, options: LogOptions) -> BoxFuture<'_, Result<LogStream>> {
        Box::pin(async move {
            self.runtime.logs(&agent, options).await.map_err(|e| match e {
                crate::runtime::Error::LogsElsewhere { .. } | crate::runtime::Error::NoPreviousRun { .. } => {
                    Error::BadRequest(e.to_string())
                }
                other => Error::Internal(anyhow::Error::new(other)),
            })
        })
    }

    fn diff(&self, agent: Agent, base: String, head: String) -> BoxFuture<'_, Result<(String, DiffSummary)>> {
        Box::pin(async move {
            let quiet = |_: &str| {};
            let resolver = &self.deploy.resolver;
            resolver.diff(&agent, &base, &head, &quiet).await.map_err(|e| {
                // The log has the error with its paths; the answer names no path of the daemon's.
                let target = &agent.metadata.name;
                tracing::warn!(agent = %target, error = %e, "could not compare for an approval's diff");
                Error::Compare(format!(
                    "cannot compare {target}'s applied commit with {head:?}: {}",
                    resolver.describe(&agent, &e)
                ))
            })
        })
    }

    fn audit(&self, agent: Option<String>, limit: usize) -> BoxFuture<'_, Result<Vec<AuditEntry>>> {
        Box::pin(async move {
            self.deploy
                .meta
                .log(agent.as_deref(), limit)
                .await
                .map_err(|e| Error::Internal(anyhow::Error::new(e)))
        })
    }

    fn agent_usage(&self, agents: Vec<Agent>, window: Duration) -> BoxFuture<'_, Result<AgentUsageList>> {
        Box::pin(super::usage::measure(self.runtime.as_ref(), agents, window))
    }
}
