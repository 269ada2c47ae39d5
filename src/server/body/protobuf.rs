//! Request bodies in Kubernetes' protobuf encoding, as client-go's typed clientset sends
//! built-in kinds (`Content-Type: application/vnd.kubernetes.protobuf`): the 4-byte magic
//! `k8s\0`, then a `runtime.Unknown` (typeMeta 1 {apiVersion 1, kind 2}, raw 2,
//! contentEncoding 3, contentType 4) whose `raw` is the object's message. Only the kinds
//! hive serves that have a protobuf form are read — the core `v1` Event and the
//! `events.k8s.io/v1` Event — into the JSON admission reads, field numbers as
//! k8s.io/api's `generated.proto` gives them. Answers stay JSON (those clients accept
//! it). Unknown fields are skipped, as protobuf readers do; anything misshapen is a 400
//! that says at which byte.

use chrono::{DateTime, SecondsFormat};
use serde_json::{Map, Value};

use crate::server::error::{ApiError, ApiResult};

/// The media type.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// A field's type, as far as these messages need.
#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    Message(&'static [Field]),
    /// `metav1.Time`: seconds and nanos, written to the second.
    Time,
    /// `metav1.MicroTime`: written to the microsecond.
    MicroTime,
    /// `map<string, string>`: repeated entries {key 1, value 2}.
    Map,
    Strings,
    Messages(&'static [Field]),
}

struct Field {
    number: u64,
    name: &'static str,
    ty: Ty,
}

const fn f(number: u64, name: &'static str, ty: Ty) -> Field {
    Field { number, name, ty }
}

const OWNER_REFERENCE: &[Field] = &[
    f(1, "kind", Ty::Str),
    f(3, "name", Ty::Str),
    f(4, "uid", Ty::Str),
    f(5, "apiVersion", Ty::Str),
    f(6, "controller", Ty::Bool),
    f(7, "blockOwnerDeletion", Ty::Bool),
];

/// `ObjectMeta` without the server-owned fields a client's write does not set
/// (selfLink, deletion, managedFields): those are skipped as unknown.
const OBJECT_META: &[Field] = &[
    f(1, "name", Ty::Str),
    f(2, "generateName", Ty::Str),
    f(3, "namespace", Ty::Str),
    f(5, "uid", Ty::Str),
    f(6, "resourceVersion", Ty::Str),
    f(7, "generation", Ty::Int),
    f(8, "creationTimestamp", Ty::Time),
    f(11, "labels", Ty::Map),
    f(12, "annotations", Ty::Map),
    f(13, "ownerReferences", Ty::Messages(OWNER_REFERENCE)),
    f(14, "finalizers", Ty::Strings),
];

const OBJECT_REFERENCE: &[Field] = &[
    f(1, "kind", Ty::Str),
    f(2, "namespace", Ty::Str),
    f(3, "name", Ty::Str),
    f(4, "uid", Ty::Str),
    f(5, "apiVersion", Ty::Str),
    f(6, "resourceVersion", Ty::Str),
    f(7, "fieldPath", Ty::Str),
];

const EVENT_SOURCE: &[Field] = &[f(1, "component", Ty::Str), f(2, "host", Ty::Str)];

const EVENT_SERIES: &[Field] = &[f(1, "count", Ty::Int), f(2, "lastObservedTime", Ty::MicroTime)];

/// `k8s.io/api/core/v1` `Event`.
const CORE_EVENT: &[Field] = &[
    f(1, "metadata", Ty::Message(OBJECT_META)),
    f(2, "involvedObject", Ty::Message(OBJECT_REFERENCE)),
    f(3, "reason", Ty::Str),
    f(4, "message", Ty::Str),
    f(5, "source", Ty::Message(EVENT_SOURCE)),
    f(6, "firstTimestamp", Ty::Time),
    f(7, "lastTimestamp", Ty::Time),
    f(8, "count", Ty::Int),
    f(9, "type", Ty::Str),
    f(10, "eventTime", Ty::MicroTime),
    f(11, "series", Ty::Message(EVENT_SERIES)),
    f(12, "action", Ty::Str),
    f(13, "related", Ty::Message(OBJECT_REFERENCE)),
    f(14, "reportingComponent", Ty::Str),
    f(15, "reportingInstance", Ty::Str),
];

/// `k8s.io/api/events/v1` `Event`.
const EVENTS_V1_EVENT: &[Field] = &[
    f(1, "metadata", Ty::Message(OBJECT_META)),
    f(2, "eventTime", Ty::MicroTime),
    f(3, "series", Ty::Message(EVENT_SERIES)),
    f(4, "reportingController", Ty::Str),
    f(5, "reportingInstance", Ty::Str),
    f(6, "action", Ty::Str),
    f(7, "reason", Ty::Str),
    f(8, "regarding", Ty::Message(OBJECT_REFERENCE)),
    f(9, "related", Ty::Message(OBJECT_REFERENCE)),
    f(10, "note", Ty::Str),
    f(11, "type", Ty::Str),
    f(12, "deprecatedSource", Ty::Message(EVENT_SOURCE)),
    f(13, "deprecatedFirstTimestamp", Ty::Time),
    f(14, "deprecatedLastTimestamp", Ty::Time),
    f(15, "deprecatedCount", Ty::Int),
];

const MAP_ENTRY: &[Field] = &[f(1, "key", Ty::Str), f(2, "value", Ty::Str)];

const TYPE_META: &[Field] = &[f(1, "apiVersion", Ty::Str), f(2, "kind", Ty::Str)];

/// Decodes a protobuf body of an Event into its JSON, in the shape of the group whose
/// `apiVersion` it names (`v1` or `events.k8s.io/v1`), which must be `expected`.
pub fn decode_event(bytes: &[u8], expected: &str) -> ApiResult<Value> {
    let unknown = bytes.strip_prefix(MAGIC).ok_or_else(|| {
        bad(0, "the body does not start with the Kubernetes protobuf magic \"k8s\\x00\"".into())
    })?;
    let mut reader = Reader { bytes: unknown, at: 0, offset: MAGIC.len() };
    let (mut type_meta, mut raw, mut encoding) = (Value::Null, None, String::new());
    while let Some((number, wire)) = reader.key()? {
        match number {
            1 => type_meta = reader.message(wire, TYPE_META)?,
            2 => raw = Some(reader.len_delimited(wire)?),
            3 => encoding = reader.string(wire)?,
            _ => reader.skip(wire)?,
        }
    }
    if !encoding.is_empty() {
        return Err(ApiError::UnsupportedMediaType(format!(
            "protobuf contentEncoding {encoding:?} is not supported: send the object unencoded, or as application/json"
        )));
    }
    let api_version = type_meta.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = type_meta.get("kind").and_then(Value::as_str).unwrap_or_default();
    let schema = match (api_version, kind) {
        ("v1", "Event") => CORE_EVENT,
        (hive_api::event::EVENTS_V1, "Event") => EVENTS_V1_EVENT,
        _ => {
            return Err(ApiError::UnsupportedMediaType(format!(
                "{PROTOBUF} is accepted for core v1 and events.k8s.io/v1 Events only, not {api_version:?} {kind:?}: \
                 send it as application/json"
            )))
        }
    };
    if api_version != expected {
        return Err(ApiError::BadRequest(format!(
            "the body's apiVersion {api_version:?} is not {expected:?}, the version of the path it was sent to"
        )));
    }
    let (raw, raw_offset) =
        raw.ok_or_else(|| bad(reader.offset, "the envelope has no raw object (field 2)".into()))?;
    let mut object = Reader { bytes: raw, at: 0, offset: raw_offset }.fields(schema)?;
    if let Value::Object(fields) = &mut object {
        fields.insert("apiVersion".into(), Value::String(api_version.into()));
        fields.insert("kind".into(), Value::String(kind.into()));
    }
    Ok(object)
}

fn bad(at: usize, why: String) -> ApiError {
    ApiError::BadRequest(format!("malformed protobuf body at byte {at}: {why}"))
}

/// Wire types.
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;
const FIXED32: u64 = 5;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Where `bytes` starts in the whole body, for errors.
    offset: usize,
}

impl<'a> Reader<'a> {
    fn here(&self) -> usize {
        self.offset + self.at
    }

    fn varint(&mut self) -> ApiResult<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .bytes
                .get(self.at)
                .ok_or_else(|| bad(self.here(), "the body ends inside a number".into()))?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(bad(self.here(), "a number longer than 10 bytes".into()))
    }

    /// The next field's number and wire type, or `None` at the end.
    fn key(&mut self) -> ApiResult<Option<(u64, u64)>> {
        if self.at == self.bytes.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        if key >> 3 == 0 {
            return Err(bad(self.here(), "field number 0".into()));
        }
        Ok(Some((key >> 3, key & 7)))
    }

    fn take(&mut self, n: usize) -> ApiResult<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len()).ok_or_else(|| {
            bad(self.here(), format!("a field of {n} bytes runs past the end of its message"))
        })?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn expect(&self, wire: u64, want: u64) -> ApiResult<()> {
        if wire != want {
            return Err(bad(self.here(), format!("wire type {wire} where {want} was expected")));
        }
        Ok(())
    }

    /// A length-delimited field and where it starts in the body.
    fn len_delimited(&mut self, wire: u64) -> ApiResult<(&'a [u8], usize)> {
        self.expect(wire, LEN)?;
        let len = usize::try_from(self.varint()?).unwrap_or(usize::MAX);
        let start = self.here();
        Ok((self.take(len)?, start))
    }

    fn string(&mut self, wire: u64) -> ApiResult<String> {
        let (bytes, start) = self.len_delimited(wire)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| bad(start, "a string that is not UTF-8".into()))
    }

    fn message(&mut self, wire: u64, schema: &'static [Field]) -> ApiResult<Value> {
        let (bytes, start) = self.len_delimited(wire)?;
        Reader { bytes, at: 0, offset: start }.fields(schema)
    }

    fn skip(&mut self, wire: u64) -> ApiResult<()> {
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8).map(drop),
            LEN => self.len_delimited(wire).map(drop),
            FIXED32 => self.take(4).map(drop),
            other => Err(bad(self.here(), format!("unsupported wire type {other}"))),
        }
    }

    /// A whole message by `schema`. Nesting is bounded by the schemas (none refers to
    /// itself), so a body cannot make this recurse deeper than they do.
    fn fields(mut self, schema: &'static [Field]) -> ApiResult<Value> {
        let mut out = Map::new();
        while let Some((number, wire)) = self.key()? {
            let Some(field) = schema.iter().find(|f| f.number == number) else {
                self.skip(wire)?;
                continue;
            };
            let value = match field.ty {
                Ty::Str => Value::String(self.string(wire)?),
                Ty::Int => {
                    self.expect(wire, VARINT)?;
                    // int32 and int64 are two's complement in 64 bits.
                    Value::from(self.varint()? as i64)
                }
                Ty::Bool => {
                    self.expect(wire, VARINT)?;
                    Value::Bool(self.varint()? != 0)
                }
                Ty::Message(inner) => self.message(wire, inner)?,
                Ty::Time | Ty::MicroTime => match self.time(wire, matches!(field.ty, Ty::MicroTime))? {
                    Some(time) => Value::String(time),
                    // A zero time is written as an empty message: JSON's null.
                    None => continue,
                },
                Ty::Map => {
                    let entry = self.message(wire, MAP_ENTRY)?;
                    let map = out.entry(field.name).or_insert_with(|| Value::Object(Map::new()));
                    let key = entry.get("key").and_then(Value::as_str).unwrap_or_default().to_string();
                    let value = entry.get("value").cloned().unwrap_or_else(|| Value::String(String::new()));
                    if let Value::Object(map) = map {
                        map.insert(key, value);
                    }
                    continue;
                }
                Ty::Strings | Ty::Messages(_) => {
                    let item = match field.ty {
                        Ty::Messages(inner) => self.message(wire, inner)?,
                        _ => Value::String(self.string(wire)?),
                    };
                    if let Value::Array(items) =
                        out.entry(field.name).or_insert_with(|| Value::Array(Vec::new()))
                    {
                        items.push(item);
                    }
                    continue;
                }
            };
            out.insert(field.name.into(), value);
        }
        Ok(Value::Object(out))
    }

    fn time(&mut self, wire: u64, micro: bool) -> ApiResult<Option<String>> {
        let (bytes, start) = self.len_delimited(wire)?;
        let mut inner = Reader { bytes, at: 0, offset: start };
        let (mut seconds, mut nanos) = (0i64, 0i64);
        while let Some((number, wire)) = inner.key()? {
            match number {
                1 | 2 => {
                    inner.expect(wire, VARINT)?;
                    let value = inner.varint()? as i64;
                    if number == 1 {
                        seconds = value;
                    } else {
                        nanos = value;
                    }
                }
                _ => inner.skip(wire)?,
            }
        }
        if bytes.is_empty() {
            return Ok(None);
        }
        let nanos = u32::try_from(nanos).ok().filter(|n| *n < 1_000_000_000);
        let time = nanos
            .and_then(|n| DateTime::from_timestamp(seconds, n))
            .ok_or_else(|| bad(start, format!("a time out of range: {seconds} s")))?;
        let format = if micro { SecondsFormat::Micros } else { SecondsFormat::Secs };
        Ok(Some(time.to_rfc3339_opts(format, true)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn field(out: &mut Vec<u8>, number: u64, bytes: &[u8]) {
        varint(out, (number << 3) | 2);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }

    fn envelope(api_version: &str, raw: &[u8]) -> Vec<u8> {
        let mut type_meta = Vec::new();
        field(&mut type_meta, 1, api_version.as_bytes());
        field(&mut type_meta, 2, b"Event");
        let mut out = MAGIC.to_vec();
        field(&mut out, 1, &type_meta);
        field(&mut out, 2, raw);
        out
    }

    #[test]
    fn an_event_decodes_with_unknown_fields_skipped_and_zero_times_left_out() {
        let mut meta = Vec::new();
        field(&mut meta, 1, b"a.1");
        let mut raw = Vec::new();
        field(&mut raw, 1, &meta);
        field(&mut raw, 3, b"Synced");
        field(&mut raw, 6, b""); // a zero firstTimestamp
        field(&mut raw, 99, b"from a newer Kubernetes");
        varint(&mut raw, 8 << 3);
        varint(&mut raw, 7);
        let value = decode_event(&envelope("v1", &raw), "v1").unwrap();
        assert_eq!(
            value,
            serde_json::json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "a.1"}, "reason": "Synced", "count": 7})
        );
    }

    #[test]
    fn misshapen_bodies_are_400s_that_say_where_and_never_panic() {
        let mut raw = Vec::new();
        field(&mut raw, 3, b"Synced");
        let whole = envelope("v1", &raw);
        for cut in 0..whole.len() {
            // Every prefix either decodes (it ended between fields) or is refused.
            let _ = decode_event(&whole[..cut], "v1");
        }
        let err = decode_event(&whole[..whole.len() - 2], "v1").unwrap_err().to_string();
        assert!(err.contains("malformed protobuf body at byte"), "{err}");
        assert!(decode_event(b"{\"json\": true}", "v1").unwrap_err().to_string().contains("magic"));
        let mut long = envelope("v1", &raw);
        long.extend_from_slice(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert!(decode_event(&long, "v1").is_err());
        let err = decode_event(&envelope("events.k8s.io/v1", &raw), "v1").unwrap_err().to_string();
        assert!(err.contains("path"), "{err}");
    }
}
