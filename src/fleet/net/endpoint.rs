//! Building the iroh endpoints of the fleet, and the control target a worker is given.
//!
//! By default ([`RelayChoice::Disabled`]) an endpoint talks only to the addresses it is
//! given: no relays, no address lookup (pkarr/DNS), no port mapping (UPnP/PCP/NAT-PMP),
//! no HTTPS probes. Every test uses it on 127.0.0.1. [`RelayChoice::N0`] opts into n0's
//! public relays and discovery for nodes behind NAT; it is never used in tests.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context as _;
use iroh::endpoint::{
    presets, AfterHandshakeOutcome, Connection, EndpointHooks, PortmapperConfig, WeakConnectionHandle,
};
use iroh::{Endpoint, EndpointAddr, EndpointId, NetReportConfig, RelayMode, SecretKey};

/// Whether an endpoint uses relays and discovery.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RelayChoice {
    /// Direct addresses only: nothing leaves the given addresses (the default).
    #[default]
    Disabled,
    /// n0's public relays and pkarr/DNS discovery (opt-in, for nodes behind NAT). It
    /// publishes the endpoint's addresses to n0's servers.
    N0,
}

/// How to bind an endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// The UDP address to bind (port 0 picks a free one).
    pub bind: SocketAddr,
    /// Relays and discovery.
    pub relay: RelayChoice,
    /// The addresses workers are told to dial the daemon at, when not the bound one (a
    /// public address, a port forward; among replicas, every replica's): the daemon's
    /// Welcome names them first. Workers' endpoints leave it empty.
    pub advertise: Vec<SocketAddr>,
}

impl NetConfig {
    /// Direct addresses only, bound to `bind`.
    pub fn direct(bind: SocketAddr) -> NetConfig {
        NetConfig { bind, relay: RelayChoice::Disabled, advertise: Vec::new() }
    }

    /// Direct addresses only, on 127.0.0.1 with a free port (tests).
    pub fn loopback() -> NetConfig {
        NetConfig::direct(SocketAddr::from(([127, 0, 0, 1], 0)))
    }
}

/// Binds an endpoint with `secret`, accepting `alpns` (a `Router` may replace them).
pub async fn bind(secret: SecretKey, config: &NetConfig, alpns: Vec<Vec<u8>>) -> anyhow::Result<Endpoint> {
    bind_with(secret, config, alpns, None).await
}

/// [`bind`], with every connection the endpoint makes or accepts kept (weakly) in the
/// returned [`Tracked`].
pub async fn bind_tracked(
    secret: SecretKey,
    config: &NetConfig,
    alpns: Vec<Vec<u8>>,
) -> anyhow::Result<(Endpoint, Tracked)> {
    let tracked = Tracked::default();
    let endpoint = bind_with(secret, config, alpns, Some(tracked.clone())).await?;
    Ok((endpoint, tracked))
}

async fn bind_with(
    secret: SecretKey,
    config: &NetConfig,
    alpns: Vec<Vec<u8>>,
    tracked: Option<Tracked>,
) -> anyhow::Result<Endpoint> {
    let mut builder = match config.relay {
        RelayChoice::Disabled => Endpoint::builder(presets::Minimal)
            .relay_mode(RelayMode::Disabled)
            .clear_address_lookup()
            .portmapper_config(PortmapperConfig::Disabled)
            .net_report_config(NetReportConfig::minimal()),
        RelayChoice::N0 => Endpoint::builder(presets::N0),
    };
    if let Some(tracked) = tracked {
        builder = builder.hooks(tracked);
    }
    let endpoint = builder
        .clear_ip_transports()
        .bind_addr(config.bind)
        .with_context(|| format!("invalid bind address {}", config.bind))?
        .secret_key(secret)
        .alpns(alpns)
        .bind()
        .await
        .with_context(|| format!("binding the fleet endpoint on {}", config.bind))?;
    Ok(endpoint)
}

/// The live connections of an endpoint with each remote, as weak handles (they keep
/// nothing open).
///
/// A worker closes every connection it still holds with its daemon when the daemon stops
/// answering. iroh sends a new connection's handshake only along the path it selected
/// for that remote while it holds any connection with it, and keeps that selection when
/// the connections on it end. So after a daemon dies without closing anything (SIGKILL,
/// a lost host), the dead daemon's half-open connections — and a connection the next
/// daemon, with the same identity at another address, opened meanwhile — would keep
/// every redial going to the dead address. With none left, iroh tries every address
/// the worker knows.
#[derive(Clone, Debug, Default)]
pub struct Tracked(Arc<Mutex<Vec<(EndpointId, WeakConnectionHandle)>>>);

impl Tracked {
    fn connections(&self) -> std::sync::MutexGuard<'_, Vec<(EndpointId, WeakConnectionHandle)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes every live connection with `remote`; how many there were.
    pub fn close_all(&self, remote: EndpointId, reason: &str) -> usize {
        let mut closed = 0;
        self.connections().retain(|(id, handle)| {
            let Some(conn) = handle.upgrade() else { return false };
            if *id != remote {
                return true;
            }
            conn.close(0u32.into(), reason.as_bytes());
            closed += 1;
            false
        });
        closed
    }

    /// How many connections with `remote` are live.
    pub fn live(&self, remote: EndpointId) -> usize {
        self.connections().iter().filter(|(id, handle)| *id == remote && handle.upgrade().is_some()).count()
    }
}

impl EndpointHooks for Tracked {
    fn after_handshake<'a>(
        &'a self,
        conn: &'a Connection,
    ) -> impl std::future::Future<Output = AfterHandshakeOutcome> + Send + 'a {
        let mut connections = self.connections();
        connections.retain(|(_, handle)| handle.upgrade().is_some());
        connections.push((conn.remote_id(), conn.weak_handle()));
        std::future::ready(AfterHandshakeOutcome::accept())
    }
}

/// Where a worker finds the daemon: its endpoint id and the addresses to dial, written
/// `<endpoint-id>@<ip:port>[,<ip:port>…]` (the id in hex).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlTarget {
    /// The daemon's endpoint id.
    pub endpoint_id: EndpointId,
    /// Its addresses.
    pub addresses: Vec<SocketAddr>,
}

impl ControlTarget {
    /// The address to dial.
    pub fn endpoint_addr(&self) -> EndpointAddr {
        self.addresses.iter().fold(EndpointAddr::new(self.endpoint_id), |a, s| a.with_ip_addr(*s))
    }

    /// `sockets` with unspecified IPs (0.0.0.0, ::) replaced by `advertise`; those
    /// without a replacement are left out.
    pub fn advertised(sockets: &[SocketAddr], advertise: Option<IpAddr>) -> Vec<SocketAddr> {
        sockets
            .iter()
            .filter_map(|s| match (s.ip().is_unspecified(), advertise) {
                (false, _) => Some(*s),
                (true, Some(ip)) if ip.is_ipv4() == s.is_ipv4() => Some(SocketAddr::new(ip, s.port())),
                (true, _) => None,
            })
            .collect()
    }
}

impl fmt::Display for ControlTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@", self.endpoint_id)?;
        for (i, addr) in self.addresses.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{addr}")?;
        }
        Ok(())
    }
}

impl FromStr for ControlTarget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (id, addrs) = s
            .split_once('@')
            .ok_or_else(|| format!("{s:?} is not <endpoint-id>@<ip:port>[,<ip:port>...]"))?;
        let endpoint_id = id.parse().map_err(|e| format!("invalid endpoint id {id:?}: {e}"))?;
        let addresses = addrs
            .split(',')
            .map(|a| a.trim().parse().map_err(|e| format!("invalid address {a:?}: {e}")))
            .collect::<Result<Vec<SocketAddr>, _>>()?;
        let unusable = addresses.iter().find(|a| a.ip().is_unspecified() || a.port() == 0);
        if let Some(addr) = unusable {
            return Err(format!("{addr} cannot be dialled"));
        }
        Ok(ControlTarget { endpoint_id, addresses })
    }
}

/// The local IP the kernel would use to reach `peer` (no packet is sent).
pub fn local_ip_towards(peer: SocketAddr) -> std::io::Result<IpAddr> {
    let any: SocketAddr = if peer.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let socket = std::net::UdpSocket::bind(any)?;
    socket.connect(peer)?;
    Ok(socket.local_addr()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_targets_round_trip_and_bad_ones_say_why() {
        let id = SecretKey::from_bytes(&[3; 32]).public();
        let text = format!("{id}@127.0.0.1:4000,[::1]:4001");
        let target: ControlTarget = text.parse().unwrap();
        assert_eq!(target.endpoint_id, id);
        assert_eq!(target.addresses.len(), 2);
        assert_eq!(target.to_string(), text);
        assert!("nope".parse::<ControlTarget>().unwrap_err().contains("<endpoint-id>@"));
        assert!("zz@127.0.0.1:1".parse::<ControlTarget>().unwrap_err().contains("invalid endpoint id"));
        let err = format!("{id}@0.0.0.0:4000").parse::<ControlTarget>().unwrap_err();
        assert_eq!(err, "0.0.0.0:4000 cannot be dialled");
        assert!(format!("{id}@nohost").parse::<ControlTarget>().unwrap_err().contains("invalid address"));
    }

    #[test]
    fn unspecified_sockets_take_the_advertised_ip() {
        let sockets: Vec<SocketAddr> = vec!["0.0.0.0:7000".parse().unwrap(), "[::]:7001".parse().unwrap()];
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        assert_eq!(ControlTarget::advertised(&sockets, Some(ip)), vec!["10.0.0.5:7000".parse().unwrap()]);
        assert!(ControlTarget::advertised(&sockets, None).is_empty());
        let fixed: Vec<SocketAddr> = vec!["127.0.0.1:7000".parse().unwrap()];
        assert_eq!(ControlTarget::advertised(&fixed, None), fixed);
    }

    #[test]
    fn the_route_to_loopback_is_loopback() {
        let ip = local_ip_towards("127.0.0.1:9".parse().unwrap()).unwrap();
        assert!(ip.is_loopback(), "{ip}");
    }
}
