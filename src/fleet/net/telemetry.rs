//! The telemetry protocol (`hive/fleet-telemetry/0`, served by each worker, dialled by
//! the daemon) and its daemon side: the [`TelemetryHub`] that keeps what was pulled, and
//! the follower task that keeps one pull stream per node open for the node's lifetime.
//!
//! On one bi stream the daemon sends [`TelemetryRequest::Pull`]; the worker answers
//! [`TelemetryMessage::Descriptors`] once, then one [`TelemetryMessage::Frames`] per
//! sample interval: a frame per channel, all frames of one sample sharing their `at`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use hive_api::meta::Time;
use hive_api::node::TelemetrySummary;
use iroh::{Endpoint, EndpointAddr, EndpointId};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, oneshot};

use super::wire::{self, WireError};
use super::{Backoff, TELEMETRY_ALPN};

/// Frames kept per node for late viewers.
pub const RECENT_FRAMES: usize = 600;
/// Frames a live follower may fall behind before it misses some.
const LIVE_CAPACITY: usize = 256;

/// Which channels a pull asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Channels {
    /// Every channel the worker has.
    All,
}

/// What the daemon sends on a telemetry stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum TelemetryRequest {
    /// Start streaming.
    Pull {
        /// Which channels.
        channels: Channels,
    },
}

/// The channels every worker serves (and the GPU ones where `nvidia-smi` answers).
/// CPU use, in percent of one core (so up to 100 × cores).
pub const CPU_PERCENT: &str = "cpu.percent";
/// Memory in use (total − available), in bytes.
pub const MEMORY_USED: &str = "memory.used_bytes";
/// Memory installed, in bytes.
pub const MEMORY_TOTAL: &str = "memory.total_bytes";
/// Mean utilization over all GPUs, in percent.
pub const GPU_UTILIZATION: &str = "gpu.utilization_percent";
/// GPU memory in use summed over all GPUs, in bytes.
pub const GPU_MEMORY_USED: &str = "gpu.memory_used_bytes";
/// GPU memory installed summed over all GPUs, in bytes.
pub const GPU_MEMORY_TOTAL: &str = "gpu.memory_total_bytes";

/// Space in use on the root filesystem, in bytes.
pub const DISK_USED: &str = "disk.used_bytes";
/// Size of the root filesystem, in bytes.
pub const DISK_TOTAL: &str = "disk.total_bytes";
/// Seconds since the machine booted.
pub const UPTIME: &str = "uptime.seconds";

/// One telemetry channel of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelDescriptor {
    /// Its name, e.g. `cpu.percent`.
    pub channel: String,
    /// The unit of its values, e.g. `bytes`.
    pub unit: String,
    /// What it measures.
    pub description: String,
}

impl ChannelDescriptor {
    /// A descriptor.
    pub fn new(channel: &str, unit: &str, description: &str) -> ChannelDescriptor {
        ChannelDescriptor { channel: channel.into(), unit: unit.into(), description: description.into() }
    }
}

/// One value of one channel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// The channel.
    pub channel: String,
    /// When it was sampled (RFC 3339 on the wire).
    pub at: DateTime<Utc>,
    /// The value, in the channel's unit.
    pub value: f64,
}

/// What a worker sends on a telemetry stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "items")]
pub enum TelemetryMessage {
    /// The channels that follow (sent once, first).
    Descriptors(Vec<ChannelDescriptor>),
    /// One sample: a frame per channel read, sharing one `at`.
    Frames(Vec<Frame>),
}

/// What the hub holds about one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TelemetrySnapshot {
    /// The channels, as last described.
    pub descriptors: Vec<ChannelDescriptor>,
    /// The most recent frames, oldest first (at most [`RECENT_FRAMES`]).
    pub recent: Vec<Frame>,
}

struct NodeTelemetry {
    descriptors: Vec<ChannelDescriptor>,
    recent: VecDeque<Frame>,
    latest: HashMap<String, f64>,
    updated_at: Option<DateTime<Utc>>,
    live: broadcast::Sender<Frame>,
}

impl NodeTelemetry {
    fn new() -> NodeTelemetry {
        NodeTelemetry {
            descriptors: Vec::new(),
            recent: VecDeque::new(),
            latest: HashMap::new(),
            updated_at: None,
            live: broadcast::channel(LIVE_CAPACITY).0,
        }
    }
}

/// The telemetry pulled from every followed node: descriptors, recent frames, a live
/// feed and a summary for the Node status.
#[derive(Default)]
pub struct TelemetryHub {
    nodes: Mutex<HashMap<String, NodeTelemetry>>,
}

impl std::fmt::Debug for TelemetryHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetryHub").field("nodes", &self.nodes().len()).finish()
    }
}

impl TelemetryHub {
    fn nodes(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodeTelemetry>> {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The descriptors and recent frames of `node`; `None` before its first descriptors.
    pub fn snapshot(&self, node: &str) -> Option<TelemetrySnapshot> {
        let nodes = self.nodes();
        let entry = nodes.get(node).filter(|n| !n.descriptors.is_empty())?;
        Some(TelemetrySnapshot {
            descriptors: entry.descriptors.clone(),
            recent: entry.recent.iter().cloned().collect(),
        })
    }

    /// Live frames of `node` from now on (subscribing before telemetry flows is fine).
    pub fn subscribe(&self, node: &str) -> broadcast::Receiver<Frame> {
        self.nodes().entry(node.to_string()).or_insert_with(NodeTelemetry::new).live.subscribe()
    }

    /// The latest values of `node` in the shape of the Node status; `None` before its
    /// first frame.
    pub fn summary(&self, node: &str) -> Option<TelemetrySummary> {
        let nodes = self.nodes();
        let entry = nodes.get(node)?;
        let updated_at = entry.updated_at?;
        let value = |channel: &str| entry.latest.get(channel).copied();
        let bytes = |channel: &str| value(channel).map(|v| v.max(0.0).round() as u64);
        Some(TelemetrySummary {
            updated_at: Some(Time(updated_at)),
            cpu_percent: value(CPU_PERCENT),
            memory_used_bytes: bytes(MEMORY_USED),
            memory_total_bytes: bytes(MEMORY_TOTAL),
            gpu_utilization_percent: value(GPU_UTILIZATION),
            gpu_memory_used_bytes: bytes(GPU_MEMORY_USED),
            disk_used_bytes: bytes(DISK_USED),
            disk_total_bytes: bytes(DISK_TOTAL),
            uptime_seconds: bytes(UPTIME),
        })
    }

    /// The nodes the hub holds anything for.
    pub fn nodes_known(&self) -> Vec<String> {
        self.nodes().keys().cloned().collect()
    }

    /// Drops everything about `node` (its live followers see the feed close).
    pub fn remove(&self, node: &str) {
        self.nodes().remove(node);
    }

    /// Records the (re)announced channels of `node`.
    pub fn set_descriptors(&self, node: &str, descriptors: Vec<ChannelDescriptor>) {
        self.nodes().entry(node.to_string()).or_insert_with(NodeTelemetry::new).descriptors = descriptors;
    }

    /// Records frames of `node` and sends them to its live followers.
    pub fn push(&self, node: &str, frames: Vec<Frame>) {
        let mut nodes = self.nodes();
        let entry = nodes.entry(node.to_string()).or_insert_with(NodeTelemetry::new);
        for frame in frames {
            entry.latest.insert(frame.channel.clone(), frame.value);
            entry.updated_at = Some(entry.updated_at.map_or(frame.at, |t| t.max(frame.at)));
            if entry.recent.len() == RECENT_FRAMES {
                entry.recent.pop_front();
            }
            entry.recent.push_back(frame.clone());
            // No live follower is not an error.
            let _ = entry.live.send(frame);
        }
    }
}

/// Why one pull ended.
#[derive(Debug, thiserror::Error)]
enum PullError {
    #[error("dialling failed: {0}")]
    Connect(String),
    #[error("opening the stream failed: {0}")]
    Open(String),
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("the worker sent frames before descriptors")]
    Protocol,
    #[error("no descriptors within {0:?}")]
    NoDescriptors(Duration),
}

/// Pulls every channel of one node into `hub` until the stream fails; `first` is sent
/// once descriptors arrived. Dialling and the descriptors together may take `attempt`:
/// a worker that has not described its channels by then is dropped, to be redialled.
async fn pull_once(
    endpoint: &Endpoint,
    hub: &TelemetryHub,
    node: &str,
    addr: EndpointAddr,
    attempt: Duration,
    first: &mut Option<oneshot::Sender<()>>,
) -> Result<(), PullError> {
    let described = async {
        let conn =
            endpoint.connect(addr, TELEMETRY_ALPN).await.map_err(|e| PullError::Connect(e.to_string()))?;
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| PullError::Open(e.to_string()))?;
        wire::write_message(&mut send, &TelemetryRequest::Pull { channels: Channels::All }).await?;
        match wire::read_message(&mut recv).await? {
            TelemetryMessage::Descriptors(descriptors) => Ok((conn, send, recv, descriptors)),
            TelemetryMessage::Frames(_) => Err(PullError::Protocol),
        }
    };
    let (_conn, _send, mut recv, descriptors) = match tokio::time::timeout(attempt, described).await {
        Ok(described) => described?,
        Err(_) => return Err(PullError::NoDescriptors(attempt)),
    };
    tracing::info!(node, channels = descriptors.len(), "fleet telemetry flowing");
    hub.set_descriptors(node, descriptors);
    if let Some(first) = first.take() {
        let _ = first.send(());
    }
    loop {
        match wire::read_message(&mut recv).await? {
            TelemetryMessage::Frames(frames) => hub.push(node, frames),
            TelemetryMessage::Descriptors(descriptors) => hub.set_descriptors(node, descriptors),
        }
    }
}

/// How one node's telemetry is followed.
pub(crate) struct Follow {
    pub(crate) node: String,
    pub(crate) worker: EndpointId,
    pub(crate) addresses: Vec<SocketAddr>,
    pub(crate) backoff: Backoff,
    /// How long one attempt may take to get the worker's descriptors.
    pub(crate) attempt: Duration,
}

/// Keeps pulling the node's telemetry, redialling with its backoff after every failure
/// (a slow worker included: a slow node is slow, not lost); runs until aborted (by
/// `FleetNet::forget`). `first` is sent once the first descriptors arrived.
pub(crate) async fn follow(
    endpoint: Endpoint,
    hub: Arc<TelemetryHub>,
    follow: Follow,
    first: oneshot::Sender<()>,
) {
    let Follow { node, worker, addresses, backoff, attempt } = follow;
    let mut first = Some(first);
    let mut delay = backoff.min;
    loop {
        let addr = addresses.iter().fold(EndpointAddr::new(worker), |a, s| a.with_ip_addr(*s));
        let started = tokio::time::Instant::now();
        match pull_once(&endpoint, &hub, &node, addr, attempt, &mut first).await {
            Ok(()) => {}
            Err(err) => {
                tracing::warn!(node, %err, retry_in = ?delay, "fleet telemetry pull ended; redialling")
            }
        }
        // A stream that ran for a while resets the backoff.
        if started.elapsed() > backoff.max {
            delay = backoff.min;
        }
        tokio::time::sleep(delay).await;
        delay = backoff.next(delay);
    }
}
