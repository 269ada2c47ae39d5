//! What agents use now, as `hive top` shows it (kubectl's `top pods`): CPU and memory of
//! each agent's process tree, measured by the daemon over a short window. Not a kind: an
//! answer of `GET /hive/v1/agents/usage`, never stored.

use serde::{Deserialize, Serialize};

/// Every agent's usage, measured together over one window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentUsageList {
    /// How long the CPU time was measured over, in seconds.
    pub window_seconds: f64,
    /// One entry per agent, by name.
    pub items: Vec<AgentUsage>,
}

/// One agent's usage: known for an agent that runs on the daemon's host; otherwise
/// `reason` says why not.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentUsage {
    /// The agent's name.
    pub name: String,
    /// The fleet node it is placed on (`spec.placement.node`); none: the daemon's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// CPU used over the window, in percent of one core (200 is two cores busy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<f64>,
    /// Resident memory of its processes, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// How many processes its tree holds (the main process and its descendants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u32>,
    /// Why there is no measure: it does not run, or where it runs cannot be measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
