//! `hive audit [AGENT]`: the deploy audit trail, the meta repo's git log (newest first):
//! every lock bump, relock, permissions commit and approval deploy, with the agents each
//! concerns and its deploy tags. `hive audit --api`: the API audit log `hive serve`
//! writes (every mutation: who, what, the outcome), read from its file and its rotated
//! backups on this host, as kube-apiserver's audit log is read.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::server::audit_log::{backup, Line};

use super::client::Query;
use super::{output, Context};

/// Show the deploy audit trail, or with `--api` the API audit log.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive audit              # every meta commit
  hive audit alpha        # only commits concerning alpha
  hive audit alpha -o json
  hive audit --api                      # the newest API mutations (from ./.hive/audit.log)
  hive audit --api --user ops --since 1h
  hive audit --api --file /var/lib/hive/audit.log -o json

The API audit log has one JSON line per mutation (and per read with `hive serve
--audit-reads`): time, requestId, user, role, verb, resource, name, subresource, code,
resourceVersion, sourceAddress (docs/api.md). `--api` reads the file and its rotated
backups (PATH.N … PATH.1) on this host; it needs no server.")]
pub struct Args {
    /// Only commits concerning this agent.
    #[arg(value_name = "AGENT", conflicts_with = "api")]
    pub agent: Option<String>,

    /// How many commits (or with --api, entries), newest first (1 to 1000).
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub limit: usize,

    /// Show the API audit log instead of the deploy trail.
    #[arg(long)]
    pub api: bool,

    /// With --api: only entries newer than this, e.g. `1h`, `30m`.
    #[arg(long, value_name = "DURATION", value_parser = super::duration::parse, requires = "api")]
    pub since: Option<Duration>,

    /// With --api: only entries by this token name.
    #[arg(long, value_name = "NAME", requires = "api")]
    pub user: Option<String>,

    /// With --api: the audit log file (default: `<state-dir>/audit.log`, the state
    /// directory being `$HIVE_STATE_DIR`, else `./.hive`, as for `hive serve`).
    #[arg(long, value_name = "PATH", requires = "api")]
    pub file: Option<PathBuf>,

    /// Output format: `table`, `json` or `yaml`.
    #[arg(short, long, value_name = "FORMAT", default_value = "table")]
    pub output: String,
}

/// Runs `hive audit`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    if args.api {
        return api(&args);
    }
    let client = ctx.client()?;
    let query =
        Query::default().push("limit", args.limit.to_string()).push_opt("agent", args.agent.as_deref());
    let body = client.get(&format!("/hive/v1/audit{query}")).await?;
    let text = match args.output.as_str() {
        "table" => render(&body, crate::host::now()),
        "json" => output::json(&body)?,
        "yaml" => output::yaml(&body)?,
        other => anyhow::bail!("unknown output format {other:?}: expected table, json or yaml"),
    };
    if text.is_empty() {
        output::eprint_line("No meta commits found");
    }
    output::print(&text)?;
    Ok(())
}

/// `hive audit --api`: reads, filters and prints the API audit log.
fn api(args: &Args) -> Result<()> {
    if !(1..=1000).contains(&args.limit) {
        anyhow::bail!("--limit {} is out of range 1..=1000", args.limit);
    }
    let path = args
        .file
        .clone()
        .unwrap_or_else(|| crate::auth::kubeconfig::default_state_dir().join(super::serve::AUDIT_LOG_FILE));
    let now = crate::host::now();
    let filter = Filter {
        since: args.since.map(|d| now - chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)),
        user: args.user.clone(),
    };
    let (mut lines, malformed) = read_api_log(&path, &filter)?;
    if malformed > 0 {
        output::eprint_line(&format!(
            "warning: skipped {malformed} lines of {} that are not audit entries",
            path.display()
        ));
    }
    let skip = lines.len().saturating_sub(args.limit);
    lines.drain(..skip);
    let text = match args.output.as_str() {
        "table" => render_api(&lines),
        "json" => output::json(&serde_json::json!({"items": lines}))?,
        "yaml" => output::yaml(&serde_json::json!({"items": lines}))?,
        other => anyhow::bail!("unknown output format {other:?}: expected table, json or yaml"),
    };
    if text.is_empty() {
        output::eprint_line(&format!("No API audit entries found in {}", path.display()));
    }
    output::print(&text)?;
    Ok(())
}

/// Which entries `hive audit --api` shows.
#[derive(Debug, Default)]
pub struct Filter {
    /// Only entries at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only entries by this token name.
    pub user: Option<String>,
}

impl Filter {
    /// Whether `line` passes.
    pub fn keeps(&self, line: &Line) -> bool {
        let recent = self.since.is_none_or(|since| {
            DateTime::parse_from_rfc3339(&line.time).is_ok_and(|t| t.with_timezone(&Utc) >= since)
        });
        let by = self.user.as_ref().is_none_or(|user| line.user.as_ref() == Some(user));
        recent && by
    }
}

/// Every entry of the audit log at `path` that `filter` keeps, oldest first: the rotated
/// backups (`PATH.N` … `PATH.1`), then `PATH`; and how many lines were not entries.
pub fn read_api_log(path: &Path, filter: &Filter) -> Result<(Vec<Line>, usize)> {
    let mut files: Vec<PathBuf> = (1..).map(|n| backup(path, n)).take_while(|p| p.exists()).collect();
    files.reverse();
    if !path.exists() && files.is_empty() {
        anyhow::bail!(
            "no API audit log at {} (hive serve writes <state-dir>/audit.log unless --audit-log names another file \
             or --no-audit-log is given; pass --file PATH)",
            path.display()
        );
    }
    files.push(path.to_path_buf());
    let (mut lines, mut malformed) = (Vec::new(), 0);
    for file in files.iter().filter(|p| p.exists()) {
        let reader = std::io::BufReader::new(
            std::fs::File::open(file).with_context(|| format!("reading {}", file.display()))?,
        );
        for text in reader.split(b'\n') {
            let text = text.with_context(|| format!("reading {}", file.display()))?;
            if text.is_empty() {
                continue;
            }
            match serde_json::from_slice::<Line>(&text) {
                Ok(line) if filter.keeps(&line) => lines.push(line),
                Ok(_) => {}
                Err(_) => malformed += 1,
            }
        }
    }
    Ok((lines, malformed))
}

/// `TIME USER ROLE VERB RESOURCE NAME CODE RV SOURCE REQUEST-ID`, one row per entry.
pub fn render_api(lines: &[Line]) -> String {
    if lines.is_empty() {
        return String::new();
    }
    let or_dash = |v: &Option<String>| v.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "-".into());
    let mut rows =
        vec![["TIME", "USER", "ROLE", "VERB", "RESOURCE", "NAME", "CODE", "RV", "SOURCE", "REQUEST-ID"]
            .map(String::from)
            .to_vec()];
    for line in lines {
        let resource = match (&line.resource, &line.subresource) {
            (Some(r), Some(sub)) => format!("{r}/{sub}"),
            (r, _) => or_dash(r),
        };
        rows.push(vec![
            line.time.get(..19).map_or_else(|| line.time.clone(), |t| format!("{t}Z")),
            or_dash(&line.user),
            or_dash(&line.role),
            line.verb.clone(),
            resource,
            or_dash(&line.name),
            line.code.to_string(),
            or_dash(&line.resource_version),
            or_dash(&line.source_address),
            line.request_id.clone(),
        ]);
    }
    output::align(&rows, &mut Vec::new())
}

/// `AGE COMMIT OP AGENTS TAGS SUBJECT`, one row per commit (empty with none).
pub fn render(body: &Value, now: DateTime<Utc>) -> String {
    let items = body["items"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        return String::new();
    }
    let list = |v: &Value| {
        let joined: Vec<&str> =
            v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        if joined.is_empty() {
            "-".to_string()
        } else {
            joined.join(",")
        }
    };
    let mut lines = vec![["AGE", "COMMIT", "OP", "AGENTS", "TAGS", "SUBJECT"].map(String::from).to_vec()];
    for item in &items {
        lines.push(vec![
            hive_api::age::age(item["time"].as_str(), now),
            item["commit"].as_str().unwrap_or("").chars().take(12).collect(),
            item["op"].as_str().filter(|s| !s.is_empty()).unwrap_or("-").to_string(),
            list(&item["agents"]),
            list(&item["tags"]),
            item["subject"].as_str().unwrap_or("").to_string(),
        ]);
    }
    output::align(&lines, &mut Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_trail() {
        let now: DateTime<Utc> = "2026-11-29T12:00:00Z".parse().unwrap();
        let body = serde_json::json!({"items": [
            {"commit": "0123456789abcdef0123", "time": "2026-11-29T11:58:00Z", "op": "deploy", "agents": ["alpha"],
             "tags": ["deploy/alpha/1"], "subject": "deploy alpha 89ab (approval a1, ApplyCommit, approved by admin)"},
            {"commit": "fedcba9876543210fedc", "time": "2026-11-29T10:00:00Z", "op": "init", "agents": [], "tags": [], "subject": "meta: init"}
        ]});
        let text = render(&body, now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("AGE"), "{text}");
        assert!(
            lines[1].contains("0123456789ab")
                && lines[1].contains("deploy/alpha/1")
                && lines[1].contains("2m"),
            "{text}"
        );
        assert!(lines[2].contains("init") && lines[2].contains(" - "), "{text}");
        assert_eq!(render(&serde_json::json!({"items": []}), now), "");
    }

    fn entry(time: &str, user: Option<&str>) -> Line {
        Line {
            time: time.into(),
            request_id: "r1".into(),
            user: user.map(Into::into),
            role: user.map(|_| "operator".into()),
            verb: "patch".into(),
            resource: Some("agents".into()),
            name: Some("a1".into()),
            subresource: Some("status".into()),
            code: 200,
            resource_version: Some("42".into()),
            source_address: Some("127.0.0.1:5000".into()),
            replica: None,
        }
    }

    #[test]
    fn the_api_log_is_filtered_by_user_and_time() {
        let since: DateTime<Utc> = "2026-12-01T10:00:00Z".parse().unwrap();
        let old = entry("2026-12-01T09:59:59.999999Z", Some("ops"));
        let new = entry("2026-12-01T10:00:00.000001Z", Some("ops"));
        let anonymous = entry("2026-12-01T10:00:01Z", None);
        let f = Filter { since: Some(since), user: None };
        assert!(!f.keeps(&old) && f.keeps(&new) && f.keeps(&anonymous));
        let f = Filter { since: None, user: Some("ops".into()) };
        assert!(f.keeps(&old) && !f.keeps(&anonymous));
        assert!(!Filter { since: None, user: Some("boss".into()) }.keeps(&new));
    }

    #[test]
    fn renders_the_api_log() {
        let text = render_api(&[
            entry("2026-12-01T10:00:00.000001Z", Some("ops")),
            entry("2026-12-01T10:00:01Z", None),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("TIME") && lines[0].contains("REQUEST-ID"), "{text}");
        assert!(lines[1].starts_with("2026-12-01T10:00:00Z") && lines[1].contains("agents/status"), "{text}");
        assert!(lines[2].contains(" - "), "an anonymous entry shows '-': {text}");
        assert_eq!(render_api(&[]), "");
    }
}
