//! `hive jobs [--agent A] [--phase P] [-w]`: the queue and the history as one table,
//! like the dashboard's queue card — queued and running Jobs first in submit order, then
//! finished ones, newest first — with nodes done of total and the running node's step;
//! only the Jobs that touch agent A and are in phase P when asked. `-w` then prints a
//! row each time a Job (that matches) changes.

use std::time::Duration;

use anyhow::{Context as _, Result};
use chrono::{DateTime, Utc};
use hive_api::job::{JobNodeState, JobPhase};
use hive_api::{Job, JobList};

use super::client::{self, Query, JSON};
use super::{output, progress, Context};

const JOBS: &str = "/apis/hive.dev/v1/jobs";

/// List the job queue and history.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive jobs
  hive jobs --agent hello --phase Failed   # what failed on hello
  hive jobs -w          # then one row per change
  hive get jobs -o yaml # the full objects")]
pub struct Args {
    /// Only the Jobs with a node acting on this agent.
    #[arg(long, value_name = "AGENT")]
    pub agent: Option<String>,

    /// Only the Jobs in this phase: Queued, Running, Done, Failed, Cancelled or
    /// Interrupted (any case).
    #[arg(long, value_name = "PHASE", value_parser = parse_phase)]
    pub phase: Option<JobPhase>,

    /// After the table, print a row each time a Job changes.
    #[arg(short, long)]
    pub watch: bool,

    /// Leave out the header line.
    #[arg(long)]
    pub no_headers: bool,
}

/// Every phase `--phase` takes.
const PHASES: [JobPhase; 6] = [
    JobPhase::Queued,
    JobPhase::Running,
    JobPhase::Done,
    JobPhase::Failed,
    JobPhase::Cancelled,
    JobPhase::Interrupted,
];

fn parse_phase(text: &str) -> Result<JobPhase, String> {
    PHASES.into_iter().find(|p| p.as_str().eq_ignore_ascii_case(text.trim())).ok_or_else(|| {
        let names: Vec<&str> = PHASES.iter().map(|p| p.as_str()).collect();
        format!("{text:?} is not a Job phase: one of {}", names.join(", "))
    })
}

/// Which Jobs `hive jobs` shows.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only those with a node acting on this agent (or naming it in `spec.agents`).
    pub agent: Option<String>,
    /// Only those in this phase, as the CLI reads it ([`progress::phase`]).
    pub phase: Option<JobPhase>,
}

impl Filter {
    /// Whether `job` is shown.
    pub fn matches(&self, job: &Job) -> bool {
        let agent_ok = self.agent.as_deref().is_none_or(|agent| {
            job.spec.agents.iter().any(|a| a == agent)
                || job.spec.nodes.iter().any(|n| n.agent.as_deref() == Some(agent))
        });
        agent_ok && self.phase.is_none_or(|phase| progress::phase(job) == phase)
    }

    fn is_empty(&self) -> bool {
        self.agent.is_none() && self.phase.is_none()
    }
}

/// The column headers.
pub const HEADERS: [&str; 7] = ["NAME", "TEMPLATE", "PHASE", "NODES", "AGENTS", "AGE", "STEP"];

/// The queue first (submit order), then the history (most recently finished first).
pub fn sort(jobs: &mut [Job]) {
    let submitted =
        |j: &Job| j.status.submitted_at.as_ref().or(j.metadata.creation_timestamp.as_ref()).map(|t| t.0);
    jobs.sort_by(|a, b| {
        let (ta, tb) = (progress::is_terminal(a), progress::is_terminal(b));
        ta.cmp(&tb).then_with(|| {
            if ta {
                let finished = |j: &Job| j.status.finished_at.as_ref().map(|t| t.0).or(submitted(j));
                finished(b).cmp(&finished(a))
            } else {
                submitted(a).cmp(&submitted(b))
            }
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        })
    });
}

/// One Job's cells.
pub fn row(job: &Job, now: DateTime<Utc>) -> Vec<String> {
    let total = job.spec.nodes.len();
    let done = job.status.nodes.iter().filter(|n| n.state == JobNodeState::Done).count();
    let phase = progress::phase(job);
    let agents = progress::agents(job);
    let step = job
        .status
        .nodes
        .iter()
        .filter(|n| n.state == JobNodeState::Running)
        .map(|n| match n.step.as_deref() {
            Some(step) if !step.is_empty() => format!("{}: {step}", n.id),
            _ => n.id.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let step = match (step.is_empty(), phase) {
        (true, JobPhase::Interrupted) => job.status.message.clone().unwrap_or_default(),
        (true, _) => String::new(),
        (false, _) => step,
    };
    let created = job.metadata.creation_timestamp.as_ref().map(|t| t.0.to_rfc3339());
    vec![
        job.metadata.name.clone(),
        job.spec.template.as_str().to_string(),
        format!("{} {}", progress::phase_glyph(Some(phase)), phase.as_str()),
        format!("{done}/{total}"),
        if agents.is_empty() { "<none>".into() } else { agents.join(",") },
        output::age(created.as_deref(), now),
        step,
    ]
}

/// The whole table, aligned; `widths` is kept for rows printed later by `-w`.
pub fn render(jobs: &[Job], now: DateTime<Utc>, headers: bool, widths: &mut Vec<usize>) -> String {
    let mut lines: Vec<Vec<String>> = Vec::new();
    if headers {
        lines.push(HEADERS.iter().map(|h| h.to_string()).collect());
    }
    lines.extend(jobs.iter().map(|j| row(j, now)));
    // An empty STEP cell would leave the padding of the column before it.
    output::align(&lines, widths).lines().map(|l| format!("{}\n", l.trim_end())).collect()
}

async fn list(client: &client::Client) -> Result<JobList> {
    let body = client.get(JOBS).await?;
    serde_json::from_value(body).context("the server sent a malformed JobList")
}

/// Runs `hive jobs`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let client = ctx.client()?;
    let filter = Filter { agent: args.agent.clone(), phase: args.phase };
    let mut widths = Vec::new();
    let mut headers = !args.no_headers;
    loop {
        let mut jobs = list(&client).await?;
        jobs.items.retain(|j| filter.matches(j));
        sort(&mut jobs.items);
        if jobs.items.is_empty() && !args.watch {
            output::eprint_line(if filter.is_empty() { "No jobs found." } else { "No jobs match." });
            return Ok(());
        }
        output::print(&render(&jobs.items, crate::host::now(), headers, &mut widths))?;
        headers = false;
        if !args.watch {
            return Ok(());
        }
        let mut resource_version = jobs.metadata.resource_version.clone();
        'watch: loop {
            let query = Query::default()
                .push_opt("resourceVersion", resource_version.as_deref())
                .push("allowWatchBookmarks", "true")
                .push("watch", "true");
            let mut stream = match client.watch(&format!("{JOBS}{query}"), JSON).await {
                Ok(stream) => stream,
                Err(e) if client::api_error(&e).is_some_and(|a| a.code() == 410) => break 'watch,
                Err(e) => return Err(e),
            };
            while let Some(event) = stream.next().await? {
                if let Some(rv) = event.object.pointer("/metadata/resourceVersion").and_then(|v| v.as_str()) {
                    resource_version = Some(rv.to_string());
                }
                match event.type_.as_str() {
                    "ADDED" | "MODIFIED" => {
                        let job: Job =
                            serde_json::from_value(event.object).context("malformed Job in watch")?;
                        // A Job that left the filter (a phase moved on) prints nothing more.
                        if !filter.matches(&job) {
                            continue;
                        }
                        output::print(&render(
                            std::slice::from_ref(&job),
                            crate::host::now(),
                            false,
                            &mut widths,
                        ))?;
                    }
                    "ERROR" => {
                        let err = client::event_error(&event);
                        if err.code() == 410 {
                            break 'watch;
                        }
                        return Err(err.into());
                    }
                    // History removals and bookmarks print nothing.
                    _ => {}
                }
            }
            // The server closed the stream: resume where it stopped.
            continue 'watch;
        }
        // Too old to resume: list again, as kubectl does after a 410.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn job(value: serde_json::Value) -> Job {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn table_lists_queue_then_history() {
        let now: DateTime<Utc> = "2026-01-01T01:00:00Z".parse().unwrap();
        let mut jobs = vec![
            job(json!({
                "metadata": {"name": "stop-old", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"template": "Stop", "nodes": [
                    {"id": "a/set-wanted", "kind": "SetWanted", "agent": "a"},
                    {"id": "a/reconcile", "kind": "Reconcile", "agent": "a"}]},
                "status": {"phase": "Done", "finishedAt": "2026-01-01T00:00:05Z", "nodes": [
                    {"id": "a/set-wanted", "state": "Done"}, {"id": "a/reconcile", "state": "Done"}]},
            })),
            job(json!({
                "metadata": {"name": "rebuild-b", "creationTimestamp": "2026-01-01T00:59:00Z"},
                "spec": {"template": "Rebuild", "nodes": [
                    {"id": "b/prebuild", "kind": "Prebuild", "agent": "b"},
                    {"id": "b/swap", "kind": "Swap", "agent": "b"}]},
                "status": {"phase": "Running", "submittedAt": "2026-01-01T00:59:00Z", "nodes": [
                    {"id": "b/prebuild", "state": "Running", "step": "building toplevel"}]},
            })),
            job(json!({
                "metadata": {"name": "restart-ab", "creationTimestamp": "2026-01-01T00:59:30Z"},
                "spec": {"template": "Restart", "nodes": [
                    {"id": "a/set-wanted", "kind": "SetWanted", "agent": "a"},
                    {"id": "b/set-wanted", "kind": "SetWanted", "agent": "b"}]},
            })),
            job(json!({
                "metadata": {"name": "kill-a", "creationTimestamp": "2026-01-01T00:30:00Z"},
                "spec": {"template": "Kill", "nodes": [{"id": "a/set-wanted", "kind": "SetWanted", "agent": "a"}]},
                "status": {"phase": "Failed", "finishedAt": "2026-01-01T00:30:01Z", "nodes": [
                    {"id": "a/set-wanted", "state": "Failed", "error": "boom"}]},
            })),
            job(json!({
                "metadata": {"name": "start-a", "creationTimestamp": "2026-01-01T00:10:00Z"},
                "spec": {"template": "Start", "nodes": [{"id": "a/set-wanted", "kind": "SetWanted", "agent": "a"}]},
                "status": {"phase": "Interrupted", "message": "the daemon restarted", "finishedAt": "2026-01-01T00:20:00Z"},
            })),
        ];
        sort(&mut jobs);
        insta::assert_snapshot!(render(&jobs, now, true, &mut Vec::new()));

        // --agent and --phase: the Jobs that touch the agent, in the phase.
        let shown = |filter: Filter| -> Vec<String> {
            jobs.iter().filter(|j| filter.matches(j)).map(|j| j.metadata.name.clone()).collect()
        };
        let agent = |a: &str| Some(a.to_string());
        assert_eq!(shown(Filter { agent: agent("b"), phase: None }), ["rebuild-b", "restart-ab"]);
        assert_eq!(shown(Filter { agent: agent("a"), phase: Some(JobPhase::Failed) }), ["kill-a"]);
        assert_eq!(shown(Filter { agent: None, phase: Some(JobPhase::Queued) }), ["restart-ab"]);
        assert!(shown(Filter { agent: agent("nobody"), phase: None }).is_empty());
        assert_eq!(parse_phase("failed"), Ok(JobPhase::Failed));
        assert!(parse_phase("Broken").unwrap_err().contains("one of Queued, Running, Done, Failed"));
    }
}
