//! Request bodies: a size limit with a `Status` error, JSON or YAML by content type,
//! and parse errors that name the line and column.

use axum::body::Body;
use axum::http::{header, HeaderMap};
use http_body_util::BodyExt;
use serde_json::Value;

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
    /// `application/strategic-merge-patch+json`: not supported for hive kinds.
    StrategicMergePatch,
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
            _ => MediaType::Other,
        }
    }
}

/// An oversized body is read and discarded up to this many bytes, so that the client,
/// still sending, receives the 413 instead of a reset connection. Past it the
/// connection is dropped.
const DRAIN_LIMIT: usize = 16 * 1024 * 1024;

/// Reads the whole body, failing with 413 past [`MAX_BODY_BYTES`].
pub async fn read(body: Body) -> ApiResult<bytes::Bytes> {
    let mut body = body;
    let mut collected = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::BadRequest(format!("failed to read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        seen += data.len();
        if seen > DRAIN_LIMIT {
            break;
        }
        if seen <= MAX_BODY_BYTES {
            collected.extend_from_slice(&data);
        }
    }
    if seen > MAX_BODY_BYTES {
        return Err(ApiError::TooLarge { limit: MAX_BODY_BYTES });
    }
    Ok(collected.freeze())
}

/// Parses a body as JSON, naming the position of a syntax error.
pub fn parse_json(bytes: &[u8]) -> ApiResult<Value> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::BadRequest("the request body is empty; expected a JSON object".into()));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::BadRequest(format!("malformed JSON at line {}, column {}: {e}", e.line(), e.column()))
    })
}

/// Parses a body as YAML (JSON is valid YAML), naming the position of a syntax error.
pub fn parse_yaml(bytes: &[u8]) -> ApiResult<Value> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ApiError::BadRequest(format!("the request body is not UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Err(ApiError::BadRequest("the request body is empty; expected a YAML or JSON object".into()));
    }
    serde_yaml_ng::from_str::<Value>(text).map_err(|e| match e.location() {
        Some(loc) => ApiError::BadRequest(format!(
            "malformed YAML at line {}, column {}: {e}",
            loc.line(),
            loc.column()
        )),
        None => ApiError::BadRequest(format!("malformed YAML: {e}")),
    })
}

/// Parses an object body (`Content-Type` JSON or YAML) and requires a JSON object.
pub fn parse_object(media: MediaType, bytes: &[u8]) -> ApiResult<Value> {
    let value = match media {
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
    if !value.is_object() {
        return Err(ApiError::BadRequest(format!(
            "the request body must be a JSON object, not {}",
            json_type(&value)
        )));
    }
    Ok(value)
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

#[cfg(test)]
mod tests {
    use super::*;

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
