//! `hive fleet provision|kill|offers|configure|status`: explicit fleet commands through
//! the REST API. Every command carries a command id (generated and printed when not
//! given, so a retry can reuse it); re-sending an id returns the original command and
//! never repeats provider work.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use chrono::{DateTime, Utc};
use hive_api::fleet_command::FleetCommandPhase;
use hive_api::node::NodePhase;
use hive_api::provider::ProviderState;
use hive_api::{FleetCommand, FleetCommandList, Node, NodeList, Provider, ProviderList, Time};
use serde_json::{json, Value};

use super::client::{decode, Query};
use super::Context;

const COMMANDS: &str = "/apis/hive.dev/v1/fleetcommands";
const NODES: &str = "/apis/hive.dev/v1/nodes";
const PROVIDERS: &str = "/apis/hive.dev/v1/providers";

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
        /// Vast.ai: lease exactly these offers, one per node (see `hive fleet offers`).
        #[arg(long = "offer", value_name = "ID")]
        offers: Vec<u64>,
        /// The Provider to create them with (default: the daemon's, `hive serve --provider`).
        #[arg(long, value_name = "NAME")]
        provider: Option<String>,
        /// The image of the nodes (default: the Provider's).
        #[arg(long, value_name = "IMAGE")]
        image: Option<String>,
        /// How many builds of the agents placed on one node run at once there (1 to 64;
        /// default 1).
        #[arg(long, value_name = "N")]
        build_slots: Option<u32>,
        /// The command id; reuse it to retry safely. Default: a new one, printed first.
        #[arg(long, value_name = "ID")]
        command_id: Option<String>,
        /// Return once the command is recorded.
        #[arg(long)]
        no_wait: bool,
    },
    /// Stop one node (destroying its process, container or instance; its record is
    /// kept), then wait until it is done.
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
    /// Search a Vast.ai provider's offers without leasing anything.
    Offers {
        /// The Vast.ai Provider (default: the daemon's when it is one, else `vastai`).
        #[arg(long, value_name = "NAME")]
        provider: Option<String>,
        /// GPU model, e.g. "RTX 4090".
        #[arg(long, value_name = "MODEL")]
        gpu: Option<String>,
        /// GPUs per instance.
        #[arg(long, value_name = "N")]
        num_gpus: Option<u32>,
        /// Minimum memory per GPU, in GB.
        #[arg(long, value_name = "GB")]
        min_gpu_ram: Option<u32>,
        /// Maximum price, in dollars per hour.
        #[arg(long, value_name = "USD")]
        max_price: Option<f64>,
        /// Minimum host reliability, 0 to 1.
        #[arg(long, value_name = "R")]
        min_reliability: Option<f64>,
        /// Only verified hosts.
        #[arg(long)]
        verified: bool,
        /// Country codes, comma-separated, e.g. US,DE.
        #[arg(long, value_name = "CC,…")]
        geo: Option<String>,
    },
    /// Give a Vast.ai provider its API key (held in the daemon's memory only, never
    /// stored or shown) and bootstrap settings; they are checked first, and a key
    /// Vast.ai refuses changes nothing.
    Configure {
        /// The Provider, e.g. `vastai` (created when it does not exist yet).
        provider: String,
        /// A file holding the API key.
        #[arg(long, value_name = "FILE")]
        api_key_file: Option<PathBuf>,
        /// Base URL of the Vast.ai API.
        #[arg(long, value_name = "URL")]
        base_url: Option<String>,
        /// Default image of the nodes.
        #[arg(long, value_name = "IMAGE")]
        image: Option<String>,
        /// A file holding the on-start (bootstrap) script.
        #[arg(long, value_name = "FILE")]
        onstart_file: Option<PathBuf>,
        /// Disk per instance, in GB.
        #[arg(long, value_name = "GB")]
        disk_gb: Option<u32>,
    },
    /// Providers and their readiness, recent commands, and every node with its phase,
    /// provider reference, live telemetry and errors.
    Status {
        /// How many recent commands to show.
        #[arg(long, value_name = "N", default_value_t = 10)]
        commands: usize,
    },
}

/// Runs `hive fleet`.
pub async fn exec(args: Args, ctx: &Context) -> anyhow::Result<()> {
    let client = ctx.client()?;
    let (id, spec, no_wait) = match args.command {
        Verb::Status { commands } => return status(&client, commands).await,
        Verb::Offers { provider, gpu, num_gpus, min_gpu_ram, max_price, min_reliability, verified, geo } => {
            let query = Query::default()
                .push_opt("provider", provider)
                .push_opt("gpu", gpu)
                .push_opt("numGpus", num_gpus.map(|n| n.to_string()))
                .push_opt("minGpuRamGb", min_gpu_ram.map(|n| n.to_string()))
                .push_opt("maxPrice", max_price.map(|n| n.to_string()))
                .push_opt("minReliability", min_reliability.map(|n| n.to_string()))
                .push_opt("verified", verified.then_some("true"))
                .push_opt("geo", geo);
            let answer = client.get(&format!("/hive/v1/fleet/offers{query}")).await?;
            super::output::print(&render_offers(answer["offers"].as_array().map_or(&[][..], Vec::as_slice)))?;
            return Ok(());
        }
        Verb::Configure { provider, api_key_file, base_url, image, onstart_file, disk_gb } => {
            let mut body = json!({});
            if let Some(path) = api_key_file {
                let key = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading the API key file {}", path.display()))?;
                body["apiKey"] = json!(key.trim());
            }
            if let Some(path) = onstart_file {
                let script = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading the on-start script {}", path.display()))?;
                body["onstart"] = json!(script);
            }
            for (field, value) in [("baseUrl", base_url), ("image", image)] {
                if let Some(value) = value {
                    body[field] = json!(value);
                }
            }
            if let Some(disk) = disk_gb {
                body["diskGb"] = json!(disk);
            }
            let path = format!("/hive/v1/fleet/providers/{}/configure", super::client::encode(&provider));
            let stored: Provider = decode(&client.post(&path, &body).await?, "Provider")?;
            super::output::print(&format!(
                "provider {provider}: {} {}\n",
                stored.status.state.map_or("?", ProviderState::as_str),
                stored.status.message.as_deref().unwrap_or("")
            ))?;
            return Ok(());
        }
        Verb::Provision { count, offers, provider, image, build_slots, command_id, no_wait } => {
            let mut provision = json!({"count": count});
            if let Some(provider) = provider {
                provision["provider"] = json!(provider);
            }
            if !offers.is_empty() {
                provision["selectedOfferIds"] = json!(offers);
            }
            if let Some(slots) = build_slots {
                provision["buildSlots"] = json!(slots);
            }
            if let Some(image) = image {
                provision["image"] = json!(image);
            }
            (command_id, json!({"provision": provision}), no_wait)
        }
        Verb::Kill { node, command_id, no_wait } => (command_id, json!({"kill": {"node": node}}), no_wait),
    };
    let generated = id.is_none();
    let id = id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    if generated {
        // Printed first, so `hive fleet status` and a retry can name the command.
        super::output::eprint_line(&format!("command id: {id}"));
    }
    let outcome = submit_and_follow(&client, &id, spec, no_wait).await;
    if let Err(err) = &outcome {
        // Only when it helps: the id was made up here (a given one the user already
        // has) and the server's answer was lost, so the command may or may not exist.
        // A refusal created nothing; a Failed command stays failed under its id.
        if generated && err.chain().any(|e| e.is::<super::client::ConnectError>()) {
            super::output::eprint_line(&format!("rerun with --command-id {id} to retry safely"));
        }
    }
    outcome
}

/// Creates the FleetCommand `id` and prints its progress until it succeeds (or at once
/// with `no_wait`); an error when it fails.
async fn submit_and_follow(
    client: &super::client::Client,
    id: &str,
    spec: Value,
    no_wait: bool,
) -> anyhow::Result<()> {
    let body =
        json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand", "metadata": {"name": id}, "spec": spec});
    let mut command: FleetCommand = decode(&client.post(COMMANDS, &body).await?, "FleetCommand")?;
    let mut last = String::new();
    loop {
        let line = progress(&command, &client_nodes(client, &command).await?);
        if line != last {
            super::output::print(&format!("{line}\n"))?;
            last = line;
        }
        let phase = command.status.phase;
        if phase == Some(FleetCommandPhase::Succeeded) || no_wait {
            return Ok(());
        }
        if phase == Some(FleetCommandPhase::Failed) {
            bail!(
                "fleet command {id} failed: {}",
                command.status.error.as_deref().unwrap_or("unknown error")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        command = decode(&client.get(&format!("{COMMANDS}/{id}")).await?, "FleetCommand")?;
    }
}

async fn status(client: &super::client::Client, recent: usize) -> anyhow::Result<()> {
    let now = crate::host::now();
    let providers: ProviderList = decode(&client.get(PROVIDERS).await?, "ProviderList")?;
    let commands: FleetCommandList = decode(&client.get(COMMANDS).await?, "FleetCommandList")?;
    let nodes: NodeList = decode(&client.get(NODES).await?, "NodeList")?;
    super::output::print("PROVIDERS\n")?;
    super::output::print(&render_providers(&providers.items))?;
    super::output::print("\nRECENT COMMANDS\n")?;
    super::output::print(&render_commands(&commands.items, recent, now))?;
    super::output::print("\nNODES\n")?;
    super::output::print(&render_nodes(&nodes.items, now))?;
    Ok(())
}

/// The command's nodes as they are now. A node that cannot be read this time (gone, or
/// the server briefly unreachable) is left out of this progress line; one that reads but
/// does not decode is an error.
async fn client_nodes(
    client: &super::client::Client,
    command: &FleetCommand,
) -> anyhow::Result<BTreeMap<String, Node>> {
    let mut nodes = BTreeMap::new();
    for name in &command.status.nodes {
        if let Ok(Some(node)) = client.get_opt(&format!("{NODES}/{name}")).await {
            nodes.insert(name.clone(), decode(&node, "Node")?);
        }
    }
    Ok(nodes)
}

/// One progress line: the command's phase and each node's phase.
pub fn progress(command: &FleetCommand, nodes: &BTreeMap<String, Node>) -> String {
    let phase = command.status.phase.map_or("Pending", FleetCommandPhase::as_str);
    let parts: Vec<String> = nodes
        .iter()
        .map(|(name, node)| format!("{name} {}", node.status.phase.map_or("Pending", NodePhase::as_str)))
        .collect();
    format!("{} {phase}: {}", command.metadata.name, parts.join(", "))
}

/// Rows as aligned columns (the last column is not padded).
fn table(rows: Vec<Vec<String>>) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> =
        (0..columns).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    s.chars().take(max - 1).collect::<String>() + "…"
}

fn bytes(b: Option<u64>) -> Option<String> {
    // As f64, as the JSON number was read before the types: the same rounding.
    let b = b? as f64;
    Some(if b >= 1e9 { format!("{:.1}G", b / 1e9) } else { format!("{:.0}M", b / 1e6) })
}

/// `3m20s` since `created`, or `<unknown>` (kubectl's AGE column).
fn age(created: Option<Time>, now: DateTime<Utc>) -> String {
    match created {
        Some(t) => hive_api::age::human_duration((now - t.0).num_seconds()),
        None => "<unknown>".into(),
    }
}

/// The provider table: NAME TYPE STATE MESSAGE.
pub fn render_providers(providers: &[Provider]) -> String {
    let mut rows = vec![["NAME", "TYPE", "STATE", "MESSAGE"].map(String::from).to_vec()];
    for p in providers {
        rows.push(vec![
            p.metadata.name.clone(),
            p.spec.type_.as_str().to_string(),
            p.status.state.map_or("Unknown", ProviderState::as_str).to_string(),
            cut(p.status.message.as_deref().unwrap_or(""), 90),
        ]);
    }
    table(rows)
}

/// The newest `limit` commands: ID ACTION PHASE NODES AGE ERROR.
pub fn render_commands(commands: &[FleetCommand], limit: usize, now: DateTime<Utc>) -> String {
    let mut commands: Vec<&FleetCommand> = commands.iter().collect();
    commands.sort_by_key(|c| std::cmp::Reverse(c.metadata.creation_timestamp));
    let mut rows = vec![["ID", "ACTION", "PHASE", "NODES", "AGE", "ERROR"].map(String::from).to_vec()];
    for c in commands.into_iter().take(limit) {
        let action = match (&c.spec.provision, &c.spec.kill) {
            (Some(p), _) => format!("provision {} × {}", p.count, p.provider),
            (None, Some(k)) => format!("kill {}", k.node),
            (None, None) => "?".into(),
        };
        rows.push(vec![
            c.metadata.name.clone(),
            action,
            c.status.phase.map_or("-", FleetCommandPhase::as_str).to_string(),
            cut(&c.status.nodes.join(","), 40),
            age(c.metadata.creation_timestamp, now),
            cut(c.status.error.as_deref().unwrap_or(""), 70),
        ]);
    }
    table(rows)
}

/// The node table: NAME LOGICAL-ID PHASE PROVIDER REF CPU MEM AGE ERROR.
pub fn render_nodes(nodes: &[Node], now: DateTime<Utc>) -> String {
    let mut rows =
        vec![["NAME", "LOGICAL-ID", "PHASE", "PROVIDER", "REF", "CPU", "MEM", "DISK", "AGE", "ERROR"]
            .map(String::from)
            .to_vec()];
    let mut nodes: Vec<&Node> = nodes.iter().collect();
    nodes.sort_by_key(|n| n.spec.logical_id);
    for node in nodes {
        let r = node.status.provider_ref.clone().unwrap_or_default();
        let reference = match (r.pid, r.container_id, r.instance_id) {
            (Some(pid), _, _) => format!("pid {pid}"),
            (_, Some(c), _) => c.chars().take(12).collect(),
            (_, _, Some(i)) => format!("instance {i}"),
            _ => "-".into(),
        };
        let t = node.status.telemetry.clone().unwrap_or_default();
        let live = !matches!(
            node.status.phase,
            Some(NodePhase::Stopped | NodePhase::Killed | NodePhase::Failed | NodePhase::Orphaned)
        );
        let cpu = t.cpu_percent.filter(|_| live).map_or("-".into(), |c| format!("{c:.1}%"));
        let pair = |used: Option<u64>, total: Option<u64>| match (bytes(used), bytes(total)) {
            (Some(used), Some(total)) if live => format!("{used}/{total}"),
            _ => "-".into(),
        };
        let (mem, disk) =
            (pair(t.memory_used_bytes, t.memory_total_bytes), pair(t.disk_used_bytes, t.disk_total_bytes));
        rows.push(vec![
            node.metadata.name.clone(),
            node.spec.logical_id.to_string(),
            node.status.phase.map_or("Pending", NodePhase::as_str).to_string(),
            node.spec.provider.clone(),
            reference,
            cpu,
            mem,
            disk,
            age(node.metadata.creation_timestamp, now),
            cut(node.status.error.as_deref().unwrap_or(""), 70),
        ]);
    }
    table(rows)
}

/// The offer table: ID GPU N VRAM $/HOUR RELIABILITY VERIFIED WHERE.
pub fn render_offers(offers: &[Value]) -> String {
    if offers.is_empty() {
        return "no offers match\n".into();
    }
    let mut rows = vec![["ID", "GPU", "N", "VRAM", "$/HOUR", "RELIABILITY", "VERIFIED", "WHERE"]
        .map(String::from)
        .to_vec()];
    for o in offers {
        rows.push(vec![
            o["id"].to_string(),
            text(&o["gpuName"]),
            o["numGpus"].to_string(),
            o["gpuRamGb"].as_f64().map_or("-".into(), |g| format!("{g} GB")),
            o["dollarsPerHour"].as_f64().map_or("-".into(), |d| format!("{d:.3}")),
            o["reliability"].as_f64().map_or("-".into(), |r| format!("{r:.3}")),
            if o["verified"] == true { "yes" } else { "no" }.into(),
            text(&o["geolocation"]),
        ]);
    }
    table(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_table_sorts_by_logical_id() {
        let now = crate::host::now();
        let created = (now - chrono::Duration::seconds(90)).to_rfc3339();
        let node = |name: &str, id: u64, phase: &str| {
            json!({"metadata": {"name": name, "creationTimestamp": created},
                   "spec": {"logicalId": id, "provider": "process"},
                   "status": {"phase": phase, "providerRef": {"pid": 4242}}})
        };
        let nodes: Vec<Node> = [node("node-10", 10, "Killed"), node("node-2", 2, "Running")]
            .iter()
            .map(|n| decode(n, "Node").expect("a Node"))
            .collect();
        let text = render_nodes(&nodes, now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAME"), "{text}");
        assert!(
            lines[1].starts_with("node-2 ") && lines[1].contains("Running") && lines[1].contains("pid 4242")
        );
        assert!(lines[2].starts_with("node-10") && lines[2].contains("Killed"), "{text}");
    }
}
