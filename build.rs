// A build script, not the daemon: it reads its own environment (the HIVE_GIT_REV /
// HIVE_FLAKE overrides a packager sets), which clippy.toml reserves to src/host/ inside hive.
#![allow(clippy::disallowed_methods)]

//! Records where this build's source came from, for the hive base flake the meta flake
//! consumes (`hive serve --hive-flake` / `--hive-rev` default to them):
//!
//! - `HIVE_GIT_REV`: the git commit the binary is built from — the `HIVE_GIT_REV`
//!   environment variable when the build sets it (a Nix build passes `self.rev`), else
//!   `git rev-parse HEAD` of the source checkout, else empty (then `hive serve` needs
//!   `--hive-rev`: a made-up revision would be locked and never fetchable).
//! - `HIVE_FLAKE`: the flake reference of this repository — the `HIVE_FLAKE` environment
//!   variable when set, else `git+file:<source dir>` when the source is a git checkout,
//!   else empty (then the daemon falls back to its documented upstream reference).

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=HIVE_GIT_REV");
    println!("cargo:rerun-if-env-changed=HIVE_FLAKE");
    // Read when the script runs, not when it was compiled: cargo reuses a compiled build
    // script for a checkout at another path (its hash leaves the path out), and the
    // path baked in then may no longer exist.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let dir = Path::new(&manifest_dir);
    let from_env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let checkout = git(dir, &["rev-parse", "--show-toplevel"]);
    // A new commit (or a checkout of another branch) changes the rev: rebuild then.
    for path in ["HEAD", "refs/heads", "packed-refs"] {
        if let Some(file) = git(dir, &["rev-parse", "--git-path", path]) {
            let file =
                if Path::new(&file).is_absolute() { file } else { dir.join(file).display().to_string() };
            if Path::new(&file).exists() {
                println!("cargo:rerun-if-changed={file}");
            }
        }
    }
    if let Some(head) = git(dir, &["symbolic-ref", "--quiet", "HEAD"]) {
        if let Some(file) = git(dir, &["rev-parse", "--git-path", &head]) {
            let file =
                if Path::new(&file).is_absolute() { file } else { dir.join(file).display().to_string() };
            println!("cargo:rerun-if-changed={file}");
        }
    }
    let rev = from_env("HIVE_GIT_REV")
        .or_else(|| git(dir, &["rev-parse", "--verify", "HEAD^{commit}"]))
        .filter(|rev| rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_default();
    let flake =
        from_env("HIVE_FLAKE").or_else(|| checkout.map(|top| format!("git+file:{top}"))).unwrap_or_default();
    println!("cargo:rustc-env=HIVE_GIT_REV={rev}");
    println!("cargo:rustc-env=HIVE_FLAKE={flake}");
}
