//! `hive fleet provision|kill|offers|configure|status`: explicit fleet commands through
//! the REST API. Every command carries a command id (generated and printed when not
//! given, so a retry can reuse it); re-sending an id returns the original command and
//! never repeats provider work.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::client::Query;
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
            print!("{}", render_offers(answer["offers"].as_array().map_or(&[][..], Vec::as_slice)));
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
            let stored = client.post(&path, &body).await?;
            println!(
                "provider {provider}: {} {}",
                stored["status"]["state"].as_str().unwrap_or("?"),
                stored["status"]["message"].as_str().unwrap_or("")
            );
            return Ok(());
        }
        Verb::Provision { count, offers, provider, image, command_id, no_wait } => {
            let mut provision = json!({"count": count});
            if let Some(provider) = provider {
                provision["provider"] = json!(provider);
            }
            if !offers.is_empty() {
                provision["selectedOfferIds"] = json!(offers);
            }
            if let Some(image) = image {
                provision["image"] = json!(image);
            }
            (command_id, json!({"provision": provision}), no_wait)
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

async fn status(client: &super::client::Client, recent: usize) -> anyhow::Result<()> {
    let now = crate::host::now();
    let providers = client.get(PROVIDERS).await?;
    let commands = client.get(COMMANDS).await?;
    let nodes = client.get(NODES).await?;
    let items = |list: &Value| list["items"].as_array().cloned().unwrap_or_default();
    println!("PROVIDERS");
    print!("{}", render_providers(&items(&providers)));
    println!("\nRECENT COMMANDS");
    print!("{}", render_commands(&items(&commands), recent, now));
    println!("\nNODES");
    print!("{}", render_nodes(&items(&nodes), now));
    Ok(())
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

fn bytes(v: &Value) -> Option<String> {
    let b = v.as_f64()?;
    Some(if b >= 1e9 { format!("{:.1}G", b / 1e9) } else { format!("{:.0}M", b / 1e6) })
}

/// The provider table: NAME TYPE STATE MESSAGE.
pub fn render_providers(providers: &[Value]) -> String {
    let mut rows = vec![["NAME", "TYPE", "STATE", "MESSAGE"].map(String::from).to_vec()];
    for p in providers {
        rows.push(vec![
            text(&p["metadata"]["name"]),
            text(&p["spec"]["type"]),
            p["status"]["state"].as_str().unwrap_or("Unknown").to_string(),
            cut(&text(&p["status"]["message"]), 90),
        ]);
    }
    table(rows)
}

/// The newest `limit` commands: ID ACTION PHASE NODES AGE ERROR.
pub fn render_commands(commands: &[Value], limit: usize, now: DateTime<Utc>) -> String {
    let mut commands: Vec<&Value> = commands.iter().collect();
    commands.sort_by_key(|c| std::cmp::Reverse(text(&c["metadata"]["creationTimestamp"])));
    let mut rows = vec![["ID", "ACTION", "PHASE", "NODES", "AGE", "ERROR"].map(String::from).to_vec()];
    for c in commands.into_iter().take(limit) {
        let action = match (&c["spec"]["provision"], &c["spec"]["kill"]) {
            (p, _) if p.is_object() => {
                format!("provision {} × {}", p["count"], p["provider"].as_str().unwrap_or("?"))
            }
            (_, k) if k.is_object() => format!("kill {}", text(&k["node"])),
            _ => "?".into(),
        };
        let nodes: Vec<String> = c["status"]["nodes"].as_array().into_iter().flatten().map(text).collect();
        rows.push(vec![
            text(&c["metadata"]["name"]),
            action,
            c["status"]["phase"].as_str().unwrap_or("-").to_string(),
            cut(&nodes.join(","), 40),
            hive_api::age::age(c["metadata"]["creationTimestamp"].as_str(), now),
            cut(&text(&c["status"]["error"]), 70),
        ]);
    }
    table(rows)
}

/// The node table: NAME LOGICAL-ID PHASE PROVIDER REF CPU MEM AGE ERROR.
pub fn render_nodes(nodes: &[Value], now: DateTime<Utc>) -> String {
    let mut rows =
        vec![["NAME", "LOGICAL-ID", "PHASE", "PROVIDER", "REF", "CPU", "MEM", "DISK", "AGE", "ERROR"]
            .map(String::from)
            .to_vec()];
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
        let t = &node["status"]["telemetry"];
        let live =
            !matches!(node["status"]["phase"].as_str(), Some("Stopped" | "Killed" | "Failed" | "Orphaned"));
        let cpu = t["cpuPercent"].as_f64().filter(|_| live).map_or("-".into(), |c| format!("{c:.1}%"));
        let pair = |used: &str, total: &str| match (bytes(&t[used]), bytes(&t[total])) {
            (Some(used), Some(total)) if live => format!("{used}/{total}"),
            _ => "-".into(),
        };
        let (mem, disk) =
            (pair("memoryUsedBytes", "memoryTotalBytes"), pair("diskUsedBytes", "diskTotalBytes"));
        rows.push(vec![
            node["metadata"]["name"].as_str().unwrap_or("").to_string(),
            node["spec"]["logicalId"].as_u64().map_or("-".into(), |i| i.to_string()),
            node["status"]["phase"].as_str().unwrap_or("Pending").to_string(),
            node["spec"]["provider"].as_str().unwrap_or("").to_string(),
            reference,
            cpu,
            mem,
            disk,
            hive_api::age::age(node["metadata"]["creationTimestamp"].as_str(), now),
            cut(&text(&node["status"]["error"]), 70),
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
        let text = render_nodes(&[node("node-10", 10, "Killed"), node("node-2", 2, "Running")], now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAME"), "{text}");
        assert!(
            lines[1].starts_with("node-2 ") && lines[1].contains("Running") && lines[1].contains("pid 4242")
        );
        assert!(lines[2].starts_with("node-10") && lines[2].contains("Killed"), "{text}");
    }
}
