//! The pure checks of a Job's graph: at most `MAX_NODES` nodes, node ids unique, agents
//! named where a node needs one, every dep naming another node of the Job, and no cycles
//! (Kahn's algorithm; the submit layer runs its own toposort, this is what admission
//! reports field by field). Every check is linear in the nodes and deps, and a refusal's
//! causes and messages are bounded whatever the graph.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::JobNode;
use crate::validation::{self, Errors, Reason};

/// Checks a node id: 1–253 characters of letters, digits, '-', '_', '.', ':' or '/'.
fn node_id(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > 253 {
        return Err("must be no more than 253 characters".into());
    }
    if !value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b)) {
        return Err("must consist of letters, digits, '-', '_', '.', ':' or '/'".into());
    }
    Ok(())
}

/// Validates the DAG: node ids unique, agents named where needed, every dep naming
/// another node of the Job, and no cycles. A cycle is reported once, at its first edge
/// `spec.nodes[i].deps[j]`, with a bounded path; at most `MAX_CYCLES_REPORTED` are listed.
pub(super) fn validate(errors: &mut Errors, nodes: &[JobNode]) {
    if nodes.len() > super::MAX_NODES {
        // Checked before anything else, so a refusal costs no more than its count.
        let message = format!("must have at most {} nodes (has {})", super::MAX_NODES, nodes.len());
        errors.push("spec.nodes", Reason::TooMany, message);
        return;
    }
    // Deps resolve to the first node carrying an id.
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        let at = format!("spec.nodes[{i}].id");
        if let Err(why) = node_id(&node.id) {
            let reason = if node.id.is_empty() { Reason::Required } else { Reason::Invalid };
            errors.push(at.clone(), reason, format!("{:?}: {why}", node.id));
        }
        if node.id.is_empty() {
            continue;
        }
        match index.entry(&node.id) {
            Entry::Occupied(_) => errors.push(at, Reason::Duplicate, format!("{:?}", node.id)),
            Entry::Vacant(slot) => {
                slot.insert(i);
            }
        }
    }

    // deps[i] = indices of the nodes node i depends on, with the dep's position.
    let mut deps: Vec<Vec<(usize, usize)>> = vec![Vec::new(); nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        match (&node.agent, node.kind.needs_agent()) {
            (Some(agent), _) => validation::name(errors, &format!("spec.nodes[{i}].agent"), agent),
            (None, true) => errors.push(
                format!("spec.nodes[{i}].agent"),
                Reason::Required,
                format!("a {} node acts on an agent", node.kind.as_str()),
            ),
            (None, false) => {}
        }
        let mut named = BTreeSet::new();
        for (j, dep) in node.deps.iter().enumerate() {
            let at = format!("spec.nodes[{i}].deps[{j}]");
            if dep.node == node.id {
                errors.push(at, Reason::Invalid, format!("{:?}: a node cannot depend on itself", dep.node));
            } else if let Some(&d) = index.get(dep.node.as_str()) {
                if named.insert(d) {
                    deps[i].push((d, j));
                } else {
                    errors.push(at, Reason::Duplicate, format!("{:?}", dep.node));
                }
            } else {
                errors.push(
                    at,
                    Reason::Invalid,
                    format!("{:?}: no node with this id in spec.nodes", dep.node),
                );
            }
        }
    }

    let found = cycles(&deps);
    for cycle in found.iter().take(MAX_CYCLES_REPORTED) {
        let names: Vec<&str> = cycle.iter().map(|&(i, _)| nodes[i].id.as_str()).collect();
        let path = cycle_path(&names);
        // Reported once, at the cycle's first edge in node order: a message the size of
        // a cycle on each of its edges would grow with the square of the cycle.
        let &(i, j) = cycle.iter().min().expect("a cycle has edges");
        errors.push(
            format!("spec.nodes[{i}].deps[{j}]"),
            Reason::Invalid,
            format!("{:?}: dependency cycle {path} (each node depends on the next)", nodes[i].deps[j].node),
        );
    }
    if found.len() > MAX_CYCLES_REPORTED {
        errors.push(
            "spec.nodes",
            Reason::Invalid,
            format!("{} more dependency cycles not listed", found.len() - MAX_CYCLES_REPORTED),
        );
    }
}

/// How many cycles one refusal lists; the rest are counted.
const MAX_CYCLES_REPORTED: usize = 16;

/// How many of a cycle's nodes its message names.
const MAX_PATH_NAMES: usize = 8;

/// `a -> b -> c -> a`, or for a long cycle its first nodes, how many there are, and
/// the way back: `a -> b -> … -> (5000 nodes in all) -> a`.
fn cycle_path(names: &[&str]) -> String {
    let mut path = if names.len() <= MAX_PATH_NAMES {
        names.join(" -> ")
    } else {
        format!("{} -> … ({} nodes in all)", names[..MAX_PATH_NAMES].join(" -> "), names.len())
    };
    path.push_str(" -> ");
    path.push_str(names[0]);
    path
}

/// Finds node-disjoint dependency cycles in time linear in nodes plus deps. `deps[i]`
/// lists `(node, dep position)` for each node `i` depends on. Returns each cycle found
/// as its edges `(node, dep position)` in order along the cycle.
///
/// Kahn's algorithm forward (peel nodes whose deps are all peeled) and backward (peel
/// nodes nothing left depends on) leaves the nodes on cycles or on paths between them,
/// each with a dep that stays. A walk from each such node along deps that stay either
/// closes a cycle (it meets itself) or reaches a node an earlier walk passed; every node
/// is walked through once.
fn cycles(deps: &[Vec<(usize, usize)>]) -> Vec<Vec<(usize, usize)>> {
    let n = deps.len();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, ds) in deps.iter().enumerate() {
        for &(d, _) in ds {
            dependents[d].push(i);
        }
    }
    let mut left = vec![true; n];
    let mut pending: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut queue: VecDeque<usize> = (0..n).filter(|&i| pending[i] == 0).collect();
    while let Some(i) = queue.pop_front() {
        left[i] = false;
        for &m in &dependents[i] {
            pending[m] -= 1;
            if pending[m] == 0 {
                queue.push_back(m);
            }
        }
    }
    let mut users: Vec<usize> = (0..n).map(|i| dependents[i].iter().filter(|&&m| left[m]).count()).collect();
    let mut queue: VecDeque<usize> = (0..n).filter(|&i| left[i] && users[i] == 0).collect();
    while let Some(i) = queue.pop_front() {
        left[i] = false;
        for &(d, _) in &deps[i] {
            if left[d] {
                users[d] -= 1;
                if users[d] == 0 {
                    queue.push_back(d);
                }
            }
        }
    }

    const UNSEEN: usize = usize::MAX;
    // A node's place in the walk now passing through it; `walked` once any walk has.
    let mut place = vec![UNSEEN; n];
    let mut walked = vec![false; n];
    let mut found = Vec::new();
    for start in 0..n {
        if !left[start] || walked[start] {
            continue;
        }
        let mut walk: Vec<(usize, usize)> = Vec::new();
        let mut at = start;
        loop {
            if walked[at] {
                break;
            }
            if place[at] != UNSEEN {
                found.push(walk[place[at]..].to_vec());
                break;
            }
            let Some(&(next, j)) = deps[at].iter().find(|&&(d, _)| left[d]) else { break };
            place[at] = walk.len();
            walk.push((at, j));
            at = next;
        }
        for &(i, _) in &walk {
            place[i] = UNSEEN;
            walked[i] = true;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::job::Job;
    use crate::resource::{decode, validate};
    use crate::testing::error_fields;

    fn job(nodes: Value) -> Value {
        json!({"metadata": {"name": "j"}, "spec": {"template": "Rebuild", "nodes": nodes}})
    }

    fn node(id: &str, deps: &[&str]) -> Value {
        let deps: Vec<Value> = deps.iter().map(|d| json!({"node": d})).collect();
        json!({"id": id, "kind": "Reconcile", "agent": "alpha", "deps": deps})
    }

    #[test]
    fn graph_rules_name_their_fields() {
        let meta_lock = json!({"id": "lock", "kind": "MetaLock", "params": {"inputs": ["hive"]}});
        let no_agent = json!({"id": "x", "kind": "Swap"});
        let cases: Vec<(Value, &[&str])> = vec![
            (json!([node("a", &[]), node("b", &["a"]), node("c", &["a", "b"])]), &[]),
            (json!([]), &["spec.nodes"]),
            (json!([node("a", &[]), node("a", &[])]), &["spec.nodes[1].id"]),
            (json!([node("", &[])]), &["spec.nodes[0].id"]),
            (json!([node("a b", &[])]), &["spec.nodes[0].id"]),
            (json!([node("a", &[]), node("b", &["zz"])]), &["spec.nodes[1].deps[0]"]),
            (json!([node("a", &["a"])]), &["spec.nodes[0].deps[0]"]),
            (json!([node("a", &[]), node("b", &["a", "a"])]), &["spec.nodes[1].deps[1]"]),
            (json!([meta_lock]), &[]),
            (json!([no_agent]), &["spec.nodes[0].agent"]),
            (json!([{"id": "x", "kind": "Swap", "agent": "Alpha"}]), &["spec.nodes[0].agent"]),
            // a -> b -> a, with c downstream of the cycle: the cycle, once, at its first edge.
            (json!([node("a", &["b"]), node("b", &["a"]), node("c", &["a"])]), &["spec.nodes[0].deps[0]"]),
            // Two separate cycles, and a node feeding one of them.
            (
                json!([
                    node("r", &[]),
                    node("a", &["r", "c"]),
                    node("b", &["a"]),
                    node("c", &["b"]),
                    node("x", &["y"]),
                    node("y", &["x"])
                ]),
                &["spec.nodes[1].deps[1]", "spec.nodes[4].deps[0]"],
            ),
        ];
        for (nodes, want) in cases {
            assert_eq!(error_fields::<Job>(&job(nodes.clone())), want, "nodes {nodes}");
        }
    }

    #[test]
    fn a_cycle_message_names_its_nodes_in_order() {
        let (j, _) =
            decode::<Job>(&job(json!([node("a", &["c"]), node("b", &["a"]), node("c", &["b"])]))).unwrap();
        let errs = validate(&j);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].message.contains("a -> c -> b -> a"), "{}", errs[0].message);
    }

    fn ring(len: usize) -> Value {
        let nodes: Vec<Value> =
            (0..len).map(|i| node(&format!("n{i}"), &[&format!("n{}", (i + 1) % len)])).collect();
        job(Value::Array(nodes))
    }

    // Regression: a 1,000-node ring put the whole path into every edge's message (14 MB
    // of error); a 5,000-node ring drove the daemon out of memory.
    #[test]
    fn a_long_cycle_is_one_bounded_message() {
        let (j, _) = decode::<Job>(&ring(super::super::MAX_NODES)).unwrap();
        let errs = validate(&j);
        assert_eq!(errs.len(), 1, "one cause for one cycle");
        assert_eq!(errs[0].field, "spec.nodes[0].deps[0]");
        let message = &errs[0].message;
        assert!(message.len() < 200, "{message}");
        assert!(message.contains(&format!("({} nodes in all) -> n0", super::super::MAX_NODES)), "{message}");
    }

    // Regression: 20,000 two-node cycles took 12.9 s of CPU (a full Kahn pass per cycle)
    // and listed every one.
    #[test]
    fn many_cycles_are_found_in_one_pass_and_listed_up_to_a_bound() {
        let pairs = super::super::MAX_NODES / 2;
        let nodes: Vec<Value> = (0..pairs)
            .flat_map(|p| {
                [node(&format!("a{p}"), &[&format!("b{p}")]), node(&format!("b{p}"), &[&format!("a{p}")])]
            })
            .collect();
        let (j, _) = decode::<Job>(&job(Value::Array(nodes))).unwrap();
        let errs = validate(&j);
        assert_eq!(errs.len(), super::MAX_CYCLES_REPORTED + 1, "the listed cycles and a count of the rest");
        let last = errs.last().unwrap();
        assert_eq!(last.field, "spec.nodes");
        assert_eq!(
            last.message,
            format!("{} more dependency cycles not listed", pairs - super::MAX_CYCLES_REPORTED)
        );
    }

    #[test]
    fn a_job_over_the_node_limit_is_refused_at_spec_nodes_alone() {
        let (j, _) = decode::<Job>(&ring(super::super::MAX_NODES + 1)).unwrap();
        let errs = validate(&j);
        assert_eq!(errs.len(), 1, "{:?}", &errs[..errs.len().min(3)]);
        assert_eq!(errs[0].field, "spec.nodes");
        assert!(errs[0].message.contains("at most 5000 nodes"), "{}", errs[0].message);
    }
}
