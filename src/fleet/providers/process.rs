//! The `process` provider: each node is a local worker, the running `hive` executable
//! re-entered as `hive fleet-worker --node NAME`. The worker's stdin is a pipe the daemon
//! holds (the supervision pipe): the worker exits when it reaches EOF, so a daemon that
//! crashes never leaves workers behind. The worker announces readiness with one
//! `ready NAME` line on stdout.
//!
//! Each worker is owned by one task, which reports an exit nobody asked for on the
//! provider's exit channel. Stopping a worker closes its stdin, waits, and kills it if
//! it does not go in time.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use hive_api::node::ProviderRef;
use hive_api::provider::ProviderState;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot};

use super::{worker_args, Created, Found, Launch, Lifetime, Provider, Readiness, JOIN_TOKEN_ENV};
use crate::fleet::error::{Error, Result};
use crate::fleet::PROCESS_READY_TIMEOUT;

/// How long a stopped worker may take to exit after its stdin closes before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// The line a worker prints once it is ready.
pub fn ready_line(node: &str) -> String {
    format!("ready {node}")
}

/// A worker that exited without being asked to: the node name and how it ended.
#[derive(Debug, Clone)]
pub struct Exit {
    /// The node.
    pub node: String,
    /// How the process ended, e.g. `exit status: 1`.
    pub status: String,
}

/// A worker just started.
#[derive(Debug)]
pub struct Spawned {
    /// Its process id.
    pub pid: u32,
    /// Resolves once the worker printed its ready line; dropped (an error) if it exits
    /// or closes stdout first.
    pub ready: oneshot::Receiver<()>,
}

struct Handle {
    stop: oneshot::Sender<oneshot::Sender<()>>,
}

/// The local worker processes of this daemon.
pub struct ProcessProvider {
    exe: PathBuf,
    /// Where each worker keeps its agents: `<state_root>/<node>`.
    state_root: PathBuf,
    workers: Mutex<HashMap<String, Handle>>,
    exits: mpsc::UnboundedSender<Exit>,
}

impl ProcessProvider {
    /// A provider starting workers from `exe` (normally `std::env::current_exe()`), each
    /// keeping its agents in `<state_root>/<node>`; unexpected exits are sent to `exits`.
    pub fn new(
        exe: PathBuf,
        state_root: PathBuf,
        exits: mpsc::UnboundedSender<Exit>,
    ) -> Arc<ProcessProvider> {
        Arc::new(ProcessProvider { exe, state_root, workers: Mutex::new(HashMap::new()), exits })
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Handle>> {
        self.workers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a worker for `node` is running.
    pub fn is_running(&self, node: &str) -> bool {
        self.workers().contains_key(node)
    }

    /// Starts the worker of `node`: `hive fleet-worker --node NODE ARGS…` in agent-only
    /// mode (`MYELIN_AGENT_ONLY=1`), its stdin the supervision pipe. `settings` (the
    /// Provider's `spec.process`) may name another executable and add environment.
    pub fn spawn(
        self: &Arc<Self>,
        node: &str,
        args: &[String],
        settings: &hive_api::provider::ProcessProvider,
    ) -> std::io::Result<Spawned> {
        let exe = settings.executable.as_ref().map_or_else(|| self.exe.clone(), PathBuf::from);
        let mut child = Command::new(&exe)
            .args(["fleet-worker", "--node", node, "--supervise", "stdin"])
            .arg("--state-dir")
            .arg(self.state_root.join(node))
            .args(args)
            .envs(&settings.env)
            .env("MYELIN_AGENT_ONLY", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().unwrap_or_default();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        let (ready_tx, ready) = oneshot::channel();
        let (stop, mut stop_rx) = oneshot::channel::<oneshot::Sender<()>>();
        self.workers().insert(node.to_string(), Handle { stop });
        let expected = ready_line(node);
        tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.trim() == expected {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(());
                    }
                }
            }
        });
        let this = self.clone();
        let node = node.to_string();
        tokio::spawn(async move {
            let mut stdin = stdin;
            tokio::select! {
                status = child.wait() => {
                    this.workers().remove(&node);
                    let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                    let _ = this.exits.send(Exit { node, status });
                }
                done = &mut stop_rx => {
                    // Closing the supervision pipe asks the worker to exit.
                    drop(stdin.take());
                    if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
                        tracing::warn!(node, pid, "fleet worker still running after its stdin closed; killing");
                        let _ = child.kill().await;
                    }
                    this.workers().remove(&node);
                    if let Ok(done) = done {
                        let _ = done.send(());
                    }
                }
            }
        });
        Ok(Spawned { pid, ready })
    }

    /// Stops the worker of `node` and waits until it is gone. False if none was running.
    pub async fn stop(&self, node: &str) -> bool {
        let Some(handle) = self.workers().remove(node) else { return false };
        let (done, gone) = oneshot::channel();
        if handle.stop.send(done).is_err() {
            return false;
        }
        let _ = gone.await;
        true
    }

    /// Stops every worker; returns the nodes that were running.
    pub async fn stop_all(&self) -> Vec<String> {
        let nodes: Vec<String> = self.workers().keys().cloned().collect();
        let stops = nodes.iter().map(|n| self.stop(n));
        futures_util::future::join_all(stops).await;
        nodes
    }
}

/// The `process` provider as the fleet uses it: this daemon's local workers, shared by
/// every Provider of type `process` (each create reads its Provider's settings).
pub struct LocalWorkers(pub Arc<ProcessProvider>);

impl Provider for LocalWorkers {
    fn check(&self) -> BoxFuture<'_, Readiness> {
        Box::pin(async {
            Readiness { state: ProviderState::Ready, message: "local worker processes of this daemon".into() }
        })
    }

    fn create<'a>(&'a self, launch: &'a Launch<'a>) -> BoxFuture<'a, Result<Created>> {
        Box::pin(async move {
            let node = launch.node;
            let mut args = worker_args(node, launch.net.control_target(None));
            if launch.net.bound_addrs().iter().all(|a| a.ip().is_loopback()) {
                // A daemon on loopback keeps its local workers there too.
                args.extend(["--bind".into(), "127.0.0.1:0".into()]);
            }
            let mut settings = launch.spec.and_then(|spec| spec.process.clone()).unwrap_or_default();
            settings.env.insert(JOIN_TOKEN_ENV.into(), launch.token.into());
            let spawned = self.0.spawn(&node.metadata.name, &args, &settings).map_err(Error::Spawn)?;
            Ok(Created {
                reference: ProviderRef { pid: Some(spawned.pid), ..Default::default() },
                ready: Some(spawned.ready),
                join_timeout: PROCESS_READY_TIMEOUT,
            })
        })
    }

    fn destroy<'a>(&'a self, node: &'a str, _reference: &'a ProviderRef) -> BoxFuture<'a, Result<String>> {
        Box::pin(async move { Ok(format!("worker stopped: {}", self.0.stop(node).await)) })
    }

    fn list<'a>(&'a self, _fleet: &'a str) -> BoxFuture<'a, Result<Vec<Found>>> {
        // A local worker ends with the daemon that supervised it: there is never one to find.
        Box::pin(async { Ok(Vec::new()) })
    }

    fn lifetime(&self) -> Lifetime {
        Lifetime::Supervised
    }
}
