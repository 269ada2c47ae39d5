//! The daemon behind `hive serve`: its composition root (store, server, engine, fleet
//! and controllers wired together), the boot sweep and reconcile, crash-watch, and the IO
//! halves of the Agent and Approval controllers (their pure decisions live in
//! `hive-controllers`). The engine, the Job intake and the Jobs mirror live in
//! `crate::jobs`; the daemon only starts them.

pub mod agent_controller;
pub mod agent_jobs;
pub mod approval_controller;
mod boot;
pub mod crashwatch;
mod leader;
mod meta_journal;
#[cfg(test)]
mod meta_journal_tests;
mod shared;

pub use crate::jobs::engine::{DEFAULT_HIVE_REV, DEFAULT_HIVE_URL};
pub use boot::Sweep;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;

use crate::auth::TokenStore;
use crate::jobs::{Engine, EngineConfig};
use crate::server::{self, tls, AppState, ServerConfig};
use crate::store::{Store, StoreConfig};

/// The default listen address. 7443 is hive's fixed port (README documents it).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7443";

/// The database file inside the state directory.
pub const DB_FILE: &str = "hive.redb";

/// Everything the daemon is started with; `hive serve` maps its flags onto this.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// The API's HTTPS address (port 0 picks one; the kubeconfig records the real one).
    pub listen: SocketAddr,
    /// Database, TLS material, tokens, kubeconfig, meta repo, agents, fleet identity.
    pub state_dir: PathBuf,
    /// Delete the database and the fleet identity before starting.
    pub reset_state: bool,
    /// The etcd cluster holding the objects, instead of the embedded database.
    pub store: Option<crate::store::etcd::EtcdConfig>,
    /// With `store`: the URL other replicas reach this one's API at (default: the
    /// listen address's URL).
    pub advertise: Option<String>,
    /// A certificate chain and key to serve instead of the generated ones.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Watch history: events retained.
    pub retention_events: usize,
    /// Watch history: how long events are retained.
    pub retention_age: Duration,
    /// Live events a watcher may lag behind before it is dropped.
    pub watch_buffer: usize,
    /// Memory a watcher's pending live events may hold before it is dropped.
    pub watch_buffer_bytes: usize,
    /// Watch history: memory the retained events may hold.
    pub retention_bytes: usize,
    /// How long acknowledged writes may wait in the write-ahead log for a checkpoint.
    pub checkpoint_interval: Duration,
    /// How long a streaming answer waits for its client to take a chunk before ending it.
    pub watch_write_timeout: Duration,
    /// The caps on requests held at once.
    pub limits: crate::server::streams::Limits,
    /// How often bookmark-allowing watches get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// How long an Event is kept after it last happened.
    pub event_ttl: Duration,
    /// Run the Agent controller.
    pub agent_controller: bool,
    /// Heavy Job nodes at once.
    pub build_slots: usize,
    /// Retries of the builds in Jobs built from templates.
    pub build_retries: u32,
    /// How long a terminal Job without a TTL of its own is kept; `None`: no bound by age.
    pub job_history_max_age: Option<Duration>,
    /// Run agents as NixOS containers instead of processes.
    pub nixos_containers: bool,
    /// nixos-container runtime: build every registered agent's toplevel at start.
    pub prebuild_agent_templates: bool,
    /// The hive-wide CPU cap per agent.
    pub agent_cpu_quota: String,
    /// The hive-wide memory cap per agent.
    pub agent_memory_max: String,
    /// The hive base input's rev.
    pub hive_rev: String,
    /// The hive base flake's reference (`--hive-flake`), the meta flake's `hive` input.
    pub hive_flake: String,
    /// The fleet's settings.
    pub fleet: crate::fleet::FleetConfig,
    /// Also serve the dashboard (and the API) here.
    pub dashboard_listen: Option<SocketAddr>,
    /// Where `/metrics` is also served, over plain HTTP without authentication.
    pub metrics_listen: Option<SocketAddr>,
    /// Whether the API records request metrics (`--metrics`).
    pub metrics: bool,
    /// The listeners' timeouts and connection cap (shared by the API and the dashboard).
    pub http: server::serve::ServeConfig,
    /// The API audit log; `None` writes none.
    pub audit: Option<server::audit_log::AuditConfig>,
}

/// Runs the daemon until `shutdown` resolves: opens the store, starts the fleet, the
/// engine and the controllers, serves the API (and the dashboard), then stops them in
/// order, draining pending commits last.
pub async fn run(
    config: DaemonConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    tracing::info!(workers, "the async runtime's worker threads (--worker-threads)");
    let state_dir = config.state_dir.clone();
    crate::auth::secret_file::create_private_dir(&state_dir)
        .with_context(|| format!("creating state directory {}", state_dir.display()))?;
    // Absolute from here on: agents, mirrors and git commands run in other working
    // directories, where a relative `./.hive` would point somewhere else.
    let state_dir = std::fs::canonicalize(&state_dir)
        .with_context(|| format!("resolving state directory {}", state_dir.display()))?;
    let db_path = state_dir.join(DB_FILE);
    // Before any reset: a corrupt token file refuses the start, and `--reset-state`
    // (which keeps the tokens) must not have deleted the database by then.
    let tokens = TokenStore::open(&state_dir)?;
    if config.reset_state && config.store.is_some() {
        anyhow::bail!(
            "--reset-state empties the embedded database; with --store etcd://… the objects are in etcd \
             (delete the key prefix there to clear them)"
        );
    }
    if config.reset_state {
        let floor = Store::reset(&db_path, &crate::host::Clock::system())
            .with_context(|| format!("resetting state {}", db_path.display()))?;
        tracing::warn!(
            path = %db_path.display(),
            revision = floor,
            "state reset: the database was replaced by an empty one; revisions continue above the old ones"
        );
    }
    let mut store_config = StoreConfig::new(&db_path);
    store_config.retention_events = config.retention_events;
    store_config.retention_age = config.retention_age;
    store_config.watch_buffer = config.watch_buffer;
    store_config.watch_buffer_bytes = config.watch_buffer_bytes;
    store_config.retention_bytes = config.retention_bytes;
    store_config.checkpoint_interval = config.checkpoint_interval;
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::new(config.metrics));
    store_config.metrics = metrics.store.clone();
    let store = match &config.store {
        None => Store::open(store_config).map_err(|e| {
            anyhow::anyhow!(
                "{e}\nThe state was not changed. Restore the file, or start with --reset-state to clear it."
            )
        })?,
        Some(etcd) => Store::open_etcd(store_config, etcd)
            .await
            .with_context(|| format!("opening the store on etcd {}", etcd.endpoints.join(",")))?,
    };
    // Replicas on etcd share the tokens and the CA (before TLS and the kubeconfig use them).
    let tokens = match store.etcd() {
        Some(backend) => {
            if config.tls.is_none() {
                shared::ca(backend, &state_dir).await?;
            }
            shared::fleet_identity(backend, &state_dir).await?;
            shared::tokens(backend, &state_dir).await?
        }
        None => tokens,
    };

    let listener =
        TcpListener::bind(config.listen).await.with_context(|| format!("listening on {}", config.listen))?;
    let local = listener.local_addr()?;
    let host = if local.ip().is_unspecified() { "127.0.0.1".to_string() } else { local.ip().to_string() };
    let material = match &config.tls {
        Some((cert, key)) => tls::load_custom(cert, key)?,
        None => {
            let mut names = vec![host.clone(), "localhost".into(), "127.0.0.1".into()];
            // Other replicas forward to the advertised URL: its host must verify too.
            names.extend(config.advertise.as_deref().and_then(advertised_host));
            tls::ensure(&state_dir, &names)?
        }
    };
    let tls_config = tls::server_config(&material)?;
    let url_host = if host.contains(':') { format!("[{host}]") } else { host };
    let url = format!("https://{url_host}:{}", local.port());
    let kubeconfig = state_dir.join("kubeconfig.yaml");
    {
        // The shared token file is written on a blocking thread (see `auth::SharedTokens`).
        let (path, url, ca, tokens) =
            (kubeconfig.clone(), url.clone(), material.ca_pem().map(str::to_owned), tokens.clone());
        tokio::task::spawn_blocking(move || write_kubeconfig(&path, &url, ca.as_deref(), &tokens))
            .await
            .context("writing the kubeconfig")??;
    }

    let mut state = AppState::new(
        store.clone(),
        tokens,
        ServerConfig {
            bookmark_interval: config.bookmark_interval,
            watch_write_timeout: config.watch_write_timeout,
            limits: config.limits,
        },
    )
    .with_metrics(metrics.clone())
    .with_key_sources(config.fleet.key_sources.clone());
    if let Some(backend) = store.etcd() {
        state = state.with_sessions(shared::sessions(backend));
    }
    let leading: Arc<std::sync::OnceLock<Leading>> = Arc::default();
    let campaign = match store.etcd() {
        None => {
            let parts = start_leading(&config, &store, &state_dir, &metrics).await?;
            state = state
                .with_jobs(parts.engine.clone())
                .with_fleet(Arc::new(parts.fleet.clone()) as Arc<dyn crate::fleet::service::FleetService>);
            let _ = leading.set(parts);
            None
        }
        Some(_) => {
            let advertised = config.advertise.clone().unwrap_or_else(|| url.clone());
            let name = leader::name(local);
            let mut campaign = leader::Campaign::start(&store, name.clone(), advertised);
            state = state.with_replication(server::forward::Replication::new(
                name,
                campaign.leader(),
                material.ca_pem(),
            )?);
            let (config, store, state_dir, metrics, state, leading) = (
                config.clone(),
                store.clone(),
                state_dir.clone(),
                metrics.clone(),
                state.clone(),
                leading.clone(),
            );
            let elected = tokio::spawn(async move {
                let started = async {
                    let epoch = campaign.elected().await?;
                    let parts = start_leading(&config, &store, &state_dir, &metrics).await?;
                    state.clone().with_jobs(parts.engine.clone()).with_fleet(
                        Arc::new(parts.fleet.clone()) as Arc<dyn crate::fleet::service::FleetService>
                    );
                    let _ = leading.set(parts);
                    tracing::info!(epoch, "leading: the scheduler, the controllers and the fleet run here");
                    crate::host::output::say(format_args!("hive: leading (epoch {epoch})"));
                    anyhow::Ok(())
                };
                if let Err(e) = started.await {
                    // Elected but unable to lead: give the leadership to another replica.
                    tracing::error!(error = format!("{e:#}"), "cannot start what the leader runs; exiting");
                    crate::host::output::say(format_args!("hive: cannot lead: {e:#}"));
                    std::process::exit(1);
                }
                campaign
            });
            Some(elected)
        }
    };
    let audit_metrics = metrics.audit.clone();
    let mut audit_log = None;
    if let Some(audit) = &config.audit {
        let mut audit = audit.clone();
        // Among replicas every line names the one that answered.
        audit.replica = store.etcd().map(|_| leader::name(local));
        let audit = &audit;
        let log = server::audit_log::AuditLog::start(audit.clone(), audit_metrics)
            .with_context(|| format!("opening the audit log {}", audit.path.display()))?;
        tracing::info!(path = %audit.path.display(), reads = audit.reads, "writing the API audit log");
        state = state.with_audit(log.clone());
        audit_log = Some(log);
    }
    let metrics_listener = match config.metrics_listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening for metrics scrapes on {addr}"))?;
            let local = listener.local_addr()?;
            let plain = server::metrics::plain_router(state.clone());
            tracing::info!(%local, "serving /metrics over plain HTTP, without authentication");
            crate::host::output::say(format_args!("hive: metrics http://{local}/metrics"));
            Some(tokio::spawn(async move {
                if let Err(why) = axum::serve(listener, plain).await {
                    tracing::warn!(error = %why, "the metrics listener stopped");
                }
            }))
        }
        None => None,
    };
    let app = server::app_with_pages(state, crate::dashboard::router());
    let connections = server::serve::Connections::new(config.http);
    let dashboard = crate::dashboard::serve_extra(
        config.dashboard_listen,
        tls_config.clone(),
        app.clone(),
        connections.clone(),
    )
    .await?;
    tracing::info!(%url, state_dir = %state_dir.display(), kubeconfig = %kubeconfig.display(), "hive is serving");
    // Lossy: a closed or full stdout must not stop the daemon it announces.
    crate::host::output::say(format_args!("hive: serving {url}"));
    crate::host::output::say(format_args!("hive: kubeconfig {}", kubeconfig.display()));
    if dashboard.is_none() {
        crate::host::output::say(format_args!("hive: dashboard {url}/"));
    }
    // A first-time user's next questions: where the dashboard is (above, or the
    // --dashboard-listen line) and what to type into its sign-in form.
    crate::host::output::say(format_args!(
        "hive: sign in with a token: the admin one is the kubeconfig's `token:`; for a read-only one run \
         `hive --kubeconfig {} token create --name NAME --role viewer`",
        kubeconfig.display()
    ));
    tracing::info!(
        max_connections = config.http.max_connections,
        header_timeout = ?config.http.timeouts.header,
        idle_timeout = ?config.http.timeouts.idle,
        "connection limits"
    );
    server::serve::serve_tls(listener, tls_config, app, connections, shutdown).await?;
    if let Some(dashboard) = dashboard {
        dashboard.abort();
    }
    if let Some(metrics_listener) = metrics_listener {
        metrics_listener.abort();
    }
    tracing::info!("shutting down: stopping agents and draining pending commits");
    // A replica still campaigning stops; one that leads has its parts stopped below.
    let campaign = match campaign {
        Some(elected) if elected.is_finished() => elected.await.ok(),
        Some(elected) => {
            elected.abort();
            None
        }
        None => None,
    };
    if let Some(parts) = leading.get() {
        parts.fleet.shutdown().await;
        parts.engine.shutdown().await;
    }
    if let Some(campaign) = campaign {
        campaign.resign().await;
    }
    store.shutdown().await;
    // Last, so the requests answered while stopping are in it too.
    if let Some(audit_log) = audit_log {
        audit_log.close(AUDIT_CLOSE_WITHIN).await;
    }
    Ok(())
}

/// What only the leader runs (all of it on a daemon on its own): the fleet, the engine
/// with its scheduler, intake, crash-watch and boot sweep, the controllers, and the
/// expiry of old Events.
struct Leading {
    engine: Arc<Engine>,
    fleet: Arc<crate::fleet::Fleet>,
}

/// Starts what only the leader runs, as a restart does: the fleet's recovery and rejoin,
/// the engine (which marks unfinished Jobs Interrupted and runs the boot sweep and
/// reconcile), the controllers.
async fn start_leading(
    config: &DaemonConfig,
    store: &Store,
    state_dir: &Path,
    metrics: &Arc<crate::metrics::Metrics>,
) -> anyhow::Result<Leading> {
    let identity = crate::fleet::open_identity(state_dir, config.reset_state)?;
    let fleet_config =
        crate::fleet::FleetConfig { controller_metrics: metrics.controllers.clone(), ..config.fleet.clone() };
    let fleet = crate::fleet::Fleet::start(store.clone(), &identity, state_dir, fleet_config).await?;
    spawn_event_expiry(store.clone(), config.event_ttl);
    let engine = start_engine(
        store.clone(),
        state_dir,
        EngineConfig {
            build_slots: config.build_slots,
            build_retries: config.build_retries,
            job_history_max_age: config.job_history_max_age,
            hive_rev: config.hive_rev.clone(),
            hive_url: config.hive_flake.clone(),
            process: Some({
                let mut process = crate::runtime::process::ProcessConfig::new(state_dir.join("agents"));
                process.default_cpu_quota = config.agent_cpu_quota.clone();
                process.default_memory_max = config.agent_memory_max.clone();
                process
            }),
            metrics: metrics.scheduler.clone(),
            controllers: metrics.controllers.clone(),
            remotes: Some(fleet.agent_nodes(state_dir.join("fleet").join("ship"))),
            // Replicas on etcd share the meta repo's history through its journal there.
            meta_journal: store.etcd().map(|backend| {
                Arc::new(meta_journal::EtcdJournal::new(backend.clone())) as Arc<dyn crate::meta::Journal>
            }),
            nixos: config.nixos_containers.then(|| {
                let mut nixos = crate::runtime::nixos::NixosConfig::new(state_dir.join("meta"));
                nixos.default_cpu_quota = config.agent_cpu_quota.clone();
                nixos.default_memory_max = config.agent_memory_max.clone();
                nixos
            }),
        },
    )
    .await
    .context("starting the scheduler and the process runtime")?;
    if config.prebuild_agent_templates {
        if config.nixos_containers {
            let engine = engine.clone();
            tokio::spawn(async move { engine.prebuild_templates().await });
        } else {
            tracing::warn!("--prebuild-agent-templates has no effect with the process runtime");
        }
    }
    if config.agent_controller {
        agent_controller::spawn(engine.clone());
    }
    approval_controller::spawn(engine.clone());
    Ok(Leading { engine, fleet })
}

/// Starts the engine and what runs beside it from boot: crash-watch, then the boot
/// reconcile (the config path's sweep, then the power path), then the Job intake, which
/// takes every Job stored while no daemon ran and every Job any write path stores after.
pub async fn start_engine(
    store: Store,
    state_dir: &Path,
    config: EngineConfig,
) -> anyhow::Result<Arc<Engine>> {
    let engine = Engine::start(store.clone(), state_dir, config).await?;
    crashwatch::spawn(store, engine.runtime.clone(), engine.scheduler.watch_leased_agents());
    let swept = boot::sweep(&engine).await;
    boot::reconcile(&engine, &swept).await;
    engine.start_intake();
    Ok(engine)
}

/// The host of an advertised `https://HOST:PORT` URL (brackets of an IPv6 one removed).
fn advertised_host(url: &str) -> Option<String> {
    let authority = url.strip_prefix("https://")?.trim_end_matches('/');
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    };
    Some(host.trim_start_matches('[').trim_end_matches(']').to_string()).filter(|h| !h.is_empty())
}

/// How long shutdown waits for the API audit log's queued entries to be written and
/// fsynced (a disk that is not keeping up cannot hold the exit longer).
const AUDIT_CLOSE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Writes the kubeconfig with the current URL and CA. The first start mints the admin
/// token; later starts keep the token already in the file. If the file is gone, a new
/// admin token is minted (the old ones stay valid until revoked).
fn write_kubeconfig(path: &Path, url: &str, ca_pem: Option<&str>, tokens: &TokenStore) -> anyhow::Result<()> {
    let existing = path
        .exists()
        .then(|| crate::auth::kubeconfig::load(path).and_then(|k| k.current()))
        .transpose()
        .unwrap_or(None)
        .and_then(|r| r.token)
        .filter(|t| tokens.authenticate(t).is_some());
    let token = match existing {
        Some(token) => token,
        None => match tokens.ensure_admin()? {
            Some(token) => token,
            None => {
                let name = minted_admin_name()?;
                tracing::warn!(kubeconfig = %path.display(), name, "kubeconfig missing or its token unknown: minting a new admin token");
                tokens.create(&name, crate::auth::Role::Admin)?
            }
        },
    };
    crate::auth::kubeconfig::write(path, url, ca_pem, &token)
}

/// The name of an admin token minted for a kubeconfig: the time and a random suffix.
/// Replicas sharing one token store may mint theirs in the same second, with the same
/// process id (each the first process of its container under `--init`): a name made of
/// the time and the pid collided, and the replica that lost exited at start.
fn minted_admin_name() -> anyhow::Result<String> {
    use ring::rand::{SecureRandom as _, SystemRandom};
    let mut bytes = [0u8; 4];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| anyhow::anyhow!("the system random number generator failed"))?;
    Ok(format!("admin-{}-{}", crate::host::now().format("%Y%m%d%H%M%S"), crate::auth::hex(&bytes)))
}

/// Deletes expired events every few minutes (and once at start).
fn spawn_event_expiry(store: Store, ttl: Duration) {
    let recorder = crate::client::events::Recorder::new(store, "hive");
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

#[cfg(test)]
mod tests {
    #[test]
    fn admin_tokens_minted_in_the_same_second_by_the_same_pid_get_different_names() {
        let names: std::collections::BTreeSet<String> =
            (0..50).map(|_| super::minted_admin_name().unwrap()).collect();
        assert_eq!(names.len(), 50, "{names:?}");
        for name in &names {
            hive_api::validation::dns1123_label(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
