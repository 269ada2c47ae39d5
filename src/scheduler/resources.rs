//! The resources a node may need before it runs: build slots (a count, held by heavy
//! nodes for their duration) and per-agent lifecycle leases (exclusive across DAGs,
//! held by the owning DAG until it is terminal). Also the lease-order check that keeps
//! DAGs spanning agents from deadlocking on each other's leases.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::watch;

use super::dag::Dag;

/// The set of agents whose lease some DAG holds, as published to crash-watch.
pub type LeasedAgents = Arc<HashSet<String>>;

/// Build slots and agent leases.
#[derive(Debug)]
pub(super) struct Resources {
    slots_total: usize,
    slots_used: usize,
    /// Other hosts' build slots (fleet nodes that build their placed agents): total, used.
    hosts: HashMap<Arc<str>, (usize, usize)>,
    /// Agent → `seq` of the DAG holding its lease.
    leases: HashMap<String, u64>,
    leased: watch::Sender<LeasedAgents>,
    leases_changed: bool,
}

impl Resources {
    /// `build_slots` slots (at least one) and no leases; the receiver follows the
    /// leased-agent set.
    pub(super) fn new(build_slots: usize) -> (Resources, watch::Receiver<LeasedAgents>) {
        let (leased, rx) = watch::channel(LeasedAgents::default());
        let resources = Resources {
            slots_total: build_slots.max(1),
            slots_used: 0,
            hosts: HashMap::new(),
            leases: HashMap::new(),
            leased,
            leases_changed: false,
        };
        (resources, rx)
    }

    /// How many more heavy nodes could start now on `host` (`None`: the daemon's).
    pub(super) fn slots_left(&self, host: Option<&str>) -> usize {
        match host {
            None => self.slots_total - self.slots_used,
            Some(host) => self.hosts.get(host).map_or(1, |(total, used)| total.saturating_sub(*used)),
        }
    }

    /// Sets how many build slots `host` has (at least one), keeping those in use.
    pub(super) fn host_slots(&mut self, host: &Arc<str>, total: usize) {
        self.hosts.entry(host.clone()).or_insert((0, 0)).0 = total.max(1);
    }

    /// Takes a build slot on `host`; the caller checked [`Resources::slots_left`].
    pub(super) fn take_slot(&mut self, host: Option<&Arc<str>>) {
        debug_assert!(self.slots_left(host.map(|h| &**h)) > 0);
        match host {
            None => self.slots_used += 1,
            Some(host) => self.hosts.entry(host.clone()).or_insert((1, 0)).1 += 1,
        }
    }

    /// Returns a build slot to `host`.
    pub(super) fn give_slot(&mut self, host: Option<&Arc<str>>) {
        match host {
            None => self.slots_used -= 1,
            Some(host) => {
                if let Some((_, used)) = self.hosts.get_mut(host) {
                    *used = used.saturating_sub(1);
                }
            }
        }
    }

    /// The DAG holding `agent`'s lease.
    pub(super) fn holder(&self, agent: &str) -> Option<u64> {
        self.leases.get(agent).copied()
    }

    /// Gives `agent`'s lease to DAG `seq`; the lease must be free.
    pub(super) fn acquire(&mut self, agent: &str, seq: u64) {
        let previous = self.leases.insert(agent.to_string(), seq);
        debug_assert!(previous.is_none(), "lease of {agent} taken twice");
        self.leases_changed = true;
    }

    /// Frees `agent`'s lease.
    pub(super) fn release(&mut self, agent: &str) {
        self.leases.remove(agent);
        self.leases_changed = true;
    }

    /// Publishes the leased-agent set if it changed since the last call.
    pub(super) fn publish(&mut self) {
        if std::mem::take(&mut self.leases_changed) {
            let set: HashSet<String> = self.leases.keys().cloned().collect();
            self.leased.send_replace(Arc::new(set));
        }
    }
}

/// Whether giving `agent`'s (free) lease to DAG `seq` could deadlock.
///
/// Leases are held until a DAG is terminal, so a DAG spanning agents that holds one
/// lease and waits for another can close a cycle with a DAG doing the reverse (rebuild
/// `x, y` holding `y` while its Prebuild of `x` runs; stop `x, y` taking `x`). The
/// scheduler keeps the graph "DAG D may wait for DAG H" (D still needs a lease H holds)
/// acyclic: the grant is refused when some DAG D already (transitively) waits for also
/// needs `agent`, since it would then wait for D too. The graph stays acyclic, so some
/// DAG waits for nobody and can always progress: no deadlock. A refused DAG simply
/// waits, like any DAG whose lease is busy.
pub(super) fn would_deadlock(
    dags: &BTreeMap<u64, Dag>,
    resources: &Resources,
    seq: u64,
    agent: &str,
) -> bool {
    let mut seen: Vec<u64> = vec![seq];
    let mut stack = vec![seq];
    while let Some(at) = stack.pop() {
        let Some(dag) = dags.get(&at) else { continue };
        for needed in dag.needs() {
            if let Some(holder) = resources.holder(needed) {
                if holder != at && !seen.contains(&holder) {
                    seen.push(holder);
                    stack.push(holder);
                }
            }
        }
    }
    seen[1..].iter().any(|h| dags.get(h).is_some_and(|d| d.needs_agent(agent)))
}

#[cfg(test)]
mod tests {
    use hive_api::job::{Edge, JobNode, JobNodeKind};
    use hive_api::{JobSpec, Time};

    use super::*;
    use crate::scheduler::log::NodeLog;

    fn dag(seq: u64, nodes: Vec<JobNode>) -> Dag {
        let spec = JobSpec { nodes, ..Default::default() };
        Dag::new(seq, format!("j{seq}").into(), Arc::new(spec), Time::from_unix(0).unwrap())
    }

    #[test]
    fn a_crossed_lease_grant_is_refused() {
        use JobNodeKind::*;
        // DAG 1 holds y and still needs x (after its prebuild); DAG 2 wants x now and y
        // later. Giving x to DAG 2 would make each wait for the other.
        let mut one = dag(
            1,
            vec![
                JobNode::new("py", Prebuild, Some("y")),
                JobNode::new("sy", StopForUpdate, Some("y")).after("py", Edge::AfterOk),
                JobNode::new("px", Prebuild, Some("x")),
                JobNode::new("sx", StopForUpdate, Some("x")).after("px", Edge::AfterOk),
            ],
        );
        let two =
            dag(2, vec![JobNode::new("wx", SetWanted, Some("x")), JobNode::new("wy", SetWanted, Some("y"))]);
        let (mut res, rx) = Resources::new(1);
        one.start(1, Time::from_unix(0).unwrap(), NodeLog::new(1));
        res.acquire("y", 1);
        one.held.push("y".into());
        let dags: BTreeMap<u64, Dag> = [(1, one), (2, two)].into();
        // DAG 2 waits for DAG 1 (y), which needs x: refused.
        assert!(would_deadlock(&dags, &res, 2, "x"));
        // DAG 1 waits for nobody: granted.
        assert!(!would_deadlock(&dags, &res, 1, "x"));
        res.publish();
        assert!(rx.borrow().contains("y"));
    }
}
