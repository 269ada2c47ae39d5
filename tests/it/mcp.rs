//! `hive mcp` end to end: the real binary as a child process, spoken to as an MCP client
//! would — newline-delimited JSON-RPC 2.0 on its stdin/stdout — against a real daemon.
//! Every read has a timeout, so a hang fails the test instead of blocking the suite.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::harness::{self, Daemon};

/// The longest any one answer may take (a `follow_job` included).
const READ: Duration = Duration::from_secs(20);

const TOOLS: [&str; 7] =
    ["follow_job", "get_agent", "list_agents", "list_approvals", "power", "request_approval", "whoami"];

/// A `hive mcp` child and the client half of its stdio (also used by `placement_surfaces`).
pub(crate) struct Mcp {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: PathBuf,
    next_id: u64,
}

impl Mcp {
    /// Spawns `hive --kubeconfig KUBECONFIG mcp` (stderr to a file beside it) and
    /// completes the handshake; returns the `initialize` result too.
    pub(crate) async fn start(kubeconfig: &Path) -> (Mcp, Value) {
        let stderr = kubeconfig.with_extension("mcp-stderr.log");
        let log = std::fs::File::create(&stderr).expect("stderr file");
        let mut child = Command::new(harness::hive_bin())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["mcp", "--log", "debug"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn hive mcp");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut mcp = Mcp { child, stdin, stdout, stderr, next_id: 0 };
        let init = mcp
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "hive-it", "version": "0.0.0"},
                }),
            )
            .await;
        mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        (mcp, init)
    }

    async fn send(&mut self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.send_raw(&line).await;
    }

    async fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        tokio::time::timeout(READ, async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        })
        .await
        .expect("writing to hive mcp timed out")
        .expect("write to hive mcp");
    }

    /// The next message on stdout; every line must be one JSON-RPC message.
    async fn recv(&mut self) -> Value {
        let line = tokio::time::timeout(READ, self.stdout.next_line())
            .await
            .unwrap_or_else(|_| panic!("no message from hive mcp within {READ:?}; stderr:\n{}", self.log()))
            .expect("read stdout")
            .unwrap_or_else(|| panic!("hive mcp closed stdout; stderr:\n{}", self.log()));
        let message: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
        assert_eq!(message["jsonrpc"], "2.0", "{message}");
        message
    }

    /// Sends a request and returns the whole response (`result` or `error`), skipping
    /// any notification the server sends meanwhile.
    async fn exchange(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        loop {
            let message = self.recv().await;
            if message["id"] == json!(id) {
                return message;
            }
            // Notifications, requests from the server, and errors about a line that
            // had no id (`id: null`) are not answers to anything we asked.
            let unsolicited = message.get("id").is_none_or(Value::is_null) || message.get("method").is_some();
            assert!(unsolicited, "stray response: {message}");
        }
    }

    /// A request that must succeed: its `result`.
    async fn request(&mut self, method: &str, params: Value) -> Value {
        let response = self.exchange(method, params).await;
        assert!(response.get("error").is_none(), "{method} failed: {response}");
        response["result"].clone()
    }

    /// `tools/call`: the result (`content`, `isError`).
    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments})).await
    }

    /// A successful tool call: its summary line and its JSON.
    pub(crate) async fn call_ok(&mut self, tool: &str, arguments: Value) -> (String, Value) {
        let result = self.call(tool, arguments).await;
        assert_ne!(result["isError"], json!(true), "{tool} failed: {result}");
        let content = result["content"].as_array().expect("content");
        assert_eq!(content.len(), 2, "{result}");
        let summary = content[0]["text"].as_str().expect("summary text").to_string();
        assert!(!summary.contains('\n'), "summary is one line: {summary}");
        let data =
            serde_json::from_str(content[1]["text"].as_str().expect("json text")).expect("json content");
        (summary, data)
    }

    /// A tool call that must fail as a tool error: its message.
    async fn call_err(&mut self, tool: &str, arguments: Value) -> String {
        let result = self.call(tool, arguments).await;
        assert_eq!(result["isError"], json!(true), "{tool} should have failed: {result}");
        result["content"][0]["text"].as_str().expect("error text").to_string()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Closes stdin, as a client does when it is done, and expects a clean exit.
    pub(crate) async fn close(mut self) -> String {
        drop(self.stdin.take());
        let status = tokio::time::timeout(READ, self.child.wait())
            .await
            .expect("hive mcp did not exit after stdin closed")
            .expect("wait");
        let log = self.log();
        assert!(status.success(), "hive mcp exited with {status}; stderr:\n{log}");
        log
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn create_agent(d: &Daemon, name: &str) {
    let reply = d.client().post("/apis/hive.dev/v1/agents", &harness::agent(name)).await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_handshake_lists_every_tool_with_a_schema() {
    let d = Daemon::start();
    let (mut mcp, init) = Mcp::start(&d.kubeconfig).await;
    assert_eq!(init["serverInfo"]["name"], "hive", "{init}");
    assert!(init["capabilities"]["tools"].is_object(), "{init}");
    assert!(init["protocolVersion"].is_string(), "{init}");

    let list = mcp.request("tools/list", json!({})).await;
    let tools = list["tools"].as_array().expect("tools");
    let mut names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, TOOLS);
    for tool in tools {
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
        assert!(tool["description"].as_str().is_some_and(|d| !d.is_empty()), "{tool}");
    }
    let schema = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap()["inputSchema"].clone();
    let power = schema("power");
    assert_eq!(power["required"], json!(["operation", "agents"]), "{power}");
    assert!(power.to_string().contains("\"restart\""), "{power}");
    assert!(schema("request_approval").to_string().contains("MergeConfigPr"));
    assert!(schema("follow_job")["properties"]["timeout_seconds"].is_object());
    assert_eq!(schema("get_agent")["required"], json!(["name"]));

    let (summary, me) = mcp.call_ok("whoami", json!({})).await;
    assert_eq!(me["role"], "admin", "{me}");
    assert!(summary.contains("role admin"), "{summary}");

    let log = mcp.close().await;
    assert!(!log.contains(&d.token), "the token leaked into the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_reads_agents_and_api_errors_become_tool_errors() {
    let d = Daemon::start();
    create_agent(&d, "alpha").await;
    let (mut mcp, _) = Mcp::start(&d.kubeconfig).await;

    let (summary, data) = mcp.call_ok("list_agents", json!({})).await;
    let agents = data["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 1, "{data}");
    assert_eq!(agents[0]["name"], "alpha");
    assert_eq!(agents[0]["wanted"], "Up");
    assert!(summary.starts_with("1 agent(s)") && summary.contains("alpha"), "{summary}");

    let (summary, agent) = mcp.call_ok("get_agent", json!({"name": "alpha"})).await;
    assert!(summary.starts_with("agent alpha"), "{summary}");
    assert_eq!(agent["metadata"]["name"], "alpha");
    assert_eq!(agent["spec"]["runtime"], "process");
    assert_eq!(agent["spec"]["config"]["rev"], "main");

    // The API's NotFound, as a tool error.
    let message = mcp.call_err("get_agent", json!({"name": "nope"})).await;
    assert_eq!(message, r#"Error from server (NotFound): agents.hive.dev "nope" not found"#);

    // Calls the server cannot route are JSON-RPC errors; arguments that do not fit a
    // tool's schema are tool errors naming what is wrong (the SDK follows the MCP spec
    // here, so a model can correct itself). Either way the server keeps serving, a line
    // that is not JSON included.
    let unknown = mcp.exchange("tools/call", json!({"name": "reboot_everything", "arguments": {}})).await;
    assert!(unknown["error"]["code"].is_i64(), "{unknown}");
    let method = mcp.exchange("no/such/method", json!({})).await;
    assert!(method["error"]["code"].is_i64(), "{method}");
    let message = mcp.call_err("power", json!({"operation": "explode", "agents": ["alpha"]})).await;
    assert!(message.contains("unknown variant `explode`") && message.contains("`restart`"), "{message}");
    let message = mcp.call_err("get_agent", json!({})).await;
    assert!(message.contains("missing field `name`"), "{message}");
    mcp.send_raw("this is not JSON-RPC\n").await;
    let (_, data) = mcp.call_ok("list_agents", json!({})).await;
    assert_eq!(data["agents"].as_array().unwrap().len(), 1);

    let log = mcp.close().await;
    assert!(!log.contains(&d.token), "the token leaked into the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_power_submits_one_job_and_follow_job_waits_for_it() {
    let d = Daemon::start();
    create_agent(&d, "alpha").await;
    let (mut mcp, _) = Mcp::start(&d.kubeconfig).await;

    let (summary, submitted) =
        mcp.call_ok("power", json!({"operation": "stop", "agents": ["alpha"], "reason": "mcp test"})).await;
    let name = submitted["job"].as_str().expect("job name").to_string();
    assert!(summary.contains(&name), "{summary}");
    assert_eq!(submitted["agents"], json!(["alpha"]));

    // The Job exists in the API, from the MCP source, with the intent written.
    let api = d.client();
    let job = api.get(&format!("/apis/hive.dev/v1/jobs/{name}")).await;
    assert_eq!(job.code, 200, "{:?}", job.body);
    assert_eq!(job.body["spec"]["template"], "Stop");
    assert_eq!(job.body["spec"]["source"], "Mcp");
    assert_eq!(job.body["spec"]["reason"], "mcp test");
    assert_eq!(api.get("/apis/hive.dev/v1/agents/alpha").await.body["spec"]["wanted"], "Offline");

    let (summary, followed) = mcp.call_ok("follow_job", json!({"name": name, "timeout_seconds": 15})).await;
    assert_eq!(followed["job"], json!(name));
    assert_eq!(followed["finished"], json!(true), "{summary}: {followed}");
    let phase = followed["phase"].as_str().expect("phase");
    assert!(["Done", "Failed"].contains(&phase), "{followed}");
    let nodes = followed["dags"][0]["nodes"].as_array().expect("nodes");
    assert!(nodes.iter().any(|n| n["id"] == "alpha/set-wanted"), "{followed}");
    assert!(nodes.iter().all(|n| n["state"].is_string()), "{followed}");
    assert!(summary.starts_with(&format!("job {name} finished")), "{summary}");

    // A start that cannot fetch the config fails at the build; follow_job names the
    // failed node and returns the end of its build log.
    let mut broken = harness::agent("beta");
    broken["spec"]["config"]["repo"] = json!(d.dir.join("no-such-repo").display().to_string());
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &broken).await.code, 201);
    let (_, submitted) = mcp.call_ok("power", json!({"operation": "start", "agents": ["beta"]})).await;
    let name = submitted["job"].as_str().expect("job name").to_string();
    let (summary, followed) = mcp.call_ok("follow_job", json!({"name": name, "timeout_seconds": 15})).await;
    assert_eq!(followed["phase"], "Failed", "{followed}");
    assert!(summary.contains("with failures: ") && summary.contains("node beta/prebuild"), "{summary}");
    let nodes = followed["dags"][0]["nodes"].as_array().expect("nodes");
    let prebuild = nodes.iter().find(|n| n["id"] == "beta/prebuild").expect("prebuild node");
    assert_eq!(prebuild["state"], "Failed", "{followed}");
    assert!(prebuild["error"].is_string(), "{followed}");
    assert!(prebuild["logTail"].as_str().is_some_and(|t| t.contains("git")), "{followed}");

    // An empty agent list and an unknown Job are the caller's to see.
    let message = mcp.call_err("power", json!({"operation": "kill", "agents": []})).await;
    assert!(message.contains("at least one agent"), "{message}");
    let message = mcp.call_err("follow_job", json!({"name": "stop-nope"})).await;
    assert!(message.contains("NotFound") && message.contains("stop-nope"), "{message}");

    mcp.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_operator_requests_an_approval_for_a_named_agent() {
    let d = Daemon::start();
    create_agent(&d, "alpha").await;
    let (mut mcp, _) = Mcp::start(&d.kubeconfig).await;

    // Not bound to an agent: the admin token must say which.
    let message = mcp
        .call_err("request_approval", json!({"kind": "ApplyCommit", "commit": "abc123", "summary": "x"}))
        .await;
    assert!(message.contains("name the agent"), "{message}");

    let (summary, created) = mcp
        .call_ok(
            "request_approval",
            json!({"kind": "ApplyCommit", "commit": "abc123", "summary": "pin the tested rev", "agent": "alpha"}),
        )
        .await;
    let name = created["name"].as_str().expect("name");
    assert!(name.starts_with("alpha-applycommit-"), "{name}");
    assert_eq!(created["target"], "alpha");
    assert_eq!(created["phase"], "Pending");
    assert!(summary.contains(name), "{summary}");
    let stored = d.client().get(&format!("/apis/hive.dev/v1/approvals/{name}")).await;
    assert_eq!(stored.code, 200, "{:?}", stored.body);
    assert_eq!(stored.body["spec"]["payload"]["commit"], "abc123");

    // The server's validation comes back as a tool error.
    let message = mcp
        .call_err("request_approval", json!({"kind": "MergeConfigPr", "summary": "x", "agent": "alpha"}))
        .await;
    assert!(message.contains("pullRequest"), "{message}");

    // Regression (issue 32): an unknown target was accepted silently, as a pending
    // approval nothing could ever deploy.
    let message = mcp
        .call_err(
            "request_approval",
            json!({"kind": "ApplyCommit", "commit": "abc123", "summary": "x", "agent": "ghost"}),
        )
        .await;
    assert!(message.contains("ghost") && message.contains("no agent"), "{message}");

    let (summary, listed) = mcp.call_ok("list_approvals", json!({"pending_only": true})).await;
    assert_eq!(listed["approvals"].as_array().unwrap().len(), 1, "{listed}");
    assert!(summary.starts_with("1 pending approval(s)"), "{summary}");

    mcp.close().await;
}

/// A kubeconfig like the daemon's, carrying `token` instead of the admin token.
fn kubeconfig_with_token(d: &Daemon, file: &str, token: &str) -> PathBuf {
    let text = std::fs::read_to_string(&d.kubeconfig).expect("kubeconfig");
    assert!(text.contains(&d.token));
    let path = d.dir.join(file);
    std::fs::write(&path, text.replace(&d.token, token)).expect("write kubeconfig");
    path
}

async fn agent_token(d: &Daemon, name: &str, agent: &str) -> String {
    let reply =
        d.client().post("/hive/v1/tokens", &json!({"name": name, "role": "agent", "agent": agent})).await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    reply.body["token"].as_str().expect("token").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_agent_token_requests_approvals_for_itself_only() {
    let d = Daemon::start();
    create_agent(&d, "alpha").await;
    create_agent(&d, "beta").await;
    let token = agent_token(&d, "alpha-mcp", "alpha").await;
    let kubeconfig = kubeconfig_with_token(&d, "alpha-kubeconfig.yaml", &token);
    let (mut mcp, _) = Mcp::start(&kubeconfig).await;

    let (_, me) = mcp.call_ok("whoami", json!({})).await;
    assert_eq!(me, json!({"name": "alpha-mcp", "role": "agent", "agent": "alpha"}));

    // For itself: target and requester are the agent.
    let (_, created) = mcp
        .call_ok(
            "request_approval",
            json!({"kind": "MergeConfigPr", "pull_request": "17", "summary": "add a tool"}),
        )
        .await;
    let name = created["name"].as_str().expect("name");
    assert!(name.starts_with("alpha-mergeconfigpr-"), "{name}");
    let stored = d.client().get(&format!("/apis/hive.dev/v1/approvals/{name}")).await;
    assert_eq!(stored.body["spec"]["target"], "alpha", "{:?}", stored.body);
    assert_eq!(stored.body["spec"]["requestedBy"], "alpha", "{:?}", stored.body);
    assert_eq!(stored.body["spec"]["decision"]["state"], "Pending");

    // For another agent: refused by the tool before any request.
    let message = mcp
        .call_err(
            "request_approval",
            json!({"kind": "ApplyCommit", "commit": "abc", "summary": "x", "agent": "beta"}),
        )
        .await;
    assert!(message.contains("bound to agent \"alpha\"") && message.contains("\"beta\""), "{message}");
    let all = d.client().get("/apis/hive.dev/v1/approvals").await;
    assert_eq!(all.body["items"].as_array().unwrap().len(), 1, "{:?}", all.body);

    // Reading is allowed; power is not, and the server's refusal comes back as a tool error.
    let (_, data) = mcp.call_ok("list_agents", json!({})).await;
    assert_eq!(data["agents"].as_array().unwrap().len(), 2);
    let message = mcp.call_err("power", json!({"operation": "stop", "agents": ["alpha"]})).await;
    assert!(message.contains("Forbidden") || message.contains("forbidden"), "{message}");

    let log = mcp.close().await;
    assert!(!log.contains(&token), "the agent token leaked into the log");
}
