//! The meta repo after a power cut: git never leaves the state dir, whatever a cut left
//! of `.git`, and a torn repo is brought back to its last good commit.

use std::path::Path;
use std::process::Command;

use super::tests::{agent, git, rev};
use super::*;

fn config(dir: &Path) -> MetaConfig {
    MetaConfig {
        dir: dir.join(".hive/meta"),
        hive_url: "github:hive-dev/hive".into(),
        hive_rev: "hive-1".into(),
        journal: None,
    }
}

/// What an enclosing repository holds: its refs, its commits and its index, byte for byte.
fn snapshot(repo: &Path) -> (String, String, Vec<u8>) {
    let refs = git(repo, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let commits = git(repo, &["rev-list", "--all", "--count"]);
    (refs, commits, std::fs::read(repo.join(".git/index")).unwrap())
}

#[tokio::test]
async fn a_torn_meta_head_never_sends_git_to_an_enclosing_repo() {
    // The default state dir is `.hive` inside the operator's checkout.
    let tmp = tempfile::tempdir().unwrap();
    let checkout = tmp.path();
    git(checkout, &["init", "--quiet", "--initial-branch=trunk"]);
    std::fs::write(checkout.join("README"), "the operator's project\n").unwrap();
    let meta = Meta::open(config(checkout)).await.unwrap();
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap();
    drop((gate, meta));
    // A power cut empties the meta repo's HEAD; the operator then commits their whole
    // checkout, the state dir's files with it.
    let meta_git = checkout.join(".hive/meta/.git");
    std::fs::write(meta_git.join("HEAD"), "").unwrap();
    git(checkout, &["add", "--all"]);
    git(checkout, &["commit", "--quiet", "--message", "the operator's commit"]);
    let before = snapshot(checkout);

    // Whatever opening the torn repo does, and whatever the operations after it do, no
    // git command of hive's reaches the checkout's repository: none writes there, and no
    // answer of the meta repo (its head, its deploy trail) is one of the checkout's commits.
    let operators = git(checkout, &["rev-parse", "HEAD"]).trim().to_string();
    if let Ok(meta) = Meta::open(config(checkout)).await {
        let gate = meta.gate().await;
        let _ = meta.sync_agents(&gate, &[agent("a", Some(rev(2))), agent("b", Some(rev(1)))]).await;
        let _ = meta.write_permissions(&gate, "b", &["web".to_string()], &[]).await;
        let _ = meta.lock_update_hive(&gate, "hive-2").await;
        if let Ok(prepared) = meta.prepare_deploy(&gate, "a", &rev(3)).await {
            let _ = meta.finalize_deploy(&gate, prepared, "deploy a").await;
        }
        if let Ok(head) = meta.head().await {
            assert_ne!(head.0, operators, "the meta repo's HEAD is the checkout's");
        }
        for entry in meta.log(None, 100).await.unwrap_or_default() {
            assert_ne!(entry.commit, operators, "the deploy trail lists the checkout's commit");
        }
    }
    assert_eq!(snapshot(checkout), before, "hive's git commands changed the enclosing repository");
}

/// Every file and directory under `dir` (`.git` included) with what tells a change: inode,
/// size and modification time.
fn tree(dir: &Path) -> std::collections::BTreeMap<std::path::PathBuf, (u64, u64, i64, i64, bool)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
        out.insert(path, (meta.ino(), meta.len(), meta.mtime(), meta.mtime_nsec(), meta.is_dir()));
    }
    out
}

/// What an operation changed that a power cut could lose unless hive synced it: every
/// new or changed directory, and every new or changed file in `.git` but its objects
/// (git fsyncs those itself, `core.fsync`). A removed entry shows as its directory's change.
fn unsynced(
    before: &std::collections::BTreeMap<std::path::PathBuf, (u64, u64, i64, i64, bool)>,
    meta: &Path,
) -> Vec<String> {
    let synced = crate::durable::synced::take();
    let objects = meta.join(".git/objects");
    tree(meta)
        .into_iter()
        .filter(|(path, stat)| before.get(path) != Some(stat))
        .filter(|(path, stat)| stat.4 || (path.starts_with(meta.join(".git")) && !path.starts_with(&objects)))
        .filter(|(path, _)| !synced.contains(path))
        .map(|(path, _)| path.strip_prefix(meta).unwrap().display().to_string())
        .collect()
}

#[tokio::test]
async fn every_meta_operation_syncs_what_it_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".hive/meta");
    std::fs::create_dir_all(&dir).unwrap();
    crate::durable::synced::take();
    let mut before = tree(&dir);
    let meta = Meta::open(config(tmp.path())).await.unwrap();
    let mut problems = Vec::new();
    let mut check = |step: &str, before: &mut _| {
        let missed = unsynced(before, &dir);
        if !missed.is_empty() {
            problems.push(format!("{step}: {missed:?}"));
        }
        *before = tree(&dir);
    };
    check("open (init)", &mut before);
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1))), agent("b", Some(rev(1)))]).await.unwrap();
    check("sync_agents", &mut before);
    meta.write_permissions(&gate, "b", &["web".to_string()], &[]).await.unwrap();
    check("write_permissions", &mut before);
    meta.lock_update_hive(&gate, "hive-2").await.unwrap();
    check("lock_update_hive", &mut before);
    let prepared = meta.prepare_deploy(&gate, "a", &rev(2)).await.unwrap();
    meta.finalize_deploy(&gate, prepared, "deploy a").await.unwrap();
    check("prepare + finalize_deploy", &mut before);
    meta.sync_agents(&gate, &[agent("a", None)]).await.unwrap();
    check("sync_agents removing b", &mut before);
    assert!(problems.is_empty(), "changed and not synced:\n{}", problems.join("\n"));
}

/// `git <args>` in the meta repo, naming it explicitly.
fn meta_git(meta: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .env("GIT_DIR", meta.join(".git"))
        .env("GIT_WORK_TREE", meta)
        .current_dir(meta)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Removes the loose object `sha` of the meta repo.
fn remove_object(meta: &Path, sha: &str) {
    std::fs::remove_file(meta.join(".git/objects").join(&sha[..2]).join(&sha[2..])).unwrap();
}

/// A meta repo with three commits (init, sync of `a`, permissions of `b`), closed.
async fn three_commits(tmp: &tempfile::TempDir) -> (std::path::PathBuf, CommitId, CommitId) {
    let meta = Meta::open(config(tmp.path())).await.unwrap();
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1))), agent("b", Some(rev(1)))]).await.unwrap();
    let synced = meta.head().await.unwrap();
    meta.write_permissions(&gate, "b", &["web".to_string()], &[]).await.unwrap();
    let last = meta.head().await.unwrap();
    (meta.dir().to_path_buf(), synced, last)
}

#[tokio::test]
async fn empty_head_config_branch_and_index_are_put_back_at_the_last_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, _, last) = three_commits(&tmp).await;
    for file in ["HEAD", "config", "refs/heads/main", "index"] {
        std::fs::write(dir.join(".git").join(file), "").unwrap();
    }
    std::fs::write(dir.join(".git/packed-refs"), [0u8; 64]).unwrap();
    let meta = Meta::open(config(tmp.path())).await.unwrap();
    assert_eq!(meta.head().await.unwrap(), last);
    let repairs = meta.repairs().join("\n");
    for named in [".git/HEAD (empty)", ".git/config (empty)", "refs/heads/main", "packed-refs"] {
        assert!(repairs.contains(named), "{named} not in: {repairs}");
    }
    assert_eq!(meta_git(&dir, &["status", "--porcelain"]), "");
    assert_eq!(meta.locked("a").await.unwrap().rev, rev(1));
    assert!(meta.permissions_match("b", &["web".to_string()], &[]).await);
    let gate = meta.gate().await;
    assert!(meta.relock(&gate, "a", "/srv/agents/a", &rev(2)).await.unwrap().is_some());
    assert_eq!(meta.log(None, 10).await.unwrap().len(), 4);
    // A whole repo opens with nothing to repair.
    drop((gate, meta));
    assert!(Meta::open(config(tmp.path())).await.unwrap().repairs().is_empty());
}

#[tokio::test]
async fn a_last_commit_whose_objects_never_reached_the_disk_is_undone() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, synced, last) = three_commits(&tmp).await;
    // The permissions commit's own blob (`["web"]`) was lost; its ref survived.
    let blob = meta_git(&dir, &["rev-parse", &format!("{}:agents/b/tool-groups.json", last.0)]);
    remove_object(&dir, blob.trim());
    let meta = Meta::open(config(tmp.path())).await.unwrap();
    assert_eq!(meta.head().await.unwrap(), synced);
    let repairs = meta.repairs().join("\n");
    assert!(repairs.contains(&format!("from {last}")) && repairs.contains(&synced.0), "{repairs}");
    assert_eq!(meta_git(&dir, &["status", "--porcelain", "--untracked-files=all"]), "");
    assert!(!dir.join("agents/b/tool-groups.json").exists());
    assert!(meta.permissions_match("b", &[], &[]).await);
    let gate = meta.gate().await;
    assert!(meta.write_permissions(&gate, "b", &["web".to_string()], &[]).await.unwrap().is_some());
}

#[tokio::test]
async fn a_repo_torn_before_its_first_commit_is_made_again() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = Meta::open(config(tmp.path())).await.unwrap();
    let dir = meta.dir().to_path_buf();
    drop(meta);
    // Nothing `git init` and the first commit wrote reached the disk but the names.
    let mut stack = vec![dir.join(".git")];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else {
            std::fs::write(&path, "").unwrap();
        }
    }
    let meta = Meta::open(config(tmp.path())).await.unwrap();
    let log = meta.log(None, 10).await.unwrap();
    assert_eq!((log.len(), log[0].subject.as_str()), (1, "meta: init"));
    assert!(meta.repairs().join("\n").contains("initialized it again"), "{:?}", meta.repairs());
    assert_eq!(meta_git(&dir, &["status", "--porcelain"]), "");
}

#[tokio::test]
async fn history_that_was_acknowledged_and_is_gone_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, synced, _) = three_commits(&tmp).await;
    // Two steps are gone, not one: the sync commit, parent of the last, is lost.
    remove_object(&dir, &synced.0);
    let error = Meta::open(config(tmp.path())).await.unwrap_err();
    let path = dir.join(".git/refs/heads/main");
    assert!(matches!(&error, Error::Corrupt { path: p, .. } if *p == path), "{error:?}");
    assert!(error.to_string().contains("acknowledged"), "{error}");

    // A HEAD with content hive never writes is not a cut's doing either.
    let tmp = tempfile::tempdir().unwrap();
    let (dir, _, _) = three_commits(&tmp).await;
    std::fs::write(dir.join(".git/HEAD"), "ref: refs/heads/elsewhere\n").unwrap();
    let error = Meta::open(config(tmp.path())).await.unwrap_err();
    assert!(error.to_string().contains(&dir.join(".git/HEAD").display().to_string()), "{error}");
}
