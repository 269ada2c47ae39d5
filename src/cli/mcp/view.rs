//! What the MCP tools answer: pure functions from the API's JSON (or typed Jobs) to a
//! compact JSON view and a one-line summary. No IO, so every shape is unit-tested.

use std::collections::BTreeMap;

use hive_api::job::JobNodeState;
use hive_api::Job;
use serde_json::{json, Map, Value};

use crate::cli::progress;

/// One tool answer: a one-line summary for a person, and compact JSON for a program.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// One line, no trailing newline.
    pub summary: String,
    /// The data, rendered compactly.
    pub data: Value,
}

/// Copies the fields of `from` named in `fields` (JSON pointers, each kept under its
/// last segment) into a new object, leaving out the absent and null ones.
fn pick(from: &Value, fields: &[&str]) -> Map<String, Value> {
    let mut out = Map::new();
    for pointer in fields {
        if let Some(value) = from.pointer(pointer).filter(|v| !v.is_null()) {
            let key = pointer.rsplit('/').next().unwrap_or(pointer);
            out.insert(key.to_string(), value.clone());
        }
    }
    out
}

fn text<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

fn items(list: &Value) -> &[Value] {
    list.get("items").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default()
}

/// The `Ready` condition of an agent: status, reason, message.
fn ready(agent: &Value) -> Option<Value> {
    let conditions = agent.pointer("/status/conditions")?.as_array()?;
    let cond = conditions.iter().find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))?;
    Some(Value::Object(pick(cond, &["/status", "/reason", "/message"])))
}

/// `GET /hive/v1/whoami`.
pub fn whoami(me: &Value) -> Reply {
    let name = text(me, "/name").unwrap_or("?");
    let role = text(me, "/role").unwrap_or("?");
    let summary = match text(me, "/agent") {
        Some(agent) => format!("token {name:?}, role {role}, bound to agent {agent:?}"),
        None => format!("token {name:?}, role {role}"),
    };
    Reply { summary, data: Value::Object(pick(me, &["/name", "/role", "/agent"])) }
}

/// One agent's row: name, wanted, observed power, applied rev, Ready, active Job, and
/// the fleet Node it is placed on (absent: it runs on the daemon's own host).
fn agent_row(agent: &Value) -> Value {
    let mut row = pick(
        agent,
        &["/metadata/name", "/status/phase", "/spec/wanted", "/status/power", "/status/appliedRev"],
    );
    // `wanted` defaults to Up when the stored spec leaves it out.
    row.entry("wanted").or_insert_with(|| json!("Up"));
    if let Some(node) = text(agent, "/spec/placement/node") {
        row.insert("node".into(), json!(node));
    }
    if let Some(ready) = ready(agent) {
        row.insert("ready".into(), ready);
    }
    if let Some(job) = agent.pointer("/status/activeJob").filter(|v| !v.is_null()) {
        row.insert("activeJob".into(), job.clone());
    }
    Value::Object(row)
}

fn agent_phrase(row: &Value) -> String {
    let name = text(row, "/name").unwrap_or("?");
    let wanted = text(row, "/wanted").unwrap_or("Up");
    let power = text(row, "/power").unwrap_or("Unknown");
    let ready = match text(row, "/ready/status") {
        Some("True") => "ready",
        _ => "not ready",
    };
    let mut phrase = match text(row, "/phase") {
        Some(phase) => format!("{name} ({phase}, {wanted}/{power}, {ready}"),
        None => format!("{name} ({wanted}/{power}, {ready}"),
    };
    if let Some(node) = text(row, "/node") {
        phrase.push_str(&format!(", on node {node}"));
    }
    if let Some(job) = text(row, "/activeJob") {
        phrase.push_str(&format!(", job {job}"));
    }
    phrase.push(')');
    phrase
}

/// `GET /apis/hive.dev/v1/agents`.
pub fn agent_list(list: &Value) -> Reply {
    let rows: Vec<Value> = items(list).iter().map(agent_row).collect();
    let ready = rows.iter().filter(|r| text(r, "/ready/status") == Some("True")).count();
    let summary = if rows.is_empty() {
        "no agents".to_string()
    } else {
        let phrases: Vec<String> = rows.iter().map(agent_phrase).collect();
        format!("{} agent(s), {ready} ready: {}", rows.len(), phrases.join(", "))
    };
    Reply { summary, data: json!({"agents": rows}) }
}

/// `GET /apis/hive.dev/v1/agents/NAME`: the spec in brief (the runtime by its type
/// only: its command and environment are the operator's business; the Node it is placed
/// on as `node`, absent for the daemon's own host), status and conditions (`Placed`
/// among them for a placed agent).
pub fn agent(agent: &Value) -> Reply {
    let row = agent_row(agent);
    let mut spec = pick(
        agent,
        &["/spec/wanted", "/spec/config", "/spec/resources", "/spec/permissions", "/spec/parent"],
    );
    spec.entry("wanted").or_insert_with(|| json!("Up"));
    if let Some(node) = row.get("node") {
        spec.insert("node".into(), node.clone());
    }
    if let Some(runtime) = text(agent, "/spec/runtime/type") {
        spec.insert("runtime".into(), json!(runtime));
    }
    let status = pick(
        agent,
        &[
            "/status/phase",
            "/status/power",
            "/status/appliedRev",
            "/status/activeJob",
            "/status/observedGeneration",
            "/status/restarts",
        ],
    );
    let metadata = pick(agent, &["/metadata/name", "/metadata/generation", "/metadata/labels"]);
    let conditions = agent.pointer("/status/conditions").cloned().unwrap_or_else(|| json!([]));
    let mut summary = format!("agent {}", agent_phrase(&row));
    if row.get("node").is_none() {
        summary.push_str(", on the daemon's host");
    }
    if let Some(rev) = text(&row, "/appliedRev") {
        summary.push_str(&format!(", at rev {rev}"));
    }
    let mut data = json!({"metadata": metadata, "spec": spec, "status": status, "conditions": conditions});
    // How it last ended, first thing after where it stands: the why of a failing agent.
    if let Some(exit) = last_exit(agent) {
        data["lastExit"] = serde_json::to_value(&exit).unwrap_or_default();
        let how = match (exit.exit_code, exit.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            (None, None) => "unknown exit status".into(),
        };
        summary.push_str(&format!("; last exit: {how}"));
        if let Some(line) = exit.stderr.last() {
            summary.push_str(&format!(", stderr: {line}"));
        }
    }
    Reply { summary, data }
}

/// An agent's `status.lastExit`, typed; `None` when it has none (or it does not parse).
fn last_exit(agent: &Value) -> Option<hive_api::agent::LastExit> {
    #[derive(serde::Deserialize)]
    struct Agent {
        #[serde(default)]
        status: Status,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        #[serde(default)]
        last_exit: Option<hive_api::agent::LastExit>,
    }
    serde_json::from_value::<Agent>(agent.clone()).ok()?.status.last_exit
}

/// The Job a power tool submitted.
pub fn submitted(job: &Value, operation: &str, agents: &[String]) -> Reply {
    let name = text(job, "/metadata/name").unwrap_or("?");
    Reply {
        summary: format!(
            "submitted job {name}: {operation} {}; follow it with follow_job {{\"name\": {name:?}}}",
            agents.join(", ")
        ),
        data: json!({"job": name, "operation": operation, "agents": agents}),
    }
}

/// Where a followed Job tree stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Every DAG of the tree is terminal.
    Finished,
    /// The timeout passed first, after this many seconds.
    TimedOut(u64),
}

/// Log tails of failed nodes, by `(job, node id)`.
pub type LogTails = BTreeMap<(String, String), String>;

/// The failed nodes of the tree rooted at `root`: `(job, node id)`.
pub fn failed_nodes(root: &str, jobs: &[Job]) -> Vec<(String, String)> {
    progress::tree(root, jobs)
        .into_iter()
        .flat_map(|(_, job)| {
            job.status
                .nodes
                .iter()
                .filter(|n| n.state == JobNodeState::Failed)
                .map(|n| (job.metadata.name.clone(), n.id.clone()))
        })
        .collect()
}

fn dag(job: &Job, tails: &LogTails) -> Value {
    let name = &job.metadata.name;
    let nodes: Vec<Value> = job
        .spec
        .nodes
        .iter()
        .map(|node| {
            let status = job.status.node(&node.id);
            let mut out = json!({
                "id": node.id,
                "kind": node.kind,
                "state": progress::node_state(job, &node.id),
            });
            if let Some(agent) = &node.agent {
                out["agent"] = json!(agent);
            }
            if let Some(step) = status.and_then(|s| s.step.as_deref()).filter(|s| !s.is_empty()) {
                out["step"] = json!(step);
            }
            if let Some(error) = status.and_then(|s| s.error.as_deref()) {
                out["error"] = json!(error);
            }
            if let Some(tail) = tails.get(&(name.clone(), node.id.clone())) {
                out["logTail"] = json!(tail);
            }
            out
        })
        .collect();
    let mut out = json!({
        "name": name,
        "template": job.spec.template,
        "phase": progress::phase(job),
        "nodes": nodes,
    });
    if let Some(parent) = &job.spec.parent {
        out["parent"] = json!(parent);
    }
    if let Some(message) = &job.status.message {
        out["message"] = json!(message);
    }
    out
}

/// The Job tree rooted at `root` (fan-out children included): the root's phase, each
/// DAG's node chain with states, steps, errors and failed nodes' log tails.
pub fn job_tree(root: &str, jobs: &[Job], wait: Wait, tails: &LogTails) -> Reply {
    let tree = progress::tree(root, jobs);
    let dags: Vec<Value> = tree.iter().map(|(_, job)| dag(job, tails)).collect();
    let failures = progress::failures(root, jobs);
    let root_job = tree.first().map(|(_, job)| *job);
    let phase = root_job.map(progress::phase);
    let line = root_job.map(progress::line).unwrap_or_default();
    let children = tree.len().saturating_sub(1);
    let children = match children {
        0 => String::new(),
        n => format!(" (+{n} fan-out job(s))"),
    };
    let summary = match wait {
        Wait::Finished if failures.is_empty() => format!("job {root} finished{children}: {line}"),
        Wait::Finished => {
            // The first failure is the cause; the rest (cancelled dependents) are in the JSON.
            let more = match failures.len() {
                0 | 1 => String::new(),
                n => format!(" (+{} more)", n - 1),
            };
            format!("job {root} finished{children} with failures: {}{more}", failures[0])
        }
        Wait::TimedOut(secs) => {
            format!("job {root} not finished after {secs}s{children}; call follow_job again: {line}")
        }
    };
    Reply {
        summary,
        data: json!({
            "job": root,
            "phase": phase,
            "finished": wait == Wait::Finished,
            "dags": dags,
            "failures": failures,
        }),
    }
}

/// The last `lines` lines of a log, at most `bytes` bytes of it (cut at a character
/// boundary).
pub fn tail(log: &str, lines: usize, bytes: usize) -> String {
    let log = log.trim_end_matches('\n');
    let mut start = log.len().saturating_sub(bytes);
    while !log.is_char_boundary(start) {
        start += 1;
    }
    let log = &log[start..];
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn approval_row(approval: &Value) -> Value {
    let mut row = pick(
        approval,
        &[
            "/metadata/name",
            "/spec/kind",
            "/spec/target",
            "/spec/requestedBy",
            "/spec/summary",
            "/spec/payload/commit",
            "/spec/payload/pullRequest",
            "/status/job",
            "/status/message",
            "/status/decidedBy",
        ],
    );
    let decision = text(approval, "/spec/decision/state").unwrap_or("Pending");
    row.insert("decision".into(), json!(decision));
    // The controller sets the phase; until it has, the decision tells.
    let phase = text(approval, "/status/phase").unwrap_or(decision);
    row.insert("phase".into(), json!(phase));
    Value::Object(row)
}

/// Whether an approval still waits for a decision.
fn pending(row: &Value) -> bool {
    text(row, "/decision") == Some("Pending")
}

/// `GET /apis/hive.dev/v1/approvals`, optionally only the pending ones.
pub fn approval_list(list: &Value, pending_only: bool) -> Reply {
    let all: Vec<Value> = items(list).iter().map(approval_row).collect();
    let waiting = all.iter().filter(|r| pending(r)).count();
    let rows: Vec<Value> = all.into_iter().filter(|r| !pending_only || pending(r)).collect();
    let phrases: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} ({} for {}, {})",
                text(r, "/name").unwrap_or("?"),
                text(r, "/kind").unwrap_or("?"),
                text(r, "/target").unwrap_or("-"),
                text(r, "/phase").unwrap_or("?")
            )
        })
        .collect();
    let summary = match (rows.len(), pending_only) {
        (0, true) => "no pending approvals".to_string(),
        (0, false) => "no approvals".to_string(),
        (n, true) => format!("{n} pending approval(s): {}", phrases.join(", ")),
        (n, false) => format!("{n} approval(s), {waiting} pending: {}", phrases.join(", ")),
    };
    Reply { summary, data: json!({"approvals": rows}) }
}

/// The approval a `request_approval` call created.
pub fn approval_created(approval: &Value) -> Reply {
    let row = approval_row(approval);
    let summary = format!(
        "requested approval {} ({} for {}), now {}; an operator decides it",
        text(&row, "/name").unwrap_or("?"),
        text(&row, "/kind").unwrap_or("?"),
        text(&row, "/target").unwrap_or("?"),
        text(&row, "/phase").unwrap_or("Pending"),
    );
    Reply { summary, data: row }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alpha() -> Value {
        json!({
            "apiVersion": "hive.dev/v1", "kind": "Agent",
            "metadata": {"name": "alpha", "generation": 3, "labels": {"app": "demo"}, "uid": "u1"},
            "spec": {
                "wanted": "Up",
                "config": {"repo": "https://git.example/alpha.git", "rev": "main"},
                "runtime": {"type": "process", "process": {"command": ["./run.sh"], "env": {"SECRET": "x"}}},
            },
            "status": {
                "power": "Running", "appliedRev": "abc123", "activeJob": "stop-1",
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "Running", "message": "up"},
                    {"type": "Converged", "status": "False", "reason": "Pending", "message": ""},
                ],
            },
        })
    }

    #[test]
    fn agent_list_rows_and_summary() {
        let beta = json!({"metadata": {"name": "beta"}, "spec": {"wanted": "Offline"}});
        let reply = agent_list(&json!({"items": [alpha(), beta]}));
        assert_eq!(
            reply.summary,
            "2 agent(s), 1 ready: alpha (Up/Running, ready, job stop-1), beta (Offline/Unknown, not ready)"
        );
        assert_eq!(
            reply.data,
            json!({"agents": [
                {"name": "alpha", "wanted": "Up", "power": "Running", "appliedRev": "abc123",
                 "ready": {"status": "True", "reason": "Running", "message": "up"}, "activeJob": "stop-1"},
                {"name": "beta", "wanted": "Offline"},
            ]})
        );
        assert_eq!(agent_list(&json!({"items": []})).summary, "no agents");
    }

    #[test]
    fn agent_detail_keeps_the_runtime_to_its_type() {
        let reply = agent(&alpha());
        assert_eq!(
            reply.summary,
            "agent alpha (Up/Running, ready, job stop-1), on the daemon's host, at rev abc123"
        );
        assert_eq!(reply.data["spec"].get("node"), None, "absent: the daemon's host");
        assert_eq!(reply.data["spec"]["runtime"], json!("process"));
        assert!(!reply.data.to_string().contains("SECRET"));
        assert_eq!(
            reply.data["metadata"],
            json!({"name": "alpha", "generation": 3, "labels": {"app": "demo"}})
        );
        assert_eq!(reply.data["status"]["activeJob"], json!("stop-1"));
        assert_eq!(reply.data["conditions"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_crashing_agent_says_its_phase_and_last_exit() {
        let mut crashy = alpha();
        crashy["status"]["phase"] = json!("CrashLoopBackOff");
        crashy["status"]["restarts"] = json!(4);
        crashy["status"]["lastExit"] = json!({"exitCode": 3, "finishedAt": "2026-01-01T00:00:00Z",
            "stderr": ["starting", "panic: config.toml: no such file"]});
        let reply = agent(&crashy);
        assert_eq!(
            reply.summary,
            "agent alpha (CrashLoopBackOff, Up/Running, ready, job stop-1), on the daemon's host, at rev abc123; \
             last exit: exit code 3, stderr: panic: config.toml: no such file"
        );
        assert_eq!(reply.data["status"]["phase"], json!("CrashLoopBackOff"));
        assert_eq!(reply.data["status"]["restarts"], json!(4));
        assert_eq!(reply.data["lastExit"]["stderr"][1], json!("panic: config.toml: no such file"));
        let list = agent_list(&json!({"items": [crashy]}));
        assert_eq!(list.data["agents"][0]["phase"], json!("CrashLoopBackOff"));
    }

    #[test]
    fn a_placed_agent_reports_its_node() {
        let mut placed = alpha();
        placed["spec"]["placement"] = json!({"node": "node-1"});
        let reply = agent(&placed);
        assert_eq!(
            reply.summary,
            "agent alpha (Up/Running, ready, on node node-1, job stop-1), at rev abc123"
        );
        assert_eq!(reply.data["spec"]["node"], json!("node-1"));
        let list = agent_list(&json!({"items": [placed, alpha()]}));
        assert_eq!(list.data["agents"][0]["node"], json!("node-1"));
        assert_eq!(list.data["agents"][1].get("node"), None);
        assert!(
            list.summary.contains("alpha (Up/Running, ready, on node node-1, job stop-1)"),
            "{}",
            list.summary
        );
    }

    #[test]
    fn whoami_names_the_bound_agent() {
        let reply = whoami(&json!({"name": "alpha-token", "role": "agent", "agent": "alpha"}));
        assert_eq!(reply.summary, "token \"alpha-token\", role agent, bound to agent \"alpha\"");
        let reply = whoami(&json!({"name": "admin", "role": "admin"}));
        assert_eq!(reply.summary, "token \"admin\", role admin");
        assert_eq!(reply.data, json!({"name": "admin", "role": "admin"}));
    }

    fn stop_job(name: &str, status: Value) -> Job {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"template": "Stop", "source": "Mcp", "agents": ["alpha"], "nodes": [
                {"id": "alpha/set-wanted", "kind": "SetWanted", "agent": "alpha"},
                {"id": "alpha/drain", "kind": "Drain", "agent": "alpha", "deps": [{"node": "alpha/set-wanted"}]},
            ]},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn job_tree_when_done_failed_and_timed_out() {
        let done = stop_job(
            "stop-1",
            json!({"phase": "Done", "nodes": [
                {"id": "alpha/set-wanted", "state": "Done"}, {"id": "alpha/drain", "state": "Done"}]}),
        );
        let reply = job_tree("stop-1", &[done], Wait::Finished, &LogTails::new());
        assert_eq!(reply.summary, "job stop-1 finished: ✓ Stop alpha: set-wanted ✓ → drain ✓");
        assert_eq!(
            reply.data,
            json!({"job": "stop-1", "phase": "Done", "finished": true, "failures": [], "dags": [
                {"name": "stop-1", "template": "Stop", "phase": "Done", "nodes": [
                    {"id": "alpha/set-wanted", "kind": "SetWanted", "state": "Done", "agent": "alpha"},
                    {"id": "alpha/drain", "kind": "Drain", "state": "Done", "agent": "alpha"},
                ]},
            ]})
        );

        let failed = stop_job(
            "stop-2",
            json!({"phase": "Failed", "nodes": [
                {"id": "alpha/set-wanted", "state": "Done"},
                {"id": "alpha/drain", "state": "Failed", "error": "harness did not drain"}]}),
        );
        assert_eq!(
            failed_nodes("stop-2", std::slice::from_ref(&failed)),
            [("stop-2".into(), "alpha/drain".into())]
        );
        let tails = LogTails::from([(("stop-2".into(), "alpha/drain".into()), "line 9\nline 10".into())]);
        let reply = job_tree("stop-2", &[failed], Wait::Finished, &tails);
        assert_eq!(
            reply.summary,
            "job stop-2 finished with failures: job stop-2 (Stop) failed: node alpha/drain: harness did not drain"
        );
        assert_eq!(reply.data["dags"][0]["nodes"][1]["logTail"], json!("line 9\nline 10"));
        assert_eq!(reply.data["dags"][0]["nodes"][1]["error"], json!("harness did not drain"));

        let twice = stop_job(
            "stop-4",
            json!({"phase": "Failed", "nodes": [
                {"id": "alpha/set-wanted", "state": "Failed", "error": "store unavailable"},
                {"id": "alpha/drain", "state": "Failed", "error": "no agent"}]}),
        );
        let reply = job_tree("stop-4", &[twice], Wait::Finished, &LogTails::new());
        assert_eq!(
            reply.summary,
            "job stop-4 finished with failures: job stop-4 (Stop) failed: node alpha/set-wanted: \
             store unavailable (+1 more)"
        );
        assert_eq!(reply.data["failures"].as_array().unwrap().len(), 2);

        let running = stop_job(
            "stop-3",
            json!({"phase": "Running", "nodes": [
                {"id": "alpha/set-wanted", "state": "Done"},
                {"id": "alpha/drain", "state": "Running", "step": "waiting for the harness"}]}),
        );
        let reply = job_tree("stop-3", &[running], Wait::TimedOut(5), &LogTails::new());
        assert_eq!(
            reply.summary,
            "job stop-3 not finished after 5s; call follow_job again: \
             ⟳ Stop alpha: set-wanted ✓ → drain ⟳ waiting for the harness"
        );
        assert_eq!(reply.data["finished"], json!(false));
        assert_eq!(reply.data["dags"][0]["nodes"][1]["step"], json!("waiting for the harness"));
    }

    #[test]
    fn tails_keep_the_last_lines_and_bytes() {
        assert_eq!(tail("a\nb\nc\nd\n", 2, 1000), "c\nd");
        assert_eq!(tail("aaaa\nbbbb", 10, 6), "a\nbbbb");
        // A cut inside a multi-byte character moves to the next boundary.
        assert_eq!(tail("ééé", 10, 3), "é");
        assert_eq!(tail("", 5, 5), "");
    }

    #[test]
    fn approvals_list_and_filter_pending() {
        let list = json!({"items": [
            {"metadata": {"name": "alpha-applycommit-1a2b3c"},
             "spec": {"kind": "ApplyCommit", "target": "alpha", "requestedBy": "alpha",
                      "summary": "bump", "payload": {"commit": "abc"}, "decision": {"state": "Pending"}}},
            {"metadata": {"name": "beta-mergeconfigpr-9f8e7d"},
             "spec": {"kind": "MergeConfigPr", "target": "beta", "payload": {"pullRequest": "7"},
                      "decision": {"state": "Approved"}},
             "status": {"phase": "Deployed", "job": "approvaldeploy-1"}},
        ]});
        let reply = approval_list(&list, false);
        assert_eq!(
            reply.summary,
            "2 approval(s), 1 pending: alpha-applycommit-1a2b3c (ApplyCommit for alpha, Pending), \
             beta-mergeconfigpr-9f8e7d (MergeConfigPr for beta, Deployed)"
        );
        assert_eq!(
            reply.data["approvals"][0],
            json!({"name": "alpha-applycommit-1a2b3c", "kind": "ApplyCommit", "target": "alpha",
                   "requestedBy": "alpha", "summary": "bump", "commit": "abc",
                   "decision": "Pending", "phase": "Pending"})
        );
        let reply = approval_list(&list, true);
        assert_eq!(reply.data["approvals"].as_array().unwrap().len(), 1);
        assert_eq!(approval_list(&json!({"items": []}), true).summary, "no pending approvals");
    }
}
