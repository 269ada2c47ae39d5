//! The build actions: Prebuild (lock, then build the new generation while the old one
//! serves), Swap (to the generation this Job's Prebuild built), Create (first spawn,
//! registered in the meta flake), Vacate (a move leaving its old host) and WriteDropin
//! (limits).

use super::{failed, NodeLines, RuntimeExecutor, VACATE_WAIT};
use crate::scheduler::{NodeContext, NodeError, NodeRun};

impl RuntimeExecutor {
    /// Prebuild: with `relock`, locks the agent's wanted rev (else reads what the meta
    /// lock pins), then builds it; the generation is kept for this Job's Swap.
    pub(super) async fn prebuild(
        &self,
        node: &NodeRun,
        name: &str,
        relock: bool,
    ) -> Result<String, NodeError> {
        let (ctx, log) = (&node.ctx, NodeLines(&node.ctx));
        let agent = self.agent(name)?;
        ctx.set_step(if relock { "locking the config rev" } else { "reading the meta lock" });
        // The gate is held only for the lock; the long build runs without it.
        let sha = self.lock_for_build(&agent, relock, &log).await?;
        let mut pinned = agent.clone();
        pinned.spec.config.rev = Some(sha);
        ctx.set_step("building");
        // The build writes only a new generation: past the Job's deadline the scheduler
        // may stop it here (the build subprocess is killed), never during the lock.
        ctx.set_interruptible(true);
        let generation = self.runtime.prebuild(&pinned, &log).await.map_err(failed);
        ctx.set_interruptible(false);
        let generation = generation?;
        let step = format!("built generation {}", generation.id);
        let key = (node.job.to_string(), name.to_string());
        self.prebuilt.lock().unwrap_or_else(|e| e.into_inner()).insert(key, generation);
        Ok(step)
    }

    /// Swap: flips the agent to the generation this Job's Prebuild built, rewriting its
    /// drop-in first (so limit changes take effect with the next lifecycle op).
    pub(super) async fn swap(&self, node: &NodeRun, name: &str) -> Result<String, NodeError> {
        let agent = self.agent(name)?;
        let key = (node.job.to_string(), name.to_string());
        let generation =
            self.prebuilt.lock().unwrap_or_else(|e| e.into_inner()).remove(&key).ok_or_else(|| {
                failed(format!(
                "no prebuilt generation for agent {name:?} in Job {}: a Prebuild of this Job must run first",
                node.job
            ))
            })?;
        self.write_limits(&agent).await?;
        node.ctx.set_step(format!("swapping to {}", generation.id));
        self.runtime.swap(&agent, &generation).await.map_err(failed)?;
        self.mark_applied(name, &generation.rev).await;
        Ok(format!("now on generation {}", generation.id))
    }

    /// Create: registers the agent in the meta flake (with `relock`, at its wanted rev;
    /// else at what the lock pins), creates its first generation on the host its
    /// placement names, records that host in `status.node`, and commits its permissions
    /// when it has any.
    pub(super) async fn create(
        &self,
        ctx: &NodeContext,
        name: &str,
        relock: bool,
    ) -> Result<String, NodeError> {
        let log = NodeLines(ctx);
        let agent = self.agent(name)?;
        ctx.set_step("registering in the meta flake");
        let sha = self.lock_for_build(&agent, relock, &log).await?;
        let mut pinned = agent.clone();
        pinned.spec.config.rev = Some(sha);
        ctx.set_step("creating");
        let generation = self.runtime.create(&pinned, &log).await.map_err(failed)?;
        self.mark_applied(name, &generation.rev).await;
        self.record_host(name, agent.spec.node()).await?;
        if !agent.spec.permissions.tool_groups.is_empty() || !agent.spec.permissions.capabilities.is_empty() {
            self.write_perm_file(name).await?;
        }
        Ok(match agent.spec.node() {
            Some(node) => format!("created generation {} on node {node}", generation.id),
            None => format!("created generation {}", generation.id),
        })
    }

    /// Vacate: the agent leaves `from` (a fleet Node; `None`: the daemon's host) for the
    /// host its placement names now. Where `from` answers, the agent is stopped there
    /// and its installation removed; a host that cannot be reached (a lost node) is left
    /// as it is, and the step says so. Either way the agent counts as installed nowhere
    /// until this Job's Create builds it on the new host (its applied-rev marker is
    /// removed, `status.node` names the new host).
    pub(super) async fn vacate(
        &self,
        ctx: &NodeContext,
        name: &str,
        from: Option<&str>,
    ) -> Result<String, NodeError> {
        let agent = self.agent(name)?;
        let host = from.map_or_else(|| "the daemon's host".to_string(), |node| format!("node {node}"));
        let mut there = agent.clone();
        there.spec.placement = from.map(|node| hive_api::agent::Placement { node: node.to_string() });
        let step = if there.spec.placement == agent.spec.placement {
            format!("already on {host}")
        } else {
            ctx.set_step(format!("reaching {host}"));
            match self.wait_answerable(ctx, &there, VACATE_WAIT).await {
                Err(why) => format!("{host} cannot be reached ({why}): what runs there is left as it is"),
                Ok(()) => {
                    ctx.set_step(format!("stopping it on {host}"));
                    self.runtime.stop(&there).await.map_err(failed)?;
                    self.runtime.destroy(&there).await.map_err(failed)?;
                    format!("stopped and removed on {host}")
                }
            }
        };
        self.deploy.markers.remove(name);
        self.record_host(name, agent.spec.node()).await?;
        Ok(step)
    }

    /// Writes `status.node`: the host the agent's installation is on (or goes to).
    async fn record_host(&self, name: &str, node: Option<&str>) -> Result<(), NodeError> {
        let node = node.map(str::to_string);
        self.agents.patch_status(name, |status| status.node = node.clone()).await.map_err(failed)?;
        Ok(())
    }

    /// WriteDropin: writes the agent's limits and reports whether the host enforces them.
    pub(super) async fn write_dropin(&self, name: &str) -> Result<String, NodeError> {
        let agent = self.agent(name)?;
        let limits = self.write_limits(&agent).await?;
        Ok(format!(
            "limits cpu {} memory {} {}",
            limits.cpu_quota,
            limits.memory_max,
            if limits.enforced { "enforced" } else { "NOT enforced" }
        ))
    }
}
