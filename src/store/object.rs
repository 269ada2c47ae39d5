//! One stored object as the store keeps it: its JSON, exactly as committed, and nothing
//! else. The cache, the event log, watchers and readers share the same bytes; the few
//! readers that need fields parse them on demand.
//!
//! Why bytes and not a parsed tree: a `serde_json::Value` with `preserve_order` costs
//! about ten times its JSON in heap (an `IndexMap` and a `String` per key), and nearly
//! every read — lists, gets, watch lines — wants the JSON anyway. Parsing one object
//! takes microseconds; keeping 100,000 parsed trees took a gigabyte.

use std::fmt;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

/// A stored object: its JSON (`serde_json::to_vec` of the object, byte for byte, as
/// redb stores it) and the revision that wrote it (its `metadata.resourceVersion`, as a
/// number). Cheap to clone: clones share the bytes.
///
/// Only the store makes one, from an encoded `Value` or from bytes it checked when it
/// loaded them, so the bytes are always one JSON object.
#[derive(Clone, PartialEq, Eq)]
pub struct Obj {
    json: Bytes,
    revision: u64,
}

/// The part of an object the store reads when it loads one: its name.
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
        &self.json
    }
}

impl Obj {
    /// The object `value`, encoded; `revision` is the one its `metadata.resourceVersion`
    /// carries.
    pub(super) fn encode(value: &Value, revision: u64) -> Obj {
        let json = serde_json::to_vec(value).expect("a serde_json::Value always serializes");
        // Exactly as long as the JSON: the cache keeps it for as long as the object lives,
        // and a growing Vec's spare capacity is up to as much again.
        Obj { json: Bytes::from(json.into_boxed_slice()), revision }
    }

    /// Bytes read back from the database, written at `revision`: checked to be one JSON
    /// object, whose `metadata.name` is returned beside it (empty when it has none).
    pub(super) fn load(json: &[u8], revision: u64) -> serde_json::Result<(Obj, String)> {
        let named: Named = serde_json::from_slice(json)?;
        let name = named.metadata.and_then(|m| m.name).unwrap_or_default();
        Ok((Obj { json: Bytes::copy_from_slice(json), revision }, name))
    }

    /// The revision that wrote this object: its `metadata.resourceVersion`, without
    /// parsing it.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The object's JSON, as lists, reads and watch lines serve it.
    pub fn json(&self) -> &Bytes {
        &self.json
    }

    /// The object parsed (a new tree each call).
    pub fn value(&self) -> Value {
        self.decode().expect("a stored object is JSON the store encoded or checked")
    }

    /// The object decoded as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.json)
    }

    /// Whether `other` is this very object (the same stored bytes, not merely equal
    /// ones): what a write's outcome is until a later write replaces it.
    pub fn is(&self, other: &Obj) -> bool {
        self.json.as_ptr() == other.json.as_ptr() && self.json.len() == other.json.len()
    }

    /// The length of the JSON in bytes.
    pub fn len(&self) -> usize {
        self.json.len()
    }

    /// Always false: a stored object is at least `{}`.
    pub fn is_empty(&self) -> bool {
        self.json.is_empty()
    }
}

impl fmt::Debug for Obj {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.json))
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
        assert_eq!(object.json().as_ref(), serde_json::to_vec(&value).unwrap().as_slice());
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
}
