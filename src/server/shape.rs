//! The shape an answer's objects take: as stored, as `PartialObjectMetadata` (what
//! client-go's metadata client, controller-runtime's `OnlyMetadata` and garbage
//! collectors ask for with `Accept: application/json;as=PartialObjectMetadata…`), or as
//! an `events.k8s.io/v1` Event (that group's routes serve the stored core Events).
//! kubectl's `as=Table` is `table.rs`'s; this file only lets it through negotiation.

use axum::http::{header, HeaderMap};
use bytes::Bytes;
use hive_api::resource::KindInfo;
use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};

/// Which group's form a route serves its objects in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// The stored kind's own (`hive.dev/v1`, or core `v1` for Events).
    Stored,
    /// `events.k8s.io/v1` for the stored core Events.
    EventsV1,
}

/// What the answer holds: one object, a list, or a watch's events (each one object).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A get, or the object a write answers with.
    One,
    /// A list.
    List,
    /// A watch: its events carry single objects.
    Watch,
}

/// The shape of the objects in an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// The committed JSON, untouched.
    Stored,
    /// `meta.k8s.io/v1` `PartialObjectMetadata`: apiVersion, kind and metadata only.
    Metadata,
    /// An `events.k8s.io/v1` Event.
    EventsV1,
}

const META_GROUP: &str = "meta.k8s.io";
const META_VERSION: &str = "meta.k8s.io/v1";

impl Shape {
    /// The shape `headers`' `Accept` asks for, in the order the client prefers: the
    /// first entry this server can answer wins (a protobuf one never can). When every
    /// entry names a form it cannot answer in, a 406, as kube-apiserver answers; an
    /// entry it does not know at all (`text/html`, a YAML type) is answered with JSON, as
    /// before.
    pub fn negotiate(headers: &HeaderMap, answer: Answer, form: Form) -> ApiResult<Shape> {
        let stored = match form {
            Form::Stored => Shape::Stored,
            Form::EventsV1 => Shape::EventsV1,
        };
        let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
            return Ok(stored);
        };
        let mut refused = Vec::new();
        for entry in accept.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let mut parts = entry.split(';').map(str::trim);
            let essence = parts.next().unwrap_or_default().to_ascii_lowercase();
            let params: Vec<(String, String)> = parts
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"').to_string()))
                .collect();
            let param = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
            let json = matches!(essence.as_str(), "application/json" | "application/*" | "*/*");
            match param("as") {
                _ if essence == "application/vnd.kubernetes.protobuf" => refused.push(entry),
                None if json => return Ok(stored),
                None => return Ok(stored),
                // kubectl's Table, served by table.rs before the shape is asked for.
                Some("Table") if json => return Ok(stored),
                Some(as_) if json && param("g") == Some(META_GROUP) && param("v") == Some("v1") => {
                    let wanted = match answer {
                        Answer::One | Answer::Watch => "PartialObjectMetadata",
                        Answer::List => "PartialObjectMetadataList",
                    };
                    if as_ == wanted {
                        return Ok(Shape::Metadata);
                    }
                    refused.push(entry);
                }
                Some(_) => refused.push(entry),
            }
        }
        if refused.is_empty() {
            return Ok(stored);
        }
        Err(ApiError::NotAcceptable(format!(
            "only the following media types are accepted: application/json, application/yaml, \
             application/json;as=Table;v=v1;g=meta.k8s.io, \
             application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io, \
             application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io (asked for: {})",
            refused.join(", ")
        )))
    }

    /// The answer's `Content-Type`.
    pub fn content_type(self, answer: Answer) -> &'static str {
        match (self, answer) {
            (Shape::Metadata, Answer::List) => {
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            }
            (Shape::Metadata, _) => "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
            _ => "application/json",
        }
    }

    /// A list's `apiVersion` and `kind`.
    pub fn list_kind(self, kind: &KindInfo) -> (&'static str, &'static str) {
        match self {
            Shape::Stored => (kind.api_version, kind.list_kind),
            Shape::Metadata => (META_VERSION, "PartialObjectMetadataList"),
            Shape::EventsV1 => (hive_api::event::EVENTS_V1, "EventList"),
        }
    }

    /// The `apiVersion` and `kind` of one object in this shape (a watch's bookmarks).
    pub fn object_kind(self, kind: &KindInfo) -> (&'static str, &'static str) {
        match self {
            Shape::Stored => (kind.api_version, kind.kind),
            Shape::Metadata => (META_VERSION, "PartialObjectMetadata"),
            Shape::EventsV1 => (hive_api::event::EVENTS_V1, kind.kind),
        }
    }

    /// One object, given as its JSON value, in this shape.
    pub fn value(self, object: Value) -> Value {
        match self {
            Shape::Stored => object,
            Shape::Metadata => {
                let metadata = match object {
                    Value::Object(mut fields) => fields.remove("metadata").unwrap_or_else(|| json!({})),
                    _ => json!({}),
                };
                json!({"apiVersion": META_VERSION, "kind": "PartialObjectMetadata", "metadata": metadata})
            }
            Shape::EventsV1 => {
                let mut object = object;
                hive_api::event::to_events_v1(&mut object);
                object
            }
        }
    }

    /// One object, given as its committed JSON, in this shape: the same bytes when
    /// stored, else parsed and written again.
    pub fn bytes(self, json: Bytes) -> Bytes {
        if self == Shape::Stored {
            return json;
        }
        match serde_json::from_slice::<Value>(&json) {
            Ok(object) => Bytes::from(serde_json::to_vec(&self.value(object)).unwrap_or_default()),
            // The store holds only JSON it wrote; should it not parse, it goes out as is.
            Err(_) => json,
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn accepting(accept: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        headers
    }

    const METADATA: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

    #[test]
    fn the_first_entry_this_server_answers_wins() {
        let shape = |accept: &str, answer| {
            Shape::negotiate(&accepting(accept), answer, Form::Stored).map_err(|e| e.to_string())
        };
        assert_eq!(shape(METADATA, Answer::One), Ok(Shape::Metadata));
        assert_eq!(shape(METADATA, Answer::Watch), Ok(Shape::Metadata));
        // A list asked with the single form falls through to plain JSON, its last entry.
        assert_eq!(shape(METADATA, Answer::List), Ok(Shape::Stored));
        let list = METADATA.replace("PartialObjectMetadata;", "PartialObjectMetadataList;");
        assert_eq!(shape(&list, Answer::List), Ok(Shape::Metadata));
        assert_eq!(
            shape("application/vnd.kubernetes.protobuf,application/json", Answer::One),
            Ok(Shape::Stored)
        );
        assert_eq!(shape("application/json;as=Table;v=v1;g=meta.k8s.io", Answer::List), Ok(Shape::Stored));
        assert_eq!(shape("text/html", Answer::One), Ok(Shape::Stored));
        let refused = shape("application/vnd.kubernetes.protobuf", Answer::One).unwrap_err();
        assert!(refused.contains("application/vnd.kubernetes.protobuf"), "{refused}");
        assert!(shape("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v2", Answer::One).is_err());
        let events = Shape::negotiate(&accepting("application/json"), Answer::List, Form::EventsV1).unwrap();
        assert_eq!(events, Shape::EventsV1);
    }

    #[test]
    fn metadata_keeps_only_the_metadata() {
        let object = json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"big": 1}});
        let bytes = Shape::Metadata.bytes(Bytes::from(object.to_string()));
        let partial: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            partial,
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {"name": "a", "labels": {"x": "y"}}})
        );
        let same = Bytes::from_static(b"{\"a\":1}");
        assert_eq!(Shape::Stored.bytes(same.clone()), same);
    }
}
