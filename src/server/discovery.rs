//! Discovery: `/version`, `/apis` (`APIGroupList`) and `/apis/hive.dev/v1`
//! (`APIResourceList`), the documents kubectl reads before anything else.
//!
//! The legacy documents are served whatever the `Accept` header asks for: kubectl 1.32
//! first asks for aggregated discovery, and falls back to these when the response's
//! content type is plain JSON (a 406 would be fatal, see kubectl-wire.md §1).

use axum::Json;
use serde_json::{json, Value};

/// `GET /version`: unauthenticated, as wrappers call it before sending credentials.
pub async fn version() -> Json<Value> {
    Json(version_info())
}

/// The version document.
pub fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": format!("v1.32.0-hive.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    })
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// `GET /apis`.
pub async fn api_groups() -> Json<Value> {
    let gv = json!({"groupVersion": hive_api::meta::API_VERSION, "version": hive_api::meta::VERSION});
    Json(json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [{"name": hive_api::meta::GROUP, "versions": [gv], "preferredVersion": gv}],
    }))
}

/// `GET /apis/hive.dev`.
pub async fn api_group() -> Json<Value> {
    let gv = json!({"groupVersion": hive_api::meta::API_VERSION, "version": hive_api::meta::VERSION});
    Json(json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": hive_api::meta::GROUP,
        "versions": [gv],
        "preferredVersion": gv,
    }))
}

/// `GET /apis/hive.dev/v1`.
pub async fn api_resources() -> Json<Value> {
    Json(resource_list())
}

/// The `APIResourceList` of the group: every kind with its status subresource.
pub fn resource_list() -> Value {
    let mut resources = Vec::new();
    for kind in hive_api::kinds() {
        resources.push(json!({
            "name": kind.plural,
            "singularName": kind.singular,
            "namespaced": false,
            "kind": kind.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            "shortNames": kind.short_names,
            "categories": ["hive"],
        }));
        resources.push(json!({
            "name": format!("{}/status", kind.plural),
            "singularName": "",
            "namespaced": false,
            "kind": kind.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": hive_api::meta::API_VERSION,
        "resources": resources,
    })
}
