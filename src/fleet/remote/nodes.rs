//! [`FleetNodes`]: the fleet's side of `runtime::placed::Remotes` — where each stored
//! agent is placed, and one [`RemoteRuntime`] per node, dialled at the endpoint and
//! addresses its worker joined with (the Node's status).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use hive_api::agent::Agent;
use hive_api::node::{Node, NodePhase};
use iroh::{Endpoint, EndpointAddr, EndpointId};
use tokio::sync::broadcast;

use super::RemoteRuntime;
use crate::client::Api;
use crate::runtime::placed::Remotes;
use crate::runtime::{Runtime, RuntimeEvent, Unanswerable};
use crate::store::Store;

/// The runtimes of the fleet's nodes.
pub struct FleetNodes {
    store: Store,
    endpoint: Endpoint,
    ship: PathBuf,
    events: broadcast::Sender<RuntimeEvent>,
    runtimes: Mutex<HashMap<String, Arc<RemoteRuntime>>>,
}

impl std::fmt::Debug for FleetNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetNodes").field("ship", &self.ship).finish_non_exhaustive()
    }
}

impl FleetNodes {
    /// Nodes dialled from the daemon's fleet `endpoint`; config bundles made in `ship`.
    pub fn new(store: Store, endpoint: Endpoint, ship: PathBuf) -> FleetNodes {
        let (events, _) = broadcast::channel(1024);
        FleetNodes { store, endpoint, ship, events, runtimes: Mutex::new(HashMap::new()) }
    }
}

/// Where `node`'s worker is, from its stored status: a node that is gone (no record, or
/// Killing, Killed, Stopped, Failed, Orphaned) is lost; one still coming up is waited for.
fn locate(store: &Store, node: &str) -> Result<EndpointAddr, Unanswerable> {
    let found = Api::<Node>::new(store).get(node).map_err(|e| Unanswerable::Waiting(e.to_string()))?;
    let node = found.ok_or_else(|| Unanswerable::Lost(format!("there is no Node named {node:?}")))?;
    let name = &node.metadata.name;
    let phase = node.status.phase.map_or("without a phase", |p| p.as_str());
    match node.status.phase {
        Some(NodePhase::Running) => {}
        Some(
            NodePhase::Killing
            | NodePhase::Killed
            | NodePhase::Stopped
            | NodePhase::Failed
            | NodePhase::Orphaned,
        ) => {
            return Err(Unanswerable::Lost(format!("node {name} is {phase}")));
        }
        _ => return Err(Unanswerable::Waiting(format!("node {name} is {phase}, not Running yet"))),
    }
    let joined = node.status.endpoint_id.as_deref();
    let id = joined.ok_or_else(|| Unanswerable::Waiting(format!("node {name}'s worker has not joined")))?;
    let id: EndpointId = id
        .parse()
        .map_err(|e| Unanswerable::Lost(format!("node {name}: its endpoint id {id:?} is invalid: {e}")))?;
    let addresses: Vec<SocketAddr> = node.status.addresses.iter().filter_map(|a| a.parse().ok()).collect();
    Ok(addresses.iter().fold(EndpointAddr::new(id), |addr, s| addr.with_ip_addr(*s)))
}

impl Remotes for FleetNodes {
    fn placement(&self, agent: &str) -> Option<String> {
        // Most agents are not placed: look for the field in the stored JSON before
        // decoding (the daemon asks this of every agent at exit).
        let raw = Api::<Agent>::new(&self.store).get_raw(agent)?;
        if !std::str::from_utf8(raw.json()).is_ok_and(|json| json.contains("\"placement\"")) {
            return None;
        }
        let agent = Api::<Agent>::new(&self.store).get(agent).ok()??;
        agent.spec.placement.map(|p| p.node)
    }

    fn runtime(&self, node: &str) -> Result<Arc<dyn Runtime>, String> {
        let mut runtimes = self.runtimes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(runtime) = runtimes.get(node) {
            return Ok(runtime.clone());
        }
        if Api::<Node>::new(&self.store).get(node).map_err(|e| e.to_string())?.is_none() {
            return Err(format!("there is no Node named {node:?}"));
        }
        let store = self.store.clone();
        let name = node.to_string();
        let runtime = Arc::new(RemoteRuntime::new(
            node,
            self.endpoint.clone(),
            Arc::new(move || locate(&store, &name)),
            self.ship.clone(),
            self.events.clone(),
        ));
        runtimes.insert(node.to_string(), runtime.clone());
        Ok(runtime)
    }

    fn build_slots(&self, node: &str) -> usize {
        Api::<Node>::new(&self.store).get(node).ok().flatten().map_or(1, |node| node.spec.build_slots())
    }

    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.events.subscribe()
    }
}
