//! `hive bench`: starts a fresh daemon as a child process on 127.0.0.1 in a temporary
//! directory and measures it from outside, over HTTPS, as clients see it: durable
//! creates per second at several concurrencies, one raw redb commit next to them, watch
//! delivery latency to many watchers while writing, a large list from the cache, and
//! the daemon's memory. Results go to stdout (with `--markdown`, also as a section for
//! `docs/benchmarks.md`); one progress line per phase goes to stderr.
//!
//! The clients here talk HTTP directly instead of through [`super::client::Client`]:
//! they need one connection pool per simulated client, the status code without parsing
//! every body, and the raw bytes of a list. It is still only the public REST API.

mod power;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use bytes::Bytes;
use hive_api::AgentList;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{Barrier, Semaphore};
use tokio::task::JoinSet;

use super::Context;

/// Where Agents are created, listed and watched.
const AGENTS: &str = "/apis/hive.dev/v1/agents";
/// The annotation carrying a watch-phase write's send time (Unix nanoseconds).
const SENT_ANNOTATION: &str = "bench.hive.dev/sent-ns";
/// Longest any single create or list may take before the run fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the daemon may take to print its URL.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long watchers may take, after the last write, to receive everything.
const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// Watch streams opened at the same time (each is a TLS handshake).
const OPENING_AT_ONCE: usize = 32;
/// Longest a fill of `--objects` may take.
const FILL_LIMIT: Duration = Duration::from_secs(15 * 60);
/// Upper bounds that keep a run bounded whatever the flags say.
const MAX_CLIENTS: usize = 1024;
const MAX_PHASE: Duration = Duration::from_secs(600);

/// Arguments of `hive bench`.
///
/// Starts a fresh daemon from this executable on 127.0.0.1 with its state in a
/// temporary directory, measures it, prints a table, then kills it and removes the
/// directory. Nothing else is touched: `--kubeconfig` is ignored. Build with
/// `--release` first; numbers from a debug build mean little.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// How long each create level runs, e.g. `5s` [default: 5s; 1s with --quick].
    #[arg(long, value_name = "DURATION", value_parser = super::duration::parse)]
    pub duration: Option<Duration>,

    /// Concurrent clients of the create levels, each with its own connection.
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_value = "1,16,64")]
    pub clients: Vec<usize>,

    /// Raw redb commits (one row each, durable) to time [default: 200; 50 with --quick].
    #[arg(long, value_name = "N")]
    pub raw_commits: Option<usize>,

    /// Watch streams to open, one connection each [default: 1000; 200 with --quick].
    /// Needs that many open files in this process and in the daemon (`ulimit -n`).
    #[arg(long, value_name = "N")]
    pub watchers: Option<usize>,

    /// Writes per second, from one writer, while the watchers listen.
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub watch_rate: u32,

    /// How long the writer writes to the watchers [default: 5s; 2s with --quick].
    #[arg(long, value_name = "DURATION", value_parser = super::duration::parse)]
    pub watch_duration: Option<Duration>,

    /// Objects in the store for the list and memory measurements; the store is topped
    /// up to this many with --fill-clients clients [default: 100000; 10000 with --quick].
    #[arg(long, value_name = "N")]
    pub objects: Option<usize>,

    /// Concurrent clients creating the --objects.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub fill_clients: usize,

    /// Full lists to time; the median is reported [default: 5; 3 with --quick].
    #[arg(long, value_name = "N")]
    pub list_runs: Option<usize>,

    /// Parent of the temporary directory holding the daemon's state (default: the
    /// system's temporary directory). Its disk is the one whose fsync is measured.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Stop/start cycles of a real agent process to time end to end [default: 10; 3 with --quick].
    #[arg(long, value_name = "N")]
    pub power_cycles: Option<usize>,

    /// A short smoke run: 1s levels, 50 raw commits, 200 watchers for 2s, 10000 objects.
    #[arg(long)]
    pub quick: bool,

    /// Also print the results as a Markdown section for docs/benchmarks.md.
    #[arg(long)]
    pub markdown: bool,

    /// One more `hive serve` flag for the daemon under test; repeat for several. E.g.
    /// `--serve-arg=--metrics=false` measures without request metrics.
    #[arg(long, value_name = "FLAG", allow_hyphen_values = true)]
    pub serve_arg: Vec<String>,
}

/// What one run measures, with `--quick` and the defaults resolved.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    duration: Duration,
    clients: Vec<usize>,
    raw_commits: usize,
    watchers: usize,
    watch_rate: u32,
    watch_duration: Duration,
    objects: usize,
    fill_clients: usize,
    list_runs: usize,
    power_cycles: usize,
    /// Extra `hive serve` flags (`--serve-arg`).
    serve_args: Vec<String>,
}

impl Plan {
    fn from_args(args: &Args) -> Result<Plan> {
        let quick = args.quick;
        let pick = |given: Option<usize>, normal: usize, short: usize| {
            given.unwrap_or(if quick { short } else { normal })
        };
        let plan = Plan {
            duration: args.duration.unwrap_or(Duration::from_secs(if quick { 1 } else { 5 })),
            clients: args.clients.clone(),
            raw_commits: pick(args.raw_commits, 200, 50),
            watchers: pick(args.watchers, 1000, 200),
            watch_rate: args.watch_rate,
            watch_duration: args.watch_duration.unwrap_or(Duration::from_secs(if quick { 2 } else { 5 })),
            objects: pick(args.objects, 100_000, 10_000),
            fill_clients: args.fill_clients,
            list_runs: pick(args.list_runs, 5, 3),
            power_cycles: pick(args.power_cycles, 10, 3),
            serve_args: args.serve_arg.clone(),
        };
        ensure!(!plan.clients.is_empty(), "--clients needs at least one level");
        for n in plan.clients.iter().chain([&plan.fill_clients]) {
            ensure!(
                (1..=MAX_CLIENTS).contains(n),
                "client counts must be between 1 and {MAX_CLIENTS}, not {n}"
            );
        }
        for (flag, d) in [("--duration", plan.duration), ("--watch-duration", plan.watch_duration)] {
            ensure!(!d.is_zero() && d <= MAX_PHASE, "{flag} must be more than 0 and at most 10m");
        }
        ensure!((1..=100_000).contains(&plan.raw_commits), "--raw-commits must be between 1 and 100000");
        ensure!((1..=100_000).contains(&plan.watchers), "--watchers must be between 1 and 100000");
        ensure!((1..=1000).contains(&plan.watch_rate), "--watch-rate must be between 1 and 1000");
        ensure!((1..=10_000_000).contains(&plan.objects), "--objects must be between 1 and 10000000");
        ensure!((1..=100).contains(&plan.list_runs), "--list-runs must be between 1 and 100");
        ensure!((1..=1000).contains(&plan.power_cycles), "--power-cycles must be between 1 and 1000");
        Ok(plan)
    }

    /// Writes the watch phase makes.
    fn watch_writes(&self) -> usize {
        ((self.watch_rate as f64 * self.watch_duration.as_secs_f64()).round() as usize).max(1)
    }

    /// The flags that reproduce this plan.
    fn flags(&self) -> String {
        let clients: Vec<String> = self.clients.iter().map(ToString::to_string).collect();
        format!(
            "--duration {}s --clients {} --raw-commits {} --watchers {} --watch-rate {} \
             --watch-duration {}s --objects {} --fill-clients {} --list-runs {} --power-cycles {}",
            self.duration.as_secs_f64(),
            clients.join(","),
            self.raw_commits,
            self.watchers,
            self.watch_rate,
            self.watch_duration.as_secs_f64(),
            self.objects,
            self.fill_clients,
            self.list_runs,
            self.power_cycles
        ) + &self.serve_args.iter().map(|a| format!(" --serve-arg={a}")).collect::<String>()
    }
}

/// Runs the benchmark; Ctrl-C stops the daemon and removes the temporary directory.
pub async fn exec(args: Args, _ctx: &Context) -> Result<()> {
    let plan = Plan::from_args(&args)?;
    let work = WorkDir::create(args.dir.as_deref())?;
    let report = tokio::select! {
        report = run(&plan, &work) => report?,
        _ = tokio::signal::ctrl_c() => bail!("interrupted; the daemon was stopped"),
    };
    print!("{}", render_text(&report.rows));
    if args.markdown {
        println!();
        print!("{}", render_markdown(&report, &plan));
    }
    Ok(())
}

/// Everything one run found.
struct Report {
    rows: Vec<Row>,
    machine_before: Machine,
    load_after: String,
}

async fn run(plan: &Plan, work: &WorkDir) -> Result<Report> {
    let machine_before = Machine::read();
    let needed = plan.watchers.max(plan.fill_clients) + 256;
    let limit = open_files_limit()?;
    ensure!(
        limit >= needed as u64,
        "{} watchers need about {needed} open files, but this process may open {limit}: \
         raise the limit (`ulimit -n {needed}`, up to `ulimit -Hn`) or pass a smaller --watchers",
        plan.watchers
    );
    let mut rows = Vec::new();

    progress(format_args!("raw redb commits n={} in {}", plan.raw_commits, work.path().display()));
    let (dir, n) = (work.path().to_path_buf(), plan.raw_commits);
    let raw = tokio::task::spawn_blocking(move || crate::store::bench::raw_commit_latencies(&dir, n))
        .await?
        .context("timing raw redb commits")?;
    let (dir, n) = (work.path().to_path_buf(), plan.raw_commits);
    let fsync = tokio::task::spawn_blocking(move || fdatasync_latencies(&dir, n)).await??;

    progress(format_args!("starting the daemon"));
    let daemon = Daemon::start(work.path(), &plan.serve_args).await?;
    let idle = daemon.memory()?;

    let mut creates = Vec::new();
    for &clients in &plan.clients {
        progress(format_args!("creates c={clients} for {:?}", plan.duration));
        let until = Until::Elapsed(plan.duration);
        let meter = CpuMeter::start(daemon.pid);
        let run = create_with(&daemon.endpoint, clients, until, &format!("c{clients}"), true).await?;
        creates.push((run, meter.stop()));
    }
    for (run, cpu) in &creates {
        let aim = (run.clients == 64).then(|| aim_text(run.rate() >= 10_000.0, "≥ 10,000/s"));
        let measurement = format!("durable creates, {} client(s)", run.clients);
        rows.push(run.row(measurement, aim.unwrap_or_default()).with_cpu(*cpu));
    }
    rows.push(Row::new(
        "raw redb commit (1 row, Immediate)",
        format!("{} commits", raw.len()),
        Some(raw.as_slice()),
        "",
    ));
    rows.push(Row::new(
        "fdatasync of 4 KiB (same disk)",
        format!("{} syncs", fsync.len()),
        Some(fsync.as_slice()),
        "",
    ));

    progress(format_args!(
        "watch: {} watchers, {} writes at {}/s",
        plan.watchers,
        plan.watch_writes(),
        plan.watch_rate
    ));
    let watch = watch_phase(&daemon.endpoint, daemon.pid, plan).await?;
    rows.extend(watch.rows());

    progress(format_args!("power: {} stop/start cycles of a real agent process", plan.power_cycles));
    let api = daemon.endpoint.api(Some(REQUEST_TIMEOUT))?;
    rows.extend(power::phase(&api, work.path(), plan.power_cycles).await?);

    let existing = daemon.endpoint.api(Some(REQUEST_TIMEOUT))?.list_head().await?.0;
    let missing = plan.objects.saturating_sub(existing);
    progress(format_args!(
        "fill: {missing} creates with {} clients (to {} objects)",
        plan.fill_clients, plan.objects
    ));
    let next = Arc::new(AtomicUsize::new(0));
    let until = Until::Count { next, total: missing };
    let meter = CpuMeter::start(daemon.pid);
    let fill = tokio::time::timeout(
        FILL_LIMIT,
        create_with(&daemon.endpoint, plan.fill_clients, until, "fill", false),
    )
    .await
    .map_err(|_| anyhow!("filling the store took longer than {FILL_LIMIT:?}"))??;
    if fill.created > 0 {
        let cpu = meter.stop();
        rows.push(fill.row(format!("fill creates, {} clients", fill.clients), String::new()).with_cpu(cpu));
    }

    progress(format_args!("list: {} full lists", plan.list_runs));
    let meter = CpuMeter::start(daemon.pid);
    let list = list_phase(&daemon.endpoint, plan.list_runs).await?;
    rows.push(list.with_cpu(meter.stop()));

    let full = daemon.memory()?;
    rows.push(Row::new("daemon memory, idle after start", idle.to_string(), None, ""));
    let db_path = work.path().join("state").join(super::serve::DB_FILE);
    let db_bytes =
        std::fs::metadata(&db_path).with_context(|| format!("reading {}", db_path.display()))?.len();
    rows.push(Row::new(
        format!("daemon memory, {} objects", fmt_count(plan.objects.max(existing) as u64)),
        format!("{full}; database file {:.0} MiB", db_bytes as f64 / (1024.0 * 1024.0)),
        None,
        "",
    ));
    daemon.stop().await;
    Ok(Report { rows, machine_before, load_after: Machine::load_average() })
}

fn progress(what: std::fmt::Arguments<'_>) {
    eprintln!("bench: {what}");
}

fn aim_text(met: bool, aim: &str) -> String {
    format!("{aim}: {}", if met { "met" } else { "missed" })
}

// ----- the daemon -------------------------------------------------------------------

/// A temporary directory, removed (with everything in it) on drop.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create(parent: Option<&Path>) -> Result<WorkDir> {
        let parent = parent.map(Path::to_path_buf).unwrap_or_else(std::env::temp_dir);
        let path = parent.join(format!("hive-bench-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&path)
            .with_context(|| format!("creating a temporary directory in {}", parent.display()))?;
        Ok(WorkDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How to reach the daemon.
#[derive(Clone)]
struct Endpoint {
    url: Arc<str>,
    ca_pem: Arc<[u8]>,
    token: Arc<str>,
}

/// `hive serve` running as a child process; killed when dropped.
struct Daemon {
    child: tokio::process::Child,
    pid: u32,
    endpoint: Endpoint,
    /// Its stderr (warnings and errors only).
    log_path: PathBuf,
}

impl Daemon {
    async fn start(work: &Path, extra: &[String]) -> Result<Daemon> {
        let state = work.join("state");
        let log_path = work.join("daemon.log");
        let log =
            std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let exe = std::env::current_exe().context("cannot find this executable to start the daemon")?;
        let mut child = tokio::process::Command::new(exe)
            // Without the Agent controller: it would give every benchmark Agent a spawn
            // Job, and this measures the API and the store, not agents starting.
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--fleet-listen",
                "127.0.0.1:0",
                "--log",
                "warn",
                "--agent-controller=false",
            ])
            .arg("--state-dir")
            .arg(&state)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start `hive serve`")?;
        let stdout = child.stdout.take().context("the daemon's stdout is not piped")?;
        let mut lines = BufReader::new(stdout).lines();
        let url = tokio::time::timeout(START_TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix("hive: serving ") {
                    return Some(url.to_string());
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        let Some(url) = url else {
            let _ = child.kill().await;
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("the daemon did not start within {START_TIMEOUT:?}; its log:\n{log}");
        };
        // The daemon prints to stdout now and then; keep the pipe open and drained.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let kubeconfig = state.join(crate::auth::kubeconfig::FILE_NAME);
        let resolved = crate::auth::kubeconfig::load(&kubeconfig)
            .and_then(|k| k.current())
            .with_context(|| format!("reading the daemon's kubeconfig {}", kubeconfig.display()))?;
        let ca_pem = resolved.ca_pem.context("the daemon's kubeconfig has no CA")?;
        let token = resolved.token.context("the daemon's kubeconfig has no token")?;
        let endpoint = Endpoint { url: url.into(), ca_pem: ca_pem.into(), token: token.into() };
        let pid = child.id().context("the daemon exited at once")?;
        Ok(Daemon { child, pid, endpoint, log_path })
    }

    /// Resident memory now and at its peak, from `/proc/<pid>/status`.
    fn memory(&self) -> Result<Memory> {
        let path = format!("/proc/{}/status", self.pid);
        let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let kib = |key| status_kib(&status, key).with_context(|| format!("{path} has no {key}"));
        Ok(Memory { rss_kib: kib("VmRSS")?, hwm_kib: kib("VmHWM")? })
    }

    /// Kills the daemon and passes on what it logged: a warning during a run (a watcher
    /// dropped, a failed commit) changes what the numbers mean.
    async fn stop(mut self) {
        let _ = self.child.kill().await;
        let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        if !log.trim().is_empty() {
            let first: Vec<&str> = log.lines().take(5).collect();
            progress(format_args!(
                "the daemon logged {} line(s); the first:\n{}",
                log.lines().count(),
                first.join("\n")
            ));
        }
    }
}

/// A process's resident set size, now and at its peak.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Memory {
    rss_kib: u64,
    hwm_kib: u64,
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VmRSS {:.0} MiB (peak {:.0} MiB)",
            self.rss_kib as f64 / 1024.0,
            self.hwm_kib as f64 / 1024.0
        )
    }
}

/// The kB value of `key` in a `/proc/<pid>/status` text (`VmRSS:   123 kB`).
fn status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The soft limit on open files of this process (the daemon inherits it).
fn open_files_limit() -> Result<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").context("reading /proc/self/limits")?;
    parse_open_files(&limits).context("/proc/self/limits has no readable `Max open files` line")
}

fn parse_open_files(limits: &str) -> Option<u64> {
    let rest = limits.lines().find_map(|line| line.strip_prefix("Max open files"))?;
    match rest.split_whitespace().next()? {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

/// `n` writes of 4 KiB at offset 0 of one file, each followed by `fdatasync`: the floor
/// under any durable commit on this disk.
fn fdatasync_latencies(dir: &Path, n: usize) -> Result<Vec<Duration>> {
    use std::io::{Seek, SeekFrom, Write};
    let path = dir.join("fdatasync-bench");
    let mut file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let block = [b'x'; 4096];
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&block)?;
        file.sync_data().with_context(|| format!("fdatasync of {}", path.display()))?;
        latencies.push(started.elapsed());
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    Ok(latencies)
}

/// CPU time used by the daemon and by this process while one phase ran, as a share of
/// one core (1.0 = one core busy the whole time; this machine's maximum is its core
/// count). Tells whether a phase was limited by CPU or by waiting (fsync).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Cpu {
    daemon: f64,
    bench: f64,
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.0}% / {:.0}%", self.daemon * 100.0, self.bench * 100.0)
    }
}

/// Starts measuring [`Cpu`] for one phase.
struct CpuMeter {
    daemon_pid: u32,
    started: Instant,
    daemon: Option<Duration>,
    bench: Option<Duration>,
}

impl CpuMeter {
    fn start(daemon_pid: u32) -> CpuMeter {
        let daemon = cpu_time(&daemon_pid.to_string());
        CpuMeter { daemon_pid, started: Instant::now(), daemon, bench: cpu_time("self") }
    }

    /// `None` when `/proc` cannot tell (not Linux, or the daemon is gone).
    fn stop(self) -> Option<Cpu> {
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        let daemon = cpu_time(&self.daemon_pid.to_string())?.checked_sub(self.daemon?)?;
        let bench = cpu_time("self")?.checked_sub(self.bench?)?;
        Some(Cpu { daemon: daemon.as_secs_f64() / wall, bench: bench.as_secs_f64() / wall })
    }
}

/// User plus system CPU time of every thread of process `pid` (or `self`) so far.
fn cpu_time(pid: &str) -> Option<Duration> {
    parse_stat_cpu(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `utime + stime` of a `/proc/<pid>/stat` line. They count clock ticks of 1/100 s:
/// `USER_HZ` is 100 on every Linux architecture hive runs on.
fn parse_stat_cpu(stat: &str) -> Option<Duration> {
    // The command name (field 2) may hold spaces; fields after its `)` start at 3.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some(Duration::from_millis((ticks(14)? + ticks(15)?) * 10))
}

// ----- HTTP ---------------------------------------------------------------------------

/// One simulated client: its own connection pool, so its own keep-alive connection(s).
struct Api {
    http: reqwest::Client,
    endpoint: Endpoint,
}

impl Endpoint {
    /// A new client; `timeout` bounds each whole request (none for watches).
    fn api(&self, timeout: Option<Duration>) -> Result<Api> {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .http1_only()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10));
        for cert in
            reqwest::Certificate::from_pem_bundle(&self.ca_pem).context("the daemon's CA is not PEM")?
        {
            builder = builder.add_root_certificate(cert);
        }
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        Ok(Api { http: builder.build().context("building an HTTP client")?, endpoint: self.clone() })
    }
}

impl Api {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.endpoint.url)).bearer_auth(&self.endpoint.token)
    }

    /// POSTs an Agent; the status code and body.
    async fn create(&self, body: Vec<u8>) -> Result<(u16, Bytes)> {
        let resp = self
            .request(reqwest::Method::POST, AGENTS)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await?;
        let code = resp.status().as_u16();
        Ok((code, resp.bytes().await?))
    }

    /// GETs `path` as JSON; fails unless 200.
    async fn get(&self, path: &str) -> Result<Bytes> {
        let resp = self
            .request(reqwest::Method::GET, path)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await?;
        let code = resp.status().as_u16();
        let body = resp.bytes().await?;
        ensure!(code == 200, "GET {path}: HTTP {code}: {}", snippet(&body));
        Ok(body)
    }

    /// The number of Agents and the current revision, from a one-item list.
    async fn list_head(&self) -> Result<(usize, u64)> {
        let body = self.get(&format!("{AGENTS}?limit=1")).await?;
        let list: Value = serde_json::from_slice(&body).context("the list is not JSON")?;
        let list: AgentList = super::client::decode(&list, "AgentList")?;
        list_head(&list).context("the list has no resourceVersion")
    }
}

fn list_head(list: &AgentList) -> Option<(usize, u64)> {
    let remaining = list.metadata.remaining_item_count.and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
    let revision = list.metadata.resource_version.as_deref()?.parse().ok()?;
    Some((list.items.len() + remaining, revision))
}

fn snippet(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(300).collect()
}

/// A valid Agent, as small as the `agent()` fixture of the integration tests but with a
/// local config path; with `sent_ns`, carrying the send time for the watch measurement.
fn agent(name: &str, sent_ns: Option<u128>) -> Vec<u8> {
    let mut metadata = json!({"name": name, "labels": {"app": "bench"}});
    if let Some(ns) = sent_ns {
        metadata["annotations"] = json!({SENT_ANNOTATION: ns.to_string()});
    }
    let object = json!({
        "apiVersion": "hive.dev/v1",
        "kind": "Agent",
        "metadata": metadata,
        "spec": {
            // A local path that does not exist: nothing may ever fetch it over the network.
            "config": {"repo": "/nonexistent/hive-bench/config.git", "rev": "main"},
            "runtime": {"type": "process", "process": {"command": ["./run.sh"]}}
        }
    });
    serde_json::to_vec(&object).expect("a JSON value serializes")
}

/// Wall-clock Unix nanoseconds: the watch measurement compares times taken in two
/// tasks, so it needs a clock both read (the daemon's clock plays no part).
fn wall_ns() -> u128 {
    crate::host::now().timestamp_nanos_opt().map_or(0, |n| u128::try_from(n).unwrap_or(0))
}

// ----- creates --------------------------------------------------------------------------

/// When a create run stops.
#[derive(Clone)]
enum Until {
    /// Each client creates until this long has passed.
    Elapsed(Duration),
    /// Clients take numbers from `next` until `total` are taken.
    Count { next: Arc<AtomicUsize>, total: usize },
}

/// What a create run did.
struct CreateRun {
    clients: usize,
    created: usize,
    failed: usize,
    first_failure: Option<String>,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl CreateRun {
    fn rate(&self) -> f64 {
        self.created as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn row(&self, measurement: String, aim: String) -> Row {
        let mut result = format!(
            "{}/s ({} in {:.1}s)",
            fmt_count(self.rate() as u64),
            fmt_count(self.created as u64),
            self.elapsed.as_secs_f64()
        );
        if self.failed > 0 {
            result +=
                &format!("; {} failed, first: {}", self.failed, self.first_failure.as_deref().unwrap_or("?"));
        }
        Row::new(measurement, result, Some(self.latencies.as_slice()), aim)
    }
}

/// `clients` tasks, each with its own client, POST Agents until `until`; only 201s
/// count as created. With `warm_up`, each first creates one Agent outside the clock, so
/// connection setup is not measured.
async fn create_with(
    endpoint: &Endpoint,
    clients: usize,
    until: Until,
    prefix: &str,
    warm_up: bool,
) -> Result<CreateRun> {
    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut tasks = JoinSet::new();
    for client in 0..clients {
        let api = endpoint.api(Some(REQUEST_TIMEOUT))?;
        let (barrier, until, prefix) = (barrier.clone(), until.clone(), prefix.to_string());
        tasks.spawn(async move {
            let warmed = if warm_up { warm(&api, &format!("{prefix}-w{client}")).await } else { Ok(()) };
            barrier.wait().await;
            warmed?;
            let started = Instant::now();
            let mut run = CreateRun {
                clients: 1,
                created: 0,
                failed: 0,
                first_failure: None,
                elapsed: Duration::ZERO,
                latencies: Vec::new(),
            };
            for seq in 0.. {
                let name = match &until {
                    Until::Elapsed(d) if started.elapsed() >= *d => break,
                    Until::Elapsed(_) => format!("{prefix}-{client}-{seq}"),
                    Until::Count { next, total } => match next.fetch_add(1, Ordering::Relaxed) {
                        i if i >= *total => break,
                        i => format!("{prefix}-{i}"),
                    },
                };
                let sent = Instant::now();
                match api.create(agent(&name, None)).await {
                    Ok((201, _)) => {
                        run.latencies.push(sent.elapsed());
                        run.created += 1;
                    }
                    failure => {
                        run.failed += 1;
                        run.first_failure.get_or_insert_with(|| match failure {
                            Ok((code, body)) => format!("HTTP {code}: {}", snippet(&body)),
                            Err(e) => format!("{e:#}"),
                        });
                    }
                }
            }
            anyhow::Ok(run)
        });
    }
    barrier.wait().await;
    let started = Instant::now();
    let mut total = CreateRun {
        clients,
        created: 0,
        failed: 0,
        first_failure: None,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    while let Some(joined) = tasks.join_next().await {
        let run = joined.context("a create client panicked")??;
        total.created += run.created;
        total.failed += run.failed;
        total.first_failure = total.first_failure.or(run.first_failure);
        total.latencies.extend(run.latencies);
    }
    total.elapsed = started.elapsed();
    ensure!(
        total.created > 0 || total.failed == 0,
        "every create failed; first: {}",
        total.first_failure.unwrap_or_default()
    );
    Ok(total)
}

async fn warm(api: &Api, name: &str) -> Result<()> {
    match api.create(agent(name, None)).await.context("warm-up create")? {
        (201, _) => Ok(()),
        (code, body) => bail!("warm-up create of {name}: HTTP {code}: {}", snippet(&body)),
    }
}

// ----- watch --------------------------------------------------------------------------

/// What the watch phase saw.
struct WatchRun {
    watchers: usize,
    writes: usize,
    deliveries: Vec<Delivery>,
    /// Watchers whose stream ended early, with the first reason.
    broken: usize,
    first_break: Option<String>,
    writer: CreateRun,
    /// While writing and until every watcher had everything.
    cpu: Option<Cpu>,
}

impl WatchRun {
    fn rows(&self) -> Vec<Row> {
        let expected = self.writes * self.watchers;
        let mut result = format!(
            "{} of {} deliveries",
            fmt_count(self.deliveries.len() as u64),
            fmt_count(expected as u64)
        );
        if self.deliveries.len() < expected {
            result += &format!(" ({} missing)", fmt_count((expected - self.deliveries.len()) as u64));
        }
        if self.broken > 0 {
            result += &format!(
                "; {} streams broke, first: {}",
                self.broken,
                self.first_break.as_deref().unwrap_or("?")
            );
        }
        let latencies: Vec<Duration> = self.deliveries.iter().map(Delivery::latency).collect();
        let p99 = summarize(&latencies).map(|s| s.p99);
        vec![
            Row::new(
                format!("watch delivery, {} watchers, send → receive", self.watchers),
                result,
                Some(latencies.as_slice()),
                aim_text(p99.is_some_and(|p| p < Duration::from_millis(20)), "p99 < 20 ms"),
            )
            .with_cpu(self.cpu),
            Row::new(
                "watch fan-out, first → each watcher",
                "after the same write reached its first watcher",
                Some(fan_out(&self.deliveries).as_slice()),
                "",
            ),
            self.writer.row("the writer's creates meanwhile".to_string(), String::new()),
        ]
    }
}

/// Opens the watchers at the current revision, writes at a steady rate from one client,
/// and collects every watcher's receive − send times.
async fn watch_phase(endpoint: &Endpoint, daemon_pid: u32, plan: &Plan) -> Result<WatchRun> {
    let writer = endpoint.api(Some(REQUEST_TIMEOUT))?;
    let (_, revision) = writer.list_head().await?;
    let writes = plan.watch_writes();
    let path = format!("{AGENTS}?watch=true&resourceVersion={revision}");

    // One client for all streams: its pool opens a new connection for each, since a
    // streaming HTTP/1.1 response holds its connection.
    let watch_client = Arc::new(endpoint.api(None)?);
    let opening = Arc::new(Semaphore::new(OPENING_AT_ONCE));
    let mut opened = JoinSet::new();
    for _ in 0..plan.watchers {
        let (client, opening, path) = (watch_client.clone(), opening.clone(), path.clone());
        opened.spawn(async move {
            let _permit = opening.acquire().await?;
            let resp = client.request(reqwest::Method::GET, &path).send().await.context("opening a watch")?;
            let code = resp.status().as_u16();
            ensure!(
                code == 200,
                "opening a watch: HTTP {code}: {}",
                snippet(&resp.bytes().await.unwrap_or_default())
            );
            anyhow::Ok(resp)
        });
    }
    let mut streams = Vec::with_capacity(plan.watchers);
    while let Some(joined) = opened.join_next().await {
        streams.push(joined.context("opening a watch panicked")??);
    }

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut readers = JoinSet::new();
    for resp in streams {
        readers.spawn(read_watch(resp, writes, stopped.clone()));
    }

    let mut run = CreateRun {
        clients: 1,
        created: 0,
        failed: 0,
        first_failure: None,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / plan.watch_rate as f64));
    let meter = CpuMeter::start(daemon_pid);
    let started = Instant::now();
    for i in 0..writes {
        ticker.tick().await;
        let sent = Instant::now();
        match writer.create(agent(&format!("watch-{i}"), Some(wall_ns()))).await? {
            (201, _) => {
                run.latencies.push(sent.elapsed());
                run.created += 1;
            }
            (code, body) => bail!("watch-phase create: HTTP {code}: {}", snippet(&body)),
        }
    }
    run.elapsed = started.elapsed();

    let mut watch = WatchRun {
        cpu: None,
        watchers: plan.watchers,
        writes,
        deliveries: Vec::new(),
        broken: 0,
        first_break: None,
        writer: run,
    };
    let mut collect = |seen: WatcherSaw| {
        watch.deliveries.extend(seen.deliveries);
        if let Some(why) = seen.broke {
            watch.broken += 1;
            watch.first_break.get_or_insert(why);
        }
    };
    let drained = tokio::time::timeout(DRAIN_GRACE, async {
        while let Some(joined) = readers.join_next().await {
            collect(joined.context("a watcher panicked")?);
        }
        anyhow::Ok(())
    })
    .await;
    if drained.is_err() {
        let _ = stop.send(true);
        while let Some(joined) = readers.join_next().await {
            collect(joined.context("a watcher panicked")?);
        }
    } else {
        drained??;
    }
    watch.cpu = meter.stop();
    Ok(watch)
}

/// One write seen by one watcher: when it was sent and when it arrived (Unix ns).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Delivery {
    sent_ns: u128,
    received_ns: u128,
}

impl Delivery {
    fn latency(&self) -> Duration {
        Duration::from_nanos(self.received_ns.saturating_sub(self.sent_ns) as u64)
    }
}

/// For every delivery, how long after the first delivery of the same write it came:
/// the fan-out alone, without the durable commit every delivery waits for.
fn fan_out(deliveries: &[Delivery]) -> Vec<Duration> {
    let mut first: std::collections::HashMap<u128, u128> = std::collections::HashMap::new();
    for d in deliveries {
        let earliest = first.entry(d.sent_ns).or_insert(d.received_ns);
        *earliest = (*earliest).min(d.received_ns);
    }
    deliveries
        .iter()
        .map(|d| Duration::from_nanos(d.received_ns.saturating_sub(first[&d.sent_ns]) as u64))
        .collect()
}

/// What one watcher received.
struct WatcherSaw {
    deliveries: Vec<Delivery>,
    broke: Option<String>,
}

/// Reads one stream until it has seen `expected` bench writes, it ends, or `stop`.
async fn read_watch(
    mut resp: reqwest::Response,
    expected: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> WatcherSaw {
    let mut saw = WatcherSaw { deliveries: Vec::with_capacity(expected), broke: None };
    let mut buffer: Vec<u8> = Vec::new();
    while saw.deliveries.len() < expected && saw.broke.is_none() {
        let chunk = tokio::select! {
            chunk = resp.chunk() => chunk,
            _ = stop.changed() => break,
        };
        // One receive time per chunk: parsing is the client's cost, not delivery.
        let received = wall_ns();
        match chunk {
            Ok(Some(bytes)) => buffer.extend_from_slice(&bytes),
            Ok(None) => saw.broke = Some("the server closed the stream".into()),
            Err(e) => saw.broke = Some(format!("{e}")),
        }
        let mut start = 0;
        while let Some(end) = buffer[start..].iter().position(|b| *b == b'\n') {
            match classify(&buffer[start..start + end]) {
                Line::Sent(sent_ns) => saw.deliveries.push(Delivery { sent_ns, received_ns: received }),
                Line::Error(why) => saw.broke = Some(why),
                Line::Other => {}
            }
            start += end + 1;
        }
        buffer.drain(..start);
    }
    saw
}

/// What a watch line is to the benchmark.
#[derive(Debug, PartialEq)]
enum Line {
    /// A bench write, sent at this Unix nanosecond.
    Sent(u128),
    /// An `ERROR` event (the stream is over), or a line that is not an event.
    Error(String),
    /// Anything else: bookmarks, objects that are not bench writes.
    Other,
}

fn classify(line: &[u8]) -> Line {
    #[derive(Deserialize)]
    struct Event {
        #[serde(rename = "type")]
        type_: String,
        object: Object,
    }
    #[derive(Deserialize)]
    struct Object {
        #[serde(default)]
        metadata: Metadata,
        #[serde(default)]
        message: String,
    }
    #[derive(Deserialize, Default)]
    struct Metadata {
        #[serde(default)]
        annotations: std::collections::HashMap<String, String>,
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Line::Other;
    }
    match serde_json::from_slice::<Event>(line) {
        Err(e) => Line::Error(format!("malformed event ({e}): {}", snippet(line))),
        Ok(event) if event.type_ == "ERROR" => Line::Error(format!("ERROR event: {}", event.object.message)),
        Ok(event) => match event.object.metadata.annotations.get(SENT_ANNOTATION).map(|v| v.parse()) {
            Some(Ok(ns)) => Line::Sent(ns),
            _ => Line::Other,
        },
    }
}

// ----- list -----------------------------------------------------------------------------

/// Times `runs` full lists and reports the median, the size and the item count.
async fn list_phase(endpoint: &Endpoint, runs: usize) -> Result<Row> {
    #[derive(Deserialize)]
    struct Items {
        items: Vec<serde::de::IgnoredAny>,
    }
    let api = endpoint.api(Some(REQUEST_TIMEOUT))?;
    let mut times = Vec::with_capacity(runs);
    let mut size = 0;
    let mut items = 0;
    for run in 0..runs {
        let started = Instant::now();
        let body = api.get(AGENTS).await?;
        times.push(started.elapsed());
        if run == 0 {
            size = body.len();
            items =
                serde_json::from_slice::<Items>(&body).context("the list is not an AgentList")?.items.len();
        }
    }
    let median = summarize(&times).map(|s| s.p50).unwrap_or_default();
    let result = format!(
        "median {} for {} items, {:.1} MiB",
        fmt_duration(median),
        fmt_count(items as u64),
        size as f64 / (1024.0 * 1024.0)
    );
    Ok(Row::new(format!("full list, JSON, {runs} runs"), result, Some(times.as_slice()), ""))
}

// ----- statistics and output ------------------------------------------------------------

/// The value at percentile `p` (0 < p ≤ 100) of ascending `sorted`, by nearest rank.
fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50, p99 and max of some latencies.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Summary {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

fn summarize(latencies: &[Duration]) -> Option<Summary> {
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    Some(Summary { p50: percentile(&sorted, 50.0)?, p99: percentile(&sorted, 99.0)?, max: *sorted.last()? })
}

/// `0.42 ms`, `12.3 ms`, `1.25 s`.
fn fmt_duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

/// `12,345`.
fn fmt_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One line of the results table.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    measurement: String,
    result: String,
    latency: Option<Summary>,
    cpu: Option<Cpu>,
    aim: String,
}

impl Row {
    fn new(
        measurement: impl Into<String>,
        result: impl Into<String>,
        latencies: Option<&[Duration]>,
        aim: impl Into<String>,
    ) -> Row {
        Row {
            measurement: measurement.into(),
            result: result.into(),
            latency: latencies.and_then(summarize),
            cpu: None,
            aim: aim.into(),
        }
    }

    fn with_cpu(mut self, cpu: Option<Cpu>) -> Row {
        self.cpu = cpu;
        self
    }

    fn cells(&self) -> [String; COLUMNS] {
        let lat = |f: fn(&Summary) -> Duration| {
            self.latency.as_ref().map(|s| fmt_duration(f(s))).unwrap_or_default()
        };
        [
            self.measurement.clone(),
            self.result.clone(),
            lat(|s| s.p50),
            lat(|s| s.p99),
            lat(|s| s.max),
            self.cpu.map(|c| c.to_string()).unwrap_or_default(),
            self.aim.clone(),
        ]
    }
}

const COLUMNS: usize = 7;
const HEADER: [&str; COLUMNS] = ["measurement", "result", "p50", "p99", "max", "CPU daemon/bench", "aim"];

/// The table for a terminal: columns padded to their widest cell.
fn render_text(rows: &[Row]) -> String {
    let cells: Vec<[String; COLUMNS]> =
        std::iter::once(HEADER.map(String::from)).chain(rows.iter().map(Row::cells)).collect();
    let mut widths = [0; COLUMNS];
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &cells {
        let padded: Vec<String> = row.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out += padded.join("  ").trim_end();
        out.push('\n');
    }
    out
}

/// The table as Markdown.
fn render_markdown_table(rows: &[Row]) -> String {
    let mut out = format!("| {} |\n|{}\n", HEADER.join(" | "), "---|".repeat(HEADER.len()));
    for row in rows {
        out += &format!("| {} |\n", row.cells().map(|c| c.replace('|', "\\|")).join(" | "));
    }
    out
}

/// A section for docs/benchmarks.md: when, where, with which flags, and the table.
fn render_markdown(report: &Report, plan: &Plan) -> String {
    let m = &report.machine_before;
    format!(
        "### Run of {date}\n\n\
         - machine: {cpus} × {cpu}, {mem}, Linux {kernel}\n\
         - load average (1/5/15 min): {load_before} before, {load_after} after\n\
         - `hive bench {flags}`\n\n\
         {table}",
        date = m.date,
        cpus = m.cpus,
        cpu = m.cpu,
        mem = m.memory,
        kernel = m.kernel,
        load_before = m.load,
        load_after = report.load_after,
        flags = plan.flags(),
        table = render_markdown_table(&report.rows),
    )
}

/// The machine a run is on, for the record.
struct Machine {
    date: String,
    cpus: usize,
    cpu: String,
    memory: String,
    kernel: String,
    load: String,
}

impl Machine {
    fn read() -> Machine {
        let read = |path| std::fs::read_to_string(path).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, v)| v.trim().to_string()));
        let memory = status_kib(&read("/proc/meminfo"), "MemTotal")
            .map(|kib| format!("{:.1} GiB memory", kib as f64 / 1024.0 / 1024.0));
        Machine {
            date: crate::host::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu: cpu.unwrap_or_else(|| "unknown CPU".into()),
            memory: memory.unwrap_or_else(|| "unknown memory".into()),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            load: Machine::load_average(),
        }
    }

    /// The first three fields of `/proc/loadavg`.
    fn load_average() -> String {
        let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let sorted: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&sorted, 50.0), Some(ms(50)));
        assert_eq!(percentile(&sorted, 99.0), Some(ms(99)));
        assert_eq!(percentile(&sorted, 100.0), Some(ms(100)));
        assert_eq!(percentile(&[ms(7)], 99.0), Some(ms(7)));
        assert_eq!(percentile(&[ms(1), ms(2)], 50.0), Some(ms(1)));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn summaries_sort_first() {
        let s = summarize(&[ms(3), ms(1), ms(2)]).unwrap();
        assert_eq!(s, Summary { p50: ms(2), p99: ms(3), max: ms(3) });
        assert_eq!(summarize(&[]), None);
    }

    #[test]
    fn numbers_are_formatted_for_people() {
        assert_eq!(fmt_count(0), "0");
        assert_eq!(fmt_count(999), "999");
        assert_eq!(fmt_count(1000), "1,000");
        assert_eq!(fmt_count(1_234_567), "1,234,567");
        assert_eq!(fmt_duration(Duration::from_micros(420)), "0.42 ms");
        assert_eq!(fmt_duration(Duration::from_micros(12_345)), "12.3 ms");
        assert_eq!(fmt_duration(ms(1250)), "1.25 s");
    }

    #[test]
    fn watch_lines_are_classified() {
        let sent = br#"{"type":"ADDED","object":{"kind":"Agent","metadata":{"name":"w","annotations":{"bench.hive.dev/sent-ns":"42"}},"spec":{}}}"#;
        assert_eq!(classify(sent), Line::Sent(42));
        let other = br#"{"type":"ADDED","object":{"kind":"Agent","metadata":{"name":"x"}}}"#;
        assert_eq!(classify(other), Line::Other);
        let bookmark = br#"{"type":"BOOKMARK","object":{"kind":"Agent","metadata":{"resourceVersion":"9"}}}"#;
        assert_eq!(classify(bookmark), Line::Other);
        assert_eq!(classify(b"  "), Line::Other);
        let error = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}"#;
        assert_eq!(classify(error), Line::Error("ERROR event: too old".into()));
        assert!(matches!(classify(b"{nope"), Line::Error(_)));
    }

    #[test]
    fn fan_out_counts_from_the_first_watcher_of_each_write() {
        let d = |sent_ns, received_ns| Delivery { sent_ns, received_ns };
        let deliveries = [d(100, 5_000_000), d(100, 3_000_000), d(200, 9_000_000), d(200, 9_000_000)];
        assert_eq!(fan_out(&deliveries), vec![ms(2), ms(0), ms(0), ms(0)]);
        assert_eq!(deliveries[0].latency(), Duration::from_nanos(4_999_900));
    }

    #[test]
    fn proc_files_are_parsed() {
        let status = "Name:\thive\nVmHWM:\t  20480 kB\nVmRSS:\t  10240 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(10240));
        assert_eq!(status_kib(status, "VmHWM"), Some(20480));
        assert_eq!(status_kib(status, "VmSwap"), None);
        let memory = Memory { rss_kib: 10240, hwm_kib: 20480 };
        assert_eq!(memory.to_string(), "VmRSS 10 MiB (peak 20 MiB)");
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_open_files(limits), Some(1024));
        assert_eq!(parse_open_files("Max open files  unlimited  unlimited  files"), Some(u64::MAX));
        let stat = "4242 (hive serve) S 1 4242 4242 0 -1 4194560 900 0 0 0 150 25 0 0 20 0 9 0 77 0 0";
        assert_eq!(parse_stat_cpu(stat), Some(Duration::from_millis(1750)));
        assert_eq!(Cpu { daemon: 1.354, bench: 0.5 }.to_string(), "135% / 50%");
    }

    #[test]
    fn list_heads_count_the_remaining_items() {
        let list = json!({"metadata": {"resourceVersion": "17", "remainingItemCount": 4}, "items": [{}]});
        let head = |list: Value| list_head(&crate::cli::client::decode(&list, "AgentList").expect("a list"));
        assert_eq!(head(list), Some((5, 17)));
        assert_eq!(head(json!({"metadata": {"resourceVersion": "3"}, "items": []})), Some((0, 3)));
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn quick_shortens_what_is_not_given() {
        let plan = Plan::from_args(&Cli::parse_from(["bench", "--quick", "--watchers", "7"]).args).unwrap();
        assert_eq!(plan.duration, Duration::from_secs(1));
        assert_eq!((plan.watchers, plan.objects, plan.raw_commits), (7, 10_000, 50));
        let plan = Plan::from_args(&Cli::parse_from(["bench"]).args).unwrap();
        assert_eq!((plan.clients.as_slice(), plan.watchers, plan.objects), (&[1, 16, 64][..], 1000, 100_000));
        assert_eq!(plan.watch_writes(), 250);
        assert!(Plan::from_args(&Cli::parse_from(["bench", "--clients", "0"]).args).is_err());
    }

    #[test]
    fn tables_render_for_terminals_and_markdown() {
        let rows = vec![
            Row::new("creates", "10/s", Some(&[ms(1), ms(3)][..]), "≥ 5/s: met")
                .with_cpu(Some(Cpu { daemon: 1.0, bench: 0.25 })),
            Row::new("memory", "VmRSS 1 MiB", None, ""),
        ];
        let text = render_text(&rows);
        assert_eq!(
            text,
            "measurement  result       p50      p99      max      CPU daemon/bench  aim\n\
             creates      10/s         1.00 ms  3.00 ms  3.00 ms  100% / 25%        ≥ 5/s: met\n\
             memory       VmRSS 1 MiB\n"
        );
        let markdown = render_markdown_table(&rows);
        assert_eq!(
            markdown,
            "| measurement | result | p50 | p99 | max | CPU daemon/bench | aim |\n\
             |---|---|---|---|---|---|---|\n\
             | creates | 10/s | 1.00 ms | 3.00 ms | 3.00 ms | 100% / 25% | ≥ 5/s: met |\n\
             | memory | VmRSS 1 MiB |  |  |  |  |  |\n"
        );
    }
}
