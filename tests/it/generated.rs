//! The checked-in generated files match what the code generates, and every example
//! manifest applies to a real server. `HIVE_UPDATE_GENERATED=1` rewrites the files.

use std::path::Path;

use crate::harness::{ok, Daemon};

fn check(path: &Path, want: &str, stale: &mut Vec<String>) {
    if std::env::var_os("HIVE_UPDATE_GENERATED").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, want).unwrap();
        return;
    }
    match std::fs::read_to_string(path) {
        Ok(have) if have == want => {}
        _ => stale.push(path.display().to_string()),
    }
}

#[test]
fn openapi_and_schemas_are_fresh() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stale = Vec::new();
    check(&root.join("openapi/hive.dev_v1.json"), &hive::cli::openapi::render(), &mut stale);
    for (file, text) in hive::cli::openapi::render_events() {
        check(&root.join("openapi").join(file), &text, &mut stale);
    }
    let schemas = hive::cli::schemas::render();
    for (name, text) in &schemas {
        check(&root.join("schemas").join(name), text, &mut stale);
    }
    let on_disk: Vec<String> = std::fs::read_dir(root.join("schemas"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    for name in on_disk {
        if !schemas.iter().any(|(n, _)| *n == name) {
            stale.push(format!("schemas/{name} (no longer generated)"));
        }
    }
    assert!(
        stale.is_empty(),
        "generated files are stale: {stale:?}\nregenerate with: HIVE_UPDATE_GENERATED=1 cargo nextest run -E 'test(openapi_and_schemas_are_fresh)'"
    );
}

#[test]
fn every_example_manifest_applies() {
    let d = Daemon::start();
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    let out = ok(d.hive(&["apply", "-f", manifests.to_str().unwrap()]));
    assert!(out.lines().count() >= 6, "one line per object:\n{out}");
    assert!(out.lines().all(|l| l.ends_with(" created")), "{out}");
    let again = ok(d.hive(&["apply", "-f", manifests.to_str().unwrap()]));
    assert!(again.lines().all(|l| l.ends_with(" unchanged")), "{again}");
    for kind in ["agents", "jobs", "approvals", "fleetcommands", "providers"] {
        let listed = ok(d.kubectl(&["get", kind, "-o", "name"]));
        assert!(!listed.trim().is_empty(), "no {kind} applied");
    }
}
