//! The fused mutation: write an operation's files (atomically, temp file + rename),
//! check whether any of exactly those paths changed, and commit exactly those paths with
//! the operation's trailers. On a failure the files go back to their previous bytes, so
//! no half-done operation is left in the work tree.

use std::path::{Path, PathBuf};

use super::git::Git;
use super::{CommitId, Error, Result};

/// The trailer naming an agent a commit concerns (one per agent).
pub(super) const AGENT_TRAILER: &str = "Hive-Agent";
/// The trailer naming the operation that made a commit.
pub(super) const OP_TRAILER: &str = "Hive-Op";

/// The operation a commit records, as its `Hive-Op` trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Init,
    Sync,
    Relock,
    LockUpdate,
    HiveBump,
    Permissions,
    Deploy,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Init => "init",
            Op::Sync => "sync",
            Op::Relock => "relock",
            Op::LockUpdate => "lock-update",
            Op::HiveBump => "hive-bump",
            Op::Permissions => "permissions",
            Op::Deploy => "deploy",
        }
    }
}

/// A commit message: the text, then one trailer paragraph.
pub(super) struct Message {
    op: Op,
    text: String,
    agents: Vec<String>,
}

impl Message {
    pub fn new(op: Op, text: impl Into<String>, agents: impl IntoIterator<Item = String>) -> Message {
        let mut agents: Vec<String> = agents.into_iter().collect();
        agents.sort();
        agents.dedup();
        Message { op, text: text.into(), agents }
    }

    /// The full message. The trailers are their own last paragraph, so git's trailer
    /// parsing (`%(trailers)`, `interpret-trailers`) finds them whatever the text is.
    pub fn render(&self) -> String {
        let mut out = self.text.trim().to_string();
        out.push_str("\n\n");
        for agent in &self.agents {
            out.push_str(&format!("{AGENT_TRAILER}: {agent}\n"));
        }
        out.push_str(&format!("{OP_TRAILER}: {}\n", self.op.as_str()));
        out
    }
}

/// A file an operation owns and the bytes it should hold; `None` removes it.
pub(super) struct FileWrite {
    /// Relative to the repo, `/`-separated.
    pub path: String,
    pub bytes: Option<Vec<u8>>,
}

/// A file's bytes before the operation touched it, to put back on failure.
struct Previous {
    path: PathBuf,
    bytes: Option<Vec<u8>>,
}

/// Writes `files`, and commits those among them that differ from `HEAD` as one commit;
/// `None` (and no commit) when none does.
pub(super) async fn commit_files(
    git: &Git,
    dir: &Path,
    files: Vec<FileWrite>,
    message: Message,
) -> Result<Option<CommitId>> {
    let mut previous = Vec::new();
    for file in &files {
        let path = dir.join(&file.path);
        let current = read_optional(&path).await?;
        if current == file.bytes {
            continue;
        }
        previous.push(Previous { path: path.clone(), bytes: current });
        if let Err(error) = put(&path, file.bytes.as_deref()).await {
            restore(&previous).await;
            return Err(error);
        }
    }
    let paths: Vec<String> = files.iter().map(|file| file.path.clone()).collect();
    let changed = match git.changed(&paths).await {
        Ok(changed) => changed,
        Err(error) => {
            restore(&previous).await;
            return Err(error);
        }
    };
    // Only paths git reports: a removed file that was never committed is no pathspec
    // git would accept.
    let to_commit: Vec<String> = paths.into_iter().filter(|path| changed.contains(path)).collect();
    if to_commit.is_empty() {
        return Ok(None);
    }
    match git.commit(&to_commit, &message.render(), false).await {
        Ok(sha) => Ok(Some(CommitId(sha))),
        Err(error) => {
            restore(&previous).await;
            if let Err(unstage) = git.unstage(&to_commit).await {
                tracing::warn!(error = %unstage, "cannot unstage meta files after a failed commit");
            }
            Err(error)
        }
    }
}

/// Best effort: puts every file back as it was; failures are logged, since the
/// operation's own error is the one to report.
async fn restore(previous: &[Previous]) {
    for file in previous.iter().rev() {
        if let Err(error) = put(&file.path, file.bytes.as_deref()).await {
            tracing::warn!(%error, "cannot restore a meta file after a failed operation");
        }
    }
}

/// The file's bytes, or `None` when it does not exist.
pub(super) async fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match tokio::fs::read(path).await {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io { action: "reading", path: path.to_path_buf(), source }),
    }
}

/// Writes `bytes` to `path` atomically and durably, or removes `path` (and its
/// directory, once empty) for `None`; either way the directories involved are synced,
/// so what the following commit records is on disk.
pub(super) async fn put(path: &Path, bytes: Option<&[u8]>) -> Result<()> {
    let path = path.to_path_buf();
    let bytes = bytes.map(<[u8]>::to_vec);
    tokio::task::spawn_blocking(move || put_blocking(&path, bytes.as_deref()))
        .await
        .map_err(|join| Error::Interrupted { reason: join.to_string() })?
}

fn put_blocking(path: &Path, bytes: Option<&[u8]>) -> Result<()> {
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { action, path, source }
    };
    let Some(bytes) = bytes else {
        return remove_blocking(path);
    };
    crate::durable::write_atomic(path, bytes, 0o644).map_err(io("writing", path))
}

/// Removes `path` (and its directory, once empty), durably.
pub(super) fn remove_blocking(path: &Path) -> Result<()> {
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { action, path, source }
    };
    crate::durable::remove_file(path).map_err(io("removing", path))?;
    // A directory that still holds someone else's file stays; that is not ours.
    if let Some(parent) = path.parent() {
        if std::fs::remove_dir(parent).is_ok() {
            if let Some(grandparent) = parent.parent() {
                crate::durable::sync_dir(grandparent).map_err(io("syncing", grandparent))?;
            }
        }
    }
    Ok(())
}
