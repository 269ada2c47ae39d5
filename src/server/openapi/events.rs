//! The OpenAPI v3 documents of the two groups that serve Events: the core `v1`
//! (`/openapi/v3/api/v1`) and `events.k8s.io/v1` (`/openapi/v3/apis/events.k8s.io/v1`),
//! each with its routes, cluster-wide and namespaced, and its `Event` schema (the
//! `events.k8s.io` one renamed field by field from the core one, as the server converts
//! them). Every operation and schema carries `x-kubernetes-group-version-kind`, as
//! kubectl looks them up.

use serde_json::{json, Map, Value};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(components(schemas(hive_api::event::Event, hive_api::event::EventList, hive_api::meta::Status)))]
struct EventsDoc;

/// Which group's document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// The core group, `v1`.
    Core,
    /// `events.k8s.io/v1`.
    EventsV1,
}

impl Group {
    /// Both, in the order the index lists them.
    pub const ALL: [Group; 2] = [Group::Core, Group::EventsV1];

    /// The index key and path below `/openapi/v3/`: `api/v1`, `apis/events.k8s.io/v1`.
    pub fn path(self) -> &'static str {
        match self {
            Group::Core => "api/v1",
            Group::EventsV1 => "apis/events.k8s.io/v1",
        }
    }

    /// The checked-in file under `openapi/`.
    pub fn file(self) -> &'static str {
        match self {
            Group::Core => "api_v1.json",
            Group::EventsV1 => "events.k8s.io_v1.json",
        }
    }

    fn group(self) -> &'static str {
        match self {
            Group::Core => "",
            Group::EventsV1 => "events.k8s.io",
        }
    }
}

fn gvk(group: Group, kind: &str) -> Value {
    json!({"group": group.group(), "version": "v1", "kind": kind})
}

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn answer(description: &str, schema: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": reference(schema)}}})
}

fn path_parameter(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "description": description, "schema": {"type": "string"}})
}

fn query_parameters(action: &str) -> Vec<Value> {
    let query = |name: &str, description: &str| json!({"name": name, "in": "query", "description": description, "schema": {"type": "string"}, "allowEmptyValue": true});
    match action {
        "list" => vec![
            query("labelSelector", "Select events by label."),
            query("fieldSelector", "Select events by field: `involvedObject.name=…`, `reason=…`, `type=…`, `metadata.namespace=…`."),
            query("watch", "`true` streams changes as watch events, one JSON object per line."),
            query("resourceVersion", "Where a list or watch starts."),
            query("limit", "At most this many events per page."),
            query("continue", "The token of the next page."),
        ],
        "post" | "put" | "patch" => vec![
            query("dryRun", "`All`: validate and answer, store nothing."),
            query("fieldManager", "The manager the write is recorded for."),
            query("fieldValidation", "`Strict`, `Warn` or `Ignore` unknown and duplicate fields."),
        ],
        _ => Vec::new(),
    }
}

fn operation(
    group: Group,
    action: &str,
    summary: &str,
    parameters: &[Value],
    body: bool,
    ok: Value,
) -> Value {
    let mut all: Vec<Value> = parameters.to_vec();
    all.extend(query_parameters(action));
    let mut op = json!({
        "summary": summary,
        "operationId": format!("{action}Event"),
        "parameters": all,
        "responses": {"200": ok, "default": answer("A Status naming what went wrong.", "Status")},
        "x-kubernetes-group-version-kind": gvk(group, "Event"),
        "x-kubernetes-action": action,
    });
    if body {
        let types = match action {
            "patch" => vec![
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
                "application/json-patch+json",
                "application/apply-patch+yaml",
            ],
            _ => vec!["application/json", "application/yaml", "application/vnd.kubernetes.protobuf"],
        };
        let schema = if action == "patch" { json!({"type": "object"}) } else { reference("Event") };
        let content: Map<String, Value> =
            types.into_iter().map(|t| (t.to_string(), json!({"schema": schema}))).collect();
        op["requestBody"] = json!({"required": true, "content": content});
    }
    if action == "post" {
        op["responses"]["201"] = answer("Created.", "Event");
    }
    op
}

/// The document of `group`.
pub fn document(group: Group) -> Value {
    let prefix = match group {
        Group::Core => "/api/v1",
        Group::EventsV1 => "/apis/events.k8s.io/v1",
    };
    let namespace = path_parameter(
        "namespace",
        "The namespace (hive's own events have none and show in every namespace).",
    );
    let name = path_parameter("name", "The event's name, a DNS subdomain.");
    let collection = |params: &[Value]| {
        json!({
            "get": operation(group, "list", "List or watch events.", params, false, answer("The events.", "EventList")),
            "post": operation(group, "post", "Record an event.", params, true, answer("The event as stored.", "Event")),
        })
    };
    let item = |params: &[Value]| {
        json!({
            "get": operation(group, "get", "Read an event.", params, false, answer("The event.", "Event")),
            "put": operation(group, "put", "Replace an event.", params, true, answer("The event as stored.", "Event")),
            "patch": operation(group, "patch", "Patch an event (a strategic-merge patch is a merge patch).", params, true, answer("The event as stored.", "Event")),
            "delete": operation(group, "delete", "Delete an event.", params, false, answer("The event as it was.", "Event")),
        })
    };
    let mut paths = Map::new();
    paths.insert(format!("{prefix}/events"), collection(&[]));
    if group == Group::Core {
        paths.insert(format!("{prefix}/events/{{name}}"), item(std::slice::from_ref(&name)));
    } else if let Some(list) = collection(&[]).get("get") {
        // events.k8s.io serves its cluster-wide path for reads only.
        paths.insert(format!("{prefix}/events"), json!({"get": list}));
    }
    paths.insert(
        format!("{prefix}/namespaces/{{namespace}}/events"),
        collection(std::slice::from_ref(&namespace)),
    );
    paths.insert(format!("{prefix}/namespaces/{{namespace}}/events/{{name}}"), item(&[namespace, name]));

    let mut schemas = serde_json::to_value(EventsDoc::openapi().components.unwrap_or_default().schemas)
        .unwrap_or_else(|_| json!({}));
    if let Some(schemas) = schemas.as_object_mut() {
        for schema in schemas.values_mut() {
            super::flatten_nullable(schema);
        }
        if group == Group::EventsV1 {
            for name in ["Event"] {
                if let Some(properties) =
                    schemas.get_mut(name).and_then(|s| s.get_mut("properties")).and_then(Value::as_object_mut)
                {
                    for (core, v1) in hive_api::event::EVENTS_V1_RENAMES {
                        if let Some(property) = properties.remove(*core) {
                            properties.insert((*v1).into(), property);
                        }
                    }
                }
            }
        }
        let api_version = match group {
            Group::Core => "v1",
            Group::EventsV1 => hive_api::event::EVENTS_V1,
        };
        for kind in ["Event", "EventList"] {
            if let Some(schema) = schemas.get_mut(kind).and_then(Value::as_object_mut) {
                schema.insert("x-kubernetes-group-version-kind".into(), json!([gvk(group, kind)]));
                if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
                    for (field, value) in [("apiVersion", api_version), ("kind", kind)] {
                        if let Some(property) = properties.get_mut(field).and_then(Value::as_object_mut) {
                            property.insert("enum".into(), json!([value]));
                        }
                    }
                }
            }
        }
    }
    let title = match group {
        Group::Core => "Events of the core group, v1.",
        Group::EventsV1 => "Events of the group events.k8s.io, v1: the core Events in that group's shape.",
    };
    json!({
        "openapi": "3.0.0",
        "info": {"title": "hive", "description": title, "version": "v1"},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"BearerToken": {"type": "http", "scheme": "bearer", "description": "A hive token: the kubeconfig's, or one `hive token create` printed."}},
        },
        "security": [{"BearerToken": []}],
    })
}
