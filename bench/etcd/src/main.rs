//! `hive-bench-etcd`: the etcd side of issue 13's side-by-side table. It measures etcd
//! (started by `run.sh`, one member on 127.0.0.1, plaintext gRPC) the way `hive bench`
//! measures hive: durable puts per second at several client counts, each client on its
//! own connection, and watch delivery latency with an open-loop writer at the same
//! loads. It prints rows in `hive bench`'s columns, so both land in one table.

mod puts;
mod table;
mod watch;

use std::time::Duration;

use anyhow::Result;
use clap::Parser;

/// Measures an etcd at --endpoint as `hive bench` measures hive; see run.sh.
#[derive(Parser, Debug)]
#[command(name = "hive-bench-etcd")]
struct Args {
    /// etcd's client URL (plaintext gRPC).
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    endpoint: String,

    /// etcd's pid, for the CPU column (run.sh passes it).
    #[arg(long)]
    etcd_pid: Option<u32>,

    /// How long each put level runs, e.g. `5s` or `500ms`.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    duration: Duration,

    /// Concurrent put clients of each level, each with its own connection.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    clients: Vec<usize>,

    /// Watch loads, each WATCHERSxRATE, as `hive bench --watch-loads`.
    #[arg(long, value_delimiter = ',', default_value = "1000x10,100x1000", value_parser = watch::Load::parse)]
    watch_loads: Vec<watch::Load>,

    /// How long the writer writes for each watch load.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    watch_duration: Duration,

    /// Most puts in flight at once from the open-loop writer.
    #[arg(long, default_value_t = 1000)]
    watch_in_flight: usize,

    /// gRPC connections the watches of a load are spread over, each watch a stream on one
    /// (as informers in several processes; at most one per watch).
    #[arg(long, default_value_t = 16)]
    watch_clients: usize,

    /// Bytes in each value (the comparison used 512).
    #[arg(long, default_value_t = 512)]
    value_bytes: usize,

    /// Each put as the transaction hive's store on etcd sends for a create (put if the
    /// key's mod revision is 0, else read it back), for hive-on-etcd against raw etcd.
    #[arg(long)]
    creates: bool,

    /// Each put level a second time with the puts or transactions sent as JSON through
    /// etcd's gRPC gateway (`/v3/kv/...`), each client on its own HTTP/1.1 connection, as
    /// hive's store on etcd sends them: what the gateway costs.
    #[arg(long)]
    gateway: bool,

    /// Only the put levels, no watch loads.
    #[arg(long)]
    no_watches: bool,

    /// Instead of measuring: put this many keys of --value-bytes under /bench/fill/ with
    /// the largest --clients count, and stop (run.sh's ETCD_RESTART=1 then times etcd's
    /// restart with them).
    #[arg(long, value_name = "N")]
    fill: Option<usize>,

    /// Print the rows as Markdown too.
    #[arg(long)]
    markdown: bool,
}

/// `5s`, `500ms`, `1.5s`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, scale) = match text.strip_suffix("ms") {
        Some(n) => (n, 0.001),
        None => (text.strip_suffix('s').unwrap_or(text), 1.0),
    };
    let n: f64 = number.parse().map_err(|_| format!("`{text}` is not a duration like 5s or 500ms"))?;
    if !(n > 0.0 && n * scale <= 600.0) {
        return Err(format!("`{text}`: more than 0 and at most 600s"));
    }
    Ok(Duration::from_secs_f64(n * scale))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(keys) = args.fill {
        let clients = args.clients.iter().copied().max().unwrap_or(64);
        eprintln!(
            "hive-bench-etcd: filling {keys} keys of {} bytes with {clients} clients",
            args.value_bytes
        );
        let took = puts::fill(&args.endpoint, keys, clients, args.value_bytes).await?;
        println!(
            "etcd fill: {keys} keys of {} bytes in {:.1}s ({:.0}/s)",
            args.value_bytes,
            took.as_secs_f64(),
            keys as f64 / took.as_secs_f64().max(1e-9)
        );
        return Ok(());
    }
    let mut rows = Vec::new();
    for &clients in &args.clients {
        eprintln!("hive-bench-etcd: puts c={clients} for {:?}", args.duration);
        for gateway in [false, true] {
            if gateway && !args.gateway {
                continue;
            }
            let level = puts::Level {
                clients,
                duration: args.duration,
                value_bytes: args.value_bytes,
                creates: args.creates,
                gateway,
            };
            rows.push(puts::level(&args.endpoint, &level, args.etcd_pid).await?);
        }
    }
    let settings = watch::Settings {
        duration: args.watch_duration,
        in_flight: args.watch_in_flight,
        value_bytes: args.value_bytes,
        clients: args.watch_clients,
        pid: args.etcd_pid,
    };
    let loads = if args.no_watches { &[][..] } else { &args.watch_loads[..] };
    for (index, load) in loads.iter().enumerate() {
        eprintln!(
            "hive-bench-etcd: watch: {} watchers at {}/s for {:?}",
            load.watchers, load.rate, args.watch_duration
        );
        rows.extend(watch::load(&args.endpoint, index, *load, &settings).await?);
    }
    print!("{}", table::render_text(&rows));
    if args.markdown {
        println!();
        print!("{}", table::render_markdown(&rows));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_hive_bench() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
