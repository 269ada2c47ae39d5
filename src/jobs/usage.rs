//! What agents use now (`hive top`): each local agent's process tree sampled from
//! `/proc` at the start and the end of a window, CPU as the rate between the two. An
//! agent placed on a fleet node is measured there by nobody yet: its entry says so (the
//! node's own telemetry is `hive top nodes`).

use std::path::Path;
use std::time::Duration;

use hive_api::agent::Agent;
use hive_api::usage::{AgentUsage, AgentUsageList};

use super::error::Result;
use crate::runtime::usage::{self, Sample};
use crate::runtime::Runtime;

/// Where the process table is read.
const PROC: &str = "/proc";

/// Measures `agents` over `window`: their pids from `runtime`, their trees from `/proc`
/// now and after the window.
pub async fn measure(runtime: &dyn Runtime, agents: Vec<Agent>, window: Duration) -> Result<AgentUsageList> {
    let mut roots: Vec<(AgentUsage, Option<(u32, Sample)>)> = Vec::with_capacity(agents.len());
    for agent in &agents {
        let name = agent.metadata.name.clone();
        let mut entry = AgentUsage { name, ..AgentUsage::default() };
        if let Some(node) = agent.spec.node() {
            entry.node = Some(node.to_string());
            entry.reason = Some(format!("runs on fleet node {node}: see hive top nodes"));
            roots.push((entry, None));
            continue;
        }
        let pid = match runtime.observed(agent).await {
            Ok(observed) => observed.pid,
            Err(err) => {
                tracing::debug!(agent = %agent.metadata.name, error = %err, "no observation for its usage");
                None
            }
        };
        let first = pid.and_then(|pid| Some((pid, usage::sample(Path::new(PROC), pid)?)));
        if first.is_none() {
            entry.reason = Some("not running".into());
        }
        roots.push((entry, first));
    }
    let began = tokio::time::Instant::now();
    if roots.iter().any(|(_, first)| first.is_some()) {
        tokio::time::sleep(window).await;
    }
    let seconds = began.elapsed().as_secs_f64();
    let items = roots
        .into_iter()
        .map(|(mut entry, first)| {
            let Some((pid, before)) = first else { return entry };
            match usage::sample(Path::new(PROC), pid) {
                Some(after) => {
                    entry.cpu_percent =
                        Some((usage::cpu_percent(&before, &after, seconds) * 10.0).round() / 10.0);
                    entry.memory_bytes = Some(after.memory_bytes);
                    entry.processes = Some(after.processes);
                }
                None => entry.reason = Some("stopped while measured".into()),
            }
            entry
        })
        .collect();
    Ok(AgentUsageList { window_seconds: seconds, items })
}
