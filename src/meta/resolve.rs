//! Resolving an agent's config source (`spec.config.repo` at `spec.config.rev`, a
//! branch, tag or sha) to the full commit the meta repo locks. Runtime-agnostic: it
//! keeps its own bare mirror per agent under a cache directory (the process runtime
//! keeps another for its builds), so a lock is always a real commit of the repository.

use std::path::{Path, PathBuf};

use hive_api::agent::Agent;

use crate::runtime::process::git;
use crate::runtime::{BuildLog, Result};

/// Resolves agents' config revs through mirrors under one directory.
#[derive(Clone, Debug)]
pub struct Resolver {
    cache: PathBuf,
}

impl Resolver {
    /// A resolver keeping its mirrors in `cache` (created on first use).
    pub fn new(cache: impl Into<PathBuf>) -> Resolver {
        Resolver { cache: cache.into() }
    }

    fn mirror(&self, agent: &str) -> PathBuf {
        self.cache.join(format!("{agent}.git"))
    }

    /// The full sha `rev` names in the agent's config repository right now (fetching
    /// first); `None` resolves the default branch.
    pub async fn resolve_rev(&self, agent: &Agent, rev: Option<&str>, log: &dyn BuildLog) -> Result<String> {
        let name = agent.metadata.name.as_str();
        std::fs::create_dir_all(&self.cache).map_err(|source| crate::runtime::Error::Io {
            agent: name.into(),
            action: "cannot create",
            path: self.cache.clone(),
            source,
        })?;
        let mirror = self.mirror(name);
        git::sync_mirror(name, &agent.spec.config.repo, &mirror, log).await?;
        git::resolve(name, &mirror, rev, log).await
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

    /// Forgets the mirror of a deleted agent.
    pub fn forget(&self, agent: &str) {
        let _ = std::fs::remove_dir_all(self.mirror(agent));
    }

    /// The cache directory.
    pub fn cache(&self) -> &Path {
        &self.cache
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
