//! The meta repo's journal: its history recorded beyond this host, so that whichever
//! replica leads (on etcd) works on the same commits with the same shas, and the deploy
//! audit trail neither forks nor vanishes in a failover.
//!
//! - Every commit is recorded before the operation that made it answers: a git bundle
//!   of what the journal's head lacks (the new commits and the deploy tags on them) and
//!   the new head, appended only on top of the head this repo last saw. A record the
//!   journal refuses (another writer extended that head, this replica no longer leads,
//!   the bundle is too large) or that fails is undone here — the tags removed, the branch
//!   moved back, the files restored — and the operation fails: nothing unrecorded is
//!   acknowledged.
//! - Opening the repo first brings it to the journal's head ([`Journaled::restore`]):
//!   the bundles it lacks are fetched and the branch moved to the head's commit. Local
//!   commits the journal never recorded (a leadership on this host that died between
//!   its commit and its record) leave the branch and are kept under
//!   `refs/hive/unrecorded/<sha>`, tags on them under `refs/hive/unrecorded/tags/`.
//!   An empty journal is seeded with the local history, as the shared token file is.
//!
//! [`Journal`] is only the storage: the daemon gives one on etcd; the embedded store
//! has none, and then nothing here runs.

use std::fmt;
use std::path::PathBuf;

use futures_util::future::BoxFuture;

use super::files::{commit_files, FileWrite, Message};
use super::git::Git;
use super::{CommitId, Error, Inner, Result, State};

/// The branch every meta commit lands on.
const BRANCH: &str = "refs/heads/main";
/// Where local commits the journal never recorded are kept (`<ref>/<sha>`).
const UNRECORDED: &str = "refs/hive/unrecorded";
/// Where a fetched bundle's branch lands while the repo is brought to the head.
const FETCHED: &str = "refs/hive/journal";

/// The journal's last record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalHead {
    /// How many records the journal holds (the first is 1).
    pub sequence: u64,
    /// The commit the branch is at once every record is applied.
    pub commit: String,
    /// The journal's own token of this head (etcd: its key's `mod_revision`); the next
    /// record is appended only while the head is still the one it names.
    pub version: u64,
}

/// One record: a git bundle of the commits of records `replaces..=sequence` (those after
/// record `replaces - 1`'s commit, up to `commit`), with the deploy tags on them.
#[derive(Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// Its place in the journal (the first is 1).
    pub sequence: u64,
    /// The commit the branch is at after it.
    pub commit: String,
    /// `git bundle create` of `<record replaces - 1's commit>..commit` (of the whole
    /// history when `replaces` is 1).
    pub bundle: Vec<u8>,
    /// The first record whose commits the bundle holds: `sequence` for a record of one
    /// commit's; lower for one that folds records `replaces..sequence` into it (the
    /// journal drops those), 1 for the whole history.
    pub replaces: u64,
}

impl fmt::Debug for JournalEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournalEntry")
            .field("sequence", &self.sequence)
            .field("commit", &self.commit)
            .field("bundle_bytes", &self.bundle.len())
            .field("replaces", &self.replaces)
            .finish()
    }
}

/// Where the meta repo's history is recorded. Failures are [`Error::Journal`].
pub trait Journal: Send + Sync + fmt::Debug {
    /// The head (`None`: nothing recorded yet), as of every record acknowledged before
    /// the call (a quorum read).
    fn head(&self) -> BoxFuture<'_, Result<Option<JournalHead>>>;

    /// Every entry it keeps up to `sequence`, in order: each one's `replaces` follows
    /// the one before it, and the first's is 1.
    fn entries(&self, sequence: u64) -> BoxFuture<'_, Result<Vec<JournalEntry>>>;

    /// Appends `entry` after `after` (`None`: as the first) and makes it the head, only
    /// if the head is still `after` and this writer may still write (a deposed leader may
    /// not); otherwise nothing changes and it is an error. The records `entry` folds in
    /// (`entry.replaces..entry.sequence`) are dropped in the same write. Returns the new
    /// head.
    fn record(&self, after: Option<JournalHead>, entry: JournalEntry) -> BoxFuture<'_, Result<JournalHead>>;

    /// The largest bundle one record holds: a fold whose bundle is larger is not written.
    fn largest_bundle(&self) -> usize {
        usize::MAX
    }

    /// Every how many records one folds in those before it (see [`FOLD_EVERY`]).
    fn fold_every(&self) -> u64 {
        FOLD_EVERY
    }
}

/// Every how many records one folds in those before it: the whole history when its
/// bundle fits one record, else the records since the last fold (or the first). The
/// journal then keeps fewer than this many records and one bundle of the history, or,
/// once the history outgrows a record, one record a hundred commits.
pub const FOLD_EVERY: u64 = 100;

/// A repo that is journaled: the journal and the head this repo is at.
pub(super) struct Journaled {
    journal: std::sync::Arc<dyn Journal>,
    head: Option<JournalHead>,
    /// Whether the whole history was found too large for one record: it only grows, so
    /// the folds after take the records since the last fold without trying it again.
    outgrown: bool,
    /// The last record this replica wrote at a fold point (a multiple of
    /// [`Journal::fold_every`]): the record the next fold takes the commits since, once
    /// the history outgrew a record — known without reading every record kept.
    fold_base: Option<JournalHead>,
}

impl Journaled {
    /// Brings the repo to the journal's head, or seeds an empty journal with the repo's
    /// history (see the module documentation).
    pub async fn restore(journal: std::sync::Arc<dyn Journal>, git: &Git) -> Result<Journaled> {
        let local = git.head().await?;
        let Some(head) = journal.head().await? else {
            let mut journaled = Journaled { journal, head: None, outgrown: false, fold_base: None };
            if let Some(local) = local {
                let tags = merged_tags(git, None).await?;
                journaled.append(git, &local, &tags).await?;
                tracing::info!(commit = %local, tags = tags.len(), "seeded the meta repo's journal with this replica's history");
            }
            return Ok(journaled);
        };
        if !has_commit(git, &head.commit).await? {
            let entries = journal.entries(head.sequence).await?;
            for entry in &entries {
                if !has_commit(git, &entry.commit).await? {
                    fetch(git, &entry.bundle).await.map_err(|e| {
                        journal_error(format!(
                            "cannot apply record {} (commit {}): {e}",
                            entry.sequence, entry.commit
                        ))
                    })?;
                }
            }
            git.run(&["update-ref", "-d", FETCHED]).await?;
            if !has_commit(git, &head.commit).await? {
                return Err(journal_error(format!(
                    "its head, record {} (commit {}), is in none of its {} records",
                    head.sequence,
                    head.commit,
                    entries.len()
                )));
            }
        }
        if local.as_deref() != Some(head.commit.as_str()) {
            if let Some(local) = &local {
                if !is_ancestor(git, local, &head.commit).await? {
                    let kept = format!("{UNRECORDED}/{local}");
                    git.run(&["update-ref", &kept, local]).await?;
                    tracing::warn!(commit = %local, kept, head = %head.commit,
                        "this host's meta repo had commits its journal never recorded (a leadership that ended before recording them): they leave the branch");
                }
            }
            git.run(&["reset", "--quiet", "--hard", &head.commit]).await?;
            tracing::info!(from = ?local, to = %head.commit, record = head.sequence, "brought the meta repo to its journal's head");
        }
        // Deploy tags on commits the branch does not hold are kept aside, so the next
        // deploy's number follows the journal's.
        let stray = git.run(&["tag", "--list", "--no-merged", BRANCH]).await?;
        for tag in stray.lines().map(str::trim).filter(|t| !t.is_empty()) {
            let from = format!("refs/tags/{tag}");
            let kept = format!("{UNRECORDED}/tags/{tag}");
            let object = git.run(&["rev-parse", "--verify", &from]).await?;
            git.run(&["update-ref", &kept, object.trim()]).await?;
            git.run(&["update-ref", "-d", &from]).await?;
            tracing::warn!(tag, kept, "a deploy tag the journal never recorded was kept aside");
        }
        Ok(Journaled { journal, head: Some(head), outgrown: false, fold_base: None })
    }

    /// Records commit `new`, made on top of `before` (`None`: the first commit), with
    /// the deploy `tags` on it. When the journal refuses or fails, the commit is undone
    /// and the journal's error returned.
    pub async fn record(
        &mut self,
        git: &Git,
        before: Option<&str>,
        new: &str,
        tags: &[String],
    ) -> Result<()> {
        match self.append(git, new, tags).await {
            Ok(()) => Ok(()),
            Err(error) => {
                tracing::warn!(%error, commit = new, "the meta repo's journal did not record a commit: undoing it");
                undo(git, before, new, tags).await;
                Err(error)
            }
        }
    }

    /// Appends the commits from the journal's head to `new` (the branch's tip); every
    /// [`Journal::fold_every`] records, folding in those before it (see [`FOLD_EVERY`]).
    async fn append(&mut self, git: &Git, new: &str, tags: &[String]) -> Result<()> {
        let Some(head) = self.head.clone() else {
            let bundle = bundle(git, None, tags).await?;
            let entry = JournalEntry { sequence: 1, commit: new.to_string(), bundle, replaces: 1 };
            self.head = Some(self.journal.record(None, entry).await?);
            return Ok(());
        };
        let sequence = head.sequence + 1;
        let every = self.journal.fold_every().max(2);
        let folded = match sequence % every {
            // A fold is a saving, not a duty: one that fails leaves an ordinary record.
            0 => self.fold(git, sequence, every).await.unwrap_or_else(|error| {
                tracing::warn!(%error, record = sequence, "cannot fold the meta repo's journal records: recording this commit alone");
                None
            }),
            _ => None,
        };
        let (bundle, replaces) = match folded {
            Some(folded) => folded,
            None => (bundle(git, Some(&head.commit), tags).await?, sequence),
        };
        let entry = JournalEntry { sequence, commit: new.to_string(), bundle, replaces };
        let written = self.journal.record(Some(head), entry).await?;
        if sequence % every == 0 {
            self.fold_base = Some(written.clone());
        }
        self.head = Some(written);
        Ok(())
    }

    /// The bundle and `replaces` of record `sequence` folding in those before it: the
    /// whole history, else the commits since the last record kept before this run of
    /// `every`; none when neither fits one record (it then holds its own commit).
    async fn fold(&mut self, git: &Git, sequence: u64, every: u64) -> Result<Option<(Vec<u8>, u64)>> {
        let largest = self.journal.largest_bundle();
        if !self.outgrown {
            let history = bundle(git, None, &merged_tags(git, None).await?).await?;
            if history.len() <= largest {
                return Ok(Some((history, 1)));
            }
            self.outgrown = true;
        }
        // Records are dropped only by folds, at multiples of `every`: the one `every`
        // back is kept, and when this replica wrote it, it knows its commit. Otherwise
        // (the first fold, or the first since this replica came to lead) the kept records
        // are read.
        let (since, commit) = match self.fold_base.clone().filter(|base| base.sequence + every == sequence) {
            Some(base) => (base.sequence, base.commit),
            None => {
                let kept = self.journal.entries(sequence - 1).await?;
                let last_run = kept.iter().rev().find(|entry| entry.sequence <= sequence - every);
                let Some(since) = last_run.or(kept.first()) else {
                    return Ok(None);
                };
                (since.sequence, since.commit.clone())
            }
        };
        let run = bundle(git, Some(&commit), &merged_tags(git, Some(&commit)).await?).await?;
        if run.len() <= largest {
            return Ok(Some((run, since + 1)));
        }
        tracing::warn!(
            record = sequence,
            bytes = run.len(),
            largest,
            "the meta repo's last commits are too large to fold into one journal record: the records stay"
        );
        Ok(None)
    }
}

impl Inner {
    /// [`commit_files`], and the journal's record of the commit it made (undone when the
    /// journal refuses it).
    pub(super) async fn commit(
        &self,
        state: &mut State,
        files: Vec<FileWrite>,
        message: Message,
    ) -> Result<Option<CommitId>> {
        let before = match &state.journal {
            Some(_) => self.git.head().await?,
            None => None,
        };
        let commit = commit_files(&self.git, &self.dir, files, message).await?;
        if let (Some(journaled), Some(commit)) = (state.journal.as_mut(), &commit) {
            journaled.record(&self.git, before.as_deref(), &commit.0, &[]).await?;
        }
        Ok(commit)
    }
}

/// An error of the journal's, or of applying what it holds.
pub(super) fn journal_error(reason: impl Into<String>) -> Error {
    Error::Journal { reason: reason.into() }
}

/// Where a bundle is written and read, inside `.git` (removed after use).
fn bundle_path(git: &Git) -> PathBuf {
    git.git_dir().join("hive-journal.bundle")
}

/// `git bundle create` of the branch and `tags`, without what `base` holds.
async fn bundle(git: &Git, base: Option<&str>, tags: &[String]) -> Result<Vec<u8>> {
    let path = bundle_path(git);
    let file = path.to_string_lossy().into_owned();
    let tags: Vec<String> = tags.iter().map(|tag| format!("refs/tags/{tag}")).collect();
    let exclude = base.map(|base| format!("^{base}"));
    let mut args = vec!["bundle", "create", "--quiet", file.as_str(), BRANCH];
    args.extend(tags.iter().map(String::as_str));
    args.extend(exclude.as_deref());
    git.run(&args).await?;
    let bytes = tokio::fs::read(&path).await.map_err(|source| Error::Io {
        action: "reading",
        path: path.clone(),
        source,
    })?;
    let _ = tokio::fs::remove_file(&path).await;
    Ok(bytes)
}

/// Fetches a bundle's commits and tags into the repo (its branch to [`FETCHED`]).
async fn fetch(git: &Git, bytes: &[u8]) -> Result<()> {
    let path = bundle_path(git);
    tokio::fs::write(&path, bytes).await.map_err(|source| Error::Io {
        action: "writing",
        path: path.clone(),
        source,
    })?;
    let file = path.to_string_lossy().into_owned();
    let branch = format!("+{BRANCH}:{FETCHED}");
    let fetched = git
        .run(&["fetch", "--quiet", "--no-write-fetch-head", &file, &branch, "+refs/tags/*:refs/tags/*"])
        .await;
    let _ = tokio::fs::remove_file(&path).await;
    fetched.map(drop)
}

/// Whether the repo holds commit `sha`.
async fn has_commit(git: &Git, sha: &str) -> Result<bool> {
    let object = format!("{sha}^{{commit}}");
    Ok(git.probe(&["cat-file", "-e", &object]).await?.success)
}

/// Whether `ancestor` is `descendant` or one of its ancestors.
async fn is_ancestor(git: &Git, ancestor: &str, descendant: &str) -> Result<bool> {
    Ok(git.probe(&["merge-base", "--is-ancestor", ancestor, descendant]).await?.success)
}

/// The tags on commits of the branch (what seeding records), or on those of its commits
/// after `since`.
async fn merged_tags(git: &Git, since: Option<&str>) -> Result<Vec<String>> {
    let mut args = vec!["tag", "--list", "--merged", BRANCH];
    args.extend(since.iter().flat_map(|since| ["--no-merged", since]));
    let out = git.run(&args).await?;
    Ok(out.lines().map(str::trim).filter(|t| !t.is_empty()).map(str::to_string).collect())
}

/// Undoes commit `new` (made on `before`) and its `tags`: the tags removed, the branch
/// moved back, the files it changed restored as `before` holds them. Best effort: the
/// journal's error is the one to report, so failures here are logged.
async fn undo(git: &Git, before: Option<&str>, new: &str, tags: &[String]) {
    let warn =
        |step: &str, error: Error| tracing::warn!(%error, step, "cannot undo an unrecorded meta commit");
    for tag in tags {
        if let Err(error) = git.run(&["update-ref", "-d", &format!("refs/tags/{tag}")]).await {
            warn("removing a tag", error);
        }
    }
    let changed = match before {
        Some(before) => git.run(&["diff-tree", "-r", "--name-only", "--no-commit-id", before, new]).await,
        None => git.run(&["ls-tree", "-r", "--name-only", new]).await,
    };
    let changed: Vec<String> = match changed {
        Ok(out) => out.lines().filter(|l| !l.is_empty()).map(str::to_string).collect(),
        Err(error) => return warn("listing its files", error),
    };
    match before {
        Some(before) => {
            if let Err(error) = git.run(&["update-ref", BRANCH, before, new]).await {
                return warn("moving the branch back", error);
            }
            if changed.is_empty() {
                return;
            }
            // The index first (a file `before` does not hold leaves it), then the files.
            if let Err(error) = git.unstage(&changed).await {
                warn("restoring the index", error);
            }
            if let Err(error) = super::restore_from_head(git, &changed).await {
                warn("restoring its files", error);
            }
        }
        None => {
            // The first commit: the repo goes back to what a first start finds, nothing
            // (as `repair` leaves a repo whose first commit was torn), so the next open
            // makes it again; HEAD's reflog must not name the undone commit.
            let git_dir = git.git_dir();
            let dir = git_dir.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
            let removed = tokio::task::spawn_blocking(move || {
                for path in &changed {
                    super::files::remove_blocking(&dir.join(path))?;
                }
                std::fs::remove_dir_all(&git_dir)
                    .and_then(|()| crate::durable::sync_dir(&dir))
                    .map_err(|source| Error::Io { action: "removing", path: git_dir.clone(), source })
            })
            .await;
            match removed {
                Ok(Ok(())) => {}
                Ok(Err(error)) => warn("removing the repo", error),
                Err(join) => warn("removing the repo", Error::Interrupted { reason: join.to_string() }),
            }
        }
    }
}
