//! The meta repo's rules, each against a real git repository in a temp dir: fused
//! path-limited commits, no-op means no commit, the deploy-window gate, two-phase deploy.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::*;

fn config(dir: &Path) -> MetaConfig {
    MetaConfig {
        dir: dir.join("meta"),
        hive_url: "github:hive-dev/hive".into(),
        hive_rev: "hive-1".into(),
        journal: None,
    }
}

/// A full-length fake sha.
pub(super) fn rev(n: u32) -> String {
    format!("{n:040x}")
}

pub(super) fn agent(name: &str, rev: Option<String>) -> AgentInput {
    AgentInput { name: name.into(), url: format!("/srv/agents/{name}"), rev }
}

/// `git <args>` in `dir` as a user would run it, independent of the module under test.
pub(super) fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=user", "-c", "user.email=user@localhost"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn commits(dir: &Path) -> usize {
    git(dir, &["rev-list", "--count", "HEAD"]).trim().parse().unwrap()
}

fn status(dir: &Path) -> String {
    git(dir, &["status", "--porcelain"])
}

fn files_of(dir: &Path, commit: &CommitId) -> Vec<String> {
    git(dir, &["show", "--name-only", "--format=", &commit.0]).lines().map(str::to_string).collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

async fn open(tmp: &tempfile::TempDir) -> Meta {
    Meta::open(config(tmp.path())).await.unwrap()
}

#[tokio::test]
async fn open_creates_the_repo_with_one_init_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let dir = meta.dir().to_path_buf();
    assert_eq!(commits(&dir), 1);
    assert_eq!(status(&dir), "");
    assert_eq!(files_of(&dir, &meta.head().await.unwrap()), ["flake.lock", "flake.nix"]);
    let hive = meta.locked("hive").await.unwrap();
    assert_eq!(hive, Locked { url: "github:hive-dev/hive".into(), rev: "hive-1".into() });
    assert_eq!(meta.hive_rev().await, "hive-1");
    let log = meta.log(None, 10).await.unwrap();
    assert_eq!((log.len(), log[0].op.as_str(), log[0].subject.as_str()), (1, "init", "meta: init"));
}

#[tokio::test]
async fn flake_lock_is_nix_lock_format_with_sorted_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap();
    let lock = std::fs::read_to_string(meta.dir().join("flake.lock")).unwrap();
    let expected = r#"{
  "nodes": {
    "agent-a": {
      "locked": {
        "rev": "0000000000000000000000000000000000000001",
        "type": "git",
        "url": "file:///srv/agents/a"
      },
      "original": {
        "type": "git",
        "url": "file:///srv/agents/a"
      }
    },
    "hive": {
      "locked": {
        "owner": "hive-dev",
        "repo": "hive",
        "rev": "hive-1",
        "type": "github"
      },
      "original": {
        "owner": "hive-dev",
        "repo": "hive",
        "type": "github"
      }
    },
    "root": {
      "inputs": {
        "agent-a": "agent-a",
        "hive": "hive"
      }
    }
  },
  "root": "root",
  "version": 7
}
"#;
    assert_eq!(lock, expected);
    let nix = std::fs::read_to_string(meta.dir().join("flake.nix")).unwrap();
    assert!(nix.contains(r#""agent-a".url = "git+file:/srv/agents/a";"#), "{nix}");
    assert!(
        nix.contains(r#""a" = hive.lib.agentSystem { name = "a"; config = inputs."agent-a"; };"#),
        "{nix}"
    );
    let locked = meta.locked("a").await.unwrap();
    assert_eq!(locked, Locked { url: "/srv/agents/a".into(), rev: rev(1) });
}

#[tokio::test]
async fn locked_agents_are_every_agent_input_as_locked_sees_it_sorted_without_hive() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    assert_eq!(meta.locked_agents().await, vec![], "a new lock pins only hive");
    let gate = meta.gate().await;
    let inputs = [agent("b", Some(rev(2))), agent("a-1", Some(rev(1))), agent("a", Some(rev(3)))];
    meta.sync_agents(&gate, &inputs).await.unwrap();
    let all = meta.locked_agents().await;
    let names: Vec<&str> = all.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["a", "a-1", "b"]);
    for (name, locked) in &all {
        assert_eq!(Some(locked), meta.locked(name).await.as_ref(), "{name}");
    }
}

/// Runs every mutating operation once, each changing something, and returns their
/// commits in order.
async fn every_operation(meta: &Meta) -> Vec<(&'static str, CommitId)> {
    let gate = meta.gate().await;
    let mut out = Vec::new();
    let sync = meta.sync_agents(&gate, &[agent("a", Some(rev(1))), agent("b", Some(rev(2)))]).await.unwrap();
    out.push(("sync", sync.unwrap()));
    let relock = meta.relock(&gate, "a", "https://example.com/a.git", &rev(3)).await.unwrap();
    out.push(("relock", relock.unwrap()));
    let bump = meta.lock_update(&gate, &[("b".into(), rev(4))]).await.unwrap();
    out.push(("lock-update", bump.commit.unwrap()));
    out.push(("hive-bump", meta.lock_update_hive(&gate, "hive-2").await.unwrap().unwrap()));
    let perms = meta.write_permissions(&gate, "a", &strings(&["shell"]), &strings(&["net"])).await.unwrap();
    out.push(("permissions", perms.unwrap()));
    let prepared = meta.prepare_deploy(&gate, "b", &rev(5)).await.unwrap();
    out.push(("deploy", meta.finalize_deploy(&gate, prepared, "deploy b").await.unwrap().commit));
    out
}

#[tokio::test]
async fn each_operation_is_exactly_one_commit_and_leaves_a_clean_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let dir = meta.dir().to_path_buf();
    let ops = every_operation(&meta).await;
    // One commit per op on top of init, in op order, and nothing left uncommitted.
    assert_eq!(commits(&dir), 1 + ops.len());
    assert_eq!(status(&dir), "");
    let log = meta.log(None, 100).await.unwrap();
    let logged: Vec<(&str, &str)> =
        log.iter().rev().skip(1).map(|e| (e.op.as_str(), e.commit.as_str())).collect();
    let expected: Vec<(&str, &str)> = ops.iter().map(|(op, c)| (*op, c.0.as_str())).collect();
    assert_eq!(logged, expected);
    assert_eq!(files_of(&dir, &ops[0].1), ["flake.lock", "flake.nix"]);
    assert_eq!(files_of(&dir, &ops[2].1), ["flake.lock"]);
    assert_eq!(files_of(&dir, &ops[4].1), ["agents/a/capabilities.json", "agents/a/tool-groups.json"]);
    assert_eq!(files_of(&dir, &ops[5].1), ["flake.lock"]);
    let perms = std::fs::read_to_string(dir.join("agents/a/tool-groups.json")).unwrap();
    assert_eq!(perms, "[\n  \"shell\"\n]\n");
}

#[tokio::test]
async fn unchanged_operations_make_no_commit_and_reopen_makes_none() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let dir = meta.dir().to_path_buf();
    every_operation(&meta).await;
    let before = commits(&dir);
    let gate = meta.gate().await;
    // The same set again, in another order and with revs left to the lock.
    let set = [agent("b", None), agent("a", Some(rev(3)))];
    let set = [AgentInput { url: "https://example.com/a.git".into(), ..set[1].clone() }, set[0].clone()];
    assert_eq!(meta.sync_agents(&gate, &set).await.unwrap(), None);
    assert_eq!(meta.relock(&gate, "a", "https://example.com/a.git", &rev(3)).await.unwrap(), None);
    let bump =
        meta.lock_update(&gate, &[("b".into(), rev(5)), ("hive".into(), "hive-2".into())]).await.unwrap();
    assert_eq!(bump, LockBump { commit: None, changed: vec![] });
    assert_eq!(meta.lock_update_hive(&gate, "hive-2").await.unwrap(), None);
    let (tool_groups, capabilities) = (strings(&["shell", "shell"]), strings(&["net"]));
    assert_eq!(meta.write_permissions(&gate, "a", &tool_groups, &capabilities).await.unwrap(), None);
    drop(gate);
    assert_eq!(commits(&dir), before);
    let reopened = Meta::open(config(tmp.path())).await.unwrap();
    assert_eq!(commits(&dir), before);
    assert_eq!(reopened.locked("b").await.unwrap().rev, rev(5));
    assert_eq!(reopened.hive_rev().await, "hive-2");
    let gate = reopened.gate().await;
    assert_eq!(reopened.sync_agents(&gate, &set).await.unwrap(), None);
    assert_eq!(commits(&dir), before);
    assert_eq!(status(&dir), "");
}

#[tokio::test]
async fn no_operation_sweeps_a_foreign_staged_file() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let dir = meta.dir().to_path_buf();
    std::fs::write(dir.join("notes.txt"), "someone else's work\n").unwrap();
    git(&dir, &["add", "notes.txt"]);
    let mut ops = every_operation(&meta).await;
    // Removing an agent with files is the one path that deletes.
    let gate = meta.gate().await;
    let removal = meta.sync_agents(&gate, &[agent("b", None)]).await.unwrap().unwrap();
    assert_eq!(
        files_of(&dir, &removal),
        ["agents/a/capabilities.json", "agents/a/tool-groups.json", "flake.lock", "flake.nix"]
    );
    ops.push(("sync", removal));
    let prepared = meta.prepare_deploy(&gate, "b", &rev(9)).await.unwrap();
    meta.abort_deploy(&gate, prepared).await.unwrap();
    for (op, commit) in &ops {
        assert!(!files_of(&dir, commit).contains(&"notes.txt".to_string()), "{op} swept notes.txt");
    }
    assert_eq!(status(&dir), "A  notes.txt\n");
    assert!(!dir.join("agents/a").exists());
}

#[tokio::test]
async fn the_gate_holds_across_prepare_and_finalize() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap();
    let order = Arc::new(StdMutex::new(Vec::new()));
    let head = meta.head().await.unwrap();
    let prepared = meta.prepare_deploy(&gate, "a", &rev(2)).await.unwrap();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let other = tokio::spawn({
        let (meta, order) = (meta.clone(), order.clone());
        async move {
            started_tx.send(()).unwrap();
            let gate = meta.gate().await;
            order.lock().unwrap().push("other took the gate");
            meta.write_permissions(&gate, "a", &strings(&["x"]), &[]).await.unwrap().unwrap()
        }
    });
    started_rx.await.unwrap();
    // Give the other task every chance to get in while the window is open.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!other.is_finished());
    assert_eq!(meta.head().await.unwrap(), head);
    let deployed = meta.finalize_deploy(&gate, prepared, "deploy a").await.unwrap();
    order.lock().unwrap().push("window closed");
    drop(gate);
    let permissions = other.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["window closed", "other took the gate"]);
    let log = meta.log(None, 2).await.unwrap();
    assert_eq!(
        [log[0].commit.as_str(), log[1].commit.as_str()],
        [permissions.0.as_str(), deployed.commit.0.as_str()]
    );
}

#[tokio::test]
async fn abort_restores_the_lock_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let dir = meta.dir().to_path_buf();
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap();
    let before = std::fs::read(dir.join("flake.lock")).unwrap();
    let head = meta.head().await.unwrap();
    let prepared = meta.prepare_deploy(&gate, "a", &rev(2)).await.unwrap();
    assert_ne!(std::fs::read(dir.join("flake.lock")).unwrap(), before);
    assert_eq!(status(&dir), " M flake.lock\n");
    // The committed lock is what readers see until the deploy is finalized.
    assert_eq!(meta.locked("a").await.unwrap().rev, rev(1));
    meta.abort_deploy(&gate, prepared).await.unwrap();
    assert_eq!(std::fs::read(dir.join("flake.lock")).unwrap(), before);
    assert_eq!(meta.head().await.unwrap(), head);
    assert_eq!(status(&dir), "");
    assert_eq!(meta.locked("a").await.unwrap().rev, rev(1));
}

#[tokio::test]
async fn finalize_commits_and_tags_each_deploy() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let dir = meta.dir().to_path_buf();
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1))), agent("b", Some(rev(1)))]).await.unwrap();
    let mut tags = Vec::new();
    for (agent, n) in [("a", 2), ("b", 3), ("a", 4)] {
        let prepared = meta.prepare_deploy(&gate, agent, &rev(n)).await.unwrap();
        let deployed =
            meta.finalize_deploy(&gate, prepared, &format!("deploy {agent}\n\n#42 approved")).await;
        let deployed = deployed.unwrap();
        assert_eq!(meta.head().await.unwrap(), deployed.commit);
        assert_eq!(meta.locked(agent).await.unwrap().rev, rev(n));
        tags.push(deployed.tag);
    }
    assert_eq!(tags, ["deploy/a/1", "deploy/b/1", "deploy/a/2"]);
    assert_eq!(git(&dir, &["rev-list", "-n1", "deploy/a/2"]).trim(), meta.head().await.unwrap().0);
    let newest = &meta.log(None, 1).await.unwrap()[0];
    assert_eq!((newest.op.as_str(), newest.agents.as_slice()), ("deploy", &["a".to_string()][..]));
    assert_eq!((newest.subject.as_str(), newest.body.as_str()), ("deploy a", "#42 approved"));
    assert_eq!(newest.tags, ["deploy/a/2"]);
    // Re-deploying the locked rev is still a deploy on record: a commit with no files.
    let prepared = meta.prepare_deploy(&gate, "a", &rev(4)).await.unwrap();
    let again = meta.finalize_deploy(&gate, prepared, "redeploy a").await.unwrap();
    assert_eq!((files_of(&dir, &again.commit).len(), again.tag.as_str()), (0, "deploy/a/3"));
    assert_eq!(status(&dir), "");
}

#[tokio::test]
async fn lock_update_reports_exactly_the_changed_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let dir = meta.dir().to_path_buf();
    let gate = meta.gate().await;
    let set = [agent("a", Some(rev(1))), agent("b", Some(rev(1))), agent("c", Some(rev(1)))];
    meta.sync_agents(&gate, &set).await.unwrap();
    let updates = [("c", rev(2)), ("a", rev(1)), ("hive", "hive-2".into())];
    let updates: Vec<(String, String)> = updates.into_iter().map(|(n, r)| (n.to_string(), r)).collect();
    let bump = meta.lock_update(&gate, &updates).await.unwrap();
    assert_eq!(bump.changed, ["c", "hive"]);
    assert_eq!(files_of(&dir, bump.commit.as_ref().unwrap()), ["flake.lock"]);
    // A hive bump concerns every agent.
    let entry = &meta.log(None, 1).await.unwrap()[0];
    assert_eq!((entry.op.as_str(), entry.agents.clone()), ("lock-update", strings(&["a", "b", "c"])));
    let before = commits(&dir);
    let unknown = meta.lock_update(&gate, &[("b".into(), rev(7)), ("zz".into(), rev(7))]).await;
    assert!(matches!(unknown, Err(Error::UnknownInput { name }) if name == "zz"));
    assert_eq!(commits(&dir), before);
    assert_eq!(meta.locked("b").await.unwrap().rev, rev(1));
}

#[tokio::test]
async fn log_of_an_agent_lists_only_its_commits_newest_first() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1))), agent("ab", Some(rev(1)))]).await.unwrap();
    meta.write_permissions(&gate, "ab", &strings(&["x"]), &[]).await.unwrap();
    meta.write_permissions(&gate, "a", &strings(&["x"]), &[]).await.unwrap();
    meta.relock(&gate, "ab", "/srv/agents/ab", &rev(2)).await.unwrap();
    let prepared = meta.prepare_deploy(&gate, "a", &rev(3)).await.unwrap();
    meta.finalize_deploy(&gate, prepared, "deploy a").await.unwrap();
    meta.lock_update_hive(&gate, "hive-2").await.unwrap();
    let log = meta.log(Some("a"), 10).await.unwrap();
    let ops: Vec<&str> = log.iter().map(|e| e.op.as_str()).collect();
    assert_eq!(ops, ["hive-bump", "deploy", "permissions", "sync"]);
    assert!(log.iter().all(|e| e.agents.contains(&"a".to_string())));
    assert!(log.windows(2).all(|w| w[0].time >= w[1].time));
    assert_eq!(log[1].tags, ["deploy/a/1"]);
    assert!(log[2].tags.is_empty());
    assert_eq!(meta.log(Some("a"), 2).await.unwrap().len(), 2);
    assert_eq!(meta.log(Some("ab"), 10).await.unwrap().len(), 4);
    assert_eq!(meta.log(None, 100).await.unwrap().len(), 7);
}

#[tokio::test]
async fn a_corrupt_flake_lock_on_open_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let path = meta.dir().join("flake.lock");
    drop(meta);
    std::fs::write(&path, "{ not json").unwrap();
    let error = Meta::open(config(tmp.path())).await.unwrap_err();
    assert!(matches!(&error, Error::Corrupt { path: p, .. } if *p == path), "{error:?}");
    assert!(error.to_string().contains(&path.display().to_string()), "{error}");
}

#[tokio::test]
async fn a_gate_from_another_meta_is_refused() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (meta, other) = (open(&one).await, open(&two).await);
    let foreign = other.gate().await;
    fn refused<T>(result: Result<T>) -> bool {
        matches!(result, Err(Error::ForeignGate))
    }
    assert!(refused(meta.sync_agents(&foreign, &[agent("a", Some(rev(1)))]).await));
    assert!(refused(meta.relock(&foreign, "a", "/srv/a", &rev(1)).await));
    assert!(refused(meta.lock_update(&foreign, &[]).await));
    assert!(refused(meta.lock_update_hive(&foreign, "h").await));
    assert!(refused(meta.write_permissions(&foreign, "a", &[], &[]).await));
    assert!(refused(meta.prepare_deploy(&foreign, "a", &rev(1)).await));
    assert_eq!(commits(meta.dir()), 1);
    // Its own gate is still free: nothing was taken by the refusals.
    let gate = meta.gate().await;
    assert!(meta.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap().is_some());
}

#[tokio::test]
async fn a_deploy_window_refuses_other_lock_changes_and_a_second_prepare() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1))), agent("b", Some(rev(1)))]).await.unwrap();
    let prepared = meta.prepare_deploy(&gate, "a", &rev(2)).await.unwrap();
    fn pending<T>(result: Result<T>) -> bool {
        matches!(result, Err(Error::DeployPending { agent }) if agent == "a")
    }
    assert!(pending(meta.relock(&gate, "b", "/srv/agents/b", &rev(3)).await));
    assert!(pending(meta.lock_update_hive(&gate, "hive-2").await));
    assert!(pending(meta.prepare_deploy(&gate, "b", &rev(3)).await));
    // Permission files are not the lock; they may change inside the window.
    assert!(meta.write_permissions(&gate, "b", &strings(&["x"]), &[]).await.unwrap().is_some());
    let deployed = meta.finalize_deploy(&gate, prepared, "deploy a").await.unwrap();
    assert_eq!(files_of(meta.dir(), &deployed.commit), ["flake.lock"]);
}

#[tokio::test]
async fn a_dropped_prepared_deploy_is_aborted_by_the_next_mutation() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let dir = meta.dir().to_path_buf();
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap();
    let before = std::fs::read(dir.join("flake.lock")).unwrap();
    let _ = meta.prepare_deploy(&gate, "a", &rev(2)).await.unwrap();
    let commit = meta.relock(&gate, "a", "/srv/agents/a", &rev(3)).await.unwrap().unwrap();
    assert_eq!(files_of(&dir, &commit), ["flake.lock"]);
    assert_eq!(meta.locked("a").await.unwrap().rev, rev(3));
    assert_ne!(std::fs::read(dir.join("flake.lock")).unwrap(), before);
    assert_eq!(status(&dir), "");
}

#[tokio::test]
async fn reopen_closes_a_deploy_window_a_crash_left_open() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let dir = meta.dir().to_path_buf();
    let gate = meta.gate().await;
    meta.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap();
    let before = std::fs::read(dir.join("flake.lock")).unwrap();
    let prepared = meta.prepare_deploy(&gate, "a", &rev(2)).await.unwrap();
    std::mem::forget(prepared);
    drop((gate, meta));
    let count = commits(&dir);
    let meta = Meta::open(config(tmp.path())).await.unwrap();
    assert_eq!(std::fs::read(dir.join("flake.lock")).unwrap(), before);
    assert_eq!((commits(&dir), status(&dir)), (count, String::new()));
    assert_eq!(meta.locked("a").await.unwrap().rev, rev(1));
}

#[tokio::test]
async fn sync_needs_a_rev_for_a_new_agent_and_refuses_bad_names() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let gate = meta.gate().await;
    let unlocked = meta.sync_agents(&gate, &[agent("a", None)]).await;
    assert!(matches!(unlocked, Err(Error::Unlocked { name, .. }) if name == "a"));
    for name in ["../x", "a/b", "", "A", "-a"] {
        let result = meta.sync_agents(&gate, &[agent(name, Some(rev(1)))]).await;
        assert!(matches!(result, Err(Error::InvalidName { .. })), "{name:?}: {result:?}");
        let result = meta.write_permissions(&gate, name, &[], &[]).await;
        assert!(matches!(result, Err(Error::InvalidName { .. })), "{name:?}: {result:?}");
    }
    let twice = meta.sync_agents(&gate, &[agent("a", Some(rev(1))), agent("a", Some(rev(2)))]).await;
    assert!(matches!(twice, Err(Error::DuplicateAgent { name }) if name == "a"));
    assert_eq!(commits(meta.dir()), 1);
    assert_eq!(status(meta.dir()), "");
}

#[tokio::test]
async fn permission_files_of_an_agent_not_yet_locked_survive_a_sync() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let dir = meta.dir().to_path_buf();
    let gate = meta.gate().await;
    meta.write_permissions(&gate, "new", &strings(&["x"]), &[]).await.unwrap().unwrap();
    meta.sync_agents(&gate, &[agent("a", Some(rev(1)))]).await.unwrap().unwrap();
    assert!(dir.join("agents/new/tool-groups.json").exists());
    meta.sync_agents(&gate, &[agent("a", Some(rev(1))), agent("new", Some(rev(1)))]).await.unwrap();
    // Once in the set, leaving it removes them.
    let commit = meta.sync_agents(&gate, &[agent("a", None)]).await.unwrap().unwrap();
    assert!(files_of(&dir, &commit).contains(&"agents/new/tool-groups.json".to_string()));
    assert!(!dir.join("agents/new").exists());
    let entry = &meta.log(Some("new"), 1).await.unwrap()[0];
    assert_eq!((entry.op.as_str(), entry.subject.as_str()), ("sync", "meta: sync agents: remove new"));
    assert_eq!(status(&dir), "");
}

#[tokio::test]
async fn a_changed_hive_url_is_applied_by_the_next_sync_not_by_open() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let dir = meta.dir().to_path_buf();
    let set = [agent("a", Some(rev(1)))];
    meta.sync_agents(&meta.gate().await, &set).await.unwrap();
    drop(meta);
    let count = commits(&dir);
    let moved = MetaConfig { hive_url: "https://example.com/hive.git".into(), ..config(tmp.path()) };
    let meta = Meta::open(moved).await.unwrap();
    assert_eq!(commits(&dir), count);
    let commit = meta.sync_agents(&meta.gate().await, &set).await.unwrap().unwrap();
    assert_eq!(files_of(&dir, &commit), ["flake.lock", "flake.nix"]);
    let hive = meta.locked("hive").await.unwrap();
    assert_eq!(hive, Locked { url: "https://example.com/hive.git".into(), rev: "hive-1".into() });
    let nix = std::fs::read_to_string(dir.join("flake.nix")).unwrap();
    assert!(nix.contains(r#"hive.url = "git+https://example.com/hive.git";"#), "{nix}");
    // The hive input feeds every agent's system, so the commit concerns them all.
    assert_eq!(meta.log(Some("a"), 1).await.unwrap()[0].commit, commit.0);
}

#[tokio::test]
async fn permissions_match_compares_sets_with_the_committed_files() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = open(&tmp).await;
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(meta.permissions_match("a", &[], &[]).await, "no files: no permissions");
    assert!(!meta.permissions_match("a", &strings(&["web"]), &[]).await);
    let gate = meta.gate().await;
    meta.write_permissions(&gate, "a", &strings(&["web", "shell"]), &strings(&["net"])).await.unwrap();
    assert!(meta.permissions_match("a", &strings(&["shell", "web", "web"]), &strings(&["net"])).await);
    assert!(!meta.permissions_match("a", &strings(&["shell"]), &strings(&["net"])).await);
    assert!(!meta.permissions_match("../a", &[], &[]).await, "a bad name never matches");
}

#[tokio::test]
async fn a_hive_bump_moves_the_hive_input_to_the_configured_flake() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("meta");
    let meta = open(&tmp).await;
    let flake = || std::fs::read_to_string(dir.join(FLAKE_NIX)).unwrap();
    assert!(flake().contains("hive.url = \"github:hive-dev/hive\";"), "{}", flake());
    drop(meta);

    // The daemon restarts with another --hive-flake: opening commits nothing, the next
    // hive bump renders the new source into flake.nix and flake.lock in one commit.
    let moved = MetaConfig { hive_url: "/srv/hive".into(), ..config(tmp.path()) };
    let meta = Meta::open(moved.clone()).await.unwrap();
    let before = commits(&dir);
    assert!(flake().contains("github:hive-dev/hive"));
    let gate = meta.gate().await;
    assert!(meta.lock_update_hive(&gate, &rev(9)).await.unwrap().is_some());
    assert_eq!(commits(&dir), before + 1);
    assert!(flake().contains("hive.url = \"git+file:/srv/hive\";"), "{}", flake());
    let lock = std::fs::read_to_string(dir.join(FLAKE_LOCK)).unwrap();
    assert!(lock.contains("file:///srv/hive") && lock.contains(&rev(9)), "{lock}");
    assert_eq!(status(&dir), "", "nothing left uncommitted");

    // Through lock_update too, and an unchanged source rewrites only the lock.
    let back = MetaConfig { hive_url: "github:hive-dev/hive".into(), ..moved };
    drop(gate);
    drop(meta);
    let meta = Meta::open(back).await.unwrap();
    let gate = meta.gate().await;
    let bump = meta.lock_update(&gate, &[("hive".into(), rev(9))]).await.unwrap();
    assert_eq!(bump.changed, ["hive"], "the source moved, the rev did not");
    assert!(flake().contains("hive.url = \"github:hive-dev/hive\";"), "{}", flake());
    let bump = meta.lock_update(&gate, &[("hive".into(), rev(10))]).await.unwrap();
    let files = git(&dir, &["show", "--name-only", "--format=", &bump.commit.unwrap().0]);
    assert_eq!(files.trim(), FLAKE_LOCK);
}
