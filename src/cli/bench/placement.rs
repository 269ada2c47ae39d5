//! The placement phase (issue 29, "Agents on fleet nodes"): one agent on the daemon's own
//! host and the same agent placed on a fleet Node of the `process` provider — a local
//! `hive fleet-worker` child of the daemon, reached over iroh on loopback — measured in
//! the same run, interleaved: spawn, stop and start Jobs (submit → Done), and how long a
//! line the agent writes takes to reach a client following its log
//! (`GET …/agents/NAME/log?follow=true`), for each.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use hive_api::node::NodePhase;
use hive_api::{FleetCommand, Node};
use serde_json::{json, Value};

use super::aim_text;
use super::api::{snippet, wall_ns, Api, Endpoint, REQUEST_TIMEOUT};
use super::power::{config_repo, run_job};
use super::report::{summarize, Row};

/// The agent: honours the fence, and prints `t=<Unix nanoseconds>` about 20 times a
/// second. `date` takes the stamp just before the shell writes the line (its output is
/// the line), so a latency is at most the few hundred microseconds of `date`'s exit long.
const STAMPING_AGENT: &str = "trap 'rm -f \"$HIVE_FENCE\"' USR1\ntrap 'exit 0' TERM\n\
                              while true; do echo \"t=$(date +%s%N)\"; sleep 0.05; done\n";
/// The goal of issue 29 for placed spawn, stop and start against local ones.
const RATIO_AIM: f64 = 1.5;
/// The goal of issue 29 for `logs -f`, agent write → client, p99.
const LOGS_AIM: Duration = Duration::from_millis(100);
/// How long the provisioned node may take to run, and a Kill of it to end.
const NODE_LIMIT: Duration = Duration::from_secs(120);

/// Where one of the two agents runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Site {
    /// The daemon's own host (the process runtime in the daemon).
    Local,
    /// A fleet node: its worker's process runtime, over iroh.
    Node,
}

impl Site {
    fn agent(self, index: usize) -> String {
        match self {
            Site::Local => format!("place-local-{index}"),
            Site::Node => format!("place-node-{index}"),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Site::Local => "local agent",
            Site::Node => "agent on a process node (iroh, loopback)",
        }
    }
}

/// Both sites, in the order each round measures them.
const SITES: [Site; 2] = [Site::Local, Site::Node];

/// What the phase measures, from the plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Settings {
    /// Spawns, stops and starts of each site's agent.
    pub(super) cycles: usize,
    /// How long each agent's log is followed.
    pub(super) log_for: Duration,
}

/// A power operation, as the Job template that does it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Spawn,
    Stop,
    Start,
}

impl Op {
    fn template(self) -> &'static str {
        match self {
            Op::Spawn => "Spawn",
            Op::Stop => "Stop",
            Op::Start => "Start",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Op::Spawn => "spawn (clone or ship the commit, check out, start)",
            Op::Stop => "stop (fence, drain, SIGTERM)",
            Op::Start => "start (incl. 1 s start grace)",
        }
    }
}

/// The latencies of one site, by [`Op`].
#[derive(Default)]
struct Timings([Vec<Duration>; 3]);

impl Timings {
    async fn time(&mut self, api: &Api, op: Op, agent: &str) -> Result<()> {
        let took = run_job(api, op.template(), agent).await?;
        self.0[op as usize].push(took);
        Ok(())
    }

    fn of(&self, op: Op) -> &[Duration] {
        &self.0[op as usize]
    }
}

/// Provisions a process node, runs the agents on it and locally, kills the node.
pub(super) async fn phase(endpoint: &Endpoint, work: &Path, settings: Settings) -> Result<Vec<Row>> {
    let api = endpoint.api(Some(REQUEST_TIMEOUT))?;
    let repo = config_repo(work, "placement-agent", STAMPING_AGENT)?;
    let provisioned = Instant::now();
    let node = provision(&api).await?;
    let provisioned = provisioned.elapsed();

    let mut timings = [Timings::default(), Timings::default()];
    for index in 0..settings.cycles {
        for (site, timings) in SITES.into_iter().zip(&mut timings) {
            let name = site.agent(index);
            let placement = (site == Site::Node).then_some(node.as_str());
            let (code, body) = api.create(agent(&name, &repo, placement).into_bytes()).await?;
            ensure!(code == 201, "creating agent {name}: HTTP {code}: {}", snippet(&body));
            timings.time(&api, Op::Spawn, &name).await?;
            // The first of each stays up for the stops, starts and logs; the others go.
            if index > 0 {
                run_job(&api, "Kill", &name).await?;
            }
        }
    }
    for _ in 0..settings.cycles {
        for (site, timings) in SITES.into_iter().zip(&mut timings) {
            let name = site.agent(0);
            timings.time(&api, Op::Stop, &name).await?;
            timings.time(&api, Op::Start, &name).await?;
        }
    }
    // Both logs at once: the same moments, the same load.
    let [local_agent, placed_agent] = SITES.map(|site| site.agent(0));
    let (local_logs, placed_logs) = tokio::try_join!(
        follow(endpoint, &local_agent, settings.log_for),
        follow(endpoint, &placed_agent, settings.log_for),
    )?;
    for site in SITES {
        run_job(&api, "Kill", &site.agent(0)).await?;
    }
    kill(&api, &node).await?;

    let mut rows = vec![Row::new(
        format!("placement: provision a process node ({node})"),
        "1 FleetCommand, POST → Node Running",
        Some(&[provisioned][..]),
        "",
    )];
    let [local, placed] = timings;
    for op in [Op::Spawn, Op::Stop, Op::Start] {
        let n = local.of(op).len();
        rows.push(Row::new(
            format!("placement: {}, {}", op.what(), Site::Local.label()),
            format!("{n} Jobs, submit → Done"),
            Some(local.of(op)),
            "",
        ));
        let (ratio, met) = ratios(local.of(op), placed.of(op));
        rows.push(Row::new(
            format!("placement: {}, {}", op.what(), Site::Node.label()),
            format!("{n} Jobs, submit → Done; {ratio}"),
            Some(placed.of(op)),
            aim_text(met, &format!("≤ {RATIO_AIM}× local (p50)")),
        ));
    }
    for (site, logs) in [(Site::Local, local_logs), (Site::Node, placed_logs)] {
        let met = summarize(&logs.latencies).is_some_and(|s| s.p99 < LOGS_AIM);
        let unread = if logs.unparsed > 0 { format!(", {} unparsed", logs.unparsed) } else { String::new() };
        rows.push(Row::new(
            format!("placement: logs -f, agent write → client, {}", site.label()),
            format!("{} lines in {:?}{unread}", logs.latencies.len(), settings.log_for),
            Some(logs.latencies.as_slice()),
            aim_text(met, "p99 < 100 ms"),
        ));
    }
    Ok(rows)
}

/// The placed / local ratios of p50 and p99, as the row says them, and whether the p50
/// ratio meets the aim.
fn ratios(local: &[Duration], placed: &[Duration]) -> (String, bool) {
    let (Some(local), Some(placed)) = (summarize(local), summarize(placed)) else {
        return ("no ratio".into(), false);
    };
    let ratio = |p: Duration, l: Duration| p.as_secs_f64() / l.as_secs_f64().max(1e-9);
    let (p50, p99) = (ratio(placed.p50, local.p50), ratio(placed.p99, local.p99));
    (format!("{p50:.2}× local at p50, {p99:.2}× at p99"), p50 <= RATIO_AIM)
}

/// The Agent `name`, built from `repo`; placed on `node` when one is given.
fn agent(name: &str, repo: &Path, node: Option<&str>) -> String {
    let mut spec = json!({"wanted": "Up", "config": {"repo": repo.display().to_string()},
                          "runtime": {"type": "process", "gracefulStopSeconds": 10,
                                      "process": {"command": ["sh", "run.sh"]}}});
    if let Some(node) = node {
        spec["placement"] = json!({ "node": node });
    }
    json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name}, "spec": spec})
        .to_string()
}

const COMMANDS: &str = "/apis/hive.dev/v1/fleetcommands";

/// POSTs a FleetCommand; the command as created.
async fn command(api: &Api, body: Value) -> Result<FleetCommand> {
    let resp = api
        .request(reqwest::Method::POST, COMMANDS)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await?;
    let code = resp.status().as_u16();
    let bytes = resp.bytes().await?;
    ensure!(code == 201, "POST FleetCommand: HTTP {code}: {}", snippet(&bytes));
    let created: Value = serde_json::from_slice(&bytes).context("the FleetCommand is not JSON")?;
    crate::cli::client::decode(&created, "FleetCommand")
}

/// Provisions one `process` node and waits until it runs; its name.
async fn provision(api: &Api) -> Result<String> {
    let body = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand",
                      "metadata": {"name": "bench-provision"},
                      "spec": {"provision": {"provider": "process", "count": 1}}});
    let created = command(api, body).await?;
    let node = created.status.nodes.first().context("the Provision command names no node")?.clone();
    wait_for_node(api, &node, NodePhase::Running).await?;
    Ok(node)
}

/// Kills `node` (its worker and the agents on it) and waits until it is Killed.
async fn kill(api: &Api, node: &str) -> Result<()> {
    let body = json!({"apiVersion": "hive.dev/v1", "kind": "FleetCommand",
                      "metadata": {"name": "bench-kill"}, "spec": {"kill": {"node": node}}});
    command(api, body).await?;
    wait_for_node(api, node, NodePhase::Killed).await
}

async fn wait_for_node(api: &Api, name: &str, phase: NodePhase) -> Result<()> {
    let started = Instant::now();
    loop {
        let body: Value =
            serde_json::from_slice(&api.get(&format!("/apis/hive.dev/v1/nodes/{name}")).await?)?;
        let node: Node = crate::cli::client::decode(&body, "Node")?;
        match node.status.phase {
            Some(now) if now == phase => return Ok(()),
            Some(NodePhase::Failed) => bail!("node {name} failed: {body}"),
            _ if started.elapsed() > NODE_LIMIT => {
                bail!("node {name} was not {} within {NODE_LIMIT:?}: {body}", phase.as_str())
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// What following one agent's log found.
struct Followed {
    latencies: Vec<Duration>,
    unparsed: usize,
}

/// Follows `agent`'s log from its end for `how_long`; the latency of every stamped line.
async fn follow(endpoint: &Endpoint, agent: &str, how_long: Duration) -> Result<Followed> {
    let api = endpoint.api(None)?;
    let path = format!("/apis/hive.dev/v1/agents/{agent}/log?follow=true&tail=0");
    let deadline = tokio::time::Instant::now() + how_long;
    let mut resp = tokio::time::timeout(REQUEST_TIMEOUT, api.request(reqwest::Method::GET, &path).send())
        .await
        .with_context(|| format!("GET {path}: no answer within {REQUEST_TIMEOUT:?}"))??;
    let code = resp.status().as_u16();
    ensure!(code == 200, "GET {path}: HTTP {code}");
    let mut lines = Stamps::default();
    let mut latencies = Vec::new();
    while let Ok(chunk) = tokio::time::timeout_at(deadline, resp.chunk()).await {
        let Some(chunk) = chunk? else { bail!("GET {path}: the stream ended while followed") };
        lines.feed(&chunk, wall_ns(), &mut latencies);
    }
    Ok(Followed { latencies, unparsed: lines.unparsed })
}

/// The stamped lines of a followed log, split as they arrive: each whole `t=<ns>` line's
/// latency is the time its last byte arrived less its stamp. Bytes only, no JSON.
#[derive(Default)]
struct Stamps {
    /// The start of a line whose end has not arrived.
    partial: Vec<u8>,
    /// Whole lines that carried no stamp.
    unparsed: usize,
}

impl Stamps {
    fn feed(&mut self, chunk: &[u8], received_ns: u128, latencies: &mut Vec<Duration>) {
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            let line = if self.partial.is_empty() {
                &rest[..end]
            } else {
                self.partial.extend_from_slice(&rest[..end]);
                &self.partial[..]
            };
            match stamp(line) {
                Some(sent) => {
                    let nanos = u64::try_from(received_ns.saturating_sub(sent)).unwrap_or(u64::MAX);
                    latencies.push(Duration::from_nanos(nanos));
                }
                None => self.unparsed += 1,
            }
            self.partial.clear();
            rest = &rest[end + 1..];
        }
        self.partial.extend_from_slice(rest);
    }
}

/// The stamp of a `t=<ns>` line.
fn stamp(line: &[u8]) -> Option<u128> {
    std::str::from_utf8(line.strip_prefix(b"t=")?).ok()?.trim_end_matches('\r').parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(chunks: &[(&str, u128)]) -> (Vec<u64>, usize) {
        let (mut stamps, mut latencies) = (Stamps::default(), Vec::new());
        for (chunk, at) in chunks {
            stamps.feed(chunk.as_bytes(), *at, &mut latencies);
        }
        (latencies.iter().map(|d| d.as_nanos() as u64).collect(), stamps.unparsed)
    }

    #[test]
    fn a_line_counts_from_its_stamp_to_the_arrival_of_its_end() {
        assert_eq!(feed(&[("t=100\nt=150\n", 200)]), (vec![100, 50], 0));
        // A line split across chunks arrives with its second part.
        assert_eq!(feed(&[("t=1", 500), ("00\nt=4", 700), ("00\n", 900)]), (vec![600, 500], 0));
        // A line without a stamp is counted, not timed; a clock that went back is zero.
        assert_eq!(feed(&[("hello\nt=x\nt=300\n", 200)]), (vec![0], 2));
        // Nothing is timed before its newline arrives.
        assert_eq!(feed(&[("t=100", 200)]), (vec![], 0));
    }

    #[test]
    fn the_aim_is_the_p50_ratio() {
        let ms = |v: &[u64]| v.iter().map(|&n| Duration::from_millis(n)).collect::<Vec<_>>();
        let (text, met) = ratios(&ms(&[100, 100, 200]), &ms(&[150, 150, 300]));
        assert_eq!((text.as_str(), met), ("1.50× local at p50, 1.50× at p99", true));
        assert!(!ratios(&ms(&[100]), &ms(&[151])).1);
        assert!(!ratios(&[], &ms(&[1])).1);
    }
}
