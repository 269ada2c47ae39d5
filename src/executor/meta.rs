//! The actions that touch the meta repo: Prebuild's and Create's lock registration,
//! MetaLock (bump, then fan out child rebuilds of exactly the affected agents),
//! WritePermFile, and ApprovalDeploy (prepare → fused stop/update/start → finalize or
//! abort). Each holds the deploy-window gate for its whole mutation span and no longer:
//! Prebuild drops it before the long build.

use hive_api::agent::{Agent, Wanted};
use hive_api::approval::{Approval, ApprovalKind};
use hive_api::job::{JobSource, JobSpec, JobTemplate};
use hive_api::names::DECIDED_BY;

use super::{failed, NodeLines, RuntimeExecutor};
use crate::client::Api;
use crate::meta::applied::Marker;
use crate::meta::resolve::source_url;
use crate::meta::{AgentInput, Gate};
use crate::runtime::{BuildLog, Generation};
use crate::scheduler::{NodeContext, NodeError, NodeRun};

impl RuntimeExecutor {
    /// The commit a build of `agent` uses: with `relock`, its wanted rev resolved now and
    /// locked (registering the agent in the meta flake on first use); without, the rev
    /// the lock already holds (a MetaLock child must not revert the bump).
    pub(super) async fn lock_for_build(
        &self,
        agent: &Agent,
        relock: bool,
        log: &dyn BuildLog,
    ) -> Result<String, NodeError> {
        let name = agent.metadata.name.as_str();
        let gate = self.deploy.meta.gate().await;
        if !relock {
            if let Some(locked) = self.deploy.meta.locked(name).await {
                return Ok(locked.rev);
            }
            // Nothing pinned to keep: lock its wanted rev, as its first build does.
            log.line(&format!("meta: {name} has no entry in the meta lock; locking its wanted rev"));
        }
        let sha = self.deploy.resolver.resolve(agent, log).await.map_err(failed)?;
        if let Some(commit) = self.register(&gate, agent, &sha).await? {
            log.line(&format!("meta: locked {name} at {sha} (commit {commit})"));
        }
        Ok(sha)
    }

    /// Locks `agent` at `sha` (one fused commit when anything changed): an agent the lock
    /// already pins is relocked (`Hive-Op: relock`); a new one is registered by rendering
    /// the meta flake for every agent the lock knows plus it (`Hive-Op: sync`).
    async fn register(
        &self,
        gate: &Gate,
        agent: &Agent,
        sha: &str,
    ) -> Result<Option<crate::meta::CommitId>, NodeError> {
        let name = agent.metadata.name.as_str();
        if self.deploy.meta.locked(name).await.is_some() {
            let url = source_url(&agent.spec.config.repo);
            return self.deploy.meta.relock(gate, name, &url, sha).await.map_err(failed);
        }
        let mut inputs = locked_inputs(&self.store, &self.deploy.meta, name).await;
        inputs.push(AgentInput {
            name: name.to_string(),
            url: source_url(&agent.spec.config.repo),
            rev: Some(sha.to_string()),
        });
        self.deploy.meta.sync_agents(gate, &inputs).await.map_err(failed)
    }

    /// Records what the agent's current generation was built from.
    pub(super) async fn mark_applied(&self, name: &str, rev: &str) {
        let marker = Marker { rev: rev.to_string(), hive: self.deploy.meta.hive_rev().await };
        if let Err(err) = self.deploy.markers.write(name, &marker) {
            tracing::warn!(agent = name, error = %err, "applied-rev marker not written");
        }
    }

    /// MetaLock: bumps `inputs`, then fans out one rebuild per affected agent — the
    /// `listed` agents when given, else every installed agent whose input changed. With
    /// `non_fatal`, a failed bump is reported and the rebuilds still fan out.
    pub(super) async fn meta_lock(
        &self,
        ctx: &NodeContext,
        inputs: &[String],
        listed: Option<&[String]>,
        non_fatal: bool,
    ) -> Result<String, NodeError> {
        let log = NodeLines(ctx);
        if inputs.is_empty() {
            return Err(failed("MetaLock names no inputs"));
        }
        ctx.set_step(format!("bumping {}", inputs.join(", ")));
        let bump = async {
            let gate = self.deploy.meta.gate().await;
            let mut updates = Vec::new();
            for input in inputs {
                let rev = if input == "hive" {
                    self.deploy.hive_rev.clone()
                } else {
                    let agent = self.agent(input)?;
                    self.deploy.resolver.resolve(&agent, &log).await.map_err(failed)?
                };
                updates.push((input.clone(), rev));
            }
            if let [(input, rev)] = updates.as_slice() {
                if input == "hive" {
                    // The hive base alone: its own commit kind (`Hive-Op: hive-bump`).
                    let commit = self.deploy.meta.lock_update_hive(&gate, rev).await.map_err(failed)?;
                    let changed = if commit.is_some() { vec![input.clone()] } else { Vec::new() };
                    return Ok(crate::meta::LockBump { commit, changed });
                }
            }
            self.deploy.meta.lock_update(&gate, &updates).await.map_err(failed)
        };
        let (changed, bump_note) = match bump.await {
            Ok(bump) => {
                let note = match &bump.commit {
                    Some(commit) => format!("bumped {} (commit {commit})", bump.changed.join(", ")),
                    None => "lock already current".to_string(),
                };
                log.line(&format!("meta: {note}"));
                (bump.changed, note)
            }
            Err(err) if non_fatal => {
                log.line(&format!("meta: the bump failed ({err}); rebuilding against the current lock"));
                (Vec::new(), format!("bump failed (non-fatal): {err}"))
            }
            // A failed bump fans out nothing.
            Err(err) => return Err(err),
        };
        let agents = match listed {
            Some(agents) => agents.to_vec(),
            None => self.affected(&changed).await,
        };
        for agent in &agents {
            let spec = JobSpec {
                template: JobTemplate::Rebuild,
                reason: Some(format!("meta-update: {}", inputs.join(", "))),
                source: JobSource::FanOut,
                agents: vec![agent.clone()],
                nodes: crate::submit::shapes::rebuild_locked(agent),
                ..Default::default()
            };
            ctx.fan_out(spec).map_err(failed)?;
        }
        Ok(format!("{bump_note}; {} rebuild(s) fanned out", agents.len()))
    }

    /// The installed agents an input change affects, parents first: a `hive` change
    /// affects every agent, an agent input only that agent.
    async fn affected(&self, changed: &[String]) -> Vec<String> {
        if changed.is_empty() {
            return Vec::new();
        }
        let all = changed.iter().any(|c| c == "hive");
        // Names first: only the installed agents (those with a marker) are decoded.
        let agents: Vec<Agent> = self
            .agents
            .names()
            .into_iter()
            .filter(|name| all || changed.iter().any(|c| **c == **name))
            .filter(|name| self.deploy.markers.read(name).is_some())
            .filter_map(|name| self.agents.get(&name).ok().flatten())
            .collect();
        hive_api::agent::parents_first(&agents)
    }

    /// WritePermFile: commits the agent's tool groups and capabilities to the meta repo
    /// (one commit), hands them to the runtime, and records the permissions snapshot.
    pub(super) async fn write_perm_file(&self, name: &str) -> Result<String, NodeError> {
        let agent = self.agent(name)?;
        let permissions = &agent.spec.permissions;
        let commit = {
            let gate = self.deploy.meta.gate().await;
            self.deploy
                .meta
                .write_permissions(&gate, name, &permissions.tool_groups, &permissions.capabilities)
                .await
                .map_err(failed)?
        };
        self.runtime.write_permissions(&agent).await.map_err(failed)?;
        let snapshot = format!(
            "tool groups [{}], capabilities [{}]",
            permissions.tool_groups.join(", "),
            permissions.capabilities.join(", ")
        );
        let message = match &commit {
            Some(c) => format!("permissions committed to meta ({c}): {snapshot}"),
            None => format!("permissions unchanged: {snapshot}"),
        };
        if let Err(err) = self
            .recorder
            .record(&agent, crate::client::events::EventType::Normal, "Permissions", &message)
            .await
        {
            tracing::warn!(error = %err, "permissions event not recorded");
        }
        Ok(match commit {
            Some(c) => format!("permissions committed ({c})"),
            None => "permissions unchanged".into(),
        })
    }

    /// ApprovalDeploy: the approval's commit goes live or nothing changes. Holds the
    /// gate for the whole span: prepare (lock written, uncommitted) → prebuild → stop →
    /// swap → start and verify → finalize (commit + deploy tag), else abort (the lock
    /// restored, the old generation back up).
    ///
    /// A failed finalize rolls back too: finalize leaves the repo as before prepare (the
    /// lock names the old commit), so the agent is put back on its previous generation
    /// and its applied-rev marker restored — agent, marker and lock agree on the old
    /// commit, and the approval fails. Completing instead would mean retrying a commit
    /// that just failed, with the agent already running what no lock records.
    pub(super) async fn approval_deploy(
        &self,
        node: &NodeRun,
        name: &str,
        approval_name: &str,
    ) -> Result<String, NodeError> {
        let ctx = &node.ctx;
        let log = NodeLines(ctx);
        let approval = Api::<Approval>::new(&self.store).get_existing(approval_name).map_err(failed)?;
        let agent = self.agent(name)?;
        let gate = self.deploy.meta.gate().await;
        ctx.set_step("resolving the change");
        let sha = self.approved_commit(&agent, &approval, &log).await?;
        let marker = self.deploy.markers.read(name);
        let prepared = self.deploy.meta.prepare_deploy(&gate, name, &sha).await.map_err(failed)?;
        log.line(&format!("meta: lock for {name} staged at {sha} (uncommitted)"));
        match self.deploy_live(node, &agent, &sha, marker.as_ref()).await {
            Ok((step, previous)) => {
                let decided_by = approval
                    .metadata
                    .annotations
                    .get(DECIDED_BY)
                    .map_or("unknown", String::as_str)
                    .to_string();
                let message = format!(
                    "deploy {name} {short} (approval {approval_name}, {kind}, approved by {decided_by})",
                    short = &sha[..sha.len().min(12)],
                    kind = approval.spec.kind.as_str()
                );
                let deployed = match self.deploy.meta.finalize_deploy(&gate, prepared, &message).await {
                    Ok(deployed) => deployed,
                    Err(err) => {
                        log.line(&format!(
                            "meta: finalizing the deploy failed ({err}); the lock is as before, so the \
                             previous generation goes back"
                        ));
                        self.roll_back(&agent, previous, marker.as_ref(), &log).await;
                        return Err(failed(format!(
                            "finalizing the deploy failed: {err}; the lock, the applied marker and the \
                             agent are back on the previous commit"
                        )));
                    }
                };
                drop(gate);
                self.adopt_rev(name, &sha).await?;
                log.line(&format!(
                    "meta: {message} committed as {} tagged {}",
                    deployed.commit, deployed.tag
                ));
                Ok(format!("{step}; deployed {} as {}", &sha[..sha.len().min(12)], deployed.tag))
            }
            Err(err) => {
                if let Err(abort) = self.deploy.meta.abort_deploy(&gate, prepared).await {
                    log.line(&format!("meta: restoring the lock failed too: {abort}"));
                    return Err(failed(format!("{err}; restoring the meta lock failed: {abort}")));
                }
                log.line("meta: deploy aborted, lock restored");
                Err(err)
            }
        }
    }

    /// The full commit an approval deploys: `ApplyCommit`'s commit, or the head of
    /// `MergeConfigPr`'s pull request ref (which must still be the reviewed commit when
    /// one was given).
    async fn approved_commit(
        &self,
        agent: &Agent,
        approval: &Approval,
        log: &dyn BuildLog,
    ) -> Result<String, NodeError> {
        let payload = &approval.spec.payload;
        match approval.spec.kind {
            ApprovalKind::ApplyCommit => {
                let commit =
                    payload.commit.as_deref().ok_or_else(|| failed("ApplyCommit names no commit"))?;
                self.deploy.resolver.resolve_rev(agent, Some(commit), log).await.map_err(failed)
            }
            ApprovalKind::MergeConfigPr => {
                let pr = payload
                    .pull_request
                    .as_deref()
                    .ok_or_else(|| failed("MergeConfigPr names no pull request"))?;
                let reference = pr_ref(pr);
                let head =
                    self.deploy.resolver.resolve_rev(agent, Some(&reference), log).await.map_err(failed)?;
                if let Some(reviewed) = payload.commit.as_deref() {
                    if !head.starts_with(reviewed) {
                        return Err(failed(format!(
                            "pull request {pr} moved on: its head is {head}, the approval reviewed {reviewed}"
                        )));
                    }
                }
                Ok(head)
            }
            other => {
                Err(failed(format!("{} approvals do not deploy through ApprovalDeploy", other.as_str())))
            }
        }
    }

    /// The fused stop / update / start on the agent, verifying it comes back up; on a
    /// failure after the swap, the previous generation is put back and restarted (and
    /// the applied marker, `marker`, restored). On success, also the previous generation,
    /// for a rollback after a failed finalize.
    async fn deploy_live(
        &self,
        node: &NodeRun,
        agent: &Agent,
        sha: &str,
        marker: Option<&Marker>,
    ) -> Result<(String, Option<Generation>), NodeError> {
        let ctx = &node.ctx;
        let log = NodeLines(ctx);
        let mut pinned = agent.clone();
        pinned.spec.config.rev = Some(sha.to_string());
        ctx.set_step("building");
        let generation = self.runtime.prebuild(&pinned, &log).await.map_err(failed)?;
        // What runs now, from durable state where the runtime keeps it (a NixOS
        // container's profile), so a daemon restart does not lose it; the rev from the
        // applied marker when the runtime cannot tell.
        let previous = self.runtime.observed(agent).await.map_err(failed)?.generation.map(|mut g| {
            if g.rev.is_empty() {
                g.rev = marker.map(|m| m.rev.clone()).unwrap_or_default();
            }
            g
        });
        ctx.set_step("stopping for the update");
        self.runtime.stop_for_update(agent).await.map_err(failed)?;
        ctx.set_step(format!("swapping to {}", generation.id));
        if let Err(err) = self.runtime.swap(agent, &generation).await {
            self.restart_if_wanted(agent).await;
            return Err(failed(err));
        }
        let verified = async {
            if agent.spec.wanted == Wanted::Offline {
                return Ok("swapped; left stopped (wanted Offline)".to_string());
            }
            ctx.set_step("starting");
            let started = self.runtime.start(agent).await.map_err(failed)?;
            if !self.runtime.is_running(agent).await.map_err(failed)? {
                return Err(failed("the agent did not stay up on the new config"));
            }
            Ok(format!("running on {} (pid {})", generation.id, started.pid))
        };
        match verified.await {
            Ok(step) => {
                self.mark_applied(&agent.metadata.name, sha).await;
                Ok((step, previous))
            }
            Err(err) => {
                log.line(&format!(
                    "the new config did not come up ({err}); putting the previous generation back"
                ));
                self.roll_back(agent, previous, marker, &log).await;
                Err(err)
            }
        }
    }

    /// Puts `previous` back: stop, swap to it (the exact generation, never a rebuild of
    /// the staged config), the applied marker as it was, and start when wanted.
    async fn roll_back(
        &self,
        agent: &Agent,
        previous: Option<Generation>,
        marker: Option<&Marker>,
        log: &dyn BuildLog,
    ) {
        let name = agent.metadata.name.as_str();
        if let Err(err) = self.runtime.stop(agent).await {
            log.line(&format!("stopping the new generation failed: {err}"));
        }
        match previous {
            Some(previous) => match self.runtime.swap(agent, &previous).await {
                Ok(()) => log.line(&format!("back on generation {}", previous.id)),
                Err(e) => log.line(&format!("swapping back to {} failed: {e}", previous.id)),
            },
            None => log.line("no previous generation is known; the new one stays installed"),
        }
        if let Some(marker) = marker {
            if let Err(err) = self.deploy.markers.write(name, marker) {
                tracing::warn!(agent = name, error = %err, "applied-rev marker not restored");
            }
        }
        self.restart_if_wanted(agent).await;
    }

    async fn restart_if_wanted(&self, agent: &Agent) {
        if agent.spec.wanted == Wanted::Up {
            if let Err(err) = self.runtime.start(agent).await {
                tracing::warn!(agent = agent.metadata.name, error = %err, "could not bring the agent back up");
            }
        }
    }

    /// After a deploy, the status says what runs: `status.appliedRev` is the deployed
    /// commit, which the meta lock pins from now on. The spec is the client's and stays
    /// as written (an executor never writes spec): the agent keeps tracking its branch,
    /// and re-applying its unchanged manifest changes nothing. `configFingerprint` is
    /// left as it is: the spec did not change, so the Agent controller sees nothing to
    /// rebuild (and a spec edited meanwhile is still rebuilt).
    async fn adopt_rev(&self, name: &str, sha: &str) -> Result<(), NodeError> {
        self.agents
            .patch_status(name, |status| status.applied_rev = Some(sha.to_string()))
            .await
            .map_err(failed)?;
        Ok(())
    }
}

/// The meta flake's inputs for every stored agent the lock already pins, except
/// `except`, each kept at its locked rev: what a `sync_agents` that changes only one
/// agent (registering or removing it) passes for all the others. It walks the lock's
/// agents, not the store's: a store of 100,000 Agents of which a few are installed
/// decodes none of them.
pub(crate) async fn locked_inputs(
    store: &crate::store::Store,
    meta: &crate::meta::Meta,
    except: &str,
) -> Vec<AgentInput> {
    let agents = Api::<Agent>::new(store);
    meta.locked_agents()
        .await
        .into_iter()
        .filter(|(name, _)| name != except && agents.get_raw(name).is_some())
        .map(|(name, locked)| AgentInput { name, url: locked.url, rev: None })
        .collect()
}

/// A pull request as a git ref: a number is `refs/pull/<n>/head` (the forge
/// convention), a URL ending in `/pull/<n>` likewise, anything else a ref or branch.
pub(crate) fn pr_ref(pr: &str) -> String {
    let number = pr.rsplit('/').next().filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    match number {
        Some(n) if pr.bytes().all(|b| b.is_ascii_digit()) || pr.contains("/pull/") => {
            format!("refs/pull/{n}/head")
        }
        _ => pr.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pull_requests_become_refs() {
        for (pr, want) in [
            ("42", "refs/pull/42/head"),
            ("https://forge.example/o/r/pull/7", "refs/pull/7/head"),
            ("feature/x", "feature/x"),
            ("refs/heads/topic", "refs/heads/topic"),
        ] {
            assert_eq!(super::pr_ref(pr), want);
        }
    }
}
