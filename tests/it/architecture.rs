//! The architecture invariants ARCHITECTURE.md states about the source tree, checked on
//! the tree itself: no import cycle between files, `src/` holds folders (plus `lib.rs`
//! and `main.rs`), and no code outside tests and the server's patch machinery indexes a
//! JSON object by `["spec"]`, `["status"]` or `["metadata"]`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every non-test source file under `dir`, by its module path (`["server", "kinds"]`).
fn modules(root: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if path.is_dir() {
                if name != "tests" {
                    dirs.push(path);
                }
                continue;
            }
            if !name.ends_with(".rs")
                || name == "tests.rs"
                || name == "testing.rs"
                || name.ends_with("_tests.rs")
            {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut module: Vec<String> = rel.iter().map(|c| c.to_string_lossy().to_string()).collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                module.pop();
            }
            found.insert(module, path);
        }
    }
    found
}

/// The file's code without its inline test module (`#[cfg(test)] mod x { … }`, which sits
/// at the end of a file; a `mod tests;` declaration cuts nothing) and without line
/// comments.
fn code(text: &str) -> String {
    let mut cut = text.len();
    let mut from = 0;
    while let Some(i) = text[from..].find("#[cfg(test)]") {
        let at = from + i;
        let next = text[at + "#[cfg(test)]".len()..].trim_start();
        let header = next.split('\n').next().unwrap_or("");
        let is_module =
            ["mod ", "pub(super) mod ", "pub(crate) mod ", "pub mod "].iter().any(|p| header.starts_with(p));
        if is_module && header.trim_end().ends_with('{') {
            cut = at;
            break;
        }
        from = at + 1;
    }
    text[..cut].lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or("").trim().to_string()];
    };
    let prefix = tree[..open].trim_end_matches("::").to_string();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|i| !i.trim().is_empty())
        .flat_map(expand)
        .map(|p| if p == "self" { prefix.clone() } else { format!("{prefix}::{p}") })
        .collect()
}

/// Every `crate::…`, `super::…` and `self::…` path the code names: those of its `use`
/// statements (a statement starts a line), expanded, and those written inline.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut rest = String::new();
    let mut statement: Option<String> = None;
    for line in code.lines() {
        let trimmed = line.trim_start();
        let starts = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find(|p| trimmed.starts_with(**p));
        match (&mut statement, starts) {
            (None, Some(prefix)) => statement = Some(trimmed[prefix.len()..].to_string()),
            (Some(text), _) => {
                text.push(' ');
                text.push_str(trimmed);
            }
            (None, None) => {
                rest.push_str(line);
                rest.push('\n');
                continue;
            }
        }
        if let Some(text) = statement.take_if(|t| t.contains(';')) {
            let tree = text.split(';').next().unwrap_or("");
            for path in expand(tree) {
                found.push(path.split("::").map(|s| s.trim().to_string()).collect());
            }
        }
    }
    found.extend(bare_paths(&rest));
    found
}

fn bare_paths(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    for head in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(head) {
            let at = from + i;
            from = at + head.len();
            if at > 0
                && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':')
            {
                continue;
            }
            let end = code[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| at + e);
            found.push(code[at..end].split("::").filter(|s| !s.is_empty()).map(str::to_string).collect());
        }
    }
    found
}

/// The file a path inside module `current` names: its longest module prefix.
fn resolve(modules: &BTreeMap<Vec<String>, PathBuf>, current: &[String], path: &[String]) -> Option<PathBuf> {
    let mut base: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") => current.to_vec(),
        Some("super") => current.to_vec(),
        _ => return None,
    };
    let mut segments = &path[1..];
    if path[0] == "super" {
        base.pop();
        while segments.first().map(String::as_str) == Some("super") {
            base.pop();
            segments = &segments[1..];
        }
    }
    let full: Vec<String> = base.into_iter().chain(segments.iter().cloned()).collect();
    (0..=full.len()).rev().find_map(|n| modules.get(&full[..n]).cloned())
}

#[test]
fn no_import_cycle_between_files() {
    let root = src();
    let modules = modules(&root);
    let by_file: BTreeMap<&PathBuf, &Vec<String>> = modules.iter().map(|(m, f)| (f, m)).collect();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        let targets = edges.entry(file.clone()).or_default();
        for path in paths(&code(&text)) {
            let Some(target) = resolve(&modules, module, &path) else { continue };
            let target_module = by_file[&target];
            // A child module may use its parent's items (and the parent declares it).
            let ancestor =
                target_module.len() < module.len() && module[..target_module.len()] == target_module[..];
            if target != *file && !ancestor {
                targets.insert(target);
            }
        }
    }
    // Depth-first search for a back edge; report the cycle it closes.
    fn visit(
        node: &PathBuf,
        edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        stack: &mut Vec<PathBuf>,
        done: &mut BTreeSet<PathBuf>,
        cycles: &mut Vec<String>,
    ) {
        if let Some(i) = stack.iter().position(|n| n == node) {
            let cycle: Vec<String> =
                stack[i..].iter().chain([node]).map(|p| p.display().to_string()).collect();
            cycles.push(cycle.join(" → "));
            return;
        }
        if !done.insert(node.clone()) {
            return;
        }
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            visit(next, edges, stack, done, cycles);
        }
        stack.pop();
    }
    let (mut done, mut cycles) = (BTreeSet::new(), Vec::new());
    for node in edges.keys() {
        visit(node, &edges, &mut Vec::new(), &mut done, &mut cycles);
    }
    assert!(cycles.is_empty(), "import cycles between files:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_check_sees_use_trees_and_paths() {
    let found = paths("use crate::a::{b, c::{d, self}};\nfn f() { super::x::y(); crate::z::W }");
    let found: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(found, ["crate::a::b", "crate::a::c::d", "crate::a::c", "crate::z::W", "super::x::y"]);
}

#[test]
fn a_test_module_declaration_cuts_nothing_and_an_inline_one_cuts_the_rest() {
    let text = "#[cfg(test)]\nmod tests;\nfn f() { a[\"spec\"] }\n#[cfg(test)]\nmod more {\n fn g() {}\n}\n";
    let kept = code(text);
    assert!(kept.contains("fn f()"), "{kept}");
    assert!(!kept.contains("fn g()"), "{kept}");
}

#[test]
fn src_holds_folders_and_the_crate_roots() {
    let loose: Vec<String> = std::fs::read_dir(src())
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n != "lib.rs" && n != "main.rs")
        .collect();
    assert!(
        loose.is_empty(),
        "loose files in src/ (give each a folder, or say why in ARCHITECTURE.md): {loose:?}"
    );
}

#[test]
fn no_code_indexes_json_by_spec_status_or_metadata() {
    let root = src();
    let mut hits = Vec::new();
    for file in modules(&root).into_values() {
        if file.starts_with(root.join("server/apply")) {
            continue; // server-side apply merges untyped field sets by design
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in code(&text).lines().enumerate() {
            if ["[\"spec\"]", "[\"status\"]", "[\"metadata\"]"].iter().any(|k| line.contains(k)) {
                hits.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(hits.is_empty(), "decode into the api types or use .get()/.pointer():\n{}", hits.join("\n"));
}

/// Every `(file, path it names, file the path resolves to)` of the non-test code.
fn imports() -> Vec<(PathBuf, String, PathBuf)> {
    let root = src();
    let modules = modules(&root);
    let mut found = Vec::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        for path in paths(&code(&text)) {
            if let Some(target) = resolve(&modules, module, &path) {
                found.push((file.clone(), path.join("::"), target));
            }
        }
    }
    found
}

#[test]
fn only_the_cli_reaches_into_the_daemon() {
    // The daemon is the composition root: it wires everything, and only `hive serve`
    // (`cli/serve.rs`) starts it. Jobs live in `src/jobs/`, below the server.
    let root = src();
    let bad: Vec<String> = imports()
        .into_iter()
        .filter(|(file, _, target)| {
            target.starts_with(root.join("daemon"))
                && !file.starts_with(root.join("daemon"))
                && !file.starts_with(root.join("cli"))
        })
        .map(|(file, path, _)| format!("{}: {path}", file.display()))
        .collect();
    assert!(bad.is_empty(), "imports of the daemon from below it:\n{}", bad.join("\n"));
}

#[test]
fn the_server_holds_the_job_and_fleet_services_not_the_engine_or_the_fleet() {
    // The seam high availability plugs into (issue 30): the server reaches Jobs and the
    // fleet through `JobService` and `FleetService` only, so a replica that does not lead
    // can answer through an implementation that reaches the leader.
    let root = src();
    let bad: Vec<String> = imports()
        .into_iter()
        .filter(|(file, path, target)| {
            let above = file.starts_with(root.join("server")) || file.starts_with(root.join("dashboard"));
            let concrete = path.ends_with("::Engine")
                || path.ends_with("::Fleet")
                || target.starts_with(root.join("daemon"))
                || *target == root.join("jobs/engine.rs");
            above && concrete
        })
        .map(|(file, path, _)| format!("{}: {path}", file.display()))
        .collect();
    assert!(bad.is_empty(), "the server names the concrete engine or fleet:\n{}", bad.join("\n"));
}
