//! The meta repo: a git repository holding the flake that pins what every agent runs
//! (`flake.nix`, `flake.lock`) and each agent's permission files. Its git log is the
//! deploy audit trail.
//!
//! Three rules keep the repo consistent while many scheduler nodes touch it:
//! - every public operation holds one internal mutex for its whole duration and fuses
//!   its mutation with its commit, so no dirty work tree is left between operations;
//! - every commit and every "did anything change" check is limited to the operation's
//!   own paths, so nobody else's staged content is ever swept into a commit;
//! - a mutation needs a [`Gate`], the deploy-window guard, so no commit can land inside
//!   a two-phase deploy's uncommitted window (prepare → finalize or abort);
//! - with a [`Journal`] (replicas on etcd), every commit is recorded in it before the
//!   operation answers, and opening the repo first brings it to the journal's head, so
//!   every leader works on one history (`journal.rs`).

pub mod applied;
mod audit;
mod deploy;
mod error;
mod files;
mod git;
mod journal;
#[cfg(test)]
mod journal_tests;
mod lock;
#[cfg(test)]
mod power_cut_tests;
mod render;
mod repair;
pub mod resolve;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{Mutex, OwnedMutexGuard};

pub use audit::AuditEntry;
pub use deploy::{Deployed, PreparedDeploy};
pub use error::{Error, Result};
pub use journal::{Journal, JournalEntry, JournalHead, FOLD_EVERY};
pub use repair::Repairs;

use files::{commit_files, FileWrite, Message, Op};
use git::Git;
use journal::Journaled;
use lock::{agent_input, Lock, Node, Source, HIVE};

/// The file that pins every input.
const FLAKE_LOCK: &str = "flake.lock";
/// The file rendered from the lock.
const FLAKE_NIX: &str = "flake.nix";
/// The directory of per-agent files.
const AGENTS_DIR: &str = "agents";
/// An agent's tool-groups permission file, under `agents/<name>/`.
const TOOL_GROUPS: &str = "tool-groups.json";
/// An agent's capabilities permission file, under `agents/<name>/`.
const CAPABILITIES: &str = "capabilities.json";

/// Where the meta repo lives and how its hive input starts out.
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// The repo's directory (the daemon uses `<state-dir>/meta`).
    pub dir: PathBuf,
    /// The hive base flake's reference, e.g. `github:hive-dev/hive`.
    pub hive_url: String,
    /// The hive input's rev in the very first lock (later ones come from
    /// `lock_update_hive`).
    pub hive_rev: String,
    /// Where every commit is recorded beyond this host (replicas on etcd); `None` for a
    /// daemon on its own.
    pub journal: Option<Arc<dyn Journal>>,
}

/// A commit of the meta repo, by full sha.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CommitId(pub String);

impl fmt::Display for CommitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One agent's configuration repository, as `sync_agents` wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentInput {
    /// The agent's name (a DNS-1123 label).
    pub name: String,
    /// A local path or a git URL.
    pub url: String,
    /// The full sha to lock, or `None` to keep the current lock.
    pub rev: Option<String>,
}

/// One input as the committed lock pins it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locked {
    /// The input's URL; a local repository is its absolute path.
    pub url: String,
    /// The pinned rev.
    pub rev: String,
}

impl Locked {
    fn of(node: &Node) -> Locked {
        Locked { url: node.source.url(), rev: node.rev.clone() }
    }
}

/// What a `lock_update` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockBump {
    /// The commit, or `None` when no rev changed.
    pub commit: Option<CommitId>,
    /// The inputs (`hive` or agent names) whose rev changed, sorted.
    pub changed: Vec<String>,
}

/// The held deploy-window gate. Every mutating operation takes one, so whoever holds it
/// (for one operation or across a prepare → finalize window) is the only writer.
pub struct Gate {
    guard: OwnedMutexGuard<()>,
}

impl Gate {
    /// Refuses a gate taken from another `Meta`.
    fn check(&self, inner: &Inner) -> Result<()> {
        if Arc::ptr_eq(OwnedMutexGuard::mutex(&self.guard), &inner.gate) {
            Ok(())
        } else {
            Err(Error::ForeignGate)
        }
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Gate")
    }
}

/// The meta repo. Cheap to clone; clones share the lock, the gate and the repo.
#[derive(Clone)]
pub struct Meta {
    inner: Arc<Inner>,
}

impl fmt::Debug for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meta").field("dir", &self.inner.dir).finish_non_exhaustive()
    }
}

struct Inner {
    dir: PathBuf,
    git: Git,
    /// The hive input's source from the configuration; `sync_agents` applies it.
    hive_source: Source,
    /// The one internal lock every public operation holds throughout.
    state: Mutex<State>,
    /// The deploy-window gate [`Gate`] guards.
    gate: Arc<Mutex<()>>,
    /// What opening the repo put back after a crash or a power cut.
    repairs: Repairs,
}

/// What the lock holds besides the repo itself.
struct State {
    /// The committed lock (a prepared deploy's rev is not in it until finalized).
    lock: Lock,
    /// The prepared, not yet finalized or aborted, deploy.
    pending: Option<deploy::Pending>,
    /// The journal every commit is recorded in, when there is one.
    journal: Option<Journaled>,
}

impl State {
    /// Refuses an operation that would rewrite `flake.lock` inside a deploy window, so
    /// the window's staged rev can never be committed under another message.
    fn refuse_pending(&self) -> Result<()> {
        match &self.pending {
            Some(pending) => Err(Error::DeployPending { agent: pending.agent.clone() }),
            None => Ok(()),
        }
    }
}

impl Meta {
    /// Opens the meta repo in `config.dir`, creating it (`git init` and one `meta: init`
    /// commit of `flake.nix` and a `flake.lock` holding only the hive input) when the
    /// directory holds no repo. Opening an existing repo never commits; a broken one
    /// (a `flake.lock` hive could not have written) is an error naming the file. A
    /// deploy window a crash left open is closed by restoring the committed files. With
    /// a journal, the repo is first brought to the journal's head (or seeds it), and the
    /// `meta: init` commit of a new repo is recorded.
    pub async fn open(config: MetaConfig) -> Result<Meta> {
        let hive_source = Source::parse(&config.hive_url)?;
        let dir = config.dir.clone();
        crate::durable::create_dir_all(&dir).map_err(|source| Error::Io {
            action: "creating",
            path: dir.clone(),
            source,
        })?;
        let git = Git::new(&dir);
        let mut repairs = Repairs::default();
        if dir.join(".git").exists() {
            repairs = match repair::repair(&git, &dir).await? {
                repair::Repaired::Whole(repairs) | repair::Repaired::Removed(repairs) => repairs,
            };
        }
        if !dir.join(".git").exists() {
            git.run(&["init", "--quiet", "--initial-branch=main"]).await?;
        }
        let mut journal = match config.journal {
            Some(journal) => Some(Journaled::restore(journal, &git).await?),
            None => None,
        };
        let lock = match git.head().await? {
            // A new repo, or one a crash left before its first commit.
            None => {
                validate_rev(HIVE, &config.hive_rev)?;
                let lock = Lock::new(Node { source: hive_source.clone(), rev: config.hive_rev.clone() });
                let files = lock_files(&lock);
                let init = commit_files(&git, &dir, files, Message::new(Op::Init, "meta: init", [])).await?;
                if let (Some(journal), Some(init)) = (journal.as_mut(), init) {
                    journal.record(&git, None, &init.0, &[]).await?;
                }
                lock
            }
            Some(_) => {
                // A flake.lock with content hive did not write is corrupt; an empty one
                // is what a cut left of an unacknowledged step, put back below.
                let lock_path = dir.join(FLAKE_LOCK);
                if !repair::torn(&lock_path).unwrap_or(false) {
                    read_lock(&dir).await?;
                }
                let ours = [FLAKE_NIX.to_string(), FLAKE_LOCK.to_string(), AGENTS_DIR.to_string()];
                let dirty = git.changed(&ours).await?;
                if !dirty.is_empty() {
                    // Only a crash inside an operation or a deploy window leaves them so.
                    tracing::warn!(dir = %dir.display(), files = ?dirty, "restoring uncommitted meta files");
                    restore_from_head(&git, &dirty).await?;
                    repairs.0.push(format!("put {} back as HEAD holds them", dirty.join(", ")));
                }
                read_lock(&dir).await?
            }
        };
        let state = State { lock, pending: None, journal };
        let inner = Inner {
            dir,
            git,
            hive_source,
            state: Mutex::new(state),
            gate: Arc::new(Mutex::new(())),
            repairs,
        };
        Ok(Meta { inner: Arc::new(inner) })
    }

    /// The repo's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// What opening the repo found torn or uncommitted and put back (empty when nothing).
    pub fn repairs(&self) -> &[String] {
        &self.inner.repairs.0
    }

    /// Waits for and takes the deploy-window gate.
    pub async fn gate(&self) -> Gate {
        Gate { guard: self.inner.gate.clone().lock_owned().await }
    }

    /// Makes the meta flake hold exactly `agents`: renders `flake.nix` for the set,
    /// locks new agents at their rev, applies given revs, drops the input and the
    /// `agents/<name>/` permission files of agents that were in the set and are not
    /// listed any more, applies the configured hive URL, and commits once
    /// (`Hive-Op: sync`) if anything changed. Idempotent.
    pub async fn sync_agents(&self, gate: &Gate, agents: &[AgentInput]) -> Result<Option<CommitId>> {
        gate.check(&self.inner)?;
        let agents = agents.to_vec();
        self.detached(move |inner| async move {
            let mut state = inner.state.lock().await;
            inner.recover_abandoned(&mut state).await?;
            state.refuse_pending()?;
            let hive = state.lock.hive().map(|node| node.rev.clone()).unwrap_or_default();
            let mut next = Lock::new(Node { source: inner.hive_source.clone(), rev: hive });
            for agent in &agents {
                validate_name(&agent.name)?;
                let source = Source::parse(&agent.url)?;
                let input = agent_input(&agent.name);
                if next.inputs.contains_key(&input) {
                    return Err(Error::DuplicateAgent { name: agent.name.clone() });
                }
                let current = state.lock.inputs.get(&input);
                let rev = match (&agent.rev, current) {
                    (Some(rev), _) => rev.clone(),
                    (None, Some(node)) if node.source == source => node.rev.clone(),
                    (None, _) => {
                        return Err(Error::Unlocked { name: agent.name.clone(), url: agent.url.clone() })
                    }
                };
                validate_rev(&input, &rev)?;
                next.inputs.insert(input, Node { source, rev });
            }
            // Agents that leave the set: only those that were in it. An agent whose
            // permission files are written before its first lock (Create's order) is
            // not "removed" by a sync that does not list it yet.
            let gone: BTreeSet<String> = state
                .lock
                .agents()
                .map(|(name, _)| name.to_string())
                .filter(|name| !next.inputs.contains_key(&agent_input(name)))
                .collect();
            let mut files = lock_files(&next);
            for name in &gone {
                files.extend(permission_paths(name).into_iter().map(|path| FileWrite { path, bytes: None }));
            }
            let (subject, agents) = sync_summary(&state.lock, &next, &gone);
            let commit = inner.commit(&mut state, files, Message::new(Op::Sync, subject, agents)).await?;
            state.lock = next;
            Ok(commit)
        })
        .await
    }

    /// Relocks one agent's input at `url` and `rev` (`Hive-Op: relock`).
    pub async fn relock(&self, gate: &Gate, agent: &str, url: &str, rev: &str) -> Result<Option<CommitId>> {
        gate.check(&self.inner)?;
        let (agent, url, rev) = (agent.to_string(), url.to_string(), rev.to_string());
        self.detached(move |inner| async move {
            let mut state = inner.state.lock().await;
            inner.recover_abandoned(&mut state).await?;
            state.refuse_pending()?;
            validate_name(&agent)?;
            let input = agent_input(&agent);
            validate_rev(&input, &rev)?;
            let source = Source::parse(&url)?;
            let mut next = state.lock.clone();
            let Some(node) = next.inputs.get_mut(&input) else {
                return Err(Error::UnknownAgent { name: agent });
            };
            *node = Node { source, rev: rev.clone() };
            let subject = format!("meta: relock {agent} at {}", short(&rev));
            let message = Message::new(Op::Relock, subject, [agent.clone()]);
            let commit = inner.commit(&mut state, lock_files(&next), message).await?;
            state.lock = next;
            Ok(commit)
        })
        .await
    }

    /// Sets the rev of each named input (`hive` or an agent name) and commits once
    /// (`Hive-Op: lock-update`) when any changed; an unknown input changes nothing.
    pub async fn lock_update(&self, gate: &Gate, updates: &[(String, String)]) -> Result<LockBump> {
        gate.check(&self.inner)?;
        let updates = updates.to_vec();
        self.detached(move |inner| async move {
            let mut state = inner.state.lock().await;
            inner.recover_abandoned(&mut state).await?;
            state.refuse_pending()?;
            let mut next = state.lock.clone();
            for (name, rev) in &updates {
                let input = if name == HIVE {
                    HIVE.to_string()
                } else {
                    validate_name(name)?;
                    agent_input(name)
                };
                validate_rev(&input, rev)?;
                let Some(node) = next.inputs.get_mut(&input) else {
                    return Err(Error::UnknownInput { name: name.clone() });
                };
                node.rev = rev.clone();
                if input == HIVE {
                    // A bump of hive also moves it to the configured `--hive-flake`.
                    node.source = inner.hive_source.clone();
                }
            }
            let changed: Vec<String> = updates
                .iter()
                .map(|(name, _)| name.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .filter(|name| {
                    let input = if name == HIVE { HIVE.to_string() } else { agent_input(name) };
                    state.lock.inputs.get(&input) != next.inputs.get(&input)
                })
                .collect();
            let subject = format!("meta: lock update {}", changed.join(", "));
            let message = Message::new(Op::LockUpdate, subject, concerned(&next, &changed));
            let files = files_for(&state.lock, &next);
            let commit = inner.commit(&mut state, files, message).await?;
            state.lock = next;
            Ok(LockBump { commit, changed })
        })
        .await
    }

    /// Bumps the hive input to `rev` (`Hive-Op: hive-bump`); the commit concerns every
    /// agent, since each one's system is built from hive.
    pub async fn lock_update_hive(&self, gate: &Gate, rev: &str) -> Result<Option<CommitId>> {
        gate.check(&self.inner)?;
        let rev = rev.to_string();
        self.detached(move |inner| async move {
            let mut state = inner.state.lock().await;
            inner.recover_abandoned(&mut state).await?;
            state.refuse_pending()?;
            validate_rev(HIVE, &rev)?;
            let mut next = state.lock.clone();
            if let Some(hive) = next.inputs.get_mut(HIVE) {
                hive.rev = rev.clone();
                hive.source = inner.hive_source.clone();
            }
            let subject = format!("meta: bump hive to {}", short(&rev));
            let message = Message::new(Op::HiveBump, subject, concerned(&next, &[HIVE.to_string()]));
            let files = files_for(&state.lock, &next);
            let commit = inner.commit(&mut state, files, message).await?;
            state.lock = next;
            Ok(commit)
        })
        .await
    }

    /// Writes `agents/<agent>/tool-groups.json` and `capabilities.json` (each a sorted,
    /// de-duplicated JSON array) and commits both at once (`Hive-Op: permissions`).
    pub async fn write_permissions(
        &self,
        gate: &Gate,
        agent: &str,
        tool_groups: &[String],
        capabilities: &[String],
    ) -> Result<Option<CommitId>> {
        gate.check(&self.inner)?;
        let agent = agent.to_string();
        let (tool_groups, capabilities) = (string_set(tool_groups), string_set(capabilities));
        self.detached(move |inner| async move {
            let mut state = inner.state.lock().await;
            inner.recover_abandoned(&mut state).await?;
            validate_name(&agent)?;
            let [tool_groups_path, capabilities_path] = permission_paths(&agent);
            let files = vec![
                FileWrite { path: tool_groups_path, bytes: Some(tool_groups) },
                FileWrite { path: capabilities_path, bytes: Some(capabilities) },
            ];
            let subject = format!("meta: permissions of {agent}");
            inner.commit(&mut state, files, Message::new(Op::Permissions, subject, [agent.clone()])).await
        })
        .await
    }

    /// The input `agent` is pinned to in the committed lock; `"hive"` gives the hive
    /// input. A prepared deploy's rev shows only once finalized.
    pub async fn locked(&self, agent: &str) -> Option<Locked> {
        let state = self.inner.state.lock().await;
        let input = if agent == HIVE { HIVE.to_string() } else { agent_input(agent) };
        state.lock.inputs.get(&input).map(Locked::of)
    }

    /// Every agent the committed lock pins, with its input, sorted by name: one look at
    /// the lock, where asking [`Meta::locked`] of each stored agent looks once per agent.
    pub async fn locked_agents(&self) -> Vec<(String, Locked)> {
        let state = self.inner.state.lock().await;
        state.lock.agents().map(|(name, node)| (name.to_string(), Locked::of(node))).collect()
    }

    /// Whether the committed permission files of `agent` hold exactly these tool groups
    /// and capabilities (as sets; absent files hold none). Lets the Agent controller tell
    /// a permissions change (the perm-change shape) from any other rebuild.
    pub async fn permissions_match(
        &self,
        agent: &str,
        tool_groups: &[String],
        capabilities: &[String],
    ) -> bool {
        if validate_name(agent).is_err() {
            return false;
        }
        let _state = self.inner.state.lock().await;
        let [tool_groups_path, capabilities_path] = permission_paths(agent);
        let matches = |path: &str, wanted: &[String]| match std::fs::read(self.inner.dir.join(path)) {
            Ok(bytes) => bytes == string_set(wanted),
            Err(_) => wanted.is_empty(),
        };
        matches(&tool_groups_path, tool_groups) && matches(&capabilities_path, capabilities)
    }

    /// The hive input's committed rev.
    pub async fn hive_rev(&self) -> String {
        let state = self.inner.state.lock().await;
        state.lock.hive().map(|node| node.rev.clone()).unwrap_or_default()
    }

    /// The commit `HEAD` names.
    pub async fn head(&self) -> Result<CommitId> {
        let _state = self.inner.state.lock().await;
        match self.inner.git.head().await? {
            Some(sha) => Ok(CommitId(sha)),
            None => Err(Error::Output { command: "git rev-parse HEAD".into(), reason: "no commit".into() }),
        }
    }

    /// Runs `operation` as its own task, so a caller that stops waiting (a cancelled
    /// scheduler node) cannot interrupt it between writing a file and committing it.
    async fn detached<T, F, Fut>(&self, operation: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Inner>) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        tokio::spawn(operation(self.inner.clone()))
            .await
            .map_err(|join| Error::Interrupted { reason: join.to_string() })?
    }
}

/// Refuses a name that is not a DNS-1123 label: callers validate too, but a name here
/// becomes a directory (`agents/<name>`), a flake attribute and a log search pattern.
fn validate_name(name: &str) -> Result<()> {
    let refuse = |reason| Err(Error::InvalidName { name: name.to_string(), reason });
    if name.is_empty() || name.len() > 63 {
        return refuse("must be 1 to 63 characters");
    }
    if name.contains('/') || name.contains("..") {
        return refuse("must not contain '/' or '..'");
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return refuse("must hold only lowercase letters, digits and '-'");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return refuse("must start and end with a letter or digit");
    }
    Ok(())
}

/// Refuses a rev the lock cannot hold as one token.
fn validate_rev(input: &str, rev: &str) -> Result<()> {
    if rev.is_empty() || rev.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::InvalidRev { input: input.to_string(), rev: rev.to_string() });
    }
    Ok(())
}

/// The first 12 characters of a rev, for commit subjects.
fn short(rev: &str) -> &str {
    rev.char_indices().nth(12).map_or(rev, |(at, _)| &rev[..at])
}

/// `flake.lock` as `lock` renders it.
fn lock_file(lock: &Lock) -> FileWrite {
    FileWrite { path: FLAKE_LOCK.into(), bytes: Some(lock.render()) }
}

/// What a lock change from `before` to `after` rewrites: `flake.lock`, and `flake.nix`
/// too when an input's source moved (the hive input following `--hive-flake`).
fn files_for(before: &Lock, after: &Lock) -> Vec<FileWrite> {
    let moved = after
        .inputs
        .iter()
        .any(|(name, node)| before.inputs.get(name).is_some_and(|b| b.source != node.source));
    if moved {
        lock_files(after)
    } else {
        vec![lock_file(after)]
    }
}

/// `flake.nix` and `flake.lock` as `lock` renders them.
fn lock_files(lock: &Lock) -> Vec<FileWrite> {
    let nix = FileWrite { path: FLAKE_NIX.into(), bytes: Some(render::flake_nix(lock).into_bytes()) };
    vec![nix, lock_file(lock)]
}

/// An agent's permission files, relative to the repo.
fn permission_paths(agent: &str) -> [String; 2] {
    [format!("{AGENTS_DIR}/{agent}/{TOOL_GROUPS}"), format!("{AGENTS_DIR}/{agent}/{CAPABILITIES}")]
}

/// A JSON array of the sorted, de-duplicated `items`: pretty, with a trailing newline.
fn string_set(items: &[String]) -> Vec<u8> {
    let set: BTreeSet<&String> = items.iter().collect();
    let mut bytes = serde_json::to_vec_pretty(&set).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// The agents a lock change concerns: those named, or every agent when hive is.
fn concerned(lock: &Lock, changed: &[String]) -> Vec<String> {
    if changed.iter().any(|name| name == HIVE) {
        return lock.agents().map(|(name, _)| name.to_string()).collect();
    }
    changed.to_vec()
}

/// A sync commit's subject and the agents it concerns.
fn sync_summary(before: &Lock, after: &Lock, gone: &BTreeSet<String>) -> (String, Vec<String>) {
    let before_agents: BTreeMap<&str, &Node> = before.agents().collect();
    let (mut added, mut relocked) = (Vec::new(), Vec::new());
    for (name, node) in after.agents() {
        match before_agents.get(name) {
            None => added.push(name.to_string()),
            Some(old) if *old != node => relocked.push(name.to_string()),
            Some(_) => {}
        }
    }
    let removed: Vec<String> = gone.iter().cloned().collect();
    let mut parts = Vec::new();
    for (verb, names) in [("add", &added), ("remove", &removed), ("relock", &relocked)] {
        if !names.is_empty() {
            parts.push(format!("{verb} {}", names.join(", ")));
        }
    }
    let mut agents: BTreeSet<String> = added.into_iter().chain(removed).chain(relocked).collect();
    if before.hive().map(|n| &n.source) != after.hive().map(|n| &n.source) {
        parts.push("hive url".into());
        agents.extend(after.agents().map(|(name, _)| name.to_string()));
    }
    let subject = if parts.is_empty() {
        "meta: sync agents".to_string()
    } else {
        format!("meta: sync agents: {}", parts.join("; "))
    };
    (subject, agents.into_iter().collect())
}

/// Parses the work tree's `flake.lock`; a missing or unreadable one is corrupt.
async fn read_lock(dir: &Path) -> Result<Lock> {
    let path = dir.join(FLAKE_LOCK);
    let bytes = tokio::fs::read(&path)
        .await
        .map_err(|e| Error::Corrupt { path: path.clone(), reason: format!("cannot read: {e}") })?;
    Lock::parse(&path, &bytes)
}

/// Puts `paths` back to their committed content in the index and the work tree (a path
/// `HEAD` does not hold is removed), and syncs them: git syncs the index, not the work
/// tree's files.
async fn restore_from_head(git: &Git, paths: &[String]) -> Result<()> {
    let mut args = vec!["ls-tree", "-r", "--name-only", "HEAD", "--"];
    args.extend(paths.iter().map(String::as_str));
    let listed = git.run(&args).await?;
    let tracked: BTreeSet<&str> = listed.lines().collect();
    let (committed, stray): (Vec<&String>, Vec<&String>) =
        paths.iter().partition(|path| tracked.contains(path.as_str()));
    if !committed.is_empty() {
        let mut args = vec!["checkout", "HEAD", "--"];
        args.extend(committed.iter().map(|path| path.as_str()));
        git.run(&args).await?;
    }
    let dir = git.git_dir().parent().map(Path::to_path_buf).unwrap_or_default();
    let (committed, stray): (Vec<PathBuf>, Vec<PathBuf>) = (
        committed.into_iter().map(|path| dir.join(path)).collect(),
        stray.into_iter().map(|path| dir.join(path)).collect(),
    );
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { action, path, source }
    };
    tokio::task::spawn_blocking(move || {
        for path in &stray {
            files::remove_blocking(path)?;
        }
        for path in &committed {
            crate::durable::sync_file(path).map_err(io("syncing", path))?;
            if let Some(parent) = path.parent() {
                crate::durable::sync_dir(parent).map_err(io("syncing", parent))?;
            }
        }
        Ok(())
    })
    .await
    .map_err(|join| Error::Interrupted { reason: join.to_string() })?
}

impl Inner {
    /// Closes a deploy window whose `PreparedDeploy` was dropped without finalize or
    /// abort (or whose finalize was cut short): `flake.lock` goes back to what `HEAD`
    /// holds, which prepare guaranteed was the file before the window opened.
    async fn recover_abandoned(&self, state: &mut State) -> Result<()> {
        let abandoned = state.pending.as_ref().is_some_and(|pending| pending.token.upgrade().is_none());
        if abandoned {
            tracing::warn!(dir = %self.dir.display(), "closing an abandoned deploy window");
            let lock = [FLAKE_LOCK.to_string()];
            if !self.git.changed(&lock).await?.is_empty() {
                restore_from_head(&self.git, &lock).await?;
            }
            state.lock = read_lock(&self.dir).await?;
            state.pending = None;
        }
        Ok(())
    }
}
