//! The pure part of the Docker client: how a fleet node maps onto engine objects
//! (labels, the container name, GPU requests, which address is the node's) and how an
//! engine address is read. No IO here, so all of it is unit-tested without an engine.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use bollard::models::{DeviceRequest, EndpointSettings};

use super::{DockerError, NodeRequest, DEFAULT_HOST};

/// Label holding the fleet label (the daemon's stable identity fingerprint).
pub const LABEL_FLEET: &str = "dev.hive.fleet";
/// Label holding the run id of the daemon that created the container.
pub const LABEL_RUN_ID: &str = "dev.hive.run-id";
/// Label holding the node name.
pub const LABEL_NODE: &str = "dev.hive.node";
/// Label holding the node's logical id.
pub const LABEL_LOGICAL_ID: &str = "dev.hive.logical-id";
/// Label holding the id of the FleetCommand that created the node.
pub const LABEL_COMMAND: &str = "dev.hive.command";
/// Label on the networks this client creates.
pub const LABEL_MANAGED: &str = "dev.hive.managed";
/// How many characters of the fleet label go into a container name.
pub const FLEET_SHORT: usize = 12;

/// The labels of `req`'s container: [`LABEL_FLEET`], [`LABEL_RUN_ID`], [`LABEL_NODE`],
/// [`LABEL_LOGICAL_ID`] and [`LABEL_COMMAND`].
pub fn node_labels(req: &NodeRequest) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_FLEET.to_string(), req.fleet.clone()),
        (LABEL_RUN_ID.to_string(), req.run_id.clone()),
        (LABEL_NODE.to_string(), req.node.clone()),
        (LABEL_LOGICAL_ID.to_string(), req.logical_id.to_string()),
        (LABEL_COMMAND.to_string(), req.command.clone()),
    ])
}

/// The container name of `node` in the fleet `fleet`: `hive-<fleet-short>-<node>`, where
/// fleet-short is the first [`FLEET_SHORT`] characters of the fleet label. Characters a
/// container name cannot hold (anything but ASCII letters, digits, `_`, `.` and `-`)
/// become `-`. The name is deterministic so that a repeated create conflicts instead of
/// duplicating; two fleets whose labels share the prefix are still told apart by the
/// labels check on adoption.
pub fn container_name(fleet: &str, node: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '-' }).collect()
    };
    let fleet: String = clean(fleet).chars().take(FLEET_SHORT).collect();
    format!("hive-{fleet}-{}", clean(node))
}

/// Why a container with `req`'s name but these `labels` is not `req`'s node (a
/// description of whose it is), or `None` when fleet, node and command all match.
pub fn foreign(labels: &HashMap<String, String>, req: &NodeRequest) -> Option<String> {
    let get = |k: &str| labels.get(k).map(String::as_str);
    if get(LABEL_FLEET) == Some(req.fleet.as_str())
        && get(LABEL_NODE) == Some(req.node.as_str())
        && get(LABEL_COMMAND) == Some(req.command.as_str())
    {
        return None;
    }
    let Some(fleet) = get(LABEL_FLEET) else {
        return Some(format!("not managed by hive (no {LABEL_FLEET} label)"));
    };
    Some(format!(
        "fleet {fleet:?} node {:?} of command {:?}, not fleet {:?} node {:?} of command {:?}",
        get(LABEL_NODE).unwrap_or(""),
        get(LABEL_COMMAND).unwrap_or(""),
        req.fleet,
        req.node,
        req.command
    ))
}

/// The device request of a `--gpus` value: `all`, a count (`2`), or `device=0,1`
/// (optionally quoted as the docker CLI accepts it). The error says what was wrong.
pub fn gpu_request(gpus: &str) -> Result<DeviceRequest, String> {
    let value = gpus.trim().trim_matches('"');
    let request = DeviceRequest { capabilities: Some(vec![vec!["gpu".to_string()]]), ..Default::default() };
    if value == "all" {
        return Ok(DeviceRequest { count: Some(-1), ..request });
    }
    if let Some(ids) = value.strip_prefix("device=") {
        let ids: Vec<String> =
            ids.split(',').map(str::trim).filter(|s| !s.is_empty()).map(Into::into).collect();
        if ids.is_empty() {
            return Err(format!("gpus {gpus:?} names no device"));
        }
        return Ok(DeviceRequest { device_ids: Some(ids), ..request });
    }
    match value.parse::<u32>() {
        Ok(n) if n > 0 => Ok(DeviceRequest { count: Some(i64::from(n)), ..request }),
        _ => Err(format!("gpus {gpus:?} is not `all`, a positive count or `device=ID,…`")),
    }
}

/// The node's address: its endpoint on the network it was created on (`network_mode`),
/// else on the only network it is attached to. Empty or unparsable addresses are none.
pub fn node_ip(
    network_mode: Option<&str>,
    networks: Option<&HashMap<String, EndpointSettings>>,
) -> Option<IpAddr> {
    let networks = networks?;
    let ip = |e: &EndpointSettings| e.ip_address.as_deref().and_then(parse_ip);
    if let Some(endpoint) = network_mode.and_then(|m| networks.get(m)) {
        return ip(endpoint);
    }
    match networks.len() {
        1 => networks.values().next().and_then(ip),
        _ => None,
    }
}

/// An IP address, `None` for an empty or malformed one (the engine reports `""` for
/// "no address").
pub fn parse_ip(text: &str) -> Option<IpAddr> {
    text.trim().parse().ok()
}

/// Where the engine listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket, by path.
    Unix(String),
    /// A TCP address, as `tcp://…` or `http://…`.
    Http(String),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix://{path}"),
            Endpoint::Http(url) => f.write_str(url),
        }
    }
}

/// The engine endpoint: `host` if given, else `docker_host_env` (`DOCKER_HOST`), else
/// [`DEFAULT_HOST`]. A bare absolute path is a Unix socket.
pub fn engine_endpoint(host: Option<&str>, docker_host_env: Option<&str>) -> Result<Endpoint, DockerError> {
    let given = host.or(docker_host_env).map(str::trim).filter(|h| !h.is_empty());
    let host = given.unwrap_or(DEFAULT_HOST);
    let error = |detail: &str| DockerError::Address { host: host.to_string(), detail: detail.to_string() };
    if let Some(path) = host.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(error("a unix:// address needs an absolute socket path"));
        }
        return Ok(Endpoint::Unix(path.to_string()));
    }
    if host.starts_with('/') {
        return Ok(Endpoint::Unix(host.to_string()));
    }
    if host.starts_with("tcp://") || host.starts_with("http://") {
        return Ok(Endpoint::Http(host.to_string()));
    }
    Err(error("use unix:///path/to/docker.sock, tcp://HOST:PORT or http://HOST:PORT"))
}
