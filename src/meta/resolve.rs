//! Resolving an agent's config source (`spec.config.repo` at `spec.config.rev`, a
//! branch, tag or sha) to the full commit the meta repo locks. Runtime-agnostic: it
//! keeps its own bare mirror per agent under a cache directory (the process runtime
//! keeps another for its builds), so a lock is always a real commit of the repository.
//!
//! Everyone who resolves or compares an agent's revs — deploys, meta updates, and any
//! number of viewers asking for an approval's diff at once — shares that agent's one
//! mirror. Git cannot write one repository from two processes at once (the second fails
//! on the first's lock file), so each mirror is fetched by one caller at a time, and the
//! callers that arrived while a fetch ran share the next one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hive_api::agent::Agent;

use crate::runtime::process::git;
use crate::runtime::{BuildLog, Error, Result};

/// Resolves agents' config revs through mirrors under one directory.
#[derive(Clone, Debug)]
pub struct Resolver {
    cache: PathBuf,
    /// One entry per agent whose mirror was used, shared by every clone.
    mirrors: Arc<Mutex<HashMap<String, Arc<Fetches>>>>,
}

/// The fetches into one agent's mirror.
#[derive(Debug, Default)]
struct Fetches {
    /// How many fetches have begun.
    begun: AtomicU64,
    /// Held while a fetch runs; holds the number of the last fetch that succeeded.
    fetched: tokio::sync::Mutex<u64>,
}

impl Resolver {
    /// A resolver keeping its mirrors in `cache` (created on first use).
    pub fn new(cache: impl Into<PathBuf>) -> Resolver {
        Resolver { cache: cache.into(), mirrors: Arc::default() }
    }

    fn mirror(&self, agent: &str) -> PathBuf {
        self.cache.join(format!("{agent}.git"))
    }

    fn fetches(&self, agent: &str) -> Arc<Fetches> {
        let mut mirrors = self.mirrors.lock().unwrap_or_else(|e| e.into_inner());
        mirrors.entry(agent.to_string()).or_default().clone()
    }

    /// Brings the agent's mirror up to date with its repository: by a fetch that begins
    /// after this call did (this call's own, or one it waited for), so the mirror is at
    /// least as new as the repository was when it was asked.
    async fn sync(&self, agent: &Agent, log: &dyn BuildLog) -> Result<()> {
        let name = agent.metadata.name.clone();
        let fetches = self.fetches(&name);
        let arrived = fetches.begun.load(Ordering::Acquire);
        let (cache, mirror, repo) = (self.cache.clone(), self.mirror(&name), agent.spec.config.repo.clone());
        // In a task of its own: a caller that goes away (a client that hung up, a
        // cancelled Job) must not kill git halfway through writing the mirror, which
        // would leave its lock file behind for every later fetch to fail on.
        let fetch = tokio::spawn(async move {
            let mut fetched = fetches.fetched.lock().await;
            let lines = Lines::default();
            if *fetched > arrived {
                return (Ok(()), lines);
            }
            let number = fetches.begun.fetch_add(1, Ordering::AcqRel) + 1;
            let result = match std::fs::create_dir_all(&cache) {
                Ok(()) => git::sync_mirror(&name, &repo, &mirror, &lines).await,
                Err(source) => {
                    Err(Error::Io { agent: name.clone(), action: "cannot create", path: cache, source })
                }
            };
            if result.is_ok() {
                *fetched = number;
            }
            (result, lines)
        });
        let (result, lines) = fetch.await.map_err(|e| Error::Io {
            agent: agent.metadata.name.clone(),
            action: "the fetch stopped in",
            path: self.mirror(&agent.metadata.name),
            source: std::io::Error::other(e.to_string()),
        })?;
        for line in lines.0.into_inner().unwrap_or_else(|e| e.into_inner()) {
            log.line(&line);
        }
        result
    }

    /// The full sha `rev` names in the agent's config repository right now (fetching
    /// first); `None` resolves the default branch.
    pub async fn resolve_rev(&self, agent: &Agent, rev: Option<&str>, log: &dyn BuildLog) -> Result<String> {
        self.sync(agent, log).await?;
        let name = agent.metadata.name.as_str();
        git::resolve(name, &self.mirror(name), rev, log).await
    }

    /// The full sha of the agent's wanted `spec.config.rev`.
    pub async fn resolve(&self, agent: &Agent, log: &dyn BuildLog) -> Result<String> {
        self.resolve_rev(agent, agent.spec.config.rev.as_deref(), log).await
    }

    /// What would change if the agent went from commit `base` to what `head` names
    /// (fetching first): the resolved head and the summary.
    pub async fn diff(
        &self,
        agent: &Agent,
        base: &str,
        head: &str,
        log: &dyn BuildLog,
    ) -> Result<(String, git::DiffSummary)> {
        let head = self.resolve_rev(agent, Some(head), log).await?;
        let name = agent.metadata.name.as_str();
        let summary = git::diff_summary(name, &self.mirror(name), base, &head, log).await?;
        Ok((head, summary))
    }

    /// Forgets the mirror of a deleted agent (after a fetch into it that runs).
    pub async fn forget(&self, agent: &str) {
        let fetches = self.mirrors.lock().unwrap_or_else(|e| e.into_inner()).remove(agent);
        let _fetched = match &fetches {
            Some(fetches) => Some(fetches.fetched.lock().await),
            None => None,
        };
        let _ = std::fs::remove_dir_all(self.mirror(agent));
    }

    /// What went wrong in `agent`'s mirror, told so a client may see it: the agent, its
    /// repository and git's own words, with every path of the daemon's (the mirror, its
    /// directory, the state dir above it) taken out. The log keeps `error` itself.
    pub fn describe(&self, agent: &Agent, error: &Error) -> String {
        let what = match error {
            Error::Command { command, status, output, .. } => {
                let output = output.trim();
                let output = if output.is_empty() { String::new() } else { format!(": {output}") };
                format!("`{command}` failed: {status}{output}")
            }
            Error::Spawn { command, source, .. } => format!("cannot run `{command}`: {source}"),
            Error::Io { action, source, .. } => format!("{action} its mirror: {source}"),
            other => other.to_string(),
        };
        format!(
            "agent {:?}, config repository {}: {}",
            agent.metadata.name,
            agent.spec.config.repo,
            self.without_paths(&what, &agent.metadata.name)
        )
    }

    /// `text` with the agent's mirror, the mirrors' directory and the state dir above it
    /// replaced by words (as written and as the file system resolves them, which is how
    /// git prints them).
    fn without_paths(&self, text: &str, agent: &str) -> String {
        let mirror = self.mirror(agent);
        let state_dir = self.cache.parent().map(Path::to_path_buf);
        let mut paths: Vec<(PathBuf, &str)> = vec![(mirror, "<mirror>"), (self.cache.clone(), "<mirrors>")];
        paths.extend(state_dir.map(|dir| (dir, "<state dir>")));
        let mut spelled: Vec<(String, &str)> = Vec::new();
        for (path, word) in paths {
            let canonical = std::fs::canonicalize(&path).ok();
            for form in [Some(path), canonical].into_iter().flatten() {
                let form = form.display().to_string();
                // A relative state dir (`.`) is no path to hide, and replacing it would
                // mangle every sentence.
                if Path::new(&form).is_absolute() && form.len() > 1 {
                    spelled.push((form, word));
                }
            }
        }
        // Longest first: the mirror lies in the mirrors' directory, which lies in the
        // state dir.
        spelled.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
        let mut text = text.to_string();
        for (path, word) in spelled {
            text = text.replace(&path, word);
        }
        text
    }

    /// The cache directory.
    pub fn cache(&self) -> &Path {
        &self.cache
    }
}

/// What a fetch run in its own task printed, handed to the caller's log when it is done.
#[derive(Default)]
struct Lines(Mutex<Vec<String>>);

impl BuildLog for Lines {
    fn line(&self, line: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(line.to_string());
    }
}

/// How the meta repo records a config repository: an absolute path for a local one
/// (relative paths resolve against the daemon's working directory, as builds do), the
/// URL as written for a remote one. The meta module renders either as a flake input.
pub fn source_url(repo: &str) -> String {
    let remote = repo.contains("://") || repo.split_once(':').is_some_and(|(host, _)| host.contains('@'));
    let path = Path::new(repo);
    if remote || path.is_absolute() {
        return repo.to_string();
    }
    std::env::current_dir()
        .map(|cwd| cwd.join(path).display().to_string())
        .unwrap_or_else(|_| repo.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::process::testing;

    fn agent(name: &str, repo: &Path) -> Agent {
        let mut agent = Agent::default();
        agent.metadata.name = name.into();
        agent.spec.config.repo = repo.display().to_string();
        agent
    }

    /// Issue 28 item 8: 128 concurrent diffs of one agent ran 128 fetches into its one
    /// mirror at once, and some failed on each other's lock files (`could not lock
    /// config file`). Every one of many concurrent resolves and diffs succeeds, and they
    /// share fetches rather than each running its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_resolves_and_diffs_of_one_mirror_all_succeed() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = testing::config_repo(tmp.path(), "echo VERSION");
        let resolver = Resolver::new(tmp.path().join("state/mirrors"));
        let alpha = agent("alpha", &repo);
        let v1 = testing::git(&repo, &["rev-parse", "v1"]);
        let fetches = Arc::new(AtomicU64::new(0));
        let asks = (0..64).map(|i| {
            let (resolver, alpha, v1, fetches) =
                (resolver.clone(), alpha.clone(), v1.clone(), fetches.clone());
            tokio::spawn(async move {
                let log = move |line: &str| {
                    if line.starts_with("$ git fetch") || line.starts_with("$ git clone") {
                        fetches.fetch_add(1, Ordering::Relaxed);
                    }
                };
                if i % 2 == 0 {
                    resolver.diff(&alpha, &v1, "v2", &log).await.map(|(head, _)| head)
                } else {
                    resolver.resolve_rev(&alpha, Some("v2"), &log).await
                }
            })
        });
        let v2 = testing::git(&repo, &["rev-parse", "v2"]);
        for answer in futures_util::future::join_all(asks).await {
            assert_eq!(answer.unwrap().unwrap(), v2);
        }
        let fetched = fetches.load(Ordering::Relaxed);
        assert!((1..64).contains(&fetched), "{fetched} fetches for 64 callers");
    }

    /// A failed fetch or an unknown rev is told naming the agent and its repository,
    /// never a path in the daemon's state dir (which git's own words hold).
    #[tokio::test]
    async fn a_failure_is_described_without_the_state_dirs_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = testing::config_repo(tmp.path(), "echo VERSION");
        let state_dir = tmp.path().join("state");
        let resolver = Resolver::new(state_dir.join("mirrors"));
        let alpha = agent("alpha", &repo);
        let quiet = |_: &str| {};
        let unknown = resolver.resolve_rev(&alpha, Some("no-such-rev"), &quiet).await.unwrap_err();
        let gone = agent("alpha", &tmp.path().join("nowhere"));
        let unreachable = resolver.resolve_rev(&gone, None, &quiet).await.unwrap_err();
        let never_cloned = agent("beta", &tmp.path().join("nowhere"));
        let not_cloned = resolver.resolve_rev(&never_cloned, None, &quiet).await.unwrap_err();
        for (agent, error) in [(&alpha, unknown), (&gone, unreachable), (&never_cloned, not_cloned)] {
            assert!(
                error.to_string().contains(&state_dir.display().to_string()),
                "the error itself names it"
            );
            let told = resolver.describe(agent, &error);
            assert!(!told.contains(&state_dir.display().to_string()), "{told}");
            let name = &agent.metadata.name;
            assert!(
                told.starts_with(&format!(
                    "agent {name:?}, config repository {}: `git ",
                    agent.spec.config.repo
                )),
                "{told}"
            );
        }
    }
}
