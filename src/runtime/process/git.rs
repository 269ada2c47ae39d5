//! The git side of a prebuild, through the `git` CLI: a per-agent mirror of the config
//! repository (`<agent>/repo.git`, `git clone --mirror`, then `git fetch --prune`),
//! resolving the wanted rev to a commit there, and checking that commit out into a
//! fresh generation directory (`git clone --no-checkout` from the mirror, then
//! `git checkout --detach`). Every command's stderr is kept for the error message.

use std::path::Path;
use std::process::Stdio;

use tokio::process::Command;

use crate::runtime::{BuildLog, Error, Result};

/// Clones the mirror on first use, fetches it otherwise.
pub async fn sync_mirror(agent: &str, repo: &str, mirror: &Path, log: &dyn BuildLog) -> Result<()> {
    // A `file://` URL, a remote URL and an absolute path go to git as written; a
    // relative path is resolved against the daemon's working directory (so an example
    // can name the repository it ships in as `.`).
    let resolved = resolve_relative(repo);
    let url = resolved.as_str();
    if mirror.join("HEAD").exists() {
        let dir = mirror;
        // The stored remote follows `spec.config.repo` when the user changes it.
        git(agent, dir, &["remote", "set-url", "origin", url], log).await?;
        git(agent, dir, &["fetch", "--quiet", "--prune", "--force", "origin"], log).await?;
    } else {
        let parent = mirror.parent().unwrap_or(mirror);
        let target = mirror.to_string_lossy();
        git(agent, parent, &["clone", "--quiet", "--mirror", "--", url, &target], log).await?;
    }
    Ok(())
}

/// `repo` with a relative local path made absolute against the current directory.
fn resolve_relative(repo: &str) -> String {
    let remote = repo.contains("://") || repo.split_once(':').is_some_and(|(host, _)| host.contains('@'));
    if remote || Path::new(repo).is_absolute() {
        return repo.to_string();
    }
    match std::env::current_dir() {
        Ok(cwd) => cwd.join(repo).to_string_lossy().into_owned(),
        Err(_) => repo.to_string(),
    }
}

/// The full commit sha `rev` (a branch, tag or sha; `None` is the default branch's
/// head) names in the mirror.
pub async fn resolve(agent: &str, mirror: &Path, rev: Option<&str>, log: &dyn BuildLog) -> Result<String> {
    let spec = format!("{}^{{commit}}", rev.unwrap_or("HEAD"));
    let out =
        git(agent, mirror, &["rev-parse", "--verify", "--quiet", "--end-of-options", &spec], log).await?;
    Ok(out.trim().to_string())
}

/// What changes between two commits of a mirror: the commits (newest first, at most
/// [`DIFF_COMMITS`]), the per-file stat and the totals.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffSummary {
    /// `<short sha> <subject>` of each commit in `base..head`.
    pub commits: Vec<String>,
    /// Commits in `base..head` in all (more than `commits` holds when it was cut).
    pub commit_count: usize,
    /// `git diff --stat` of `base` to `head`, one line per file and the totals line.
    pub stat: Vec<String>,
    /// Files changed.
    pub files_changed: u64,
    /// Lines added.
    pub insertions: u64,
    /// Lines removed.
    pub deletions: u64,
}

/// How many commits a [`DiffSummary`] lists.
pub const DIFF_COMMITS: usize = 50;

/// The change from commit `base` to commit `head` in the mirror.
pub async fn diff_summary(
    agent: &str,
    mirror: &Path,
    base: &str,
    head: &str,
    log: &dyn BuildLog,
) -> Result<DiffSummary> {
    let range = format!("{base}..{head}");
    let count = git(agent, mirror, &["rev-list", "--count", "--end-of-options", &range], log).await?;
    let commits = git(
        agent,
        mirror,
        &["log", &format!("--max-count={DIFF_COMMITS}"), "--format=%h %s", "--end-of-options", &range],
        log,
    )
    .await?;
    let stat = git(agent, mirror, &["diff", "--stat=100", "--end-of-options", base, head], log).await?;
    let totals = git(agent, mirror, &["diff", "--numstat", "--end-of-options", base, head], log).await?;
    let mut summary = DiffSummary {
        commits: commits.lines().map(str::to_string).collect(),
        commit_count: count.trim().parse().unwrap_or(0),
        stat: stat.lines().map(|l| l.trim_end().to_string()).collect(),
        ..Default::default()
    };
    for line in totals.lines() {
        let mut fields = line.split('\t');
        // Binary files count as changed with `-` for both numbers.
        let (added, removed) = (fields.next().unwrap_or("-"), fields.next().unwrap_or("-"));
        summary.files_changed += 1;
        summary.insertions += added.parse::<u64>().unwrap_or(0);
        summary.deletions += removed.parse::<u64>().unwrap_or(0);
    }
    Ok(summary)
}

/// Checks commit `sha` out from the mirror into `dir`, which must not exist yet.
pub async fn checkout(agent: &str, mirror: &Path, sha: &str, dir: &Path, log: &dyn BuildLog) -> Result<()> {
    let parent = dir.parent().unwrap_or(dir);
    let source = mirror.to_string_lossy();
    let target = dir.to_string_lossy();
    git(agent, parent, &["clone", "--quiet", "--no-checkout", "--", &source, &target], log).await?;
    git(agent, dir, &["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", sha], log)
        .await?;
    Ok(())
}

/// Runs `git <args>` in `dir`, logging the command line, and returns its stdout.
async fn git(agent: &str, dir: &Path, args: &[&str], log: &dyn BuildLog) -> Result<String> {
    let command = format!("git {}", args.join(" "));
    log.line(&format!("$ {command}"));
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| Error::Spawn {
            agent: agent.into(),
            command: command.clone(),
            dir: dir.into(),
            source,
        })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    for line in stderr.lines() {
        log.line(line);
    }
    if !output.status.success() {
        return Err(Error::Command {
            agent: agent.into(),
            command,
            dir: dir.into(),
            status: output.status.to_string(),
            output: stderr.trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
