//! `hive fleet provision|kill|status`: explicit fleet commands through the REST API.
//! Every command carries a command id (generated and printed when not given, so a retry
//! can reuse it); re-sending an id returns the original command and never repeats
//! provider work.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::bail;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::Context;

const COMMANDS: &str = "/apis/hive.dev/v1/fleetcommands";
const NODES: &str = "/apis/hive.dev/v1/nodes";

/// Arguments of `hive fleet`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Verb,
}

#[derive(clap::Subcommand, Debug)]
enum Verb {
    /// Create nodes, then wait until they are ready (or failed), printing progress.
    Provision {
        /// How many nodes to create.
        #[arg(long, value_name = "N")]
        count: u32,
        /// The Provider to create them with.
        #[arg(long, value_name = "NAME", default_value = "process")]
        provider: String,
        /// The command id; reuse it to retry safely. Default: a new one, printed first.
        #[arg(long, value_name = "ID")]
        command_id: Option<String>,
        /// Return once the command is recorded.
        #[arg(long)]
        no_wait: bool,
    },
    /// Stop one node (its record is kept), then wait until it is done.
    Kill {
        /// The node, e.g. `node-7`.
        node: String,
        /// The command id; reuse it to retry safely. Default: a new one, printed first.
        #[arg(long, value_name = "ID")]
        command_id: Option<String>,
        /// Return once the command is recorded.
        #[arg(long)]
        no_wait: bool,
    },
    /// List the fleet's nodes.
    Status,
}

/// Runs `hive fleet`.
pub async fn exec(args: Args, ctx: &Context) -> anyhow::Result<()> {
    let client = ctx.client()?;
    let (id, spec, no_wait) = match args.command {
        Verb::Status => {
            let list = client.get(NODES).await?;
            let items = list["items"].as_array().cloned().unwrap_or_default();
            print!("{}", render_nodes(&items, Utc::now()));
            return Ok(());
        }
        Verb::Provision { count, provider, command_id, no_wait } => {
            (command_id, json!({"provision": {"provider": provider, "count": count}}), no_wait)
        }
        Verb::Kill { node, command_id, no_wait } => (command_id, json!({"kill": {"node": node}}), no_wait),
    };
    let id = id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    eprintln!("command id: {id} (rerun with --command-id {id} to retry safely)");
    let body =
        json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id}, "spec": spec});
    let mut command = client.post(COMMANDS, &body).await?;
    let mut last = String::new();
    loop {
        let line = progress(&command, &client_nodes(&client, &command).await);
        if line != last {
            println!("{line}");
            last = line;
        }
        let phase = command["status"]["phase"].as_str().unwrap_or("");
        if phase == "Succeeded" || no_wait {
            return Ok(());
        }
        if phase == "Failed" {
            bail!(
                "fleet command {id} failed: {}",
                command["status"]["error"].as_str().unwrap_or("unknown error")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        command = client.get(&format!("{COMMANDS}/{id}")).await?;
    }
}

async fn client_nodes(client: &super::client::Client, command: &Value) -> BTreeMap<String, Value> {
    let mut nodes = BTreeMap::new();
    for name in command["status"]["nodes"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        if let Ok(Some(node)) = client.get_opt(&format!("{NODES}/{name}")).await {
            nodes.insert(name.to_string(), node);
        }
    }
    nodes
}

/// One progress line: the command's phase and each node's phase.
pub fn progress(command: &Value, nodes: &BTreeMap<String, Value>) -> String {
    let phase = command["status"]["phase"].as_str().unwrap_or("Pending");
    let parts: Vec<String> = nodes
        .iter()
        .map(|(name, node)| format!("{name} {}", node["status"]["phase"].as_str().unwrap_or("Pending")))
        .collect();
    format!("{} {phase}: {}", command["metadata"]["name"].as_str().unwrap_or(""), parts.join(", "))
}

/// The node table: NAME LOGICAL-ID PHASE PROVIDER REF AGE.
pub fn render_nodes(nodes: &[Value], now: DateTime<Utc>) -> String {
    let mut rows = vec![["NAME", "LOGICAL-ID", "PHASE", "PROVIDER", "REF", "AGE"].map(String::from).to_vec()];
    let mut nodes: Vec<&Value> = nodes.iter().collect();
    nodes.sort_by_key(|n| n["spec"]["logicalId"].as_u64().unwrap_or(0));
    for node in nodes {
        let r = &node["status"]["providerRef"];
        let reference = match (r["pid"].as_u64(), r["containerId"].as_str(), r["instanceId"].as_u64()) {
            (Some(pid), _, _) => format!("pid {pid}"),
            (_, Some(c), _) => c.chars().take(12).collect(),
            (_, _, Some(i)) => format!("instance {i}"),
            _ => "-".into(),
        };
        rows.push(vec![
            node["metadata"]["name"].as_str().unwrap_or("").to_string(),
            node["spec"]["logicalId"].as_u64().map_or("-".into(), |i| i.to_string()),
            node["status"]["phase"].as_str().unwrap_or("Pending").to_string(),
            node["spec"]["provider"].as_str().unwrap_or("").to_string(),
            reference,
            crate::age::age(node["metadata"]["creationTimestamp"].as_str(), now),
        ]);
    }
    let widths: Vec<usize> =
        (0..6).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_table_sorts_by_logical_id() {
        let now = Utc::now();
        let created = (now - chrono::Duration::seconds(90)).to_rfc3339();
        let node = |name: &str, id: u64, phase: &str| {
            json!({"metadata": {"name": name, "creationTimestamp": created},
                   "spec": {"logicalId": id, "provider": "process"},
                   "status": {"phase": phase, "providerRef": {"pid": 4242}}})
        };
        let text = render_nodes(&[node("node-10", 10, "Killed"), node("node-2", 2, "Running")], now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAME"), "{text}");
        assert!(
            lines[1].starts_with("node-2 ") && lines[1].contains("Running") && lines[1].contains("pid 4242")
        );
        assert!(lines[2].starts_with("node-10") && lines[2].contains("Killed"), "{text}");
    }
}
