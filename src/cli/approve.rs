//! `hive approve NAME` / `hive deny NAME --reason TEXT`: an operator's decision on an
//! Approval, written as a merge patch of `spec.decision` (the server records who and
//! when). `approve` then follows the approval until it is Deployed or Failed
//! (`--no-wait` returns at once); exit 1 when it failed.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use hive_api::approval::{ApprovalPhase, DecisionState};
use hive_api::Approval;
use serde_json::{json, Value};

use super::client::{decode, encode, with_operation};
use super::{output, Context};

/// How often a followed approval is read.
const POLL: Duration = Duration::from_millis(300);

/// Approve a pending approval.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive approve alpha-apply-3f2a            # approve, then follow it until deployed
  hive approve alpha-apply-3f2a --no-wait
  hive get approvals                       # what is pending")]
pub struct ApproveArgs {
    /// The approval (`NAME` or `approval/NAME`).
    #[arg(value_name = "APPROVAL")]
    pub approval: String,

    /// Why, recorded in `spec.decision.reason`.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,

    /// Return once the decision is recorded instead of following the deploy.
    #[arg(long)]
    pub no_wait: bool,

    /// Give up following after this long, e.g. `10m`.
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = super::duration::parse)]
    pub timeout: Duration,
}

/// Deny a pending approval.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:
  hive deny alpha-apply-3f2a --reason 'touches the billing prompts; split it'")]
pub struct DenyArgs {
    /// The approval (`NAME` or `approval/NAME`).
    #[arg(value_name = "APPROVAL")]
    pub approval: String,

    /// Why, recorded in `spec.decision.reason` and shown to whoever asked.
    #[arg(long, value_name = "TEXT", required = true)]
    pub reason: String,
}

/// The approval name in `NAME`, `approval/NAME` or `approvals/NAME`.
pub fn approval_name(text: &str) -> Result<&str> {
    let name = match text.split_once('/') {
        Some(("approval" | "approvals" | "apr", name)) => name,
        Some((kind, _)) => bail!("only approvals can be decided, not {kind:?}"),
        None => text,
    };
    if name.is_empty() {
        bail!("resource name may not be empty");
    }
    Ok(name)
}

/// The merge patch recording a decision.
pub fn decision_patch(state: &str, reason: Option<&str>) -> Value {
    let mut decision = json!({"state": state});
    if let Some(reason) = reason {
        decision["reason"] = json!(reason);
    }
    json!({"spec": {"decision": decision}})
}

async fn decide(ctx: &Context, name: &str, state: &str, reason: Option<&str>) -> Result<Approval> {
    let client = ctx.client()?;
    let path = format!("/apis/hive.dev/v1/approvals/{}", encode(name));
    let current = client
        .get(&path)
        .await
        .map_err(|e| with_operation(e, format!("error when reading approval {name:?}")))?;
    let current: Approval = decode(&current, "Approval")?;
    let decided = current.spec.decision.state;
    if decided != DecisionState::Pending {
        bail!("approval {name:?} was already decided: {}{}", decided.as_str(), by(&current));
    }
    let response = client
        .patch(&path, "application/merge-patch+json", &decision_patch(state, reason))
        .await
        .map_err(|e| with_operation(e, format!("error when deciding approval {name:?}")))?;
    decode(&response.body, "Approval")
}

fn by(approval: &Approval) -> String {
    match approval.metadata.annotations.get(hive_api::names::DECIDED_BY) {
        Some(who) => format!(" by {who}"),
        None => String::new(),
    }
}

/// Runs `hive approve`.
pub async fn approve(args: ApproveArgs, ctx: &Context) -> Result<()> {
    let name = approval_name(&args.approval)?;
    let decided = decide(ctx, name, "Approved", args.reason.as_deref()).await?;
    output::print(&format!("approval.hive.dev/{name} approved{}\n", by(&decided)))?;
    if args.no_wait {
        return Ok(());
    }
    follow(ctx, name, args.timeout).await
}

/// Follows an approval until it resolves, printing each phase once.
async fn follow(ctx: &Context, name: &str, timeout: Duration) -> Result<()> {
    let client = ctx.client()?;
    let path = format!("/apis/hive.dev/v1/approvals/{}", encode(name));
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let approval = client.get(&path).await.context("following the approval")?;
        let approval: Approval = decode(&approval, "Approval")?;
        let line = phase_line(&approval);
        if line != last {
            output::eprint_line(&line.to_string());
            last = line;
        }
        match approval.status.phase {
            Some(ApprovalPhase::Deployed) => return Ok(()),
            Some(ApprovalPhase::Failed | ApprovalPhase::Denied) => {
                return Err(anyhow::Error::new(super::Reported))
            }
            _ => {}
        }
        if started.elapsed() > timeout {
            bail!("approval {name:?} did not resolve within {timeout:?}; it goes on in the daemon");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `approval/x: Deploying (Job approval-x): approved by admin; Job approval-x`.
pub fn phase_line(approval: &Approval) -> String {
    let name = match approval.metadata.name.as_str() {
        "" => "?",
        name => name,
    };
    let phase = approval.status.phase.map_or("Pending", ApprovalPhase::as_str);
    let mut line = format!("approval/{name}: {phase}");
    if let Some(job) = &approval.status.job {
        line.push_str(&format!(" (Job {job})"));
    }
    if let Some(message) = &approval.status.message {
        line.push_str(&format!(": {message}"));
    }
    line
}

/// Runs `hive deny`.
pub async fn deny(args: DenyArgs, ctx: &Context) -> Result<()> {
    let name = approval_name(&args.approval)?;
    if args.reason.trim().is_empty() {
        bail!("--reason must say why");
    }
    let decided = decide(ctx, name, "Denied", Some(&args.reason)).await?;
    output::print(&format!("approval.hive.dev/{name} denied{}\n", by(&decided)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_patches_and_lines() {
        assert_eq!(approval_name("approval/a").unwrap(), "a");
        assert_eq!(approval_name("a").unwrap(), "a");
        assert!(approval_name("agent/a").unwrap_err().to_string().contains("only approvals"));
        assert_eq!(
            decision_patch("Denied", Some("no")),
            json!({"spec": {"decision": {"state": "Denied", "reason": "no"}}})
        );
        let approval = json!({"metadata": {"name": "a"}, "status": {"phase": "Deploying", "job": "approval-a", "message": "approved by admin"}});
        let approval: Approval = decode(&approval, "Approval").expect("an Approval");
        assert_eq!(phase_line(&approval), "approval/a: Deploying (Job approval-a): approved by admin");
    }
}
