//! The list phase: the store filled to `--objects`, then full lists of every Agent from
//! the daemon's cache, timed to the last byte, over HTTP/1.1 and then over HTTP/2. A full list is also what shows a restarted
//! daemon serving, and its size gives the objects' own JSON for the memory per object.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context as _, Result};
use serde::Deserialize;

use super::api::{Api, Endpoint, AGENTS, REQUEST_TIMEOUT};
use super::creates::{create_with, Until};
use super::daemon::Daemon;
use super::meters::CpuMeter;
use super::report::{summarize, Row};
use super::units::{fmt_count, fmt_duration};
use super::{progress, Plan};

/// Longest a fill of `--objects` may take.
const FILL_LIMIT: Duration = Duration::from_secs(15 * 60);

/// What one full list answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Listed {
    /// Agents in it.
    pub(super) items: usize,
    /// Bytes of its JSON body.
    pub(super) bytes: usize,
}

/// What the list phase measured.
pub(super) struct ListRun {
    pub(super) row: Row,
    pub(super) listed: Listed,
}

/// One full list of every Agent; fails unless `200`.
pub(super) async fn list_all(api: &Api) -> Result<Listed> {
    count(&api.get(AGENTS).await?)
}

/// What a full list's body holds. This is the client's own work, parsing the whole
/// body (about as long again as receiving it at 100,000 objects), so it is not in the
/// time of a list.
fn count(body: &[u8]) -> Result<Listed> {
    #[derive(Deserialize)]
    struct Items {
        items: Vec<serde::de::IgnoredAny>,
    }
    let items = serde_json::from_slice::<Items>(body).context("the list is not an AgentList")?.items.len();
    Ok(Listed { items, bytes: body.len() })
}

/// Times `runs` full lists over one connection, HTTP/1.1 (curl, the Python client) or
/// HTTP/2 (kubectl, client-go), and reports the median, the size and the item count.
pub(super) async fn list_phase(endpoint: &Endpoint, runs: usize, http2: bool) -> Result<ListRun> {
    let api = if http2 {
        endpoint.api_http2(Some(REQUEST_TIMEOUT))?
    } else {
        endpoint.api(Some(REQUEST_TIMEOUT))?
    };
    let mut times = Vec::with_capacity(runs);
    let mut listed = Listed { items: 0, bytes: 0 };
    for run in 0..runs {
        let started = Instant::now();
        let body = api.get(AGENTS).await?;
        times.push(started.elapsed());
        if run == 0 {
            listed = count(&body)?;
        }
    }
    let median = summarize(&times).map(|s| s.p50).unwrap_or_default();
    let result = format!(
        "median {} for {} items, {:.1} MiB",
        fmt_duration(median),
        fmt_count(listed.items as u64),
        listed.bytes as f64 / (1024.0 * 1024.0)
    );
    let over = if http2 { ", over HTTP/2" } else { "" };
    let row = Row::new(format!("full list, JSON{over}, {runs} runs"), result, Some(times.as_slice()), "");
    Ok(ListRun { row, listed })
}
/// Fills the store to `--objects` and times full lists; their rows and what a list held.
pub(super) async fn fill_and_list(daemon: &Daemon, plan: &Plan) -> Result<(Vec<Row>, Listed)> {
    let mut rows = Vec::new();
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

    progress(format_args!("list: {} full lists over HTTP/1.1, then over HTTP/2", plan.list_runs));
    let meter = CpuMeter::start(daemon.pid);
    let list = list_phase(&daemon.endpoint, plan.list_runs, false).await?;
    rows.push(list.row.with_cpu(meter.stop()));
    let meter = CpuMeter::start(daemon.pid);
    let over_http2 = list_phase(&daemon.endpoint, plan.list_runs, true).await?;
    ensure!(
        over_http2.listed == list.listed,
        "a full list over HTTP/2 held {:?}, over HTTP/1.1 {:?}",
        over_http2.listed,
        list.listed
    );
    rows.push(over_http2.row.with_cpu(meter.stop()));

    Ok((rows, list.listed))
}
