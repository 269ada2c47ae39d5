//! `hive logs job/NAME [--node ID] [-f]` prints a Job node's build log (by default the
//! running node, else the last one that ran); `hive logs agent/NAME [-f] [--tail N]
//! [--since D | --since-time T] [--timestamps] [--previous]` prints an agent's captured
//! stdout/stderr, as `kubectl logs` does a pod's. Both stream the server's `text/plain`.

use std::io::Write as _;

use anyhow::{Context as _, Result};
use hive_api::job::JobNodeState;
use hive_api::Job;

use super::client::{encode, Query};
use super::Context;

/// Print the build log of a Job node, or the output of an agent.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive logs job/stop-1a2b3c4d                      # the running node, else the last that ran
  hive logs job/stop-1a2b3c4d --node alpha/drain -f
  hive logs agent/alpha --tail 100
  hive logs agent/alpha -f
  hive logs agent/alpha --since 10m --timestamps   # the last ten minutes, each line with its time
  hive logs agent/alpha --since-time 2026-12-01T17:00:00Z
  hive logs agent/alpha --previous                 # the run before the current one (before a crash)")]
pub struct Args {
    /// What to read: `job/NAME` or `agent/NAME` (also `jobs/`, `jb/`, `agents/`, `ag/`).
    #[arg(value_name = "job/NAME|agent/NAME")]
    pub object: String,

    /// The Job node whose log to print, by id (`alpha/drain`) or, when unambiguous, by
    /// step (`drain`). Jobs only.
    #[arg(long, value_name = "ID")]
    pub node: Option<String>,

    /// Keep streaming: a node's log until the node ends, an agent's until interrupted.
    #[arg(short, long)]
    pub follow: bool,

    /// Only the last N lines of an agent's log. Agents only.
    #[arg(long, value_name = "N")]
    pub tail: Option<u64>,

    /// Only lines written in the last DURATION (`30s`, `10m`, `2h`). Agents only.
    #[arg(long, value_name = "DURATION", value_parser = super::duration::parse, conflicts_with = "since_time")]
    pub since: Option<std::time::Duration>,

    /// Only lines written at or after TIME (RFC 3339, e.g. `2026-12-01T17:00:00Z`). Agents only.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since_time: Option<chrono::DateTime<chrono::Utc>>,

    /// Prefix each line with the time it was written (RFC 3339, nanoseconds). Agents only.
    #[arg(long)]
    pub timestamps: bool,

    /// The agent's run before the current one: what it printed before it last
    /// (re)started, e.g. before a crash. Agents only.
    #[arg(short, long)]
    pub previous: bool,
}

fn parse_time(text: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.to_utc())
        .map_err(|e| format!("expected an RFC 3339 time such as 2026-12-01T17:00:00Z: {e}"))
}

/// What `hive logs agent/NAME` asks of the agent's log, beside `follow`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentLogQuery {
    /// `--tail N`.
    pub tail: Option<u64>,
    /// `--since D`.
    pub since: Option<std::time::Duration>,
    /// `--since-time T`.
    pub since_time: Option<chrono::DateTime<chrono::Utc>>,
    /// `--timestamps`.
    pub timestamps: bool,
    /// `--previous`.
    pub previous: bool,
}

impl AgentLogQuery {
    fn of(args: &Args) -> AgentLogQuery {
        AgentLogQuery {
            tail: args.tail,
            since: args.since,
            since_time: args.since_time,
            timestamps: args.timestamps,
            previous: args.previous,
        }
    }

    /// The agent-only flags given, by name, for the refusal on a Job.
    fn given(&self) -> Vec<&'static str> {
        let flags = [
            ("--tail", self.tail.is_some()),
            ("--since", self.since.is_some()),
            ("--since-time", self.since_time.is_some()),
            ("--timestamps", self.timestamps),
            ("--previous", self.previous),
        ];
        flags.iter().filter(|(_, given)| *given).map(|(name, _)| *name).collect()
    }
}

/// What `hive logs` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A Job's node logs.
    Job(String),
    /// An agent's output.
    Agent(String),
}

/// Parses `job/NAME` or `agent/NAME`.
pub fn parse_target(text: &str) -> Result<Target> {
    let Some((kind, name)) = text.split_once('/') else {
        anyhow::bail!("expected job/NAME or agent/NAME, got {text:?}");
    };
    if name.is_empty() {
        anyhow::bail!("resource name may not be empty in {text:?}");
    }
    match kind.to_ascii_lowercase().as_str() {
        "job" | "jobs" | "jb" => Ok(Target::Job(name.to_string())),
        "agent" | "agents" | "ag" => Ok(Target::Agent(name.to_string())),
        other => {
            anyhow::bail!("logs are kept for jobs and agents, not {other:?}: use job/NAME or agent/NAME")
        }
    }
}

/// The node whose log to print: `wanted` (an id, or a step unique among the Job's
/// nodes), else the running node, else the one that started last.
pub fn pick_node(job: &Job, wanted: Option<&str>) -> Result<String> {
    let name = &job.metadata.name;
    if let Some(wanted) = wanted {
        if job.spec.nodes.iter().any(|n| n.id == wanted) {
            return Ok(wanted.to_string());
        }
        let suffix = format!("/{wanted}");
        let matches: Vec<&str> =
            job.spec.nodes.iter().map(|n| n.id.as_str()).filter(|id| id.ends_with(&suffix)).collect();
        return match matches.as_slice() {
            [one] => Ok(one.to_string()),
            [] => anyhow::bail!("job {name} has no node {wanted:?}; its nodes are: {}", node_ids(job)),
            _ => {
                anyhow::bail!("node {wanted:?} is ambiguous in job {name}: use one of {}", matches.join(", "))
            }
        };
    }
    if let Some(running) = job.status.nodes.iter().find(|n| n.state == JobNodeState::Running) {
        return Ok(running.id.clone());
    }
    job.status
        .nodes
        .iter()
        .filter(|n| n.started_at.is_some() || matches!(n.state, JobNodeState::Done | JobNodeState::Failed))
        .max_by_key(|n| n.started_at.as_ref().map(|t| t.0))
        .map(|n| n.id.clone())
        .ok_or_else(|| {
            anyhow::anyhow!("no node of job {name} has run yet; pick one with --node ({})", node_ids(job))
        })
}

fn node_ids(job: &Job) -> String {
    job.spec.nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>().join(", ")
}

/// The log path for a target, given the node picked for a Job.
pub fn log_path(target: &Target, node: Option<&str>, follow: bool, agent: &AgentLogQuery) -> String {
    match target {
        Target::Job(name) => {
            let query = Query::default().push_opt("node", node).push("follow", follow.to_string());
            format!("/apis/hive.dev/v1/jobs/{}/log{query}", encode(name))
        }
        Target::Agent(name) => {
            let flag = |on: bool| on.then(|| "true".to_string());
            let query = Query::default()
                .push("follow", follow.to_string())
                .push_opt("tail", agent.tail.map(|n| n.to_string()))
                // Rounded up, so `--since 1500ms` still covers the whole span.
                .push_opt("sinceSeconds", agent.since.map(|d| d.as_secs_f64().ceil().max(1.0).to_string()))
                .push_opt(
                    "sinceTime",
                    agent.since_time.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
                )
                .push_opt("timestamps", flag(agent.timestamps))
                .push_opt("previous", flag(agent.previous));
            format!("/apis/hive.dev/v1/agents/{}/log{query}", encode(name))
        }
    }
}

/// Runs `hive logs`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let target = parse_target(&args.object)?;
    let client = ctx.client()?;
    let node = match &target {
        Target::Job(name) => {
            if let Some(flag) = AgentLogQuery::of(&args).given().first() {
                anyhow::bail!(
                    "{flag} applies to agent logs; a node's build log is printed whole, without times"
                );
            }
            let job = client.get(&format!("/apis/hive.dev/v1/jobs/{}", encode(name))).await?;
            let job: Job = serde_json::from_value(job).context("the server sent a malformed Job")?;
            Some(pick_node(&job, args.node.as_deref())?)
        }
        Target::Agent(_) => {
            if args.node.is_some() {
                anyhow::bail!("--node applies to job logs");
            }
            None
        }
    };
    let path = log_path(&target, node.as_deref(), args.follow, &AgentLogQuery::of(&args));
    let mut stream = client.stream(&path).await?;
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = stream.next().await? {
        out.write_all(&chunk)?;
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn job() -> Job {
        serde_json::from_value(json!({
            "metadata": {"name": "restart-1"},
            "spec": {"template": "Restart", "nodes": [
                {"id": "a/set-wanted", "kind": "SetWanted", "agent": "a"},
                {"id": "a/reconcile", "kind": "Reconcile", "agent": "a"},
                {"id": "b/set-wanted", "kind": "SetWanted", "agent": "b"},
                {"id": "b/reconcile", "kind": "Reconcile", "agent": "b"},
            ]},
            "status": {"nodes": [
                {"id": "a/set-wanted", "state": "Done", "startedAt": "2026-01-01T00:00:00Z"},
                {"id": "a/reconcile", "state": "Done", "startedAt": "2026-01-01T00:00:02Z"},
                {"id": "b/set-wanted", "state": "Done", "startedAt": "2026-01-01T00:00:01Z"},
            ]},
        }))
        .unwrap()
    }

    #[test]
    fn targets_parse() {
        assert_eq!(parse_target("job/x").unwrap(), Target::Job("x".into()));
        assert_eq!(parse_target("ag/y").unwrap(), Target::Agent("y".into()));
        assert!(parse_target("x").unwrap_err().to_string().contains("job/NAME"));
        assert!(parse_target("node/x").unwrap_err().to_string().contains("not \"node\""));
        assert!(parse_target("job/").is_err());
    }

    #[test]
    fn default_node_is_the_running_one_else_the_last_started() {
        let mut j = job();
        assert_eq!(pick_node(&j, None).unwrap(), "a/reconcile");
        j.status.nodes[2].state = JobNodeState::Running;
        assert_eq!(pick_node(&j, None).unwrap(), "b/set-wanted");
        j.status.nodes.clear();
        assert!(pick_node(&j, None).unwrap_err().to_string().contains("--node"));
    }

    #[test]
    fn node_by_id_or_unique_step() {
        let j = job();
        assert_eq!(pick_node(&j, Some("b/reconcile")).unwrap(), "b/reconcile");
        assert!(pick_node(&j, Some("reconcile")).unwrap_err().to_string().contains("ambiguous"));
        assert!(pick_node(&j, Some("drain")).unwrap_err().to_string().contains("has no node"));
    }

    #[test]
    fn paths_carry_node_follow_and_tail() {
        assert_eq!(
            log_path(&Target::Job("j".into()), Some("a/drain"), true, &AgentLogQuery::default()),
            "/apis/hive.dev/v1/jobs/j/log?node=a%2Fdrain&follow=true"
        );
        let none = AgentLogQuery::default();
        assert_eq!(
            log_path(&Target::Job("j".into()), Some("a/drain"), false, &none),
            "/apis/hive.dev/v1/jobs/j/log?node=a%2Fdrain&follow=false"
        );
        let tail = AgentLogQuery { tail: Some(10), ..none.clone() };
        assert_eq!(
            log_path(&Target::Agent("a".into()), None, false, &tail),
            "/apis/hive.dev/v1/agents/a/log?follow=false&tail=10"
        );
    }

    #[test]
    fn agent_paths_carry_since_timestamps_and_previous() {
        let agent = Target::Agent("a".into());
        let since = AgentLogQuery {
            since: Some(std::time::Duration::from_millis(600_500)),
            timestamps: true,
            previous: true,
            ..AgentLogQuery::default()
        };
        assert_eq!(
            log_path(&agent, None, false, &since),
            "/apis/hive.dev/v1/agents/a/log?follow=false&sinceSeconds=601&timestamps=true&previous=true"
        );
        let at = parse_time("2026-12-01T18:00:00+01:00").unwrap();
        let since_time = AgentLogQuery { since_time: Some(at), ..AgentLogQuery::default() };
        assert_eq!(
            log_path(&agent, None, true, &since_time),
            "/apis/hive.dev/v1/agents/a/log?follow=true&sinceTime=2026-12-01T17%3A00%3A00Z"
        );
        assert!(parse_time("10m").unwrap_err().contains("RFC 3339"));
    }
}
