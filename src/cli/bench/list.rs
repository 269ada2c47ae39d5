//! The list phase: full lists of every Agent from the daemon's cache, timed to the last
//! byte. A full list is also what shows a restarted daemon serving, and its size gives
//! the objects' own JSON for the memory per object.

use std::time::Instant;

use anyhow::{Context as _, Result};
use serde::Deserialize;

use super::api::{Api, Endpoint, AGENTS, REQUEST_TIMEOUT};
use super::report::{summarize, Row};
use super::units::{fmt_count, fmt_duration};

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

/// Times `runs` full lists and reports the median, the size and the item count.
pub(super) async fn list_phase(endpoint: &Endpoint, runs: usize) -> Result<ListRun> {
    let api = endpoint.api(Some(REQUEST_TIMEOUT))?;
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
    let row = Row::new(format!("full list, JSON, {runs} runs"), result, Some(times.as_slice()), "");
    Ok(ListRun { row, listed })
}
