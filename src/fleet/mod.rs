//! The fleet (Myelin): explicit, idempotent Provision and Kill commands over node
//! providers. No reconciler: nothing is created, replaced or torn down unless a
//! FleetCommand says so.
//!
//! - `identity.rs`: the daemon's durable iroh secret key in the state directory.
//! - `commands.rs`: the one record of a command, whatever created it — `POST
//!   fleetcommands`, or the intake below for `hive apply`, `kubectl apply`, server-side
//!   apply: the command and the Node intents it causes are recorded before any provider
//!   call; a used command id answers its original record and never runs again.
//! - `intents.rs`: a Provision's Node intents, derived from its record and written in
//!   groups the store takes in one transaction (etcd's limits): the part that did not fit
//!   the recording's first transaction, by the recording and again by the claim, so a
//!   command runs only once every node it names exists.
//! - `retained.rs`: the retained record of every command id, written as it is recorded:
//!   the tombstone a deleted command leaves, so its id is never reused.
//! - `providers/`: what creates and destroys nodes (`process`, `docker`, `vastai`) and
//!   the registry of their readiness; `status.rs` writes it to each Provider.
//! - `net/`: the iroh layer — the daemon's control ALPN (Join / RejoinHello, the
//!   `myelin.manual-control` binding) and the telemetry ALPN each worker serves and the
//!   daemon pulls.
//! - `intake.rs`: the FleetCommand controller: a command stored unrecorded (empty
//!   status) is recorded (`commands::intake`); a recorded Pending one is claimed by a
//!   compare-and-swap that moves it to Running and names this run in `status.claim`, and
//!   only the claimer runs it.
//! - `exec.rs`: runs a claimed command's provider work, once.
//! - `members.rs`: persists a worker's Join / RejoinHello before it is welcomed, and
//!   starts the node's telemetry pull; `server/telemetry.rs` serves that telemetry.
//! - `recovery.rs`: at start, provider state is ground truth — a record with its
//!   resource is adopted (whatever its phase but Killed), a record without one is marked
//!   Stopped, a resource without a record (or labelled by an identity `--reset-state`
//!   retired) is reported as an `Orphaned` node and left alone.
//! - `api.rs`: SearchOffers and ConfigureProvider.
//!
//! Shutdown stops local worker processes and clears their records (they cannot be
//! adopted); Docker containers and Vast.ai instances are left running for the next
//! daemon to adopt.

pub mod commands;
pub mod error;
mod exec;
pub mod identity;
mod intake;
mod intents;
mod members;
pub mod net;
pub mod providers;
mod recovery;
pub mod remote;
mod retained;
pub mod service;
pub mod status;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use hive_api::fleet_command::{FleetCommand, FleetCommandPhase, FleetCommandStatus};
use hive_api::meta::Time;
use hive_api::node::{Node, NodePhase, NodeStatus};
use hive_api::provider::{DockerProvider, ProviderSpec, ProviderType, VastaiProvider};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use futures_util::StreamExt as _;
use hive_controllers::watcher::Config as WatchConfig;
use hive_controllers::{watcher, Event};

use crate::client::{self, Api, Patched};
use crate::store::{Mutation, Store};
use providers::process::{Exit, ProcessProvider};
use providers::Providers;

pub use error::{Error, Result};
pub use exec::is_live;
pub use identity::Identity;

/// How long a new local worker may take to join.
pub const PROCESS_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a new container may take to join.
pub const DOCKER_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a new Vast.ai instance may take to join (image pull, boot, on-start).
pub const VASTAI_READY_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How often a followed node's telemetry summary is written to its status.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(2);

/// The providers `hive serve --provider` accepts: the default of commands that name none.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProviderChoice {
    /// Local worker processes supervised over their stdin pipe (the default).
    #[default]
    Process,
    /// Containers on the local Docker Engine (Provider `docker`).
    Docker,
    /// Leased Vast.ai instances (Provider `vastai`; starts Unconfigured without a key).
    Vastai,
}

impl ProviderChoice {
    /// The Provider's name and type.
    pub fn name(self) -> &'static str {
        match self {
            ProviderChoice::Process => "process",
            ProviderChoice::Docker => "docker",
            ProviderChoice::Vastai => "vastai",
        }
    }
}

/// How the fleet of this daemon run is set up (from `hive serve`'s flags).
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// The provider of commands that name none.
    pub default_provider: ProviderChoice,
    /// The daemon's iroh endpoint.
    pub net: net::NetConfig,
    /// How long one attempt to pull a joined node's telemetry waits for its first
    /// descriptors before it is retried (`--fleet-telemetry-wait`).
    pub telemetry_wait: Duration,
    /// How long a new node's worker may take to join (`--fleet-join-timeout`); `None`:
    /// the provider's own bound ([`PROCESS_READY_TIMEOUT`] and its siblings).
    pub join_timeout: Option<Duration>,
    /// The image of `docker` nodes when the Provider names none.
    pub docker_image: String,
    /// The Docker network of `docker` nodes when the Provider names none.
    pub docker_network: String,
    /// The Vast.ai API base URL of the built-in `vastai` Provider, when not the public API.
    pub vastai_base_url: Option<String>,
    /// Where Providers may take a Vast.ai key from on this host (`--provider-key-dir`,
    /// `--provider-key-env`, `--provider-base-url`).
    pub key_sources: providers::keys::KeySources,
    /// Where the Provider controller records its reconcile runs.
    pub controller_metrics: Arc<crate::metrics::ControllerMetrics>,
}

fn is_terminal(phase: Option<NodePhase>) -> bool {
    matches!(phase, Some(NodePhase::Stopped | NodePhase::Killed | NodePhase::Failed | NodePhase::Orphaned))
}

/// Loads (or creates) the daemon identity in `state_dir` and logs its public
/// fingerprint; with `reset`, deletes the old one first.
pub fn open_identity(state_dir: &Path, reset: bool) -> anyhow::Result<Identity> {
    if reset {
        Identity::reset(state_dir)?;
    }
    let (identity, created) = Identity::load_or_create(state_dir)?;
    tracing::info!(fingerprint = %identity.fingerprint(), created, "fleet identity loaded");
    Ok(identity)
}

/// The running fleet.
pub struct Fleet {
    store: Store,
    /// Every Node read and write.
    nodes: Api<Node>,
    /// Every FleetCommand read and write.
    commands: Api<FleetCommand>,
    /// Readiness and clients of every Provider.
    pub providers: Arc<Providers>,
    process: Arc<ProcessProvider>,
    net: Arc<net::FleetNet>,
    members: Arc<members::Membership>,
    config: FleetConfig,
    /// This daemon's stable provider label: its identity's fingerprint. Docker
    /// containers carry it, so two daemons on one engine never adopt each other's.
    fleet_label: String,
    /// This run's id (labels the containers it creates).
    run_id: String,
    /// The fleet labels of identities `--reset-state` retired: what they label is
    /// reported as orphans.
    retired_labels: Vec<String>,
    tasks: Mutex<JoinSet<()>>,
    /// Set once shutdown began: no command is claimed and no task starts after it.
    closing: AtomicBool,
    /// Providers whose resources were recovered in this run. (Process memory on purpose:
    /// recovery runs once per provider per run, whenever it is first found ready; which
    /// commands are this run's is durable, in their `status.claim`.)
    recovered: Mutex<HashSet<String>>,
    /// Nodes whose telemetry summary was written, by the frame time written last.
    summarized: Mutex<HashMap<String, Option<Time>>>,
    /// Per node, the turn of whoever kills it, holding the provider reference the last
    /// kill destroyed (see `exec::kill_node`).
    kills: Mutex<HashMap<String, KillTurn>>,
}

/// One node's kill turn: the reference its last kill destroyed, if one did.
type KillTurn = Arc<tokio::sync::Mutex<Option<Option<hive_api::node::ProviderRef>>>>;

impl Fleet {
    /// Starts the fleet: the iroh endpoint, the Provider controller, recovery, and the
    /// FleetCommand intake (`intake.rs`: record, claim, execute).
    /// Local workers keep their agents in `<state_dir>/fleet/workers/<node>`.
    pub async fn start(
        store: Store,
        identity: &Identity,
        state_dir: &Path,
        config: FleetConfig,
    ) -> anyhow::Result<Arc<Fleet>> {
        let observer = config.controller_metrics.clone();
        let exe = std::env::current_exe().context("finding the hive executable for fleet workers")?;
        let (exits_tx, exits) = mpsc::unbounded_channel();
        let generation =
            commands::next_control_generation(&store).await.context("recording the control generation")?;
        let members = members::Membership::new(store.clone(), generation);
        let process = ProcessProvider::new(exe, state_dir.join("fleet").join("workers"), exits_tx);
        let net =
            net::FleetNet::start(*identity.secret_bytes(), config.net.clone(), generation, members.clone())
                .await
                .context("starting the fleet's iroh endpoint")?;
        tracing::info!(endpoint = %net.endpoint_id(), addrs = ?net.bound_addrs(), generation, "fleet endpoint bound");
        let fleet = Arc::new(Fleet {
            store: store.clone(),
            nodes: Api::new(&store),
            commands: Api::new(&store),
            providers: Providers::listening(
                process.clone(),
                config.key_sources.clone(),
                net.bound_addrs().iter().all(|a| a.ip().is_loopback()),
            ),
            process,
            net,
            members,
            fleet_label: identity.fingerprint(),
            retired_labels: identity.retired_labels().to_vec(),
            run_id: uuid::Uuid::new_v4().simple().to_string(),
            config,
            tasks: Mutex::new(JoinSet::new()),
            closing: AtomicBool::new(false),
            recovered: Mutex::new(HashSet::new()),
            summarized: Mutex::new(HashMap::new()),
            kills: Mutex::new(HashMap::new()),
        });
        fleet.members.attach(&fleet);
        fleet.ensure_builtin_providers().await;
        recovery::process_nodes(&fleet).await;
        retained::backfill(&store).await;
        exec::fail_interrupted_commands(&fleet).await;
        intake::spawn(&fleet);
        let watcher = fleet.clone();
        fleet.spawn(async move { watcher.watch_exits(exits).await });
        let controller = fleet.clone();
        let providers = fleet.providers.clone();
        let weak = Arc::downgrade(&fleet);
        fleet.spawn(async move {
            status::run(controller.store.clone(), providers, observer, move |name| {
                if let Some(fleet) = weak.upgrade() {
                    fleet.provider_ready(&name);
                }
            })
            .await
        });
        let summaries = fleet.clone();
        fleet.spawn(async move { summaries.write_summaries().await });
        let deletions = fleet.clone();
        fleet.spawn(async move { deletions.follow_deletions().await });
        let members = fleet.clone();
        let events = fleet.net.member_events();
        fleet.spawn(async move { members.follow_members(events).await });
        Ok(fleet)
    }

    /// The runtimes of agents placed on this fleet's nodes, dialled from the fleet's
    /// endpoint; config bundles for them are made in `ship`.
    pub fn agent_nodes(&self, ship: std::path::PathBuf) -> Arc<remote::FleetNodes> {
        Arc::new(remote::FleetNodes::new(self.store.clone(), self.net.endpoint().clone(), ship))
    }

    /// The name of the provider commands use when they name none.
    pub fn default_provider(&self) -> &'static str {
        self.config.default_provider.name()
    }

    /// The type of the default provider, if its Provider object exists.
    pub fn default_provider_type(&self) -> Option<ProviderType> {
        commands::provider_type(&self.store, self.default_provider())
    }

    /// The telemetry pulled from the nodes.
    pub fn telemetry(&self) -> &net::TelemetryHub {
        self.net.hub()
    }

    /// The daemon's iroh endpoint id.
    pub fn endpoint_id(&self) -> String {
        self.net.endpoint_id().to_string()
    }

    /// The store's clock, as a status timestamp.
    fn now(&self) -> Time {
        Time(self.store.now())
    }

    async fn ensure_builtin_providers(&self) {
        let process = ProviderSpec { type_: ProviderType::Process, ..Default::default() };
        status::ensure(&self.store, "process", process).await;
        match self.config.default_provider {
            ProviderChoice::Process => {}
            ProviderChoice::Docker => {
                let docker = DockerProvider {
                    image: self.config.docker_image.clone(),
                    network: Some(self.config.docker_network.clone()),
                    ..Default::default()
                };
                let spec =
                    ProviderSpec { type_: ProviderType::Docker, docker: Some(docker), ..Default::default() };
                status::ensure(&self.store, "docker", spec).await;
            }
            ProviderChoice::Vastai => {
                // `--provider vastai` allows its variable (see `hive serve --help`).
                let env = providers::keys::BUILTIN_KEY_ENV;
                let named =
                    crate::host::env::var_os(env).is_some() && self.config.key_sources.env_allowed(env);
                let vastai = VastaiProvider {
                    base_url: self.config.vastai_base_url.clone(),
                    api_key_env: named.then(|| env.to_string()),
                    ..Default::default()
                };
                let spec =
                    ProviderSpec { type_: ProviderType::Vastai, vastai: Some(vastai), ..Default::default() };
                status::ensure(&self.store, "vastai", spec).await;
            }
        }
    }

    /// A provider became ready: recover its resources, once per run.
    pub fn provider_ready(self: &Arc<Self>, name: &str) {
        if !self.recovered.lock().unwrap_or_else(PoisonError::into_inner).insert(name.to_string()) {
            return;
        }
        let fleet = self.clone();
        let name = name.to_string();
        self.spawn(async move { recovery::recover(&fleet, &name).await });
    }

    /// Runs a command this run claimed (see `intake.rs`) until it is done or the fleet
    /// shuts down.
    fn execute(self: &Arc<Self>, claimed: intake::Claimed) {
        let fleet = self.clone();
        self.spawn(async move { exec::execute(fleet, claimed).await });
    }

    /// The kill turn of node `name`.
    fn kill_turn(&self, name: &str) -> KillTurn {
        self.kills.lock().unwrap_or_else(PoisonError::into_inner).entry(name.to_string()).or_default().clone()
    }

    /// Runs `task` until shutdown; once shutdown began, drops it unstarted.
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.is_closing() {
            tasks.spawn(task);
        }
    }

    /// Whether shutdown began.
    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Stops executing, stops every local worker and clears their records (a local
    /// worker cannot be adopted), marks unfinished commands Failed, and leaves Docker
    /// containers and Vast.ai instances running for the next daemon. Call before the
    /// store shuts down.
    pub async fn shutdown(&self) {
        let mut tasks = {
            let mut running = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
            // Under the tasks' lock: a reconcile still running (its own task) cannot start
            // an execution after the ones running now are aborted.
            self.closing.store(true, Ordering::SeqCst);
            std::mem::take(&mut *running)
        };
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        let stopped = self.process.stop_all().await;
        tracing::info!(workers = stopped.len(), "fleet: local workers stopped");
        let (_, nodes) = self.nodes.list();
        let mut cleared = 0;
        for node in nodes {
            // Only live records: a kill's (or a failure's) terminal record is kept.
            if !self.is_local(&node) || !exec::is_live(&node) {
                continue;
            }
            let name = &node.metadata.name;
            match self.nodes.delete(name).await {
                Ok(Some(_)) => cleared += 1,
                Ok(None) => {}
                Err(err) => tracing::warn!(node = name, %err, "clearing a local node's record failed"),
            }
        }
        tracing::info!(cleared, "fleet: local node records cleared; containers and instances left running");
        exec::fail_unfinished_commands(self, "the daemon stopped").await;
        self.net.shutdown().await;
    }

    /// Whether `node` is a local worker process (of a `process` provider).
    fn is_local(&self, node: &Node) -> bool {
        commands::provider_type(&self.store, &node.spec.provider) == Some(ProviderType::Process)
    }

    /// Writes `change` into the status of Node `name`, and the `Ready` condition that
    /// follows its phase (every fleet write of a node's phase comes through here, so none
    /// can leave it behind); logs (and returns `None`) when it does not land.
    async fn node_status(&self, name: &str, mut change: impl FnMut(&mut NodeStatus) + Send) -> Option<Node> {
        let now = self.now();
        let written = self
            .nodes
            .patch_status(name, |s| {
                change(s);
                s.sync_ready(now);
            })
            .await;
        landed(written, name)
    }

    /// Writes `change` into the status of FleetCommand `name`; logs (and returns `None`)
    /// when it does not land.
    /// The command's retained record follows; once the command is deleted, the write
    /// goes to the retained record alone, which carries the outcome on.
    async fn command_status(
        &self,
        name: &str,
        mut change: impl FnMut(&mut FleetCommandStatus) + Send,
    ) -> Option<FleetCommand> {
        match self.commands.patch_status(name, &mut change).await {
            Ok(patched) => {
                let command = patched.into_inner();
                retained::keep(&self.store, &command).await;
                Some(command)
            }
            Err(err) if err.is_not_found() => retained::patch_status(&self.store, name, change).await,
            Err(err) if err.is_shut_down() => {
                tracing::debug!(name, %err, "fleet status write: the daemon is stopping");
                None
            }
            Err(err) => {
                tracing::warn!(name, %err, "fleet status write failed");
                None
            }
        }
    }

    /// Marks the node of a worker that exited by itself Failed.
    async fn watch_exits(&self, mut exits: mpsc::UnboundedReceiver<Exit>) {
        while let Some(exit) = exits.recv().await {
            tracing::warn!(node = exit.node, status = exit.status, "fleet worker exited unexpectedly");
            self.net.forget(&exit.node);
            let error = format!("the worker exited unexpectedly ({})", exit.status);
            let now = self.now();
            self.node_status(&exit.node, |s| {
                if !is_terminal(s.phase) {
                    s.phase = Some(NodePhase::Failed);
                    s.error = Some(error.clone());
                    s.finished_at = Some(now);
                }
            })
            .await;
        }
    }

    /// A deleted node record stops its telemetry pull, and its local worker (which
    /// nothing could see or adopt any more). A container or instance is never destroyed
    /// by a delete: only a Kill command does that.
    async fn follow_deletions(&self) {
        let client = Api::<hive_api::Node>::new(&self.store);
        let mut events = std::pin::pin!(watcher(client, WatchConfig::default()));
        while let Some(event) = events.next().await {
            let gone: Vec<String> = match event {
                Ok(Event::Deleted(node)) => vec![node.metadata.name.clone()],
                // After a relist, whatever is followed but no longer listed was deleted
                // meanwhile.
                Ok(Event::Restarted(all)) => {
                    let listed: HashSet<String> = all.iter().map(|n| n.metadata.name.clone()).collect();
                    self.telemetry().nodes_known().into_iter().filter(|n| !listed.contains(n)).collect()
                }
                Ok(Event::Applied(_)) | Err(_) => continue,
            };
            for name in gone {
                self.forget_node(&name).await;
            }
        }
    }

    /// Lets go of everything a deleted node record had here.
    async fn forget_node(&self, name: &str) {
        self.net.forget(name);
        self.summarized.lock().unwrap_or_else(PoisonError::into_inner).remove(name);
        let token = Mutation::Delete {
            kind: members::TOKEN_KIND,
            name: name.to_string(),
            uid: None,
            resource_version: None,
        };
        let _ = self.store.commit(token, false).await;
        if self.process.is_running(name) {
            tracing::info!(node = name, "fleet: node record deleted; stopping its local worker");
            self.process.stop(name).await;
        }
    }

    /// A Running node whose worker's control connection ended says so in its status
    /// (its phase stays: nothing is torn down); a rejoin clears it.
    async fn follow_members(&self, mut events: tokio::sync::broadcast::Receiver<net::MemberEvent>) {
        loop {
            let node = match events.recv().await {
                Ok(net::MemberEvent::Lost { node }) => node,
                Ok(net::MemberEvent::Joined { .. }) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            let error = format!(
                "the worker's control connection was lost at {}; waiting for it to rejoin",
                self.store.now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
            self.node_status(&node, |s| {
                if s.phase == Some(NodePhase::Running) {
                    s.error = Some(error.clone());
                }
            })
            .await;
        }
    }

    /// Every [`SUMMARY_INTERVAL`], writes the latest telemetry summary of each followed
    /// node to its status (only when a newer frame arrived).
    async fn write_summaries(&self) {
        let mut tick = tokio::time::interval(SUMMARY_INTERVAL);
        loop {
            tick.tick().await;
            for node in self.telemetry().nodes_known() {
                let Some(summary) = self.telemetry().summary(&node) else { continue };
                let seen = self.summarized.lock().unwrap_or_else(PoisonError::into_inner).get(&node).cloned();
                if seen == Some(summary.updated_at) {
                    continue;
                }
                let written = self
                    .node_status(&node, |s| {
                        if !is_terminal(s.phase) {
                            s.telemetry = Some(summary.clone());
                        }
                    })
                    .await;
                if written.is_some() {
                    self.summarized
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(node, summary.updated_at);
                }
            }
        }
    }

    /// Pulls a rejoined worker's telemetry again (the membership sink calls this after
    /// its Welcome went out; the Provision that created a node pulls it itself).
    async fn resume_telemetry(&self, node: &str) -> Result<()> {
        exec::start_telemetry(self, node).await
    }

    /// Resolves when `node` joined (or rejoined) after this call.
    fn await_join(&self, node: &str) -> oneshot::Receiver<()> {
        self.members.waiter(node)
    }
}

/// The object a typed status write left, or `None` (logged) when it did not land.
fn landed<K>(result: client::Result<Patched<K>>, name: &str) -> Option<K> {
    match result {
        Ok(patched) => Some(patched.into_inner()),
        Err(err) if err.is_not_found() => {
            tracing::warn!(name, %err, "fleet status write did not land");
            None
        }
        Err(err) if err.is_shut_down() => {
            tracing::debug!(name, %err, "fleet status write: the daemon is stopping");
            None
        }
        Err(err) => {
            tracing::warn!(name, %err, "fleet status write failed");
            None
        }
    }
}

/// The phase of a terminal command, from its result.
fn command_result(result: &Result<()>) -> FleetCommandPhase {
    if result.is_ok() {
        FleetCommandPhase::Succeeded
    } else {
        FleetCommandPhase::Failed
    }
}
