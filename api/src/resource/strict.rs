//! A `serde` deserializer over a borrowed JSON value that decodes a struct from a JSON
//! object only.
//!
//! `serde_json`'s own value deserializer hands a JSON array to a struct's derived
//! `visit_seq`, which serde generates for formats without field names: the array's
//! elements fill the fields in declaration order, and fields with defaults may be left
//! out. So `"metadata": ["x"]` would decode as the name `x`, and `"status": []` or
//! `"resources": [null, null]` as an empty status or no limits. From a JSON body an array
//! in place of an object is a misshapen field, and the client must hear so, with the
//! field named. Everything else behaves exactly as `serde_json::Value` does.

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, Unexpected, Visitor};
use serde_json::{Error, Value};

/// Deserializes the value it borrows; see the module docs.
pub(super) struct Strict<'a>(pub(super) &'a Value);

fn unexpected(value: &Value) -> Unexpected<'_> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Unexpected::Unsigned(u),
            (_, Some(i), _) => Unexpected::Signed(i),
            (_, _, Some(f)) => Unexpected::Float(f),
            _ => Unexpected::Other("number"),
        },
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

impl<'de> Deserializer<'de> for Strict<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => visitor.visit_u64(u),
                (_, Some(i), _) => visitor.visit_i64(i),
                (_, _, Some(f)) => visitor.visit_f64(f),
                _ => Err(de::Error::invalid_type(unexpected(self.0), &visitor)),
            },
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(items) => {
                let mut seq = Seq(items.iter());
                let value = visitor.visit_seq(&mut seq)?;
                match seq.0.len() {
                    0 => Ok(value),
                    _ => Err(de::Error::invalid_length(items.len(), &"fewer elements in array")),
                }
            }
            Value::Object(map) => {
                let mut entries = Entries { iter: map.iter(), value: None };
                let value = visitor.visit_map(&mut entries)?;
                match entries.iter.len() {
                    0 => Ok(value),
                    _ => Err(de::Error::invalid_length(map.len(), &"fewer elements in map")),
                }
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(_) => Err(de::Error::invalid_type(Unexpected::Seq, &visitor)),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::String(variant) => visitor.visit_enum(BorrowedStrDeserializer::new(variant)),
            Value::Object(map) if map.len() == 1 => {
                let (variant, value) = map.iter().next().expect("one entry");
                visitor.visit_enum(Variant { variant, value })
            }
            Value::Object(_) => Err(de::Error::invalid_value(Unexpected::Map, &"a map with a single key")),
            other => Err(de::Error::invalid_type(unexpected(other), &"a string or a map")),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map identifier
    }
}

struct Seq<'a>(std::slice::Iter<'a, Value>);

impl<'de> de::SeqAccess<'de> for Seq<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        self.0.next().map(|item| seed.deserialize(Strict(item))).transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Entries<'a> {
    iter: serde_json::map::Iter<'a>,
    value: Option<&'a Value>,
}

impl<'de> de::MapAccess<'de> for Entries<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        let Some((key, value)) = self.iter.next() else { return Ok(None) };
        self.value = Some(value);
        seed.deserialize(BorrowedStrDeserializer::new(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        match self.value.take() {
            Some(value) => seed.deserialize(Strict(value)),
            None => Err(de::Error::custom("a map value was asked for before its key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

/// An externally tagged enum variant with content: `{"variant": value}`.
struct Variant<'a> {
    variant: &'a str,
    value: &'a Value,
}

impl<'de> de::EnumAccess<'de> for Variant<'de> {
    type Error = Error;
    type Variant = Strict<'de>;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Strict<'de>), Error> {
        let variant = seed.deserialize(BorrowedStrDeserializer::<Error>::new(self.variant))?;
        Ok((variant, Strict(self.value)))
    }
}

impl<'de> de::VariantAccess<'de> for Strict<'de> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.0 {
            Value::Null => Ok(()),
            other => Err(de::Error::invalid_type(unexpected(other), &"a unit variant")),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(_) => self.deserialize_any(visitor),
            other => Err(de::Error::invalid_type(unexpected(other), &"a tuple variant")),
        }
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_struct("", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::{json, Map};

    use super::*;

    #[derive(Debug, Default, PartialEq, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Limits {
        #[serde(default)]
        cpu_quota: Option<String>,
        #[serde(default)]
        memory_max: Option<String>,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    enum Shape {
        Unit,
        Newtype(u32),
        Tuple(u32, bool),
        Struct { at: String },
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Holder {
        limits: Limits,
        shapes: Vec<Shape>,
        free: Value,
        maybe: Option<Map<String, Value>>,
    }

    fn decode<'a, T: Deserialize<'a>>(value: &'a Value) -> Result<T, String> {
        T::deserialize(Strict(value)).map_err(|e| e.to_string())
    }

    #[test]
    fn decodes_as_serde_json_does() {
        let value = json!({
            "limits": {"cpuQuota": "200%"},
            "shapes": ["Unit", {"Newtype": 3}, {"Tuple": [1, true]}, {"Struct": {"at": "x"}}],
            "free": [1, -2, 2.5, "s", null, {"k": [true]}],
            "maybe": null,
        });
        let strict: Holder = decode(&value).unwrap();
        let lenient = Holder::deserialize(&value).unwrap();
        assert_eq!(strict, lenient);
        assert_eq!(strict.free, value["free"], "a free-form value comes through unchanged");
    }

    #[test]
    fn a_struct_is_never_decoded_from_an_array() {
        for limits in [json!([]), json!([null, null]), json!(["200%", "4G"])] {
            assert!(Limits::deserialize(&limits).is_ok(), "serde_json's own deserializer takes {limits}");
            let err = decode::<Limits>(&limits).unwrap_err();
            assert_eq!(err, "invalid type: sequence, expected struct Limits");
        }
        let variant = json!({"Struct": ["x"]});
        assert_eq!(
            decode::<Shape>(&variant).unwrap_err(),
            "invalid type: sequence, expected struct variant Shape::Struct"
        );
    }

    #[test]
    fn wrong_shapes_are_refused_with_serde_json_s_words() {
        let cases = [
            (json!({"cpuQuota": 5}), "invalid type: integer `5`, expected a string"),
            (json!(7), "invalid type: integer `7`, expected struct Limits"),
            (json!("x"), "invalid type: string \"x\", expected struct Limits"),
        ];
        for (value, want) in cases {
            assert_eq!(decode::<Limits>(&value).unwrap_err(), want, "{value}");
        }
        assert!(decode::<Shape>(&json!({"Unit": 1, "Newtype": 2})).is_err());
        assert!(decode::<Shape>(&json!(["Unit"])).is_err());
    }
}
