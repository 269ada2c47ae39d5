//! Starts the real `hive` binary on 127.0.0.1:0 in a temp dir and drives it with
//! reqwest, kubectl and the hive CLI.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running daemon.
pub struct Daemon {
    child: Option<Child>,
    /// The state directory (kept for restarts).
    pub dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// `<dir>/kubeconfig.yaml`.
    pub kubeconfig: PathBuf,
    /// The admin token from the kubeconfig.
    pub token: String,
    /// PEM of the CA.
    pub ca_pem: Vec<u8>,
    /// The extra `serve` flags, kept for restarts.
    extra: Vec<String>,
    /// Every line the daemon printed on stdout (its banner), as it prints them.
    stdout: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

pub fn hive_bin() -> &'static str {
    env!("CARGO_BIN_EXE_hive")
}

impl Daemon {
    /// Starts a daemon on a fresh state dir.
    pub fn start() -> Daemon {
        Self::start_with(&[])
    }

    /// Starts a daemon on a fresh state dir with extra `serve` flags.
    pub fn start_with(extra: &[&str]) -> Daemon {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().to_path_buf();
        let mut daemon = Self::spawn(&dir, extra).expect("daemon starts");
        daemon._temp = Some(temp);
        daemon
    }

    /// Starts a daemon on a fresh state dir whose open-file limit (soft and hard) is
    /// `limit`, through util-linux `prlimit`; `None` (the test says it is skipped) when
    /// `prlimit` is not on PATH. A restart drops the limit.
    pub fn start_with_open_files(limit: u64, extra: &[&str]) -> Option<Daemon> {
        let found = Command::new("prlimit").arg("--version").output().is_ok_and(|o| o.status.success());
        if !found {
            return None;
        }
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().to_path_buf();
        let nofile = format!("--nofile={limit}:{limit}");
        let mut daemon =
            Self::spawn_under(&["prlimit", &nofile, "--"], &dir, extra, &[]).expect("daemon starts");
        daemon._temp = Some(temp);
        Some(daemon)
    }

    /// Starts a daemon on a fresh state dir with extra `serve` flags and extra
    /// environment variables (set on the daemon's process only, never on the suite's).
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = temp.path().to_path_buf();
        let mut daemon = Self::spawn_env(&dir, extra, env).expect("daemon starts");
        daemon._temp = Some(temp);
        daemon
    }

    /// Starts a daemon on an existing state dir; the error is the daemon's stderr.
    pub fn spawn(dir: &Path, extra: &[&str]) -> Result<Daemon, String> {
        Self::spawn_under(&[], dir, extra, &[])
    }

    /// [`Daemon::spawn`] with extra environment variables on the daemon's process.
    pub fn spawn_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Result<Daemon, String> {
        Self::spawn_under(&[], dir, extra, env)
    }

    /// [`Daemon::spawn`], run through `wrapper` (a command that execs its arguments,
    /// such as `prlimit … --`) when it is not empty, with extra environment variables.
    fn spawn_under(
        wrapper: &[&str],
        dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Daemon, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let log_path = dir.join("daemon.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| e.to_string())?;
        let mut command = match wrapper {
            [] => Command::new(hive_bin()),
            [program, args @ ..] => {
                let mut command = Command::new(program);
                command.args(args).arg(hive_bin());
                command
            }
        };
        let mut child = command
            .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(dir)
            .args(["--bookmark-interval", "1s"])
            .args(if extra.contains(&"--log") { &[][..] } else { &["--log", "info"][..] })
            // The fleet endpoint's fixed default port would collide between tests.
            .args(if extra.contains(&"--fleet-listen") {
                &[][..]
            } else {
                &["--fleet-listen", "127.0.0.1:0"][..]
            })
            // The suite's example agents point at repositories it must not reach; the
            // tests that exercise the Agent controller turn it on.
            .args(if extra.iter().any(|a| a.starts_with("--agent-controller")) {
                &[][..]
            } else {
                &["--agent-controller=false"][..]
            })
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn hive serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let printed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let lines = printed.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("hive: serving ") {
                    let _ = tx.send(url.to_string());
                }
                lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::fs::read_to_string(&log_path).unwrap_or_default());
            }
        };
        let kubeconfig = dir.join("kubeconfig.yaml");
        let resolved =
            hive::auth::kubeconfig::load(&kubeconfig).and_then(|k| k.current()).expect("kubeconfig resolves");
        Ok(Daemon {
            child: Some(child),
            dir: dir.to_path_buf(),
            _temp: None,
            url,
            kubeconfig,
            token: resolved.token.expect("token"),
            ca_pem: resolved.ca_pem.expect("ca"),
            extra: extra.iter().map(|a| a.to_string()).collect(),
            stdout: printed,
        })
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, std::process::Child::id)
    }

    /// The lines the daemon printed on stdout so far (its banner).
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// Waits up to `within` for the daemon to exit by itself; its status if it did.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGKILL and waits for the process to go.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restarts on the same state dir (after `kill9`).
    pub fn restart(&mut self) {
        self.kill9();
        let extra: Vec<&str> =
            self.extra.iter().map(String::as_str).filter(|a| !a.starts_with("--reset")).collect();
        let mut fresh = Self::spawn(&self.dir, &extra).expect("daemon restarts");
        self.child = fresh.child.take();
        self.url = std::mem::take(&mut fresh.url);
        self.token = std::mem::take(&mut fresh.token);
        self.ca_pem = std::mem::take(&mut fresh.ca_pem);
        self.stdout = fresh.stdout.clone();
    }

    /// An HTTP client trusting the daemon's CA, sending `token` (if any).
    pub fn client_with(&self, token: Option<&str>) -> Api {
        Api::trusting(&self.ca_pem, &self.url, token)
    }

    /// An admin client.
    pub fn client(&self) -> Api {
        self.client_with(Some(&self.token.clone()))
    }

    /// Runs stock kubectl against the daemon.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_stdin(args, None)
    }

    /// Runs kubectl with `stdin`.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        run_with_stdin(
            Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .arg("--cache-dir")
                .arg(self.dir.join("kube-cache"))
                .args(args),
            stdin,
        )
    }

    /// Runs the hive CLI against the daemon.
    pub fn hive(&self, args: &[&str]) -> Output {
        self.hive_stdin(args, None)
    }

    /// Runs the hive CLI with `stdin`.
    pub fn hive_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        run_with_stdin(Command::new(hive_bin()).arg("--kubeconfig").arg(&self.kubeconfig).args(args), stdin)
    }
}

impl Daemon {
    /// Stops the daemon gracefully (SIGTERM) and starts it again on the same state dir
    /// with `extra` as its `serve` flags from now on.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.terminate();
        let mut fresh = Self::spawn(&self.dir, extra).expect("daemon restarts");
        self.child = fresh.child.take();
        self.url = std::mem::take(&mut fresh.url);
        self.token = std::mem::take(&mut fresh.token);
        self.ca_pem = std::mem::take(&mut fresh.ca_pem);
        self.stdout = fresh.stdout.clone();
        self.extra = extra.iter().map(|a| a.to_string()).collect();
    }

    /// Stops the daemon gracefully (SIGTERM) and waits for it to exit; its state
    /// directory stays for the test to read.
    pub fn stop(&mut self) {
        self.terminate();
    }

    /// A graceful stop (SIGTERM), so the daemon stops the agent processes it started;
    /// SIGKILL if it does not exit within 15 s.
    fn terminate(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.terminate();
    }
}

fn run_with_stdin(cmd: &mut Command, stdin: Option<&str>) -> Output {
    use std::io::Write;
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    if let Some(input) = stdin {
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    }
    child.wait_with_output().expect("wait")
}

/// stdout of a successful command; panics with stderr otherwise.
pub fn ok(out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "command failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    stdout
}

/// stderr of a failed command; panics if it succeeded.
pub fn fails(out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "command unexpectedly succeeded:\nstdout:\n{stdout}\nstderr:\n{stderr}");
    stderr
}

/// A thin REST client for tests.
#[derive(Clone)]
pub struct Api {
    /// The reqwest client.
    pub http: reqwest::Client,
    /// Base URL.
    pub base: String,
    token: Option<String>,
}

/// A response: status, headers and JSON body.
#[derive(Debug)]
pub struct Reply {
    pub code: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Api {
    /// A client of the API at `base` (`https://HOST:PORT`) that trusts only the CA
    /// `ca_pem` and sends `token` (if any).
    pub fn trusting(ca_pem: &[u8], base: &str, token: Option<&str>) -> Api {
        let cert = reqwest::Certificate::from_pem(ca_pem).expect("ca pem");
        let http = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(cert)
            .build()
            .expect("client");
        Api { http, base: base.to_string(), token: token.map(str::to_string) }
    }

    /// Sends a request; `body` is sent as-is with `content_type`.
    pub async fn send(&self, method: &str, path: &str, content_type: &str, body: Option<String>) -> Reply {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self.http.request(method, format!("{}{}", self.base, path));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.header("content-type", content_type).body(b);
        }
        let resp = req.send().await.unwrap_or_else(|e| panic!("request {path}: {e:?}"));
        let code = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.expect("body");
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        Reply { code, headers, body }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send("GET", path, "", None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send("POST", path, "application/json", Some(body.to_string())).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Reply {
        self.send("PUT", path, "application/json", Some(body.to_string())).await
    }

    pub async fn patch(&self, path: &str, content_type: &str, body: &Value) -> Reply {
        self.send("PATCH", path, content_type, Some(body.to_string())).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.send("DELETE", path, "", None).await
    }

    /// The bearer token (empty for anonymous).
    pub fn token(&self) -> &str {
        self.token.as_deref().unwrap_or("")
    }

    /// Opens a watch and returns a line reader.
    pub async fn watch(&self, path: &str) -> WatchLines {
        let mut req = self.http.get(format!("{}{}", self.base, path));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("watch request");
        assert_eq!(resp.status().as_u16(), 200, "watch status");
        WatchLines { resp, buf: Vec::new() }
    }
}

/// Reads NDJSON watch events.
pub struct WatchLines {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl From<reqwest::Response> for WatchLines {
    fn from(resp: reqwest::Response) -> WatchLines {
        WatchLines { resp, buf: Vec::new() }
    }
}

impl WatchLines {
    /// The next event, or None when the stream ends or `timeout` passes.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).expect("event is JSON"));
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, self.resp.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => return None,
            }
        }
    }
}

/// A minimal valid Agent.
pub fn agent(name: &str) -> Value {
    serde_json::json!({
        "apiVersion": "hive.dev/v1",
        "kind": "Agent",
        "metadata": {"name": name, "labels": {"app": "demo"}},
        "spec": {
            "config": {"repo": format!("https://git.example.invalid/agents/{name}.git"), "rev": "main"},
            "runtime": {"type": "process", "process": {"command": ["./run.sh"]}}
        }
    })
}

/// Polls `check` every 100 ms until it yields a value; fails the test naming `what`
/// after 90 s (generous: the suite shares two cores with the daemons it starts).
pub async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
