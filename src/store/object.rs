//! One stored object as the store keeps it: its JSON, exactly as committed, and, when it
//! has labels, those labels in a compact form beside it. The cache, the event log,
//! watchers and readers share the same bytes; the few readers that need fields parse
//! them on demand, and selectors read the labels without parsing anything.
//!
//! Why bytes and not a parsed tree: a `serde_json::Value` with `preserve_order` costs
//! about ten times its JSON in heap (an `IndexMap` and a `String` per key), and nearly
//! every read — lists, gets, watch lines — wants the JSON anyway. Parsing one object
//! takes microseconds; keeping 100,000 parsed trees took a gigabyte.
//!
//! Why the labels beside it: a list or watch with a `labelSelector` tests every object
//! it passes, and parsing each one to find its labels made a `limit=1` page over
//! 20,000 Agents cost 115 ms (issue 28). The labels are read once, when the store makes
//! the object, and kept after its JSON in the same buffer:
//!
//! ```text
//! JSON | labels | u32 LE: length of labels | LABELLED
//! ```
//!
//! where `labels` is each label's key and value, each as a LEB128 length and its UTF-8
//! bytes. `LABELLED` (0xFF) can never end JSON text, which ends in `}` or whitespace,
//! so an object without labels is its JSON alone: no byte more than before, and
//! `Obj` itself is no larger.

use std::fmt;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The last byte of an object's buffer when labels follow its JSON.
const LABELLED: u8 = 0xFF;
/// The trailer after the labels: their length (u32 LE) and [`LABELLED`].
const TRAILER: usize = 5;

/// A stored object: its JSON (`serde_json::to_vec` of the object, byte for byte, as
/// redb stores it), its labels, and the revision that wrote it (its
/// `metadata.resourceVersion`, as a number). Cheap to clone: clones share the bytes.
///
/// Only the store makes one, from an encoded `Value` or from bytes it checked when it
/// loaded them, so the JSON is always one JSON object and the labels are its own.
#[derive(Clone)]
pub struct Obj {
    /// The JSON, then its labels and the trailer when it has any (see the module doc).
    bytes: Bytes,
    revision: u64,
}

#[cfg(test)]
thread_local! {
    static PARSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static LABELS_READ: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The part of an object the store reads when it loads one: its name and labels.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    metadata: Option<MetaHead>,
}

#[derive(Deserialize)]
struct MetaHead {
    #[serde(default)]
    name: Option<String>,
    /// Anything: labels that are not an object are no labels, as they always were to
    /// selectors (the API stores only maps of strings).
    #[serde(default)]
    labels: Option<Value>,
}

/// The name alone, for a reader that has the object but not its name.
#[derive(Deserialize)]
struct Named {
    #[serde(default)]
    metadata: Option<NameOnly>,
}

#[derive(Deserialize)]
struct NameOnly {
    #[serde(default)]
    name: Option<String>,
}

/// An object is its JSON.
impl AsRef<[u8]> for Obj {
    fn as_ref(&self) -> &[u8] {
        self.json()
    }
}

impl Obj {
    /// The object `value`, encoded; `revision` is the one its `metadata.resourceVersion`
    /// carries.
    pub(super) fn encode(value: &Value, revision: u64) -> Obj {
        let mut bytes = serde_json::to_vec(value).expect("a serde_json::Value always serializes");
        let labels = value.pointer("/metadata/labels").and_then(Value::as_object);
        append_labels(&mut bytes, labels);
        // Exactly as long as its bytes: the cache keeps them for as long as the object
        // lives, and a growing Vec's spare capacity is up to as much again.
        Obj { bytes: Bytes::from(bytes.into_boxed_slice()), revision }
    }

    /// Bytes read back from the database, written at `revision`: checked to be one JSON
    /// object, whose `metadata.name` is returned beside it (empty when it has none).
    pub(super) fn load(json: &[u8], revision: u64) -> serde_json::Result<(Obj, String)> {
        let head: Head = serde_json::from_slice(json)?;
        let (name, labels) = head.metadata.map(|m| (m.name, m.labels)).unwrap_or_default();
        let mut section = Vec::new();
        append_labels(&mut section, labels.as_ref().and_then(Value::as_object));
        let mut bytes = Vec::with_capacity(json.len() + section.len());
        bytes.extend_from_slice(json);
        bytes.extend_from_slice(&section);
        Ok((Obj { bytes: Bytes::from(bytes.into_boxed_slice()), revision }, name.unwrap_or_default()))
    }

    /// The revision that wrote this object: its `metadata.resourceVersion`, without
    /// parsing it.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The object's JSON, as lists, reads and watch lines serve it.
    pub fn json(&self) -> &[u8] {
        &self.bytes[..self.json_len()]
    }

    /// The object's JSON as shared bytes, for a response body (no copy).
    pub fn json_bytes(&self) -> Bytes {
        self.bytes.slice(..self.json_len())
    }

    /// The object's `metadata.labels`, read without parsing the object.
    pub fn labels(&self) -> StoredLabels<'_> {
        #[cfg(test)]
        LABELS_READ.with(|read| read.set(read.get() + 1));
        let json = self.json_len();
        let end = self.bytes.len().saturating_sub(TRAILER).max(json);
        StoredLabels { section: &self.bytes[json..end] }
    }

    /// The object's `metadata.name` (empty when it has none), read from its JSON
    /// without building a tree: for a reader that has the object but not its name.
    pub fn name(&self) -> String {
        let named: serde_json::Result<Named> = serde_json::from_slice(self.json());
        named.ok().and_then(|n| n.metadata).and_then(|m| m.name).unwrap_or_default()
    }

    /// The object parsed (a new tree each call).
    pub fn value(&self) -> Value {
        self.decode().expect("a stored object is JSON the store encoded or checked")
    }

    /// The object decoded as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        #[cfg(test)]
        PARSED.with(|parsed| parsed.set(parsed.get() + 1));
        serde_json::from_slice(self.json())
    }

    /// How many times this thread has parsed a stored object ([`Obj::value`],
    /// [`Obj::decode`]): what a test counts to show that a path reads no object's JSON.
    #[cfg(test)]
    pub fn parsed_on_this_thread() -> usize {
        PARSED.with(std::cell::Cell::get)
    }

    /// How many times this thread has read a stored object's labels: what a test counts
    /// to show how many objects a selector looked at.
    #[cfg(test)]
    pub fn labels_read_on_this_thread() -> usize {
        LABELS_READ.with(std::cell::Cell::get)
    }

    /// Whether `other` is this very object (the same stored bytes, not merely equal
    /// ones): what a write's outcome is until a later write replaces it.
    pub fn is(&self, other: &Obj) -> bool {
        self.bytes.as_ptr() == other.bytes.as_ptr() && self.bytes.len() == other.bytes.len()
    }

    /// The length of the JSON in bytes.
    pub fn len(&self) -> usize {
        self.json_len()
    }

    /// Always false: a stored object is at least `{}`.
    pub fn is_empty(&self) -> bool {
        self.json_len() == 0
    }

    /// Where the JSON ends: before the labels and trailer, if there are any.
    fn json_len(&self) -> usize {
        let bytes = &self.bytes[..];
        match bytes.split_last() {
            Some((&LABELLED, rest)) if rest.len() >= TRAILER - 1 => {
                let (rest, length) = rest.split_at(rest.len() - (TRAILER - 1));
                let length = u32::from_le_bytes(length.try_into().expect("four bytes")) as usize;
                rest.len().saturating_sub(length)
            }
            _ => bytes.len(),
        }
    }
}

/// Appends `labels` (nothing when there are none) and the trailer after an object's
/// JSON. A value that is not a string counts as the empty string, as selectors always
/// read it.
fn append_labels(bytes: &mut Vec<u8>, labels: Option<&Map<String, Value>>) {
    let start = bytes.len();
    for (key, value) in labels.into_iter().flatten() {
        for text in [key.as_str(), value.as_str().unwrap_or("")] {
            put_length(bytes, text.len());
            bytes.extend_from_slice(text.as_bytes());
        }
    }
    if bytes.len() > start {
        // Never more than the JSON they were read from, which redb holds in a value of
        // less than 4 GiB (each label costs at least its quotes, colon and comma there).
        let length = u32::try_from(bytes.len() - start).expect("an object's labels are below 4 GiB");
        bytes.extend_from_slice(&length.to_le_bytes());
        bytes.push(LABELLED);
    }
}

/// `length` as LEB128: seven bits a byte, low first, the high bit set on all but the
/// last (one byte for every label key and value the API accepts, 317 bytes at most).
fn put_length(bytes: &mut Vec<u8>, mut length: usize) {
    while length >= 0x80 {
        bytes.push((length & 0x7F) as u8 | 0x80);
        length >>= 7;
    }
    bytes.push(length as u8);
}

/// Reads a LEB128 length from the front of `bytes`.
fn take_length(bytes: &mut &[u8]) -> Option<usize> {
    let mut length = 0usize;
    for shift in (0..usize::BITS).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        length |= usize::from(byte & 0x7F) << shift;
        if byte & 0x80 == 0 {
            return Some(length);
        }
    }
    None
}

/// An object's labels as the store keeps them beside its JSON: found by key without
/// parsing the object or building a map.
#[derive(Clone, Copy)]
pub struct StoredLabels<'a> {
    section: &'a [u8],
}

impl<'a> StoredLabels<'a> {
    /// Each label's key and value, in the object's order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> {
        let mut rest = self.section;
        let mut text = move || {
            let length = take_length(&mut rest)?;
            let (text, after) = rest.split_at_checked(length)?;
            rest = after;
            std::str::from_utf8(text).ok()
        };
        std::iter::from_fn(move || Some((text()?, text()?)))
    }

    /// True when the object has no labels.
    pub fn is_empty(&self) -> bool {
        self.section.is_empty()
    }
}

impl hive_api::selector::Labels for StoredLabels<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

/// Equal objects have the same JSON and revision (their labels follow from the JSON).
impl PartialEq for Obj {
    fn eq(&self, other: &Obj) -> bool {
        self.revision == other.revision && self.json() == other.json()
    }
}

impl Eq for Obj {}

impl fmt::Debug for Obj {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.json()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_keeps_its_json_byte_for_byte_and_parses_back() {
        let value =
            serde_json::json!({"metadata": {"name": "a", "labels": {"z": "1", "a": "2"}}, "spec": {}});
        let object = Obj::encode(&value, 7);
        assert_eq!(object.json(), serde_json::to_vec(&value).unwrap().as_slice());
        assert_eq!(object.value(), value);
        assert_eq!(object.revision(), 7);
        let (loaded, name) = Obj::load(object.json(), 7).unwrap();
        assert_eq!((loaded.clone(), name.as_str()), (object.clone(), "a"));
        assert!(object.is(&object.clone()), "a clone is the same object");
        assert!(!object.is(&loaded), "equal bytes loaded apart are not the same object");
    }

    #[test]
    fn loading_refuses_bytes_that_are_not_one_json_object() {
        for bad in [&b"[1,2]"[..], b"{\"metadata\":", b"\"text\"", b"{\"metadata\":{\"name\":7}}"] {
            assert!(Obj::load(bad, 1).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(Obj::load(b"{}", 1).unwrap().1, "", "no name is an empty name");
    }

    fn labels(object: &Obj) -> Vec<(&str, &str)> {
        object.labels().iter().collect()
    }

    #[test]
    fn labels_are_read_once_and_kept_beside_the_json() {
        let long_key = format!("example.com/{}", "k".repeat(200));
        let value = serde_json::json!({"metadata": {"name": "a", "labels": {
            "tier": "gold", "odd \"text\" \\ é": "v\u{1}\"", &long_key: "x", "not-a-string": 7,
        }}, "spec": {"text": "x".repeat(300)}});
        let encoded = Obj::encode(&value, 3);
        let want = [
            ("tier", "gold"),
            ("odd \"text\" \\ é", "v\u{1}\""),
            (long_key.as_str(), "x"),
            ("not-a-string", ""),
        ];
        assert_eq!(labels(&encoded), want);
        assert_eq!(encoded.json(), serde_json::to_vec(&value).unwrap().as_slice(), "the JSON alone");
        assert_eq!(encoded.len(), encoded.json().len());
        assert_eq!(encoded.value(), value);
        let (loaded, _) = Obj::load(encoded.json(), 3).unwrap();
        assert_eq!(labels(&loaded), want, "the same labels when loaded");
        assert_eq!(&loaded.json_bytes()[..], encoded.json());

        // Bytes on disk are kept as they are; their labels are read through JSON escapes.
        let escaped = br#"{"metadata":{"labels":{"ti\u0065r":"g\u006fld","hive.dev\/x":""},"name":"b"}} "#;
        let (loaded, name) = Obj::load(escaped, 4).unwrap();
        assert_eq!((name.as_str(), loaded.json()), ("b", &escaped[..]));
        assert_eq!(labels(&loaded), [("tier", "gold"), ("hive.dev/x", "")]);
        assert_eq!(loaded.name(), "b");
    }

    #[test]
    fn an_object_without_labels_is_its_json_alone() {
        assert!(std::mem::size_of::<Obj>() <= std::mem::size_of::<Bytes>() + 8, "no larger than before");
        for metadata in [
            serde_json::json!({"name": "a"}),
            serde_json::json!({"name": "a", "labels": {}}),
            serde_json::json!({"name": "a", "labels": null}),
            serde_json::json!({"name": "a", "labels": "not a map"}),
        ] {
            let value = serde_json::json!({"metadata": metadata});
            let encoded = Obj::encode(&value, 1);
            let (loaded, _) = Obj::load(encoded.json(), 1).unwrap();
            for object in [&encoded, &loaded] {
                assert_eq!(object.bytes.len(), object.json().len(), "{value}: nothing beside the JSON");
                assert!(object.labels().is_empty(), "{value}");
            }
        }
    }

    /// Selectors read the packed labels exactly as they read a map of them.
    #[test]
    fn selectors_match_packed_labels_as_they_match_a_map() {
        use hive_api::selector::LabelSelector;
        let label_sets = [
            serde_json::json!({}),
            serde_json::json!({"tier": "gold"}),
            serde_json::json!({"tier": "silver", "env": "prod"}),
            serde_json::json!({"tier": "", "hive.dev/legacy": "true"}),
        ];
        let selectors = [
            "tier",
            "!tier",
            "tier=gold",
            "tier==silver",
            "tier!=gold",
            "tier in (gold,silver)",
            "tier notin (gold)",
            "tier=",
            "env,!hive.dev/legacy",
            "hive.dev/legacy=true,tier in (x)",
        ];
        for labels in &label_sets {
            let object = Obj::encode(&serde_json::json!({"metadata": {"name": "a", "labels": labels}}), 1);
            let map: std::collections::BTreeMap<String, String> =
                serde_json::from_value(labels.clone()).unwrap();
            for selector in selectors {
                let selector: LabelSelector = selector.parse().unwrap();
                assert_eq!(
                    selector.matches(&object.labels()),
                    selector.matches(&map),
                    "{selector} on {labels}"
                );
            }
        }
    }
}
