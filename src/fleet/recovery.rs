//! Recovery at start. Provider state is ground truth:
//! - a node record with its provider resource → adopted, whatever its phase but Killed
//!   (a Failed or Stopped node whose resource runs is Provisioning again): its phase
//!   follows the resource, and its worker's RejoinHello restarts the telemetry pull;
//! - a record without a resource → `Stopped`, never recreated;
//! - a resource carrying this fleet's label without a record, or the label of an
//!   identity `--reset-state` retired → an `Orphaned` node the operator sees, an
//!   `OrphanFound` Warning Event and a log line; nothing is done to the resource.
//!
//! Local worker processes cannot be adopted (they end with the daemon that supervised
//! them), so their live records become `Stopped` at once. Docker and Vast.ai resources
//! are recovered when their provider is first found ready in this run.

use std::collections::BTreeMap;

use super::providers::{Found, Lifetime};
use super::{commands, exec, intake, retained, Fleet};
use crate::client::events::EventType;
use hive_api::node::{Node, NodePhase, NodeSpec, NodeStatus};

/// Live records of local workers → Stopped.
pub(super) async fn process_nodes(fleet: &Fleet) {
    let (_, nodes) = fleet.nodes.list();
    for node in nodes {
        if !fleet.is_local(&node) || !exec::is_live(&node) {
            continue;
        }
        let name = &node.metadata.name;
        mark_stopped(fleet, name, "the daemon restarted; a local worker process cannot be adopted").await;
    }
}

async fn mark_stopped(fleet: &Fleet, name: &str, why: &str) {
    tracing::info!(node = name, why, "fleet recovery: node stopped");
    let now = fleet.now();
    fleet
        .node_status(name, |s| {
            s.phase = Some(NodePhase::Stopped);
            s.error = Some(why.to_string());
            s.finished_at = Some(now);
        })
        .await;
}

/// Recovers the resources of provider `name` (once it is ready).
pub(super) async fn recover(fleet: &Fleet, name: &str) {
    let Some(type_) = commands::provider_type(&fleet.store, name) else { return };
    let listed = match fleet.providers.ready(name, type_) {
        // Resources that end with the daemon leave nothing to recover.
        Ok(provider) if provider.lifetime() == Lifetime::Supervised => return,
        Ok(provider) => provider.list(&fleet.fleet_label).await.map(|found| (provider, found)),
        Err(err) => Err(err),
    };
    let (provider, found) = match listed {
        Ok(listed) => listed,
        Err(err) => {
            tracing::warn!(
                provider = name,
                %err,
                "fleet recovery: listing the provider's resources failed; \
                 it runs again when the provider is next found ready"
            );
            fleet.recovered.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(name);
            return;
        }
    };
    // Nodes of this run's commands are its own: not recovered. Which commands are this
    // run's is durable (`intake::this_run`: not terminal, or claimed by this run), read
    // from the command or, once it was deleted, from its retained record.
    let this_run = |node: &Node| {
        let Some(command) = node.spec.command.as_deref() else { return false };
        let command =
            fleet.commands.get(command).ok().flatten().or_else(|| retained::get(&fleet.store, command));
        command.is_some_and(|c| intake::this_run(&c, &fleet.run_id))
    };
    let mut by_node: BTreeMap<String, Found> = BTreeMap::new();
    let mut orphans = Vec::new();
    for f in found {
        let record = f.node.as_deref().and_then(|n| fleet.nodes.get(n).ok().flatten());
        if record.as_ref().is_some_and(this_run) {
            continue;
        }
        match f.node.clone().filter(|_| record.is_some_and(|o| o.spec.provider == name)) {
            Some(node) => {
                by_node.insert(node, f);
            }
            None => orphans.push(f),
        }
    }
    let (mut adopted, mut stopped) = (0, 0);
    let (_, nodes) = fleet.nodes.list();
    for node in nodes.iter().filter(|n| n.spec.provider == name && !this_run(n)) {
        let node_name = node.metadata.name.clone();
        let live = exec::is_live(node);
        match by_node.remove(&node_name) {
            Some(f) if live => {
                adopted += 1;
                adopt(fleet, &node_name, &f).await;
            }
            Some(f) if node.status.phase == Some(NodePhase::Killed) => {
                // A Kill whose destroy did not finish: the resource is reported, not touched.
                orphans.push(f);
            }
            Some(f) => {
                // Failed or Stopped, and its resource is there: observed, like a live one.
                adopted += 1;
                adopt(fleet, &node_name, &f).await;
            }
            None if live => {
                stopped += 1;
                mark_stopped(fleet, &node_name, "no provider resource found at start; not recreated").await;
            }
            None => {}
        }
    }
    let mut orphaned = orphans.len();
    for f in orphans {
        report_orphan(fleet, name, f, None).await;
    }
    // What an identity retired by --reset-state labelled has no intent here any more.
    for label in &fleet.retired_labels {
        match provider.list(label).await {
            Ok(found) => {
                orphaned += found.len();
                for f in found {
                    report_orphan(fleet, name, f, Some(label)).await;
                }
            }
            Err(err) => tracing::warn!(
                provider = name,
                label,
                %err,
                "fleet recovery: listing the resources of a retired fleet label failed"
            ),
        }
    }
    tracing::info!(provider = name, adopted, stopped, orphaned, "fleet recovery done");
}

async fn adopt(fleet: &Fleet, name: &str, found: &Found) {
    let running = found.running;
    let state = found.state.clone();
    let generation = fleet.net.generation();
    let now = fleet.now();
    fleet
        .node_status(name, |s| {
            s.provider_ref = Some(found.reference.clone());
            let rejoined = s.runtime.as_ref().and_then(|r| r.control_generation) == Some(generation);
            if running && rejoined {
                // Its worker rejoined this run before recovery got here: nothing to say.
            } else if running {
                if matches!(s.phase, Some(NodePhase::Failed | NodePhase::Stopped)) {
                    // Its resource runs: the phase follows what is observed.
                    s.phase = Some(NodePhase::Provisioning);
                    s.finished_at = None;
                }
                s.error = Some(format!(
                    "adopted after a daemon restart ({state}); waiting for its worker to rejoin"
                ));
            } else if s.phase == Some(NodePhase::Stopped) {
                s.error = Some(format!("the resource was found {state} at start; left as it is"));
            } else {
                s.phase = Some(NodePhase::Stopped);
                s.error = Some(format!("the resource was found {state} at start; left as it is"));
                s.finished_at = Some(now);
            }
        })
        .await;
    tracing::info!(node = name, running, state = found.state, "fleet recovery: adopted");
}

/// The name of the Orphaned node reporting a resource without a record.
fn orphan_name(provider: &str, found: &Found) -> String {
    let id = match (&found.reference.container_id, found.reference.instance_id) {
        (Some(c), _) => c.chars().take(12).collect(),
        (_, Some(i)) => i.to_string(),
        _ => "unknown".into(),
    };
    format!("orphan-{provider}-{id}")
}

/// Reports `found` as an Orphaned node, a Warning Event and a log line; the resource
/// is left as it is. `retired` is the fleet label it carries when that label belonged to
/// an identity `--reset-state` retired.
async fn report_orphan(fleet: &Fleet, provider: &str, found: Found, retired: Option<&str>) {
    let name = orphan_name(provider, &found);
    let whose = match retired {
        Some(label) => format!(
            "without intent: it carries fleet label {label}, of this state directory's identity \
             before --reset-state"
        ),
        None => "without a live record in this fleet".to_string(),
    };
    let error = format!(
        "found at provider {provider} ({}) labelled {} {whose}; left untouched \
         (a Kill command naming this node destroys it)",
        found.state,
        found.node.as_deref().map_or("with no node".to_string(), |n| format!(
            "node {n}{}",
            found.command.as_deref().map(|c| format!(" of command {c}")).unwrap_or_default()
        )),
    );
    let status = NodeStatus {
        phase: Some(NodePhase::Orphaned),
        provider_ref: Some(found.reference.clone()),
        error: Some(error.clone()),
        ..Default::default()
    };
    tracing::warn!(node = name, provider, reference = ?found.reference, why = error, "fleet recovery: orphan reported");
    if fleet.nodes.get_raw(&name).is_some() {
        if let Some(node) = fleet.node_status(&name, |s| *s = status.clone()).await {
            orphan_event(fleet, &node, &error).await;
        }
        return;
    }
    let mut node = Node::new(
        name.clone(),
        NodeSpec {
            logical_id: found.logical_id.unwrap_or(0),
            provider: provider.to_string(),
            command: None,
            ..Default::default()
        },
    );
    node.metadata.labels = BTreeMap::from([(hive_api::names::ORPHAN_LABEL.to_string(), "true".to_string())]);
    node.status = status;
    node.status.sync_ready(fleet.now());
    match fleet.nodes.create(&node).await {
        Ok(node) => orphan_event(fleet, &node, &error).await,
        Err(err) => tracing::warn!(node = name, %err, "fleet recovery: reporting an orphan failed"),
    }
}

/// The `OrphanFound` Warning Event about the orphan `node`.
async fn orphan_event(fleet: &Fleet, node: &Node, message: &str) {
    let recorder = crate::client::events::Recorder::new(fleet.store.clone(), "hive-fleet");
    let recorded = recorder.record(node, EventType::Warning, "OrphanFound", message).await;
    if let Err(err) = recorded {
        tracing::warn!(node = node.metadata.name, %err, "fleet recovery: the orphan's Event was not recorded");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hive_api::node::ProviderRef;

    #[test]
    fn orphan_names_are_stable_and_short() {
        let found = |c: Option<&str>, i: Option<u64>| Found {
            node: None,
            logical_id: None,
            command: None,
            reference: ProviderRef { container_id: c.map(str::to_string), instance_id: i, pid: None },
            running: true,
            state: "running".into(),
        };
        assert_eq!(
            orphan_name("docker", &found(Some("0123456789abcdef0123"), None)),
            "orphan-docker-0123456789ab"
        );
        assert_eq!(orphan_name("vastai", &found(None, Some(4242))), "orphan-vastai-4242");
    }
}
