//! The fleet (Myelin): explicit, idempotent Provision and Kill commands over node
//! providers. No reconciler: nothing is created or torn down unless a FleetCommand says
//! so.
//!
//! - `identity.rs`: the daemon's durable iroh secret key in the state directory.
//! - `commands.rs`: `POST fleetcommands` — the command and the Node intent it causes are
//!   recorded in one store transaction before any provider call; replays of a command
//!   id return the stored record.
//! - `providers/`: what creates and destroys nodes (`process` so far).
//! - this file: the executor. It watches FleetCommands and runs the provider calls of
//!   each newly recorded (Pending) one exactly once, writing Node and command status as
//!   it goes; at start it marks what a previous run left unfinished (a local worker
//!   cannot be adopted: its node becomes Stopped, its command Failed); at shutdown it
//!   stops the local workers and marks their nodes Stopped.

pub mod commands;
pub mod identity;
pub mod providers;

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use hive_api::fleet_command::{FleetCommand, FleetCommandPhase};
use hive_api::meta::Time;
use hive_api::node::NodePhase;
use hive_api::provider::ProviderType;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::store::{EventType, Store, Subresource};
use crate::update::update;
use providers::process::{Exit, ProcessProvider};

pub use identity::Identity;

/// How long a new worker may take to announce readiness.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The providers `hive serve --provider` accepts.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProviderChoice {
    /// Local worker processes supervised over their stdin pipe (the default).
    #[default]
    Process,
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

fn now() -> Value {
    json!(Time(chrono::Utc::now()))
}

fn phase_of(node: &Value) -> Option<NodePhase> {
    serde_json::from_value(node["status"]["phase"].clone()).ok()
}

fn is_terminal(phase: Option<NodePhase>) -> bool {
    matches!(phase, Some(NodePhase::Stopped | NodePhase::Killed | NodePhase::Failed | NodePhase::Orphaned))
}

/// The running fleet executor.
pub struct Fleet {
    store: Store,
    process: Arc<ProcessProvider>,
    tasks: Mutex<JoinSet<()>>,
    /// Commands whose execution began in this run (each runs at most once).
    started: Mutex<HashSet<String>>,
}

impl Fleet {
    /// Marks what a previous run left unfinished, then starts executing new commands.
    pub async fn start(store: Store, _identity: &Identity) -> anyhow::Result<Arc<Fleet>> {
        let exe = std::env::current_exe().context("finding the hive executable for fleet workers")?;
        let (exits_tx, exits) = mpsc::unbounded_channel();
        let fleet = Arc::new(Fleet {
            store: store.clone(),
            process: ProcessProvider::new(exe, exits_tx),
            tasks: Mutex::new(JoinSet::new()),
            started: Mutex::new(HashSet::new()),
        });
        let revision = store.revision();
        let watch = store.watch("fleetcommands", revision).context("watching fleet commands")?;
        fleet.mark_unfinished("the daemon restarted; a local worker process cannot be adopted").await;
        let runner = fleet.clone();
        fleet.spawn(async move { runner.follow(watch, revision).await });
        let watcher = fleet.clone();
        fleet.spawn(async move { watcher.watch_exits(exits).await });
        Ok(fleet)
    }

    /// Runs every newly recorded command, once. A watch that ends (it fell behind, or
    /// its history expired) is replaced, after a relist that catches up on what it
    /// missed; it ends for good when the store closes.
    async fn follow(self: Arc<Self>, mut watch: crate::store::Watch, mut revision: u64) {
        loop {
            while let Some(Ok(event)) = watch.next().await {
                revision = event.revision;
                if event.type_ == EventType::Added {
                    self.run_once((*event.object).clone());
                }
            }
            let (listed, commands) = self.store.list("fleetcommands");
            for command in commands {
                self.run_once((*command).clone());
            }
            revision = revision.max(listed);
            match self.store.watch("fleetcommands", revision) {
                Ok(next) => watch = next,
                Err(crate::store::Error::Closed) => return,
                Err(err) => {
                    tracing::warn!(%err, "fleet: re-watching commands failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    revision = self.store.revision();
                }
            }
        }
    }

    /// Starts executing `command` unless it was started before in this run.
    fn run_once(self: &Arc<Self>, command: Value) {
        let name = command["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if !self.started.lock().unwrap_or_else(PoisonError::into_inner).insert(name) {
            return;
        }
        let fleet = self.clone();
        self.spawn(async move { fleet.execute(command).await });
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner).spawn(task);
    }

    /// Stops executing, stops every local worker and marks unfinished nodes Stopped and
    /// unfinished commands Failed. Call before the store shuts down.
    pub async fn shutdown(&self) {
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        let stopped = self.process.stop_all().await;
        tracing::info!(workers = stopped.len(), "fleet: local workers stopped");
        self.mark_unfinished("the daemon stopped; local worker processes end with it").await;
    }

    /// Nodes not in a terminal phase become Stopped; commands not terminal become Failed.
    async fn mark_unfinished(&self, why: &str) {
        let (_, nodes) = self.store.list("nodes");
        for node in nodes {
            // Only local workers end with the daemon; a node without a phase was not
            // recorded by a command (apply) and is left alone.
            let local =
                node["spec"]["provider"].as_str().and_then(|p| commands::provider_type(&self.store, p))
                    == Some(ProviderType::Process);
            if !local || phase_of(&node).is_none() || is_terminal(phase_of(&node)) {
                continue;
            }
            let name = node["metadata"]["name"].as_str().unwrap_or_default().to_string();
            self.node_status(&name, |s| {
                s["phase"] = json!(NodePhase::Stopped);
                s["error"] = json!(why);
                s["finishedAt"] = now();
            })
            .await;
        }
        let (_, commands) = self.store.list("fleetcommands");
        for command in commands {
            let phase: Option<FleetCommandPhase> =
                serde_json::from_value(command["status"]["phase"].clone()).ok();
            if phase.is_none_or(FleetCommandPhase::is_terminal) {
                continue;
            }
            let name = command["metadata"]["name"].as_str().unwrap_or_default().to_string();
            self.command_status(&name, |s| {
                s["phase"] = json!(FleetCommandPhase::Failed);
                s["error"] = json!(format!("interrupted: {why}"));
                s["finishedAt"] = now();
            })
            .await;
        }
    }

    async fn node_status(&self, name: &str, change: impl FnMut(&mut Value) + Send) -> Option<Value> {
        write_status(&self.store, "nodes", name, change).await
    }

    async fn command_status(&self, name: &str, change: impl FnMut(&mut Value) + Send) -> Option<Value> {
        write_status(&self.store, "fleetcommands", name, change).await
    }

    /// Runs the provider work of a newly recorded command, once.
    async fn execute(self: Arc<Self>, object: Value) {
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let command: FleetCommand = match serde_json::from_value(object.clone()) {
            Ok(c) => c,
            Err(err) => {
                tracing::warn!(command = name, %err, "undecodable fleet command");
                return;
            }
        };
        match command.status.phase {
            Some(FleetCommandPhase::Pending) => {}
            // Created by a write that bypassed POST (apply, PUT): it recorded no node
            // intent, so it is left as it is, inert.
            None => {
                tracing::warn!(command = name, "fleet command not created by POST: not run");
                return;
            }
            Some(_) => return,
        }
        self.command_status(&name, |s| {
            s["phase"] = json!(FleetCommandPhase::Running);
            s["startedAt"] = now();
        })
        .await;
        let result = if command.spec.provision.is_some() {
            let runs = command.status.nodes.iter().map(|node| self.clone().provision(node.clone()));
            let errors: Vec<String> =
                futures_util::future::join_all(runs).await.into_iter().filter_map(Result::err).collect();
            if errors.is_empty() {
                Ok(())
            } else {
                Err(errors.join("; "))
            }
        } else if let Some(kill) = &command.spec.kill {
            self.kill(&kill.node).await
        } else {
            Err("neither provision nor kill is set".to_string())
        };
        self.command_status(&name, |s| {
            match &result {
                Ok(()) => s["phase"] = json!(FleetCommandPhase::Succeeded),
                Err(err) => {
                    s["phase"] = json!(FleetCommandPhase::Failed);
                    s["error"] = json!(err);
                }
            }
            s["finishedAt"] = now();
        })
        .await;
        tracing::info!(command = name, action = command.action(), ok = result.is_ok(), "fleet command done");
    }

    fn kill_requested(&self, node: &str) -> bool {
        self.store
            .get("nodes", node)
            .is_none_or(|n| n["metadata"]["annotations"][commands::KILLED_BY].is_string())
    }

    /// Creates one node's worker and waits until it is ready.
    async fn provision(self: Arc<Self>, node: String) -> Result<(), String> {
        if self.kill_requested(&node) {
            return Err(format!("{node}: killed before it was created"));
        }
        self.node_status(&node, |s| s["phase"] = json!(NodePhase::Provisioning)).await;
        let spawned = match self.process.spawn(&node) {
            Ok(spawned) => spawned,
            Err(err) => {
                let error = format!("{node}: starting the worker failed: {err}");
                self.fail_node(&node, &error).await;
                return Err(error);
            }
        };
        let pid = spawned.pid;
        self.node_status(&node, |s| {
            s["providerRef"] = json!({"pid": pid});
            s["provisionedAt"] = now();
        })
        .await;
        match tokio::time::timeout(READY_TIMEOUT, spawned.ready).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                let error = format!("{node}: the worker exited before it was ready");
                self.process.stop(&node).await;
                self.fail_node(&node, &error).await;
                return Err(error);
            }
            Err(_) => {
                let error = format!("{node}: the worker was not ready within {}s", READY_TIMEOUT.as_secs());
                self.process.stop(&node).await;
                self.fail_node(&node, &error).await;
                return Err(error);
            }
        }
        if self.kill_requested(&node) {
            // A Kill raced the create; its executor found no worker yet, so stop it here.
            self.process.stop(&node).await;
            self.node_status(&node, |s| {
                s["phase"] = json!(NodePhase::Killed);
                s["finishedAt"] = now();
            })
            .await;
            return Ok(());
        }
        self.node_status(&node, |s| {
            if s["phase"] == json!(NodePhase::Provisioning) {
                s["phase"] = json!(NodePhase::Running);
                s["readyAt"] = now();
            }
        })
        .await;
        tracing::info!(node, pid, "fleet node ready");
        Ok(())
    }

    async fn fail_node(&self, node: &str, error: &str) {
        self.node_status(node, |s| {
            s["phase"] = json!(NodePhase::Failed);
            s["error"] = json!(error);
            s["finishedAt"] = now();
        })
        .await;
    }

    /// Stops one node's worker, keeping its record in a terminal phase.
    async fn kill(&self, node: &str) -> Result<(), String> {
        let Some(current) = self.store.get("nodes", node) else {
            return Err(format!("{node}: no such node"));
        };
        let was_terminal = is_terminal(phase_of(&current));
        if !was_terminal {
            self.node_status(node, |s| s["phase"] = json!(NodePhase::Killing)).await;
        }
        let stopped = self.process.stop(node).await;
        if !was_terminal {
            self.node_status(node, |s| {
                s["phase"] = json!(NodePhase::Killed);
                s["finishedAt"] = now();
            })
            .await;
        }
        tracing::info!(node, stopped, "fleet node killed");
        Ok(())
    }

    /// Marks the node of a worker that exited by itself Failed.
    async fn watch_exits(&self, mut exits: mpsc::UnboundedReceiver<Exit>) {
        while let Some(exit) = exits.recv().await {
            tracing::warn!(node = exit.node, status = exit.status, "fleet worker exited unexpectedly");
            let error = format!("the worker exited unexpectedly ({})", exit.status);
            self.node_status(&exit.node, |s| {
                if !is_terminal(serde_json::from_value(s["phase"].clone()).ok()) {
                    s["phase"] = json!(NodePhase::Failed);
                    s["error"] = json!(error);
                    s["finishedAt"] = now();
                }
            })
            .await;
        }
    }
}

/// Writes `change` into the status of `kind/name`; logs (and returns `None`) on failure.
async fn write_status(
    store: &Store,
    kind: &'static str,
    name: &str,
    mut change: impl FnMut(&mut Value) + Send,
) -> Option<Value> {
    match update(store, kind, name, Subresource::Status, |o| change(&mut o["status"])).await {
        Ok(crate::update::Updated::Stored(o) | crate::update::Updated::Unchanged(o)) => Some((*o).clone()),
        Ok(other) => {
            tracing::warn!(kind, name, ?other, "fleet status write did not land");
            None
        }
        Err(err) => {
            tracing::warn!(kind, name, %err, "fleet status write failed");
            None
        }
    }
}
