//! The list phase: full lists of every Agent from the daemon's cache, timed to the last
//! byte.

use std::time::Instant;

use anyhow::{Context as _, Result};
use serde::Deserialize;

use super::api::{Endpoint, AGENTS, REQUEST_TIMEOUT};
use super::report::{fmt_count, fmt_duration, summarize, Row};

/// Times `runs` full lists and reports the median, the size and the item count.
pub(super) async fn list_phase(endpoint: &Endpoint, runs: usize) -> Result<Row> {
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
