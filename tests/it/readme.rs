//! README's tour works as written: every command of its shell blocks runs, unchanged,
//! against a fresh `hive serve` started as README says (from the repository root, the
//! Agent controller on), from a directory holding `.hive` (the state directory) and
//! `manifests/`, with `hive` the binary under test in place of README's `cargo run`
//! alias. A command README names that fails, or an object it names that no manifest
//! defines, fails this test.

use std::path::Path;
use std::process::Command;

use crate::harness::{eventually, hive_bin, Daemon};

/// The lines of the first ```sh block after the heading `heading`, with `\`
/// continuations joined.
fn shell_block(readme: &str, heading: &str) -> Vec<String> {
    let start = readme.find(heading).unwrap_or_else(|| panic!("README has no heading {heading:?}"));
    let rest = &readme[start..];
    let open = rest.find("```sh\n").expect("a ```sh block after the heading") + "```sh\n".len();
    let close = rest[open..].find("```").expect("the block closes");
    let mut lines = Vec::new();
    let mut pending = String::new();
    for line in rest[open..open + close].lines() {
        match line.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(line);
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    lines
}

/// A command line without its trailing `# comment` (a `#` after two spaces; README
/// aligns its comments that way, and no command holds one).
fn without_comment(line: &str) -> &str {
    match line.find("  #") {
        Some(at) => line[..at].trim_end(),
        None => line.trim_end(),
    }
}

/// Whether a README command follows or watches forever (or is sent to the
/// background): it runs for a few seconds, and being stopped then is success.
fn runs_forever(command: &str) -> bool {
    let words: Vec<&str> = command.split_whitespace().collect();
    command.ends_with('&')
        || words.contains(&"-w")
        || words.contains(&"--watch")
        || (words.contains(&"logs") && (words.contains(&"-f") || words.contains(&"--follow")))
}

/// Runs `block`'s commands in order in `workdir`, with `.bin/hive` on `PATH` in place of
/// README's `cargo run` alias; the first failure fails the test with the command and
/// what it printed.
fn run_block(workdir: &Path, block: &[String]) {
    // `export NAME=VALUE` lines hold for the rest of the block, as in one shell.
    let mut exported: Vec<(String, String)> = Vec::new();
    for line in block {
        let command = without_comment(line);
        if command.is_empty() || command.starts_with('#') || command.starts_with("alias hive=") {
            continue;
        }
        if let Some((name, value)) = command.strip_prefix("export ").and_then(|a| a.split_once('=')) {
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {value}"))
                .current_dir(workdir)
                .output()
                .expect("run sh");
            exported.push((name.to_string(), String::from_utf8_lossy(&out.stdout).into_owned()));
            continue;
        }
        let script = if runs_forever(command) {
            let command = command.trim_end_matches('&').trim_end().replace('\'', "'\\''");
            format!("timeout 3 sh -c '{command}'; rc=$?; [ $rc -eq 124 ] || exit $rc")
        } else {
            command.to_string()
        };
        let path =
            format!("{}:{}", workdir.join(".bin").display(), std::env::var("PATH").unwrap_or_default());
        let out = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .current_dir(workdir)
            .env("PATH", path)
            .env_remove("HIVE_KUBECONFIG")
            .envs(exported.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("run sh");
        assert!(
            out.status.success(),
            "README command failed ({}):\n  {command}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A directory to run README's commands from: `.hive` is the daemon's state directory,
/// `manifests` the repository's, `.bin/hive` the binary under test.
fn workdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::os::unix::fs::symlink(root.join("manifests"), dir.path().join("manifests")).unwrap();
    std::fs::create_dir(dir.path().join(".bin")).unwrap();
    std::os::unix::fs::symlink(hive_bin(), dir.path().join(".bin/hive")).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn readme_tour_runs_as_written() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let work = workdir();
    // As README starts it: from the repository root (the example agents' `repo: .`),
    // on the embedded defaults — the Agent controller on.
    let d = Daemon::spawn(&work.path().join(".hive"), &["--agent-controller=true"]).expect("daemon starts");

    run_block(work.path(), &shell_block(&readme, "## A five-minute tour"));
    run_block(work.path(), &shell_block(&readme, "### Agents that run"));
    run_block(work.path(), &shell_block(&readme, "The same with stock kubectl"));

    // The crash the tour ends with is seen and the agent comes back.
    let api = d.client();
    eventually("hello to be Ready again after the tour's kill -9", || {
        let api = api.clone();
        async move {
            let agent = api.get("/apis/hive.dev/v1/agents/hello").await.body;
            let ready = agent["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            ready.then_some(())
        }
    })
    .await;
}
