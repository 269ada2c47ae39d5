//! Manifests for `apply -f` and `delete -f`: files, directories (recursively, sorted) and
//! stdin; multi-document YAML or concatenated JSON; `kind: List` expanded. Every
//! document is checked locally (apiVersion, kind, name, and for apply the kind's shape)
//! before anything is sent, and every problem names its file, document and line.

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use hive_api::meta::API_VERSION;
use hive_api::KindInfo;
use serde_json::Value;

use super::kind;

/// The text of one input: a file or stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// How messages name it: the path as given, or `STDIN`.
    pub name: String,
    /// Its content.
    pub text: String,
}

/// Where a document came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// File path or `STDIN`.
    pub source: String,
    /// 1-based index among the source's non-empty documents.
    pub document: usize,
    /// 1-based index within a `kind: List` document.
    pub item: Option<usize>,
    /// 1-based line where the document (or the error in it) starts.
    pub line: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: document {}", self.source, self.document)?;
        if let Some(item) = self.item {
            write!(f, ", item {item}")?;
        }
        if let Some(line) = self.line {
            write!(f, " (line {line})")?;
        }
        Ok(())
    }
}

/// A document that passed the local checks.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// Where it came from.
    pub location: Location,
    /// Its kind.
    pub kind: KindInfo,
    /// `metadata.name`.
    pub name: String,
    /// The document as JSON.
    pub object: Value,
}

/// A document that failed the local checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Where it came from.
    pub location: Location,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

/// How thoroughly documents are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checks {
    /// apiVersion, kind and name only (enough to delete).
    Identity,
    /// Also decode the document as its kind: wrong types and unknown fields fail
    /// here instead of half-way through an apply.
    Shape,
}

/// Reads every `-f` argument: `-` is stdin, a directory contributes its `.yaml`, `.yml`
/// and `.json` files (recursively, sorted by path, hidden entries skipped), a file is
/// read whatever its extension.
pub fn read_sources(args: &[String]) -> Result<Vec<Source>> {
    let mut sources = Vec::new();
    let mut stdin_used = false;
    for arg in args {
        if arg == "-" {
            if stdin_used {
                bail!("standard input (-) can only be given once");
            }
            stdin_used = true;
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read manifests from standard input")?;
            sources.push(Source { name: "STDIN".into(), text });
            continue;
        }
        let path = Path::new(arg);
        let meta = std::fs::metadata(path).with_context(|| format!("the path {arg:?} does not exist"))?;
        let files = if meta.is_dir() {
            let mut files = Vec::new();
            walk(path, &mut files)?;
            files.sort();
            if files.is_empty() {
                bail!("no manifests (.yaml, .yml or .json files) found in directory {arg:?}");
            }
            files
        } else {
            vec![path.to_path_buf()]
        };
        for file in files {
            let text =
                std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
            sources.push(Source { name: file.display().to_string(), text });
        }
    }
    Ok(sources)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read directory {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read directory {}", dir.display()))?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            walk(&path, files)?;
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
        {
            files.push(path);
        }
    }
    Ok(())
}

/// Splits a source into its documents (empty ones skipped), each with its location;
/// a syntax error ends the source, since nothing after it can be trusted.
pub fn parse_documents(source: &str, text: &str) -> Vec<Result<(Location, Value), Invalid>> {
    let location = |document: usize, line: Option<usize>| Location {
        source: source.to_string(),
        document,
        item: None,
        line,
    };
    let looks_like_json = source.ends_with(".json") || text.trim_start().starts_with('{');
    let mut out = Vec::new();
    if looks_like_json {
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        let mut document = 0;
        loop {
            let start = stream.byte_offset();
            match stream.next() {
                None => break,
                Some(Ok(value)) => {
                    document += 1;
                    let line = line_at(text, start + leading_whitespace(&text[start..]));
                    out.push(Ok((location(document, Some(line)), value)));
                }
                Some(Err(e)) => {
                    out.push(Err(Invalid {
                        location: location(document + 1, Some(e.line())),
                        message: format!("invalid JSON: {}", strip_position(&e.to_string())),
                    }));
                    break;
                }
            }
        }
        return out;
    }
    let mut document = 0;
    for (start_line, chunk) in yaml_chunks(text) {
        let Some(first) = first_content_line(&chunk) else { continue };
        let doc_line = start_line + first;
        match serde_yaml_ng::from_str::<Value>(&chunk) {
            Ok(Value::Null) => continue,
            Ok(value) => {
                document += 1;
                out.push(Ok((location(document, Some(doc_line)), value)));
            }
            Err(e) => {
                document += 1;
                let line = e.location().map(|l| start_line + l.line() - 1).unwrap_or(doc_line);
                out.push(Err(Invalid {
                    location: location(document, Some(line)),
                    message: format!("invalid YAML: {}", strip_position(&e.to_string())),
                }));
                break;
            }
        }
    }
    out
}

/// Splits YAML text at `---` / `...` markers; yields (1-based line of the chunk's first
/// line, chunk text).
fn yaml_chunks(text: &str) -> Vec<(usize, String)> {
    let mut chunks = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (i, line) in text.lines().enumerate() {
        let marker = |m: &str| line == m || (line.starts_with(m) && line[3..].starts_with([' ', '\t']));
        if marker("---") || marker("...") {
            chunks.push((start, std::mem::take(&mut current)));
            // Content after `--- ` on the same line belongs to the new document.
            let rest = line.strip_prefix("---").map_or("", str::trim);
            if rest.is_empty() || rest.starts_with('#') {
                start = i + 2;
            } else {
                start = i + 1;
                current.push_str(rest);
                current.push('\n');
            }
            continue;
        }
        current.push_str(line);
        current.push('\n');
    }
    chunks.push((start, current));
    chunks
}

/// 0-based index of the first line that is neither blank nor a comment.
fn first_content_line(chunk: &str) -> Option<usize> {
    chunk.lines().position(|l| {
        let t = l.trim();
        !t.is_empty() && !t.starts_with('#') && !t.starts_with('%')
    })
}

fn leading_whitespace(s: &str) -> usize {
    s.len() - s.trim_start().len()
}

fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Parser messages end in ` at line L column C` relative to the chunk; we report our
/// own (absolute) line instead.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

/// Checks one document and, for `kind: List`, each of its items.
pub fn check_document(
    kinds: &[KindInfo],
    location: Location,
    value: Value,
    checks: Checks,
) -> Vec<Result<Manifest, Invalid>> {
    let is_list =
        value.get("kind").and_then(Value::as_str).is_some_and(|k| k == "List" || k.ends_with("List"))
            && value.get("items").is_some_and(Value::is_array);
    if !is_list {
        return vec![check(kinds, location, value, checks)];
    }
    let Some(Value::Array(items)) = value.get("items").cloned() else { unreachable!("checked above") };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| check(kinds, Location { item: Some(i + 1), ..location.clone() }, item, checks))
        .collect()
}

/// Checks that a document is a `hive.dev/v1` object of a known kind with a valid name
/// (and, with [`Checks::Shape`], that it decodes as its kind without unknown fields).
pub fn check(
    kinds: &[KindInfo],
    location: Location,
    value: Value,
    checks: Checks,
) -> Result<Manifest, Invalid> {
    let fail = |message: String| Invalid { location: location.clone(), message };
    let Value::Object(map) = &value else {
        return Err(fail(format!(
            "expected an object with apiVersion, kind and metadata, found {}",
            type_name(&value)
        )));
    };
    match map.get("apiVersion") {
        None => return Err(fail(format!("missing \"apiVersion\" (expected {API_VERSION:?})"))),
        Some(Value::String(v)) if v == API_VERSION => {}
        Some(Value::String(v)) => {
            return Err(fail(format!("apiVersion {v:?} is not served by hive (expected {API_VERSION:?})")))
        }
        Some(other) => return Err(fail(format!("apiVersion must be a string, found {}", type_name(other)))),
    }
    let kind_name = match map.get("kind") {
        None => return Err(fail("missing \"kind\"".into())),
        Some(Value::String(k)) => k.as_str(),
        Some(other) => return Err(fail(format!("kind must be a string, found {}", type_name(other)))),
    };
    let Some(kind) = kind::by_kind(kinds, kind_name) else {
        let known: Vec<&str> = kinds.iter().map(|k| k.kind).collect();
        let hint = match kinds.iter().find(|k| k.kind.eq_ignore_ascii_case(kind_name)) {
            Some(k) => format!("; did you mean {:?}?", k.kind),
            None => String::new(),
        };
        return Err(fail(format!(
            "unknown kind {kind_name:?} in {API_VERSION} (known kinds: {}){hint}",
            known.join(", ")
        )));
    };
    let name = match value.pointer("/metadata/name") {
        None | Some(Value::Null) => return Err(fail("missing \"metadata.name\"".into())),
        Some(Value::String(n)) if n.is_empty() => return Err(fail("missing \"metadata.name\"".into())),
        Some(Value::String(n)) => n.clone(),
        Some(other) => {
            return Err(fail(format!("metadata.name must be a string, found {}", type_name(other))))
        }
    };
    if let Err(why) = hive_api::validation::dns1123_label(&name) {
        return Err(fail(format!("invalid metadata.name {name:?}: {why}")));
    }
    if checks == Checks::Shape {
        match (kind.decode)(&value) {
            Err(e) if e.field.is_empty() => return Err(fail(e.message)),
            Err(e) => return Err(fail(format!("{}: {}", e.field, e.message))),
            Ok(decoded) if !decoded.unknown_fields.is_empty() => {
                let fields: Vec<String> = decoded.unknown_fields.iter().map(|f| format!("{f:?}")).collect();
                let noun = if fields.len() == 1 { "field" } else { "fields" };
                return Err(fail(format!("unknown {noun} {} in {}", fields.join(", "), kind.kind)));
            }
            Ok(_) => {}
        }
    }
    Ok(Manifest { location, kind, name, object: value })
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Parses and checks every document of every source, in order.
pub fn load(kinds: &[KindInfo], sources: &[Source], checks: Checks) -> (Vec<Manifest>, Vec<Invalid>) {
    let mut valid = Vec::new();
    let mut invalid = Vec::new();
    for source in sources {
        for parsed in parse_documents(&source.name, &source.text) {
            let results = match parsed {
                Ok((location, value)) => check_document(kinds, location, value, checks),
                Err(e) => vec![Err(e)],
            };
            for result in results {
                match result {
                    Ok(m) => valid.push(m),
                    Err(e) => invalid.push(e),
                }
            }
        }
    }
    (valid, invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::kind::fixtures::kinds;

    fn summarize(source: &str, text: &str, checks: Checks) -> Vec<String> {
        let sources = [Source { name: source.into(), text: text.into() }];
        let (valid, invalid) = load(&kinds(), &sources, checks);
        let mut out: Vec<String> =
            valid.iter().map(|m| format!("ok {} {}/{}", m.location, m.kind.plural, m.name)).collect();
        out.extend(invalid.iter().map(|e| format!("error {e}")));
        out
    }

    #[test]
    fn splits_yaml_documents_with_lines() {
        let text = "\
# leading comment
---
apiVersion: hive.dev/v1
kind: Agent
metadata:
  name: a1
---
# only a comment
---

apiVersion: hive.dev/v1
kind: Job
metadata: {name: j1}
...
--- {apiVersion: hive.dev/v1, kind: Agent, metadata: {name: a2}}
";
        assert_eq!(
            summarize("m.yaml", text, Checks::Shape),
            [
                "ok m.yaml: document 1 (line 3) agents/a1",
                "ok m.yaml: document 2 (line 11) jobs/j1",
                "ok m.yaml: document 3 (line 15) agents/a2",
            ]
        );
    }

    #[test]
    fn reports_file_document_and_line() {
        let text = "\
apiVersion: hive.dev/v1
kind: Agent
metadata:
  name: a1
---
apiVersion: hive.dev/v1
kind: Agent
metadata:
  labels: {app: x}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
---
apiVersion: hive.dev/v1
kind: agent
metadata: {name: a3}
---
apiVersion: hive.dev/v1
kind: Agent
metadata: {name: A_3}
---
apiVersion: hive.dev/v1
kind: Agent
metadata: {name: a4}
spec: {wanted: Up, bogus: 1, replicas: 2}
---
apiVersion: hive.dev/v1
kind: Agent
metadata: {name: a5}
spec: {replicas: many}
---
- just a list
";
        let out = summarize("dir/bad.yaml", text, Checks::Shape);
        assert_eq!(out[0], "ok dir/bad.yaml: document 1 (line 1) agents/a1");
        assert_eq!(out[1], "error dir/bad.yaml: document 2 (line 6): missing \"metadata.name\"");
        assert_eq!(
            out[2],
            "error dir/bad.yaml: document 3 (line 11): apiVersion \"apps/v1\" is not served by hive (expected \"hive.dev/v1\")"
        );
        assert_eq!(
            out[3],
            "error dir/bad.yaml: document 4 (line 15): unknown kind \"agent\" in hive.dev/v1 \
             (known kinds: Agent, FleetCommand, Job); did you mean \"Agent\"?"
        );
        assert!(
            out[4].starts_with("error dir/bad.yaml: document 5 (line 19): invalid metadata.name \"A_3\": "),
            "{}",
            out[4]
        );
        assert_eq!(out[5], "error dir/bad.yaml: document 6 (line 23): unknown field \"spec.bogus\" in Agent");
        assert!(
            out[6].starts_with("error dir/bad.yaml: document 7 (line 28): spec.replicas: invalid type"),
            "{}",
            out[6]
        );
        assert_eq!(
            out[7],
            "error dir/bad.yaml: document 8 (line 33): expected an object with apiVersion, kind and metadata, found a list"
        );
        assert_eq!(out.len(), 8);
    }

    #[test]
    fn identity_checks_ignore_the_shape() {
        let text = "apiVersion: hive.dev/v1\nkind: Agent\nmetadata: {name: a4}\nspec: {bogus: 1}\n";
        assert_eq!(summarize("x.yaml", text, Checks::Identity), ["ok x.yaml: document 1 (line 1) agents/a4"]);
    }

    #[test]
    fn yaml_syntax_errors_stop_the_source_with_an_absolute_line() {
        let text = "\
apiVersion: hive.dev/v1
kind: Agent
metadata: {name: a1}
---
apiVersion: hive.dev/v1
kind: Agent
metadata:
  name: a2
 bad: indentation
---
apiVersion: hive.dev/v1
kind: Agent
metadata: {name: a3}
";
        let out = summarize("s.yaml", text, Checks::Shape);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0], "ok s.yaml: document 1 (line 1) agents/a1");
        assert!(out[1].starts_with("error s.yaml: document 2 (line 9): invalid YAML: "), "{}", out[1]);
        assert!(!out[1].contains(" at line "), "{}", out[1]);
    }

    #[test]
    fn json_streams_and_lists() {
        let text = r#"{"apiVersion":"hive.dev/v1","kind":"Agent","metadata":{"name":"a1"}}
{
  "apiVersion": "v1",
  "kind": "List",
  "items": [
    {"apiVersion":"hive.dev/v1","kind":"Agent","metadata":{"name":"a2"}},
    {"apiVersion":"hive.dev/v1","kind":"Agent","metadata":{}}
  ]
}
{"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "j1"},}
"#;
        assert_eq!(
            summarize("STDIN", text, Checks::Shape),
            [
                "ok STDIN: document 1 (line 1) agents/a1",
                "ok STDIN: document 2, item 1 (line 2) agents/a2",
                "error STDIN: document 2, item 2 (line 2): missing \"metadata.name\"",
                "error STDIN: document 3 (line 10): invalid JSON: trailing comma",
            ]
        );
    }

    #[test]
    fn yaml_lists_from_get_round_trip() {
        let text = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: hive.dev/v1\n  kind: Agent\n  metadata:\n    name: a1\nmetadata:\n  resourceVersion: \"\"\n";
        assert_eq!(
            summarize("l.yaml", text, Checks::Shape),
            ["ok l.yaml: document 1, item 1 (line 1) agents/a1"]
        );
    }

    #[test]
    fn directories_are_read_recursively_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let write = |rel: &str, text: &str| {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("b.yaml", "b");
        write("a/z.yml", "z");
        write("a/c.json", "c");
        write("notes.txt", "ignored");
        write(".hidden/x.yaml", "ignored");
        let root = dir.path().display().to_string();
        let sources = read_sources(std::slice::from_ref(&root)).unwrap();
        let names: Vec<String> =
            sources.iter().map(|s| s.name.strip_prefix(&root).unwrap().to_string()).collect();
        assert_eq!(names, ["/a/c.json", "/a/z.yml", "/b.yaml"]);
        let err = read_sources(&[format!("{root}/missing.yaml")]).unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        let err = read_sources(&[empty.path().display().to_string()]).unwrap_err();
        assert!(err.to_string().starts_with("no manifests"), "{err}");
    }
}
