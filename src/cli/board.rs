//! The progress board a power verb draws: on a terminal, one line per agent of every DAG
//! in the Job tree (its state glyph, the template, the agent, the time it has taken, and
//! its node chain), each cut to the terminal's width so the block never wraps and can be
//! redrawn in place, and the summary printed when the tree is done
//! (`5/6 done, 1 failed: researcher`); for a pipe, the same line per agent without the
//! time or the cut ([`plain`]). Pure: Jobs and a clock reading in, lines out.

use chrono::{DateTime, Utc};
use hive_api::job::JobPhase;
use hive_api::Job;

use super::{output, progress, terminal};

/// One line of the board before it is laid out.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// How deep in the fan-out tree its DAG is (0: the submitted Job).
    pub depth: usize,
    /// Where this agent's part of the DAG is.
    pub phase: JobPhase,
    /// The DAG's template, e.g. `Restart`.
    pub template: String,
    /// The agent, or `None` for the nodes acting on no agent (a MetaLock).
    pub agent: Option<String>,
    /// Seconds from its first node's start to its last node's end (or `now`); `None`
    /// before anything started.
    pub elapsed: Option<i64>,
    /// The node chain with glyphs and the running node's step.
    pub chain: String,
}

/// The rows of the tree rooted at `root`: per DAG, the agent-less chain first, then one
/// row per agent in node order.
pub fn rows(root: &str, jobs: &[Job], now: DateTime<Utc>) -> Vec<Row> {
    let mut out = Vec::new();
    for (depth, job) in progress::tree(root, jobs) {
        let groups = progress::by_agent(job);
        let job_phase = progress::phase(job);
        if groups.is_empty() {
            out.push(Row {
                depth,
                phase: job_phase,
                template: job.spec.template.as_str().to_string(),
                agent: None,
                elapsed: None,
                chain: format!(
                    "{}: {}",
                    job.metadata.name,
                    job.status.message.as_deref().unwrap_or("no nodes")
                ),
            });
        }
        for (agent, nodes) in groups {
            let states = nodes.iter().map(|n| progress::node_state(job, &n.id));
            let phase = match job_phase {
                // The daemon restarted under it: nothing of this DAG will move again.
                JobPhase::Interrupted | JobPhase::Cancelled => job_phase,
                _ if job.status.nodes.is_empty() => JobPhase::Queued,
                _ => JobPhase::roll_up(states),
            };
            let statuses: Vec<_> = nodes.iter().filter_map(|n| job.status.node(&n.id)).collect();
            let started = statuses.iter().filter_map(|s| s.started_at).map(|t| t.0).min();
            let finished = statuses.iter().filter_map(|s| s.finished_at).map(|t| t.0).max();
            let end = if phase.is_terminal() { finished.unwrap_or(now) } else { now };
            out.push(Row {
                depth,
                phase,
                template: job.spec.template.as_str().to_string(),
                agent: agent.map(str::to_string),
                elapsed: started.map(|s| (end - s).num_seconds().max(0)),
                chain: progress::chain(job, &nodes),
            });
        }
    }
    out
}

/// The board's lines: `✓ Restart alpha    12s  set-wanted ✓ → reconcile ✓`, templates
/// and agents padded to the widest, fan-out children indented with `↳`; each line cut
/// with `…` to `width - 1` columns (a line filling the last column would leave the cursor
/// in the terminal's pending-wrap state, and redrawing in place counts on one row per
/// line).
pub fn lines(root: &str, jobs: &[Job], now: DateTime<Utc>, width: usize) -> Vec<String> {
    let rows = rows(root, jobs, now);
    let template_w = rows.iter().map(|r| r.template.len()).max().unwrap_or(0);
    let agent_w = rows.iter().map(|r| r.agent.as_deref().map_or(0, terminal::text_width)).max().unwrap_or(0);
    rows.iter()
        .map(|row| {
            let indent = match row.depth {
                0 => String::new(),
                d => format!("{}↳ ", "  ".repeat(d)),
            };
            let elapsed = row.elapsed.map(output::human_duration).unwrap_or_else(|| "-".into());
            let text = format!(
                "{indent}{} {:<template_w$} {:<agent_w$} {elapsed:>6}  {}",
                progress::phase_glyph(Some(row.phase)),
                row.template,
                row.agent.as_deref().unwrap_or(""),
                row.chain,
            );
            terminal::ellipsize(&text, width.saturating_sub(1).max(1))
        })
        .collect()
}

/// The lines for a pipe or a file: one per agent of every DAG in the tree,
/// `✓ Restart alpha: set-wanted ✓ → reconcile ✓` (fan-out children after `↳ `), never
/// cut and without the ticking elapsed time, so [`super::progress::Screen`] prints a
/// line only when that agent's part changed: a CI log gets one short line per change
/// instead of every agent joined into one line per update.
pub fn plain(root: &str, jobs: &[Job], now: DateTime<Utc>) -> Vec<String> {
    rows(root, jobs, now)
        .into_iter()
        .map(|row| {
            let child = if row.depth == 0 { "" } else { "↳ " };
            let glyph = progress::phase_glyph(Some(row.phase));
            match &row.agent {
                Some(agent) => format!("{child}{glyph} {} {agent}: {}", row.template, row.chain),
                None => format!("{child}{glyph} {} {}", row.template, row.chain),
            }
        })
        .collect()
}

/// The last line: `5/6 done, 1 failed: researcher` (agents; the DAGs by template when
/// no node acts on an agent).
pub fn summary(root: &str, jobs: &[Job], now: DateTime<Utc>) -> String {
    let rows = rows(root, jobs, now);
    let mut counted: Vec<&Row> = rows.iter().filter(|r| r.agent.is_some()).collect();
    if counted.is_empty() {
        counted = rows.iter().collect();
    }
    let name = |r: &Row| r.agent.clone().unwrap_or_else(|| r.template.clone());
    let done = counted.iter().filter(|r| r.phase == JobPhase::Done).count();
    let mut text = format!("{done}/{} done", counted.len());
    for (phase, word) in [
        (JobPhase::Failed, "failed"),
        (JobPhase::Cancelled, "cancelled"),
        (JobPhase::Interrupted, "interrupted"),
        (JobPhase::Running, "running"),
        (JobPhase::Queued, "queued"),
    ] {
        let names: Vec<String> = counted.iter().filter(|r| r.phase == phase).map(|r| name(r)).collect();
        if !names.is_empty() {
            text.push_str(&format!(", {} {word}: {}", names.len(), names.join(", ")));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde_json::{json, Value};

    use super::*;

    const AGENTS: [&str; 6] =
        ["manager", "researcher", "writer", "reviewer", "scheduler-with-a-long-name", "ops"];

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 15, 0, 0).unwrap()
    }

    /// A six-agent Restart; `state(i)` gives agent i's node statuses.
    fn restart(phase: &str, state: impl Fn(usize, &str) -> Vec<Value>) -> Job {
        let mut nodes = Vec::new();
        let mut statuses = Vec::new();
        for (i, agent) in AGENTS.iter().enumerate() {
            for (n, kind) in ["set-wanted", "signal", "drain", "reconcile"].iter().enumerate() {
                let mut node = json!({"id": format!("{agent}/{kind}"), "kind": "Reconcile", "agent": agent});
                if n > 0 {
                    node["deps"] =
                        json!([{"node": format!("{agent}/{}", ["set-wanted", "signal", "drain"][n - 1])}]);
                }
                nodes.push(node);
            }
            statuses.extend(state(i, agent));
        }
        serde_json::from_value(json!({
            "metadata": {"name": "restart-6a"},
            "spec": {"template": "Restart", "nodes": nodes},
            "status": {"phase": phase, "nodes": statuses},
        }))
        .unwrap()
    }

    fn node(agent: &str, kind: &str, state: &str, started: &str, finished: Option<&str>) -> Value {
        let mut v = json!({"id": format!("{agent}/{kind}"), "state": state, "startedAt": started});
        if let Some(f) = finished {
            v["finishedAt"] = json!(f);
        }
        if state == "Running" {
            v["step"] = json!("waiting for the harness to drain its queue of pending tool calls");
        }
        if state == "Failed" {
            v["error"] = json!("exit status 1");
        }
        v
    }

    fn running() -> Job {
        restart("Running", |i, agent| match i {
            0 => ["set-wanted", "signal", "drain", "reconcile"]
                .iter()
                .map(|k| node(agent, k, "Done", "2026-11-29T14:59:00Z", Some("2026-11-29T14:59:20Z")))
                .collect(),
            1 => vec![
                node(agent, "set-wanted", "Done", "2026-11-29T14:59:00Z", Some("2026-11-29T14:59:01Z")),
                node(agent, "signal", "Failed", "2026-11-29T14:59:01Z", Some("2026-11-29T14:59:03Z")),
                node(agent, "drain", "Cancelled", "2026-11-29T14:59:03Z", Some("2026-11-29T14:59:03Z")),
                node(agent, "reconcile", "Cancelled", "2026-11-29T14:59:03Z", Some("2026-11-29T14:59:03Z")),
            ],
            5 => vec![],
            _ => vec![
                node(agent, "set-wanted", "Done", "2026-11-29T14:58:00Z", Some("2026-11-29T14:58:01Z")),
                node(agent, "signal", "Done", "2026-11-29T14:58:01Z", Some("2026-11-29T14:58:02Z")),
                node(agent, "drain", "Running", "2026-11-29T14:58:02Z", None),
            ],
        })
    }

    fn finished() -> Job {
        restart("Failed", |i, agent| {
            let end = "2026-11-29T14:59:40Z";
            if i == 1 {
                return vec![
                    node(agent, "set-wanted", "Done", "2026-11-29T14:59:00Z", Some("2026-11-29T14:59:01Z")),
                    node(agent, "signal", "Failed", "2026-11-29T14:59:01Z", Some("2026-11-29T14:59:03Z")),
                    node(agent, "drain", "Cancelled", "2026-11-29T14:59:03Z", Some("2026-11-29T14:59:03Z")),
                    node(
                        agent,
                        "reconcile",
                        "Cancelled",
                        "2026-11-29T14:59:03Z",
                        Some("2026-11-29T14:59:03Z"),
                    ),
                ];
            }
            ["set-wanted", "signal", "drain", "reconcile"]
                .iter()
                .map(|k| node(agent, k, "Done", "2026-11-29T14:59:00Z", Some(end)))
                .collect()
        })
    }

    #[test]
    fn six_agents_at_120_columns() {
        let mut out = String::new();
        for (title, job) in [("running", running()), ("finished, one failed", finished())] {
            let lines = lines("restart-6a", std::slice::from_ref(&job), now(), 120);
            for line in &lines {
                assert!(terminal::text_width(line) < 120, "{line:?} does not fit 120 columns");
            }
            assert_eq!(lines.len(), 6, "one line per agent");
            out.push_str(&format!(
                "# {title}\n{}\n{}\n",
                lines.join("\n"),
                summary("restart-6a", &[job], now())
            ));
        }
        insta::assert_snapshot!(out);
    }

    /// Regression (issue 32): without a terminal, each update joined every agent into
    /// one line (over 1,000 characters for eight agents).
    #[test]
    fn without_a_terminal_each_agent_has_a_line_of_its_own() {
        let mut out = String::new();
        for (title, job) in [("running", running()), ("finished, one failed", finished())] {
            let lines = plain("restart-6a", std::slice::from_ref(&job), now());
            assert_eq!(lines.len(), AGENTS.len(), "one line per agent: {lines:#?}");
            for (line, agent) in lines.iter().zip(AGENTS) {
                assert!(line.contains(&format!(" Restart {agent}: ")), "{line}");
                assert!(!line.contains(" | "), "{line}");
            }
            out.push_str(&format!("# {title}\n{}\n", lines.join("\n")));
        }
        // A Screen for a pipe prints only the agents whose part changed.
        let mut screen = progress::Screen::new(false);
        let first = screen.update(&plain("restart-6a", &[running()], now()));
        assert_eq!(first.lines().count(), AGENTS.len());
        let next = screen.update(&plain("restart-6a", &[finished()], now()));
        out.push_str(&format!("# printed after the first frame\n{next}"));
        insta::assert_snapshot!(out);
    }

    #[test]
    fn narrow_terminals_cut_every_line() {
        for width in [20, 40, 79] {
            for line in lines("restart-6a", &[running()], now(), width) {
                assert!(terminal::text_width(&line) < width, "{line:?} at {width}");
            }
        }
    }

    #[test]
    fn summary_names_what_did_not_finish() {
        assert_eq!(summary("restart-6a", &[finished()], now()), "5/6 done, 1 failed: researcher");
        let queued: Job = serde_json::from_value(json!({"metadata": {"name": "x"},
            "spec": {"template": "MetaUpdate", "nodes": [{"id": "meta-lock", "kind": "MetaLock"}]},
            "status": {"phase": "Done", "nodes": [{"id": "meta-lock", "state": "Done"}]}}))
        .unwrap();
        assert_eq!(summary("x", &[queued], now()), "1/1 done");
    }
}
