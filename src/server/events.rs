//! Core Events, at `/api/v1/events` (so `kubectl describe` shows an object's history: it
//! asks with `involvedObject` field selectors) and on the namespaced routes client-go's
//! recorders write to, and the same stored events served as `events.k8s.io/v1`.
//!
//! hive's kinds are cluster-scoped and its own events have no namespace; an event a
//! client records keeps the namespace it was written in. A namespaced route lists that
//! namespace's events and hive's own (every namespace shows those), the cluster-wide
//! route every event. Names are one space for all namespaces (the store's key), so two
//! namespaces cannot hold events of the same name. `events.k8s.io/v1` is one stored
//! object in two shapes, converted field by field as kube-apiserver converts them
//! (`hive_api::event::EVENTS_V1_RENAMES`). The typed clientset's protobuf bodies are
//! read by `body/protobuf.rs`; answers are JSON.

use crate::auth::{Principal, Verb};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use hive_api::event::{EVENTS_V1, EVENT_KIND};
use serde_json::{json, Value};

use super::body::{self, protobuf, MediaType};
use super::error::{ApiError, ApiResult};
use super::routes::{self, ApiRouter};
use super::shape::Form;
use super::{discovery, resources, AppState};
use crate::store::Subresource;

/// The routes of `/api`, `/api/v1` and `/apis/events.k8s.io`: reads for any role, changes
/// for operators.
pub fn router() -> ApiRouter {
    ApiRouter::new()
        .route("/api", routes::get(Verb::Read, versions))
        .route("/api/v1", routes::get(Verb::Read, resource_list))
        .route("/api/v1/events", routes::get(Verb::Read, list_all::<false>).post(Verb::Write, create))
        .route(
            "/api/v1/events/{name}",
            routes::get(Verb::Read, read)
                .put(Verb::Write, replace)
                .patch(Verb::Write, patch)
                .delete(Verb::Write, delete),
        )
        .merge(namespaced::<false>())
        .route("/apis/events.k8s.io", routes::get(Verb::Read, events_group))
        .route("/apis/events.k8s.io/v1", routes::get(Verb::Read, events_resource_list))
        .route("/apis/events.k8s.io/v1/events", routes::get(Verb::Read, list_all::<true>))
        .merge(namespaced::<true>())
}

/// The namespaced routes, in the core shape or (`V1`) events.k8s.io's.
fn namespaced<const V1: bool>() -> ApiRouter {
    let (collection, item) = if V1 {
        (
            "/apis/events.k8s.io/v1/namespaces/{namespace}/events",
            "/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}",
        )
    } else {
        ("/api/v1/namespaces/{namespace}/events", "/api/v1/namespaces/{namespace}/events/{name}")
    };
    ApiRouter::new()
        .route(collection, routes::get(Verb::Read, list_in::<V1>).post(Verb::Write, create_in::<V1>))
        .route(
            item,
            routes::get(Verb::Read, read_in::<V1>)
                .put(Verb::Write, replace_in::<V1>)
                .patch(Verb::Write, patch_in::<V1>)
                .delete(Verb::Write, delete_in::<V1>),
        )
}

/// `GET /api`: aggregated discovery of the core group's `v1` when asked for (kubectl
/// 1.32 asks it first, like `/apis`), else the legacy `APIVersions`.
async fn versions(headers: HeaderMap) -> Response {
    if discovery::wants_aggregated(&headers) {
        return discovery::aggregated(vec![discovery::group_discovery(
            "",
            "v1",
            &discovery::events_resource(),
        )]);
    }
    discovery::vary_accept(
        Json(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
        }))
        .into_response(),
    )
}

async fn resource_list() -> Json<Value> {
    Json(discovery::legacy_resource_list("v1", &discovery::events_resource()))
}

async fn events_group() -> Json<Value> {
    let gv = json!({"groupVersion": EVENTS_V1, "version": "v1"});
    Json(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": discovery::EVENTS_GROUP, "versions": [gv], "preferredVersion": gv}),
    )
}

async fn events_resource_list() -> Json<Value> {
    Json(discovery::legacy_resource_list(EVENTS_V1, &discovery::events_resource()))
}

/// A route's form and namespace.
#[derive(Clone, Copy)]
struct Route<'a> {
    form: Form,
    namespace: Option<&'a str>,
}

const CORE: Route<'static> = Route { form: Form::Stored, namespace: None };

impl Route<'_> {
    fn api_version(&self) -> &'static str {
        match self.form {
            Form::Stored => "v1",
            Form::EventsV1 => EVENTS_V1,
        }
    }

    /// The body as a core Event in the route's namespace: protobuf or JSON/YAML read,
    /// an `events.k8s.io/v1` body converted, a namespace left out taken from the path,
    /// and one that differs from it refused.
    async fn body(&self, headers: &HeaderMap, body: Body) -> ApiResult<body::Parsed> {
        let bytes = body::read(body).await?;
        let mut parsed = match MediaType::of(headers) {
            MediaType::Protobuf => body::Parsed {
                value: protobuf::decode_event(&bytes, self.api_version())?,
                duplicates: Default::default(),
            },
            media => body::parse_object(media, &bytes)?,
        };
        if self.form == Form::EventsV1 {
            hive_api::event::from_events_v1(&mut parsed.value);
        }
        if let Some(namespace) = self.namespace {
            if let Some(meta) = body::metadata_mut(&mut parsed.value) {
                match meta.get("namespace").and_then(Value::as_str).filter(|n| !n.is_empty()) {
                    None => {
                        meta.insert("namespace".into(), Value::String(namespace.into()));
                    }
                    Some(given) if given != namespace => {
                        return Err(ApiError::BadRequest(format!(
                            "the namespace of the provided object ({given:?}) does not match the namespace sent on \
                             the request ({namespace:?})"
                        )))
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(parsed)
    }

    /// An error of the core shape in the route's terms: an `events.k8s.io/v1` client
    /// reads `regarding.name`, not `involvedObject.name`.
    fn error(&self, err: ApiError) -> ApiError {
        match (self.form, err) {
            (Form::EventsV1, ApiError::Invalid { kind, name, mut errors }) => {
                for error in &mut errors {
                    error.field = hive_api::event::events_v1_path(&error.field);
                }
                ApiError::Invalid { kind, name, errors }
            }
            (_, err) => err,
        }
    }

    /// A named event on a namespaced route exists there only when it has that
    /// namespace or none: another namespace's is a 404, as in Kubernetes.
    fn check_namespace(&self, state: &AppState, name: &str) -> ApiResult<()> {
        let Some(namespace) = self.namespace else { return Ok(()) };
        let Some(object) = state.store.get(EVENT_KIND.plural, name) else { return Ok(()) };
        let own = hive_api::selector::Field::Namespace.value_in(&object.value()).into_owned();
        if own.is_empty() || own == namespace {
            return Ok(());
        }
        Err(ApiError::NotFound { plural: "events".into(), name: name.into() })
    }

    async fn list(&self, state: AppState, headers: HeaderMap, uri: Uri) -> ApiResult<Response> {
        resources::list(state, &EVENT_KIND, self.form, self.namespace.map(str::to_string), headers, uri).await
    }

    async fn create(
        &self,
        state: AppState,
        principal: &Principal,
        headers: HeaderMap,
        uri: Uri,
        body: Body,
    ) -> ApiResult<Response> {
        let parsed = self.body(&headers, body).await.map_err(|e| self.error(e))?;
        resources::create_parsed(state, &EVENT_KIND, self.form, principal, headers, uri, parsed)
            .await
            .map_err(|e| self.error(e))
    }

    async fn read(&self, state: AppState, name: String, headers: HeaderMap, uri: Uri) -> ApiResult<Response> {
        self.check_namespace(&state, &name)?;
        resources::get(state, &EVENT_KIND, self.form, name, headers, uri).await
    }

    // The extracted parts of one request, passed through as axum hands them over.
    #[allow(clippy::too_many_arguments)]
    async fn replace(
        &self,
        state: AppState,
        principal: &Principal,
        name: String,
        headers: HeaderMap,
        uri: Uri,
        body: Body,
    ) -> ApiResult<Response> {
        self.check_namespace(&state, &name)?;
        let parsed = self.body(&headers, body).await.map_err(|e| self.error(e))?;
        resources::replace_parsed(
            state,
            &EVENT_KIND,
            self.form,
            principal,
            name,
            Subresource::Main,
            headers,
            uri,
            parsed,
        )
        .await
        .map_err(|e| self.error(e))
    }

    async fn patch(
        &self,
        state: AppState,
        principal: &Principal,
        name: String,
        headers: HeaderMap,
        uri: Uri,
        body: Body,
    ) -> ApiResult<Response> {
        self.check_namespace(&state, &name)?;
        resources::patch(
            state,
            &EVENT_KIND,
            self.form,
            principal,
            name,
            Subresource::Main,
            headers,
            uri,
            body,
        )
        .await
        .map_err(|e| self.error(e))
    }

    async fn delete(
        &self,
        state: AppState,
        name: String,
        headers: HeaderMap,
        uri: Uri,
        body: Body,
    ) -> ApiResult<Response> {
        self.check_namespace(&state, &name)?;
        resources::delete(state, &EVENT_KIND, self.form, name, headers, uri, body).await
    }
}

/// The route of `namespace` (none: cluster-wide) in the core shape or (`V1`)
/// events.k8s.io's.
fn route<const V1: bool>(namespace: Option<&str>) -> Route<'_> {
    Route { form: if V1 { Form::EventsV1 } else { Form::Stored }, namespace }
}

async fn list_all<const V1: bool>(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
) -> ApiResult<Response> {
    route::<V1>(None).list(state, headers, uri).await
}

async fn list_in<const V1: bool>(
    State(state): State<AppState>,
    Path(namespace): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> ApiResult<Response> {
    route::<V1>(Some(&namespace)).list(state, headers, uri).await
}

async fn create_in<const V1: bool>(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(namespace): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    route::<V1>(Some(&namespace)).create(state, &principal, headers, uri, body).await
}

async fn read_in<const V1: bool>(
    State(state): State<AppState>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
) -> ApiResult<Response> {
    route::<V1>(Some(&namespace)).read(state, name, headers, uri).await
}

async fn replace_in<const V1: bool>(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    route::<V1>(Some(&namespace)).replace(state, &principal, name, headers, uri, body).await
}

async fn patch_in<const V1: bool>(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    route::<V1>(Some(&namespace)).patch(state, &principal, name, headers, uri, body).await
}

async fn delete_in<const V1: bool>(
    State(state): State<AppState>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    route::<V1>(Some(&namespace)).delete(state, name, headers, uri, body).await
}

/// The cluster-wide named routes of the core group (events.k8s.io has none).
async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    CORE.create(state, &principal, headers, uri, body).await
}

async fn read(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> ApiResult<Response> {
    CORE.read(state, name, headers, uri).await
}

async fn replace(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    CORE.replace(state, &principal, name, headers, uri, body).await
}

async fn patch(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    CORE.patch(state, &principal, name, headers, uri, body).await
}

async fn delete(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    CORE.delete(state, name, headers, uri, body).await
}
