//! The two-phase deploy: prepare writes an agent's new lock entry without committing,
//! so a build can use it; finalize commits it with the deploy message and tags it
//! `deploy/<agent>/<n>`; abort puts the previous bytes back. A failed deploy leaves no
//! orphan commit: finalize undoes its own commit when the tag cannot be made, or when
//! the journal does not record the two.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Weak};

use super::files::{put, read_optional, Message, Op};
use super::git::Git;
use super::lock::{agent_input, Lock};
use super::{short, validate_name, validate_rev, CommitId, Error, Gate, Meta, Result, FLAKE_LOCK};

/// A deploy whose lock entry is written but not committed. Finalize or abort it while
/// holding the same [`Gate`]; one dropped instead is aborted by the next mutation.
#[must_use = "a prepared deploy leaves flake.lock uncommitted until finalized or aborted"]
pub struct PreparedDeploy {
    agent: String,
    rev: String,
    previous: Vec<u8>,
    /// Identifies this deploy to the `Meta` that prepared it.
    token: Arc<()>,
}

impl PreparedDeploy {
    /// The agent being deployed.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The rev being deployed.
    pub fn rev(&self) -> &str {
        &self.rev
    }
}

impl fmt::Debug for PreparedDeploy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedDeploy").field("agent", &self.agent).field("rev", &self.rev).finish()
    }
}

/// A finalized deploy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployed {
    /// The commit of the new lock.
    pub commit: CommitId,
    /// The tag on it, `deploy/<agent>/<n>`.
    pub tag: String,
}

/// The `Meta`'s side of a prepared deploy.
pub(super) struct Pending {
    pub agent: String,
    /// Dead once the `PreparedDeploy` is gone.
    pub token: Weak<()>,
    /// The lock as it is once finalized.
    lock: Lock,
}

impl Pending {
    fn is(&self, prepared: &PreparedDeploy) -> bool {
        Weak::ptr_eq(&self.token, &Arc::downgrade(&prepared.token))
    }
}

impl Meta {
    /// Writes `rev` as `agent`'s locked rev into `flake.lock` without committing and
    /// returns the deploy to finalize or abort. The lock must be clean, and only one
    /// deploy can be prepared at a time.
    pub async fn prepare_deploy(&self, gate: &Gate, agent: &str, rev: &str) -> Result<PreparedDeploy> {
        gate.check(&self.inner)?;
        let (agent, rev) = (agent.to_string(), rev.to_string());
        self.detached(move |inner| async move {
            let mut state = inner.state.lock().await;
            inner.recover_abandoned(&mut state).await?;
            state.refuse_pending()?;
            validate_name(&agent)?;
            let input = agent_input(&agent);
            validate_rev(&input, &rev)?;
            let path = inner.dir.join(FLAKE_LOCK);
            if !inner.git.changed(&[FLAKE_LOCK.to_string()]).await?.is_empty() {
                return Err(Error::Dirty { path });
            }
            let mut lock = state.lock.clone();
            let Some(node) = lock.inputs.get_mut(&input) else {
                return Err(Error::UnknownAgent { name: agent });
            };
            node.rev = rev.clone();
            let previous = read_optional(&path).await?.unwrap_or_default();
            if let Err(error) = put(&path, Some(&lock.render())).await {
                // The rename is atomic, so the old bytes are either still there or
                // need putting back; either way write them.
                let _ = put(&path, Some(&previous)).await;
                return Err(error);
            }
            let token = Arc::new(());
            state.pending = Some(Pending { agent: agent.clone(), token: Arc::downgrade(&token), lock });
            Ok(PreparedDeploy { agent, rev, previous, token })
        })
        .await
    }

    /// Commits the prepared lock with `message` (plus its `Hive-Agent` and
    /// `Hive-Op: deploy` trailers) and tags the commit `deploy/<agent>/<n>`, n one past
    /// the agent's highest deploy tag. Re-deploying the locked rev still records a
    /// (file-less) commit: the deploy happened. On failure the repo is as before prepare.
    pub async fn finalize_deploy(
        &self,
        gate: &Gate,
        prepared: PreparedDeploy,
        message: &str,
    ) -> Result<Deployed> {
        gate.check(&self.inner)?;
        let message = message.to_string();
        self.detached(move |inner| async move {
            let mut state = inner.state.lock().await;
            let pending = match &state.pending {
                Some(pending) if pending.is(&prepared) => pending,
                _ => return Err(Error::ForeignDeploy { agent: prepared.agent }),
            };
            let lock = pending.lock.clone();
            let git = &inner.git;
            let path = inner.dir.join(FLAKE_LOCK);
            let paths = [FLAKE_LOCK.to_string()];
            let text = if message.trim().is_empty() {
                format!("deploy {} at {}", prepared.agent, short(&prepared.rev))
            } else {
                message
            };
            let text = Message::new(Op::Deploy, text, [prepared.agent.clone()]).render();
            let before = git.head().await?;
            let sha = match git.commit(&paths, &text, true).await {
                Ok(sha) => sha,
                Err(error) => {
                    undo(git, &path, &prepared.previous).await;
                    state.pending = None;
                    return Err(error);
                }
            };
            let tag = match tag_deploy(&inner.git, &prepared.agent, &sha, &text).await {
                Ok(tag) => tag,
                Err(error) => {
                    // No untagged deploy commit stays behind: move the branch back.
                    if let Some(before) = before {
                        if let Err(reset) = git.run(&["update-ref", "HEAD", &before, &sha]).await {
                            tracing::warn!(error = %reset, "cannot undo an untagged deploy commit");
                        }
                    }
                    undo(git, &path, &prepared.previous).await;
                    state.pending = None;
                    return Err(error);
                }
            };
            if let Some(journal) = state.journal.as_mut() {
                // Refused: `record` undid the commit and its tag; the lock is as before.
                if let Err(error) =
                    journal.record(git, before.as_deref(), &sha, std::slice::from_ref(&tag)).await
                {
                    state.pending = None;
                    return Err(error);
                }
            }
            state.lock = lock;
            state.pending = None;
            Ok(Deployed { commit: CommitId(sha), tag })
        })
        .await
    }

    /// Puts `flake.lock` back to its bytes before prepare; no commit is made.
    pub async fn abort_deploy(&self, gate: &Gate, prepared: PreparedDeploy) -> Result<()> {
        gate.check(&self.inner)?;
        self.detached(move |inner| async move {
            let mut state = inner.state.lock().await;
            if !state.pending.as_ref().is_some_and(|pending| pending.is(&prepared)) {
                return Err(Error::ForeignDeploy { agent: prepared.agent });
            }
            put(&inner.dir.join(FLAKE_LOCK), Some(&prepared.previous)).await?;
            state.pending = None;
            Ok(())
        })
        .await
    }
}

/// Puts `flake.lock` back to `previous` in the work tree and the index after a failed
/// finalize. Best effort: the failure being undone is the error to report.
async fn undo(git: &Git, path: &Path, previous: &[u8]) {
    if let Err(error) = put(path, Some(previous)).await {
        tracing::warn!(%error, "cannot restore flake.lock after a failed deploy");
    }
    if let Err(error) = git.unstage(&[FLAKE_LOCK.to_string()]).await {
        tracing::warn!(%error, "cannot unstage flake.lock after a failed deploy");
    }
}

/// Tags `sha` as the agent's next deploy (annotated, carrying the deploy message) and
/// returns the tag's name.
async fn tag_deploy(git: &Git, agent: &str, sha: &str, message: &str) -> Result<String> {
    let prefix = format!("deploy/{agent}/");
    let pattern = format!("{prefix}*");
    let existing = git.run(&["tag", "--list", &pattern]).await?;
    let highest = existing
        .lines()
        .filter_map(|tag| tag.trim().strip_prefix(&prefix)?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    let tag = format!("{prefix}{}", highest + 1);
    git.run(&["tag", "--annotate", "--cleanup=whitespace", "--message", message, &tag, sha]).await?;
    Ok(tag)
}
