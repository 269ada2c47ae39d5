//! The meta flake's `flake.lock`, which hive writes itself in nix's lock-file format
//! (version 7): one node per input, each pinned to a rev. The same model renders
//! `flake.nix` (through [`Source`]), so the two files can never disagree.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Map, Value};

use super::{Error, Result};

/// The lock file's version, as nix writes it.
const VERSION: u64 = 7;

/// The name of the hive base flake's input.
pub(super) const HIVE: &str = "hive";

/// The input name of agent `name`'s configuration repository.
pub(super) fn agent_input(name: &str) -> String {
    format!("agent-{name}")
}

/// Where an input comes from, in the forms the meta flake supports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Source {
    /// A git repository on this host, by absolute path.
    Path(String),
    /// A git repository behind a URL (`https://`, `ssh://`, `file://` …).
    Git(String),
    /// `github:<owner>/<repo>[/<ref>]`.
    GitHub { owner: String, repo: String, reference: Option<String> },
}

impl Source {
    /// Reads the URL a caller gives (a path, a URL, an scp-style `user@host:path`, a
    /// `git+…` or `github:` flake reference).
    pub fn parse(url: &str) -> Result<Source> {
        let unsupported = || Error::UnsupportedUrl { url: url.to_string() };
        if url.is_empty() || url.chars().any(|c| c.is_control() || c == '"' || c == '\\') {
            return Err(unsupported());
        }
        if let Some(rest) = url.strip_prefix("github:") {
            let mut parts = rest.split('/');
            let (owner, repo) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let reference = parts.next().map(str::to_string);
            if owner.is_empty() || repo.is_empty() || parts.next().is_some() {
                return Err(unsupported());
            }
            return Ok(Source::GitHub { owner: owner.into(), repo: repo.into(), reference });
        }
        let url = url.strip_prefix("git+").unwrap_or(url);
        if let Some(path) = url.strip_prefix("path:") {
            return Source::parse(path);
        }
        if url.contains("://") {
            return Ok(match url.strip_prefix("file://") {
                Some(path) if path.starts_with('/') => Source::Path(path.to_string()),
                _ => Source::Git(url.to_string()),
            });
        }
        if let Some(path) = url.strip_prefix("file:") {
            return Source::parse(path);
        }
        // scp-style `git@host:owner/repo.git`, as the runtime's mirror accepts it.
        if let Some((host, path)) = url.split_once(':') {
            if host.contains('@') && !host.contains('/') {
                return Ok(Source::Git(format!("ssh://{host}/{path}")));
            }
        }
        if Path::new(url).is_absolute() {
            return Ok(Source::Path(url.to_string()));
        }
        // A relative path would resolve against whatever directory nix runs in.
        match std::env::current_dir() {
            Ok(cwd) => Ok(Source::Path(cwd.join(url).to_string_lossy().into_owned())),
            Err(_) => Err(unsupported()),
        }
    }

    /// The URL as callers see it again (`Locked::url`): a local repository is its path.
    pub fn url(&self) -> String {
        match self {
            Source::Path(path) => path.clone(),
            Source::Git(url) => url.clone(),
            Source::GitHub { owner, repo, reference: None } => format!("github:{owner}/{repo}"),
            Source::GitHub { owner, repo, reference: Some(r) } => format!("github:{owner}/{repo}/{r}"),
        }
    }

    /// The flake reference `flake.nix` names the input by.
    pub fn flake_url(&self) -> String {
        match self {
            Source::Path(path) => format!("git+file:{path}"),
            Source::Git(url) => format!("git+{url}"),
            Source::GitHub { .. } => self.url(),
        }
    }

    /// The node's `original` (`rev` = None) or `locked` attribute set.
    fn to_json(&self, rev: Option<&str>) -> Value {
        let mut object = match self {
            Source::Path(path) => json!({ "type": "git", "url": format!("file://{path}") }),
            Source::Git(url) => json!({ "type": "git", "url": url }),
            Source::GitHub { owner, repo, reference } => {
                let mut object = json!({ "type": "github", "owner": owner, "repo": repo });
                if let (Some(r), None) = (reference, rev) {
                    object["ref"] = json!(r);
                }
                object
            }
        };
        if let Some(rev) = rev {
            object["rev"] = json!(rev);
        }
        object
    }

    fn from_json(value: &Value) -> Option<Source> {
        let field = |name: &str| value.get(name).and_then(Value::as_str);
        match field("type")? {
            "git" => Source::parse(field("url")?).ok(),
            "github" => Some(Source::GitHub {
                owner: field("owner")?.to_string(),
                repo: field("repo")?.to_string(),
                reference: field("ref").map(str::to_string),
            }),
            _ => None,
        }
    }
}

/// One pinned input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Node {
    pub source: Source,
    pub rev: String,
}

/// The whole lock: input name → pinned source. A `BTreeMap` so rendering is sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Lock {
    pub inputs: BTreeMap<String, Node>,
}

impl Lock {
    /// A lock holding only the hive input.
    pub fn new(hive: Node) -> Lock {
        Lock { inputs: BTreeMap::from([(HIVE.to_string(), hive)]) }
    }

    pub fn hive(&self) -> Option<&Node> {
        self.inputs.get(HIVE)
    }

    /// The agents with an input, by agent name (sorted).
    pub fn agents(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.inputs.iter().filter_map(|(input, node)| Some((input.strip_prefix("agent-")?, node)))
    }

    /// Parses `bytes` read from `path`; anything that is not a lock hive could have
    /// written is corrupt, naming the file.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Lock> {
        let corrupt = |reason: String| Error::Corrupt { path: path.to_path_buf(), reason };
        let value: Value = serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not JSON: {e}")))?;
        if value.get("version").and_then(Value::as_u64) != Some(VERSION) {
            return Err(corrupt(format!("lock file version is not {VERSION}")));
        }
        let root_name = value.get("root").and_then(Value::as_str).ok_or_else(|| corrupt("no root".into()))?;
        let nodes =
            value.get("nodes").and_then(Value::as_object).ok_or_else(|| corrupt("no nodes".into()))?;
        let root_inputs = nodes
            .get(root_name)
            .and_then(|root| root.get("inputs"))
            .and_then(Value::as_object)
            .ok_or_else(|| corrupt("the root node has no inputs".into()))?;
        let mut inputs = BTreeMap::new();
        for (input, target) in root_inputs {
            let node_name =
                target.as_str().ok_or_else(|| corrupt(format!("input {input} is not a node name")))?;
            let locked = nodes
                .get(node_name)
                .and_then(|node| node.get("locked"))
                .ok_or_else(|| corrupt(format!("input {input} has no locked node")))?;
            let source = Source::from_json(locked)
                .ok_or_else(|| corrupt(format!("input {input} has an unsupported locked source")))?;
            let rev = locked
                .get("rev")
                .and_then(Value::as_str)
                .ok_or_else(|| corrupt(format!("input {input} has no locked rev")))?;
            inputs.insert(input.clone(), Node { source, rev: rev.to_string() });
        }
        if !inputs.contains_key(HIVE) {
            return Err(corrupt(format!("no {HIVE} input")));
        }
        Ok(Lock { inputs })
    }

    /// The file's bytes: pretty-printed, keys sorted, a trailing newline, so an
    /// unchanged lock renders byte-identical.
    pub fn render(&self) -> Vec<u8> {
        let mut nodes = Map::new();
        let mut root_inputs = Map::new();
        for (input, node) in &self.inputs {
            root_inputs.insert(input.clone(), json!(input));
            let entry = json!({
                "locked": node.source.to_json(Some(&node.rev)),
                "original": node.source.to_json(None),
            });
            nodes.insert(input.clone(), entry);
        }
        nodes.insert("root".into(), json!({ "inputs": Value::Object(root_inputs) }));
        let lock = json!({ "nodes": Value::Object(nodes), "root": "root", "version": VERSION });
        let mut bytes = serde_json::to_vec_pretty(&sorted(lock)).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }
}

/// `value` with every object's keys in sorted order, whether or not serde_json keeps
/// insertion order (the workspace enables `preserve_order`).
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let ordered: BTreeMap<String, Value> = map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            Value::Object(ordered.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
