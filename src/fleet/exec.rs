//! Executing a recorded command, once: Provision creates each node at its provider,
//! waits for its worker to join and for its telemetry to flow (Running); Kill destroys
//! the node's resource and keeps its record (Killed).

use std::sync::Arc;
use std::time::Duration;

use hive_api::fleet_command::{FleetCommand, FleetCommandPhase};
use hive_api::node::{Node, NodePhase, ProviderRef};
use hive_api::provider::{Provider, ProviderSpec, ProviderType};

use crate::client::Api;

use super::providers::docker::NodeRequest;
use super::providers::vastai::{instance_label, CreateRequest, InstanceId, DEFAULT_DISK_GB};
use super::{command_result, commands, is_terminal, Fleet};
use super::{DOCKER_READY_TIMEOUT, PROCESS_READY_TIMEOUT, VASTAI_READY_TIMEOUT};

/// The environment variable that gives a worker its node's join token.
pub const JOIN_TOKEN_ENV: &str = "HIVE_JOIN_TOKEN";

/// How long a command waits for its provider's first check after the daemon started.
pub const PROVIDER_CHECK_WAIT: Duration = Duration::from_secs(30);

/// How long the first telemetry descriptors may take after a worker joined.
pub const TELEMETRY_TIMEOUT: Duration = Duration::from_secs(15);

/// The on-start script of Vast.ai nodes when neither the command nor the Provider gives
/// one: the image's `hive` runs the worker, configured by the instance's environment.
pub const DEFAULT_ONSTART: &str = "exec hive fleet-worker --supervise none";

/// Serializes creating Docker networks in this daemon.
static NETWORKS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs the provider work of a newly recorded command, once.
pub(super) async fn execute(fleet: Arc<Fleet>, command: FleetCommand) {
    let name = command.metadata.name.clone();
    match command.status.phase {
        Some(FleetCommandPhase::Pending) => {}
        // Created by a write that bypassed POST (apply, PUT): it recorded no node
        // intent, so it is left as it is, inert.
        None => {
            tracing::warn!(command = name, "fleet command not created by POST: not run");
            let now = fleet.now();
            fleet
                .command_status(&name, |s| {
                    s.phase = Some(FleetCommandPhase::Failed);
                    s.error = Some(
                        "not run: a fleet command runs only when created with POST (hive fleet, the API's \
                         create), which records its node intents first; this one was written by apply or PUT"
                            .into(),
                    );
                    s.finished_at = Some(now);
                })
                .await;
            return;
        }
        Some(_) => return,
    }
    let now = fleet.now();
    fleet
        .command_status(&name, |s| {
            s.phase = Some(FleetCommandPhase::Running);
            s.started_at = Some(now);
        })
        .await;
    let result = if command.spec.provision.is_some() {
        let runs = command.status.nodes.iter().map(|node| provision(fleet.clone(), node.clone()));
        let errors: Vec<String> =
            futures_util::future::join_all(runs).await.into_iter().filter_map(Result::err).collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    } else if let Some(kill) = &command.spec.kill {
        kill_node(&fleet, &kill.node).await
    } else {
        Err("neither provision nor kill is set".to_string())
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

/// Every non-terminal command becomes Failed with `why`.
pub(super) async fn fail_unfinished_commands(fleet: &Fleet, why: &str) {
    let (_, commands) = fleet.commands.list();
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
/// a kill's outcome is never overwritten by the create it interrupted.
async fn fail_node(fleet: &Fleet, node: &str, error: &str) {
    let now = fleet.now();
    fleet
        .node_status(node, |s| {
            if matches!(s.phase, Some(NodePhase::Killing | NodePhase::Killed)) {
                return;
            }
            s.phase = Some(NodePhase::Failed);
            s.error = Some(error.to_string());
            s.finished_at = Some(now);
        })
        .await;
}

fn load_node(fleet: &Fleet, name: &str) -> Result<Node, String> {
    match fleet.nodes.get(name) {
        Ok(Some(node)) => Ok(node),
        Ok(None) => Err(format!("{name}: no such node")),
        Err(e) => Err(format!("{name}: undecodable node: {e}")),
    }
}

/// Creates one node at its provider, waits until its worker joined and its telemetry
/// flows, and marks it Running.
async fn provision(fleet: Arc<Fleet>, name: String) -> Result<(), String> {
    if kill_requested(&fleet, &name) {
        return Err(format!("{name}: killed before it was created"));
    }
    let node = load_node(&fleet, &name)?;
    let Some(type_) = commands::provider_type(&fleet.store, &node.spec.provider) else {
        let error = format!("{name}: the provider {:?} no longer exists", node.spec.provider);
        fail_node(&fleet, &name, &error).await;
        return Err(error);
    };
    let joined = fleet.await_join(&name);
    fleet
        .node_status(&name, |s| {
            if s.phase == Some(NodePhase::Pending) {
                s.phase = Some(NodePhase::Provisioning);
            }
        })
        .await;
    // The worker proves it is this node's with a token only it is given; the hash is
    // durable before the resource exists, so a rejoin after a restart is checked too.
    let created = match super::members::issue_token(&fleet.store, &name).await {
        Err(error) => Err(error),
        Ok(token) => match type_ {
            ProviderType::Process => create_process(&fleet, &node, &token).await,
            ProviderType::Docker => create_container(&fleet, &node, &token).await,
            ProviderType::Vastai => create_instance(&fleet, &node, &token).await,
        },
    };
    let (reference, exited, timeout) = match created {
        Ok(created) => created,
        Err(error) => {
            let error = format!("{name}: {error}");
            fail_node(&fleet, &name, &error).await;
            return Err(error);
        }
    };
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
    let exited = async move {
        if let Some(ready) = exited {
            if ready.await.is_err() {
                return;
            }
        }
        std::future::pending::<()>().await
    };
    let outcome = tokio::select! {
        biased;
        joined = joined => joined.map_err(|_| format!("{name}: the join waiter was dropped")),
        () = exited => Err(format!("{name}: the worker exited before it joined")),
        () = killed(&fleet, &name) => Err(format!("{name}: killed while waiting for its worker")),
        () = tokio::time::sleep(timeout) => Err(format!(
            "{name}: the worker did not join within {}s{}",
            timeout.as_secs(),
            if type_ == ProviderType::Process { "" } else { "; its resource is left as it is: kill the node to remove it" }
        )),
    };
    fleet.members.forget_waiter(&name);
    if kill_requested(&fleet, &name) {
        // A Kill raced the create; its executor may have found no resource yet.
        return kill_node(&fleet, &name).await;
    }
    if let Err(error) = outcome {
        if type_ == ProviderType::Process {
            fleet.process.stop(&name).await;
        }
        fail_node(&fleet, &name, &error).await;
        return Err(error);
    }
    if let Err(error) = start_telemetry(&fleet, &name).await {
        fail_node(&fleet, &name, &error).await;
        return Err(error);
    }
    Ok(())
}

/// Resolves once a Kill names `name` (checked twice a second).
async fn killed(fleet: &Fleet, name: &str) {
    while !kill_requested(fleet, name) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Pulls `name`'s telemetry from the endpoint its worker joined with; once the first
/// descriptors arrived the node is Running.
pub(super) async fn start_telemetry(fleet: &Fleet, name: &str) -> Result<(), String> {
    let node = load_node(fleet, name)?;
    let endpoint = node.status.endpoint_id.clone().unwrap_or_default();
    let addresses = node.status.addresses.iter().filter_map(|a| a.parse().ok()).collect();
    let followed = fleet.net.follow_telemetry(name, &endpoint, addresses, TELEMETRY_TIMEOUT).await;
    // A Kill (or a delete) may have come while the pull was being set up: its forget ran
    // before this follower existed, so stop the follower here.
    let gone =
        fleet.nodes.get(name).ok().flatten().is_none_or(|n| !is_live(&n) || kill_requested(fleet, name));
    if gone {
        fleet.net.forget(name);
        return Err(format!("{name}: killed or stopped while its telemetry pull started"));
    }
    if let Err(error) = followed {
        fleet.net.forget(name);
        let error = format!("{name}: the worker joined but serves no telemetry: {error}");
        fleet.node_status(name, |s| s.error = Some(error.clone())).await;
        return Err(error);
    }
    let now = fleet.now();
    fleet
        .node_status(name, |s| {
            if matches!(s.phase, Some(NodePhase::Provisioning | NodePhase::Running)) {
                if s.phase == Some(NodePhase::Provisioning) {
                    s.ready_at = Some(now);
                }
                s.phase = Some(NodePhase::Running);
                s.error = None;
            }
        })
        .await;
    tracing::info!(node = name, "fleet node ready: joined, telemetry flowing");
    Ok(())
}

type Created = (ProviderRef, Option<tokio::sync::oneshot::Receiver<()>>, Duration);

fn worker_args(node: &Node, control: String) -> Vec<String> {
    vec!["--logical-id".into(), node.spec.logical_id.to_string(), "--control".into(), control]
}

async fn create_process(fleet: &Fleet, node: &Node, token: &str) -> Result<Created, String> {
    let control = fleet.net.control_target(None);
    let mut args = worker_args(node, control);
    if fleet.net.bound_addrs().iter().all(|a| a.ip().is_loopback()) {
        // A daemon on loopback keeps its local workers there too.
        args.extend(["--bind".into(), "127.0.0.1:0".into()]);
    }
    let mut settings = provider_spec(fleet, &node.spec.provider)
        .map(|spec| spec.process.unwrap_or_default())
        .unwrap_or_default();
    settings.env.insert(JOIN_TOKEN_ENV.into(), token.into());
    let spawned = fleet
        .process
        .spawn(&node.metadata.name, &args, &settings)
        .map_err(|e| format!("starting the worker failed: {e}"))?;
    Ok((
        ProviderRef { pid: Some(spawned.pid), ..Default::default() },
        Some(spawned.ready),
        PROCESS_READY_TIMEOUT,
    ))
}

/// The image of a node: the command's, else the provider's.
fn image_of(node: &Node, provider_default: Option<&str>) -> Result<String, String> {
    node.spec
        .image
        .clone()
        .or_else(|| provider_default.map(str::to_string))
        .filter(|i| !i.trim().is_empty())
        .ok_or_else(|| {
            format!("no image: neither the command nor Provider {:?} names one", node.spec.provider)
        })
}

fn provider_spec(fleet: &Fleet, name: &str) -> Result<ProviderSpec, String> {
    match Api::<Provider>::new(&fleet.store).get(name) {
        Ok(Some(provider)) => Ok(provider.spec),
        Ok(None) => Err(format!("the Provider {name:?} is gone")),
        Err(e) => Err(format!("Provider {name:?}: {e}")),
    }
}

/// Waits (boundedly) until the provider controller checked `provider` once: a command
/// that arrives right after the daemon started must not fail for being early.
async fn checked(fleet: &Fleet, provider: &str) {
    let deadline = tokio::time::Instant::now() + PROVIDER_CHECK_WAIT;
    while fleet.providers.get(provider).is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create_container(fleet: &Fleet, node: &Node, token: &str) -> Result<Created, String> {
    let provider = &node.spec.provider;
    checked(fleet, provider).await;
    let docker = fleet.providers.docker(provider)?;
    let settings = provider_spec(fleet, provider)?.docker.unwrap_or_default();
    let network_name = settings.network.clone().unwrap_or_else(|| fleet.config.docker_network.clone());
    // The engine allows two networks of one name: concurrent creates must not race.
    let network = {
        let _serial = NETWORKS.lock().await;
        docker.ensure_network(&network_name).await.map_err(|e| e.to_string())?
    };
    if fleet.net.bound_addrs().iter().all(|a| a.ip().is_loopback()) {
        return Err("the fleet endpoint listens on loopback only, where containers cannot reach it: start \
                    hive serve with --fleet-listen 0.0.0.0:PORT"
            .into());
    }
    let Some(gateway) = network.gateway else {
        return Err(format!(
            "the Docker network {network_name:?} has no gateway for nodes to reach the daemon at"
        ));
    };
    let mut cmd =
        vec!["hive".to_string(), "fleet-worker".into(), "--node".into(), node.metadata.name.clone()];
    cmd.extend(worker_args(node, fleet.net.control_target(Some(gateway))));
    cmd.extend(["--supervise".into(), "none".into()]);
    let request = NodeRequest {
        fleet: fleet.fleet_label.clone(),
        run_id: fleet.run_id.clone(),
        node: node.metadata.name.clone(),
        logical_id: node.spec.logical_id,
        command: node.spec.command.clone().unwrap_or_default(),
        image: image_of(node, Some(&settings.image))?,
        cmd,
        env: vec![("MYELIN_AGENT_ONLY".into(), "1".into()), (JOIN_TOKEN_ENV.into(), token.into())],
        network: Some(network_name),
        gpus: settings.gpus.clone(),
        keep_stdin_open: false,
    };
    let id = docker.create_node(&request).await.map_err(|e| e.to_string())?;
    Ok((ProviderRef { container_id: Some(id), ..Default::default() }, None, DOCKER_READY_TIMEOUT))
}

async fn create_instance(fleet: &Fleet, node: &Node, token: &str) -> Result<Created, String> {
    let provider = &node.spec.provider;
    checked(fleet, provider).await;
    let client = fleet.providers.vast(provider)?;
    let settings = provider_spec(fleet, provider)?.vastai.unwrap_or_default();
    let Some(offer) = node.spec.offer_id else {
        return Err("no selected offer recorded for this node".into());
    };
    let control = match fleet.config.advertise {
        Some(addr) => format!("{}@{addr}", fleet.net.endpoint_id()),
        None => fleet.net.control_target(None),
    };
    // hive:<fleet>:<command>:<node>: the fleet label keeps two daemons sharing one Vast.ai
    // account out of each other's recovery.
    let scoped = format!("{}:{}", fleet.fleet_label, node.spec.command.as_deref().unwrap_or_default());
    let label = instance_label(&scoped, &node.metadata.name);
    let onstart =
        node.spec.bootstrap.clone().or(settings.onstart.clone()).unwrap_or_else(|| DEFAULT_ONSTART.into());
    let mut request =
        CreateRequest::new(offer, label, image_of(node, settings.image.as_deref())?, Some(onstart));
    request.disk_gb = settings.disk_gb.unwrap_or(DEFAULT_DISK_GB);
    request.env = [
        ("MYELIN_AGENT_ONLY", "1".to_string()),
        ("HIVE_NODE", node.metadata.name.clone()),
        ("HIVE_LOGICAL_ID", node.spec.logical_id.to_string()),
        ("HIVE_CONTROL", control),
        (JOIN_TOKEN_ENV, token.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let created = client.create_instance(&request).await.map_err(|e| e.to_string())?;
    if !created.duplicates.is_empty() {
        tracing::warn!(node = node.metadata.name, duplicates = ?created.duplicates, "vast.ai: other instances carry this node's label; left alone");
    }
    Ok((ProviderRef { instance_id: Some(created.id.0), ..Default::default() }, None, VASTAI_READY_TIMEOUT))
}

/// Destroys one node's resource (if it still has one) and marks it Killed, keeping its
/// record.
pub(super) async fn kill_node(fleet: &Fleet, name: &str) -> Result<(), String> {
    let node = load_node(fleet, name)?;
    let was = node.status.phase;
    if was != Some(NodePhase::Killed) {
        fleet.node_status(name, |s| s.phase = Some(NodePhase::Killing)).await;
    }
    fleet.net.forget(name);
    let reference = node.status.provider_ref.clone().unwrap_or_default();
    let destroyed: Result<String, String> = match commands::provider_type(&fleet.store, &node.spec.provider) {
        None if reference.container_id.is_some() || reference.instance_id.is_some() => Err(format!(
            "the Provider {:?} no longer exists, so its resource ({}) cannot be destroyed; recreate the \
             Provider and kill the node again",
            node.spec.provider,
            reference
                .container_id
                .clone()
                .unwrap_or_else(|| format!("instance {}", reference.instance_id.unwrap_or(0)))
        )),
        Some(ProviderType::Process) | None => {
            Ok(format!("worker stopped: {}", fleet.process.stop(name).await))
        }
        Some(ProviderType::Docker) => match &reference.container_id {
            None => Ok("no container".into()),
            Some(id) => match fleet.providers.docker(&node.spec.provider) {
                Ok(docker) => docker
                    .destroy(id)
                    .await
                    .map(|()| format!("container {id} removed"))
                    .map_err(|e| e.to_string()),
                Err(why) => Err(why),
            },
        },
        Some(ProviderType::Vastai) => match reference.instance_id {
            None => Ok("no instance".into()),
            Some(id) => match fleet.providers.vast(&node.spec.provider) {
                Ok(client) => client
                    .destroy(InstanceId(id))
                    .await
                    .map(|outcome| format!("instance {id}: {outcome:?}"))
                    .map_err(|e| e.to_string()),
                Err(why) => Err(why),
            },
        },
    };
    match destroyed {
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
            Ok(())
        }
        Err(why) => {
            let error = format!("{name}: destroying its resource failed: {why}");
            fleet
                .node_status(name, |s| {
                    if s.phase == Some(NodePhase::Killing) {
                        s.phase = Some(was.unwrap_or(NodePhase::Failed));
                    }
                    s.error = Some(error.clone());
                })
                .await;
            Err(error)
        }
    }
}

/// Whether `node` is still live: not in a terminal phase.
pub(super) fn is_live(node: &Node) -> bool {
    node.status.phase.is_some() && !is_terminal(node.status.phase)
}
