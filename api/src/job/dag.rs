//! The pure checks of a Job's graph: node ids unique, agents named where a node needs
//! one, every dep naming another node of the Job, and no cycles (Kahn's algorithm; the
//! submit layer runs its own toposort, this is what admission reports field by field).

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
/// another node of the Job, and no cycles. A cycle is reported on each of its edges,
/// at `spec.nodes[i].deps[j]`.
pub(super) fn validate(errors: &mut Errors, nodes: &[JobNode]) {
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

    for cycle in cycles(&deps) {
        let names: Vec<&str> = cycle.iter().map(|&(i, _)| nodes[i].id.as_str()).collect();
        let mut path = names.join(" -> ");
        path.push_str(" -> ");
        path.push_str(names[0]);
        let mut edges = cycle;
        edges.sort();
        for (i, j) in edges {
            errors.push(
                format!("spec.nodes[{i}].deps[{j}]"),
                Reason::Invalid,
                format!(
                    "{:?}: dependency cycle {path} (each node depends on the next)",
                    nodes[i].deps[j].node
                ),
            );
        }
    }
}

/// Finds dependency cycles with Kahn's algorithm. `deps[i]` lists `(node, dep position)`
/// for each node `i` depends on. Returns each cycle found as its edges `(node, dep
/// position)` in order along the cycle; the nodes a cycle holds are removed before
/// looking for the next, so every cycle is reported once.
fn cycles(deps: &[Vec<(usize, usize)>]) -> Vec<Vec<(usize, usize)>> {
    let n = deps.len();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, ds) in deps.iter().enumerate() {
        for &(d, _) in ds {
            dependents[d].push(i);
        }
    }
    let mut active = vec![true; n];
    let mut found = Vec::new();
    loop {
        // Forward Kahn: peel nodes whose deps are all peeled. What stays is on a cycle
        // or downstream of one.
        let mut pending: Vec<usize> =
            (0..n).map(|i| deps[i].iter().filter(|&&(d, _)| active[d]).count()).collect();
        let mut left = active.clone();
        let mut queue: VecDeque<usize> = (0..n).filter(|&i| active[i] && pending[i] == 0).collect();
        while let Some(i) = queue.pop_front() {
            left[i] = false;
            for &m in &dependents[i] {
                if left[m] {
                    pending[m] -= 1;
                    if pending[m] == 0 {
                        queue.push_back(m);
                    }
                }
            }
        }
        // Backward Kahn: peel nodes nothing left depends on. What stays is on a cycle
        // (or on a path between cycles), and each such node has a dep that stays.
        let mut users: Vec<usize> =
            (0..n).map(|i| dependents[i].iter().filter(|&&m| left[m]).count()).collect();
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
        let Some(start) = (0..n).find(|&i| left[i]) else { return found };
        // Walk deps that stay until a node repeats; the repeat closes a cycle.
        let mut walk: Vec<(usize, usize)> = Vec::new();
        let mut at = start;
        let cycle = loop {
            if let Some(pos) = walk.iter().position(|&(i, _)| i == at) {
                break walk.split_off(pos);
            }
            let &(next, j) =
                deps[at].iter().find(|&&(d, _)| left[d]).expect("a remaining node has a remaining dep");
            walk.push((at, j));
            at = next;
        };
        for &(i, _) in &cycle {
            active[i] = false;
        }
        found.push(cycle);
    }
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
        let meta_lock = json!({"id": "lock", "kind": "MetaLock"});
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
            // a -> b -> a, with c downstream of the cycle: only the cycle's edges.
            (
                json!([node("a", &["b"]), node("b", &["a"]), node("c", &["a"])]),
                &["spec.nodes[0].deps[0]", "spec.nodes[1].deps[0]"],
            ),
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
                &[
                    "spec.nodes[1].deps[1]",
                    "spec.nodes[2].deps[0]",
                    "spec.nodes[3].deps[0]",
                    "spec.nodes[4].deps[0]",
                    "spec.nodes[5].deps[0]",
                ],
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
        assert_eq!(errs.len(), 3);
        assert!(errs[0].message.contains("a -> c -> b -> a"), "{}", errs[0].message);
    }
}
