//! Test fixtures shared by the tests that run real agents in-process (the process
//! runtime's and the executor's): git with a fixed identity, and a config repository
//! whose commits `v1` and `v2` hold a `run.sh`.

use std::path::{Path, PathBuf};

/// Runs `git <args>` in `dir` with a fixed identity; panics with its stderr on failure.
/// Returns its trimmed stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=hive", "-c", "user.email=hive@example.com", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `<dir>/config`: a repository with commits tagged `v1` and `v2`, each a `run.sh` that is
/// `run_sh` with `VERSION` replaced by the tag.
pub fn config_repo(dir: &Path, run_sh: &str) -> PathBuf {
    let repo = dir.join("config");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "--quiet", "-b", "main"]);
    for version in ["v1", "v2"] {
        std::fs::write(repo.join("run.sh"), run_sh.replace("VERSION", version)).unwrap();
        git(&repo, &["add", "run.sh"]);
        git(&repo, &["commit", "--quiet", "-m", version]);
        git(&repo, &["tag", version]);
    }
    repo
}
