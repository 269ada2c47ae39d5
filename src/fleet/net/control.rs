//! The control protocol (`hive/fleet-control/0`, served by the daemon, dialled by each
//! worker) and its daemon side.
//!
//! One bi stream per connection carries request/reply pairs in [`wire`]
//! framing: the worker sends a [`ControlRequest`], the daemon answers with one
//! [`ControlReply`]. A worker joins (or rejoins) with a [`Hello`]; the daemon hands it to
//! the [`Members`] sink, which persists the facts, and **only after the sink succeeded**
//! answers [`ControlReply::Welcome`]. The connection then stays open with periodic
//! heartbeats; when it ends the daemon reports [`MemberEvent::Lost`].

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use iroh::endpoint::Connection;
use iroh::protocol::{AcceptError, ProtocolHandler};
use iroh::Endpoint;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::wire::{self, WireError};

/// The registry name under which the daemon's control binding is published.
pub const CONTROL_NAME: &str = "myelin.manual-control";

/// Whether a worker joins for the first time or comes back to a (possibly new) daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloKind {
    /// The first Hello of a worker process.
    Join,
    /// A Hello after the control connection dropped and was re-established.
    Rejoin,
}

/// One GPU of a node, as reported when it joins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFact {
    /// The product name.
    pub name: String,
    /// Memory installed, in MiB.
    pub memory_mib: u64,
}

/// What a worker reports about its machine when it joins or rejoins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeFacts {
    /// The machine's host name.
    pub hostname: String,
    /// Logical CPUs available to the worker.
    pub cpus: u32,
    /// Memory installed, in bytes.
    pub memory_total_bytes: u64,
    /// The GPUs `nvidia-smi` lists (empty without it).
    pub gpus: Vec<GpuFact>,
    /// `MYELIN_AGENT_ONLY=1` was set in the worker's environment.
    pub agent_only: bool,
    /// When the worker process started.
    pub started_at: chrono::DateTime<chrono::Utc>,
}

/// A worker announcing itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Join or Rejoin.
    pub kind: HelloKind,
    /// The node name (its logical identity, with `logical_id`).
    pub node: String,
    /// The node's logical id (monotonic, never reused).
    pub logical_id: u64,
    /// The worker's endpoint id (hex), where it serves telemetry. The daemon refuses a
    /// Hello whose id is not the one of the connection it arrived on.
    pub endpoint_id: String,
    /// Addresses the worker's endpoint is reachable at.
    pub addresses: Vec<SocketAddr>,
    /// What the worker runs on.
    pub facts: RuntimeFacts,
    /// The control generation the worker is bound to (`None` before its first Welcome).
    pub bound_generation: Option<u64>,
    /// The node's join token, given to the worker when its resource was created (env
    /// `HIVE_JOIN_TOKEN`): proof that this worker is the node's. Its `Debug` is redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join_token: Option<JoinToken>,
}

/// A node's join token. Never printed: `Debug` and `Display` are redacted.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JoinToken(pub String);

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JoinToken([redacted])")
    }
}

/// Where the control actor of the current daemon run is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// The registry name ([`CONTROL_NAME`]).
    pub name: String,
    /// The daemon's endpoint id (hex).
    pub endpoint_id: String,
    /// The daemon's bound addresses.
    pub addresses: Vec<SocketAddr>,
    /// The daemon run's control generation.
    pub generation: u64,
}

/// What a worker sends on the control stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ControlRequest {
    /// Join or rejoin; answered by Welcome or Refused.
    Hello(Hello),
    /// Look up a registry name; answered by Binding or NotFound.
    Resolve {
        /// The name, e.g. [`CONTROL_NAME`].
        name: String,
    },
    /// Keeps the connection alive; answered by Ack.
    Heartbeat,
}

/// What the daemon answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ControlReply {
    /// The Hello's facts are persisted; the worker binds to `generation` and redials
    /// the daemon from now on at `daemon_endpoint_id` and `addresses`.
    Welcome {
        /// The daemon run's control generation.
        generation: u64,
        /// The daemon's endpoint id (hex).
        daemon_endpoint_id: String,
        /// Where the daemon's control endpoint is now: its advertised address first,
        /// then the bound ones (an unspecified IP is the one the worker reached it at).
        /// Empty from a daemon that names none: the worker keeps what it dialled.
        #[serde(default)]
        addresses: Vec<SocketAddr>,
    },
    /// The Hello was not accepted.
    Refused {
        /// Why.
        reason: String,
    },
    /// The answer to Resolve.
    Binding(Binding),
    /// Resolve of a name nobody published.
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// The answer to Heartbeat.
    Ack,
}

/// The future a [`Members`] sink returns.
pub type AdmitFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Where the daemon hands each Hello (the fleet executor implements it). The daemon
/// answers Welcome only after `admit` resolved `Ok`, so a worker never binds to a daemon
/// that has not persisted its facts.
pub trait Members: Send + Sync + 'static {
    /// Persists `hello` (Join or Rejoin); `Err(reason)` refuses the worker.
    fn admit(&self, hello: Hello) -> AdmitFuture;
}

/// A change in which workers hold a control connection to this daemon run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberEvent {
    /// A worker was welcomed (by Join or Rejoin).
    Joined {
        /// The node.
        node: String,
        /// Join or Rejoin.
        kind: HelloKind,
    },
    /// The control connection of a welcomed worker ended.
    Lost {
        /// The node.
        node: String,
    },
}

/// The daemon side of the control ALPN.
#[derive(Clone)]
pub(crate) struct ControlService {
    pub(crate) endpoint: Endpoint,
    pub(crate) generation: u64,
    /// The addresses workers are told to dial, when not the bound one.
    pub(crate) advertise: Vec<SocketAddr>,
    pub(crate) members: Arc<dyn Members>,
    pub(crate) events: broadcast::Sender<MemberEvent>,
    /// node → the connection that most recently welcomed it, so an old connection
    /// ending after a newer one joined reports no Lost.
    pub(crate) current: Arc<Mutex<HashMap<String, u64>>>,
    pub(crate) next_connection: Arc<AtomicU64>,
}

impl std::fmt::Debug for ControlService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlService").field("generation", &self.generation).finish_non_exhaustive()
    }
}

impl ControlService {
    /// The binding of this daemon run.
    pub(crate) fn binding(&self) -> Binding {
        Binding {
            name: CONTROL_NAME.to_string(),
            endpoint_id: self.endpoint.id().to_string(),
            addresses: self.endpoint.bound_sockets(),
            generation: self.generation,
        }
    }

    /// Where a welcomed worker redials: the advertised addresses, then the bound ones.
    pub(crate) fn control_addresses(&self) -> Vec<SocketAddr> {
        let mut addresses = self.advertise.clone();
        for bound in self.endpoint.bound_sockets() {
            if !addresses.contains(&bound) {
                addresses.push(bound);
            }
        }
        addresses
    }

    fn current(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn answer(
        &self,
        request: ControlRequest,
        remote: &str,
        welcomed: &mut Option<(String, u64)>,
        id: u64,
    ) -> ControlReply {
        match request {
            ControlRequest::Heartbeat => ControlReply::Ack,
            ControlRequest::Resolve { name } if name == CONTROL_NAME => ControlReply::Binding(self.binding()),
            ControlRequest::Resolve { name } => ControlReply::NotFound { name },
            ControlRequest::Hello(hello) => {
                let (node, kind) = (hello.node.clone(), hello.kind);
                if hello.endpoint_id != remote {
                    tracing::warn!(
                        node,
                        claimed = hello.endpoint_id,
                        remote,
                        "fleet hello refused: endpoint id mismatch"
                    );
                    return ControlReply::Refused {
                        reason: format!(
                            "the hello names endpoint {} but came from {remote}",
                            hello.endpoint_id
                        ),
                    };
                }
                tracing::info!(node, ?kind, bound = ?hello.bound_generation, "fleet hello: admitting");
                match self.members.admit(hello).await {
                    Ok(()) => {
                        self.current().insert(node.clone(), id);
                        *welcomed = Some((node.clone(), id));
                        tracing::info!(node, ?kind, generation = self.generation, "fleet worker welcomed");
                        let _ = self.events.send(MemberEvent::Joined { node, kind });
                        ControlReply::Welcome {
                            generation: self.generation,
                            daemon_endpoint_id: self.endpoint.id().to_string(),
                            addresses: self.control_addresses(),
                        }
                    }
                    Err(reason) => {
                        tracing::warn!(node, ?kind, reason, "fleet hello refused by the member sink");
                        ControlReply::Refused { reason }
                    }
                }
            }
        }
    }
}

impl ProtocolHandler for ControlService {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        let remote = conn.remote_id().to_string();
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let (mut send, mut recv) = conn.accept_bi().await?;
        let mut welcomed = None;
        let ended = loop {
            let request = match wire::read_message::<_, ControlRequest>(&mut recv).await {
                Ok(request) => request,
                Err(err) => break err,
            };
            let reply = self.answer(request, &remote, &mut welcomed, id).await;
            if let Err(err) = wire::write_message(&mut send, &reply).await {
                break err;
            }
        };
        if let Some((node, id)) = welcomed {
            let mut current = self.current();
            if current.get(&node) == Some(&id) {
                current.remove(&node);
                drop(current);
                match &ended {
                    WireError::Ended => tracing::info!(node, "fleet worker left"),
                    err => tracing::info!(node, %err, "fleet worker control connection lost"),
                }
                let _ = self.events.send(MemberEvent::Lost { node });
            }
        }
        Ok(())
    }
}
