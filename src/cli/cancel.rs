//! `hive cancel JOB [--children]`: cancels a Job that is still fully queued (the server
//! answers 409 once any node has started). Cancelling a queued power Job reverts the
//! agents' `spec.wanted` to their observed state.

use anyhow::Result;
use serde_json::{json, Value};

use super::client::{encode, with_operation};
use super::{output, Context};

/// Cancel a queued Job.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive cancel stop-1a2b3c4d
  hive cancel metaupdate-9f8e --children   # its fan-out children too")]
pub struct Args {
    /// The Job to cancel (`NAME` or `job/NAME`).
    #[arg(value_name = "JOB")]
    pub job: String,

    /// Cancel the Job's fan-out children as well.
    #[arg(long)]
    pub children: bool,
}

/// The Job name in `NAME`, `job/NAME` or `jobs/NAME`.
pub fn job_name(text: &str) -> Result<&str> {
    let name = match text.split_once('/') {
        Some(("job" | "jobs" | "jb", name)) => name,
        Some((kind, _)) => anyhow::bail!("only jobs can be cancelled, not {kind:?}"),
        None => text,
    };
    if name.is_empty() {
        anyhow::bail!("resource name may not be empty");
    }
    Ok(name)
}

/// Runs `hive cancel`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let name = job_name(&args.job)?;
    let client = ctx.client()?;
    let path = format!("/apis/hive.dev/v1/jobs/{}/cancel", encode(name));
    let answer = client
        .post(&path, &json!({"children": args.children}))
        .await
        .map_err(|e| with_operation(e, format!("error when cancelling job {name:?}")))?;
    output::print(&cancelled_lines(name, &answer))?;
    Ok(())
}

/// One line per Job cancelled: the server lists them (`cancelled`, with `--children`
/// the parent's children too); an answer without that list cancelled just `name`.
pub fn cancelled_lines(name: &str, answer: &Value) -> String {
    let names: Vec<&str> = match answer.get("cancelled").and_then(Value::as_array) {
        Some(list) => list.iter().filter_map(Value::as_str).collect(),
        None => vec![name],
    };
    names.iter().map(|n| format!("job.hive.dev/{n} cancelled\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_or_without_kind() {
        assert_eq!(job_name("stop-1").unwrap(), "stop-1");
        assert_eq!(job_name("job/stop-1").unwrap(), "stop-1");
        assert!(job_name("agent/a").is_err());
        assert!(job_name("job/").is_err());
    }

    #[test]
    fn every_cancelled_job_gets_a_line() {
        let answer = json!({"job": {}, "cancelled": ["meta-1", "rebuild-a"]});
        assert_eq!(
            cancelled_lines("meta-1", &answer),
            "job.hive.dev/meta-1 cancelled\njob.hive.dev/rebuild-a cancelled\n"
        );
        assert_eq!(cancelled_lines("x", &json!({"kind": "Job"})), "job.hive.dev/x cancelled\n");
    }
}
