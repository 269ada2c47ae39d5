//! `hive bench`: starts a fresh daemon as a child process on 127.0.0.1 in a temporary
//! directory and measures it from outside, over HTTPS, as clients see it: durable
//! creates per second at several concurrencies, one raw redb commit next to them, watch
//! delivery latency to many watchers while writing, power Jobs of a real agent, an agent
//! on a fleet node against a local one, a large list from the cache, and the daemon's
//! memory; `--phases` picks some of these. Results go to stdout (with `--markdown`, also
//! as a section for `docs/benchmarks.md`); one progress line per phase goes to stderr.
//!
//! The clients here talk HTTP directly instead of through [`super::client::Client`]:
//! they need one connection pool per simulated client, the status code without parsing
//! every body, and the raw bytes of a list. It is still only the public REST API.

mod api;
mod cold_start;
mod creates;
mod daemon;
mod list;
mod machine;
mod meters;
mod phase;
mod placement;
mod power;
mod report;
mod units;
mod updates;
mod watch;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context as _, Result};

use self::api::REQUEST_TIMEOUT;
use self::daemon::{open_files_limit, Daemon, WorkDir};
use self::machine::Machine;
use self::meters::fdatasync_latencies;
use self::phase::Phase;
use self::report::{render_markdown, render_text, Row};
use self::units::fmt_count;
use self::watch::{watch_phase, WatchLoad, WriterMode, WriterTransport};
use super::Context;

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

    /// Agents the update phase creates and then replaces, over and over, at each
    /// --clients level for --duration [default: 1000; 100 with --quick].
    #[arg(long, value_name = "N")]
    pub update_objects: Option<usize>,

    /// Raw redb commits (one row each, durable), write-ahead log appends (1 KiB each,
    /// synced) and 4 KiB fdatasyncs to time, this many of each [default: 200; 50 with --quick].
    #[arg(long, value_name = "N")]
    pub raw_commits: Option<usize>,

    /// Watch loads to measure one after the other, each WATCHERSxRATE: that many watch
    /// streams (one connection each) while the writer creates RATE Agents a second
    /// [default: 1000x10,100x1000, the two loads of issue 13; 200x10,20x200 with --quick].
    /// Needs about WATCHERS + min(--watch-in-flight, writes) open files in this process
    /// and in the daemon (`ulimit -n`).
    #[arg(long, value_name = "WxR,...", value_delimiter = ',', value_parser = WatchLoad::parse,
          conflicts_with_all = ["watchers", "watch_rate"])]
    pub watch_loads: Vec<WatchLoad>,

    /// Shorthand for one watch load: this many watchers [default: 1000; 200 with
    /// --quick] at --watch-rate.
    #[arg(long, value_name = "N")]
    pub watchers: Option<usize>,

    /// Shorthand for one watch load: this many writes a second [default: 50] to
    /// --watchers watchers.
    #[arg(long, value_name = "N")]
    pub watch_rate: Option<u32>,

    /// How the watch phase's writer paces its creates. `open`: on a fixed schedule,
    /// each create in its own task without waiting for earlier answers (as independent
    /// clients write; a daemon that falls behind keeps getting the load). `closed`: one
    /// create at a time, the next tick waiting for the previous answer (the writer
    /// before issue 13; a slow daemon slows its own load down).
    #[arg(long, value_name = "MODE", value_enum, default_value_t = WriterMode::Open)]
    pub watch_writer: WriterMode,

    /// Most open-loop creates in flight at once (streams of the one HTTP/2 connection, or
    /// with `--watch-writer-transport http1` one connection each). When it is full a
    /// tick waits, and the writer's row says how many sends were late.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub watch_in_flight: usize,

    /// Open the watch streams over HTTP/2, up to 200 on one connection, instead of one
    /// HTTP/1.1 connection each (what a browser or kubectl does with many watches).
    #[arg(long)]
    pub watch_http2: bool,

    /// Open the watch streams over HTTP/2 on this many connections, spread evenly (at most
    /// 200 on one: more connections are opened if the load needs them), as informers in
    /// several processes share an API server; bench/etcd spreads its watches over 16 gRPC
    /// connections by default. Implies `--watch-http2`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub watch_connections: Option<u16>,

    /// The connections the watch phase's writer sends its creates over. `http2`: one
    /// HTTP/2 connection, each create a stream on it, as etcd's generator (bench/etcd)
    /// sends its puts over one gRPC connection and as kubectl talks to an API server.
    /// `http1`: one HTTP/1.1 connection per create in flight; the open-loop writer then
    /// opens a new connection, with its TLS handshake, whenever more creates are in
    /// flight than before, so a stall of the daemon costs both sides handshakes on top
    /// of the load (the writer before 2026-12-04).
    #[arg(long, value_name = "PROTOCOL", value_enum, default_value_t = WriterTransport::Http2)]
    pub watch_writer_transport: WriterTransport,

    /// The same as `--watch-writer-transport http2`, the default now (kept so that the
    /// commands of older runs in docs/benchmarks.md still work).
    #[arg(long, hide = true, conflicts_with = "watch_writer_transport")]
    pub watch_writer_http2: bool,

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

    /// Full lists to time over each of HTTP/1.1 and HTTP/2; the median of each is reported
    /// [default: 5; 3 with --quick].
    #[arg(long, value_name = "N")]
    pub list_runs: Option<usize>,

    /// Parent of the temporary directory holding the daemon's state (default: the
    /// system's temporary directory). Its disk is the one whose fsync is measured.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Stop/start cycles of a real agent process to time end to end [default: 10; 3 with --quick].
    #[arg(long, value_name = "N")]
    pub power_cycles: Option<usize>,

    /// The placement phase's spawns, stops and starts of each of its two agents (one on
    /// the daemon's host, one on a `process` fleet node) [default: 10; 3 with --quick].
    #[arg(long, value_name = "N")]
    pub placement_cycles: Option<usize>,

    /// How long the placement phase follows each agent's log (`logs -f`), timing every
    /// line from the agent's write to the client [default: 10s; 3s with --quick].
    #[arg(long, value_name = "DURATION", value_parser = super::duration::parse)]
    pub log_duration: Option<Duration>,

    /// The phases to run, in this order whatever order they are given in [default: all].
    /// `cold-start` needs `list`; every phase but `raw` starts the daemon.
    #[arg(long, value_name = "PHASE,...", value_delimiter = ',', value_enum)]
    pub phases: Vec<Phase>,

    /// After the fill and the lists: graceful restarts (SIGTERM, wait for the exit, start
    /// again on the same state) to time the cold start, spawn → a full list answering
    /// with every object, and to read the memory after each [default: 3; 1 with --quick;
    /// 0 skips the phase].
    #[arg(long, value_name = "N")]
    pub restarts: Option<usize>,

    /// A short smoke run: 1s levels, 50 raw commits, watch loads 200x10 and 20x200 for
    /// 2s, 10000 objects, 3 power cycles, 1 restart.
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
    update_objects: usize,
    raw_commits: usize,
    watch_loads: Vec<WatchLoad>,
    watch_writer: WriterMode,
    watch_in_flight: usize,
    watch_http2: bool,
    /// The connections the watch streams are spread over (`None`: one per 200).
    watch_connections: Option<usize>,
    watch_writer_transport: WriterTransport,
    watch_duration: Duration,
    objects: usize,
    fill_clients: usize,
    list_runs: usize,
    power_cycles: usize,
    placement_cycles: usize,
    log_duration: Duration,
    restarts: usize,
    /// The phases to run, in run order.
    phases: Vec<Phase>,
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
            update_objects: pick(args.update_objects, 1000, 100),
            raw_commits: pick(args.raw_commits, 200, 50),
            watch_loads: if args.watchers.is_some() || args.watch_rate.is_some() {
                let (watchers, rate) = (pick(args.watchers, 1000, 200), args.watch_rate.unwrap_or(50));
                vec![WatchLoad::new(watchers, rate).map_err(|e| anyhow!("--watchers/--watch-rate: {e}"))?]
            } else if args.watch_loads.is_empty() {
                let (first, second) = if quick { ((200, 10), (20, 200)) } else { ((1000, 10), (100, 1000)) };
                [first, second].map(|(watchers, rate)| WatchLoad { watchers, rate }).to_vec()
            } else {
                args.watch_loads.clone()
            },
            watch_writer: args.watch_writer,
            watch_in_flight: args.watch_in_flight,
            watch_http2: args.watch_http2 || args.watch_connections.is_some(),
            watch_connections: args.watch_connections.map(usize::from),
            watch_writer_transport: if args.watch_writer_http2 {
                WriterTransport::Http2
            } else {
                args.watch_writer_transport
            },
            watch_duration: args.watch_duration.unwrap_or(Duration::from_secs(if quick { 2 } else { 5 })),
            objects: pick(args.objects, 100_000, 10_000),
            fill_clients: args.fill_clients,
            list_runs: pick(args.list_runs, 5, 3),
            power_cycles: pick(args.power_cycles, 10, 3),
            placement_cycles: pick(args.placement_cycles, 10, 3),
            log_duration: args.log_duration.unwrap_or(Duration::from_secs(if quick { 3 } else { 10 })),
            restarts: pick(args.restarts, 3, 1),
            phases: phase::selected(&args.phases),
            serve_args: args.serve_arg.clone(),
        };
        ensure!(!plan.clients.is_empty(), "--clients needs at least one level");
        for n in plan.clients.iter().chain([&plan.fill_clients]) {
            ensure!(
                (1..=MAX_CLIENTS).contains(n),
                "client counts must be between 1 and {MAX_CLIENTS}, not {n}"
            );
        }
        for (flag, d) in [
            ("--duration", plan.duration),
            ("--watch-duration", plan.watch_duration),
            ("--log-duration", plan.log_duration),
        ] {
            ensure!(!d.is_zero() && d <= MAX_PHASE, "{flag} must be more than 0 and at most 10m");
        }
        ensure!(
            (1..=1_000_000).contains(&plan.update_objects),
            "--update-objects must be between 1 and 1000000"
        );
        ensure!((1..=100_000).contains(&plan.raw_commits), "--raw-commits must be between 1 and 100000");
        ensure!(
            (1..=10_000).contains(&plan.watch_in_flight),
            "--watch-in-flight must be between 1 and 10000"
        );
        ensure!((1..=10_000_000).contains(&plan.objects), "--objects must be between 1 and 10000000");
        ensure!((1..=100).contains(&plan.list_runs), "--list-runs must be between 1 and 100");
        ensure!((1..=1000).contains(&plan.power_cycles), "--power-cycles must be between 1 and 1000");
        ensure!((1..=1000).contains(&plan.placement_cycles), "--placement-cycles must be between 1 and 1000");
        ensure!(plan.restarts <= 20, "--restarts must be at most 20");
        ensure!(
            !plan.runs(Phase::ColdStart) || plan.restarts == 0 || plan.runs(Phase::List),
            "--phases cold-start needs list too: the restarts are timed to a full list of the filled store"
        );
        Ok(plan)
    }

    fn runs(&self, phase: Phase) -> bool {
        self.phases.contains(&phase)
    }

    /// Open files this process needs at most: the watchers of the largest watch load
    /// plus the open-loop writer's connections, or the fill's clients, plus spare.
    fn open_files_needed(&self) -> usize {
        let watch = self.watch_loads.iter().map(|load| {
            let writer = match (self.watch_writer, self.watch_writer_transport) {
                (WriterMode::Open, WriterTransport::Http1) => {
                    self.watch_in_flight.min(load.writes(self.watch_duration))
                }
                _ => 1,
            };
            load.watchers + writer
        });
        let watch = watch.filter(|_| self.runs(Phase::Watch));
        let fill = Some(self.fill_clients).filter(|_| self.runs(Phase::List));
        let creates =
            self.clients.iter().copied().filter(|_| self.runs(Phase::Creates) || self.runs(Phase::Updates));
        watch.chain(fill).chain(creates).max().unwrap_or(0) + 256
    }

    /// The flags that reproduce this plan.
    fn flags(&self) -> String {
        let clients: Vec<String> = self.clients.iter().map(ToString::to_string).collect();
        let loads: Vec<String> = self.watch_loads.iter().map(ToString::to_string).collect();
        let phases = if self.phases == phase::ALL {
            String::new()
        } else {
            let names: Vec<&str> = self.phases.iter().map(|p| p.name()).collect();
            format!(" --phases {}", names.join(","))
        };
        format!(
            "--duration {}s --clients {} --update-objects {} --raw-commits {} --watch-loads {} --watch-writer {} \
             --watch-writer-transport {} --watch-in-flight {}{} --watch-duration {}s --objects {} --fill-clients {} --list-runs {} \
             --power-cycles {} --placement-cycles {} --log-duration {}s --restarts {}",
            self.duration.as_secs_f64(),
            clients.join(","),
            self.update_objects,
            self.raw_commits,
            loads.join(","),
            self.watch_writer.name(),
            self.watch_writer_transport.name(),
            self.watch_in_flight,
            match (self.watch_http2, self.watch_connections) {
                (_, Some(n)) => format!(" --watch-connections {n}"),
                (true, None) => " --watch-http2".to_owned(),
                (false, None) => String::new(),
            },
            self.watch_duration.as_secs_f64(),
            self.objects,
            self.fill_clients,
            self.list_runs,
            self.power_cycles,
            self.placement_cycles,
            self.log_duration.as_secs_f64(),
            self.restarts
        ) + &phases
            + &self.serve_args.iter().map(|a| format!(" --serve-arg={a}")).collect::<String>()
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
        print!(
            "{}",
            render_markdown(&report.machine_before, &report.load_after, &plan.flags(), &report.rows)
        );
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
    let needed = plan.open_files_needed();
    let limit = open_files_limit()?;
    ensure!(
        limit >= needed as u64,
        "this plan needs about {needed} open files (watchers, the writer's connections), but this \
         process may open {limit}: raise the limit (`ulimit -n {needed}`, up to `ulimit -Hn`) or \
         pass smaller --watch-loads or --watch-in-flight"
    );
    let mut rows = Vec::new();

    // Measured first, on an idle machine, but shown after the creates they explain.
    let raw = if plan.runs(Phase::Raw) { raw_phase(plan, work).await? } else { Vec::new() };
    if plan.phases == [Phase::Raw] {
        return Ok(Report { rows: raw, machine_before, load_after: Machine::load_average() });
    }

    progress(format_args!("starting the daemon"));
    let daemon = Daemon::start(work.path(), &plan.serve_args, 0).await?;
    let idle = daemon.memory()?;

    if plan.runs(Phase::Creates) {
        rows.extend(creates::levels(&daemon, &plan.clients, plan.duration).await?);
    }
    rows.extend(raw);

    if plan.runs(Phase::Updates) {
        let state = work.path().join("state");
        rows.extend(
            updates::phase(&daemon, &state, plan.update_objects, &plan.clients, plan.duration).await?,
        );
    }

    if plan.runs(Phase::Watch) {
        for (index, load) in plan.watch_loads.iter().enumerate() {
            progress(format_args!(
                "watch: {} watchers, {} writes at {}/s, {}-loop",
                load.watchers,
                load.writes(plan.watch_duration),
                load.rate,
                plan.watch_writer.name()
            ));
            let watch = watch_phase(&daemon.endpoint, daemon.pid, plan, index).await?;
            rows.extend(watch.rows());
        }
    }

    if plan.runs(Phase::Power) {
        progress(format_args!("power: {} stop/start cycles of a real agent process", plan.power_cycles));
        let api = daemon.endpoint.api(Some(REQUEST_TIMEOUT))?;
        rows.extend(power::phase(&api, work.path(), plan.power_cycles).await?);
    }

    if plan.runs(Phase::Placement) {
        progress(format_args!(
            "placement: a process node; {} spawns, stops and starts of a local and a placed agent, \
             then their logs followed for {:?}",
            plan.placement_cycles, plan.log_duration
        ));
        let settings = placement::Settings { cycles: plan.placement_cycles, log_for: plan.log_duration };
        rows.extend(placement::phase(&daemon.endpoint, work.path(), settings).await?);
    }

    if !plan.runs(Phase::List) {
        daemon.stop().await;
        return Ok(Report { rows, machine_before, load_after: Machine::load_average() });
    }
    let (list_rows, listed) = list::fill_and_list(&daemon, plan).await?;
    rows.extend(list_rows);
    let live = daemon.memory()?;
    rows.push(Row::new("daemon memory, idle after start", idle.to_string(), None, ""));
    let db_path = work.path().join("state").join(super::serve::DB_FILE);
    // redb grows its file by doubling it (as a sparse file) up to 4 GiB: the length says
    // what it reserved, the blocks what the disk holds.
    let db = std::fs::metadata(&db_path).with_context(|| format!("reading {}", db_path.display()))?;
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    rows.push(cold_start::memory_row(
        format!("daemon memory, {} objects, live", fmt_count(listed.items as u64)),
        &live,
        &idle,
        &listed,
        format!(
            "; database file {:.0} MiB long, {:.0} MiB on disk",
            mib(db.len()),
            mib(std::os::unix::fs::MetadataExt::blocks(&db) * 512)
        ),
    ));
    let listed = listed.items;

    let mut daemon = daemon;
    let restarts = if plan.runs(Phase::ColdStart) { plan.restarts } else { 0 };
    let mut done = Vec::with_capacity(restarts);
    for generation in 1..=restarts {
        progress(format_args!(
            "cold start {generation} of {restarts}: SIGTERM, then a new daemon on the same {listed} objects",
        ));
        let (restarted, restart) =
            cold_start::restart(daemon, work.path(), &plan.serve_args, generation, listed).await?;
        daemon = restarted;
        done.push(restart);
    }
    rows.extend(cold_start::rows(&done, &idle));
    daemon.stop().await;
    Ok(Report { rows, machine_before, load_after: Machine::load_average() })
}

/// Raw redb commits, log appends and fdatasyncs in the work directory, no daemon.
async fn raw_phase(plan: &Plan, work: &WorkDir) -> Result<Vec<Row>> {
    progress(format_args!(
        "raw redb commits, log appends and fdatasyncs n={} each in {}",
        plan.raw_commits,
        work.path().display()
    ));
    let (dir, n) = (work.path().to_path_buf(), plan.raw_commits);
    let raw = tokio::task::spawn_blocking(move || crate::store::bench::raw_commit_latencies(&dir, n))
        .await?
        .context("timing raw redb commits")?;
    let (dir, n) = (work.path().to_path_buf(), plan.raw_commits);
    let appends = tokio::task::spawn_blocking(move || crate::store::bench::raw_append_latencies(&dir, n))
        .await?
        .context("timing raw log appends")?;
    let (dir, n) = (work.path().to_path_buf(), plan.raw_commits);
    let fsync = tokio::task::spawn_blocking(move || fdatasync_latencies(&dir, n)).await??;
    Ok(vec![
        Row::new(
            "raw write-ahead log append (1 KiB, synced)",
            format!("{} appends", appends.len()),
            Some(appends.as_slice()),
            "",
        ),
        Row::new(
            "raw redb commit (1 row, Immediate)",
            format!("{} commits", raw.len()),
            Some(raw.as_slice()),
            "",
        ),
        Row::new(
            "fdatasync of 4 KiB (same disk)",
            format!("{} syncs", fsync.len()),
            Some(fsync.as_slice()),
            "",
        ),
    ])
}

fn progress(what: std::fmt::Arguments<'_>) {
    eprintln!("bench: {what}");
}

fn aim_text(met: bool, aim: &str) -> String {
    format!("{aim}: {}", if met { "met" } else { "missed" })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn quick_shortens_what_is_not_given() {
        let plan = Plan::from_args(&Cli::parse_from(["bench", "--quick", "--watchers", "7"]).args).unwrap();
        assert_eq!(plan.duration, Duration::from_secs(1));
        assert_eq!(
            (plan.watch_loads.as_slice(), plan.objects, plan.raw_commits),
            (&[load(7, 50)][..], 10_000, 50)
        );
        let plan = Plan::from_args(&Cli::parse_from(["bench"]).args).unwrap();
        assert_eq!((plan.clients.as_slice(), plan.objects), (&[1, 16, 64][..], 100_000));
        assert!(Plan::from_args(&Cli::parse_from(["bench", "--clients", "0"]).args).is_err());
        assert_eq!((plan.update_objects, self::plan(&["--quick"]).unwrap().update_objects), (1000, 100));
        let err = self::plan(&["--update-objects", "0"]).unwrap_err();
        assert!(err.to_string().contains("--update-objects"), "{err}");
    }

    fn load(watchers: usize, rate: u32) -> WatchLoad {
        WatchLoad { watchers, rate }
    }

    fn plan(args: &[&str]) -> Result<Plan> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))?;
        Plan::from_args(&cli.args)
    }

    #[test]
    fn watch_loads_default_to_the_two_loads_of_issue_13() {
        let default = plan(&[]).unwrap();
        assert_eq!(default.watch_loads, [load(1000, 10), load(100, 1000)]);
        assert_eq!(default.watch_writer, WriterMode::Open);
        assert_eq!(plan(&["--quick"]).unwrap().watch_loads, [load(200, 10), load(20, 200)]);
        let given = plan(&["--watch-loads", "10x5,3x7", "--watch-writer", "closed"]).unwrap();
        assert_eq!(
            (given.watch_loads.as_slice(), given.watch_writer),
            (&[load(10, 5), load(3, 7)][..], WriterMode::Closed)
        );
        assert_eq!(plan(&["--watch-rate", "1000"]).unwrap().watch_loads, [load(1000, 1000)]);
        // One load is given one way.
        assert!(plan(&["--watch-loads", "10x5", "--watchers", "3"]).is_err());
        assert!(plan(&["--watch-loads", "10"]).is_err());
        assert!(plan(&["--watch-rate", "0"]).is_err());
        assert!(plan(&["--watch-in-flight", "0"]).is_err());
    }

    #[test]
    fn the_flags_reproduce_the_plan() {
        let given = plan(&[
            "--quick",
            "--watch-loads",
            "10x5,3x7",
            "--watch-writer-transport",
            "http1",
            "--watch-connections",
            "16",
            "--serve-arg=--metrics=false",
        ])
        .unwrap();
        assert!(given.watch_http2 && given.watch_connections == Some(16));
        let flags: Vec<String> = given.flags().split(' ').map(String::from).collect();
        let again = plan(&flags.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        assert_eq!(again, given);
        assert!(plan(&["--watch-connections", "0"]).is_err());
        let some = plan(&["--phases", "placement,power", "--placement-cycles", "4", "--log-duration", "2s"]);
        let some = some.unwrap();
        assert!(some
            .flags()
            .ends_with(" --placement-cycles 4 --log-duration 2s --restarts 3 --phases power,placement"));
        let flags: Vec<String> = some.flags().split(' ').map(String::from).collect();
        assert_eq!(plan(&flags.iter().map(String::as_str).collect::<Vec<_>>()).unwrap(), some);
    }

    #[test]
    fn phases_select_what_runs() {
        assert_eq!(plan(&[]).unwrap().phases, phase::ALL);
        let placement = plan(&["--phases", "placement"]).unwrap();
        assert_eq!(placement.phases, [Phase::Placement]);
        assert_eq!((placement.placement_cycles, placement.log_duration), (10, Duration::from_secs(10)));
        let quick = plan(&["--quick", "--phases", "placement"]).unwrap();
        assert_eq!((quick.placement_cycles, quick.log_duration), (3, Duration::from_secs(3)));
        // No watchers, fill or create clients: only the spare open files.
        assert_eq!(placement.open_files_needed(), 256);
        assert_eq!(plan(&["--phases", "list,cold-start"]).unwrap().phases, [Phase::List, Phase::ColdStart]);
        // The restarts list the filled store; without restarts there is nothing to refuse.
        assert!(plan(&["--phases", "cold-start"]).is_err());
        assert!(plan(&["--phases", "cold-start", "--restarts", "0"]).is_ok());
        assert!(plan(&["--phases", "nothing"]).is_err());
        assert!(plan(&["--placement-cycles", "0"]).is_err());
        assert!(plan(&["--log-duration", "0s"]).is_err());
    }

    #[test]
    fn the_open_files_needed_count_the_writer_connections() {
        // One HTTP/2 connection writes: 1000 watchers + 1.
        assert_eq!(plan(&[]).unwrap().open_files_needed(), 1001 + 256);
        // Over HTTP/1.1, the larger of 1000 watchers + 50 writes (10/s for 5 s) and 100
        // watchers + 1000 creates in flight.
        let http1 = ["--watch-writer-transport", "http1"];
        assert_eq!(plan(&http1).unwrap().open_files_needed(), 1100 + 256);
        let fewer = [&http1[..], &["--watch-in-flight", "10"]].concat();
        assert_eq!(plan(&fewer).unwrap().open_files_needed(), 1010 + 256);
        // The old flag is the default.
        assert_eq!(plan(&["--watch-writer-http2"]).unwrap(), plan(&[]).unwrap());
        assert_eq!(plan(&["--watch-writer", "closed"]).unwrap().open_files_needed(), 1001 + 256);
    }
}
