//! `hive fleet-worker` (hidden): the worker of one fleet node. It binds an iroh endpoint
//! serving telemetry, joins the daemon named by `--control` over the control protocol,
//! prints `ready NAME` on stdout once the daemon welcomed it (its facts persisted), and
//! rejoins a restarted daemon on its own.
//!
//! With `--supervise stdin` (local process workers) it ends when stdin reaches EOF, so a
//! daemon that closes the pipe or dies never leaves it behind; with `--supervise none`
//! (containers, rented machines) it runs until SIGTERM or SIGINT. Logs go to stderr;
//! stdout carries only the ready line.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;

use super::Context;
use crate::fleet::net::{worker, ControlTarget, NetConfig, RelayChoice, WorkerConfig};
use crate::fleet::providers::process::ready_line;

/// What ends the worker.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Supervise {
    /// Stdin reaching EOF (the daemon holds the pipe).
    #[default]
    Stdin,
    /// Only SIGTERM or SIGINT.
    None,
}

/// Arguments of `hive fleet-worker`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The node this worker runs.
    #[arg(long, value_name = "NAME", env = "HIVE_NODE")]
    pub node: String,
    /// The node's logical id.
    #[arg(long, value_name = "N", env = "HIVE_LOGICAL_ID")]
    pub logical_id: u64,
    /// The daemon: `<endpoint-id>@<ip:port>[,<ip:port>...]`.
    #[arg(long, value_name = "TARGET", env = "HIVE_CONTROL")]
    pub control: ControlTarget,
    /// The node's join token, which the daemon gave it when it created the node. Read
    /// from the environment only (`HIVE_JOIN_TOKEN`), so it never shows in a process list.
    #[arg(skip = crate::host::env::var("HIVE_JOIN_TOKEN"))]
    pub join_token: Option<String>,
    /// The UDP address the worker's endpoint binds.
    #[arg(long, value_name = "ADDR", env = "HIVE_FLEET_BIND", default_value = "0.0.0.0:0")]
    pub bind: SocketAddr,
    /// Relays and discovery: `disabled` (direct addresses only) or `n0` (n0's public
    /// relays, for nodes behind NAT).
    #[arg(long, value_enum, env = "HIVE_FLEET_RELAY", default_value_t = RelayChoice::Disabled)]
    pub relay: RelayChoice,
    /// What ends the worker.
    #[arg(long, value_enum, default_value_t = Supervise::Stdin)]
    pub supervise: Supervise,
    /// How often telemetry is sampled and sent, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub telemetry_interval_ms: u64,
    /// Where the node's agents live (their generations, logs, pid files) and the config
    /// bundles the daemon ships for their builds land. The worker runs the agents placed
    /// on its node there, as the daemon asks over the agent runtime protocol.
    #[arg(long, value_name = "DIR", env = "HIVE_WORKER_STATE_DIR", default_value = "/var/lib/hive-worker")]
    pub state_dir: std::path::PathBuf,
    /// Log filter (tracing `EnvFilter` syntax); logs go to stderr.
    #[arg(long, value_name = "FILTER", default_value = "info")]
    pub log: String,
}

/// Runs the worker until it is told to stop.
pub async fn exec(args: Args, _ctx: &Context) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: the daemon redirects a local worker's stderr into a log
    // file, which escape codes would litter (issue 32).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(crate::host::output::Stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .log_internal_errors(false)
        .try_init();
    anyhow::ensure!(args.telemetry_interval_ms > 0, "--telemetry-interval-ms must be positive");

    let mut config = WorkerConfig::new(&args.node, args.logical_id, args.control);
    config.net = NetConfig { bind: args.bind, relay: args.relay, advertise: Vec::new() };
    config.telemetry_interval = Duration::from_millis(args.telemetry_interval_ms);
    config.join_token = args.join_token.clone().map(crate::fleet::net::control::JoinToken);
    config.state_dir = Some(args.state_dir.clone());
    let node = args.node.clone();
    let ready = move || -> anyhow::Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", ready_line(&node))?;
        out.flush().context("writing the ready line")
    };
    match args.supervise {
        Supervise::Stdin => worker::run(config, ready, stdin_closed()).await,
        Supervise::None => worker::run(config, ready, terminated()).await,
    }
}

/// Resolves when stdin reaches EOF (or fails): the daemon closed the supervision pipe.
async fn stdin_closed() {
    let read = tokio::task::spawn_blocking(|| {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 256];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => {
                    tracing::warn!(%err, "fleet worker: reading stdin failed; stopping");
                    return;
                }
            }
        }
    });
    let _ = read.await;
    tracing::info!("fleet worker: stdin closed; stopping");
}

/// Resolves on SIGTERM or SIGINT.
async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    let (term, int) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("fleet worker: SIGTERM; stopping"),
                _ = int.recv() => tracing::info!("fleet worker: SIGINT; stopping"),
            }
        }
        (Err(err), _) | (_, Err(err)) => {
            tracing::warn!(%err, "fleet worker: cannot watch signals; waiting for Ctrl-C");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
