//! Progress of submitted Jobs: a DAG's line (the roll-up glyph, the template, each
//! agent's node chain with the running node's step label, fan-out children indented
//! under their parent; MCP's view), the chains and groups the board builds on, and the
//! failures. Pure (Jobs in, text out); [`Screen`] turns successive frames into terminal
//! output, in place on a TTY and as plain changed lines otherwise; the power verbs'
//! lines are [`super::board`]'s, one per agent, on a TTY or not.

use std::collections::{BTreeMap, BTreeSet};

use hive_api::job::{JobNode, JobNodeState, JobPhase};
use hive_api::Job;

/// The glyph of a Job's roll-up phase (`None`: not reported yet, i.e. queued).
pub fn phase_glyph(phase: Option<JobPhase>) -> &'static str {
    match phase {
        None | Some(JobPhase::Queued) => "·",
        Some(JobPhase::Running) => "⟳",
        Some(JobPhase::Done) => "✓",
        Some(JobPhase::Failed) => "✗",
        Some(JobPhase::Cancelled) => "⊘",
        Some(JobPhase::Interrupted) => "!",
    }
}

/// The glyph of one node's state.
pub fn node_glyph(state: JobNodeState) -> &'static str {
    match state {
        JobNodeState::Queued => "·",
        JobNodeState::Running => "⟳",
        JobNodeState::Done => "✓",
        JobNodeState::Failed => "✗",
        JobNodeState::Cancelled => "⊘",
    }
}

/// The phase of a Job as the CLI reads it: the reported one, else the roll-up of the
/// node states (a Job the scheduler has not reported on yet is queued).
pub fn phase(job: &Job) -> JobPhase {
    match job.status.phase {
        Some(phase) => phase,
        None if job.status.nodes.is_empty() => JobPhase::Queued,
        None => JobPhase::roll_up(job.status.nodes.iter().map(|n| n.state)),
    }
}

/// Whether the Job will not change any more: a terminal phase and, for a `Failed` one,
/// every node terminal (a failed Swap's AfterAny Reconcile still runs under `Failed`).
pub fn is_terminal(job: &Job) -> bool {
    let mut status = job.status.clone();
    status.phase = Some(phase(job));
    status.settled()
}

/// The state of a node (`Queued` until the scheduler reports it).
pub fn node_state(job: &Job, id: &str) -> JobNodeState {
    job.status.node(id).map(|n| n.state).unwrap_or_default()
}

/// The agents a Job's nodes act on, in node order, without repeats.
pub fn agents(job: &Job) -> Vec<String> {
    let mut seen = BTreeSet::new();
    job.spec.nodes.iter().filter_map(|n| n.agent.clone()).filter(|a| seen.insert(a.clone())).collect()
}

/// A node's label in a chain: its id without the `<agent>/` prefix.
fn node_label(node: &JobNode) -> &str {
    match &node.agent {
        Some(agent) => {
            node.id.strip_prefix(agent.as_str()).and_then(|r| r.strip_prefix('/')).unwrap_or(&node.id)
        }
        None => &node.id,
    }
}

/// The node chain `set-wanted ✓ → drain ⟳ waiting… → reconcile ·` of `nodes` (one agent's, or
/// the agent-less ones) in `job`.
pub fn chain(job: &Job, nodes: &[&JobNode]) -> String {
    nodes
        .iter()
        .map(|node| {
            let state = node_state(job, &node.id);
            let mut text = format!("{} {}", node_label(node), node_glyph(state));
            if state == JobNodeState::Running {
                if let Some(step) = job.status.node(&node.id).and_then(|n| n.step.as_deref()) {
                    if !step.is_empty() {
                        text.push(' ');
                        text.push_str(step);
                    }
                }
            }
            text
        })
        .collect::<Vec<_>>()
        .join(" → ")
}

/// One DAG's progress line (without children), e.g.
/// `⟳ Stop alpha: set-wanted ✓ → drain ⟳ waiting for the harness… → reconcile ·`.
/// A Job's nodes grouped per agent, in node order; the agent-less chain (a MetaLock)
/// first.
pub fn by_agent(job: &Job) -> Vec<(Option<&str>, Vec<&JobNode>)> {
    let mut groups: Vec<(Option<&str>, Vec<&JobNode>)> = Vec::new();
    for node in &job.spec.nodes {
        let key = node.agent.as_deref();
        match groups.iter_mut().find(|(agent, _)| *agent == key) {
            Some((_, nodes)) => nodes.push(node),
            None => groups.push((key, vec![node])),
        }
    }
    groups.sort_by_key(|(agent, _)| agent.is_some());
    groups
}

/// A DAG spanning agents shows one chain per agent, separated by ` | `; nodes acting on
/// no agent (a MetaLock) form a chain of their own, first.
pub fn line(job: &Job) -> String {
    let groups = by_agent(job);
    let parts: Vec<String> = groups
        .iter()
        .map(|(agent, nodes)| match agent {
            None => chain(job, nodes),
            Some(agent) => format!("{agent}: {}", chain(job, nodes)),
        })
        .collect();
    let head = format!("{} {}", phase_glyph(Some(phase(job))), job.spec.template.as_str());
    if parts.is_empty() {
        let message = job.status.message.as_deref().unwrap_or("no nodes");
        return format!("{head} {}: {message}", job.metadata.name);
    }
    let mut text = format!("{head} {}", parts.join(" | "));
    if phase(job) == JobPhase::Interrupted {
        if let Some(message) = &job.status.message {
            text.push_str(&format!(" ({message})"));
        }
    }
    text
}

/// The Jobs of the tree rooted at `root` (the root first, then each child under its
/// parent, depth first, in submit order): children are found through `status.children`
/// and through `spec.parent`, whichever the server reported first.
pub fn tree<'a>(root: &str, jobs: &'a [Job]) -> Vec<(usize, &'a Job)> {
    let by_name: BTreeMap<&str, &Job> = jobs.iter().map(|j| (j.metadata.name.as_str(), j)).collect();
    let mut out = Vec::new();
    let mut visited = BTreeSet::new();
    walk(root, 0, &by_name, jobs, &mut visited, &mut out);
    out
}

fn walk<'a>(
    name: &str,
    depth: usize,
    by_name: &BTreeMap<&str, &'a Job>,
    jobs: &'a [Job],
    visited: &mut BTreeSet<String>,
    out: &mut Vec<(usize, &'a Job)>,
) {
    let Some(job) = by_name.get(name) else { return };
    if !visited.insert(name.to_string()) {
        return;
    }
    out.push((depth, job));
    let mut children: Vec<&str> = job.status.children.iter().map(String::as_str).collect();
    for other in jobs {
        let name = other.metadata.name.as_str();
        if other.spec.parent.as_deref() == Some(job.metadata.name.as_str()) && !children.contains(&name) {
            children.push(name);
        }
    }
    for child in children {
        walk(child, depth + 1, by_name, jobs, visited, out);
    }
}

/// The progress lines of the tree rooted at `root`: one per DAG, children indented
/// under their parent with `↳`.
pub fn frame(root: &str, jobs: &[Job]) -> Vec<String> {
    tree(root, jobs)
        .into_iter()
        .map(|(depth, job)| match depth {
            0 => line(job),
            d => format!("{}↳ {}", "  ".repeat(d), line(job)),
        })
        .collect()
}

/// What went wrong in a finished tree, one line each: every failed node's error, and
/// every cancelled or interrupted DAG. Empty when every DAG is done.
pub fn failures(root: &str, jobs: &[Job]) -> Vec<String> {
    let mut out = Vec::new();
    for (_, job) in tree(root, jobs) {
        let name = &job.metadata.name;
        let template = job.spec.template.as_str();
        match phase(job) {
            JobPhase::Done | JobPhase::Queued | JobPhase::Running => {}
            JobPhase::Failed => {
                let mut any = false;
                for node in &job.status.nodes {
                    if node.state == JobNodeState::Failed {
                        any = true;
                        let error = node.error.as_deref().unwrap_or("failed without an error message");
                        out.push(format!("job {name} ({template}) failed: node {}: {error}", node.id));
                    }
                }
                if !any {
                    let message = job.status.message.as_deref().unwrap_or("no failed node reported");
                    out.push(format!("job {name} ({template}) failed: {message}"));
                }
            }
            JobPhase::Cancelled => out.push(format!("job {name} ({template}) was cancelled")),
            JobPhase::Interrupted => {
                let message = job.status.message.as_deref().unwrap_or("the daemon restarted");
                out.push(format!("job {name} ({template}) was interrupted: {message}"));
            }
        }
    }
    out
}

/// Turns successive frames into terminal output. On a TTY, the whole block is redrawn
/// in place (cursor up, clear each line); the caller cuts each line to the terminal's
/// width ([`super::board::lines`]), so every line is one row and the cursor arithmetic
/// holds. Otherwise a line the previous frame did not have is printed, so logs and
/// pipes get one line per agent change ([`super::board::plain`]).
#[derive(Debug, Default)]
pub struct Screen {
    tty: bool,
    previous: Vec<String>,
}

impl Screen {
    /// A screen for a terminal (`tty`) or a pipe.
    pub fn new(tty: bool) -> Screen {
        Screen { tty, previous: Vec::new() }
    }

    /// The bytes that bring the output from the previous frame to `lines`; empty when
    /// nothing changed. The lines' own control characters are escaped here
    /// ([`super::terminal::escape_controls`]), so the only controls in the answer are the
    /// screen's own cursor moves, and the caller prints it with
    /// [`super::output::print_screen`].
    pub fn update(&mut self, lines: &[String]) -> String {
        if lines == self.previous.as_slice() {
            return String::new();
        }
        let mut out = String::new();
        if self.tty {
            if !self.previous.is_empty() {
                out.push_str(&format!("\x1b[{}A", self.previous.len()));
            }
            for line in lines {
                out.push_str("\r\x1b[2K");
                out.push_str(&super::terminal::escape_controls(line));
                out.push('\n');
            }
            if lines.len() < self.previous.len() {
                // A DAG left the tree (pruned from the history): clear what is below.
                out.push_str("\x1b[J");
            }
        } else {
            // A line is printed when the previous frame did not have it: a line stands
            // for one agent's part, so this is one line per change, wherever a new line
            // (a fan-out child) lands in the frame.
            for line in lines {
                if !self.previous.contains(line) {
                    out.push_str(&super::terminal::escape_controls(line.trim_start()));
                    out.push('\n');
                }
            }
        }
        self.previous = lines.to_vec();
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn job(value: Value) -> Job {
        serde_json::from_value(value).expect("a Job")
    }

    fn stop_job(status: Value) -> Job {
        job(json!({
            "apiVersion": "hive.dev/v1", "kind": "Job",
            "metadata": {"name": "stop-1a2b3c4d"},
            "spec": {"template": "Stop", "source": "Cli", "nodes": [
                {"id": "alpha/set-wanted", "kind": "SetWanted", "agent": "alpha"},
                {"id": "alpha/signal", "kind": "Signal", "agent": "alpha", "deps": [{"node": "alpha/set-wanted"}]},
                {"id": "alpha/drain", "kind": "Drain", "agent": "alpha", "deps": [{"node": "alpha/signal"}]},
                {"id": "alpha/reconcile", "kind": "Reconcile", "agent": "alpha", "deps": [{"node": "alpha/drain"}]},
            ]},
            "status": status,
        }))
    }

    fn two_agent_restart(status: Value) -> Job {
        job(json!({
            "metadata": {"name": "restart-77"},
            "spec": {"template": "Restart", "nodes": [
                {"id": "alpha/set-wanted", "kind": "SetWanted", "agent": "alpha"},
                {"id": "beta/set-wanted", "kind": "SetWanted", "agent": "beta"},
                {"id": "alpha/reconcile", "kind": "Reconcile", "agent": "alpha", "deps": [{"node": "alpha/set-wanted"}]},
                {"id": "beta/reconcile", "kind": "Reconcile", "agent": "beta", "deps": [{"node": "beta/set-wanted"}]},
            ]},
            "status": status,
        }))
    }

    fn meta_update(status: Value) -> Job {
        job(json!({
            "metadata": {"name": "metaupdate-1"},
            "spec": {"template": "MetaUpdate", "nodes": [{"id": "meta-lock", "kind": "MetaLock"}]},
            "status": status,
        }))
    }

    fn rebuild_child(name: &str, agent: &str, status: Value) -> Job {
        job(json!({
            "metadata": {"name": name},
            "spec": {"template": "Rebuild", "parent": "metaupdate-1", "nodes": [
                {"id": format!("{agent}/prebuild"), "kind": "Prebuild", "agent": agent},
                {"id": format!("{agent}/swap"), "kind": "Swap", "agent": agent},
                {"id": format!("{agent}/reconcile"), "kind": "Reconcile", "agent": agent},
            ]},
            "status": status,
        }))
    }

    fn frames(cases: &[(&str, Vec<Job>)]) -> String {
        cases
            .iter()
            .map(|(title, jobs)| {
                let root = &jobs[0].metadata.name;
                format!("# {title}\n{}\n", frame(root, jobs).join("\n"))
            })
            .collect()
    }

    #[test]
    fn progress_lines() {
        let running_stop = stop_job(json!({"phase": "Running", "nodes": [
            {"id": "alpha/set-wanted", "state": "Done"},
            {"id": "alpha/signal", "state": "Done"},
            {"id": "alpha/drain", "state": "Running", "step": "waiting for the harness…"},
        ]}));
        let failed_stop = stop_job(json!({"phase": "Failed", "nodes": [
            {"id": "alpha/set-wanted", "state": "Done"},
            {"id": "alpha/signal", "state": "Failed", "error": "fence: permission denied"},
            {"id": "alpha/drain", "state": "Cancelled", "error": "dep alpha/signal failed"},
            {"id": "alpha/reconcile", "state": "Cancelled", "error": "dep alpha/drain cancelled"},
        ]}));
        let cases = vec![
            ("queued, never reported", vec![stop_job(json!({}))]),
            ("running, with the running node's step", vec![running_stop]),
            ("failed", vec![failed_stop]),
            (
                "done, two agents",
                vec![two_agent_restart(json!({"phase": "Done", "nodes": [
                    {"id": "alpha/set-wanted", "state": "Done"}, {"id": "beta/set-wanted", "state": "Done"},
                    {"id": "alpha/reconcile", "state": "Done"}, {"id": "beta/reconcile", "state": "Done"},
                ]}))],
            ),
            (
                "running, two agents",
                vec![two_agent_restart(json!({"phase": "Running", "nodes": [
                    {"id": "alpha/set-wanted", "state": "Done"}, {"id": "beta/set-wanted", "state": "Done"},
                    {"id": "alpha/reconcile", "state": "Running", "step": "starting"},
                ]}))],
            ),
            (
                "cancelled while queued",
                vec![stop_job(json!({"phase": "Cancelled", "nodes": [
                    {"id": "alpha/set-wanted", "state": "Cancelled"}, {"id": "alpha/signal", "state": "Cancelled"},
                    {"id": "alpha/drain", "state": "Cancelled"}, {"id": "alpha/reconcile", "state": "Cancelled"},
                ]}))],
            ),
            (
                "interrupted",
                vec![stop_job(json!({"phase": "Interrupted", "message": "the daemon restarted", "nodes": [
                    {"id": "alpha/set-wanted", "state": "Done"},
                    {"id": "alpha/signal", "state": "Running"},
                ]}))],
            ),
            (
                "fan-out: children joining, one running, one queued",
                vec![
                    meta_update(json!({"phase": "Done", "children": ["rebuild-b"],
                        "nodes": [{"id": "meta-lock", "state": "Done"}]})),
                    rebuild_child(
                        "rebuild-b",
                        "beta",
                        json!({"phase": "Running", "nodes": [
                            {"id": "beta/prebuild", "state": "Running", "step": "building toplevel"},
                        ]}),
                    ),
                    // Known only through spec.parent so far.
                    rebuild_child("rebuild-c", "gamma", json!({})),
                    // Unrelated Jobs stay out.
                    stop_job(json!({"phase": "Done"})),
                ],
            ),
            (
                "fan-out: a child failed",
                vec![
                    meta_update(json!({"phase": "Done", "children": ["rebuild-b"],
                        "nodes": [{"id": "meta-lock", "state": "Done"}]})),
                    rebuild_child(
                        "rebuild-b",
                        "beta",
                        json!({"phase": "Failed", "nodes": [
                            {"id": "beta/prebuild", "state": "Failed", "error": "build exited with status 1"},
                            {"id": "beta/swap", "state": "Cancelled"},
                            {"id": "beta/reconcile", "state": "Done"},
                        ]}),
                    ),
                ],
            ),
        ];
        insta::assert_snapshot!(frames(&cases));
    }

    #[test]
    fn failures_name_failed_nodes_cancelled_and_interrupted_jobs() {
        let failed = stop_job(json!({"phase": "Failed", "nodes": [
            {"id": "alpha/set-wanted", "state": "Done"},
            {"id": "alpha/signal", "state": "Failed", "error": "fence: permission denied"},
            {"id": "alpha/drain", "state": "Cancelled", "error": "dep alpha/signal failed"},
        ]}));
        assert_eq!(
            failures("stop-1a2b3c4d", &[failed]),
            vec!["job stop-1a2b3c4d (Stop) failed: node alpha/signal: fence: permission denied"]
        );
        let cancelled = stop_job(json!({"phase": "Cancelled"}));
        assert_eq!(failures("stop-1a2b3c4d", &[cancelled]), vec!["job stop-1a2b3c4d (Stop) was cancelled"]);
        let interrupted = stop_job(json!({"phase": "Interrupted", "message": "daemon restarted"}));
        assert_eq!(
            failures("stop-1a2b3c4d", &[interrupted]),
            vec!["job stop-1a2b3c4d (Stop) was interrupted: daemon restarted"]
        );
        assert!(failures("stop-1a2b3c4d", &[stop_job(json!({"phase": "Done"}))]).is_empty());
    }

    #[test]
    fn phase_falls_back_to_the_node_roll_up() {
        assert_eq!(phase(&stop_job(json!({}))), JobPhase::Queued);
        let job = stop_job(json!({"nodes": [{"id": "alpha/set-wanted", "state": "Running"}]}));
        assert_eq!(phase(&job), JobPhase::Running);
    }

    /// Control sequences made visible, so the snapshot shows what the terminal gets.
    fn visible(text: &str) -> String {
        text.replace('\x1b', "⎋").replace('\r', "⏎")
    }

    #[test]
    fn screen_plain_and_tty() {
        let steps: Vec<Vec<String>> = vec![
            vec!["· Stop alpha: set-wanted · → reconcile ·".into()],
            vec!["· Stop alpha: set-wanted · → reconcile ·".into()],
            vec!["⟳ Stop alpha: set-wanted ⟳ → reconcile ·".into()],
            vec!["⟳ MetaUpdate meta-lock ✓".into(), "  ↳ · Rebuild beta: prebuild ·".into()],
            vec!["✓ MetaUpdate meta-lock ✓".into(), "  ↳ · Rebuild beta: prebuild ·".into()],
        ];
        let mut out = String::new();
        for tty in [false, true] {
            out.push_str(&format!("# tty: {tty}\n"));
            let mut screen = Screen::new(tty);
            for (i, lines) in steps.iter().enumerate() {
                out.push_str(&format!("-- frame {i}\n{}", visible(&screen.update(lines))));
            }
        }
        insta::assert_snapshot!(out);
    }

    #[test]
    fn screen_clears_lines_that_went_away() {
        let mut screen = Screen::new(true);
        screen.update(&["a".to_string(), "b".to_string()]);
        assert_eq!(visible(&screen.update(&["c".to_string()])), "⎋[2A⏎⎋[2Kc\n⎋[J");
    }
}
