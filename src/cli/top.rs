//! `hive top [agents|nodes]`: what agents and fleet nodes use now, as `kubectl top`. An
//! agent's CPU (percent of one core, over the server's window) and resident memory of
//! its process tree come from `GET /hive/v1/agents/usage`; a node's from its Node's
//! telemetry summary (`status.telemetry`), as the fleet's workers report it. Pure tables
//! (typed answers in, text out), snapshot-tested.

use anyhow::Result;
use hive_api::agent::Agent;
use hive_api::node::NodePhase;
use hive_api::usage::{AgentUsage, AgentUsageList};
use hive_api::{AgentList, Node, NodeList};

use super::client;
use super::{output, Context};

/// Show CPU and memory of agents (and fleet nodes).
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive top            # agents, then fleet nodes
  hive top agents
  hive top nodes")]
pub struct Args {
    /// What to show: agents, nodes, or both (the default).
    #[arg(value_enum)]
    pub what: Option<What>,
}

/// What `hive top` shows.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    /// Each agent's process tree on the daemon's host.
    Agents,
    /// Each fleet node, from its telemetry.
    Nodes,
}

/// Runs `hive top`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let client = ctx.client()?;
    let mut out = String::new();
    if args.what != Some(What::Nodes) {
        let usage: AgentUsageList =
            client::decode(&client.get("/hive/v1/agents/usage").await?, "usage list")?;
        let agents: AgentList = client::decode(&client.get("/apis/hive.dev/v1/agents").await?, "AgentList")?;
        out.push_str(&render_agents(&usage, &agents.items));
    }
    if args.what != Some(What::Agents) {
        let nodes: NodeList = client::decode(&client.get("/apis/hive.dev/v1/nodes").await?, "NodeList")?;
        if args.what == Some(What::Nodes) || !nodes.items.is_empty() {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&render_nodes(&nodes.items));
        }
    }
    output::print(&out)?;
    Ok(())
}

/// `12.3Mi` / `1.5Gi`: memory as `kubectl top` writes it (binary units).
pub fn memory(bytes: u64) -> String {
    let mib = bytes as f64 / (1u64 << 20) as f64;
    if mib >= 1024.0 {
        format!("{:.1}Gi", mib / 1024.0)
    } else {
        format!("{mib:.1}Mi")
    }
}

/// The agents table: NAME STATUS CPU MEMORY PROCESSES NODE, by name; an agent without a
/// measure shows `-` and why.
pub fn render_agents(usage: &AgentUsageList, agents: &[Agent]) -> String {
    let mut items: Vec<&AgentUsage> = usage.items.iter().collect();
    items.sort_by(|a, b| a.name.cmp(&b.name));
    let mut rows =
        vec![["NAME", "STATUS", "CPU", "MEMORY", "PROCESSES", "NODE", "NOTE"].map(String::from).to_vec()];
    for u in items {
        let status = agents
            .iter()
            .find(|a| a.metadata.name == u.name)
            .and_then(|a| a.status.phase)
            .map_or("-", |p| p.as_str());
        rows.push(vec![
            u.name.clone(),
            status.to_string(),
            u.cpu_percent.map_or("-".into(), |c| format!("{c:.1}%")),
            u.memory_bytes.map_or("-".into(), memory),
            u.processes.map_or("-".into(), |p| p.to_string()),
            u.node.clone().unwrap_or_else(|| "-".into()),
            u.reason.clone().unwrap_or_default(),
        ]);
    }
    table(rows)
}

/// The nodes table: NAME PHASE CPU MEMORY MEMORY% GPUS, by logical id, from each Node's
/// telemetry; a node that does not run (or has reported nothing) shows `-`.
pub fn render_nodes(nodes: &[Node]) -> String {
    let mut nodes: Vec<&Node> = nodes.iter().collect();
    nodes.sort_by_key(|n| n.spec.logical_id);
    let mut rows = vec![["NAME", "PHASE", "CPU", "MEMORY", "MEMORY%", "GPUS"].map(String::from).to_vec()];
    for node in nodes {
        let live = matches!(node.status.phase, Some(NodePhase::Running | NodePhase::Provisioning));
        let t = node.status.telemetry.clone().filter(|_| live).unwrap_or_default();
        let percent = match (t.memory_used_bytes, t.memory_total_bytes) {
            (Some(used), Some(total)) if total > 0 => format!("{:.0}%", used as f64 * 100.0 / total as f64),
            _ => "-".into(),
        };
        rows.push(vec![
            node.metadata.name.clone(),
            node.status.phase.map_or("Pending", NodePhase::as_str).to_string(),
            t.cpu_percent.map_or("-".into(), |c| format!("{c:.1}%")),
            t.memory_used_bytes.map_or("-".into(), memory),
            percent,
            node.status.gpus.len().to_string(),
        ]);
    }
    table(rows)
}

fn table(rows: Vec<Vec<String>>) -> String {
    let mut widths = Vec::new();
    output::align(&rows, &mut widths).lines().map(|l| format!("{}\n", l.trim_end())).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn agents_and_nodes() {
        let usage: AgentUsageList = serde_json::from_value(json!({"windowSeconds": 1.0, "items": [
            {"name": "writer", "cpuPercent": 0.0, "memoryBytes": 3_250_000, "processes": 1},
            {"name": "manager", "cpuPercent": 37.5, "memoryBytes": 1_717_986_918u64, "processes": 4},
            {"name": "researcher", "reason": "not running"},
            {"name": "placed", "node": "node-1", "reason": "runs on fleet node node-1: see hive top nodes"},
        ]}))
        .unwrap();
        let agents: Vec<Agent> = serde_json::from_value(json!([
            {"metadata": {"name": "manager"}, "spec": {}, "status": {"phase": "Running"}},
            {"metadata": {"name": "researcher"}, "spec": {}, "status": {"phase": "Stopped"}},
            {"metadata": {"name": "writer"}, "spec": {}, "status": {"phase": "Running"}},
        ]))
        .unwrap();
        let nodes: Vec<Node> = serde_json::from_value(json!([
            {"metadata": {"name": "node-2"}, "spec": {"provider": "process", "logicalId": 2},
             "status": {"phase": "Killed", "telemetry": {"cpuPercent": 50.0}}},
            {"metadata": {"name": "node-1"}, "spec": {"provider": "process", "logicalId": 1},
             "status": {"phase": "Running", "telemetry": {"cpuPercent": 11.04, "memoryUsedBytes": 2_147_483_648u64,
                        "memoryTotalBytes": 8_589_934_592u64}}},
        ]))
        .unwrap();
        insta::assert_snapshot!(format!("{}\n{}", render_agents(&usage, &agents), render_nodes(&nodes)));
    }
}
