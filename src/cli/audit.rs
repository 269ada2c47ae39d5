//! `hive audit [AGENT]`: the deploy audit trail, the meta repo's git log (newest first):
//! every lock bump, relock, permissions commit and approval deploy, with the agents each
//! concerns and its deploy tags.

use anyhow::Result;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::client::Query;
use super::{output, Context};

/// Show the deploy audit trail.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive audit              # every meta commit
  hive audit alpha        # only commits concerning alpha
  hive audit alpha -o json")]
pub struct Args {
    /// Only commits concerning this agent.
    #[arg(value_name = "AGENT")]
    pub agent: Option<String>,

    /// How many commits, newest first (1 to 1000).
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub limit: usize,

    /// Output format: `table`, `json` or `yaml`.
    #[arg(short, long, value_name = "FORMAT", default_value = "table")]
    pub output: String,
}

/// Runs `hive audit`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
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
        eprintln!("No meta commits found");
    }
    output::print(&text)?;
    Ok(())
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
}
