//! The meta repo after a power cut: git never leaves the state dir, whatever a cut left
//! of `.git`, and a torn repo is brought back to its last good commit.

use std::path::Path;
use std::process::Command;

use super::*;

fn config(dir: &Path) -> MetaConfig {
    MetaConfig {
        dir: dir.join(".hive/meta"),
        hive_url: "github:hive-dev/hive".into(),
        hive_rev: "hive-1".into(),
    }
}

/// A full-length fake sha.
fn rev(n: u32) -> String {
    format!("{n:040x}")
}

fn agent(name: &str, rev: Option<String>) -> AgentInput {
    AgentInput { name: name.into(), url: format!("/srv/agents/{name}"), rev }
}

/// `git <args>` in `dir` as a user would run it, independent of the module under test.
fn git(dir: &Path, args: &[&str]) -> String {
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
