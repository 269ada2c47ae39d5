//! The boot reconcile, at daemon start, after the engine starts and before its intake
//! does: the config path classifies every installed agent by rev freshness and submits
//! ONE BootSweep Job when any is stale; the power path gives every agent whose observed
//! power drifted from wanted a plain Reconcile.

use hive_api::agent::{parents_first, Power, Wanted};
use hive_api::job::{JobSource, JobTemplate, Scheduling, BOOT_PRIORITY};
use hive_api::Agent;

use crate::jobs::Engine;
use crate::submit::{DagRequest, LiveState};

/// What the boot sweep found, per agent (the sweep's reason records the counts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Stale and wanted Up: rebuilt by the sweep, parents first.
    pub rebuild: Vec<String>,
    /// Stale and wanted Offline: no boot-time build; their next start rebuilds.
    pub deferred: Vec<String>,
    /// Built from the current config and base.
    pub up_to_date: Vec<String>,
}

impl Sweep {
    /// `boot sweep: 2 rebuild, 1 deferred, 3 up to date`.
    pub fn reason(&self) -> String {
        format!(
            "boot sweep: {} rebuild, {} deferred, {} up to date",
            self.rebuild.len(),
            self.deferred.len(),
            self.up_to_date.len()
        )
    }
}

/// The stored agents that are installed, decoded; one never built is left to the
/// Agent controller, which spawns it. Installed is what the runtime says for an agent
/// on this host; for an agent placed on a node, whose worker may not have rejoined
/// yet at boot, it is the applied-rev marker its last build left here. Only these are
/// decoded: with many stored agents, decoding them all was most of a cold start.
fn installed_agents(engine: &Engine) -> Vec<Agent> {
    let agents = engine.agents();
    let marked = engine.deploy.markers.names();
    // What this host's runtime installed, listed once when it can list: asking it per
    // stored Agent (a read of the Agent for its placement and a `statx` each) was most
    // of a start at 1,000,000 Agents (docs/benchmarks.md, issue 34).
    let listed = engine.runtime.installed_here();
    let installed = |name: &str| match &listed {
        Some(names) => names.contains(name),
        None => engine.runtime.installed(name),
    };
    let candidates = agents.names().into_iter().filter(|name| installed(name) || marked.contains(&**name));
    candidates
        .filter_map(|name| match agents.get(&name) {
            Ok(agent) => agent,
            Err(err) => {
                tracing::warn!(agent = %name, error = %err, "skipping an agent that does not decode");
                None
            }
        })
        .filter(|agent| agent.spec.node().is_some() || installed(&agent.metadata.name))
        .collect()
}

/// Classifies every installed agent by rev freshness (its applied-rev marker against
/// the current lock and hive base) and wanted power.
pub async fn classify(engine: &Engine) -> Sweep {
    let agents = installed_agents(engine);
    let mut sweep = Sweep::default();
    let mut stale_up = Vec::new();
    for agent in &agents {
        let name = agent.metadata.name.as_str();
        match (engine.is_fresh(name).await, agent.spec.wanted) {
            (true, _) => sweep.up_to_date.push(name.to_string()),
            (false, Wanted::Up) => stale_up.push(agent.clone()),
            (false, Wanted::Offline) => sweep.deferred.push(name.to_string()),
        }
    }
    sweep.rebuild = parents_first(&stale_up);
    sweep
}

/// The boot reconcile's config path: when any agent is stale, ONE BootSweep Job — a
/// non-fatal MetaLock of the hive input that fans out rebuilds of the stale
/// wanted-up agents, parents first. The bump runs even when every stale agent is
/// offline, so their later start-upgrades build against it. No stale agent: no Job
/// and no meta commit.
pub async fn sweep(engine: &Engine) -> Sweep {
    let sweep = classify(engine).await;
    if sweep.rebuild.is_empty() && sweep.deferred.is_empty() {
        return sweep;
    }
    let request = DagRequest {
        template: JobTemplate::BootSweep,
        nodes: crate::submit::shapes::meta_lock(&["hive".into()], Some(&sweep.rebuild), true),
        source: JobSource::Boot,
        reason: Some(sweep.reason()),
        inputs: vec!["hive".into()],
        agents: sweep.rebuild.clone(),
        scheduling: Scheduling { priority: BOOT_PRIORITY, ..Default::default() },
        ..Default::default()
    };
    match engine.submit_dag(&request).await {
        Ok(job) => {
            tracing::info!(job = job.metadata.name, reason = sweep.reason(), "boot sweep submitted")
        }
        Err(err) => tracing::warn!(error = %err, "boot sweep not submitted"),
    }
    sweep
}

/// The boot reconcile's power path: every agent whose observed power drifted from
/// its wanted power gets a plain Reconcile Job (source `Boot`), except those the
/// sweep rebuilds (their rebuild's tail Reconcile brings them up).
///
/// First, every agent on this host recorded running (or starting, or stopping) that
/// the runtime finds stopped is recorded `Stopped`: the last daemon's shutdown (or
/// its kill) stopped it without crash-watch seeing the exit, and no event will say
/// so now. (An agent on a fleet node is observed from its worker when it rejoins.)
pub async fn reconcile(engine: &Engine, swept: &Sweep) {
    for agent in installed_agents(engine) {
        let name = agent.metadata.name.clone();
        let running = engine.is_running(&name);
        let recorded_up =
            matches!(agent.status.power, Some(Power::Running | Power::Starting | Power::Stopping));
        if agent.spec.node().is_none() && recorded_up && !running {
            let stopped =
                engine.agents().patch_status(&name, |status| status.power = Some(Power::Stopped)).await;
            if let Err(err) = stopped {
                tracing::warn!(agent = name, error = %err, "recording a stopped agent's power failed");
            }
        }
        if swept.rebuild.contains(&name) {
            continue;
        }
        let drifted = match agent.spec.wanted {
            Wanted::Up => !running,
            Wanted::Offline => running,
        };
        if drifted {
            let reason = Some("boot: observed power differs from wanted".to_string());
            if let Err(err) =
                engine.submit(JobTemplate::Reconcile, vec![name.clone()], JobSource::Boot, reason).await
            {
                tracing::warn!(agent = name, error = %err, "boot reconcile not submitted");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_reason_counts() {
        let sweep =
            Sweep { rebuild: vec!["a".into(), "b".into()], deferred: vec!["c".into()], up_to_date: vec![] };
        assert_eq!(sweep.reason(), "boot sweep: 2 rebuild, 1 deferred, 0 up to date");
    }
}
