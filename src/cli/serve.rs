//! `hive serve`: runs the daemon on its embedded defaults — redb state in a local
//! folder, HTTPS with a private CA, an admin token and a kubeconfig written on first
//! start (as k3s does).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::net::TcpListener;

use super::Context;
use crate::auth::TokenStore;
use crate::server::{self, tls, AppState, ServerConfig};
use crate::store::{Store, StoreConfig};

/// The default listen address. 7443 is hive's fixed port (README documents it).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7443";

/// The database file inside the state directory.
pub const DB_FILE: &str = "hive.redb";

/// Arguments of `hive serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on (HTTPS). Port 0 picks a free port; the kubeconfig records the real one.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN, env = "HIVE_LISTEN")]
    pub listen: SocketAddr,

    /// Directory holding the database, TLS material, tokens and kubeconfig
    /// (default: `$HIVE_STATE_DIR`, else `./.hive`).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Delete the database and the fleet identity (identity.key) before starting. The
    /// only way to clear state: a corrupt or unreadable database or identity is otherwise
    /// a hard startup error.
    #[arg(long)]
    pub reset_state: bool,

    /// Serve this certificate (PEM chain) instead of the generated one. Needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// Key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Watch history: how many events are retained for resuming watches.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub retention_events: usize,

    /// Watch history: how long events are retained, e.g. `1h`, `30m`.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = super::duration::parse)]
    pub retention_age: Duration,

    /// How often watches that allow bookmarks get one, e.g. `10s`.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::duration::parse)]
    pub bookmark_interval: Duration,

    /// Live events a watcher may lag behind before it is dropped with a 410 (it then re-lists).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub watch_buffer: usize,

    /// Run the Agent controller, which spawns, rebuilds and converges agents by itself.
    /// `--agent-controller=false` leaves agents alone (Jobs still run when submitted).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub agent_controller: bool,

    /// How many heavy Job nodes (builds, swaps, first creates) run at once.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub build_slots: usize,

    /// The agent runtime of this host: `process` (supervised local processes; the
    /// embedded default) or `nixos-container` (each agent a NixOS container built from
    /// the meta flake; needs nix, nixos-container and systemd, and root).
    #[arg(long, value_enum, value_name = "RUNTIME", default_value_t = RuntimeChoice::Process)]
    pub runtime: RuntimeChoice,

    /// nixos-container runtime: at start, build every registered agent's toplevel in the
    /// background (`preBuildAgentTemplates`), so the first start after a host rebuild
    /// finds its closure in the store. No effect with the process runtime.
    #[arg(long)]
    pub prebuild_agent_templates: bool,

    /// The hive-wide CPU cap per agent (`agentCpuQuota`) for agents whose
    /// `spec.resources.cpuQuota` is unset: a percentage of one core ("200%" = 2 cores).
    #[arg(long, value_name = "PERCENT", default_value = "200%")]
    pub agent_cpu_quota: String,

    /// The hive-wide memory cap per agent (`agentMemoryMax`) for agents whose
    /// `spec.resources.memoryMax` is unset: bytes with K, M, G or T, or `infinity`.
    #[arg(long, value_name = "SIZE", default_value = "4G")]
    pub agent_memory_max: String,

    /// The hive base input's rev recorded in the meta lock. When it differs from what an
    /// agent was built against, the boot sweep rebuilds the agent (wanted-up ones at
    /// once, stopped ones at their next start). Default: this build's version.
    #[arg(long, value_name = "REV", env = "HIVE_BASE_REV", default_value = crate::daemon::DEFAULT_HIVE_REV)]
    pub hive_rev: String,

    /// How long an Event is kept after it last happened, e.g. `1h`.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = super::duration::parse)]
    pub event_ttl: Duration,

    /// The fleet provider of commands that name none: `process` (local worker processes;
    /// the default), `docker` (containers on the local Docker Engine; see --docker-image)
    /// or `vastai` (starts Unconfigured without a key: `hive fleet configure vastai`).
    #[arg(long, value_enum, value_name = "PROVIDER", default_value_t = crate::fleet::ProviderChoice::Process)]
    pub provider: crate::fleet::ProviderChoice,

    /// UDP address of the fleet's iroh endpoint (control and telemetry). Keep the port
    /// fixed so Docker and Vast.ai workers find a restarted daemon; listen on 0.0.0.0 for
    /// nodes on other hosts or in containers. Port 0 picks a free one.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7946", env = "HIVE_FLEET_LISTEN")]
    pub fleet_listen: SocketAddr,

    /// The address Vast.ai workers dial the daemon at (a public IP and port that reach
    /// --fleet-listen), when it is not the bound one.
    #[arg(long, value_name = "ADDR")]
    pub fleet_advertise: Option<SocketAddr>,

    /// iroh relays and discovery for the fleet endpoint: `disabled` (direct addresses
    /// only; the default) or `n0` (n0's public relays and DNS discovery, for nodes behind
    /// NAT; publishes the endpoint's addresses to n0; needs the internet, so the test
    /// suite does not exercise it).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = crate::fleet::net::RelayChoice::Disabled)]
    pub fleet_relay: crate::fleet::net::RelayChoice,

    /// Image of `docker` nodes when neither the command nor the Provider names one. It
    /// must have `hive` on its PATH (deploy/rootfs.sh builds such a root filesystem).
    #[arg(long, value_name = "IMAGE", default_value = "hive-node:latest")]
    pub docker_image: String,

    /// Docker network of `docker` nodes (created if missing) when the Provider names none.
    #[arg(long, value_name = "NAME", default_value = "hive-fleet")]
    pub docker_network: String,

    /// Base URL of the Vast.ai API for the built-in `vastai` Provider (default: the public
    /// API, https://console.vast.ai/api/v0).
    #[arg(long, value_name = "URL", env = "HIVE_VASTAI_BASE_URL")]
    pub vastai_base_url: Option<String>,

    /// Also serve the dashboard (and the API it calls) on this address, with the same
    /// TLS; it is always on --listen at `/`. A bare port means 127.0.0.1:PORT
    /// (`HIVE_DASHBOARD_PORT` sets that port).
    #[arg(long, value_name = "ADDR", env = "HIVE_DASHBOARD_PORT", value_parser = crate::dashboard::parse_listen)]
    pub dashboard_listen: Option<SocketAddr>,

    /// Log filter, e.g. `info`, `hive=debug` (also `RUST_LOG`).
    #[arg(long, value_name = "FILTER", env = "RUST_LOG", default_value = "info")]
    pub log: String,
}

/// The agent runtimes `hive serve --runtime` accepts.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeChoice {
    /// Supervised local processes (the embedded default).
    Process,
    /// NixOS containers (`nix build`, `nixos-container`, `systemctl`).
    NixosContainer,
}

/// Runs `hive serve` until Ctrl-C or SIGTERM.
pub async fn exec(args: Args, _ctx: &Context) -> anyhow::Result<()> {
    check(&args)?;
    init_tracing(&args.log);
    let state_dir = args.state_dir.clone().unwrap_or_else(crate::kubeconfig::default_state_dir);
    crate::auth::secret_file::create_private_dir(&state_dir)
        .with_context(|| format!("creating state directory {}", state_dir.display()))?;
    // Absolute from here on: agents, mirrors and git commands run in other working
    // directories, where a relative `./.hive` would point somewhere else.
    let state_dir = std::fs::canonicalize(&state_dir)
        .with_context(|| format!("resolving state directory {}", state_dir.display()))?;
    let db_path = state_dir.join(DB_FILE);
    if args.reset_state {
        Store::reset(&db_path).with_context(|| format!("resetting state {}", db_path.display()))?;
        tracing::warn!(path = %db_path.display(), "state reset: the database was deleted");
    }
    let mut store_config = StoreConfig::new(&db_path);
    store_config.retention_events = args.retention_events;
    store_config.retention_age = args.retention_age;
    store_config.watch_buffer = args.watch_buffer;
    let store = Store::open(store_config).map_err(|e| {
        anyhow::anyhow!(
            "{e}\nThe state was not changed. Restore the file, or start with --reset-state to clear it."
        )
    })?;
    let tokens = TokenStore::open(&state_dir)?;
    let identity = crate::fleet::open_identity(&state_dir, args.reset_state)?;
    let fleet_config = crate::fleet::FleetConfig {
        default_provider: args.provider,
        net: crate::fleet::net::NetConfig { bind: args.fleet_listen, relay: args.fleet_relay },
        advertise: args.fleet_advertise,
        docker_image: args.docker_image.clone(),
        docker_network: args.docker_network.clone(),
        vastai_base_url: args.vastai_base_url.clone(),
    };
    let fleet = crate::fleet::Fleet::start(store.clone(), &identity, fleet_config).await?;

    let listener =
        TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let local = listener.local_addr()?;
    let host = if local.ip().is_unspecified() { "127.0.0.1".to_string() } else { local.ip().to_string() };
    let material = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => tls::load_custom(cert, key)?,
        _ => tls::ensure(&state_dir, &[host.clone(), "localhost".into(), "127.0.0.1".into()])?,
    };
    let tls_config = tls::server_config(&material)?;
    let url_host = if host.contains(':') { format!("[{host}]") } else { host };
    let url = format!("https://{url_host}:{}", local.port());
    let kubeconfig = state_dir.join("kubeconfig.yaml");
    write_kubeconfig(&kubeconfig, &url, material.ca_pem(), &tokens)?;

    let state =
        AppState::new(store.clone(), tokens, ServerConfig { bookmark_interval: args.bookmark_interval });
    spawn_event_expiry(store.clone(), args.event_ttl);
    let engine = crate::daemon::Engine::start(
        store.clone(),
        &state_dir,
        crate::daemon::EngineConfig {
            build_slots: args.build_slots,
            hive_rev: args.hive_rev.clone(),
            hive_url: crate::daemon::DEFAULT_HIVE_URL.into(),
            process: Some({
                let mut process = crate::runtime::process::ProcessConfig::new(state_dir.join("agents"));
                process.default_cpu_quota = args.agent_cpu_quota.clone();
                process.default_memory_max = args.agent_memory_max.clone();
                process
            }),
            nixos: (args.runtime == RuntimeChoice::NixosContainer).then(|| {
                let mut nixos = crate::runtime::nixos::NixosConfig::new(state_dir.join("meta"));
                nixos.default_cpu_quota = args.agent_cpu_quota.clone();
                nixos.default_memory_max = args.agent_memory_max.clone();
                nixos
            }),
        },
    )
    .await
    .context("starting the scheduler and the process runtime")?;
    if args.prebuild_agent_templates {
        if args.runtime == RuntimeChoice::NixosContainer {
            let engine = engine.clone();
            tokio::spawn(async move { engine.prebuild_templates().await });
        } else {
            tracing::warn!("--prebuild-agent-templates has no effect with the process runtime");
        }
    }
    if args.agent_controller {
        crate::agent_controller::spawn(engine.clone());
    }
    crate::approval_controller::spawn(engine.clone());
    let state = state.with_engine(engine.clone()).with_fleet(fleet.clone());
    let app = server::app(state);
    let dashboard =
        crate::dashboard::serve_extra(args.dashboard_listen, tls_config.clone(), app.clone()).await?;
    let shutdown = shutdown_signal();
    tracing::info!(%url, state_dir = %state_dir.display(), kubeconfig = %kubeconfig.display(), "hive is serving");
    println!("hive: serving {url}");
    println!("hive: kubeconfig {}", kubeconfig.display());
    server::serve::serve_tls(listener, tls_config, app, shutdown).await?;
    if let Some(dashboard) = dashboard {
        dashboard.abort();
    }
    tracing::info!("shutting down: stopping agents and draining pending commits");
    fleet.shutdown().await;
    engine.shutdown().await;
    store.shutdown().await;
    Ok(())
}

/// Writes the kubeconfig with the current URL and CA. The first start mints the admin
/// token; later starts keep the token already in the file. If the file is gone, a new
/// admin token is minted (the old ones stay valid until revoked).
fn write_kubeconfig(path: &Path, url: &str, ca_pem: Option<&str>, tokens: &TokenStore) -> anyhow::Result<()> {
    let existing = path
        .exists()
        .then(|| crate::kubeconfig::load(path).and_then(|k| k.current()))
        .transpose()
        .unwrap_or(None)
        .and_then(|r| r.token)
        .filter(|t| tokens.authenticate(t).is_some());
    let token = match existing {
        Some(token) => token,
        None => match tokens.ensure_admin()? {
            Some(token) => token,
            None => {
                let name = format!("admin-{}", chrono::Utc::now().format("%Y%m%d%H%M%S"));
                tracing::warn!(kubeconfig = %path.display(), name, "kubeconfig missing or its token unknown: minting a new admin token");
                tokens.create(&name, crate::auth::Role::Admin)?
            }
        },
    };
    crate::kubeconfig::write(path, url, ca_pem, &token)
}

/// Deletes expired events every few minutes (and once at start).
fn spawn_event_expiry(store: Store, ttl: Duration) {
    let recorder = crate::events::Recorder::new(store, "hive");
    let every = (ttl / 4).clamp(Duration::from_secs(1), Duration::from_secs(300));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            match recorder.expire(ttl).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(expired = n, "old events deleted"),
                Err(err) => tracing::warn!(error = %err, "expiring events failed"),
            }
        }
    });
}

fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Registers for SIGTERM at once (before the daemon says it is serving, so a prompt
/// SIGTERM from a supervisor is never missed), then resolves on Ctrl-C or SIGTERM.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term = match term {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
            tokio::select! {
                _ = ctrl_c => {},
                _ = term.recv() => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = ctrl_c.await;
        }
    }
}

/// Rejects flag values clap cannot check by itself.
fn check(args: &Args) -> anyhow::Result<()> {
    if args.watch_buffer == 0 {
        bail!("--watch-buffer must be at least 1");
    }
    if args.build_slots == 0 {
        bail!("--build-slots must be at least 1");
    }
    crate::runtime::process::limits::parse_cpu_quota(&args.agent_cpu_quota)
        .map_err(|e| anyhow::anyhow!("--agent-cpu-quota {e}"))?;
    crate::runtime::process::limits::parse_memory_max(&args.agent_memory_max)
        .map_err(|e| anyhow::anyhow!("--agent-memory-max {e}"))?;
    if args.hive_rev.trim().is_empty() {
        bail!("--hive-rev must not be empty");
    }
    Ok(())
}
