//! The on-disk layout of one agent under the runtime root, and its generations:
//!
//! ```text
//! <root>/<agent>/repo.git                      mirror of spec.config.repo
//! <root>/<agent>/generations/<n>-<shortrev>/   checked-out, built trees
//! <root>/<agent>/current -> generations/<id>   switched by renaming a temp symlink
//! <root>/<agent>/logs/agent.log[.N]            the agent's rotating output
//! <root>/<agent>/fence                         the graceful fence
//! <root>/<agent>/pid                           `<pid> <start ticks>` while running
//! <root>/<agent>/limits.json, permissions.json advisory limits, permissions
//! ```
//!
//! A generation is complete once its `.hive-rev` file (the full commit sha) exists: it
//! is written only after the build succeeded, so a directory without it is a leftover
//! of a failed or interrupted prebuild and is removed.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;

use crate::runtime::{BuildLog, Error, Generation, Result};

/// The file in a generation that records its commit and marks it complete.
pub const REV_FILE: &str = ".hive-rev";

/// The file in an agent's directory naming its running process.
pub const PID_FILE: &str = "pid";

/// The paths of one agent's runtime state.
#[derive(Clone, Debug)]
pub struct AgentDir {
    /// The agent's name.
    pub agent: String,
    /// `<root>/<agent>`.
    pub path: PathBuf,
}

impl AgentDir {
    /// The directory of `agent` under `root`.
    pub fn new(root: &Path, agent: &str) -> AgentDir {
        AgentDir { agent: agent.to_string(), path: root.join(agent) }
    }

    /// The mirror of the config repository.
    pub fn mirror(&self) -> PathBuf {
        self.path.join("repo.git")
    }

    /// The directory holding every generation.
    pub fn generations(&self) -> PathBuf {
        self.path.join("generations")
    }

    /// The directory of generation `id`.
    pub fn generation(&self, id: &str) -> PathBuf {
        self.generations().join(id)
    }

    /// The `current` symlink.
    pub fn current_link(&self) -> PathBuf {
        self.path.join("current")
    }

    /// The log directory.
    pub fn logs(&self) -> PathBuf {
        self.path.join("logs")
    }

    /// The pid file of the running process (`<pid> <start ticks>`).
    pub fn pid_file(&self) -> PathBuf {
        self.path.join(PID_FILE)
    }

    /// The graceful fence file.
    pub fn fence(&self) -> PathBuf {
        self.path.join("fence")
    }

    /// An IO error about `path` of this agent.
    pub fn io(&self, action: &'static str, path: &Path, source: io::Error) -> Error {
        Error::Io { agent: self.agent.clone(), action, path: path.to_path_buf(), source }
    }

    /// Every complete generation, oldest first, with its number.
    pub fn list(&self) -> Vec<(u64, Generation)> {
        let mut out: Vec<(u64, Generation)> = self
            .entries()
            .into_iter()
            .filter_map(|(n, id, path)| {
                let rev = fs::read_to_string(path.join(REV_FILE)).ok()?;
                Some((n, Generation { id, rev: rev.trim().to_string() }))
            })
            .collect();
        out.sort_by_key(|(n, _)| *n);
        out
    }

    /// The number the next generation gets: one past every directory present,
    /// complete or not, so a number is never reused while its directory exists.
    pub fn next_number(&self) -> u64 {
        self.entries().into_iter().map(|(n, _, _)| n + 1).max().unwrap_or(1)
    }

    /// Removes generation directories that never completed.
    pub fn remove_incomplete(&self) -> Result<()> {
        for (_, _, path) in self.entries() {
            if !path.join(REV_FILE).exists() {
                fs::remove_dir_all(&path)
                    .map_err(|e| self.io("cannot remove incomplete generation", &path, e))?;
            }
        }
        Ok(())
    }

    /// The current generation, if the `current` link points at a complete one.
    pub fn current(&self) -> Option<Generation> {
        let target = fs::read_link(self.current_link()).ok()?;
        let id = target.file_name()?.to_str()?.to_string();
        let rev = fs::read_to_string(self.generation(&id).join(REV_FILE)).ok()?;
        Some(Generation { id, rev: rev.trim().to_string() })
    }

    /// Points `current` at generation `id` atomically: a temp symlink renamed over it.
    pub fn switch_current(&self, id: &str) -> Result<()> {
        let dir = self.generation(id);
        if !dir.join(REV_FILE).exists() {
            return Err(Error::UnknownGeneration {
                agent: self.agent.clone(),
                generation: id.into(),
                path: dir,
            });
        }
        let tmp = self.path.join(".current.tmp");
        let _ = fs::remove_file(&tmp);
        let target = Path::new("generations").join(id);
        std::os::unix::fs::symlink(&target, &tmp).map_err(|e| self.io("cannot create symlink", &tmp, e))?;
        let link = self.current_link();
        crate::durable::rename(&tmp, &link).map_err(|e| self.io("cannot switch", &link, e))
    }

    /// Removes all but the `keep` newest complete generations, never the current one.
    pub fn prune(&self, keep: usize) -> Result<()> {
        let current = self.current().map(|g| g.id);
        let all = self.list();
        let old = all.len().saturating_sub(keep);
        for (_, generation) in all.into_iter().take(old) {
            if Some(&generation.id) == current.as_ref() {
                continue;
            }
            let path = self.generation(&generation.id);
            fs::remove_dir_all(&path).map_err(|e| self.io("cannot prune generation", &path, e))?;
        }
        Ok(())
    }

    /// `(number, id, path)` of every `<n>-<shortrev>` directory in `generations/`.
    fn entries(&self) -> Vec<(u64, String, PathBuf)> {
        fs::read_dir(self.generations())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let id = entry.file_name().into_string().ok()?;
                let n = id.split_once('-')?.0.parse().ok()?;
                Some((n, id, entry.path()))
            })
            .collect()
    }
}

/// The id of generation number `n` built from commit `sha`.
pub fn generation_id(n: u64, sha: &str) -> String {
    format!("{n}-{}", &sha[..sha.len().min(12)])
}

/// Runs the build command `argv` (no shell) in `dir`, streaming its stdout and stderr
/// to `log` line by line; a non-zero exit is an [`Error::Command`] with the last lines.
///
/// The command runs in a process group of its own: dropping the future before it ends
/// (the scheduler stopping a Prebuild at its Job's deadline) kills the whole group, the
/// command and whatever it started.
pub async fn run_build(
    agent: &str,
    argv: &[String],
    dir: &Path,
    env: &BTreeMap<String, String>,
    log: &dyn BuildLog,
) -> Result<()> {
    let command = argv.join(" ");
    log.line(&format!("$ {command}"));
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(dir)
        .envs(env)
        .env("HIVE_AGENT", agent)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn {
            agent: agent.into(),
            command: command.clone(),
            dir: dir.into(),
            source,
        })?;
    let mut group = KillGroup(child.id());
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let tail = std::sync::Mutex::new(Vec::<String>::new());
    let sink = |line: String| {
        log.line(&line);
        let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
        if tail.len() == 20 {
            tail.remove(0);
        }
        tail.push(line);
    };
    let (status, (), ()) = tokio::join!(child.wait(), lines(stdout, &sink), lines(stderr, &sink));
    group.0 = None; // ended: its pid may be reused
    let status = status.map_err(|source| Error::Spawn {
        agent: agent.into(),
        command: command.clone(),
        dir: dir.into(),
        source,
    })?;
    if status.success() {
        return Ok(());
    }
    let output = tail.into_inner().unwrap_or_else(|e| e.into_inner()).join("\n");
    Err(Error::Command { agent: agent.into(), command, dir: dir.into(), status: status.to_string(), output })
}

/// Kills process group `.0` when dropped, unless it was cleared first (the group's
/// leader was waited for).
struct KillGroup(Option<u32>);

impl Drop for KillGroup {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = super::supervisor::signal_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

/// Feeds every line of `reader` (lossily decoded, newline stripped) to `sink`.
async fn lines(reader: impl AsyncRead + Unpin, sink: &impl Fn(String)) {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                sink(line.trim_end_matches(['\n', '\r']).to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(dir: &AgentDir, id: &str) {
        let path = dir.generation(id);
        fs::create_dir_all(&path).unwrap();
        fs::write(path.join(REV_FILE), format!("{id}-sha\n")).unwrap();
    }

    #[test]
    fn numbering_listing_switching_and_pruning() {
        let root = tempfile::tempdir().unwrap();
        let dir = AgentDir::new(root.path(), "a");
        assert_eq!(dir.next_number(), 1);
        assert_eq!(dir.current(), None);
        for id in ["1-aaa", "2-bbb", "3-ccc", "4-ddd"] {
            complete(&dir, id);
        }
        fs::create_dir_all(dir.generation("5-eee")).unwrap();
        assert_eq!(dir.next_number(), 6);
        dir.remove_incomplete().unwrap();
        assert!(!dir.generation("5-eee").exists());
        dir.switch_current("1-aaa").unwrap();
        dir.switch_current("2-bbb").unwrap();
        assert_eq!(dir.current(), Some(Generation { id: "2-bbb".into(), rev: "2-bbb-sha".into() }));
        assert!(matches!(dir.switch_current("9-zzz"), Err(Error::UnknownGeneration { .. })));
        dir.prune(2).unwrap();
        let ids: Vec<String> = dir.list().into_iter().map(|(_, g)| g.id).collect();
        assert_eq!(ids, ["2-bbb", "3-ccc", "4-ddd"], "the current generation survives pruning");
    }
}
