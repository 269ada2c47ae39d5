//! One pass over a JSON or YAML body that builds its `serde_json::Value` and records each
//! key an object gives twice, by field path (the value kept is the last, as the parsers
//! always kept it). kube-apiserver's strict decoding finds the same; `fieldValidation`
//! decides what becomes of them (`hive_api::Duplicates`).
//!
//! Bounded work on any body: nesting is bounded by the parsers' own recursion limit (128
//! levels; past it, a parse error); each key costs one lookup in its object; only the
//! first few duplicates have their path rendered, each cut at [`MAX_PATH_BYTES`].

use std::fmt;

use hive_api::Duplicates;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// A field path named in a message is cut after this many bytes: a body's keys may be
/// megabytes long, and nested a hundred deep.
pub const MAX_PATH_BYTES: usize = 256;

/// Reads `deserializer`'s one document as a `Value`, with the keys it gives twice.
pub fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<(Value, Duplicates), D::Error> {
    let mut duplicates = Duplicates::default();
    let value = Node { at: &At::Root, duplicates: &mut duplicates }.deserialize(deserializer)?;
    Ok((value, duplicates))
}

/// Where a value sits in the document: its parent, and its key or index there.
enum At<'a> {
    Root,
    Key(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
}

impl At<'_> {
    /// The path as Kubernetes names fields (`spec.nodes[1].id`), cut at
    /// [`MAX_PATH_BYTES`].
    fn field(&self) -> String {
        let mut steps = Vec::new();
        let mut at = self;
        while let At::Key(parent, _) | At::Index(parent, _) = at {
            steps.push(at);
            at = parent;
        }
        let mut field = String::new();
        for step in steps.into_iter().rev() {
            match step {
                At::Key(_, key) => {
                    if !field.is_empty() {
                        field.push('.');
                    }
                    field.push_str(key);
                }
                At::Index(_, index) => field.push_str(&format!("[{index}]")),
                At::Root => {}
            }
            if field.len() > MAX_PATH_BYTES {
                let mut cut = MAX_PATH_BYTES;
                while !field.is_char_boundary(cut) {
                    cut -= 1;
                }
                field.truncate(cut);
                field.push('…');
                break;
            }
        }
        field
    }
}

/// One value of the document, read at `at`.
struct Node<'a, 'd> {
    at: &'a At<'a>,
    duplicates: &'d mut Duplicates,
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// A key, read as `serde_json::Value` reads one (any scalar the parser gives as a string).
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for Key {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E>(self, key: &str) -> Result<String, E> {
        Ok(key.to_string())
    }

    fn visit_string<E>(self, key: String) -> Result<String, E> {
        Ok(key)
    }
}

// The leaves are read as `serde_json::Value`'s own visitor reads them, so that a body
// parses to the value it parsed to before keys given twice were looked for.
impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Value, E> {
        serde::Deserialize::deserialize(serde::de::value::I128Deserializer::<E>::new(v)).map(Value::Number)
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Value, E> {
        serde::Deserialize::deserialize(serde::de::value::U128Deserializer::<E>::new(v)).map(Value::Number)
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let at = At::Index(self.at, items.len());
            match seq.next_element_seed(Node { at: &at, duplicates: &mut *self.duplicates })? {
                Some(item) => items.push(item),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key_seed(Key)? {
            let at = At::Key(self.at, &key);
            let value = map.next_value_seed(Node { at: &at, duplicates: &mut *self.duplicates })?;
            if object.contains_key(&key) {
                self.duplicates.record(|| at.field());
            }
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}
