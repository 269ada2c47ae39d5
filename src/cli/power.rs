//! `hive start|stop|restart|rebuild|kill AGENT… | --all`: one Job through the submit
//! layer (`POST /apis/hive.dev/v1/jobs`), then its progress (on a terminal a line per
//! agent and a summary, otherwise a line per agent change) until every DAG
//! of the tree (fan-out children included) is terminal. Exit 0 when all are done, 1
//! when any failed, was cancelled or was interrupted.
//!
//! `--all` is every agent, except for `restart`: "restart what runs" must not start an
//! agent an operator keeps Offline, so `restart --all` takes the agents whose
//! `spec.wanted` is Up (`in_all`). A named Offline agent is still restarted (its shape
//! is a start), and `start --all` starts every agent, explicitly.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use hive_api::agent::Wanted;
use hive_api::job::{JobSource, JobTemplate};
use hive_api::{Agent, AgentList, Job, JobList};
use serde_json::{json, Value};

use super::client::{self, Client};
use super::{board, output, progress, terminal, Context};

/// How often the Job tree is read while waiting.
const POLL: Duration = Duration::from_millis(250);
/// How long the server may stay unreachable before the wait gives up.
const UNREACHABLE: Duration = Duration::from_secs(60);

/// Arguments shared by every power verb.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agents to act on; all of them go into one Job.
    #[arg(value_name = "AGENT", required_unless_present = "all", conflicts_with = "all")]
    pub agents: Vec<String>,

    /// Act on every agent (each verb's help says which it takes).
    #[arg(long)]
    pub all: bool,

    /// Print the Job name and return at once instead of following its progress.
    #[arg(long)]
    pub no_wait: bool,

    /// Why, recorded in the Job's `spec.reason`.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,

    /// The Job's `spec.priority` (-1000 to 1000; default 0, the boot sweep runs at -10):
    /// its nodes go before lower priorities' for a build slot or an agent's lease.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub priority: Option<i32>,
}

/// The Job body the submit layer builds the DAG from; the server names it.
pub fn job_body(
    template: JobTemplate,
    agents: &[String],
    reason: Option<&str>,
    priority: Option<i32>,
) -> Value {
    job_body_from(JobSource::Cli, template, agents, reason, priority)
}

/// [`job_body`] for a Job another surface submits (the MCP server), recorded as its
/// `spec.source`.
pub fn job_body_from(
    source: JobSource,
    template: JobTemplate,
    agents: &[String],
    reason: Option<&str>,
    priority: Option<i32>,
) -> Value {
    let mut spec = json!({"template": template.as_str(), "agents": agents, "source": source.as_str()});
    if let Some(reason) = reason {
        spec["reason"] = json!(reason);
    }
    if let Some(priority) = priority {
        spec["priority"] = json!(priority);
    }
    json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {}, "spec": spec})
}

const JOBS: &str = "/apis/hive.dev/v1/jobs";

/// Runs one power verb.
pub async fn exec(template: JobTemplate, args: Args, ctx: &Context) -> ExitCode {
    match run(template, args, ctx).await {
        Ok(code) => code,
        Err(err) => super::exit_with(&err),
    }
}

async fn run(template: JobTemplate, args: Args, ctx: &Context) -> Result<ExitCode> {
    let client = ctx.client()?;
    let agents = if args.all { all_agents(&client, template).await? } else { args.agents };
    let created = client
        .post(JOBS, &job_body(template, &agents, args.reason.as_deref(), args.priority))
        .await
        .map_err(|e| {
            client::with_operation(e, format!("error when submitting a {} job", template.as_str()))
        })?;
    let job: Job = serde_json::from_value(created).context("the server answered with something not a Job")?;
    let name = job.metadata.name.clone();
    // The name first, so `hive logs job/NAME` and `hive cancel NAME` are at hand.
    output::print(&format!("job.hive.dev/{name} submitted\n"))?;
    if args.no_wait {
        return Ok(ExitCode::SUCCESS);
    }
    let jobs = follow(&client, &name, job, std::io::stdout().is_terminal()).await?;
    let failures = progress::failures(&name, &jobs);
    for failure in &failures {
        output::eprint_line(&format!("error: {failure}"));
    }
    Ok(if failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The names of the agents `--all` means for `template` (see [`in_all`]).
async fn all_agents(client: &Client, template: JobTemplate) -> Result<Vec<String>> {
    let list = client.get("/apis/hive.dev/v1/agents").await?;
    let list: AgentList = client::decode(&list, "AgentList")?;
    if list.items.is_empty() {
        anyhow::bail!("no agents found: there is nothing to act on");
    }
    let names: Vec<String> =
        list.items.iter().filter(|a| in_all(template, a)).map(|a| a.metadata.name.clone()).collect();
    if names.is_empty() {
        anyhow::bail!(
            "no agent is wanted Up: there is nothing to restart (`hive start --all` starts them all)"
        );
    }
    Ok(names)
}

/// Whether `--all` of `template` takes `agent`: every agent, except that a restart
/// leaves out the agents kept Offline.
fn in_all(template: JobTemplate, agent: &Agent) -> bool {
    template != JobTemplate::Restart || agent.spec.wanted == Wanted::Up
}

/// Polls the Job tree rooted at `name`, printing progress, until every DAG in it is
/// terminal; returns the last Jobs read. `first` is the Job as created, shown at once.
///
/// On a terminal: [`board`]'s one line per agent, redrawn in place, then its summary;
/// otherwise [`board::plain`]'s line per agent, printed when that agent's part changed.
async fn follow(client: &Client, name: &str, first: Job, tty: bool) -> Result<Vec<Job>> {
    let mut screen = progress::Screen::new(tty);
    let width = terminal::width().unwrap_or(80);
    let mut jobs = vec![first];
    let mut unreachable_since: Option<tokio::time::Instant> = None;
    loop {
        let now = crate::host::now();
        let lines = if tty { board::lines(name, &jobs, now, width) } else { board::plain(name, &jobs, now) };
        output::print_screen(&screen.update(&lines))?;
        let tree = progress::tree(name, &jobs);
        if !tree.is_empty() && tree.iter().all(|(_, j)| progress::is_terminal(j)) {
            if tty {
                output::print(&format!("{}\n", board::summary(name, &jobs, now)))?;
            }
            return Ok(jobs);
        }
        tokio::time::sleep(POLL).await;
        let fresh = match client.get(JOBS).await {
            Ok(list) => list,
            // A daemon restarting or a dropped connection: keep the last state and retry
            // for a while (a restart marks the Job interrupted, which ends the wait).
            Err(e) if client::api_error(&e).is_none() => {
                let since = *unreachable_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() > UNREACHABLE {
                    return Err(e.context(format!("lost the server while following job {name}")));
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        unreachable_since = None;
        let list: JobList = serde_json::from_value(fresh).context("the server sent a malformed JobList")?;
        if !list.items.iter().any(|j| j.metadata.name == name) {
            // Terminal Jobs past the history limit are deleted; one that vanished before
            // we saw it finish cannot be followed any more.
            anyhow::bail!("job {name} disappeared before it finished (deleted, or pruned from the history)");
        }
        jobs = list.items;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_names_template_agents_and_source() {
        let body = job_body(JobTemplate::Stop, &["a".into(), "b".into()], Some("maintenance"), None);
        assert_eq!(
            body,
            json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {},
                   "spec": {"template": "Stop", "agents": ["a", "b"], "source": "Cli", "reason": "maintenance"}})
        );
        let body = job_body(JobTemplate::Kill, &["a".into()], None, Some(-5));
        assert!(body["spec"].get("reason").is_none());
        assert_eq!(body["spec"]["priority"], json!(-5));
    }

    #[test]
    fn all_is_every_agent_except_the_offline_ones_for_restart() {
        let agent = |wanted: Wanted| {
            let mut agent = Agent::new("a", Default::default());
            agent.spec.wanted = wanted;
            agent
        };
        let (up, offline) = (agent(Wanted::Up), agent(Wanted::Offline));
        use JobTemplate::{Kill, Rebuild, Restart, Start, Stop};
        for template in [Start, Stop, Rebuild, Kill] {
            assert!(in_all(template, &up) && in_all(template, &offline), "{template:?}");
        }
        assert!(in_all(Restart, &up));
        assert!(!in_all(Restart, &offline));
    }
}
