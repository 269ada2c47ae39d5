//! The update phase: `--update-objects` Agents created, then replaced over and over by N
//! clients, each on its own connection, at each `--clients` level. Every replace (a PUT
//! without a resourceVersion, as `kubectl replace` of an edited file) changes a label,
//! so each is a new revision of an object the store already holds: the history turns
//! over many times past its retention, the checkpointer writes the same keys again and
//! again, and the rows say whether the database file and the write-ahead log stay as
//! large as they were.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio::task::JoinSet;

use super::api::{agent_marked, snippet, Api, AGENTS, REQUEST_TIMEOUT};
use super::creates::{create_with, gather, CreateRun, Until};
use super::daemon::Daemon;
use super::meters::CpuMeter;
use super::progress;
use super::report::Row;
use super::units::fmt_count;

/// The prefix of the updated Agents' names.
const PREFIX: &str = "u";

/// Creates the `objects` Agents, then runs each level in `levels` for `duration`: one
/// row a level (updates a second and their latency), and one for the state directory
/// after each.
pub(super) async fn phase(
    daemon: &Daemon,
    state: &Path,
    objects: usize,
    levels: &[usize],
    duration: Duration,
) -> Result<Vec<Row>> {
    progress(format_args!("updates: creating {} Agents to update", fmt_count(objects as u64)));
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients = levels.iter().copied().max().unwrap_or(1).min(64);
    let created =
        create_with(&daemon.endpoint, clients, Until::Count { next, total: objects }, PREFIX, false).await?;
    if created.created != objects {
        bail!(
            "creating the Agents to update: {} of {objects} created; first failure: {}",
            created.created,
            created.first_failure.as_deref().unwrap_or("none")
        );
    }
    let mut rows = vec![Row::new("state directory before the updates", on_disk(state)?, None, "")];
    for (generation, &clients) in levels.iter().enumerate() {
        progress(format_args!("updates c={clients} for {duration:?} over {objects} Agents"));
        let meter = CpuMeter::start(daemon.pid);
        let run = update_with(daemon, clients, objects, duration, generation).await?;
        let measurement =
            format!("durable updates (PUT), {clients} client(s), {} Agents", fmt_count(objects as u64));
        rows.push(run.row(measurement, String::new()).with_cpu(meter.stop()));
        rows.push(Row::new(format!("state directory after c={clients}"), on_disk(state)?, None, ""));
    }
    Ok(rows)
}

/// `clients` tasks replace Agents `u-<i>` for `duration`, client `c` taking `i = c,
/// c + clients, …` in turn; only `200 OK` counts.
async fn update_with(
    daemon: &Daemon,
    clients: usize,
    objects: usize,
    duration: Duration,
    generation: usize,
) -> Result<CreateRun> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = JoinSet::new();
    for client in 0..clients {
        let api = daemon.endpoint.api(Some(REQUEST_TIMEOUT))?;
        let barrier = barrier.clone();
        tasks.spawn(async move {
            // One update outside the clock, so connection setup is not measured.
            let warmed = replace(&api, client % objects, &format!("{generation}-w")).await;
            barrier.wait().await;
            match warmed? {
                (200, _) => {}
                (code, body) => bail!("warm-up update: HTTP {code}: {}", snippet(&body)),
            }
            let started = Instant::now();
            let mut run = CreateRun::new(1);
            let mut index = client;
            for seq in 0.. {
                if started.elapsed() >= duration {
                    break;
                }
                let sent = Instant::now();
                let outcome = replace(&api, index % objects, &format!("{generation}-{seq}")).await;
                run.record_as(200, sent.elapsed(), outcome);
                index += clients;
            }
            anyhow::Ok(run)
        });
    }
    gather(&barrier, tasks, clients, "update").await
}

/// PUTs Agent `u-<index>` with the label [`super::api::UPDATE_LABEL`] set to `mark`.
async fn replace(api: &Api, index: usize, mark: &str) -> Result<(u16, bytes::Bytes)> {
    let name = format!("{PREFIX}-{index}");
    let resp = api
        .request(reqwest::Method::PUT, &format!("{AGENTS}/{name}"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(agent_marked(&name, None, Some(mark)))
        .send()
        .await?;
    let code = resp.status().as_u16();
    Ok((code, resp.bytes().await?))
}

/// The database file's and the write-ahead log's sizes in `state`: length and blocks on
/// disk.
fn on_disk(state: &Path) -> Result<String> {
    let db = state.join(crate::cli::serve::DB_FILE);
    let mut parts = Vec::new();
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let mut files = vec![db.clone()];
    files.extend([0, 1].map(|i| {
        let mut name = db.as_os_str().to_owned();
        name.push(format!("-wal-{i}"));
        std::path::PathBuf::from(name)
    }));
    for file in files {
        match std::fs::metadata(&file) {
            Ok(meta) => parts.push(format!(
                "{} {:.1} MiB long, {:.1} MiB on disk",
                file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                mib(meta.len()),
                mib(std::os::unix::fs::MetadataExt::blocks(&meta) * 512)
            )),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(err).with_context(|| format!("reading {}", file.display())),
        }
    }
    Ok(parts.join("; "))
}
