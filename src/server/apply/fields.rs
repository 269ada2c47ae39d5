//! Field paths and field sets: which leaves of an object a manager owns, and their
//! `FieldsV1` trie form.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Bound;

use serde_json::{Map, Value};

use super::SERVER_OWNED_METADATA;

// ---------------------------------------------------------------------------------------
// Field paths and sets
// ---------------------------------------------------------------------------------------

/// The path to one field, as map keys from the object's root: `["spec", "wanted"]`.
/// Displays in kubectl's dotted form, `.spec.wanted`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldPath(pub(super) Vec<String>);

impl FieldPath {
    /// A path from its map keys.
    pub fn new<S: Into<String>>(segments: impl IntoIterator<Item = S>) -> FieldPath {
        FieldPath(segments.into_iter().map(Into::into).collect())
    }

    /// The map keys from the root.
    pub fn segments(&self) -> &[String] {
        &self.0
    }

    /// The value at this path, if every step is a map holding the next key.
    pub fn get<'a>(&self, object: &'a Value) -> Option<&'a Value> {
        self.0.iter().try_fold(object, |v, key| v.as_object()?.get(key))
    }

    /// The strict ancestors, from the shortest (`.spec`) to the parent.
    pub(super) fn ancestors(&self) -> impl Iterator<Item = FieldPath> + '_ {
        (1..self.0.len()).map(|n| FieldPath(self.0[..n].to_vec()))
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|key| write!(f, ".{key}"))
    }
}

/// A set of fields of one object, as a manager owns them: leaf paths (see the module
/// docs for what a leaf is), convertible to and from the Kubernetes `FieldsV1` trie
/// (`{"f:spec":{"f:wanted":{}}}`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet(pub(super) BTreeSet<FieldPath>);

/// Why a `FieldsV1` document could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldsV1Error {
    /// A trie node is not a JSON object.
    #[error("fieldsV1 node at {path:?} is not an object")]
    NotAnObject {
        /// Dotted path of the node (empty for the root).
        path: String,
    },
    /// A key other than `f:<name>` or `.`; hive lists are atomic, so `k:`, `v:` and `i:`
    /// elements never occur.
    #[error("fieldsV1 element {element:?} at {path:?} is not supported")]
    UnsupportedElement {
        /// Dotted path of the node holding the key.
        path: String,
        /// The key.
        element: String,
    },
}

impl FieldSet {
    /// The empty set.
    pub fn new() -> FieldSet {
        FieldSet::default()
    }

    /// Every leaf of `object`, leaving out `apiVersion`, `kind` and server-owned metadata.
    pub fn of_object(object: &Value) -> FieldSet {
        fn walk(value: &Value, path: &mut Vec<String>, out: &mut BTreeSet<FieldPath>) {
            match value {
                Value::Object(map) if !map.is_empty() || path.is_empty() => {
                    for (key, child) in map {
                        if !excluded(path.len(), path.first().map(String::as_str), key) {
                            path.push(key.clone());
                            walk(child, path, out);
                            path.pop();
                        }
                    }
                }
                _ if path.is_empty() => {}
                _ => {
                    out.insert(FieldPath(path.clone()));
                }
            }
        }
        let mut out = BTreeSet::new();
        walk(object, &mut Vec::new(), &mut out);
        FieldSet(out)
    }

    /// `FieldSet::of_object(object).to_fields_v1()` in one walk, without a set of paths:
    /// the whole ownership a create records (`None` when the object has no field to own).
    /// Every non-empty map the walk meets is a parent only (a leaf has no children), so
    /// no `"."` element occurs.
    pub fn fields_v1_of_object(object: &Value) -> Option<Value> {
        fn trie(map: &Map<String, Value>, depth: usize, first: Option<&str>) -> Map<String, Value> {
            let mut keys: Vec<(&String, &Value)> =
                map.iter().filter(|(key, _)| !excluded(depth, first, key)).collect();
            keys.sort_unstable_by(|a, b| a.0.cmp(b.0));
            let mut out = Map::new();
            for (key, child) in keys {
                let node = match child {
                    Value::Object(children) if !children.is_empty() => {
                        let node = trie(children, depth + 1, first.or(Some(key)));
                        if node.is_empty() {
                            continue; // every field below is the server's
                        }
                        node
                    }
                    _ => Map::new(),
                };
                out.insert(format!("f:{key}"), Value::Object(node));
            }
            out
        }
        let root = trie(object.as_object()?, 0, None);
        (!root.is_empty()).then_some(Value::Object(root))
    }

    /// Reads a `FieldsV1` trie.
    pub fn from_fields_v1(fields: &Value) -> Result<FieldSet, FieldsV1Error> {
        fn walk(
            node: &Value,
            path: &mut Vec<String>,
            out: &mut BTreeSet<FieldPath>,
        ) -> Result<(), FieldsV1Error> {
            let here = |path: &[String]| FieldPath(path.to_vec());
            let Some(map) = node.as_object() else {
                return Err(FieldsV1Error::NotAnObject { path: here(path).to_string() });
            };
            if map.is_empty() && !path.is_empty() {
                out.insert(here(path));
            }
            for (key, child) in map {
                if key == "." {
                    if !path.is_empty() {
                        out.insert(here(path));
                    }
                } else if let Some(name) = key.strip_prefix("f:") {
                    path.push(name.to_string());
                    walk(child, path, out)?;
                    path.pop();
                } else {
                    let path = here(path).to_string();
                    return Err(FieldsV1Error::UnsupportedElement { path, element: key.clone() });
                }
            }
            Ok(())
        }
        let mut out = BTreeSet::new();
        walk(fields, &mut Vec::new(), &mut out)?;
        Ok(FieldSet(out))
    }

    /// Writes the set as a `FieldsV1` trie, keys sorted.
    pub fn to_fields_v1(&self) -> Value {
        #[derive(Default)]
        struct Node<'a> {
            member: bool,
            children: BTreeMap<&'a str, Node<'a>>,
        }
        fn render(node: &Node<'_>) -> Value {
            let mut map = Map::new();
            if node.member && !node.children.is_empty() {
                map.insert(".".to_string(), Value::Object(Map::new()));
            }
            for (key, child) in &node.children {
                map.insert(format!("f:{key}"), render(child));
            }
            Value::Object(map)
        }
        let mut root = Node::default();
        for path in &self.0 {
            let node = path.0.iter().fold(&mut root, |node, key| node.children.entry(key).or_default());
            node.member = true;
        }
        render(&root)
    }

    /// Whether the set holds exactly this path.
    pub fn contains(&self, path: &FieldPath) -> bool {
        self.0.contains(path)
    }

    /// Adds a path; returns whether it was new.
    pub fn insert(&mut self, path: FieldPath) -> bool {
        self.0.insert(path)
    }

    /// Removes a path; returns whether it was there.
    pub fn remove(&mut self, path: &FieldPath) -> bool {
        self.0.remove(path)
    }

    /// The paths, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &FieldPath> {
        self.0.iter()
    }

    /// How many paths the set holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when the set holds no path.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The paths strictly below `path`. Sorted order keeps them together, right after it.
    pub(super) fn descendants<'a>(&'a self, path: &'a FieldPath) -> impl Iterator<Item = &'a FieldPath> + 'a {
        self.0.range((Bound::Excluded(path), Bound::Unbounded)).take_while(move |p| p.0.starts_with(&path.0))
    }

    /// Whether the set holds `path` or anything below it.
    pub(super) fn covers(&self, path: &FieldPath) -> bool {
        self.contains(path) || self.descendants(path).next().is_some()
    }

    /// Drops the paths that no longer exist in `object`: nobody owns a missing field.
    pub(super) fn retain_present(&mut self, object: &Value) {
        self.0.retain(|p| p.get(object).is_some());
    }
}

/// Whether `key`, in a map `depth` levels below the object's root whose path starts with
/// `first`, is left out of every field set: `apiVersion`, `kind` and server-owned metadata.
fn excluded(depth: usize, first: Option<&str>, key: &str) -> bool {
    match depth {
        0 => key == "apiVersion" || key == "kind",
        1 => first == Some("metadata") && SERVER_OWNED_METADATA.contains(&key),
        _ => false,
    }
}

impl FromIterator<FieldPath> for FieldSet {
    fn from_iter<I: IntoIterator<Item = FieldPath>>(iter: I) -> FieldSet {
        FieldSet(iter.into_iter().collect())
    }
}
