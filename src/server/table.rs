//! Server-side printing: the `meta.k8s.io/v1` `Table` that `kubectl get` asks for with
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`.

use axum::http::{header, HeaderMap};
use hive_api::KindInfo;
use serde_json::{json, Map, Value};

/// The content type of a Table response.
pub const TABLE_CONTENT_TYPE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// Whether the client asked for a Table (kubectl's Table Accept header).
pub fn wants_table(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).any(|accept| {
        accept.split(',').any(|media| {
            let params: Vec<&str> = media.split(';').map(str::trim).collect();
            params.contains(&"as=Table")
                && params.contains(&"g=meta.k8s.io")
                && (params.contains(&"v=v1") || params.contains(&"v=v1beta1"))
        })
    })
}

/// What `rows[].object` carries (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    /// Nothing.
    None,
    /// A `PartialObjectMetadata` (the default).
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// Parses the query parameter; absent means `Metadata`.
    pub fn parse(value: Option<&str>) -> Result<IncludeObject, String> {
        match value {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(format!(
                "includeObject: unsupported value {other:?}: supported values are None, Metadata, Object"
            )),
        }
    }
}

/// The column definitions of a kind: Name, the kind's default columns, Age, then the
/// kind's wide (priority 1) columns.
pub fn column_definitions(kind: &KindInfo) -> Vec<Value> {
    let columns = (kind.columns)();
    let mut defs = vec![json!({
        "name": "Name", "type": "string", "format": "name",
        "description": "Name must be unique within the kind. A DNS-1123 label.", "priority": 0
    })];
    let def = |c: &hive_api::Column| json!({"name": c.name, "type": c.type_, "format": "", "description": c.description, "priority": c.priority});
    defs.extend(columns.iter().filter(|c| c.priority == 0).map(def));
    defs.push(json!({
        "name": "Age", "type": "date", "format": "",
        "description": "Time since metadata.creationTimestamp.", "priority": 0
    }));
    defs.extend(columns.iter().filter(|c| c.priority != 0).map(def));
    defs
}

/// One table row for an object, cells in [`column_definitions`] order.
pub fn row(kind: &KindInfo, object: &Value, include: IncludeObject) -> Value {
    let columns = (kind.columns)();
    let cells = (kind.cells)(object);
    let meta = object.get("metadata").unwrap_or(&Value::Null);
    let mut row_cells = vec![meta.get("name").cloned().unwrap_or(Value::Null)];
    let mut wide = Vec::new();
    for (column, cell) in columns.iter().zip(cells) {
        if column.priority == 0 {
            row_cells.push(cell);
        } else {
            wide.push(cell);
        }
    }
    row_cells.push(Value::String(age(meta.get("creationTimestamp").and_then(Value::as_str))));
    row_cells.extend(wide);
    let mut row = Map::new();
    row.insert("cells".into(), Value::Array(row_cells));
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            row.insert("object".into(), partial_metadata(object));
        }
        IncludeObject::Object => {
            row.insert("object".into(), object.clone());
        }
    }
    Value::Object(row)
}

/// The `PartialObjectMetadata` of an object.
pub fn partial_metadata(object: &Value) -> Value {
    let mut meta = object.get("metadata").cloned().unwrap_or(Value::Null);
    if let Some(m) = meta.as_object_mut() {
        m.remove("managedFields");
    }
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
}

/// A Table of `objects`; `with_columns` is false for watch events after the first.
pub fn table(
    kind: &KindInfo,
    objects: &[Value],
    include: IncludeObject,
    list_meta: Value,
    with_columns: bool,
) -> Value {
    let rows: Vec<Value> = objects.iter().map(|o| row(kind, o, include)).collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": if with_columns { Value::Array(column_definitions(kind)) } else { json!([]) },
        "rows": rows,
    })
}

/// Age of an RFC 3339 timestamp as kubectl prints it (`5s`, `3m20s`, `4h`, `12d`).
pub fn age(timestamp: Option<&str>) -> String {
    hive_api::age::age(timestamp, crate::host::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn table_accept_is_recognised() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
            ),
        );
        assert!(wants_table(&headers));
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json, */*"));
        assert!(!wants_table(&headers));
    }
}
