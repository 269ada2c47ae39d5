//! Executing a claimed command (see `intake.rs`), once: Provision creates each node at its provider,
//! waits for its worker to join and for its telemetry to flow (Running); Kill destroys
//! the node's resource and keeps its record (Killed). What a create or destroy does is
//! the node's [`Provider`]'s business; this file only sequences it.

use std::sync::Arc;
use std::time::Duration;

use hive_api::fleet_command::FleetCommandPhase;
use hive_api::meta::{set_condition, Condition, ConditionStatus};
use hive_api::node::{Node, NodePhase, ProviderRef};
use hive_api::provider::{Provider as ProviderObject, ProviderSpec};

use super::error::{Error, Result};
use super::intake::Claimed;
use super::providers::{Launch, Lifetime, Provider};
use super::{command_result, commands, is_terminal, retained, Fleet};
use crate::client::Api;

/// Runs the provider work of a command this run claimed (it is Running: the claim wrote
/// that), once: only the claim makes a [`Claimed`].
pub(super) async fn execute(fleet: Arc<Fleet>, claimed: Claimed) {
    let command = claimed.command();
    let name = command.metadata.name.clone();
    let result = if command.spec.provision.is_some() {
        let runs = command.status.nodes.iter().map(|node| provision(fleet.clone(), node.clone()));
        let errors: Vec<Error> =
            futures_util::future::join_all(runs).await.into_iter().filter_map(Result::err).collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Nodes(errors))
        }
    } else if let Some(kill) = &command.spec.kill {
        kill_node(&fleet, &kill.node).await
    } else {
        Err(Error::EmptyCommand)
    };
    let now = fleet.now();
    fleet
        .command_status(&name, |s| {
            s.phase = Some(command_result(&result));
            if let Err(err) = &result {
                s.error = Some(err.to_string());
            }
            s.finished_at = Some(now);
        })
        .await;
    tracing::info!(command = name, action = command.action(), ok = result.is_ok(), "fleet command done");
}

/// Commands a previous run left Pending or Running: Failed (their nodes are recovered
/// one by one; the command is not re-run).
pub(super) async fn fail_interrupted_commands(fleet: &Fleet) {
    fail_unfinished_commands(fleet, "the daemon restarted while it ran").await;
}

/// Every non-terminal command becomes Failed with `why`, whether its object is still
/// there or only its retained record is (it was deleted while it ran).
pub(super) async fn fail_unfinished_commands(fleet: &Fleet, why: &str) {
    let (_, mut commands) = fleet.commands.list();
    let listed: std::collections::HashSet<String> =
        commands.iter().map(|c| c.metadata.name.clone()).collect();
    commands.extend(retained::list(&fleet.store).into_iter().filter(|c| !listed.contains(&c.metadata.name)));
    let now = fleet.now();
    for command in commands {
        if command.status.phase.is_none_or(FleetCommandPhase::is_terminal) {
            continue;
        }
        fleet
            .command_status(&command.metadata.name, |s| {
                s.phase = Some(FleetCommandPhase::Failed);
                s.error = Some(format!("interrupted: {why}; its nodes keep their own phases"));
                s.finished_at = Some(now);
            })
            .await;
    }
}

/// Whether a Kill names `node` (or its record is gone).
fn kill_requested(fleet: &Fleet, node: &str) -> bool {
    match fleet.nodes.get(node) {
        Ok(node) => node.is_none_or(|n| n.metadata.annotations.contains_key(commands::KILLED_BY)),
        // Not decodable as a Node: nothing is known to say it was not killed.
        Err(_) => fleet.nodes.get_raw(node).is_none(),
    }
}

/// Marks `node` Failed with `error`, unless a Kill got there first (Killing, Killed):
/// a kill's outcome is never overwritten by the create it interrupted. Returns `error`.
async fn fail_node(fleet: &Fleet, node: &str, error: Error) -> Error {
    let error = Error::node(node, error);
    let text = error.to_string();
    let now = fleet.now();
    fleet
        .node_status(node, |s| {
            if matches!(s.phase, Some(NodePhase::Killing | NodePhase::Killed)) {
                return;
            }
            s.phase = Some(NodePhase::Failed);
            s.error = Some(text.clone());
            s.finished_at = Some(now);
        })
        .await;
    error
}

/// The node `name` as stored; a missing or undecodable one is an error naming it.
fn load_node(fleet: &Fleet, name: &str) -> Result<Node> {
    match fleet.nodes.get(name) {
        Ok(Some(node)) => Ok(node),
        Ok(None) => Err(Error::node(name, Error::NoSuchNode)),
        Err(err) => Err(Error::node(name, err.into())),
    }
}

/// The spec of Provider `name` as stored now, if it exists (and decodes).
fn provider_spec(fleet: &Fleet, name: &str) -> Option<ProviderSpec> {
    match Api::<ProviderObject>::new(&fleet.store).get(name) {
        Ok(provider) => provider.map(|p| p.spec),
        Err(err) => {
            tracing::warn!(provider = name, %err, "a Provider that does not decode has no settings");
            None
        }
    }
}

/// Issues the node's join token and creates its resource at `provider`.
async fn create(fleet: &Fleet, node: &Node, provider: &dyn Provider) -> Result<super::providers::Created> {
    // The worker proves it is this node's with a token only it is given; the hash is
    // durable before the resource exists, so a rejoin after a restart is checked too.
    let token = super::members::issue_token(&fleet.store, &node.metadata.name).await?;
    let spec = provider_spec(fleet, &node.spec.provider);
    let launch = Launch {
        node,
        token: &token,
        spec: spec.as_ref(),
        net: &fleet.net,
        fleet_label: &fleet.fleet_label,
        run_id: &fleet.run_id,
        advertise: &fleet.config.net.advertise,
        docker_network: &fleet.config.docker_network,
    };
    provider.create(&launch).await
}

/// Creates one node at its provider, waits until its worker joined and its telemetry
/// flows, and marks it Running.
async fn provision(fleet: Arc<Fleet>, name: String) -> Result<()> {
    if kill_requested(&fleet, &name) {
        return Err(Error::node(&name, Error::KilledBeforeCreate));
    }
    let node = load_node(&fleet, &name)?;
    let Some(type_) = commands::provider_type(&fleet.store, &node.spec.provider) else {
        let error = Error::ProviderMissing { provider: node.spec.provider.clone() };
        return Err(fail_node(&fleet, &name, error).await);
    };
    let joined = fleet.await_join(&name);
    fleet
        .node_status(&name, |s| {
            if s.phase == Some(NodePhase::Pending) {
                s.phase = Some(NodePhase::Provisioning);
            }
        })
        .await;
    let provider = match fleet.providers.checked(&node.spec.provider, type_).await {
        Ok(provider) => provider,
        Err(error) => return Err(fail_node(&fleet, &name, error).await),
    };
    let created = match create(&fleet, &node, provider.as_ref()).await {
        Ok(created) => created,
        Err(error) => return Err(fail_node(&fleet, &name, error).await),
    };
    let reference = created.reference;
    let now = fleet.now();
    fleet
        .node_status(&name, |s| {
            s.provider_ref = Some(reference.clone());
            s.provisioned_at = Some(now);
        })
        .await;
    if kill_requested(&fleet, &name) {
        // A Kill arrived while the resource was being created; its executor may have
        // found nothing to destroy yet. The resource is recorded now: destroy it.
        return kill_node(&fleet, &name).await;
    }
    // A local worker that dies before it joins ends the wait at once. (Its ready line
    // comes after the Welcome, so a printed one is no exit.)
    let ready = created.ready;
    let exited = async move {
        if let Some(ready) = ready {
            if ready.await.is_err() {
                return;
            }
        }
        std::future::pending::<()>().await
    };
    let lifetime = provider.lifetime();
    let timeout = fleet.config.join_timeout.unwrap_or(created.join_timeout);
    let outcome = tokio::select! {
        biased;
        joined = joined => joined.map_err(|_| Error::JoinWaiterDropped),
        () = exited => Err(Error::ExitedBeforeJoin),
        () = killed(&fleet, &name) => Err(Error::KilledWhileJoining),
        () = tokio::time::sleep(timeout) => Err(Error::JoinTimeout {
            after: timeout,
            left_running: lifetime == Lifetime::Detached,
        }),
    };
    fleet.members.forget_waiter(&name);
    if kill_requested(&fleet, &name) {
        // A Kill raced the create; its executor may have found no resource yet.
        return kill_node(&fleet, &name).await;
    }
    if let Err(error) = outcome {
        if lifetime == Lifetime::Supervised {
            // Nothing could reach or adopt a worker that never joined: stop it.
            if let Err(err) = provider.destroy(&name, &reference).await {
                tracing::warn!(node = name, %err, "stopping a worker that did not join failed");
            }
        }
        return Err(fail_node(&fleet, &name, error).await);
    }
    match start_telemetry(&fleet, &name).await {
        Ok(()) => Ok(()),
        // The node's end (a Kill, a delete, its worker's exit) has said why already.
        Err(error) if ended(&fleet, &name).is_some() => Err(error),
        Err(error) => Err(fail_node(&fleet, &name, error).await),
    }
}

/// Resolves once a Kill names `name` (checked twice a second).
async fn killed(fleet: &Fleet, name: &str) {
    while !kill_requested(fleet, name) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The Node condition that says whether a joined node's telemetry flows.
pub const TELEMETRY_CONDITION: &str = "Telemetry";

/// A [`TELEMETRY_CONDITION`].
fn telemetry(flowing: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: TELEMETRY_CONDITION.into(),
        status: if flowing { ConditionStatus::True } else { ConditionStatus::False },
        reason: reason.into(),
        message: message.into(),
        last_transition_time: None,
        observed_generation: None,
    }
}

/// Why a node's telemetry wait ended without descriptors, if it did.
fn ended(fleet: &Fleet, name: &str) -> Option<Error> {
    let node = fleet.nodes.get(name).ok().flatten();
    if node.as_ref().is_none_or(|n| !is_live(n)) || kill_requested(fleet, name) {
        let phase = node.and_then(|n| n.status.phase).map_or("gone", NodePhase::as_str);
        return Some(Error::EndedWhileFollowing { phase: phase.to_string() });
    }
    None
}

/// Resolves once [`ended`] says why (checked twice a second).
async fn end_of(fleet: &Fleet, name: &str) -> Error {
    loop {
        if let Some(why) = ended(fleet, name) {
            return why;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Pulls `name`'s telemetry from the endpoint its worker joined with, for the node's
/// lifetime; once the first descriptors arrived the node is Running. A worker slow to
/// describe its channels is slow, not failed: each attempt waits
/// `--fleet-telemetry-wait`, the pull is retried with backoff, and meanwhile the node
/// stays Provisioning with its [`TELEMETRY_CONDITION`] saying so. The wait ends early
/// only when the node ends (killed, deleted, its worker exited).
pub(super) async fn start_telemetry(fleet: &Fleet, name: &str) -> Result<()> {
    let node = load_node(fleet, name)?;
    let endpoint = node.status.endpoint_id.clone().unwrap_or_default();
    let addresses = node.status.addresses.iter().filter_map(|a| a.parse().ok()).collect();
    let wait = fleet.config.telemetry_wait;
    let mut first = match fleet.net.start_following(name, &endpoint, addresses, wait) {
        Ok(first) => first,
        Err(error) => {
            let error = Error::node(name, Error::NoTelemetry(error));
            let text = error.to_string();
            fleet.node_status(name, |s| s.error = Some(text.clone())).await;
            return Err(error);
        }
    };
    let mut waited = false;
    let flowing = loop {
        tokio::select! {
            biased;
            first = &mut first => break first.is_ok(),
            why = end_of(fleet, name) => {
                fleet.net.forget(name);
                return Err(Error::node(name, why));
            }
            () = tokio::time::sleep(wait) => {
                if !waited {
                    waited = true;
                    let message = format!(
                        "the worker joined; its telemetry has not flowed within {wait:?}; \
                         the pull is retried with backoff"
                    );
                    tracing::info!(node = name, ?wait, "fleet node waits for its telemetry");
                    let condition = telemetry(false, "WaitingForTelemetry", &message);
                    let now = fleet.now();
                    fleet.node_status(name, |s| {
                        set_condition(&mut s.conditions, condition.clone(), now);
                    })
                    .await;
                }
            }
        }
    };
    // A Kill (or a delete) may have come while the pull was being set up: its forget ran
    // before this follower existed, so stop the follower here.
    if let Some(why) = ended(fleet, name) {
        fleet.net.forget(name);
        return Err(Error::node(name, why));
    }
    if !flowing {
        // A newer pull (a rejoin's) replaced this one: it makes the node Running.
        return await_running(fleet, name).await;
    }
    let now = fleet.now();
    let condition = telemetry(true, "Flowing", "the worker's telemetry flows");
    fleet
        .node_status(name, |s| {
            if matches!(s.phase, Some(NodePhase::Provisioning | NodePhase::Running)) {
                if s.phase == Some(NodePhase::Provisioning) {
                    s.ready_at = Some(now);
                }
                s.phase = Some(NodePhase::Running);
                s.error = None;
                set_condition(&mut s.conditions, condition.clone(), now);
            }
        })
        .await;
    tracing::info!(node = name, "fleet node ready: joined, telemetry flowing");
    Ok(())
}

/// Resolves once `name` is Running (a newer telemetry pull got there), or errs once it
/// ended.
async fn await_running(fleet: &Fleet, name: &str) -> Result<()> {
    loop {
        if let Some(why) = ended(fleet, name) {
            return Err(Error::node(name, why));
        }
        let phase = fleet.nodes.get(name).ok().flatten().and_then(|n| n.status.phase);
        if phase == Some(NodePhase::Running) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The resource a node's record names at a provider that outlives the daemon: a
/// container id or `instance N`.
fn detached_resource(reference: &ProviderRef) -> Option<String> {
    reference.container_id.clone().or_else(|| reference.instance_id.map(|id| format!("instance {id}")))
}

/// Destroys `node`'s resource `reference` at its provider; says what was done.
async fn destroy(fleet: &Fleet, node: &Node, reference: &ProviderRef) -> Result<String> {
    let name = &node.metadata.name;
    let provider = &node.spec.provider;
    match commands::provider_type(&fleet.store, provider) {
        None => match detached_resource(reference) {
            Some(resource) => Err(Error::ProviderGoneWithResource { provider: provider.clone(), resource }),
            // Only a local worker can be left of a node whose Provider is gone.
            None => fleet.providers.local().destroy(name, reference).await,
        },
        Some(type_) => match fleet.providers.ready(provider, type_) {
            Ok(implementation) => implementation.destroy(name, reference).await,
            // Nothing was created there, so there is nothing to destroy, ready or not.
            Err(_) if detached_resource(reference).is_none() => Ok("no resource was created".into()),
            Err(err) => Err(err),
        },
    }
}

/// Destroys one node's resource (if it still has one) and marks it Killed, keeping its
/// record. A Kill and the Provision it interrupted may both get here for one node: they
/// take turns, and the second destroys only a resource the first did not (the Provision
/// may have recorded it after the Kill looked), so a provider sees one destroy per
/// resource.
pub(super) async fn kill_node(fleet: &Fleet, name: &str) -> Result<()> {
    let turn = fleet.kill_turn(name);
    let mut destroyed = turn.lock().await;
    let node = load_node(fleet, name)?;
    if node.status.phase == Some(NodePhase::Killed) && destroyed.as_ref() == Some(&node.status.provider_ref) {
        tracing::info!(node = name, "fleet node already killed");
        return Ok(());
    }
    let result = kill_loaded(fleet, node).await;
    if let Ok(reference) = &result {
        *destroyed = Some(reference.clone());
    }
    result.map(|_| ())
}

/// [`kill_node`] of `node` as loaded; returns the reference it destroyed.
async fn kill_loaded(fleet: &Fleet, node: Node) -> Result<Option<ProviderRef>> {
    let name = node.metadata.name.as_str();
    let was = node.status.phase;
    if was != Some(NodePhase::Killed) {
        fleet.node_status(name, |s| s.phase = Some(NodePhase::Killing)).await;
    }
    fleet.net.forget(name);
    let reference = node.status.provider_ref.clone().unwrap_or_default();
    match destroy(fleet, &node, &reference).await {
        Ok(what) => {
            let now = fleet.now();
            fleet
                .node_status(name, |s| {
                    s.phase = Some(NodePhase::Killed);
                    if !is_terminal(was) || s.finished_at.is_none() {
                        s.finished_at = Some(now);
                    }
                })
                .await;
            tracing::info!(node = name, what, "fleet node killed");
            Ok(node.status.provider_ref.clone())
        }
        Err(why) => {
            let error = Error::node(name, Error::Destroy(Box::new(why)));
            let text = error.to_string();
            fleet
                .node_status(name, |s| {
                    if s.phase == Some(NodePhase::Killing) {
                        s.phase = Some(was.unwrap_or(NodePhase::Failed));
                    }
                    s.error = Some(text.clone());
                })
                .await;
            Err(error)
        }
    }
}

/// Whether `node` is still live: not in a terminal phase.
pub fn is_live(node: &Node) -> bool {
    node.status.phase.is_some() && !is_terminal(node.status.phase)
}
