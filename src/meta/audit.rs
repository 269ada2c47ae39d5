//! Reading the meta repo's git log back as the deploy audit trail: each commit with its
//! `Hive-Op` and `Hive-Agent` trailers and the deploy tags on it, optionally only the
//! commits that concern one agent.

use chrono::{DateTime, Utc};

use super::files::{AGENT_TRAILER, OP_TRAILER};
use super::{validate_name, Error, Meta, Result};

/// One commit of the meta repo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// The commit's full sha.
    pub commit: String,
    /// When it was committed.
    pub time: DateTime<Utc>,
    /// Its `Hive-Op` trailer (`init`, `sync`, `relock`, `lock-update`, `hive-bump`,
    /// `permissions`, `deploy`); empty for a commit hive did not make.
    pub op: String,
    /// Its `Hive-Agent` trailers: the agents it concerns.
    pub agents: Vec<String>,
    /// The message's first line.
    pub subject: String,
    /// The rest of the message, without hive's trailers.
    pub body: String,
    /// The tags on it (`deploy/<agent>/<n>`), sorted.
    pub tags: Vec<String>,
}

/// Separates the fields of one commit in the log format.
const FIELD: char = '\u{1f}';
/// Ends one commit in the log format.
const RECORD: char = '\u{1e}';

impl Meta {
    /// The newest `limit` commits, newest first; with `agent`, only those with a
    /// `Hive-Agent: <agent>` trailer.
    pub async fn log(&self, agent: Option<&str>, limit: usize) -> Result<Vec<AuditEntry>> {
        if let Some(agent) = agent {
            validate_name(agent)?;
        }
        let _state = self.inner.state.lock().await;
        let format = format!(
            "--format=%H%x1f%ct%x1f%D%x1f%(trailers:key={OP_TRAILER},valueonly,separator=%x2C)%x1f\
             %(trailers:key={AGENT_TRAILER},valueonly,separator=%x2C)%x1f%s%x1f%b%x1e"
        );
        let count = format!("--max-count={limit}");
        let mut args = vec!["log", "--decorate=short", count.as_str(), format.as_str()];
        // The name is a DNS-1123 label (validated above), so it has no regex syntax.
        let grep = agent.map(|agent| format!("--grep=^{AGENT_TRAILER}: {agent}$"));
        if let Some(grep) = &grep {
            args.push(grep);
        }
        let out = self.inner.git.run(&args).await?;
        let command = format!("git {}", args.join(" "));
        let mut entries = Vec::new();
        for record in out.split(RECORD) {
            let record = record.trim_start_matches('\n');
            if record.is_empty() {
                continue;
            }
            let entry = parse(record).ok_or_else(|| Error::Output {
                command: command.clone(),
                reason: format!("cannot read log record {record:?}"),
            })?;
            // `--grep` matches any message line; the trailer itself is the filter.
            if agent.is_none_or(|agent| entry.agents.iter().any(|a| a == agent)) {
                entries.push(entry);
            }
        }
        Ok(entries)
    }
}

/// One `--format` record.
fn parse(record: &str) -> Option<AuditEntry> {
    let mut fields = record.splitn(7, FIELD);
    let commit = fields.next()?.to_string();
    let time = DateTime::from_timestamp(fields.next()?.trim().parse().ok()?, 0)?;
    let mut tags: Vec<String> = fields
        .next()?
        .split(", ")
        .filter_map(|decoration| decoration.strip_prefix("tag: "))
        .map(str::to_string)
        .collect();
    tags.sort();
    let op = fields.next()?.trim().to_string();
    let agents = list(fields.next()?);
    let subject = fields.next()?.to_string();
    let body = without_trailers(fields.next()?);
    Some(AuditEntry { commit, time, op, agents, subject, body, tags })
}

/// The comma-separated trailer values.
fn list(values: &str) -> Vec<String> {
    values.split(',').map(str::trim).filter(|v| !v.is_empty()).map(str::to_string).collect()
}

/// The body with its last paragraph dropped when that paragraph is hive's trailers.
fn without_trailers(body: &str) -> String {
    let body = body.trim_end();
    let (text, last) = match body.rsplit_once("\n\n") {
        Some((text, last)) => (text, last),
        None => ("", body),
    };
    let ours = last.lines().any(|line| line.starts_with(&format!("{OP_TRAILER}: ")))
        && last.lines().all(|line| line.contains(": "));
    if ours {
        text.trim().to_string()
    } else {
        body.trim().to_string()
    }
}
