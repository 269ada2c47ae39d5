//! An agent's phase: the one word that says where it stands (`Running`, `Stopped`,
//! `CrashLoopBackOff`, `BuildFailed` …), as kubectl's STATUS column says a pod's. It is
//! worked out here, once, from `spec.wanted` and the rest of `status` (power and the
//! conditions the controllers write), and kept in `status.phase` by the daemon's typed
//! client on every status write, so the server's Table, the CLI, MCP and the dashboard all say the same word.
//! The last exit (`status.lastExit`) is what crash-watch saw of the agent's process
//! ending on its own: code or signal, time, and the last lines of its stderr.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{
    Agent, Power, Wanted, CONDITION_BUILDING, CONDITION_CONVERGED, CONDITION_CRASHED, CONDITION_NODE_LOST,
    CONDITION_PLACED,
};
use crate::meta::{ConditionStatus, Time};
use crate::validation::{Errors, Reason};

/// Where an agent stands, in one word (`status.phase`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum AgentPhase {
    /// Nothing has happened yet: no status, or wanted Up and stopped with no Job on it
    /// yet; or, placed on a fleet Node, waiting for that node.
    #[default]
    Pending,
    /// A spawn, rebuild or move Job is building it.
    Building,
    /// Wanted Up and a Job is starting it.
    Starting,
    /// Wanted Up, and it runs.
    Running,
    /// It is being stopped (or runs while wanted Offline).
    Stopping,
    /// Wanted Offline, and it is stopped.
    Stopped,
    /// It exits on its own, and crash-watch restarts it after a backoff (condition
    /// `Crashed` True).
    CrashLoopBackOff,
    /// The newest build of its config failed (condition `Building` False, reason
    /// `BuildFailed`); an older generation may still run.
    BuildFailed,
    /// The last start failed without the agent ever running (its command could not be
    /// launched); nothing retries it until the spec changes or a power verb runs.
    StartFailed,
    /// The last stop failed.
    StopFailed,
    /// Its fleet Node is gone or cannot be reached (condition `NodeLost` True).
    Lost,
    /// It is being deleted.
    Terminating,
    /// The runtime could not tell.
    Unknown,
}

impl AgentPhase {
    /// The serialized name, e.g. `CrashLoopBackOff`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentPhase::Pending => "Pending",
            AgentPhase::Building => "Building",
            AgentPhase::Starting => "Starting",
            AgentPhase::Running => "Running",
            AgentPhase::Stopping => "Stopping",
            AgentPhase::Stopped => "Stopped",
            AgentPhase::CrashLoopBackOff => "CrashLoopBackOff",
            AgentPhase::BuildFailed => "BuildFailed",
            AgentPhase::StartFailed => "StartFailed",
            AgentPhase::StopFailed => "StopFailed",
            AgentPhase::Lost => "Lost",
            AgentPhase::Terminating => "Terminating",
            AgentPhase::Unknown => "Unknown",
        }
    }

    /// Whether the agent failed and will not get better by itself while its spec stays
    /// as it is: `hive wait` gives up at once on these.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            AgentPhase::CrashLoopBackOff
                | AgentPhase::BuildFailed
                | AgentPhase::StartFailed
                | AgentPhase::StopFailed
                | AgentPhase::Lost
        )
    }
}

/// The reason of the `Converged` (and `Ready`) condition when the last start failed
/// without the agent ever running.
pub const REASON_START_FAILED: &str = "StartFailed";
/// The reason of the `Converged` (and `Ready`) condition when the last stop failed.
pub const REASON_STOP_FAILED: &str = "StopFailed";
/// The reason of the `Building` condition when the newest build failed.
pub const REASON_BUILD_FAILED: &str = "BuildFailed";

/// The agent's phase, from `metadata.deletionTimestamp`, `spec.wanted` and its status
/// (never from `status.phase` itself). The first that holds wins: being deleted; its
/// node lost; waiting for its node; a build under way; a crash loop; a failed start or
/// stop; a failed build; then what its power says against what is wanted.
pub fn phase(agent: &Agent) -> AgentPhase {
    let status = &agent.status;
    let holds =
        |type_: &str, state: ConditionStatus| status.condition(type_).is_some_and(|c| c.status == state);
    let false_because = |type_: &str| {
        status.condition(type_).filter(|c| c.status == ConditionStatus::False).map(|c| c.reason.as_str())
    };
    let up = agent.spec.wanted == Wanted::Up;
    if agent.metadata.deletion_timestamp.is_some() {
        return AgentPhase::Terminating;
    }
    if status.power == Some(Power::Lost) || holds(CONDITION_NODE_LOST, ConditionStatus::True) {
        return AgentPhase::Lost;
    }
    if holds(CONDITION_PLACED, ConditionStatus::False) {
        return AgentPhase::Pending;
    }
    if holds(CONDITION_BUILDING, ConditionStatus::True) {
        return AgentPhase::Building;
    }
    if up && holds(CONDITION_CRASHED, ConditionStatus::True) {
        return AgentPhase::CrashLoopBackOff;
    }
    match false_because(CONDITION_CONVERGED) {
        Some(REASON_START_FAILED) if up => return AgentPhase::StartFailed,
        Some(REASON_STOP_FAILED) if !up => return AgentPhase::StopFailed,
        _ => {}
    }
    if false_because(CONDITION_BUILDING) == Some(REASON_BUILD_FAILED) {
        return AgentPhase::BuildFailed;
    }
    let working = status.active_job.is_some();
    match (status.power, up) {
        (Some(Power::Running), true) => AgentPhase::Running,
        (Some(Power::Running), false) | (Some(Power::Stopping), _) => AgentPhase::Stopping,
        (Some(Power::Starting), _) => AgentPhase::Starting,
        (Some(Power::Unknown), _) => AgentPhase::Unknown,
        (Some(Power::Lost), _) => AgentPhase::Lost,
        (Some(Power::Stopped), false) => AgentPhase::Stopped,
        // Built, never started, and wanted Offline: stopped, as wanted.
        (None, false) if status.condition(CONDITION_BUILDING).is_some() => AgentPhase::Stopped,
        (Some(Power::Stopped) | None, true) if working => AgentPhase::Starting,
        (Some(Power::Stopped) | None, _) => AgentPhase::Pending,
    }
}

/// Whether a condition of this type is bad news when True (`Crashed`, `NodeLost`): the
/// dashboard draws those red when True, the others red when False.
pub fn bad_when_true(type_: &str) -> bool {
    matches!(type_, CONDITION_CRASHED | CONDITION_NODE_LOST)
}

/// At most this many lines of stderr are kept in `status.lastExit.stderr`.
pub const LAST_EXIT_LINES: usize = 20;
/// At most this many bytes of stderr (all lines together) are kept in
/// `status.lastExit.stderr`.
pub const LAST_EXIT_BYTES: usize = 4096;

/// How the agent's process last ended on its own (a crash, or an exit nobody asked
/// for): what `kubectl describe pod` shows as a container's last state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastExit {
    /// The exit code, when it exited by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did (e.g. 9 for SIGKILL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// When the runtime saw it end.
    pub finished_at: Time,
    /// The last lines it wrote to stderr, oldest first: at most 20 lines and 4 KiB, with
    /// the daemon's state directory written as `$STATE_DIR`. Empty when the runtime keeps
    /// no stderr (a NixOS container's is in its journal).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stderr: Vec<String>,
}

impl LastExit {
    /// `exit code 1`, `signal 9`: how it ended, in a few words.
    pub fn how(&self) -> String {
        match (self.exit_code, self.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            (None, None) => "unknown exit status".into(),
        }
    }

    /// Refuses a stderr tail over its bounds.
    pub(crate) fn validate(&self, errors: &mut Errors, field: &str) {
        if self.stderr.len() > LAST_EXIT_LINES {
            errors.push(
                format!("{field}.stderr"),
                Reason::TooMany,
                format!("{} lines: at most {LAST_EXIT_LINES}", self.stderr.len()),
            );
        }
        let bytes: usize = self.stderr.iter().map(String::len).sum();
        if bytes > LAST_EXIT_BYTES {
            errors.push(
                format!("{field}.stderr"),
                Reason::TooLong,
                format!("{bytes} bytes: at most {LAST_EXIT_BYTES}"),
            );
        }
    }
}

/// The last lines of `text` (an agent's stderr), bounded as `status.lastExit.stderr` is
/// — at most [`LAST_EXIT_LINES`] lines and [`LAST_EXIT_BYTES`] bytes, the newest kept, a
/// longer line cut at its start — with `state_dir` (when given) written as
/// `$STATE_DIR`, and without blank lines or control characters.
pub fn stderr_tail(text: &str, state_dir: Option<&str>) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut bytes = 0;
    for line in text.lines().rev() {
        if lines.len() == LAST_EXIT_LINES {
            break;
        }
        let mut line = match state_dir.filter(|d| !d.is_empty()) {
            Some(dir) => line.replace(dir, "$STATE_DIR"),
            None => line.to_string(),
        };
        line.retain(|c| !c.is_control() || c == '\t');
        let line = line.trim_end();
        if line.trim().is_empty() {
            continue;
        }
        let room = LAST_EXIT_BYTES - bytes;
        if room == 0 {
            break;
        }
        let mut start = line.len().saturating_sub(room);
        while !line.is_char_boundary(start) {
            start += 1;
        }
        let kept = &line[start..];
        bytes += kept.len();
        lines.push(kept.to_string());
    }
    lines.reverse();
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Condition;

    fn agent(wanted: Wanted, power: Option<Power>, conditions: &[(&str, ConditionStatus, &str)]) -> Agent {
        let mut agent = Agent::new("a", Default::default());
        agent.spec.wanted = wanted;
        agent.status.power = power;
        agent.status.conditions = conditions
            .iter()
            .map(|(type_, status, reason)| Condition {
                type_: type_.to_string(),
                status: *status,
                reason: reason.to_string(),
                ..Default::default()
            })
            .collect();
        agent
    }

    #[test]
    fn one_word_says_where_an_agent_stands() {
        use AgentPhase::*;
        use ConditionStatus::{False, True};
        use Power::{Lost as PowerLost, Running as Runs, Stopped as Stops};
        use Wanted::{Offline, Up};
        let built = (CONDITION_BUILDING, False, "Built");
        let crashed = (CONDITION_CRASHED, True, "CrashLoopBackOff");
        let cases: Vec<(&str, Agent, AgentPhase)> = vec![
            ("a new agent", agent(Up, None, &[]), Pending),
            ("being spawned", agent(Up, None, &[(CONDITION_BUILDING, True, "Spawn")]), Building),
            ("runs as wanted", agent(Up, Some(Runs), &[built]), Running),
            ("stopped on purpose", agent(Offline, Some(Stops), &[built]), Stopped),
            ("created Offline, built, never started", agent(Offline, None, &[built]), Stopped),
            ("wanted Offline, still running", agent(Offline, Some(Runs), &[built]), Stopping),
            ("a crash loop", agent(Up, Some(Stops), &[built, crashed]), CrashLoopBackOff),
            ("a crash loop, briefly up", agent(Up, Some(Runs), &[built, crashed]), CrashLoopBackOff),
            ("a crashed agent since stopped", agent(Offline, Some(Stops), &[built, crashed]), Stopped),
            (
                "a spawn whose build failed",
                agent(Up, None, &[(CONDITION_BUILDING, False, REASON_BUILD_FAILED)]),
                BuildFailed,
            ),
            (
                "a rebuild failed, the old generation runs",
                agent(Up, Some(Runs), &[(CONDITION_BUILDING, False, REASON_BUILD_FAILED)]),
                BuildFailed,
            ),
            (
                "a start that never ran",
                agent(Up, Some(Stops), &[built, (CONDITION_CONVERGED, False, REASON_START_FAILED)]),
                StartFailed,
            ),
            (
                "a stop that failed",
                agent(Offline, Some(Runs), &[built, (CONDITION_CONVERGED, False, REASON_STOP_FAILED)]),
                StopFailed,
            ),
            ("its node is lost", agent(Up, Some(PowerLost), &[built, crashed]), Lost),
            (
                "waiting for its node",
                agent(Up, None, &[(CONDITION_PLACED, False, "WaitingForNode")]),
                Pending,
            ),
            (
                "a rebuild under way beats an old failure",
                agent(Up, Some(Runs), &[(CONDITION_BUILDING, True, "Rebuild"), crashed]),
                Building,
            ),
        ];
        for (what, agent, want) in cases {
            assert_eq!(phase(&agent), want, "{what}");
        }
        let mut starting = agent(Up, Some(Stops), &[built]);
        assert_eq!(phase(&starting), Pending, "wanted Up, stopped, nothing on it yet");
        starting.status.active_job = Some("start-a-1".into());
        assert_eq!(phase(&starting), Starting);
        let mut deleted = agent(Up, Some(Runs), &[built]);
        deleted.metadata.deletion_timestamp = Time::from_unix(0);
        assert_eq!(phase(&deleted), Terminating);
    }

    #[test]
    fn a_stderr_tail_is_bounded_and_names_no_state_dir() {
        let text =
            "first\n\npanic: /var/lib/hive/agents/a/gen/config.toml: no such file\n\x1b[31mred\x1b[0m\n";
        assert_eq!(
            stderr_tail(text, Some("/var/lib/hive")),
            ["first", "panic: $STATE_DIR/agents/a/gen/config.toml: no such file", "[31mred[0m"]
        );
        let many: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let tail = stderr_tail(&many, None);
        assert_eq!(tail.len(), LAST_EXIT_LINES);
        assert_eq!(tail.last().map(String::as_str), Some("line 99"));
        let long = format!("{}é{}\nlast\n", "x".repeat(5000), "y".repeat(10));
        let tail = stderr_tail(&long, None);
        assert_eq!(tail.iter().map(String::len).sum::<usize>(), LAST_EXIT_BYTES);
        assert_eq!(tail.last().map(String::as_str), Some("last"));
        let exit = LastExit {
            exit_code: Some(1),
            signal: None,
            finished_at: Time::from_unix(0).unwrap(),
            stderr: tail,
        };
        let mut errors = Errors::default();
        exit.validate(&mut errors, "status.lastExit");
        assert!(errors.0.is_empty(), "{:?}", errors.0);
    }
}
