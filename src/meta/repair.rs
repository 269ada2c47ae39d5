//! Bringing a meta repo a power cut tore back to its last good commit, at open. Every git
//! command that writes is synced before hive acts on it (`git.rs`), so a cut can only
//! tear the step that was under way, which nobody was told had happened: files git
//! was writing that are empty or zeros (what a cut leaves of unsynced data), a ref naming
//! a commit whose objects never reached the disk. Those are put back — `HEAD` and
//! `config` rewritten as `git init` writes them, torn refs, objects and index removed,
//! the branch moved back at most one step (by its reflog) to a commit that is whole, the index
//! and work tree reset to it — and each repair is reported. A repo torn before its first
//! commit is made again as the first start makes it. Anything else (a `HEAD` with
//! foreign content, history that was acknowledged and is gone) stays a hard error naming
//! the file or the object.

use std::io;
use std::path::{Path, PathBuf};

use super::git::Git;
use super::{Error, Result};

/// The branch every meta commit lands on.
const BRANCH: &str = "refs/heads/main";
/// `HEAD` as `git init --initial-branch=main` writes it.
const HEAD: &str = "ref: refs/heads/main\n";
/// `config` as `git init` writes it for a work tree.
const CONFIG: &str =
    "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n";

/// What opening the repo found torn and put back, one sentence each.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Repairs(pub Vec<String>);

/// The outcome of [`repair`].
pub(super) enum Repaired {
    /// The repo is whole (maybe after repairs) and has a commit.
    Whole(Repairs),
    /// Nothing good remained and no commit was ever acknowledged: `.git` was removed, so
    /// the caller initializes the repo as on a first start.
    Removed(Repairs),
}

/// Repairs the repo in `dir` (which holds `.git`); see the module's documentation.
pub(super) async fn repair(git: &Git, dir: &Path) -> Result<Repaired> {
    let git_dir = git.git_dir();
    let scanned = git_dir.clone();
    let mut repairs = tokio::task::spawn_blocking(move || put_back_torn_files(&scanned))
        .await
        .map_err(|join| Error::Interrupted { reason: join.to_string() })??;

    // The branch: where it points if that commit is whole, else the newest whole commit
    // its reflog (or HEAD's) names.
    let tip = git.probe(&["rev-parse", "--verify", "--quiet", BRANCH]).await?;
    let tip = tip.success.then(|| tip.stdout.trim().to_string());
    let mut candidates: Vec<String> = tip.iter().cloned().collect();
    for log in ["logs/refs/heads/main", "logs/HEAD"] {
        candidates.extend(reflog(&git_dir.join(log)));
    }
    // The newest commit known and the one before it: a cut tears at most the step under
    // way, so going further back would drop history that was acknowledged.
    let mut seen = std::collections::BTreeSet::new();
    candidates.retain(|sha| seen.insert(sha.clone()));
    candidates.truncate(2);
    let mut good = None;
    for candidate in &candidates {
        if whole(git, candidate).await? {
            good = Some(candidate.clone());
            break;
        }
    }
    match (&good, &tip) {
        (Some(good), Some(tip)) if good == tip => {}
        (Some(good), _) => {
            let from = tip
                .as_deref()
                .map_or("nothing".to_string(), |tip| format!("{tip}, whose objects are not all on disk"));
            git.run(&["update-ref", BRANCH, good]).await?;
            repairs.0.push(format!("moved {BRANCH} back from {from} to the last whole commit {good}"));
        }
        (None, _) => {
            let commits = commit_objects(git).await?;
            if commits > 1 {
                let path = git_dir.join(BRANCH);
                let reason = format!(
                    "neither its newest commit nor the one before it is whole ({}; {commits} commit objects \
                     on disk): history that was acknowledged is missing",
                    if candidates.is_empty() { "none named".to_string() } else { candidates.join(", ") }
                );
                return Err(Error::Corrupt { path, reason });
            }
            let removed = git_dir.clone();
            tokio::task::spawn_blocking(move || {
                std::fs::remove_dir_all(&removed)?;
                crate::durable::sync_dir(removed.parent().unwrap_or(Path::new(".")))
            })
            .await
            .map_err(|join| Error::Interrupted { reason: join.to_string() })?
            .map_err(|source| Error::Io {
                action: "removing",
                path: git_dir.clone(),
                source,
            })?;
            repairs.0.push(format!(
                "{} held no whole commit and at most the first one was ever made: initialized it again",
                git_dir.display()
            ));
            return Ok(Repaired::Removed(repairs));
        }
    }

    // Tags the torn step was making whose object never reached the disk.
    for tag in broken_tags(git).await? {
        git.run(&["update-ref", "-d", &tag]).await?;
        repairs.0.push(format!("removed the tag {tag}, whose object is not on disk"));
    }

    // The index: rebuilt from the branch when it was torn or anything above moved.
    let index_ok = git.probe(&["status", "--porcelain", "--untracked-files=no"]).await?.success;
    if !repairs.0.is_empty() || !index_ok {
        git.run(&["read-tree", "HEAD"]).await?;
        if !index_ok {
            repairs.0.push("rebuilt the index from HEAD".to_string());
        }
    }
    if !repairs.0.is_empty() {
        tracing::warn!(dir = %dir.display(), repairs = ?repairs.0, "repaired the meta repo after a power cut");
    }
    Ok(Repaired::Whole(repairs))
}

/// Whether commit `sha` is whole: it, its tree, every blob and its parent are readable.
async fn whole(git: &Git, sha: &str) -> Result<bool> {
    let args = ["rev-list", "--objects", "--quiet", "--verify-objects", "--max-count=1", sha];
    Ok(git.probe(&args).await?.success)
}

/// How many commit objects the object store holds.
async fn commit_objects(git: &Git) -> Result<usize> {
    let out = git.probe(&["cat-file", "--batch-all-objects", "--batch-check=%(objecttype)"]).await?;
    Ok(out.stdout.lines().filter(|line| *line == "commit").count())
}

/// Tags whose object cannot be read.
async fn broken_tags(git: &Git) -> Result<Vec<String>> {
    let mut broken = Vec::new();
    let refs = git.probe(&["for-each-ref", "--format=%(refname) %(objectname)", "refs/tags"]).await?;
    for line in refs.stdout.lines() {
        let Some((name, sha)) = line.split_once(' ') else { continue };
        if !git.probe(&["cat-file", "-e", sha]).await?.success {
            broken.push(name.to_string());
        }
    }
    Ok(broken)
}

/// The new values a reflog records, newest first; torn or foreign lines are skipped.
fn reflog(path: &Path) -> Vec<String> {
    let text = std::fs::read(path).unwrap_or_default();
    let mut shas: Vec<String> = String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|line| line.split(' ').nth(1))
        .filter(|sha| sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit()) && *sha != "0".repeat(40))
        .map(str::to_string)
        .collect();
    shas.reverse();
    shas
}

/// Whether a file holds what a power cut leaves of a write that was never synced:
/// nothing, or only zeros.
pub(super) fn torn(path: &Path) -> io::Result<bool> {
    let bytes = std::fs::read(path)?;
    Ok(bytes.iter().all(|b| *b == 0))
}

/// [`torn`] for a file of `.git`; a loose object is torn when empty (one cut short
/// otherwise fails to inflate, which [`whole`] finds), so the object store, which grows
/// with every commit, is not read at each start.
fn torn_file(path: &Path, objects: &Path) -> io::Result<bool> {
    if path.starts_with(objects) {
        return Ok(std::fs::metadata(path)?.len() == 0);
    }
    torn(path)
}

/// Rewrites a torn `HEAD` and `config`, removes every other torn file of `.git`; a `HEAD`
/// that is not torn and names something else than the branch is corrupt.
fn put_back_torn_files(git_dir: &Path) -> Result<Repairs> {
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { action, path, source }
    };
    let mut repairs = Repairs::default();
    for (name, bytes) in [("HEAD", HEAD), ("config", CONFIG)] {
        let path = git_dir.join(name);
        let missing = !path.exists();
        if missing || torn(&path).map_err(io("reading", &path))? {
            crate::durable::write_atomic(&path, bytes.as_bytes(), 0o644).map_err(io("writing", &path))?;
            let was = if missing { "missing" } else { "empty" };
            repairs.0.push(format!("rewrote {} ({was}) as git init writes it", path.display()));
        }
    }
    let head = git_dir.join("HEAD");
    let content = std::fs::read_to_string(&head).map_err(io("reading", &head))?;
    let detached = content.trim().len() == 40 && content.trim().bytes().all(|b| b.is_ascii_hexdigit());
    if content != HEAD && !detached {
        let reason = format!("names {:?}, not {BRANCH}", content.trim());
        return Err(Error::Corrupt { path: head, reason });
    }
    let objects = git_dir.join("objects");
    let mut stack = vec![git_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(io("reading", &dir))? {
            let entry = entry.map_err(io("reading", &dir))?;
            let path: PathBuf = entry.path();
            if entry.file_type().map_err(io("reading", &path))?.is_dir() {
                stack.push(path);
            } else if torn_file(&path, &objects).map_err(io("reading", &path))? {
                crate::durable::remove_file(&path).map_err(io("removing", &path))?;
                let name = path.strip_prefix(git_dir).unwrap_or(&path).display().to_string();
                repairs.0.push(format!("removed .git/{name}, which a power cut left empty"));
            }
        }
    }
    Ok(repairs)
}
