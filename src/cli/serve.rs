//! `hive serve`: runs the daemon on its embedded defaults — redb state in a local
//! folder, HTTPS with a private CA, an admin token and a kubeconfig written on first
//! start (as k3s does).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;

use super::Context;
use crate::daemon::DaemonConfig;
pub use crate::daemon::{DB_FILE, DEFAULT_LISTEN};

/// The API audit log's file in the state directory, unless `--audit-log` names another.
pub const AUDIT_LOG_FILE: &str = "audit.log";

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

    /// Empty the database and delete the fleet identity (identity.key) before starting.
    /// The only way to clear state: a corrupt or unreadable database or identity is
    /// otherwise a hard startup error. Revisions continue above the old database's, so a
    /// client resuming an old watch gets 410 and lists again.
    #[arg(long)]
    pub reset_state: bool,

    /// Keep the objects in an etcd cluster instead of the embedded database:
    /// `etcd://HOST:PORT[,HOST:PORT…][/PREFIX]` (prefix default `/hive/`). Several
    /// replicas may share one cluster: every one serves the API; one is elected leader
    /// and runs the scheduler, the controllers and the fleet, and another takes over
    /// within a few seconds when it dies (see deploy/ha.md).
    #[arg(long, value_name = "URL", value_parser = parse_store)]
    pub store: Option<crate::store::etcd::EtcdConfig>,

    /// With --store: the URL other replicas reach this one's API at, to forward what
    /// only the leader runs (default: https://LISTEN-ADDRESS). Needed when listening on
    /// 0.0.0.0 or behind a NAT; its host must be in the serving certificate.
    #[arg(long, value_name = "URL", requires = "store", value_parser = parse_advertise)]
    pub advertise_url: Option<String>,

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

    /// Watch history: about how much memory the retained events may hold (their objects
    /// parsed and encoded), e.g. `256M`; the oldest are dropped beyond it.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    pub retention_bytes: usize,

    /// How long acknowledged writes may wait in the write-ahead log before the
    /// checkpointer applies them to the database file, e.g. `250ms` (at most `1m`). A
    /// write is durable once logged either way; a longer interval batches more writes per
    /// database transaction and leaves more to replay after a crash.
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = super::duration::parse)]
    pub checkpoint_interval: Duration,

    /// How often watches that allow bookmarks get one, e.g. `10s`.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::duration::parse)]
    pub bookmark_interval: Duration,

    /// Live events a watcher may lag behind before it is dropped with a 410 (it then re-lists).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub watch_buffer: usize,

    /// How much memory a watcher's pending live events may hold before it is dropped
    /// with a 410, e.g. `16M` (one event is always let through).
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = parse_size)]
    pub watch_buffer_bytes: usize,

    /// How long a streaming answer (a watch, a log, telemetry, a large list) may wait
    /// for its client to take the next chunk before it is ended as not reading, e.g. `30s`.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::duration::parse)]
    pub watch_write_timeout: Duration,

    /// Run the Agent controller, which spawns, rebuilds and converges agents by itself.
    /// `--agent-controller=false` leaves agents alone (Jobs still run when submitted).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub agent_controller: bool,

    /// How many threads serve requests and run the controllers (the async runtime's
    /// workers), 1 to 1024. Default: one a CPU core. The store's commit, checkpoint and
    /// audit-log threads come on top. On a small machine shared with the agents, fewer
    /// workers can deliver a busy stream of events sooner, but fan out to many watchers
    /// slower and with a longer tail (docs/benchmarks.md measures 1 against 2 on 2 cores).
    #[arg(long, value_name = "N", env = "HIVE_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_threads: Option<u16>,

    /// How many heavy Job nodes (builds, swaps, first creates) run at once.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub build_slots: usize,

    /// How many times the Jobs hive builds from its templates (start, restart, rebuild,
    /// spawn …) retry a failed build (their Prebuild and Create nodes), 0 to 20, with a
    /// backoff of 10 s doubling up to 5 min; a Job written with its own `spec.retry`
    /// keeps it.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub build_retries: u32,

    /// How long a finished Job (Done, Failed, Cancelled, Interrupted) without a
    /// `spec.ttlSecondsAfterFinished` of its own is kept after it finished, e.g. `24h`
    /// (`1s` up to a year, `8760h`); then it is deleted. Default: no bound by age (only the
    /// 5 most recent terminal Jobs of each template are kept, which holds either way).
    #[arg(long, value_name = "DURATION", value_parser = parse_job_history_max_age)]
    pub job_history_max_age: Option<Duration>,

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
    /// once, stopped ones at their next start). Default: the git commit this binary was
    /// built from.
    #[arg(long, value_name = "REV", env = "HIVE_BASE_REV", default_value = crate::daemon::DEFAULT_HIVE_REV)]
    pub hive_rev: String,

    /// The flake reference of the hive base flake (it provides `lib.agentSystem`), the
    /// meta flake's `hive` input: a path, `git+file:`, `git+https://` or `github:` ref.
    /// Default: the repository checkout this binary was built from.
    #[arg(long, value_name = "REF", env = "HIVE_BASE_FLAKE", default_value = crate::daemon::DEFAULT_HIVE_URL)]
    pub hive_flake: String,

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

    /// The addresses Vast.ai workers dial the daemon at (a public IP and port that reach
    /// --fleet-listen), when it is not the bound one. Among replicas (--store), list
    /// every replica's, comma-separated: a worker redials them all after a failover and
    /// reaches whichever replica leads.
    #[arg(long, value_name = "ADDR[,ADDR...]", value_delimiter = ',')]
    pub fleet_advertise: Vec<SocketAddr>,

    /// How long one attempt to pull a joined node's telemetry may wait for its first
    /// descriptors (`1s` up to `10m`). A node that has not described its channels by
    /// then stays Provisioning (its `Telemetry` condition says it waits) and the pull is
    /// retried with backoff for the node's lifetime: a slow node is slow, never Failed.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "15s",
        env = "HIVE_FLEET_TELEMETRY_WAIT",
        value_parser = parse_telemetry_wait
    )]
    pub fleet_telemetry_wait: Duration,

    /// How long a new node's worker may take to join before the node is Failed (`1s` up
    /// to `24h`) [default: per provider: process 30s, docker 2m, vastai 30m]. A local
    /// worker that did not join is stopped; a Vast.ai instance is left running (and
    /// billed): its record is adopted if its worker joins later, or after a restart.
    #[arg(long, value_name = "DURATION", env = "HIVE_FLEET_JOIN_TIMEOUT", value_parser = parse_join_timeout)]
    pub fleet_join_timeout: Option<Duration>,

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
    /// API, https://console.vast.ai/api/v0). Also allowed as a --provider-base-url.
    #[arg(long, value_name = "URL", env = "HIVE_VASTAI_BASE_URL")]
    pub vastai_base_url: Option<String>,

    /// The directory Providers may read a Vast.ai API key file from: `spec.vastai.apiKeyFile`
    /// names a file inside it by its relative path (or an absolute path inside it); links
    /// are followed only while they stay inside. Without it, no Provider names a key file.
    #[arg(long, value_name = "DIR")]
    pub provider_key_dir: Option<PathBuf>,

    /// An environment variable Providers may read a Vast.ai API key from
    /// (`spec.vastai.apiKeyEnv`); repeat for several. `--provider vastai` allows
    /// VASTAI_API_KEY. Without any, no Provider names a variable.
    #[arg(long, value_name = "NAME")]
    pub provider_key_env: Vec<String>,

    /// A base URL (besides the public API and --vastai-base-url) that a key read from this
    /// host (a key file or variable) may be sent to; repeat for several. A key given at
    /// runtime (`hive fleet configure`) may go to any base URL.
    #[arg(long, value_name = "URL")]
    pub provider_base_url: Vec<String>,

    /// Also serve the dashboard (and the API it calls) on this address, with the same
    /// TLS; it is always on --listen at `/`. A bare port means 127.0.0.1:PORT
    /// (`HIVE_DASHBOARD_PORT` sets that port; the Myelin document's
    /// `MYELIN_DASHBOARD_PORT` too, when neither the flag nor `HIVE_DASHBOARD_PORT` is given).
    #[arg(long, value_name = "ADDR", env = "HIVE_DASHBOARD_PORT", value_parser = crate::dashboard::parse_listen)]
    pub dashboard_listen: Option<SocketAddr>,

    /// Also serve `GET /metrics` (Prometheus/OpenMetrics text) on this address over
    /// plain HTTP with no authentication, for a scraper on this host: bind it to a
    /// loopback address. It is always on --listen at `/metrics` for any token that may
    /// read (viewer and up).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// Record API request metrics (counts, latencies, in-flight and long-running
    /// requests, watch events). `--metrics=false` turns recording off, to measure what it
    /// costs; `/metrics` still answers, with the levels read at scrape time.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics: bool,

    /// How long a client may take to send a request's head: from the TLS handshake, or on
    /// a kept-alive connection from the request's first byte. Slower connections are
    /// closed. `0` turns it off.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::duration::parse)]
    pub http_header_timeout: Duration,

    /// How long a connection with no request in flight may go without a byte before it
    /// is closed (gracefully). A watch or a followed log is a request in flight and is
    /// never cut by it. `0` turns it off.
    #[arg(long, value_name = "DURATION", default_value = "90s", value_parser = super::duration::parse)]
    pub http_idle_timeout: Duration,

    /// Open HTTPS connections at most, over --listen and --dashboard-listen together; one
    /// more is answered 503 (`Retry-After: 1`) and closed. Default: from the open-file
    /// limit (`ulimit -n`), less a quarter of it (at least 128) for the store, agents
    /// and logs, but at least half of it, and at most 10000.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,

    /// Long-running requests (watches, logs, telemetry) open at once, everyone's
    /// together; one more is answered 429 (`Retry-After: 1`). Admin tokens may go an
    /// eighth beyond it, so an operator is never locked out. Default: a quarter of the
    /// open-file limit (`ulimit -n`; each may hold a descriptor), at most 2000.
    #[arg(long, value_name = "N")]
    pub max_long_running: Option<usize>,

    /// Long-running requests one token (or dashboard session's token) may hold open;
    /// admin tokens are not capped alone.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub max_long_running_per_client: usize,

    /// Other requests being answered at once, everyone's together (a list streamed to a
    /// slow client counts until its last byte), as kube-apiserver's
    /// --max-requests-inflight; admins may go an eighth beyond it.
    #[arg(long, value_name = "N", default_value_t = 400)]
    pub max_requests_inflight: usize,

    /// Other requests one token may have answered at once; admin tokens are not capped
    /// alone.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub max_requests_inflight_per_client: usize,

    /// Log filter, e.g. `info`, `hive=debug` (also `RUST_LOG`).
    #[arg(long, value_name = "FILTER", env = "RUST_LOG", default_value = "info")]
    pub log: String,

    /// The API audit log: every mutation (and with --audit-reads every read) as one JSON
    /// line — time, request id, user and role, verb, resource, name, subresource, code,
    /// resulting resourceVersion, source address; never a body or a token (docs/api.md).
    /// Default: `<state-dir>/audit.log`.
    #[arg(long, value_name = "PATH", conflicts_with = "no_audit_log")]
    pub audit_log: Option<PathBuf>,

    /// Write no API audit log.
    #[arg(long)]
    pub no_audit_log: bool,

    /// Also record reads (get, list, watch) in the audit log.
    #[arg(long)]
    pub audit_reads: bool,

    /// Rotate the audit log before it would grow past this size, e.g. `100M`.
    #[arg(long, value_name = "SIZE", default_value = "100M", value_parser = parse_size)]
    pub audit_log_max_size: usize,

    /// Rotated audit logs kept (`PATH.1` newest … `PATH.N`); 0 keeps none.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub audit_log_max_backups: usize,

    /// Log line format on stderr: `text` (for people; coloured only when stderr is a
    /// terminal) or `json` (one JSON object a line, with the request's span and its
    /// `request_id`, for a log collector).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The log formats `hive serve --log-format` accepts.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines; ANSI colour only on a terminal, never in a file or pipe.
    Text,
    /// One JSON object a line (tracing-subscriber's JSON formatter).
    Json,
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
pub async fn exec(mut args: Args, _ctx: &Context) -> anyhow::Result<()> {
    args.dashboard_listen =
        dashboard_listen(args.dashboard_listen, crate::host::env::var(MYELIN_DASHBOARD_PORT))?;
    check(&args)?;
    let key_sources = key_sources(&args)?;
    init_tracing(&args.log, args.log_format);
    let state_dir = args.state_dir.clone().unwrap_or_else(crate::auth::kubeconfig::default_state_dir);
    let config = DaemonConfig {
        listen: args.listen,
        audit: (!args.no_audit_log).then(|| crate::server::audit_log::AuditConfig {
            path: args.audit_log.clone().unwrap_or_else(|| state_dir.join(AUDIT_LOG_FILE)),
            max_size: args.audit_log_max_size as u64,
            max_backups: args.audit_log_max_backups,
            reads: args.audit_reads,
            replica: None,
        }),
        state_dir,
        reset_state: args.reset_state,
        store: args.store.clone(),
        advertise: args.advertise_url.clone(),
        tls: args.tls_cert.clone().zip(args.tls_key.clone()),
        retention_events: args.retention_events,
        retention_age: args.retention_age,
        watch_buffer: args.watch_buffer,
        watch_buffer_bytes: args.watch_buffer_bytes,
        retention_bytes: args.retention_bytes,
        checkpoint_interval: args.checkpoint_interval,
        watch_write_timeout: args.watch_write_timeout,
        limits: request_limits(&args),
        bookmark_interval: args.bookmark_interval,
        event_ttl: args.event_ttl,
        agent_controller: args.agent_controller,
        build_slots: args.build_slots,
        build_retries: args.build_retries,
        job_history_max_age: args.job_history_max_age,
        nixos_containers: args.runtime == RuntimeChoice::NixosContainer,
        prebuild_agent_templates: args.prebuild_agent_templates,
        agent_cpu_quota: args.agent_cpu_quota.clone(),
        agent_memory_max: args.agent_memory_max.clone(),
        hive_rev: args.hive_rev.clone(),
        hive_flake: args.hive_flake.clone(),
        fleet: crate::fleet::FleetConfig {
            default_provider: args.provider,
            net: crate::fleet::net::NetConfig {
                bind: args.fleet_listen,
                relay: args.fleet_relay,
                advertise: args.fleet_advertise.clone(),
            },
            telemetry_wait: args.fleet_telemetry_wait,
            join_timeout: args.fleet_join_timeout,
            docker_image: args.docker_image.clone(),
            docker_network: args.docker_network.clone(),
            vastai_base_url: args.vastai_base_url.clone(),
            key_sources,
            controller_metrics: Default::default(),
        },
        dashboard_listen: args.dashboard_listen,
        metrics_listen: args.metrics_listen,
        metrics: args.metrics,
        http: serve_config(&args),
    };
    crate::daemon::run(config, shutdown_signal()).await
}

/// `--fleet-telemetry-wait`: a duration from 1 s to 10 min (a shorter attempt could
/// never reach a worker over a slow link; a longer one only delays the retry).
fn parse_telemetry_wait(text: &str) -> Result<Duration, String> {
    let wait = super::duration::parse(text)?;
    if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&wait) {
        return Err(format!("{text:?} is outside 1s..10m"));
    }
    Ok(wait)
}

/// `--fleet-join-timeout`: a duration from 1 s to 24 h.
fn parse_join_timeout(text: &str) -> Result<Duration, String> {
    let timeout = super::duration::parse(text)?;
    if !(Duration::from_secs(1)..=Duration::from_secs(24 * 3600)).contains(&timeout) {
        return Err(format!("{text:?} is outside 1s..24h"));
    }
    Ok(timeout)
}

/// `--job-history-max-age`: a duration from 1 s to a year, the longest
/// `spec.ttlSecondsAfterFinished` (a max age of 0 would delete a Job before a client
/// waiting on it could read how it ended).
fn parse_job_history_max_age(text: &str) -> Result<Duration, String> {
    let age = super::duration::parse(text)?;
    let year = Duration::from_secs(hive_api::job::MAX_TTL_SECONDS as u64);
    if !(Duration::from_secs(1)..=year).contains(&age) {
        return Err(format!("{text:?} is outside 1s..8760h (a year)"));
    }
    Ok(age)
}

/// The caps on requests held at once (`server::streams`).
fn request_limits(args: &Args) -> crate::server::streams::Limits {
    let defaults = crate::server::streams::Limits::default_for(crate::host::limits::open_files());
    crate::server::streams::Limits {
        long_running: args.max_long_running.unwrap_or(defaults.long_running),
        long_running_per_client: args.max_long_running_per_client,
        inflight: args.max_requests_inflight,
        inflight_per_client: args.max_requests_inflight_per_client,
    }
}

/// The listeners' limits: the timeouts (`0` is off) and the connection cap, by default
/// derived from the open-file limit.
fn serve_config(args: &Args) -> crate::server::serve::ServeConfig {
    let on = |d: Duration| (!d.is_zero()).then_some(d);
    crate::server::serve::ServeConfig {
        timeouts: crate::server::serve::Timeouts {
            header: on(args.http_header_timeout),
            idle: on(args.http_idle_timeout),
        },
        max_connections: args.max_connections.unwrap_or_else(|| {
            crate::server::serve::ServeConfig::default_max_connections(crate::host::limits::open_files())
        }),
    }
}

/// Installs the log subscriber: `filter` on stderr in `format`. Colour only when stderr
/// is a terminal, so a log redirected to a file or a journal has no escape codes in it.
fn init_tracing(filter: &str, format: LogFormat) {
    use std::io::IsTerminal as _;
    let builder = log_builder(filter, crate::host::output::Stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
        // Each line carries the fields of the spans it was logged in (the request's
        // `request_id` among them), so one request's lines can be found by its id.
        LogFormat::Json => {
            builder.with_ansi(false).json().with_current_span(true).with_span_list(false).try_init()
        }
    };
}

/// The daemon's log subscriber over `writer`: a line that cannot be written (a full disk
/// under a redirected log, a closed pipe) is dropped by the writer, and not reported by
/// tracing-subscriber either, whose report is an `eprintln!` that panics the request or
/// the store thread that logged.
pub(crate) fn log_builder<W>(
    filter: &str,
    writer: W,
) -> tracing_subscriber::fmt::SubscriberBuilder<
    tracing_subscriber::fmt::format::DefaultFields,
    tracing_subscriber::fmt::format::Format,
    tracing_subscriber::EnvFilter,
    W,
>
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).log_internal_errors(false)
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

/// A byte count with an optional K, M, G or T suffix (1024-based); a clap `value_parser`.
fn parse_size(value: &str) -> Result<usize, String> {
    use crate::runtime::process::limits::{parse_memory_max, MemoryMax};
    match parse_memory_max(value) {
        Ok(MemoryMax::Bytes(bytes)) => usize::try_from(bytes).map_err(|_| format!("{value:?}: is too large")),
        Ok(MemoryMax::Unlimited) => Err(format!("{value:?}: must be a byte count such as \"16M\"")),
        Err(e) => Err(e),
    }
}

/// What Providers may read a key from on this host, from the flags: the directory, the
/// variables (with VASTAI_API_KEY for `--provider vastai`), the base URLs (with
/// `--vastai-base-url`).
fn key_sources(args: &Args) -> anyhow::Result<crate::fleet::providers::keys::KeySources> {
    use crate::fleet::providers::keys::{KeySources, BUILTIN_KEY_ENV};
    let mut urls = args.provider_base_url.clone();
    // (A malformed one makes the built-in Provider invalid, as before; it allows nothing.)
    urls.extend(
        args.vastai_base_url.clone().filter(|u| u.starts_with("https://") || u.starts_with("http://")),
    );
    let mut sources = KeySources::new(args.provider_key_dir.as_deref(), &args.provider_key_env, &urls)
        .map_err(anyhow::Error::msg)?;
    if args.provider == crate::fleet::ProviderChoice::Vastai {
        sources.allow_env(BUILTIN_KEY_ENV);
    }
    Ok(sources)
}

/// The Myelin document's name for the dashboard's port.
const MYELIN_DASHBOARD_PORT: &str = "MYELIN_DASHBOARD_PORT";

/// `--dashboard-listen` (or `HIVE_DASHBOARD_PORT`) when given, else `MYELIN_DASHBOARD_PORT`.
fn dashboard_listen(given: Option<SocketAddr>, myelin: Option<String>) -> anyhow::Result<Option<SocketAddr>> {
    match (given, myelin) {
        (Some(addr), _) => Ok(Some(addr)),
        (None, Some(value)) => crate::dashboard::parse_listen(&value)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{MYELIN_DASHBOARD_PORT}={value:?}: {e}")),
        (None, None) => Ok(None),
    }
}

/// Rejects flag values clap cannot check by itself.
fn check(args: &Args) -> anyhow::Result<()> {
    if args.watch_buffer == 0 {
        bail!("--watch-buffer must be at least 1");
    }
    if args.checkpoint_interval.is_zero() || args.checkpoint_interval > Duration::from_secs(60) {
        bail!("--checkpoint-interval must be more than 0 and at most 1m");
    }
    if args.watch_write_timeout.is_zero() {
        bail!("--watch-write-timeout must be more than 0");
    }
    if args.build_slots == 0 {
        bail!("--build-slots must be at least 1");
    }
    for (flag, value) in [
        ("--max-long-running", args.max_long_running.unwrap_or(1)),
        ("--max-long-running-per-client", args.max_long_running_per_client),
        ("--max-requests-inflight", args.max_requests_inflight),
        ("--max-requests-inflight-per-client", args.max_requests_inflight_per_client),
    ] {
        if value == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    if args.audit_log_max_size == 0 {
        bail!("--audit-log-max-size must be more than 0");
    }
    if args.max_connections == Some(0) {
        bail!("--max-connections must be at least 1");
    }
    crate::runtime::process::limits::parse_cpu_quota(&args.agent_cpu_quota)
        .map_err(|e| anyhow::anyhow!("--agent-cpu-quota {e}"))?;
    crate::runtime::process::limits::parse_memory_max(&args.agent_memory_max)
        .map_err(|e| anyhow::anyhow!("--agent-memory-max {e}"))?;
    if args.hive_rev.trim().is_empty() {
        bail!(
            "--hive-rev must not be empty (this build does not know the git commit it was built from: \
             pass the hive commit the meta flake should lock)"
        );
    }
    if args.hive_flake.trim().is_empty() {
        bail!("--hive-flake must not be empty");
    }
    Ok(())
}

/// `--store`: an etcd cluster's URL.
fn parse_advertise(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| format!("{url:?}: the advertised URL is https://HOST:PORT (replicas serve HTTPS)"))?;
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        return Err(format!("{url:?}: expected https://HOST:PORT, without a path"));
    }
    Ok(format!("https://{authority}"))
}

fn parse_store(url: &str) -> Result<crate::store::etcd::EtcdConfig, String> {
    crate::store::etcd::EtcdConfig::parse(url)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: Args,
    }

    fn checked(flags: &[&str]) -> anyhow::Result<()> {
        let serve = Serve::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()))?;
        check(&serve.args)
    }

    #[test]
    fn an_advertised_url_is_https_host_port_and_needs_a_store() {
        let store = ["--store", "etcd://127.0.0.1:2379"];
        let with = |url: &str| Serve::try_parse_from(["serve", store[0], store[1], "--advertise-url", url]);
        assert_eq!(
            with("https://hive-a:7443/").unwrap().args.advertise_url.as_deref(),
            Some("https://hive-a:7443")
        );
        for bad in ["http://hive-a:7443", "hive-a:7443", "https://", "https://hive-a:7443/api"] {
            let err = with(bad).err().unwrap_or_else(|| panic!("{bad} was taken")).to_string();
            assert!(err.contains("--advertise-url") && err.contains("https://HOST:PORT"), "{bad}: {err}");
        }
        let alone = Serve::try_parse_from(["serve", "--advertise-url", "https://hive-a:7443"]);
        assert!(alone.is_err(), "--advertise-url without --store is refused");
    }

    #[test]
    fn fleet_advertise_takes_every_replicas_address() {
        let serve =
            |flags: &[&str]| Serve::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()));
        assert!(serve(&[]).unwrap().args.fleet_advertise.is_empty());
        let one = serve(&["--fleet-advertise", "203.0.113.7:7946"]).unwrap().args.fleet_advertise;
        assert_eq!(one, vec!["203.0.113.7:7946".parse::<SocketAddr>().unwrap()]);
        let three = serve(&["--fleet-advertise", "10.0.0.1:7946,10.0.0.2:7946,[2001:db8::3]:7946"]).unwrap();
        assert_eq!(three.args.fleet_advertise.len(), 3);
        assert_eq!(three.args.fleet_advertise[2], "[2001:db8::3]:7946".parse::<SocketAddr>().unwrap());
        let err = serve(&["--fleet-advertise", "10.0.0.1:7946,host-b"]).err().unwrap().to_string();
        assert!(err.contains("--fleet-advertise") && err.contains("host-b"), "{err}");
    }

    #[test]
    fn the_checkpoint_interval_is_more_than_zero_and_at_most_a_minute() {
        assert!(checked(&[]).is_ok(), "the defaults pass");
        assert!(checked(&["--checkpoint-interval", "100ms"]).is_ok());
        assert!(checked(&["--checkpoint-interval", "1m"]).is_ok());
        for bad in ["0", "61s", "1h"] {
            let err = checked(&["--checkpoint-interval", bad]).unwrap_err().to_string();
            assert!(err.contains("--checkpoint-interval must be more than 0 and at most 1m"), "{bad}: {err}");
        }
        assert!(checked(&["--checkpoint-interval", "soon"]).is_err());
    }

    #[test]
    fn the_fleet_join_timeout_is_from_a_second_to_a_day_and_absent_by_default() {
        let serve =
            |flags: &[&str]| Serve::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()));
        assert_eq!(serve(&[]).unwrap().args.fleet_join_timeout, None);
        let set = serve(&["--fleet-join-timeout", "90s"]).unwrap();
        assert_eq!(set.args.fleet_join_timeout, Some(Duration::from_secs(90)));
        for bad in ["0", "25h", "soon"] {
            let err = serve(&["--fleet-join-timeout", bad]).err().unwrap().to_string();
            assert!(err.contains("--fleet-join-timeout"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_job_history_max_age_is_from_a_second_to_a_year_and_off_by_default() {
        let serve =
            |flags: &[&str]| Serve::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()));
        assert_eq!(serve(&[]).unwrap().args.job_history_max_age, None, "no bound by age unless asked");
        let set = serve(&["--job-history-max-age", "24h"]).unwrap();
        assert_eq!(set.args.job_history_max_age, Some(Duration::from_secs(24 * 3600)));
        assert!(serve(&["--job-history-max-age", "8760h"]).is_ok());
        for bad in ["0", "500ms", "8761h", "soon"] {
            let err = serve(&["--job-history-max-age", bad]).err().unwrap().to_string();
            assert!(err.contains("--job-history-max-age"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_fleet_telemetry_wait_is_from_a_second_to_ten_minutes() {
        let wait =
            |flags: &[&str]| Serve::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()));
        assert_eq!(wait(&[]).unwrap().args.fleet_telemetry_wait, Duration::from_secs(15));
        assert_eq!(
            wait(&["--fleet-telemetry-wait", "2s"]).unwrap().args.fleet_telemetry_wait,
            Duration::from_secs(2)
        );
        for bad in ["0", "500ms", "11m"] {
            let err = wait(&["--fleet-telemetry-wait", bad]).err().unwrap().to_string();
            assert!(
                err.contains("--fleet-telemetry-wait") && err.contains("outside 1s..10m"),
                "{bad}: {err}"
            );
        }
    }
}
