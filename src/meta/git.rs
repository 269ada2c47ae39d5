//! Running the `git` CLI in the meta repo: one place that fixes the identity and the
//! environment, so no global or system git configuration (signing, hooks, a default
//! branch, an inherited `GIT_DIR`) can change what hive commits; that names the
//! repository (`GIT_DIR`, `GIT_WORK_TREE`, a ceiling), so a torn `.git` is an error and
//! never sends git to a repository above the state dir; and that makes everything a
//! command wrote durable before the command counts as done.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use super::{Error, Result};
use crate::runtime::process::git::{confine, Repo};

/// The identity every meta commit and tag carries.
const IDENTITY: [&str; 8] = [
    "-c",
    "user.name=hive",
    "-c",
    "user.email=hive@localhost",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "tag.gpgsign=false",
];

/// git fsyncs every object, pack, ref and index it writes, with a real `fsync`; an
/// automatic gc runs inside the command that triggers it (not detached into the
/// background), so what it writes is synced with the command (see [`sync_repo`] for
/// what `core.fsync` does not cover).
const DURABILITY: [&str; 8] = [
    "-c",
    "core.fsync=all",
    "-c",
    "core.fsyncMethod=fsync",
    "-c",
    "gc.autoDetach=false",
    "-c",
    "maintenance.autoDetach=false",
];

/// Commands not followed by [`sync_repo`]: those that never write in the repository
/// (`bundle create` writes a file of the journal's that is read and removed at once),
/// and `status` and `add`, which write only the index and are always followed, within
/// the same operation and before it answers, by a command that is synced (`commit`, or
/// `reset` when the commit failed): one sync per operation instead of three.
const NOT_SYNCED: [&str; 12] = [
    "rev-parse",
    "log",
    "cat-file",
    "for-each-ref",
    "ls-tree",
    "rev-list",
    "show",
    "status",
    "add",
    "bundle",
    "diff-tree",
    "merge-base",
];

/// The meta repo's work tree, as git sees it.
#[derive(Debug, Clone)]
pub(super) struct Git {
    dir: PathBuf,
}

/// What a finished git command left behind.
pub(super) struct Output {
    pub success: bool,
    pub stdout: String,
}

impl Git {
    pub fn new(dir: &Path) -> Git {
        Git { dir: dir.to_path_buf() }
    }

    /// The repository's git dir, `<dir>/.git`.
    pub fn git_dir(&self) -> PathBuf {
        self.dir.join(".git")
    }

    /// Runs `git <args>` and returns its stdout; a non-zero exit is an error carrying
    /// the command line and its stderr.
    pub async fn run(&self, args: &[&str]) -> Result<String> {
        let (output, command, stderr) = self.spawn(args).await?;
        if !output.success {
            return Err(Error::Git { command, dir: self.dir.clone(), stderr });
        }
        Ok(output.stdout)
    }

    /// Runs `git <args>` where a non-zero exit is an answer (e.g. `rev-parse --verify`
    /// of a ref that does not exist), not a failure.
    pub async fn probe(&self, args: &[&str]) -> Result<Output> {
        Ok(self.spawn(args).await?.0)
    }

    async fn spawn(&self, args: &[&str]) -> Result<(Output, String, String)> {
        let command = format!("git {}", args.join(" "));
        let mut cmd = Command::new("git");
        cmd.args(IDENTITY)
            .args(DURABILITY)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        confine(&mut cmd, Repo::WorkTree(&self.dir));
        let output = cmd.output().await.map_err(|source| Error::Spawn {
            command: command.clone(),
            dir: self.dir.clone(),
            source,
        })?;
        // A failed command may have written too (objects, an index), and hive acts on
        // what it left, so it is synced either way.
        if writes(args) {
            let git_dir = self.git_dir();
            tokio::task::spawn_blocking(move || sync_repo(&git_dir))
                .await
                .map_err(|join| Error::Interrupted { reason: join.to_string() })?
                .map_err(|source| Error::Io { action: "syncing", path: self.git_dir(), source })?;
        }
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        Ok((Output { success: output.status.success(), stdout }, command, stderr))
    }

    /// The full sha `HEAD` names, or `None` in a repository with no commit yet.
    pub async fn head(&self) -> Result<Option<String>> {
        let out = self.probe(&["rev-parse", "--verify", "--quiet", "HEAD^{commit}"]).await?;
        Ok(out.success.then(|| out.stdout.trim().to_string()))
    }

    /// The files among `paths` that differ from `HEAD` in the index or the work tree
    /// (untracked ones included). Path-scoped, so someone else's staged file is never
    /// seen, let alone committed.
    pub async fn changed(&self, paths: &[String]) -> Result<Vec<String>> {
        let mut args = vec!["status", "--porcelain", "-z", "--untracked-files=all", "--"];
        args.extend(paths.iter().map(String::as_str));
        let out = self.run(&args).await?;
        // `-z` entries are `XY path`; a rename or copy is followed by its source path as
        // a field of its own, which is a changed path too.
        let mut paths = Vec::new();
        let mut fields = out.split('\0').filter(|field| !field.is_empty());
        while let Some(entry) = fields.next() {
            let (status, path) = (entry.get(..2).unwrap_or(""), entry.get(3..).unwrap_or(""));
            paths.push(path.to_string());
            if status.contains(['R', 'C']) {
                paths.extend(fields.next().map(str::to_string));
            }
        }
        Ok(paths)
    }

    /// Stages and commits exactly `paths` (`git commit -- <paths>` commits only those,
    /// leaving anything else staged as it was) and returns the new commit's sha.
    pub async fn commit(&self, paths: &[String], message: &str, allow_empty: bool) -> Result<String> {
        let mut add = vec!["add", "--all", "--"];
        add.extend(paths.iter().map(String::as_str));
        if !paths.is_empty() {
            self.run(&add).await?;
        }
        // `whitespace` cleanup keeps a message line that starts with `#` (an issue
        // number in a deploy message) instead of dropping it as a comment.
        let mut commit = vec!["commit", "--quiet", "--no-verify", "--cleanup=whitespace", "-m", message];
        if allow_empty {
            commit.push("--allow-empty");
        }
        commit.push("--");
        commit.extend(paths.iter().map(String::as_str));
        self.run(&commit).await?;
        self.head().await?.ok_or_else(|| Error::Git {
            command: "git rev-parse HEAD".into(),
            dir: self.dir.clone(),
            stderr: "no HEAD after a commit".into(),
        })
    }

    /// Drops whatever is staged for `paths`, back to `HEAD`; the undo of [`Git::commit`]'s
    /// `git add` when the commit itself failed.
    pub async fn unstage(&self, paths: &[String]) -> Result<()> {
        let mut args = vec!["reset", "--quiet", "--"];
        args.extend(paths.iter().map(String::as_str));
        self.run(&args).await.map(drop)
    }
}

/// Whether `git <args>` is followed by [`sync_repo`].
fn writes(args: &[&str]) -> bool {
    match args.first() {
        Some(&"tag") => !args.contains(&"--list"),
        Some(command) => !NOT_SYNCED.contains(command),
        None => false,
    }
}

/// Makes what a git command wrote survive a power cut. `core.fsync` has git fsync the
/// objects, packs, refs and index it writes, but not `HEAD` or `config` (written by
/// `init`), the reflogs, nor any directory: a new loose object's `objects/xx/`, a new
/// ref's `refs/...` or the rename of `index.lock` onto `index` can be lost while the
/// file's contents were synced. So every file of `.git` outside `objects/` (a few, plus
/// one per ref) and every directory down to `objects/xx/` is fsynced, and the work tree
/// that holds `.git`; an fsync of what is already on disk costs a system call.
pub(super) fn sync_repo(git_dir: &Path) -> io::Result<()> {
    let objects = git_dir.join("objects");
    for entry in std::fs::read_dir(git_dir)? {
        let entry = entry?;
        let path = entry.path();
        if path == objects {
            continue;
        }
        if entry.file_type()?.is_dir() {
            sync_tree(&path)?;
        } else {
            // A lock file git is renaming right now may be gone already.
            ignore_missing(crate::durable::sync_file(&path))?;
        }
    }
    match std::fs::read_dir(&objects) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry?;
                if entry.file_type()?.is_dir() {
                    crate::durable::sync_dir(&entry.path())?;
                }
            }
            crate::durable::sync_dir(&objects)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    crate::durable::sync_dir(git_dir)?;
    if let Some(work_tree) = git_dir.parent() {
        crate::durable::sync_dir(work_tree)?;
    }
    Ok(())
}

/// fsyncs every file and directory under `dir` (a missing `dir` is fine).
fn sync_tree(dir: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_tree(&entry.path())?;
        } else {
            // A lock file git is renaming right now may be gone already.
            ignore_missing(crate::durable::sync_file(&entry.path()))?;
        }
    }
    crate::durable::sync_dir(dir)
}

fn ignore_missing(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}
