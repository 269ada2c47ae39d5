//! `hive mcp`: the Model Context Protocol over stdin/stdout, so AI agents (and their
//! operators' assistants) use the hive API through tools: who am I, agent state, power
//! operations through the submit layer, following a Job, and requesting an approval for
//! the caller's own config change. A client of the public REST API only (through
//! [`Client`]), scoped by the token the kubeconfig gives it; stdout carries the
//! protocol, logs go to stderr.

mod view;

use std::time::Duration;

use anyhow::{Context as _, Result};
use hive_api::job::{JobSource, JobTemplate};
use hive_api::JobList;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::schemars::JsonSchema;
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt as _};
use serde::Deserialize;
use serde_json::{json, Value};

use self::view::{Reply, Wait};
use super::client::{self, encode, Client};
use super::logs::{self, Target};
use super::{power, Context};

const AGENTS: &str = "/apis/hive.dev/v1/agents";
const JOBS: &str = "/apis/hive.dev/v1/jobs";
const APPROVALS: &str = "/apis/hive.dev/v1/approvals";
const WHOAMI: &str = "/hive/v1/whoami";

/// How often `follow_job` reads the Job tree.
const POLL: Duration = Duration::from_millis(250);
/// `follow_job`'s wait when the caller names none, and the longest it accepts.
const DEFAULT_FOLLOW_SECS: u64 = 60;
const MAX_FOLLOW_SECS: u64 = 600;
/// How much of a failed node's log `follow_job` returns.
const TAIL_LINES: usize = 40;
const TAIL_BYTES: usize = 8 * 1024;

/// Serve the Model Context Protocol on stdin/stdout for AI agents.
#[derive(clap::Args, Debug)]
#[command(after_help = "Configure it in an MCP client as a stdio server, e.g.:
  {\"command\": \"hive\", \"args\": [\"--kubeconfig\", \"/path/to/agent-kubeconfig.yaml\", \"mcp\"]}

The tools act with the kubeconfig's token: an agent's own token (role agent) reads
everything and requests approvals for that agent only.")]
pub struct Args {
    /// Log filter for stderr, e.g. `info`, `hive=debug` (also `RUST_LOG`).
    #[arg(long, value_name = "FILTER", env = "RUST_LOG", default_value = "warn")]
    pub log: String,
}

/// Runs `hive mcp` until the client closes stdin.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // stdout is the protocol: every log line goes to stderr.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(crate::host::output::Stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .log_internal_errors(false)
        .try_init();
    let client = ctx.client()?;
    tracing::info!(server = client.server(), "serving MCP on stdio");
    let service = Server::new(client)
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP client did not complete the initialize handshake")?;
    service.waiting().await.context("the MCP service stopped abnormally")?;
    Ok(())
}

/// The MCP server: the tools, each a few REST calls through one [`Client`].
#[derive(Debug, Clone)]
pub struct Server {
    client: Client,
    tool_router: ToolRouter<Server>,
}

/// `get_agent`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct AgentName {
    /// The agent's name (`metadata.name`).
    pub name: String,
}

/// A power operation; each is one Job built by the submit layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(crate = "rmcp::schemars")]
pub enum Operation {
    /// Start the agents (a stale agent is rebuilt first).
    Start,
    /// Stop gracefully: signal, wait for the harness to drain, stop.
    Stop,
    /// Graceful drain, stop, start.
    Restart,
    /// Build at the configured rev while the old generation keeps serving, then swap.
    Rebuild,
    /// Stop at once, without a graceful drain.
    Kill,
}

impl Operation {
    fn template(self) -> JobTemplate {
        match self {
            Operation::Start => JobTemplate::Start,
            Operation::Stop => JobTemplate::Stop,
            Operation::Restart => JobTemplate::Restart,
            Operation::Rebuild => JobTemplate::Rebuild,
            Operation::Kill => JobTemplate::Kill,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Operation::Start => "start",
            Operation::Stop => "stop",
            Operation::Restart => "restart",
            Operation::Rebuild => "rebuild",
            Operation::Kill => "kill",
        }
    }
}

/// `power`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct PowerArgs {
    /// What to do.
    pub operation: Operation,
    /// The agents to act on (at least one); all of them go into one Job.
    #[schemars(length(min = 1))]
    pub agents: Vec<String>,
    /// Why, recorded in the Job's `spec.reason`.
    #[serde(default)]
    pub reason: Option<String>,
    /// The Job's `spec.priority`, -1000 to 1000 (default 0; the boot sweep runs at -10):
    /// its nodes go before lower priorities' for a build slot or an agent's lease.
    #[serde(default)]
    #[schemars(range(min = -1000, max = 1000))]
    pub priority: Option<i32>,
}

/// `follow_job`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct FollowArgs {
    /// The Job's name, as `power` returned it.
    pub name: String,
    /// How long to wait for the Job (and its fan-out children) to finish, in seconds
    /// (at most 600). When it passes, the tool answers with the Job as it stands; call
    /// it again to keep waiting.
    #[serde(default = "default_follow_secs")]
    #[schemars(range(max = 600))]
    pub timeout_seconds: u64,
}

fn default_follow_secs() -> u64 {
    DEFAULT_FOLLOW_SECS
}

/// The config changes an agent may ask approval for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub enum ApprovalKind {
    /// Apply a commit of the agent's config repository (`commit` required).
    ApplyCommit,
    /// Merge a pull request against the agent's config repository, then deploy it
    /// (`pull_request` required; `commit` optionally pins the head that was reviewed).
    MergeConfigPr,
}

impl ApprovalKind {
    fn as_str(self) -> &'static str {
        match self {
            ApprovalKind::ApplyCommit => "ApplyCommit",
            ApprovalKind::MergeConfigPr => "MergeConfigPr",
        }
    }
}

/// `request_approval`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ApprovalArgs {
    /// What kind of change.
    pub kind: ApprovalKind,
    /// `ApplyCommit`: the commit to apply. `MergeConfigPr`: optionally, the head commit
    /// that was reviewed (the merge fails if the PR has moved on).
    #[serde(default)]
    pub commit: Option<String>,
    /// `MergeConfigPr`: the pull request, as a URL or a number.
    #[serde(default)]
    pub pull_request: Option<String>,
    /// One line for the operator who decides: what changes and why.
    pub summary: String,
    /// The agent the change is for. An agent's own token may leave it out (it is that
    /// agent) and may not name another; any other token must name it.
    #[serde(default)]
    pub agent: Option<String>,
}

/// `list_approvals`' arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ListApprovalsArgs {
    /// Only the approvals still waiting for a decision.
    #[serde(default)]
    pub pending_only: bool,
}

/// A tool's outcome before it becomes MCP content: a reply, or a message for the caller.
type Outcome = Result<Reply, anyhow::Error>;

/// A reply as two text blocks: the one-line summary, then the compact JSON.
fn success(reply: Reply) -> CallToolResult {
    CallToolResult::success(vec![
        ContentBlock::text(reply.summary),
        ContentBlock::text(reply.data.to_string()),
    ])
}

/// A failure as a tool error the caller sees: the server's `Status` rendered as kubectl
/// would (`Error from server (NotFound): agents.hive.dev "x" not found`), or our own
/// message. The client never puts the token in an error.
fn failure(err: &anyhow::Error) -> CallToolResult {
    let message = match client::api_error(err) {
        Some(api) => api.render(),
        None => format!("error: {err:#}"),
    };
    CallToolResult::error(vec![ContentBlock::text(message)])
}

fn answer(tool: &str, outcome: Outcome) -> Result<CallToolResult, ErrorData> {
    Ok(match outcome {
        Ok(reply) => success(reply),
        Err(err) => {
            tracing::info!(tool, error = %format!("{err:#}"), "tool failed");
            failure(&err)
        }
    })
}

/// Who the token is, from `GET /hive/v1/whoami`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Caller {
    role: String,
    agent: Option<String>,
}

/// The agent an approval targets: an agent token's own agent (naming another is
/// refused here, before any request, and by the server too); any other token must name
/// one.
fn approval_target(caller: &Caller, named: Option<&str>) -> Result<String> {
    match (caller.role.as_str(), caller.agent.as_deref(), named) {
        ("agent", Some(own), Some(other)) if other != own => anyhow::bail!(
            "refused: this token is bound to agent {own:?}; it may request approvals only for \
             itself, not for {other:?}"
        ),
        ("agent", Some(own), _) => Ok(own.to_string()),
        ("agent", None, _) => {
            anyhow::bail!("this agent token is bound to no agent; ask an operator for a new one")
        }
        (_, _, Some(named)) if !named.is_empty() => Ok(named.to_string()),
        (role, _, _) => anyhow::bail!(
            "name the agent the change is for in `agent`: this token (role {role}) is not bound \
             to one agent"
        ),
    }
}

/// `<agent>-<kind in lowercase>-<6 random hex digits>`, within the 253 characters of a name.
fn approval_name(agent: &str, kind: ApprovalKind, random: &str) -> String {
    let suffix = format!("-{}-{random}", kind.as_str().to_ascii_lowercase());
    let room = 253usize.saturating_sub(suffix.len());
    let agent: String = agent.chars().take(room).collect();
    format!("{}{suffix}", agent.trim_end_matches(['-', '.']))
}

/// The Approval object `request_approval` creates.
fn approval_body(name: &str, target: &str, args: &ApprovalArgs) -> Value {
    let mut payload = json!({});
    if let Some(commit) = &args.commit {
        payload["commit"] = json!(commit);
    }
    if let Some(pr) = &args.pull_request {
        payload["pullRequest"] = json!(pr);
    }
    json!({
        "apiVersion": "hive.dev/v1",
        "kind": "Approval",
        "metadata": {"name": name},
        "spec": {
            "kind": args.kind.as_str(),
            "target": target,
            "payload": payload,
            "requestedBy": target,
            "summary": args.summary,
        },
    })
}

/// The Job body of a power operation, as `hive start` builds it, from an MCP client.
fn power_body(operation: Operation, agents: &[String], reason: Option<&str>, priority: Option<i32>) -> Value {
    power::job_body_from(JobSource::Mcp, operation.template(), agents, reason, priority)
}

impl Server {
    /// A server acting through `client`.
    pub fn new(client: Client) -> Server {
        Server { client, tool_router: Server::tool_router() }
    }

    async fn caller(&self) -> Result<Caller> {
        let me = self.client.get(WHOAMI).await?;
        let role = me.get("role").and_then(Value::as_str).unwrap_or_default().to_string();
        let agent = me.get("agent").and_then(Value::as_str).map(str::to_string);
        Ok(Caller { role, agent })
    }

    async fn follow(&self, name: &str, timeout: Duration) -> Outcome {
        let started = tokio::time::Instant::now();
        // A wrong name is the server's NotFound, not a wait that times out.
        self.client.get(&format!("{JOBS}/{}", encode(name))).await?;
        loop {
            let list = self.client.get(JOBS).await?;
            let list: JobList =
                serde_json::from_value(list).context("the server sent a malformed JobList")?;
            if !list.items.iter().any(|j| j.metadata.name == name) {
                anyhow::bail!(
                    "job {name} disappeared before it finished (deleted, or pruned from the history)"
                );
            }
            let tree = super::progress::tree(name, &list.items);
            let finished = tree.iter().all(|(_, j)| super::progress::is_terminal(j));
            let elapsed = started.elapsed();
            if finished || elapsed >= timeout {
                let wait = if finished { Wait::Finished } else { Wait::TimedOut(elapsed.as_secs()) };
                let mut tails = view::LogTails::new();
                for (job, node) in view::failed_nodes(name, &list.items) {
                    if let Some(tail) = self.log_tail(&job, &node).await {
                        tails.insert((job, node), tail);
                    }
                }
                return Ok(view::job_tree(name, &list.items, wait, &tails));
            }
            tokio::time::sleep(POLL.min(timeout - elapsed)).await;
        }
    }

    /// The end of a node's build log; `None` when the server keeps none for it.
    async fn log_tail(&self, job: &str, node: &str) -> Option<String> {
        let path =
            logs::log_path(&Target::Job(job.to_string()), Some(node), false, &logs::AgentLogQuery::default());
        let mut stream = match self.client.stream(&path).await {
            Ok(stream) => stream,
            Err(err) => {
                tracing::debug!(job, node, error = %format!("{err:#}"), "no node log");
                return None;
            }
        };
        // Keep only the end: a build log can be long.
        let mut kept: Vec<u8> = Vec::new();
        while let Ok(Some(chunk)) = stream.next().await {
            kept.extend_from_slice(&chunk);
            if kept.len() > 2 * TAIL_BYTES {
                kept.drain(..kept.len() - TAIL_BYTES);
            }
        }
        let tail = view::tail(&String::from_utf8_lossy(&kept), TAIL_LINES, TAIL_BYTES);
        (!tail.is_empty()).then_some(tail)
    }

    async fn request(&self, args: &ApprovalArgs) -> Outcome {
        let caller = match self.caller().await {
            Ok(caller) => caller,
            // A server without whoami: only an explicitly named agent will do.
            Err(e) if client::is_not_found(&e) => Caller { role: "unknown".into(), agent: None },
            Err(e) => return Err(e),
        };
        let target = approval_target(&caller, args.agent.as_deref())?;
        // The server takes an approval for an agent that does not exist (a Spawn's target
        // is new); one for a config change could never deploy: refused here, named.
        if let Err(e) = self.client.get(&format!("{AGENTS}/{}", encode(&target))).await {
            if client::is_not_found(&e) {
                anyhow::bail!(
                    "there is no agent named {target:?}: an approval asks to change an existing agent's config"
                );
            }
            return Err(e);
        }
        let random = uuid::Uuid::new_v4().simple().to_string();
        let name = approval_name(&target, args.kind, &random[..6]);
        let created = self.client.post(APPROVALS, &approval_body(&name, &target, args)).await?;
        Ok(view::approval_created(&created))
    }
}

#[tool_router]
impl Server {
    #[tool(
        description = "Who this MCP server acts as: the token's name, its role (viewer, agent, operator \
                       or admin) and, for an agent token, the one agent it is bound to.",
        annotations(read_only_hint = true)
    )]
    async fn whoami(&self) -> Result<CallToolResult, ErrorData> {
        answer("whoami", self.client.get(WHOAMI).await.map(|me| view::whoami(&me)))
    }

    #[tool(
        description = "List every agent: name, wanted power (Up/Offline), observed power, applied \
                       config rev, the Ready condition, the Job currently holding it and the fleet \
                       node it is placed on (no `node`: the daemon's own host).",
        annotations(read_only_hint = true)
    )]
    async fn list_agents(&self) -> Result<CallToolResult, ErrorData> {
        answer("list_agents", self.client.get(AGENTS).await.map(|list| view::agent_list(&list)))
    }

    #[tool(
        description = "One agent in detail: its spec in brief (wanted, config repo and rev, runtime \
                       type, resources, permissions, parent, and `node`: the fleet node it is placed \
                       on, absent when it runs on the daemon's own host), its status and all its \
                       conditions (`Placed` says whether its node runs it).",
        annotations(read_only_hint = true)
    )]
    async fn get_agent(&self, Parameters(args): Parameters<AgentName>) -> Result<CallToolResult, ErrorData> {
        let path = format!("{AGENTS}/{}", encode(&args.name));
        answer("get_agent", self.client.get(&path).await.map(|agent| view::agent(&agent)))
    }

    #[tool(
        description = "Start, stop, restart, rebuild or kill agents: submits ONE Job for all of them \
                       through the submit layer (as `hive start` does) and returns its name at once, \
                       without waiting; call follow_job with that name to see it finish. Needs an \
                       operator token.",
        annotations(destructive_hint = true)
    )]
    async fn power(&self, Parameters(args): Parameters<PowerArgs>) -> Result<CallToolResult, ErrorData> {
        let outcome = async {
            if args.agents.is_empty() {
                anyhow::bail!("name at least one agent in `agents`");
            }
            let body = power_body(args.operation, &args.agents, args.reason.as_deref(), args.priority);
            let job = self.client.post(JOBS, &body).await.map_err(|e| {
                client::with_operation(e, format!("error when submitting a {} job", args.operation.as_str()))
            })?;
            Ok(view::submitted(&job, args.operation.as_str(), &args.agents))
        };
        answer("power", outcome.await)
    }

    #[tool(
        description = "Wait for a Job and its fan-out children to finish (or for timeout_seconds, \
                       default 60, at most 600), then return its phase, every DAG's node chain with \
                       each node's state, step and error, and the tail of each failed node's log.",
        annotations(read_only_hint = true)
    )]
    async fn follow_job(
        &self,
        Parameters(args): Parameters<FollowArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        // The schema says 600 at most; a client that asks for more waits 600 s.
        let secs = args.timeout_seconds.min(MAX_FOLLOW_SECS);
        answer("follow_job", self.follow(&args.name, Duration::from_secs(secs)).await)
    }

    #[tool(
        description = "Ask an operator to approve a config change of the calling agent: ApplyCommit \
                       (a commit of its config repo) or MergeConfigPr (a pull request against it). \
                       Creates a pending Approval targeting the agent this token is bound to (an \
                       operator token names it in `agent`) and returns its name and phase; nothing \
                       changes until an operator approves.",
        annotations(destructive_hint = false)
    )]
    async fn request_approval(
        &self,
        Parameters(args): Parameters<ApprovalArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer("request_approval", self.request(&args).await)
    }

    #[tool(
        description = "List approvals: name, kind, target agent, who requested it, summary, the \
                       decision and the phase; pending_only keeps those still waiting for a decision.",
        annotations(read_only_hint = true)
    )]
    async fn list_approvals(
        &self,
        Parameters(args): Parameters<ListApprovalsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let outcome =
            self.client.get(APPROVALS).await.map(|list| view::approval_list(&list, args.pending_only));
        answer("list_approvals", outcome)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("hive", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "hive is a control plane for agents. Every tool answers with two text blocks: a \
                 one-line summary, then compact JSON. Power operations submit a Job and return at \
                 once; follow_job waits for it. Tools act with this server's token (see whoami).",
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(role: &str, agent: Option<&str>) -> Caller {
        Caller { role: role.into(), agent: agent.map(str::to_string) }
    }

    #[test]
    fn an_agent_token_targets_itself_only() {
        let alpha = caller("agent", Some("alpha"));
        assert_eq!(approval_target(&alpha, None).unwrap(), "alpha");
        assert_eq!(approval_target(&alpha, Some("alpha")).unwrap(), "alpha");
        let err = approval_target(&alpha, Some("beta")).unwrap_err().to_string();
        assert!(err.contains("bound to agent \"alpha\"") && err.contains("not for \"beta\""), "{err}");
        assert!(approval_target(&caller("agent", None), None).is_err());
    }

    #[test]
    fn other_tokens_name_the_agent() {
        let operator = caller("operator", None);
        assert_eq!(approval_target(&operator, Some("beta")).unwrap(), "beta");
        let err = approval_target(&operator, None).unwrap_err().to_string();
        assert!(err.contains("name the agent") && err.contains("(role operator)"), "{err}");
        assert!(approval_target(&operator, Some("")).is_err());
    }

    #[test]
    fn approval_names_and_bodies() {
        assert_eq!(approval_name("alpha", ApprovalKind::ApplyCommit, "1a2b3c"), "alpha-applycommit-1a2b3c");
        let long = "a".repeat(300);
        let name = approval_name(&long, ApprovalKind::MergeConfigPr, "1a2b3c");
        assert_eq!(name.len(), 253);
        assert!(name.ends_with("-mergeconfigpr-1a2b3c"));

        let args = ApprovalArgs {
            kind: ApprovalKind::MergeConfigPr,
            commit: None,
            pull_request: Some("17".into()),
            summary: "enable the search tool".into(),
            agent: None,
        };
        assert_eq!(
            approval_body("alpha-mergeconfigpr-1a2b3c", "alpha", &args),
            json!({"apiVersion": "hive.dev/v1", "kind": "Approval",
                   "metadata": {"name": "alpha-mergeconfigpr-1a2b3c"},
                   "spec": {"kind": "MergeConfigPr", "target": "alpha", "payload": {"pullRequest": "17"},
                            "requestedBy": "alpha", "summary": "enable the search tool"}})
        );
    }

    #[test]
    fn power_jobs_come_from_mcp() {
        let body = power_body(Operation::Restart, &["alpha".into()], Some("stuck"), Some(10));
        assert_eq!(body["spec"]["source"], json!("Mcp"));
        assert_eq!(body["spec"]["template"], json!("Restart"));
        assert_eq!(body["spec"]["reason"], json!("stuck"));
        assert_eq!(body["spec"]["priority"], json!(10));
    }

    #[test]
    fn tools_have_snake_case_names_and_object_schemas() {
        let tools = Server::tool_router().list_all();
        let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "follow_job",
                "get_agent",
                "list_agents",
                "list_approvals",
                "power",
                "request_approval",
                "whoami"
            ]
        );
        for tool in &tools {
            assert_eq!(tool.input_schema.get("type"), Some(&json!("object")), "{}", tool.name);
            assert!(tool.description.as_deref().is_some_and(|d| d.len() > 40), "{}", tool.name);
        }
        let power = tools.iter().find(|t| t.name == "power").unwrap();
        let schema = Value::Object((*power.input_schema).clone());
        assert_eq!(schema["required"], json!(["operation", "agents"]));
        assert_eq!(schema["properties"]["agents"]["minItems"], json!(1));
        let follow = tools.iter().find(|t| t.name == "follow_job").unwrap();
        let timeout = &follow.input_schema["properties"]["timeout_seconds"];
        assert_eq!((&timeout["default"], &timeout["maximum"]), (&json!(60), &json!(600)));
    }
}
