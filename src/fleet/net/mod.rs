//! The fleet's network layer over iroh (QUIC, endpoints named by their public key).
//!
//! - `endpoint.rs`: binding endpoints (direct-only by default; n0 relays opt-in) and the
//!   `<endpoint-id>@<ip:port>` control target a worker is started with.
//! - `wire.rs`: length-prefixed JSON messages on QUIC streams, with a size cap.
//! - `control.rs`: the control protocol (`hive/fleet-control/0`): Join/Rejoin hellos,
//!   Welcome only after the [`Members`] sink persisted the facts, name resolution of
//!   [`CONTROL_NAME`], heartbeats; and its daemon side.
//! - `telemetry.rs`: the telemetry protocol (`hive/fleet-telemetry/0`): pull, descriptors,
//!   frames; the daemon's [`TelemetryHub`] and per-node follower.
//! - `sampler.rs`: what a worker measures (`/proc`, `nvidia-smi`) and its runtime facts.
//! - `worker.rs`: the worker side: serves telemetry, joins, and rejoins a restarted daemon.
//! - this file: [`FleetNet`], the daemon side as one handle.
//!
//! Architecture Invariant: a worker dials only the daemon's control ALPN and the daemon
//! dials only the workers' telemetry ALPN, so a worker never needs to reach the
//! dashboard. Nothing here touches the store: persisting a Hello is the [`Members`]
//! sink's job, and this layer only waits for it.

pub mod control;
pub mod endpoint;
pub mod sampler;
pub mod telemetry;
pub mod wire;
pub mod worker;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use iroh::protocol::Router;
use iroh::{Endpoint, EndpointId, SecretKey};
use tokio::sync::{broadcast, oneshot};
use tokio::task::AbortHandle;

pub use control::{
    AdmitFuture, Binding, ControlReply, ControlRequest, GpuFact, Hello, HelloKind, MemberEvent, Members,
    RuntimeFacts, CONTROL_NAME,
};
pub use endpoint::{ControlTarget, NetConfig, RelayChoice};
pub use telemetry::{ChannelDescriptor, Frame, TelemetryHub, TelemetryMessage, TelemetrySnapshot};
pub use worker::{Worker, WorkerConfig, WorkerStatus};

/// The ALPN of the control protocol, served by the daemon.
pub const CONTROL_ALPN: &[u8] = b"hive/fleet-control/0";
/// The ALPN of the telemetry protocol, served by each worker.
pub const TELEMETRY_ALPN: &[u8] = b"hive/fleet-telemetry/0";

/// Bounded exponential backoff between redials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay.
    pub min: Duration,
    /// The largest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { min: Duration::from_millis(200), max: Duration::from_secs(10) }
    }
}

impl Backoff {
    /// The delay after `current`: doubled, at most `max`.
    pub fn next(&self, current: Duration) -> Duration {
        (current * 2).clamp(self.min, self.max)
    }
}

/// The daemon's side of the fleet network: its endpoint serving the control protocol,
/// the telemetry followers and hub. Start one per daemon run.
pub struct FleetNet {
    router: Router,
    generation: u64,
    hub: Arc<TelemetryHub>,
    events: broadcast::Sender<MemberEvent>,
    followers: Mutex<HashMap<String, AbortHandle>>,
    backoff: Backoff,
}

impl std::fmt::Debug for FleetNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetNet")
            .field("endpoint_id", &self.endpoint_id().to_string())
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl FleetNet {
    /// Binds the daemon endpoint with `secret` (the durable identity) and serves the
    /// control protocol for the control `generation` of this run; hellos go to `members`.
    pub async fn start(
        secret: [u8; 32],
        config: NetConfig,
        generation: u64,
        members: Arc<dyn Members>,
    ) -> anyhow::Result<Arc<FleetNet>> {
        FleetNet::start_with_backoff(secret, config, generation, members, Backoff::default()).await
    }

    /// [`FleetNet::start`] with the telemetry redial backoff given (tests use short ones).
    pub async fn start_with_backoff(
        secret: [u8; 32],
        config: NetConfig,
        generation: u64,
        members: Arc<dyn Members>,
        backoff: Backoff,
    ) -> anyhow::Result<Arc<FleetNet>> {
        let endpoint = endpoint::bind(SecretKey::from_bytes(&secret), &config, vec![CONTROL_ALPN.to_vec()])
            .await
            .context("starting the fleet daemon endpoint")?;
        let (events, _) = broadcast::channel(256);
        let service = control::ControlService {
            endpoint: endpoint.clone(),
            generation,
            advertise: config.advertise.clone(),
            members,
            events: events.clone(),
            current: Arc::default(),
            next_connection: Arc::new(AtomicU64::new(0)),
        };
        let router = Router::builder(endpoint).accept(CONTROL_ALPN, service).spawn();
        let net = Arc::new(FleetNet {
            router,
            generation,
            hub: Arc::default(),
            events,
            followers: Mutex::new(HashMap::new()),
            backoff,
        });
        tracing::info!(
            endpoint_id = %net.endpoint_id(),
            addrs = ?net.bound_addrs(),
            generation,
            "fleet daemon endpoint started"
        );
        Ok(net)
    }

    /// The daemon's endpoint: what it dials workers from.
    pub fn endpoint(&self) -> &Endpoint {
        self.router.endpoint()
    }

    /// The daemon's endpoint id (its public key; stable across runs with the same secret).
    pub fn endpoint_id(&self) -> EndpointId {
        self.endpoint().id()
    }

    /// The UDP addresses the endpoint is bound to.
    pub fn bound_addrs(&self) -> Vec<SocketAddr> {
        self.endpoint().bound_sockets()
    }

    /// The control generation of this run.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The `--control` value for a new worker: `<endpoint-id>@<ip:port>[,…]`. When the
    /// endpoint is bound to an unspecified IP (0.0.0.0), `advertise_ip` is the IP at which
    /// the node reaches the daemon (without it such sockets are left out).
    pub fn control_target(&self, advertise_ip: Option<IpAddr>) -> String {
        self.control_target_for(ControlTarget::advertised(&self.bound_addrs(), advertise_ip))
    }

    /// The worker's `HIVE_CONTROL` naming `advertised` (the addresses workers on other
    /// hosts dial, every replica's among replicas), or the bound ones when it is empty.
    pub fn control_target_at(&self, advertised: &[SocketAddr]) -> String {
        match advertised {
            [] => self.control_target(None),
            addresses => self.control_target_for(addresses.to_vec()),
        }
    }

    fn control_target_for(&self, addresses: Vec<SocketAddr>) -> String {
        ControlTarget { endpoint_id: self.endpoint_id(), addresses }.to_string()
    }

    /// The telemetry pulled from the nodes.
    pub fn hub(&self) -> &Arc<TelemetryHub> {
        &self.hub
    }

    /// Who joined and whose control connection ended, from now on.
    pub fn member_events(&self) -> broadcast::Receiver<MemberEvent> {
        self.events.subscribe()
    }

    fn followers(&self) -> std::sync::MutexGuard<'_, HashMap<String, AbortHandle>> {
        self.followers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts pulling `node`'s telemetry from the worker at `endpoint_id` (hex) and
    /// `addresses`, for the node's lifetime: a pull that got no descriptors within
    /// `attempt`, or a dropped stream, is redialled with backoff until
    /// [`FleetNet::forget`]. The receiver resolves once the first descriptors arrived,
    /// and fails when the follower stopped first (forgotten, or replaced: following a
    /// node again replaces its follower). A bad id is an error and starts nothing.
    pub fn start_following(
        &self,
        node: &str,
        endpoint_id: &str,
        addresses: Vec<SocketAddr>,
        attempt: Duration,
    ) -> Result<oneshot::Receiver<()>, String> {
        let worker: EndpointId = endpoint_id
            .parse()
            .map_err(|e| format!("{node}: invalid worker endpoint id {endpoint_id:?}: {e}"))?;
        let (first_tx, first) = oneshot::channel();
        let follow =
            telemetry::Follow { node: node.to_string(), worker, addresses, backoff: self.backoff, attempt };
        let task =
            tokio::spawn(telemetry::follow(self.endpoint().clone(), self.hub.clone(), follow, first_tx));
        if let Some(previous) = self.followers().insert(node.to_string(), task.abort_handle()) {
            previous.abort();
        }
        Ok(first)
    }

    /// [`FleetNet::start_following`], each attempt given `first_within`, resolved once
    /// the first descriptors arrived; an `Err` (bad id, or no descriptors within
    /// `first_within`) leaves a follower running — call `forget` to stop it.
    pub async fn follow_telemetry(
        &self,
        node: &str,
        endpoint_id: &str,
        addresses: Vec<SocketAddr>,
        first_within: Duration,
    ) -> Result<(), String> {
        let first = self.start_following(node, endpoint_id, addresses, first_within)?;
        match tokio::time::timeout(first_within, first).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(format!("{node}: the telemetry follower stopped before descriptors arrived")),
            Err(_) => Err(format!("{node}: no telemetry descriptors within {first_within:?}")),
        }
    }

    /// Stops following `node` and drops its telemetry. False if it was not followed.
    pub fn forget(&self, node: &str) -> bool {
        let follower = self.followers().remove(node);
        self.hub.remove(node);
        follower.map(|f| f.abort()).is_some()
    }

    /// Stops every follower and closes the endpoint (workers see their control
    /// connections close and start redialling).
    pub async fn shutdown(&self) {
        for (_, follower) in self.followers().drain() {
            follower.abort();
        }
        if let Err(err) = self.router.shutdown().await {
            tracing::warn!(%err, "fleet daemon endpoint shutdown");
        }
        tracing::info!(generation = self.generation, "fleet daemon endpoint closed");
    }
}
