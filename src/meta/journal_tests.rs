//! The journal's guarantees against an in-memory journal and real git repositories: a
//! commit the journal refuses is undone and its operation fails; opening a repo with no
//! or an older history brings it to the journal's head with the same shas; commits the
//! journal never recorded leave the branch; two repos cannot both extend one head; an
//! empty journal is seeded with the local history. (The etcd journal's own guards are
//! tested in `daemon::meta_journal_tests`.)

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex as StdMutex;

use futures_util::future::BoxFuture;

use super::tests::{agent, git, rev};
use super::*;

/// A journal in memory; `refuse` makes every record fail, as a deposed leader's does;
/// `fold_every` and `largest`, when set, how often a record folds in those before it and
/// the largest bundle one holds; `reads` counts the calls of [`Journal::entries`].
#[derive(Debug, Default)]
struct Memory {
    entries: StdMutex<Vec<JournalEntry>>,
    reads: AtomicUsize,
    refuse: AtomicBool,
    fold_every: Option<u64>,
    largest: Option<usize>,
}

impl Memory {
    fn head_now(&self) -> Option<JournalHead> {
        let entries = self.entries.lock().unwrap();
        entries.last().map(|e| JournalHead {
            sequence: e.sequence,
            commit: e.commit.clone(),
            version: e.sequence,
        })
    }
}

impl Journal for Memory {
    fn head(&self) -> BoxFuture<'_, Result<Option<JournalHead>>> {
        Box::pin(std::future::ready(Ok(self.head_now())))
    }

    fn entries(&self, sequence: u64) -> BoxFuture<'_, Result<Vec<JournalEntry>>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let entries =
            self.entries.lock().unwrap().iter().filter(|e| e.sequence <= sequence).cloned().collect();
        Box::pin(std::future::ready(Ok(entries)))
    }

    fn record(&self, after: Option<JournalHead>, entry: JournalEntry) -> BoxFuture<'_, Result<JournalHead>> {
        let answer = if self.refuse.load(Ordering::SeqCst) {
            Err(Error::Journal { reason: "refused by the test".into() })
        } else if after != self.head_now() {
            Err(Error::Journal { reason: "its head moved".into() })
        } else {
            let head = JournalHead {
                sequence: entry.sequence,
                commit: entry.commit.clone(),
                version: entry.sequence,
            };
            let mut entries = self.entries.lock().unwrap();
            entries.retain(|kept| kept.sequence < entry.replaces);
            entries.push(entry);
            Ok(head)
        };
        Box::pin(std::future::ready(answer))
    }

    fn fold_every(&self) -> u64 {
        self.fold_every.unwrap_or(FOLD_EVERY)
    }

    fn largest_bundle(&self) -> usize {
        self.largest.unwrap_or(usize::MAX)
    }
}

fn config(dir: &Path, journal: &Arc<Memory>) -> MetaConfig {
    MetaConfig {
        dir: dir.join("meta"),
        hive_url: "github:hive-dev/hive".into(),
        hive_rev: "hive-1".into(),
        journal: Some(journal.clone() as Arc<dyn Journal>),
    }
}

async fn open(dir: &Path, journal: &Arc<Memory>) -> Meta {
    Meta::open(config(dir, journal)).await.unwrap()
}

/// The history as the audit trail shows it: (sha, subject, tags), newest first.
async fn history(meta: &Meta) -> Vec<(String, String, Vec<String>)> {
    let log = meta.log(None, 1000).await.unwrap();
    log.into_iter().map(|e| (e.commit, e.subject, e.tags)).collect()
}

/// What a repo holds that the trail does not show: HEAD, the lock file, the status.
fn snapshot(meta: &Meta) -> (String, Vec<u8>, String) {
    let dir = meta.dir();
    (
        git(dir, &["rev-parse", "HEAD"]),
        std::fs::read(dir.join("flake.lock")).unwrap(),
        git(dir, &["status", "--porcelain", "--untracked-files=all"]),
    )
}

async fn deploy(meta: &Meta, name: &str, at: String) -> Deployed {
    let gate = meta.gate().await;
    let prepared = meta.prepare_deploy(&gate, name, &at).await.unwrap();
    meta.finalize_deploy(&gate, prepared, &format!("deploy {name}")).await.unwrap()
}

#[tokio::test]
async fn a_commit_the_journal_refuses_is_undone_and_its_operation_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let journal = Arc::new(Memory::default());
    let meta = open(tmp.path(), &journal).await;
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap();
    assert_eq!(journal.head_now().map(|h| (h.sequence, h.commit)), Some((2, meta.head().await.unwrap().0)));
    let (before, trail) = (snapshot(&meta), history(&meta).await);

    journal.refuse.store(true, Ordering::SeqCst);
    let refused = meta.relock(&gate, "a", "/srv/agents/a", &rev(2)).await;
    assert!(matches!(refused, Err(Error::Journal { .. })), "{refused:?}");
    let refused = meta.write_permissions(&gate, "a", &["web".into()], &[]).await;
    assert!(matches!(refused, Err(Error::Journal { .. })), "{refused:?}");
    assert!(!meta.dir().join("agents/a").exists(), "the permission files went with their commit");
    drop(gate);
    let gate = meta.gate().await;
    let prepared = meta.prepare_deploy(&gate, "a", &rev(3)).await.unwrap();
    let refused = meta.finalize_deploy(&gate, prepared, "deploy a").await;
    assert!(matches!(refused, Err(Error::Journal { .. })), "{refused:?}");
    assert_eq!(git(meta.dir(), &["tag", "--list"]), "", "the deploy tag went with its commit");
    assert_eq!(snapshot(&meta), before, "the branch, the files and the index are as before");
    assert_eq!(history(&meta).await, trail);
    assert_eq!(meta.locked("a").await.map(|l| l.rev), Some(rev(1)));
    assert_eq!(journal.head_now().map(|h| h.sequence), Some(2));

    // Recording again: the same operations go through, each recorded.
    journal.refuse.store(false, Ordering::SeqCst);
    meta.relock(&gate, "a", "/srv/agents/a", &rev(2)).await.unwrap();
    drop(gate);
    let deployed = deploy(&meta, "a", rev(3)).await;
    assert_eq!(deployed.tag, "deploy/a/1");
    assert_eq!(journal.head_now().map(|h| (h.sequence, h.commit)), Some((4, deployed.commit.0)));
}

#[tokio::test]
async fn a_first_commit_the_journal_refuses_leaves_no_repo_history_and_the_next_open_makes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let journal = Arc::new(Memory::default());
    journal.refuse.store(true, Ordering::SeqCst);
    let refused = Meta::open(config(tmp.path(), &journal)).await;
    assert!(matches!(refused, Err(Error::Journal { .. })), "{refused:?}");
    let dir = tmp.path().join("meta");
    assert!(!dir.join("flake.lock").exists() && !dir.join("flake.nix").exists());
    assert!(!dir.join(".git").exists(), "no commit is left: the repo is as a first start finds it");

    journal.refuse.store(false, Ordering::SeqCst);
    let meta = open(tmp.path(), &journal).await;
    let trail = history(&meta).await;
    assert_eq!(trail.len(), 1);
    assert_eq!(journal.head_now().map(|h| h.commit), Some(trail[0].0.clone()));
}

#[tokio::test]
async fn opening_a_repo_with_no_or_an_older_history_brings_it_to_the_head_with_the_same_shas() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let journal = Arc::new(Memory::default());
    let leader = open(first.path(), &journal).await;
    let gate = leader.gate().await;
    leader.sync_agents(&gate, &[agent("a", Some(rev(1))), agent("b", Some(rev(1)))]).await.unwrap();
    leader.write_permissions(&gate, "a", &["web".into()], &["net".into()]).await.unwrap();
    drop(gate);
    deploy(&leader, "a", rev(2)).await;

    // A host that never held the repo.
    let other = open(second.path(), &journal).await;
    assert_eq!(history(&other).await, history(&leader).await);
    assert_eq!(snapshot(&other), snapshot(&leader));
    assert_eq!(other.locked("a").await, leader.locked("a").await);
    assert!(other.permissions_match("a", &["web".into()], &["net".into()]).await);
    drop(other);

    // The same host later, behind by a few commits.
    let gate = leader.gate().await;
    leader.relock(&gate, "b", "/srv/agents/b", &rev(3)).await.unwrap();
    drop(gate);
    deploy(&leader, "b", rev(4)).await;
    let other = open(second.path(), &journal).await;
    assert_eq!(history(&other).await, history(&leader).await);
    assert_eq!(snapshot(&other), snapshot(&leader));
    assert_eq!(other.locked("b").await.map(|l| l.rev), Some(rev(4)));

    // No fork: the repo that is behind the journal now cannot extend it.
    let gate = other.gate().await;
    other.relock(&gate, "b", "/srv/agents/b", &rev(5)).await.unwrap();
    let trail = history(&other).await;
    let gate = leader.gate().await;
    let stale = leader.relock(&gate, "a", "/srv/agents/a", &rev(6)).await;
    assert!(matches!(stale, Err(Error::Journal { .. })), "{stale:?}");
    assert_eq!(journal.head_now().map(|h| h.commit), Some(trail[0].0.clone()));
}

#[tokio::test]
async fn commits_and_tags_the_journal_never_recorded_leave_the_branch_and_are_kept_aside() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let journal = Arc::new(Memory::default());
    let leader = open(first.path(), &journal).await;
    let gate = leader.gate().await;
    leader.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap();
    drop(gate);
    deploy(&leader, "a", rev(2)).await;
    drop(open(second.path(), &journal).await);

    // A leadership on the second host that committed and died before recording: the
    // same repo opened without the journal stands for it.
    let unjournaled =
        Meta::open(MetaConfig { journal: None, ..config(second.path(), &journal) }).await.unwrap();
    let lost = deploy(&unjournaled, "a", rev(9)).await;
    assert_eq!(lost.tag, "deploy/a/2");
    drop(unjournaled);

    let other = open(second.path(), &journal).await;
    assert_eq!(history(&other).await, history(&leader).await);
    let dir = other.dir();
    let kept = format!("refs/hive/unrecorded/{}", lost.commit.0);
    assert_eq!(git(dir, &["rev-parse", &kept]).trim(), lost.commit.0);
    assert_eq!(git(dir, &["tag", "--list"]).trim(), "deploy/a/1");
    git(dir, &["rev-parse", "--verify", "refs/hive/unrecorded/tags/deploy/a/2"]);
    // The next deploy's number follows the journal's.
    assert_eq!(deploy(&other, "a", rev(3)).await.tag, "deploy/a/2");
}

#[tokio::test]
async fn an_empty_journal_is_seeded_with_the_local_history() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let journal = Arc::new(Memory::default());
    let alone = Meta::open(MetaConfig { journal: None, ..config(first.path(), &journal) }).await.unwrap();
    let gate = alone.gate().await;
    alone.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap();
    drop(gate);
    deploy(&alone, "a", rev(2)).await;
    let trail = history(&alone).await;
    drop(alone);

    let seeded = open(first.path(), &journal).await;
    assert_eq!(history(&seeded).await, trail, "seeding changes nothing locally");
    assert_eq!(journal.head_now().map(|h| (h.sequence, h.commit)), Some((1, trail[0].0.clone())));
    let other = open(second.path(), &journal).await;
    assert_eq!(history(&other).await, trail, "the tags come along");
}

/// Deploys of one agent, each after a relock of it, from `round` on: their tags.
async fn deploy_rounds(leader: &Meta, rounds: std::ops::RangeInclusive<u32>) -> Vec<String> {
    let mut tags = Vec::new();
    for round in rounds {
        let gate = leader.gate().await;
        leader.relock(&gate, "a", "/srv/agents/a", &rev(round * 2)).await.unwrap();
        drop(gate);
        tags.push(deploy(leader, "a", rev(round * 2 + 1)).await.tag);
    }
    tags
}

/// Repos at `dirs` (new, or left behind) opened on `journal` come to `leader`'s head, with
/// the same shas, files and deploy tags.
async fn all_come_to_the_head(leader: &Meta, journal: &Arc<Memory>, dirs: &[&Path]) {
    for dir in dirs {
        let other = open(dir, journal).await;
        assert_eq!(history(&other).await, history(leader).await);
        assert_eq!(snapshot(&other), snapshot(leader));
        assert_eq!(git(other.dir(), &["tag", "--list"]), git(leader.dir(), &["tag", "--list"]));
    }
}

/// Every few records one folds in the whole history and the journal drops the records
/// before it: it keeps fewer records than that, not one a commit forever, and a host that
/// never held the repo, or one left behind before the records it lacks were dropped, is
/// brought to the head from them with the same shas and tags.
#[tokio::test]
async fn a_record_every_few_folds_in_the_whole_history_and_repos_still_come_to_the_head() {
    let (first, second, third) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let journal = Arc::new(Memory { fold_every: Some(4), ..Memory::default() });
    let leader = open(first.path(), &journal).await;
    let gate = leader.gate().await;
    leader.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap();
    drop(gate);
    drop(open(third.path(), &journal).await);
    for round in 1..=5u32 {
        deploy_rounds(&leader, round..=round).await;
        let kept = journal.entries.lock().unwrap().len();
        assert!(kept <= 4, "round {round}: the journal keeps {kept} records");
    }
    let head = journal.head_now().unwrap();
    assert_eq!(head.commit, leader.head().await.unwrap().0);
    let entries = journal.entries.lock().unwrap().clone();
    assert!(head.sequence > 8, "{} records were made", head.sequence);
    assert!(entries[0].sequence > 1 && entries[0].replaces == 1, "{entries:?}");
    assert!(entries[1..].iter().all(|e| e.replaces == e.sequence), "{entries:?}");
    assert_eq!(git(leader.dir(), &["tag", "--list"]).lines().count(), 5);
    all_come_to_the_head(&leader, &journal, &[second.path(), third.path()]).await;
}

/// Once the whole history is larger than a record holds, each fold takes in the records
/// since the last one: the journal keeps one record a few, each replica still comes to
/// the head, and the leader, which wrote the record each fold starts from, reads none of
/// the records kept (their bundles) to find it.
#[tokio::test]
async fn once_the_history_outgrows_a_record_each_fold_takes_the_records_since_the_last() {
    let (first, second, third) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // A record holds about five commits' bundle, far less than the history below.
    let journal = Arc::new(Memory { fold_every: Some(4), largest: Some(4000), ..Memory::default() });
    let leader = open(first.path(), &journal).await;
    let gate = leader.gate().await;
    leader.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap();
    drop(gate);
    drop(open(third.path(), &journal).await);
    journal.reads.store(0, Ordering::SeqCst);
    deploy_rounds(&leader, 1..=12).await;
    assert_eq!(journal.reads.load(Ordering::SeqCst), 0, "the leader's folds read the kept records");

    let head = journal.head_now().unwrap();
    let entries = journal.entries.lock().unwrap().clone();
    let folds: Vec<_> = entries.iter().filter(|e| e.replaces < e.sequence).collect();
    assert!(folds.len() >= 4, "{entries:?}");
    assert!(folds.iter().all(|e| e.bundle.len() <= 4000), "{entries:?}");
    // The whole history fitted a record at first (the first kept folds it in), then no more.
    assert_eq!(entries[0].replaces, 1, "{entries:?}");
    assert!(folds[1..].iter().all(|e| e.replaces > 1), "{entries:?}");
    assert!(entries.len() as u64 <= head.sequence / 2, "{} records kept of {}", entries.len(), head.sequence);
    for pair in entries.windows(2) {
        assert_eq!(pair[1].replaces, pair[0].sequence + 1, "each record follows the one kept before it");
    }
    all_come_to_the_head(&leader, &journal, &[second.path(), third.path()]).await;

    // A replica that comes to lead did not write the record its first fold starts from:
    // that fold reads the kept records, the next does not; the records still follow.
    drop(leader);
    let next = open(second.path(), &journal).await;
    journal.reads.store(0, Ordering::SeqCst);
    deploy_rounds(&next, 13..=16).await;
    assert_eq!(journal.reads.load(Ordering::SeqCst), 1, "only the new leader's first fold reads");
    let entries = journal.entries.lock().unwrap().clone();
    for pair in entries.windows(2) {
        assert_eq!(pair[1].replaces, pair[0].sequence + 1, "each record follows the one kept before it");
    }
    all_come_to_the_head(&next, &journal, &[first.path(), third.path()]).await;
}
