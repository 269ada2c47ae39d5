//! The `hive` command line: one file per verb, each with a clap `Args` struct and an
//! `exec` function. The verbs speak only the public REST API, through [`client::Client`];
//! rendering lives in pure functions (JSON in, `String` out) so it can be snapshot-tested.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hive_api::job::JobTemplate;

pub mod apply;
pub mod approve;
pub mod audit;
pub mod bench;
pub mod board;
pub mod cancel;
pub mod client;
pub mod columns;
pub mod completion;
pub mod delete;
pub mod describe;
pub mod duration;
pub mod events;
pub mod fleet;
pub mod fleet_worker;
pub mod get;
pub mod jobs;
pub mod jsonpath;
pub mod kind;
pub mod logs;
pub mod manifest;
pub mod mcp;
pub mod openapi;
pub mod output;
pub mod power;
pub mod progress;
pub mod schemas;
pub mod serve;
pub mod terminal;
pub mod token;
pub mod top;
pub mod version;
pub mod wait;

/// hive: a declarative control plane for agents, approvals and fleet nodes.
///
/// The same binary runs the daemon (`hive serve`) and talks to it. Client commands find
/// the server, its CA and a token in a kubeconfig file: `--kubeconfig`, else
/// `$HIVE_KUBECONFIG`, else the one `hive serve` wrote.
#[derive(Parser, Debug)]
#[command(name = "hive", version, propagate_version = true, max_term_width = 100)]
pub struct Cli {
    /// Path of the kubeconfig file to use (default: `$HIVE_KUBECONFIG`, then the one
    /// written by `hive serve`).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

/// Every `hive` subcommand.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create or update objects from manifests (server-side apply).
    ///
    /// Reads multi-document YAML or JSON (including `kind: List`) from files, directories
    /// (recursively: every .yaml, .yml and .json file, in path order) or stdin. Every
    /// document must be `apiVersion: hive.dev/v1` with a known kind and a `metadata.name`.
    /// All documents are checked before anything is sent: if one is invalid, nothing is
    /// applied (`--continue-on-error` applies the valid ones). Objects are then applied in
    /// order; an object the server refuses is named with the server's message and the
    /// rest are still applied, as kubectl does, and the command exits 1 at the end. Each
    /// object prints `created`, `configured` or `unchanged`.
    Apply(apply::Args),
    /// List objects in a table, or print them as YAML, JSON or names.
    ///
    /// KIND is a plural (`agents`), singular (`agent`), short name (`ag`), Kind (`Agent`)
    /// or `agents.hive.dev`, in any case; several kinds are separated by commas; `all`
    /// (or `hive`) means every kind.
    Get(get::Args),
    /// Show the details of objects: metadata, spec, status, conditions and events.
    Describe(describe::Args),
    /// Delete objects by kind and name, by label, or from manifests.
    Delete(delete::Args),
    /// Show the events recorded about an object (or all), oldest first; follow them with -w.
    Events(events::Args),
    /// Wait until objects meet a condition, match a JSONPath value, or are deleted.
    ///
    /// A wait for a condition or a value ends at once (exit 1, naming the phase and the
    /// failed node's error) when the object reaches a failed terminal phase it cannot
    /// leave: a Job Failed, Cancelled or Interrupted, an Approval Denied or Failed, a
    /// FleetCommand Failed.
    Wait(wait::Args),
    /// Start agents (a stale agent is rebuilt first), as one Job; follow its progress.
    ///
    /// Submits one Job for all the agents named (or every agent with --all) and follows
    /// it until it ends. On a terminal: one line per agent, redrawn in place, with its
    /// state glyph (· queued, ⟳ running, ✓ done, ✗ failed, ⊘ cancelled, ! interrupted),
    /// the template, the time it took and its node chain with the running node's step,
    /// each cut to the width; then a summary (`5/6 done, 1 failed: researcher`).
    /// Otherwise (a pipe, a log): a line per agent (`✓ Restart alpha: set-wanted ✓ →
    /// reconcile ✓`), printed each time that agent's part changes. Fan-out children
    /// show up under their parent (`↳`). Exits 1 if any DAG did not
    /// end done, naming the failed nodes and their errors.
    #[command(mut_arg("all", |a| a.help("Start every agent, Offline ones too (their spec.wanted becomes Up)")))]
    #[command(after_help = "Examples:
  hive start alpha
  hive start alpha beta --reason 'after maintenance'
  hive start --all --no-wait")]
    Start(power::Args),
    /// Stop agents gracefully (signal, wait for the harness to drain, stop), as one Job.
    ///
    /// Progress and exit code as for `hive start`.
    #[command(mut_arg("all", |a| a.help("Stop every agent")))]
    #[command(after_help = "Examples:
  hive stop alpha
  hive stop --all --reason 'host maintenance'
  hive stop alpha --no-wait")]
    Stop(power::Args),
    /// Restart agents (graceful drain, stop, start), as one Job.
    ///
    /// A named agent that is stopped is started. `--all` restarts what should run: the
    /// agents whose spec.wanted is Up; an agent kept Offline stays down (`hive start
    /// --all` starts every agent). Progress and exit code as for `hive start`.
    #[command(mut_arg("all", |a| a.help(
        "Restart every agent whose spec.wanted is Up; agents kept Offline stay down"
    )))]
    #[command(after_help = "Examples:
  hive restart alpha beta
  hive restart --all   # the agents wanted Up")]
    Restart(power::Args),
    /// Rebuild agents at their configured rev while the old generation keeps serving,
    /// then swap, as one Job.
    ///
    /// Progress and exit code as for `hive start`; a build failure leaves the running
    /// generation untouched.
    #[command(mut_arg("all", |a| a.help("Rebuild every agent (an Offline one is built and stays stopped)")))]
    #[command(after_help = "Examples:
  hive rebuild alpha
  hive logs job/NAME -f   # the build output, NAME from `hive jobs`")]
    Rebuild(power::Args),
    /// Stop agents at once, without a graceful drain, as one Job.
    ///
    /// Progress and exit code as for `hive start`.
    #[command(mut_arg("all", |a| a.help("Kill every agent")))]
    #[command(after_help = "Examples:
  hive kill alpha
  hive kill --all")]
    Kill(power::Args),
    /// List the job queue and history.
    Jobs(jobs::Args),
    /// Cancel a Job that has not started yet.
    Cancel(cancel::Args),
    /// Show CPU and memory of agents and fleet nodes, as kubectl top.
    ///
    /// An agent's CPU (percent of one core over a one-second window) and resident
    /// memory are its process tree's on the daemon's host; a node's come from its
    /// worker's telemetry.
    Top(top::Args),
    /// Approve a pending Approval, then follow it until it is deployed.
    ///
    /// The decision (and who made it, and when) is recorded once; the Approval
    /// controller then runs the change as a Job (an approval deploy, a spawn, a
    /// meta-update). Operators only.
    Approve(approve::ApproveArgs),
    /// Deny a pending Approval, saying why.
    Deny(approve::DenyArgs),
    /// Show the deploy audit trail (the meta repo's git log), or with --api the API audit log.
    Audit(audit::Args),
    /// Print a Job node's build log or an agent's output.
    Logs(logs::Args),
    /// Create, list and revoke API tokens (admin only).
    Token(token::Args),
    /// Run the hive daemon.
    Serve(Box<serve::Args>),
    /// Print the OpenAPI document.
    Openapi(openapi::Args),
    /// Print the JSON Schemas of every kind.
    Schemas(schemas::Args),
    /// Print the client and server versions.
    Version(version::Args),
    /// Print a shell completion script (bash, zsh, fish).
    Completion(completion::Args),
    /// Measure a fresh daemon from outside: durable creates, watch delivery, list, memory.
    Bench(bench::Args),
    /// Serve the Model Context Protocol on stdin/stdout, so AI agents use the API as tools.
    Mcp(mcp::Args),
    /// Manage the fleet: provision nodes, kill one, list them.
    Fleet(fleet::Args),
    /// Run one fleet node's worker (started by the daemon or a node's entrypoint).
    #[command(hide = true)]
    FleetWorker(fleet_worker::Args),
}

/// What every verb gets besides its own arguments: the global flags, and the means to
/// reach the server.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// `--kubeconfig`, if given.
    pub kubeconfig: Option<PathBuf>,
}

impl Context {
    /// A client for the server named by the current kubeconfig context. Built on demand:
    /// `serve`, `openapi` and `schemas` need no kubeconfig at all.
    pub fn client(&self) -> anyhow::Result<client::Client> {
        client::Client::from_kubeconfig(self.kubeconfig.as_deref())
    }
}

/// An error that has already been printed to stderr; `main` only turns it into exit
/// code 1. Verbs that report several problems (one line each) return it at the end.
#[derive(Debug)]
pub struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("errors were reported above")
    }
}

impl std::error::Error for Reported {}

/// Reads the command line; a bad one exits here, with clap's message naming the flag and
/// exit code 2, before anything else runs.
pub fn parse() -> Cli {
    Cli::parse()
}

impl Cli {
    /// How many worker threads the async runtime is built with (`hive serve
    /// --worker-threads`); `None`: tokio's default, one a core.
    pub fn worker_threads(&self) -> Option<usize> {
        match &self.command {
            Command::Serve(args) => args.worker_threads.map(usize::from),
            _ => None,
        }
    }
}

/// Runs the verb `cli` names and maps its outcome to an exit code: 0 on success, 1 on
/// any failure (printed kubectl-style on stderr), 2 for usage errors.
pub async fn run(cli: Cli) -> ExitCode {
    let ctx = Context { kubeconfig: cli.kubeconfig };
    let result = match cli.command {
        Command::Apply(args) => apply::exec(args, &ctx).await,
        Command::Get(args) => get::exec(args, &ctx).await,
        Command::Describe(args) => describe::exec(args, &ctx).await,
        Command::Delete(args) => delete::exec(args, &ctx).await,
        Command::Events(args) => events::exec(args, &ctx).await,
        Command::Wait(args) => return wait::exec(args, &ctx).await,
        Command::Start(args) => return power::exec(JobTemplate::Start, args, &ctx).await,
        Command::Stop(args) => return power::exec(JobTemplate::Stop, args, &ctx).await,
        Command::Restart(args) => return power::exec(JobTemplate::Restart, args, &ctx).await,
        Command::Rebuild(args) => return power::exec(JobTemplate::Rebuild, args, &ctx).await,
        Command::Kill(args) => return power::exec(JobTemplate::Kill, args, &ctx).await,
        Command::Jobs(args) => jobs::exec(args, &ctx).await,
        Command::Cancel(args) => cancel::exec(args, &ctx).await,
        Command::Top(args) => top::exec(args, &ctx).await,
        Command::Approve(args) => approve::approve(args, &ctx).await,
        Command::Deny(args) => approve::deny(args, &ctx).await,
        Command::Audit(args) => audit::exec(args, &ctx).await,
        Command::Logs(args) => logs::exec(args, &ctx).await,
        Command::Token(args) => token::exec(args, &ctx).await,
        Command::Serve(args) => serve::exec(*args, &ctx).await,
        Command::Openapi(args) => openapi::exec(args, &ctx).await,
        Command::Schemas(args) => schemas::exec(args, &ctx).await,
        Command::Version(args) => version::exec(args, &ctx).await,
        Command::Completion(args) => completion::exec(args, &ctx).await,
        Command::Bench(args) => bench::exec(args, &ctx).await,
        Command::Mcp(args) => mcp::exec(args, &ctx).await,
        Command::Fleet(args) => fleet::exec(args, &ctx).await,
        Command::FleetWorker(args) => fleet_worker::exec(args, &ctx).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => exit_with(&err),
    }
}

/// Prints `err` the way kubectl would and returns the exit code for it. A closed stdout
/// (`hive get agents | head -1`) is not an error.
pub fn exit_with(err: &anyhow::Error) -> ExitCode {
    if is_broken_pipe(err) {
        return ExitCode::SUCCESS;
    }
    if let Some(text) = render_error(err) {
        output::eprint_line(&text.to_string());
    }
    ExitCode::FAILURE
}

/// The stderr text for a failed command, or `None` when it was already printed.
pub fn render_error(err: &anyhow::Error) -> Option<String> {
    if err.chain().any(|e| e.is::<Reported>()) {
        return None;
    }
    if let Some(api) = err.chain().find_map(|e| e.downcast_ref::<client::ApiError>()) {
        return Some(api.render());
    }
    Some(format!("error: {err:#}"))
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn reported_errors_are_not_printed_twice() {
        let err = anyhow::Error::new(Reported).context("outer");
        assert_eq!(render_error(&err), None);
    }

    #[test]
    fn other_errors_print_their_chain() {
        let err = anyhow::anyhow!("inner").context("outer");
        assert_eq!(render_error(&err).unwrap(), "error: outer: inner");
    }
}
