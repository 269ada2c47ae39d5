//! Running the host's commands (`nix`, `nixos-container`, `systemctl`): a command line
//! that renders itself for logs and errors, the driver's `PATH`, and the mapping of
//! failures to [`Error::Spawn`] / [`Error::Command`] carrying the last lines of output.
//!
//! Every command runs in `/` with stdin closed, `LC_ALL=C` and `TZ=UTC`, so the output
//! the driver parses (`systemctl show` timestamps) reads the same on every host, and is
//! killed when the driver stops waiting for it.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::runtime::{BuildLog, Error, Result};

/// How many lines of output an [`Error::Command`] keeps.
pub const TAIL_LINES: usize = 20;

/// The directory every command runs in.
const DIR: &str = "/";

/// One command line: a program looked up on the driver's `PATH`, and its arguments.
#[derive(Clone, Debug)]
pub struct CommandLine {
    program: &'static str,
    args: Vec<OsString>,
}

impl CommandLine {
    /// `program` without arguments.
    pub fn new(program: &'static str) -> CommandLine {
        CommandLine { program, args: Vec::new() }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> CommandLine {
        self.args.push(arg.into());
        self
    }

    /// The command line as a shell would take it back (arguments quoted where needed).
    pub fn render(&self) -> String {
        let mut line = self.program.to_string();
        for arg in &self.args {
            line.push(' ');
            line.push_str(&shell_word(&arg.to_string_lossy()));
        }
        line
    }

    fn command(&self, path: Option<&OsStr>) -> Command {
        let mut command = Command::new(self.program);
        command
            .args(&self.args)
            .current_dir(DIR)
            .env("LC_ALL", "C")
            .env("TZ", "UTC")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(path) = path {
            // On Unix the child's PATH is also where the program is looked up.
            command.env("PATH", path);
        }
        command
    }
}

/// What a finished command left behind.
#[derive(Debug)]
pub struct Finished {
    /// How it ended.
    pub status: ExitStatus,
    /// Everything it printed on stdout.
    pub stdout: String,
    /// Its last [`TAIL_LINES`] lines of output, stdout then stderr.
    pub tail: String,
}

/// Runs `line` to the end, whatever its exit status.
pub async fn output(agent: &str, line: &CommandLine, path: Option<&OsStr>) -> Result<Finished> {
    tracing::debug!(agent, command = %line.render(), "running");
    let out = line
        .command(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .map_err(|source| spawn_error(agent, line, source))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut tail = Tail::default();
    stdout.lines().chain(stderr.lines()).for_each(|l| tail.push(l));
    Ok(Finished { status: out.status, stdout, tail: tail.text() })
}

/// Runs `line` and returns its stdout; a non-zero exit is an [`Error::Command`].
pub async fn run(agent: &str, line: &CommandLine, path: Option<&OsStr>) -> Result<String> {
    let finished = output(agent, line, path).await?;
    if !finished.status.success() {
        return Err(failed(agent, line, finished.status.to_string(), finished.tail));
    }
    Ok(finished.stdout)
}

/// Runs `line` with every line it prints (stdout and stderr, as they come) passed to
/// `log`, after the command line itself; returns its stdout lines. A non-zero exit is
/// an [`Error::Command`].
pub async fn run_logged(
    agent: &str,
    line: &CommandLine,
    path: Option<&OsStr>,
    log: &dyn BuildLog,
) -> Result<Vec<String>> {
    let rendered = line.render();
    tracing::debug!(agent, command = %rendered, "running");
    log.line(&format!("$ {rendered}"));
    let mut child = line
        .command(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| spawn_error(agent, line, source))?;
    let mut stdout = child.stdout.take().map(|out| BufReader::new(out).lines());
    let mut stderr = child.stderr.take().map(|err| BufReader::new(err).lines());
    let mut printed = Vec::new();
    let mut tail = Tail::default();
    let read_error = |source| Error::Io {
        agent: agent.into(),
        action: "cannot read the output of",
        path: Path::new(line.program).into(),
        source,
    };
    while stdout.is_some() || stderr.is_some() {
        tokio::select! {
            next = async { stdout.as_mut().expect("checked by the guard").next_line().await },
                if stdout.is_some() => match next.map_err(read_error)? {
                Some(text) => {
                    log.line(&text);
                    tail.push(&text);
                    printed.push(text);
                }
                None => stdout = None,
            },
            next = async { stderr.as_mut().expect("checked by the guard").next_line().await },
                if stderr.is_some() => match next.map_err(read_error)? {
                Some(text) => {
                    log.line(&text);
                    tail.push(&text);
                }
                None => stderr = None,
            },
        }
    }
    let status = child.wait().await.map_err(|source| spawn_error(agent, line, source))?;
    if !status.success() {
        return Err(failed(agent, line, status.to_string(), tail.text()));
    }
    Ok(printed)
}

/// The [`Error::Command`] of `line`.
pub fn failed(agent: &str, line: &CommandLine, status: String, output: String) -> Error {
    Error::Command { agent: agent.into(), command: line.render(), dir: DIR.into(), status, output }
}

fn spawn_error(agent: &str, line: &CommandLine, source: std::io::Error) -> Error {
    Error::Spawn { agent: agent.into(), command: line.render(), dir: DIR.into(), source }
}

/// The last [`TAIL_LINES`] lines seen.
#[derive(Default)]
struct Tail(VecDeque<String>);

impl Tail {
    fn push(&mut self, line: &str) {
        if self.0.len() == TAIL_LINES {
            self.0.pop_front();
        }
        self.0.push_back(line.to_string());
    }

    fn text(&self) -> String {
        let lines: Vec<&str> = self.0.iter().map(String::as_str).collect();
        lines.join("\n").trim().to_string()
    }
}

/// `word` as one POSIX shell word: unchanged when it holds only characters no shell
/// treats specially, else single-quoted.
pub fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "@%+=:,./-_#".contains(c);
    if !word.is_empty() && !word.starts_with('#') && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
