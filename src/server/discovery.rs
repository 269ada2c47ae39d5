//! Discovery: `/version`, `/apis` (hive.dev and events.k8s.io) and `/apis/hive.dev/v1`,
//! the documents kubectl reads before anything else.
//!
//! `/apis` (and the core group's `/api`, see `events.rs`) answer aggregated discovery —
//! one `APIGroupDiscoveryList` of `apidiscovery.k8s.io/v2` naming every resource with its
//! verbs and subresources — when the `Accept` header asks for it, as kubectl 1.32 does
//! first; any other `Accept` gets the legacy `APIGroupList` as plain JSON (never a 406,
//! which kubectl treats as fatal, see kubectl-wire.md §1). Both are built from one
//! description of the resources ([`resources`]), so they cannot disagree.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// The content type of an aggregated discovery answer (what kubectl checks before it
/// reads the body as an `APIGroupDiscoveryList`).
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

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

/// `GET /apis`: aggregated discovery of `hive.dev` when asked for, else the legacy
/// `APIGroupList`.
pub async fn api_groups(headers: HeaderMap) -> Response {
    if wants_aggregated(&headers) {
        return aggregated(vec![
            group_discovery(hive_api::meta::GROUP, hive_api::meta::VERSION, &hive_resources()),
            group_discovery(EVENTS_GROUP, "v1", &events_resource()),
        ]);
    }
    let gv = json!({"groupVersion": hive_api::meta::API_VERSION, "version": hive_api::meta::VERSION});
    let events = json!({"groupVersion": hive_api::event::EVENTS_V1, "version": "v1"});
    vary_accept(
        Json(json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {"name": hive_api::meta::GROUP, "versions": [gv], "preferredVersion": gv},
                {"name": EVENTS_GROUP, "versions": [events], "preferredVersion": events},
            ],
        }))
        .into_response(),
    )
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

/// The `APIResourceList` of the group: every kind with its subresources.
pub fn resource_list() -> Value {
    legacy_resource_list(hive_api::meta::API_VERSION, &hive_resources())
}

/// One resource as discovery describes it.
pub struct Resource {
    /// Plural name, as in URLs: `agents`.
    pub plural: &'static str,
    /// Singular name: `agent`.
    pub singular: &'static str,
    /// Kind of its objects: `Agent`.
    pub kind: &'static str,
    /// Short names kubectl accepts: `ag`.
    pub short_names: &'static [&'static str],
    /// Categories (`kubectl get hive`).
    pub categories: &'static [&'static str],
    /// The verbs served on the resource.
    pub verbs: &'static [&'static str],
    /// Subresources served under `{plural}/{name}/`, each with its verbs.
    pub subresources: Vec<(&'static str, &'static [&'static str])>,
    /// Whether its routes take a namespace (events); hive's kinds are cluster-scoped.
    pub namespaced: bool,
}

/// The group that serves the core Events again in its own shape.
pub const EVENTS_GROUP: &str = "events.k8s.io";

/// The one resource of the core group and of `events.k8s.io`: events, namespaced as in
/// Kubernetes.
pub fn events_resource() -> Vec<Resource> {
    vec![Resource {
        plural: "events",
        singular: "event",
        kind: "Event",
        short_names: &["ev"],
        categories: &[],
        verbs: VERBS,
        subresources: Vec::new(),
        namespaced: true,
    }]
}

/// The verbs of every hive resource (and of core events).
pub const VERBS: &[&str] = &["create", "delete", "get", "list", "patch", "update", "watch"];
const STATUS_VERBS: &[&str] = &["get", "patch", "update"];

/// Every resource of `hive.dev/v1`, with the subresources the server routes: `status` on
/// every kind, `log` on agents and jobs, `cancel` (a POST, so `create`) on jobs.
pub fn hive_resources() -> Vec<Resource> {
    hive_api::kinds()
        .iter()
        .map(|kind| {
            let mut subresources = vec![("status", STATUS_VERBS)];
            match kind.plural {
                "agents" => subresources.push(("log", &["get"])),
                "jobs" => {
                    subresources.push(("log", &["get"]));
                    subresources.push(("cancel", &["create"]));
                }
                _ => {}
            }
            Resource {
                plural: kind.plural,
                singular: kind.singular,
                kind: kind.kind,
                short_names: kind.short_names,
                categories: &["hive"],
                verbs: VERBS,
                subresources,
                namespaced: false,
            }
        })
        .collect()
}

/// The legacy `APIResourceList` of `group_version` (`hive.dev/v1`, or `v1` for the core
/// group): each resource, then each of its subresources as `plural/sub`.
pub fn legacy_resource_list(group_version: &str, resources: &[Resource]) -> Value {
    let mut out = Vec::new();
    for r in resources {
        out.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs,
            "shortNames": r.short_names,
            "categories": r.categories,
        }));
        for (sub, verbs) in &r.subresources {
            out.push(json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": verbs,
            }));
        }
    }
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": out,
    })
}

/// One `APIGroupDiscovery` (`group` is empty for the core group): its one version, with
/// each resource's scope.
pub fn group_discovery(group: &str, version: &str, resources: &[Resource]) -> Value {
    let response_kind = |kind: &str| json!({"group": group, "version": version, "kind": kind});
    let resources: Vec<Value> = resources
        .iter()
        .map(|r| {
            let subresources: Vec<Value> = r
                .subresources
                .iter()
                .map(|(sub, verbs)| json!({"subresource": sub, "responseKind": response_kind(r.kind), "verbs": verbs}))
                .collect();
            let mut entry = json!({
                "resource": r.plural,
                "responseKind": response_kind(r.kind),
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": r.singular,
                "verbs": r.verbs,
                "categories": r.categories,
                "subresources": subresources,
            });
            if !r.short_names.is_empty() {
                entry["shortNames"] = json!(r.short_names);
            }
            entry
        })
        .collect();
    let metadata = if group.is_empty() { json!({}) } else { json!({"name": group}) };
    json!({
        "metadata": metadata,
        "versions": [{"version": version, "resources": resources, "freshness": "Current"}],
    })
}

/// An `APIGroupDiscoveryList` of `groups`, with the content type kubectl expects.
pub fn aggregated(groups: Vec<Value>) -> Response {
    let body = json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": groups,
    });
    let mut response = (StatusCode::OK, body.to_string()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(AGGREGATED_CONTENT_TYPE));
    vary_accept(response)
}

/// Marks a discovery answer as depending on `Accept`, so no cache serves one shape for
/// the other.
pub fn vary_accept(mut response: Response) -> Response {
    response.headers_mut().insert(header::VARY, HeaderValue::from_static("Accept"));
    response
}

/// Whether `Accept` names aggregated discovery v2: a media range
/// `application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList` (parameters in
/// any order; `v2beta1` alone is not served and gets the legacy document).
pub fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).any(|accept| {
        accept.split(',').any(|media| {
            let mut parts = media.split(';').map(str::trim);
            let type_ok = parts.next().is_some_and(|t| t.eq_ignore_ascii_case("application/json"));
            let params: Vec<&str> = parts.collect();
            type_ok
                && params.contains(&"g=apidiscovery.k8s.io")
                && params.contains(&"v=v2")
                && params.contains(&"as=APIGroupDiscoveryList")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn kubectls_accept_asks_for_aggregated_v2_and_others_do_not() {
        assert!(wants_aggregated(&accept(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
        )));
        assert!(wants_aggregated(&accept(
            "application/json; as=APIGroupDiscoveryList; v=v2; g=apidiscovery.k8s.io"
        )));
        assert!(!wants_aggregated(&accept(
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
        )));
        assert!(!wants_aggregated(&accept("application/json, */*")));
        assert!(!wants_aggregated(&HeaderMap::new()));
    }

    #[test]
    fn legacy_and_aggregated_name_the_same_resources_and_subresources() {
        let resources = hive_resources();
        let legacy = legacy_resource_list("hive.dev/v1", &resources);
        let mut legacy_names: Vec<String> = legacy
            .get("resources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|r| r.get("name").and_then(Value::as_str).map(str::to_owned))
            .collect();
        let group = group_discovery("hive.dev", "v1", &resources);
        let mut aggregated_names = Vec::new();
        for r in group.pointer("/versions/0/resources").and_then(Value::as_array).into_iter().flatten() {
            let plural = r.get("resource").and_then(Value::as_str).unwrap_or_default();
            aggregated_names.push(plural.to_owned());
            for sub in r.get("subresources").and_then(Value::as_array).into_iter().flatten() {
                let sub = sub.get("subresource").and_then(Value::as_str).unwrap_or_default();
                aggregated_names.push(format!("{plural}/{sub}"));
            }
        }
        legacy_names.sort();
        aggregated_names.sort();
        assert_eq!(legacy_names, aggregated_names);
        assert!(
            legacy_names.contains(&"jobs/cancel".to_owned())
                && legacy_names.contains(&"agents/log".to_owned())
        );
    }
}
