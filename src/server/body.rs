//! Request bodies: a size limit with a `Status` error, JSON or YAML by content type,
//! parse errors that name the line and column, the keys a body gives twice, and the rest
//! of a body nobody read discarded before the answer goes out.

mod duplicates;
mod flow_depth;
pub mod protobuf;

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, BodyDataStream, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::{Stream, StreamExt};
use hive_api::Duplicates;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::oneshot;

use super::error::{ApiError, ApiResult};

/// Largest request body accepted, in bytes (3 MiB, the Kubernetes API server's default).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The media type of a request body, from its `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediaType {
    /// `application/json` (or none given).
    Json,
    /// `application/yaml`.
    Yaml,
    /// `application/merge-patch+json` (RFC 7386).
    MergePatch,
    /// `application/json-patch+json` (RFC 6902).
    JsonPatch,
    /// `application/apply-patch+yaml` (server-side apply; YAML or JSON body).
    ApplyPatch,
    /// `application/strategic-merge-patch+json`: not supported for hive kinds; a merge
    /// patch of a core Event's flat fields.
    StrategicMergePatch,
    /// `application/vnd.kubernetes.protobuf`: for core Events only (`body/protobuf.rs`).
    Protobuf,
    /// Anything else.
    Other,
}

impl MediaType {
    /// Classifies the request's `Content-Type`.
    pub fn of(headers: &HeaderMap) -> MediaType {
        let Some(ct) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
            return MediaType::Json;
        };
        let essence = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        match essence.as_str() {
            "" | "application/json" | "*/*" => MediaType::Json,
            "application/yaml" | "application/x-yaml" | "text/yaml" => MediaType::Yaml,
            "application/merge-patch+json" => MediaType::MergePatch,
            "application/json-patch+json" => MediaType::JsonPatch,
            "application/apply-patch+yaml" | "application/apply-patch+json" => MediaType::ApplyPatch,
            "application/strategic-merge-patch+json" => MediaType::StrategicMergePatch,
            protobuf::PROTOBUF => MediaType::Protobuf,
            _ => MediaType::Other,
        }
    }
}

/// A body the answer does not need (an oversized one, or one the request was refused
/// before reading: a bad parameter, a role that may not write, an unknown path) is read
/// and discarded up to this many bytes, so that a client still sending it receives the
/// answer instead of a reset connection. Past it the connection is dropped.
const DRAIN_LIMIT: usize = 16 * 1024 * 1024;

/// How long a client may take to send the rest of a body nobody reads.
const DRAIN_TIME: Duration = Duration::from_secs(15);

/// Reads the whole body, failing with 413 past [`MAX_BODY_BYTES`] (the rest is left to
/// [`drain_unread`]).
pub async fn read(body: Body) -> ApiResult<bytes::Bytes> {
    let mut body = body;
    let mut collected = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::BadRequest(format!("failed to read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        if collected.len() + data.len() > MAX_BODY_BYTES {
            return Err(ApiError::TooLarge { limit: MAX_BODY_BYTES });
        }
        collected.extend_from_slice(&data);
    }
    Ok(collected.freeze())
}

/// Middleware: when the answer is ready and the request's body was not read to its end,
/// reads and discards the rest (at most [`DRAIN_LIMIT`] bytes within [`DRAIN_TIME`])
/// before answering. A client that sends its whole body before it reads (Python's
/// `requests`, for one) otherwise gets a reset connection in place of the 4xx: the
/// unread bytes make the socket close with a reset.
pub async fn drain_unread(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let (back, mut unread) = oneshot::channel();
    let tracked = Tracked { rest: Some(body.into_data_stream()), back: Some(back) };
    let response = next.run(Request::from_parts(parts, Body::from_stream(tracked))).await;
    if let Ok(mut rest) = unread.try_recv() {
        let discard = async {
            let mut seen = 0usize;
            while let Some(Ok(chunk)) = rest.next().await {
                seen += chunk.len();
                if seen > DRAIN_LIMIT {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(DRAIN_TIME, discard).await;
    }
    response
}

/// A request body that, dropped before its end, hands what is left back to
/// [`drain_unread`].
struct Tracked {
    rest: Option<BodyDataStream>,
    back: Option<oneshot::Sender<BodyDataStream>>,
}

impl Stream for Tracked {
    type Item = Result<bytes::Bytes, axum::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(rest) = self.rest.as_mut() else { return Poll::Ready(None) };
        let next = std::task::ready!(Pin::new(rest).poll_next(cx));
        if next.is_none() {
            self.rest = None;
        }
        Poll::Ready(next)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let (Some(rest), Some(back)) = (self.rest.take(), self.back.take()) {
            let _ = back.send(rest);
        }
    }
}

/// A parsed body: its value (of a key given twice, the last), and the keys it gave twice,
/// for `fieldValidation` to refuse or warn about (`hive_api::admit_body`).
#[derive(Debug)]
pub struct Parsed {
    /// The body as JSON.
    pub value: Value,
    /// The keys it gave more than once.
    pub duplicates: Duplicates,
}

/// Parses a body as JSON, naming the position of a syntax error.
pub fn parse_json(bytes: &[u8]) -> ApiResult<Parsed> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::BadRequest("the request body is empty; expected a JSON object".into()));
    }
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let parsed = duplicates::read(&mut reader).and_then(|read| reader.end().map(|()| read));
    let (value, duplicates) = parsed.map_err(|e| {
        ApiError::BadRequest(format!("malformed JSON at line {}, column {}: {e}", e.line(), e.column()))
    })?;
    Ok(Parsed { value, duplicates })
}

/// Parses a body as YAML (JSON is valid YAML), naming the position of a syntax error.
pub fn parse_yaml(bytes: &[u8]) -> ApiResult<Parsed> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ApiError::BadRequest(format!("the request body is not UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Err(ApiError::BadRequest("the request body is empty; expected a YAML or JSON object".into()));
    }
    // Before the parser, whose time grows with the square of the nesting (see flow_depth).
    flow_depth::check(text).map_err(|line| {
        ApiError::BadRequest(format!(
            "malformed YAML at line {line}: flow collections ([…] or {{…}}) nested more than {} deep",
            flow_depth::MAX_FLOW_DEPTH
        ))
    })?;
    let (value, duplicates) =
        duplicates::read(serde_yaml_ng::Deserializer::from_str(text)).map_err(|e| match e.location() {
            Some(loc) => ApiError::BadRequest(format!(
                "malformed YAML at line {}, column {}: {e}",
                loc.line(),
                loc.column()
            )),
            None => ApiError::BadRequest(format!("malformed YAML: {e}")),
        })?;
    Ok(Parsed { value, duplicates })
}

/// Parses an object body (`Content-Type` JSON or YAML) and requires a JSON object.
pub fn parse_object(media: MediaType, bytes: &[u8]) -> ApiResult<Parsed> {
    let parsed = match media {
        MediaType::Json => parse_json(bytes)?,
        MediaType::Yaml | MediaType::ApplyPatch => parse_yaml(bytes)?,
        _ => {
            return Err(ApiError::UnsupportedMediaType(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json, application/yaml"
                    .into(),
            ))
        }
    };
    if !parsed.value.is_object() {
        return Err(ApiError::BadRequest(format!(
            "the request body must be a JSON object, not {}",
            json_type(&parsed.value)
        )));
    }
    Ok(parsed)
}

/// Decodes a parsed body as `T`, refusing a value of the wrong shape with a 400 that
/// names the field: `{what}: spec.children: invalid type: …`. Fields `T` does not define
/// are ignored unless `T` denies them.
pub fn decode<T: serde::de::DeserializeOwned>(value: &Value, what: &str) -> ApiResult<T> {
    hive_api::resource::decode::<T>(value).map(|(decoded, _unknown)| decoded).map_err(|e| {
        let at = if e.field.is_empty() { String::new() } else { format!("{}: ", e.field) };
        ApiError::BadRequest(format!("{what}: {at}{}", e.message))
    })
}

/// The JSON type name of a value, for messages.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The metadata map of an object (`None` when it has none, or it is not a map).
pub fn metadata_mut(
    object: &mut serde_json::Value,
) -> Option<&mut serde_json::Map<String, serde_json::Value>> {
    object.get_mut("metadata").and_then(serde_json::Value::as_object_mut)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key given twice, by path, whatever the body's form; the last value kept.
    #[test]
    fn keys_given_twice_are_found_by_their_path_in_json_and_yaml() {
        let cases: [(&str, MediaType, &str, &[&str]); 7] = [
            ("none", MediaType::Json, r#"{"a": {"b": 1, "c": [{"d": 1}, {"d": 2}]}}"#, &[]),
            ("top", MediaType::Json, r#"{"a": 1, "b": 2, "a": 3}"#, &["a"]),
            (
                "nested",
                MediaType::Json,
                r#"{"spec": {"nodes": [{"id": "x"}, {"id": "y", "id": "z"}]}}"#,
                &["spec.nodes[1].id"],
            ),
            ("three times", MediaType::Json, r#"{"m": {"k": 1, "k": 2, "k": 3}}"#, &["m.k", "m.k"]),
            (
                "yaml",
                MediaType::Yaml,
                "metadata:\n  labels:\n    app: a\n    app: b\nspec: {x: 1, x: 2}\n",
                &["metadata.labels.app", "spec.x"],
            ),
            ("yaml as apply", MediaType::ApplyPatch, "a:\n- b: 1\n  b: 2\n", &["a[0].b"]),
            ("json as yaml", MediaType::Yaml, r#"{"a": {"b": 1, "b": 2}}"#, &["a.b"]),
        ];
        for (name, media, body, want) in cases {
            let parsed = parse_object(media, body.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut expected = Duplicates::default();
            for field in want {
                expected.record(|| field.to_string());
            }
            assert_eq!(parsed.duplicates, expected, "{name}");
        }
        let parsed = parse_object(MediaType::Json, br#"{"m": {"k": 1, "k": 2, "k": 3}}"#).unwrap();
        assert_eq!(parsed.value, serde_json::json!({"m": {"k": 3}}), "the last value is kept");
    }

    /// Looking for keys given twice changes nothing in what a body parses to.
    #[test]
    fn a_body_parses_to_what_the_plain_parsers_make_of_it() {
        let json = [
            r#"{"a": [1, -2, 3.5, 1e300, 18446744073709551615, 99999999999999999999, null, true, "\u00e9\ud83d\ude00"]}"#,
            r#"{"nested": {"deep": [[[], {}], {"x": {"y": null}}]}, "": "empty key"}"#,
            r#"{"order": {"z": 1, "a": 2, "m": 3}}"#,
        ];
        for text in json {
            let plain: Value = serde_json::from_str(text).unwrap();
            assert_eq!(parse_json(text.as_bytes()).unwrap().value, plain, "{text}");
        }
        let yaml = [
            "a: 1\nb: [x, 'y', \"z\"]\nc: ~\nd: .nan\ne: 0x1F\nf: 1.5e3\ng: yes\n",
            "1: one\ntrue: t\nnull: n\n3.5: f\n",
            "base: &b {x: 1}\nuse: *b\nbig: 340282366920938463463374607431768211455\nneg: -170141183460469231731687303715884105728\n",
            "text: |\n  two\n  lines\nfolded: >\n  one\n  line\n",
        ];
        for text in yaml {
            let plain: Result<Value, _> = serde_yaml_ng::from_str(text);
            match (plain, parse_yaml(text.as_bytes())) {
                (Ok(plain), Ok(parsed)) => assert_eq!(parsed.value, plain, "{text}"),
                (Err(_), Err(_)) => {}
                (plain, parsed) => panic!("{text}: the plain parser says {plain:?}, this one {parsed:?}"),
            }
        }
        for refused in ["a: !tag 1\n", "? [a]\n: b\n", "a: 1\n---\nb: 2\n", "a: *nowhere\n"] {
            assert!(serde_yaml_ng::from_str::<Value>(refused).is_err(), "{refused}");
            assert!(parse_yaml(refused.as_bytes()).is_err(), "{refused}");
        }
        for refused in [r#"{"a": 1} {"b": 2}"#, r#"{"a": 1,}"#, "[1, 2"] {
            assert!(parse_json(refused.as_bytes()).is_err(), "{refused}");
        }
    }

    /// Nesting past the parsers' limit is a 400, not a stack overflow; and a key given
    /// twice under a hundred levels of long keys is named by a path cut short.
    #[test]
    fn deep_or_long_bodies_are_bounded_work() {
        for depth in [200, 100_000] {
            let json = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let err = parse_json(json.as_bytes()).unwrap_err().to_string();
            assert!(err.contains("recursion limit exceeded"), "{err}");
            // 100,000 nested flow mappings took libyaml over a minute to read before the
            // depth was checked.
            let nested = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
            let started = std::time::Instant::now();
            let err = parse_yaml(nested.as_bytes()).unwrap_err().to_string();
            assert!(err.contains("nested more than 128 deep"), "{err}");
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
        }
        // (YAML allows keys of at most 1,024 characters.)
        let key = "k".repeat(1000);
        let mut body = String::from("\"x\": 1, \"x\": 2");
        for _ in 0..100 {
            body = format!("\"{key}\": {{{body}}}");
        }
        let body = format!("{{{body}}}");
        for parsed in [parse_json(body.as_bytes()), parse_yaml(body.as_bytes())] {
            let warnings = parsed.unwrap().duplicates.warnings();
            assert_eq!(warnings.len(), 1);
            let named = &warnings[0];
            assert!(named.starts_with("duplicate field \"kkk") && named.ends_with("…\""), "{named:.80}");
            assert!(named.len() < duplicates::MAX_PATH_BYTES + 64, "{} bytes", named.len());
        }
    }

    #[test]
    fn json_errors_name_the_position() {
        let err = parse_json(b"{\n  \"a\": ,\n}").unwrap_err();
        assert!(err.to_string().contains("line 2, column 8"), "{err}");
    }

    #[test]
    fn yaml_errors_name_the_position() {
        let err = parse_yaml(b"a: b\n  c: : d\n").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn decode_names_the_misshapen_field() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Options {
            preconditions: Option<Preconditions>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Preconditions {
            uid: Option<String>,
        }
        let cases = [
            (
                serde_json::json!({"preconditions": {"uid": 5}}),
                "opts: preconditions.uid: invalid type: integer `5`",
            ),
            (serde_json::json!({"preconditions": ["u"]}), "opts: preconditions: invalid type: sequence"),
        ];
        for (value, want) in cases {
            let err = decode::<Options>(&value, "opts").unwrap_err().to_string();
            assert!(err.starts_with(want), "{value}: {err}");
        }
    }

    #[test]
    fn non_objects_are_rejected() {
        let err = parse_object(MediaType::Json, b"[1]").unwrap_err();
        assert_eq!(err.to_string(), "the request body must be a JSON object, not an array");
    }
}
