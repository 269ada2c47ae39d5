//! The git side of a prebuild, through the `git` CLI: a per-agent mirror of the config
//! repository (`<agent>/repo.git`, `git clone --mirror`, then `git fetch --prune`),
//! resolving the wanted rev to a commit there, and checking that commit out into a
//! fresh generation directory (`git clone --no-checkout` from the mirror, then
//! `git checkout --detach`). Every command's stderr is kept for the error message.
//!
//! Every git command hive runs names its repository ([`Repo`], [`confine`]): a mirror or
//! a checkout whose `HEAD` a power cut emptied is then an error, never a reason for git
//! to look for a repository in the directories above it (the operator's checkout that
//! holds the state dir).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
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
    // A mirror is a cache of the config repository: one a power cut tore (an empty
    // `HEAD` or `config`) is cloned again rather than an error on every build.
    if mirror.join("HEAD").exists()
        && git(agent, Repo::Bare(mirror), &["rev-parse", "--git-dir"], log).await.is_err()
    {
        log.line(&format!("the mirror {} is not a usable repository; cloning it again", mirror.display()));
        std::fs::remove_dir_all(mirror).map_err(|source| Error::Io {
            agent: agent.into(),
            action: "cannot remove",
            path: mirror.into(),
            source,
        })?;
    }
    if mirror.join("HEAD").exists() {
        let repo = Repo::Bare(mirror);
        // The stored remote follows `spec.config.repo` when the user changes it.
        git(agent, repo, &["remote", "set-url", "origin", url], log).await?;
        git(agent, repo, &["fetch", "--quiet", "--prune", "--force", "origin"], log).await?;
    } else {
        let parent = mirror.parent().unwrap_or(mirror);
        let target = mirror.to_string_lossy();
        git(agent, Repo::None(parent), &["clone", "--quiet", "--mirror", "--", url, &target], log).await?;
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
        git(agent, Repo::Bare(mirror), &["rev-parse", "--verify", "--quiet", "--end-of-options", &spec], log)
            .await?;
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
    let mirror = Repo::Bare(mirror);
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
    git(agent, Repo::None(parent), &["clone", "--quiet", "--no-checkout", "--", &source, &target], log)
        .await?;
    git(
        agent,
        Repo::WorkTree(dir),
        &["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", sha],
        log,
    )
    .await?;
    Ok(())
}

/// The ref a shipped bundle carries: the one commit a fleet node builds.
pub const SHIP_REF: &str = "refs/hive/ship";

/// Writes a git bundle of commit `sha` (and its history) from the mirror to `file`, under
/// [`SHIP_REF`]: what a fleet node builds from, so it never needs the config remote.
pub async fn bundle(agent: &str, mirror: &Path, sha: &str, file: &Path, log: &dyn BuildLog) -> Result<()> {
    git(agent, Repo::Bare(mirror), &["update-ref", SHIP_REF, sha], log).await?;
    let target = file.to_string_lossy();
    git(agent, Repo::Bare(mirror), &["bundle", "create", "--quiet", &target, SHIP_REF], log).await?;
    Ok(())
}

/// The repository a git command works on, named explicitly.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Repo<'a> {
    /// A bare repository (a mirror): this directory is the git dir.
    Bare(&'a Path),
    /// A work tree with its git dir at `<dir>/.git`.
    WorkTree(&'a Path),
    /// No repository: a command that makes one (`clone`, `init`), run in this directory.
    None(&'a Path),
}

impl Repo<'_> {
    /// The directory the command runs in.
    pub fn dir(&self) -> &Path {
        match self {
            Repo::Bare(dir) | Repo::WorkTree(dir) | Repo::None(dir) => dir,
        }
    }
}

/// Variables a parent process (a git hook, a user shell) may have set that would point
/// git at another repository, index, object store or identity.
const INHERITED: [&str; 13] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "GIT_COMMITTER_DATE",
];

/// Points `cmd` at exactly `repo`: runs it in the repo's directory with `GIT_DIR` (and
/// `GIT_WORK_TREE`) set, so git never discovers a repository by walking up; and with
/// `GIT_CEILING_DIRECTORIES` at the directory's parent, so a command without a
/// repository (`clone`) looks at no directory above the one it runs in, not even for
/// configuration. Variables inherited from a parent process that would redirect git are
/// removed.
pub(crate) fn confine(cmd: &mut Command, repo: Repo<'_>) {
    let dir = repo.dir();
    for name in INHERITED {
        cmd.env_remove(name);
    }
    cmd.current_dir(dir).env("GIT_CEILING_DIRECTORIES", ceiling(dir));
    match repo {
        Repo::Bare(git_dir) => {
            cmd.env("GIT_DIR", git_dir);
        }
        Repo::WorkTree(work_tree) => {
            cmd.env("GIT_DIR", work_tree.join(".git")).env("GIT_WORK_TREE", work_tree);
        }
        Repo::None(_) => {}
    }
}

/// The ceiling for a command run in `dir`: its parent (git never enters the ceiling when
/// walking up, so it looks at `dir` itself only), made absolute.
fn ceiling(dir: &Path) -> OsString {
    let absolute = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir().map(|cwd| cwd.join(dir)).unwrap_or_else(|_| dir.to_path_buf())
    };
    absolute.parent().map(PathBuf::from).unwrap_or(absolute).into_os_string()
}

/// Runs `git <args>` in `repo`, logging the command line, and returns its stdout.
async fn git(agent: &str, repo: Repo<'_>, args: &[&str], log: &dyn BuildLog) -> Result<String> {
    let command = format!("git {}", args.join(" "));
    log.line(&format!("$ {command}"));
    let dir = repo.dir();
    let mut cmd = Command::new("git");
    cmd.args(args).env("GIT_TERMINAL_PROMPT", "0").stdin(Stdio::null()).kill_on_drop(true);
    confine(&mut cmd, repo);
    let output = cmd.output().await.map_err(|source| Error::Spawn {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::process::testing;

    #[tokio::test]
    async fn a_mirror_with_a_torn_head_is_never_the_enclosing_repo_and_is_cloned_again() {
        // The state dir (with its mirrors) inside the operator's checkout.
        let tmp = tempfile::tempdir().unwrap();
        let checkout = tmp.path();
        testing::git(checkout, &["init", "--quiet", "-b", "trunk"]);
        std::fs::write(checkout.join("README"), "the operator's project\n").unwrap();
        testing::git(checkout, &["add", "README"]);
        testing::git(checkout, &["commit", "--quiet", "-m", "operator"]);
        let operators = testing::git(checkout, &["rev-parse", "HEAD"]);
        std::fs::create_dir_all(checkout.join(".hive/mirrors")).unwrap();
        let config = testing::config_repo(&checkout.join(".hive"), "echo VERSION");
        let mirror = checkout.join(".hive/mirrors/a.git");
        let log = |_: &str| {};
        sync_mirror("a", &config.to_string_lossy(), &mirror, &log).await.unwrap();
        let v2 = resolve("a", &mirror, Some("v2"), &log).await.unwrap();
        assert_ne!(v2, operators);

        // A cut empties the mirror's HEAD: resolving is an error, never the checkout's
        // commit; a fetch and a diff fail too, and nothing lands in the checkout's repo.
        std::fs::write(mirror.join("HEAD"), "").unwrap();
        let refs = testing::git(checkout, &["for-each-ref"]);
        match resolve("a", &mirror, None, &log).await {
            Ok(sha) => assert_ne!(sha, operators, "resolved the enclosing repository's HEAD"),
            Err(error) => assert!(error.to_string().contains("not a git repository"), "{error}"),
        }
        assert!(diff_summary("a", &mirror, &operators, &operators, &log).await.is_err());
        assert_eq!(testing::git(checkout, &["for-each-ref"]), refs);
        // The next sync clones the torn mirror again, and it resolves as before.
        sync_mirror("a", &config.to_string_lossy(), &mirror, &log).await.unwrap();
        assert_eq!(resolve("a", &mirror, Some("v2"), &log).await.unwrap(), v2);
        assert_eq!(testing::git(checkout, &["for-each-ref"]), refs);
        assert!(
            !testing::git(checkout, &["remote"]).contains("origin"),
            "a remote was added to the checkout"
        );
    }
}
