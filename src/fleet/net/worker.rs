//! The worker side: a fresh endpoint (random key per start; the worker's logical
//! identity is its node name and logical id) that serves telemetry pulls, and the
//! control loop that joins the daemon and, whenever the control connection drops,
//! redials with backoff, resolves [`CONTROL_NAME`] and rejoins — binding to a new control
//! generation, and to the control address the Welcome names, only after the daemon's
//! Welcome (sent once the facts are persisted).

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use iroh::endpoint::{Connection, RecvStream, SendStream};
use iroh::protocol::{AcceptError, ProtocolHandler, Router};
use iroh::{Endpoint, EndpointId, SecretKey};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::control::{ControlReply, ControlRequest, Hello, HelloKind, CONTROL_NAME};
use super::endpoint::{self, ControlTarget, NetConfig};
use super::sampler::{self, Sampler};
use super::telemetry::{Frame, TelemetryMessage, TelemetryRequest};
use super::wire;
use super::{Backoff, CONTROL_ALPN, TELEMETRY_ALPN};

/// How long dialling the daemon and each control reply may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the Welcome may take: the daemon persists the facts first. A daemon that
/// dies meanwhile closes the connection (or lets it time out) sooner.
const WELCOME_TIMEOUT: Duration = Duration::from_secs(60);

/// How a worker runs.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The node name.
    pub node: String,
    /// The node's logical id.
    pub logical_id: u64,
    /// Where the daemon is.
    pub control: ControlTarget,
    /// How to bind the worker's endpoint.
    pub net: NetConfig,
    /// How often telemetry is sampled and sent.
    pub telemetry_interval: Duration,
    /// How often the control connection is checked with a heartbeat.
    pub heartbeat_interval: Duration,
    /// Delays between control redials.
    pub backoff: Backoff,
    /// The node's join token (from the daemon, at the resource's creation).
    pub join_token: Option<super::control::JoinToken>,
    /// Where the node's agents live (`<dir>/agents`) and their config bundles land:
    /// with one, the worker serves the agent runtime protocol to its daemon.
    pub state_dir: Option<std::path::PathBuf>,
}

impl WorkerConfig {
    /// The defaults: bound to 0.0.0.0:0 without relays, telemetry every second,
    /// heartbeats every 5 s.
    pub fn new(node: &str, logical_id: u64, control: ControlTarget) -> WorkerConfig {
        WorkerConfig {
            node: node.to_string(),
            logical_id,
            control,
            net: NetConfig::direct(SocketAddr::from(([0, 0, 0, 0], 0))),
            telemetry_interval: Duration::from_secs(1),
            heartbeat_interval: Duration::from_secs(5),
            backoff: Backoff::default(),
            join_token: None,
            state_dir: None,
        }
    }
}

/// What the worker's control loop has reached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerStatus {
    /// The control generation the worker is bound to: set by a Welcome, never before.
    pub bound_generation: Option<u64>,
    /// Whether a welcomed control connection is open now.
    pub connected: bool,
    /// How many Hellos the daemon refused so far.
    pub refusals: u32,
    /// Where the worker redials the daemon, as the last Welcome said (`None` before it).
    pub control: Option<ControlTarget>,
}

/// A running worker (its endpoint, telemetry service and control loop).
pub struct Worker {
    router: Router,
    agents: Option<crate::fleet::remote::RuntimeService>,
    control: JoinHandle<()>,
    status: watch::Receiver<WorkerStatus>,
    advertised: Vec<SocketAddr>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("status", &*self.status.borrow()).finish_non_exhaustive()
    }
}

impl Worker {
    /// Binds the endpoint, starts serving telemetry and starts joining the daemon (in
    /// the background: watch [`Worker::status`] for the Welcome).
    pub async fn start(config: WorkerConfig) -> anyhow::Result<Worker> {
        let started_at = crate::host::now();
        let alpns = vec![TELEMETRY_ALPN.to_vec(), crate::fleet::remote::RUNTIME_ALPN.to_vec()];
        let (endpoint, tracked) = endpoint::bind_tracked(SecretKey::generate(), &config.net, alpns)
            .await
            .context("starting the fleet worker endpoint")?;
        let advertised = advertised_addresses(&endpoint.bound_sockets(), &config.control)?;
        let service = TelemetryService { node: config.node.clone(), interval: config.telemetry_interval };
        let mut router = Router::builder(endpoint.clone()).accept(TELEMETRY_ALPN, service);
        let agents = match &config.state_dir {
            Some(dir) => {
                let service = agent_runtime(&config.node, config.control.endpoint_id, dir).await?;
                router = router.accept(crate::fleet::remote::RUNTIME_ALPN, service.clone());
                Some(service)
            }
            None => None,
        };
        let router = router.spawn();
        tracing::info!(
            node = config.node,
            endpoint_id = %endpoint.id(),
            addrs = ?advertised,
            daemon = %config.control,
            "fleet worker endpoint started"
        );
        let (status_tx, status) = watch::channel(WorkerStatus::default());
        let control =
            tokio::spawn(control_loop(endpoint, tracked, config, advertised.clone(), started_at, status_tx));
        Ok(Worker { router, agents, control, status, advertised })
    }

    /// The worker endpoint's id (random per start).
    pub fn endpoint_id(&self) -> EndpointId {
        self.router.endpoint().id()
    }

    /// The UDP sockets the endpoint is bound to.
    pub fn bound_sockets(&self) -> Vec<SocketAddr> {
        self.router.endpoint().bound_sockets()
    }

    /// The addresses advertised to the daemon in each Hello.
    pub fn advertised(&self) -> &[SocketAddr] {
        &self.advertised
    }

    /// The control loop's progress.
    pub fn status(&self) -> watch::Receiver<WorkerStatus> {
        self.status.clone()
    }

    /// Stops the control loop and closes the endpoint (the daemon sees the worker leave).
    pub async fn shutdown(self) {
        self.control.abort();
        if let Some(agents) = &self.agents {
            agents.stop_all().await;
        }
        if let Err(err) = self.router.shutdown().await {
            tracing::warn!(%err, "fleet worker endpoint shutdown");
        }
    }
}

/// The node's agent runtime: the process runtime in `<dir>/agents`, served to `daemon`
/// only. Processes a previous worker left (it died without stopping them) are stopped.
async fn agent_runtime(
    node: &str,
    daemon: EndpointId,
    dir: &std::path::Path,
) -> anyhow::Result<crate::fleet::remote::RuntimeService> {
    use crate::runtime::process::{ProcessConfig, ProcessRuntime};
    use crate::runtime::Runtime as _;
    let agents_dir = dir.join("agents");
    crate::durable::create_dir_all(&agents_dir)
        .with_context(|| format!("creating the worker's agent directory {}", agents_dir.display()))?;
    let runtime = std::sync::Arc::new(ProcessRuntime::new(ProcessConfig::new(agents_dir.clone())));
    runtime.attach(&Vec::new).await;
    Ok(crate::fleet::remote::RuntimeService::new(node, daemon, runtime, agents_dir, dir.join("incoming")))
}

/// Runs a worker until `shutdown` resolves, calling `on_ready` after the first Welcome.
pub async fn run(
    config: WorkerConfig,
    on_ready: impl FnOnce() -> anyhow::Result<()>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let worker = Worker::start(config).await?;
    let mut status = worker.status();
    tokio::pin!(shutdown);
    let welcomed = tokio::select! {
        bound = status.wait_for(|s| s.bound_generation.is_some()) => bound.is_ok(),
        () = &mut shutdown => false,
    };
    let result = if welcomed {
        let ready = on_ready();
        if ready.is_ok() {
            shutdown.await;
        }
        ready
    } else {
        Ok(())
    };
    worker.shutdown().await;
    result
}

/// The bound sockets, with an unspecified IP replaced by the local IP that routes to
/// the daemon.
fn advertised_addresses(bound: &[SocketAddr], control: &ControlTarget) -> anyhow::Result<Vec<SocketAddr>> {
    let route = match control.addresses.first() {
        Some(daemon) if bound.iter().any(|s| s.ip().is_unspecified()) => Some(
            endpoint::local_ip_towards(*daemon)
                .with_context(|| format!("finding the local address that reaches {daemon}"))?,
        ),
        _ => None,
    };
    let advertised = ControlTarget::advertised(bound, route);
    anyhow::ensure!(!advertised.is_empty(), "no advertisable address among {bound:?}");
    Ok(advertised)
}

/// Why one control session ended.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("dialling the daemon failed: {0}")]
    Connect(String),
    #[error("the daemon did not answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Wire(#[from] wire::WireError),
    #[error("the daemon refused the hello: {0}")]
    Refused(String),
    #[error("unexpected reply {0:?}")]
    Unexpected(Box<ControlReply>),
    #[error("the control connection closed: {0}")]
    Closed(String),
}

struct Stream {
    send: SendStream,
    recv: RecvStream,
}

impl Stream {
    async fn ask(&mut self, request: &ControlRequest) -> Result<ControlReply, SessionError> {
        self.ask_within(request, CONTROL_TIMEOUT).await
    }

    async fn ask_within(
        &mut self,
        request: &ControlRequest,
        within: Duration,
    ) -> Result<ControlReply, SessionError> {
        wire::write_message(&mut self.send, request).await?;
        match tokio::time::timeout(within, wire::read_message(&mut self.recv)).await {
            Ok(reply) => Ok(reply?),
            Err(_) => Err(SessionError::Timeout(within)),
        }
    }
}

/// Joins (or rejoins), then keeps the connection checked until it fails.
async fn control_loop(
    endpoint: Endpoint,
    tracked: endpoint::Tracked,
    config: WorkerConfig,
    advertised: Vec<SocketAddr>,
    started_at: chrono::DateTime<chrono::Utc>,
    status: watch::Sender<WorkerStatus>,
) {
    let node = config.node.as_str();
    let mut delay = config.backoff.min;
    // Where the daemon is: as the worker was started, then as each Welcome says.
    let mut target = config.control.clone();
    loop {
        let result = session(&endpoint, &config, &mut target, &advertised, started_at, &status).await;
        let was_welcomed = status.borrow().connected;
        status.send_modify(|s| s.connected = false);
        match result {
            Err(SessionError::Refused(reason)) => {
                status.send_modify(|s| s.refusals = s.refusals.saturating_add(1));
                tracing::warn!(node, reason, retry_in = ?delay, "fleet worker: hello refused; retrying");
            }
            Err(err) => {
                tracing::warn!(node, %err, retry_in = ?delay, "fleet worker: control connection ended")
            }
            Ok(()) => {}
        }
        // Whatever is still open with the daemon's identity (its telemetry pull and
        // agent runtime connections, a dead daemon's half-open ones) is closed before
        // the redial, so the redial tries every address the worker knows (see
        // `endpoint::Tracked`): the daemon may be another replica, elsewhere.
        let closed =
            tracked.close_all(target.endpoint_id, "the worker lost its control connection; redialling");
        if closed > 0 {
            tracing::info!(
                node,
                closed,
                "fleet worker: closed the daemon's other connections before redialling"
            );
        }
        if was_welcomed {
            delay = config.backoff.min;
        }
        tokio::time::sleep(delay).await;
        delay = config.backoff.next(delay);
    }
}

async fn session(
    endpoint: &Endpoint,
    config: &WorkerConfig,
    target: &mut ControlTarget,
    advertised: &[SocketAddr],
    started_at: chrono::DateTime<chrono::Utc>,
    status: &watch::Sender<WorkerStatus>,
) -> Result<(), SessionError> {
    let node = config.node.as_str();
    let dial = endpoint.connect(target.endpoint_addr(), CONTROL_ALPN);
    let conn = match tokio::time::timeout(CONTROL_TIMEOUT, dial).await {
        Ok(conn) => conn.map_err(|e| SessionError::Connect(e.to_string()))?,
        Err(_) => return Err(SessionError::Timeout(CONTROL_TIMEOUT)),
    };
    let (send, recv) = conn.open_bi().await.map_err(|e| SessionError::Connect(e.to_string()))?;
    let mut stream = Stream { send, recv };
    tracing::info!(node, daemon = %conn.remote_id().fmt_short(), "fleet worker: connected to the daemon");
    let bound = status.borrow().bound_generation;
    let kind = match bound {
        None => HelloKind::Join,
        Some(bound) => {
            let binding = match stream.ask(&ControlRequest::Resolve { name: CONTROL_NAME.into() }).await? {
                ControlReply::Binding(binding) => binding,
                other => return Err(SessionError::Unexpected(Box::new(other))),
            };
            if binding.generation != bound {
                tracing::info!(
                    node,
                    bound,
                    generation = binding.generation,
                    "fleet worker: control binding changed; rejoining"
                );
            } else {
                // Same daemon run: rejoin anyway, so the daemon knows whose connection
                // this is (it reported the old one lost).
                tracing::info!(
                    node,
                    generation = bound,
                    "fleet worker: control binding unchanged; rejoining"
                );
            }
            HelloKind::Rejoin
        }
    };
    let hello = Hello {
        kind,
        node: node.to_string(),
        logical_id: config.logical_id,
        endpoint_id: endpoint.id().to_string(),
        addresses: advertised.to_vec(),
        facts: sampler::runtime_facts(started_at).await,
        bound_generation: bound,
        join_token: config.join_token.clone(),
    };
    tracing::info!(node, ?kind, "fleet worker: hello sent; waiting for welcome");
    match stream.ask_within(&ControlRequest::Hello(hello), WELCOME_TIMEOUT).await? {
        ControlReply::Welcome { generation, daemon_endpoint_id, addresses } => {
            // The facts are persisted: bind to this generation, and redial the daemon
            // where it says it is from now on.
            *target = rebind(target, &daemon_endpoint_id, &addresses);
            status.send_modify(|s| {
                s.bound_generation = Some(generation);
                s.connected = true;
                s.control = Some(target.clone());
            });
            tracing::info!(node, generation, daemon = %target, "fleet worker: welcomed; bound");
        }
        ControlReply::Refused { reason } => return Err(SessionError::Refused(reason)),
        other => return Err(SessionError::Unexpected(Box::new(other))),
    }
    let mut ticks = tokio::time::interval(config.heartbeat_interval);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => match stream.ask(&ControlRequest::Heartbeat).await? {
                ControlReply::Ack => {}
                other => return Err(SessionError::Unexpected(Box::new(other))),
            },
            err = conn.closed() => return Err(SessionError::Closed(err.to_string())),
        }
    }
}

/// Where to redial after a Welcome from the daemon `endpoint_id` naming `addresses`:
/// those addresses (an unspecified IP replaced by each IP the worker reaches the daemon
/// at now), then the ones dialled so far that the Welcome did not name, as a fallback.
/// A Welcome naming no address (an older daemon) or an id that does not parse leaves the
/// target as it is.
pub(super) fn rebind(current: &ControlTarget, endpoint_id: &str, addresses: &[SocketAddr]) -> ControlTarget {
    let Ok(endpoint_id) = endpoint_id.parse() else { return current.clone() };
    if addresses.is_empty() {
        return current.clone();
    }
    let mut rebound = Vec::new();
    for address in addresses {
        if address.port() == 0 {
            continue;
        }
        if address.ip().is_unspecified() {
            let reached = current.addresses.iter().filter(|a| a.is_ipv4() == address.is_ipv4());
            rebound.extend(reached.map(|a| SocketAddr::new(a.ip(), address.port())));
        } else {
            rebound.push(*address);
        }
    }
    for address in &current.addresses {
        rebound.push(*address);
    }
    let mut seen = std::collections::HashSet::new();
    rebound.retain(|a| seen.insert(*a));
    ControlTarget { endpoint_id, addresses: rebound }
}

/// The worker side of the telemetry ALPN: each pull gets its own sampler.
#[derive(Debug, Clone)]
struct TelemetryService {
    node: String,
    interval: Duration,
}

impl ProtocolHandler for TelemetryService {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        let (mut send, mut recv) = conn.accept_bi().await?;
        let request: TelemetryRequest = wire::read_message(&mut recv).await.map_err(AcceptError::from_err)?;
        let TelemetryRequest::Pull { channels } = request;
        tracing::info!(node = self.node, ?channels, "fleet worker: telemetry pull started");
        let mut sampler = Sampler::new().await;
        let descriptors = TelemetryMessage::Descriptors(sampler.descriptors());
        wire::write_message(&mut send, &descriptors).await.map_err(AcceptError::from_err)?;
        let mut ticks = tokio::time::interval(self.interval);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let at = crate::host::now();
            let frames = sampler
                .sample()
                .await
                .into_iter()
                .map(|(channel, value)| Frame { channel: channel.to_string(), at, value })
                .collect();
            if let Err(err) = wire::write_message(&mut send, &TelemetryMessage::Frames(frames)).await {
                tracing::info!(node = self.node, %err, "fleet worker: telemetry pull ended");
                return Ok(());
            }
        }
    }
}
