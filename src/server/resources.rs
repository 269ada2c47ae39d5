//! The generic resource handlers — get, list, create, replace, patch, delete, and the
//! `/status` subresource — for any kind in the registry. `kinds.rs` binds them to
//! per-kind routes with their OpenAPI documentation.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use hive_api::meta::Time;
use hive_api::KindInfo;
use serde_json::{json, Value};

use super::body::{self, MediaType};
use super::error::{ApiError, ApiResult};
use super::params::{FieldValidation, Params};
use super::selectors::Selectors;
use super::shape::{Answer, Form, Shape};
use super::table::{self, IncludeObject};
use super::{admission, apply};
use super::{watch, AppState};
use crate::auth::Principal;
use crate::store::{Mutation, Obj, Outcome, Page, Subresource};
use hive_api::Duplicates;

/// How many times a patch is re-applied when a concurrent write wins the race. Each
/// group commit lets one of N racing patches of one object through, so N racers need
/// up to N rounds; past this many the client gets a 409 and retries itself.
const PATCH_RETRIES: usize = 64;

/// A JSON response with an optional list of `Warning` headers (`299 - "text"`).
pub fn json_response(code: StatusCode, value: &Value, warnings: &[String]) -> Response {
    encoded_response(code, Bytes::from(serde_json::to_vec(value).unwrap_or_default()), warnings)
}

/// The response for a stored object: its JSON as committed (no re-encoding) unless the
/// answer's `shape` is another. `created` is the name a create wrote, which its path
/// does not say.
fn object_response(
    code: StatusCode,
    object: &Obj,
    created: Option<String>,
    warnings: &[String],
    shape: Shape,
) -> Response {
    let mut response = encoded_response(code, shape.bytes(object.json_bytes()), warnings);
    if shape != Shape::Stored {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(shape.content_type(Answer::One)));
    }
    // For the audit log, so that neither it nor the handler parses the object back.
    response.extensions_mut().insert(super::audit_log::Written::object(object, created));
    response
}

/// A response whose body is already JSON, with an optional list of `Warning` headers.
fn encoded_response(code: StatusCode, body: Bytes, warnings: &[String]) -> Response {
    let mut response = (code, body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for warning in warnings {
        let text = format!("299 - {}", serde_json::to_string(warning).unwrap_or_default());
        if let Ok(value) = HeaderValue::from_str(&text) {
            response.headers_mut().append("warning", value);
        }
    }
    response
}

fn table_response(value: &Value) -> Response {
    let mut response = (StatusCode::OK, serde_json::to_vec(value).unwrap_or_default()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(table::TABLE_CONTENT_TYPE));
    response
}

/// Who made a change, for `managedFields`: `fieldManager`, else the user agent's
/// program name (as upstream), else `unknown`.
fn manager(params: &Params, headers: &HeaderMap) -> String {
    if let Some(m) = params.field_manager.as_deref().filter(|m| !m.is_empty()) {
        return m.to_string();
    }
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

/// Decodes, defaults and validates a whole object of `kind` ([`hive_api::admit`]).
/// Returns the normalized object and the warnings to send.
pub fn admit(kind: &KindInfo, value: Value, validation: FieldValidation) -> ApiResult<(Value, Vec<String>)> {
    admit_body(kind, value, &Duplicates::default(), validation)
}

/// [`admit`] for what a client sent, with the keys it gave twice
/// ([`hive_api::admit_body`]).
fn admit_body(
    kind: &KindInfo,
    value: Value,
    duplicates: &Duplicates,
    validation: FieldValidation,
) -> ApiResult<(Value, Vec<String>)> {
    let admitted = hive_api::admit_body(kind, value, duplicates, validation)?;
    Ok((admitted.object, admitted.warnings))
}

/// The keys a JSON patch's operations give twice (`{"op": …, "value": 1, "value": 2}`):
/// refused under `Strict`, else warned about, as kube-apiserver checks the operations
/// themselves (`json patch duplicate field "[0].value"`).
fn json_patch_duplicates(duplicates: &Duplicates, validation: FieldValidation) -> ApiResult<Vec<String>> {
    let words = duplicates.warnings().into_iter().map(|w| format!("json patch {w}"));
    match validation {
        _ if duplicates.is_empty() => Ok(Vec::new()),
        FieldValidation::Strict => Err(ApiError::BadRequest(format!(
            "strict decoding error: {}",
            words.collect::<Vec<_>>().join(", ")
        ))),
        FieldValidation::Warn => Ok(words.collect()),
        FieldValidation::Ignore => Ok(Vec::new()),
    }
}

/// Equal once `metadata.managedFields` is set aside.
fn same_apart_from_managed_fields(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
        v
    };
    strip(a) == strip(b)
}

/// Rejects changes the kind forbids (immutable specs, decisions made twice).
fn check_update(kind: &KindInfo, new: &Value, old: &Value, subresource: Option<&str>) -> ApiResult<()> {
    if subresource.is_some() {
        return Ok(());
    }
    let errors = (kind.validate_update)(new, old);
    if errors.is_empty() {
        return Ok(());
    }
    Err(ApiError::Invalid { kind: kind.kind.into(), name: name_of(new).to_string(), errors })
}

/// A patched object keeps its `metadata.uid`: changing it is a 422 naming the field.
fn uid_unchanged(kind: &KindInfo, new: &Value, old: &Value) -> ApiResult<()> {
    let uid = |v: &Value| v.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_owned);
    match (uid(new), uid(old)) {
        (Some(new_uid), Some(old_uid)) if !new_uid.is_empty() && new_uid != old_uid => {
            Err(ApiError::Invalid {
                kind: kind.kind.into(),
                name: name_of(new).to_string(),
                errors: vec![hive_api::validation::ValidationError::new(
                    "metadata.uid",
                    hive_api::validation::Reason::Invalid,
                    format!("{new_uid:?}: field is immutable"),
                )],
            })
        }
        _ => Ok(()),
    }
}

/// A JSON pointer as a field path: `/spec/nodes/0/deps` → `spec.nodes[0].deps`.
fn field_of_pointer(pointer: &str) -> String {
    let mut field = String::new();
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            field.push_str(&format!("[{segment}]"));
        } else {
            if !field.is_empty() {
                field.push('.');
            }
            field.push_str(&segment);
        }
    }
    field
}

/// The `op` of a JSON-patch operation, as the client wrote it.
fn json_patch_op_name(op: &json_patch::PatchOperation) -> &'static str {
    match op {
        json_patch::PatchOperation::Add(_) => "add",
        json_patch::PatchOperation::Remove(_) => "remove",
        json_patch::PatchOperation::Replace(_) => "replace",
        json_patch::PatchOperation::Move(_) => "move",
        json_patch::PatchOperation::Copy(_) => "copy",
        json_patch::PatchOperation::Test(_) => "test",
    }
}

fn name_of(value: &Value) -> &str {
    hive_api::meta::name_of(value)
}

fn resource_version_of(value: &Value) -> Option<&str> {
    value.pointer("/metadata/resourceVersion").and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Clears an admitted object's status: observed state is written only through /status.
fn clear_status(object: &mut Value) {
    if let Some(map) = object.as_object_mut() {
        map.insert("status".into(), json!({}));
    }
}

/// Fills in the body's `metadata.name` from the URL when it has none, and refuses one
/// that differs. The body is as the client sent it, so its shape is checked before any
/// field is touched: a `metadata` that is not an object, or a name that is not a string,
/// is refused naming the field.
fn ensure_body_name(kind: &KindInfo, object: &mut Value, path_name: &str) -> ApiResult<()> {
    let misshapen = |field: &str, value: &Value, expected: &str| {
        ApiError::BadRequest(format!(
            "{} in version \"v1\" cannot be handled as a {}: {field}: invalid type: {}, expected {expected}",
            kind.kind,
            kind.kind,
            body::json_type(value)
        ))
    };
    let Some(body) = object.as_object_mut() else {
        return Err(ApiError::BadRequest(format!(
            "the request body must be a JSON object, not {}",
            body::json_type(object)
        )));
    };
    let metadata = body.entry("metadata").or_insert_with(|| json!({}));
    let Some(metadata) = metadata.as_object_mut() else {
        return Err(misshapen("metadata", metadata, "an object"));
    };
    match metadata.get("name") {
        None => {}
        Some(Value::String(n)) if n.is_empty() => {}
        Some(Value::String(n)) if n == path_name => return Ok(()),
        Some(Value::String(n)) => return Err(name_mismatch(kind, n, path_name)),
        Some(other) => return Err(misshapen("metadata.name", other, "a string")),
    }
    metadata.insert("name".into(), json!(path_name));
    Ok(())
}

fn name_mismatch(kind: &KindInfo, body_name: &str, path_name: &str) -> ApiError {
    ApiError::BadRequest(format!(
        "the name of the object ({body_name}) does not match the name on the URL ({path_name}) for {}",
        kind.plural
    ))
}

fn now() -> Time {
    Time(crate::host::now())
}

/// Keeps server-owned `managedFields` and records what this write changed.
/// Records what a non-apply write changed in `managedFields` (client-sent
/// `managedFields` are ignored; ownership comes from `old`).
fn track_update(old: Option<&Value>, new: &mut Value, manager: &str, subresource: Option<&str>) {
    apply::record_update(old, new, manager, subresource, now());
}

fn outcome_object(outcome: Outcome) -> (StatusCode, Obj) {
    match outcome {
        Outcome::Created(o) => (StatusCode::CREATED, o),
        Outcome::Updated(o) | Outcome::Unchanged(o) | Outcome::Deleting(o) | Outcome::Deleted(o) => {
            (StatusCode::OK, o)
        }
    }
}

/// `GET /apis/hive.dev/v1/{plural}/{name}`, answered in the route's `form`.
pub async fn get(
    state: AppState,
    kind: &'static KindInfo,
    form: Form,
    name: String,
    headers: HeaderMap,
    uri: Uri,
) -> ApiResult<Response> {
    let params = Params::from_uri(&uri)?;
    // Not older than any write acknowledged before this GET, whichever replica took it.
    let object =
        state.store.get_consistent(kind.plural, &name).await?.ok_or_else(|| not_found(kind, &name))?;
    if table::wants_table(&headers) {
        let include = IncludeObject::parse(params.include_object.as_deref()).map_err(ApiError::BadRequest)?;
        let object = object.value();
        let rv = resource_version_of(&object).unwrap_or("").to_string();
        return Ok(table_response(&table::table(
            kind,
            &[object],
            include,
            json!({"resourceVersion": rv}),
            true,
        )));
    }
    let shape = Shape::negotiate(&headers, Answer::One, form)?;
    Ok(object_response(StatusCode::OK, &object, None, &[], shape))
}

fn not_found(kind: &KindInfo, name: &str) -> ApiError {
    ApiError::NotFound { plural: kind.plural.into(), name: name.into() }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    rv: u64,
    start: String,
}

fn encode_continue(token: &ContinueToken) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(token).unwrap_or_default())
}

fn decode_continue(text: &str) -> ApiResult<ContinueToken> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| {
            ApiError::BadRequest("continue: invalid continue token; start the list again without it".into())
        })
}

/// `GET /apis/hive.dev/v1/{plural}` — a list, or a watch with `watch=true` — answered in
/// the route's `form`, on a namespaced route of `namespace`.
pub async fn list(
    state: AppState,
    kind: &'static KindInfo,
    form: Form,
    namespace: Option<String>,
    headers: HeaderMap,
    uri: Uri,
) -> ApiResult<Response> {
    let params = Params::from_uri(&uri)?;
    let selectors = Selectors::parse(kind, &params)?.in_namespace(namespace);
    if params.watch()? {
        let shape = Shape::negotiate(&headers, Answer::Watch, form)?;
        return watch::serve(state, kind, &params, selectors, table::wants_table(&headers), shape).await;
    }
    let shape = Shape::negotiate(&headers, Answer::List, form)?;
    let include = IncludeObject::parse(params.include_object.as_deref()).map_err(ApiError::BadRequest)?;
    // Served from the cache, which is never older than a revision a client has seen; the
    // value must still be one, not silently ignored, and not one from the future.
    params.reached_revision(&state.store).await?;
    let continued = match params.continue_.as_deref().filter(|c| !c.is_empty()) {
        Some(token) => {
            let token = decode_continue(token)?;
            // Only this server mints tokens, at revisions it had: one ahead of the store
            // is forged (or from another store), and its revision must not be echoed.
            let current = state.store.revision();
            if token.rv > current {
                return Err(ApiError::BadRequest(format!(
                    "continue: the token's revision {} is ahead of the store's {current}; start the list \
                     again without it",
                    token.rv
                )));
            }
            if token.rv < state.store.stats().compacted {
                return Err(ApiError::Expired(
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter."
                        .into(),
                ));
            }
            Some(token)
        }
        None => None,
    };
    let limit = params.limit()?;
    let start_after = continued.as_ref().map(|token| token.start.as_str());
    let page = if selectors.is_empty() {
        // Only the page itself is taken from the cache.
        state.store.page(kind.plural, start_after, limit)
    } else {
        // Labels and names are read from what the store keeps beside each object, so
        // the cache's lock is held over thousands of them at a time; a selector on
        // another field parses each object it looks at, a few at a time.
        let per_lock = if selectors.parses_objects() { 32 } else { 4096 };
        state.store.page_selected(kind.plural, start_after, limit, per_lock, |name, object| {
            selectors.matches_stored(name, object)
        })
    };
    // A continued list stays at the revision its first page was served at.
    let list_rv = continued.as_ref().map_or(page.revision, |token| token.rv);
    let Page { items, last, remaining, more, .. } = page;
    let mut list_meta = json!({"resourceVersion": list_rv.to_string()});
    if more {
        let last = last.map(|name| name.to_string()).unwrap_or_default();
        list_meta["continue"] = json!(encode_continue(&ContinueToken { rv: list_rv, start: last }));
    }
    if let Some(remaining) = remaining.filter(|&n| n > 0) {
        list_meta["remainingItemCount"] = json!(remaining);
    }
    if table::wants_table(&headers) {
        let objects: Vec<Value> = items.iter().map(Obj::value).collect();
        return Ok(table_response(&table::table(kind, &objects, include, list_meta, true)));
    }
    // The list is each object's JSON as committed (no object is copied or encoded
    // again), streamed in chunks.
    let (api_version, list_kind) = shape.list_kind(kind);
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(
        format!("{{\"apiVersion\":\"{api_version}\",\"kind\":\"{list_kind}\",\"metadata\":").as_bytes(),
    );
    serde_json::to_writer(&mut head, &list_meta).map_err(|e| ApiError::Internal(e.into()))?;
    head.extend_from_slice(b",\"items\":");
    let body = match shape {
        Shape::Stored => super::list_body::body(head, items),
        // Another shape writes each object again.
        other => super::list_body::body(head, items.iter().map(|o| other.bytes(o.json_bytes())).collect()),
    };
    let mut response = (StatusCode::OK, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(shape.content_type(Answer::List)));
    Ok(response)
}

/// `POST /apis/hive.dev/v1/{plural}`.
pub async fn create(
    state: AppState,
    kind: &'static KindInfo,
    principal: &Principal,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    let bytes = body::read(body).await?;
    let parsed = body::parse_object(MediaType::of(&headers), &bytes)?;
    create_parsed(state, kind, Form::Stored, principal, headers, uri, parsed).await
}

/// [`create`] of a body already read, answered in the route's `form`.
pub async fn create_parsed(
    state: AppState,
    kind: &'static KindInfo,
    form: Form,
    principal: &Principal,
    headers: HeaderMap,
    uri: Uri,
    parsed: body::Parsed,
) -> ApiResult<Response> {
    let params = Params::from_uri(&uri)?;
    let shape = Shape::negotiate(&headers, Answer::One, form)?;
    let body::Parsed { mut value, duplicates } = parsed;
    let prefix = super::generate_name::prefix_of(kind.kind, &value)?;
    if let Some(prefix) = &prefix {
        super::generate_name::name_it(&mut value, prefix);
    }
    let (mut object, warnings) = admit_body(kind, value, &duplicates, params.field_validation()?)?;
    if let Some(meta) = body::metadata_mut(&mut object) {
        meta.remove("managedFields");
        meta.remove("resourceVersion");
    }
    // Status is observed state: only controllers write it, through /status.
    clear_status(&mut object);
    admission::check(kind, principal, None, &mut object, None, &state.admission_facts())?;
    track_update(None, &mut object, &manager(&params, &headers), None);
    let dry_run = params.dry_run()?;
    // The name the object is stored under, for the audit log: the body's, else (given a
    // prefix) the one the store took, read back from the stored JSON.
    let named = prefix.is_none().then(|| name_of(&object).to_string());
    let outcome = match &prefix {
        None => state.store.commit(Mutation::Create { kind: kind.plural, object }, dry_run).await?,
        Some(prefix) => {
            super::generate_name::create(&state.store, kind.plural, object, prefix, dry_run).await?
        }
    };
    let (code, object) = outcome_object(outcome);
    let name = Some(named.unwrap_or_else(|| object.name())).filter(|n| !n.is_empty());
    Ok(object_response(code, &object, name, &warnings, shape))
}

/// `PUT /apis/hive.dev/v1/{plural}/{name}[/status]`.
// The extracted parts of one request, passed through as axum hands them over.
#[allow(clippy::too_many_arguments)]
pub async fn replace(
    state: AppState,
    kind: &'static KindInfo,
    principal: &Principal,
    name: String,
    subresource: Subresource,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    let bytes = body::read(body).await?;
    let parsed = body::parse_object(MediaType::of(&headers), &bytes)?;
    replace_parsed(state, kind, Form::Stored, principal, name, subresource, headers, uri, parsed).await
}

/// [`replace`] with a body already read, answered in the route's `form`.
// The extracted parts of one request, passed through as axum hands them over.
#[allow(clippy::too_many_arguments)]
pub async fn replace_parsed(
    state: AppState,
    kind: &'static KindInfo,
    form: Form,
    principal: &Principal,
    name: String,
    subresource: Subresource,
    headers: HeaderMap,
    uri: Uri,
    parsed: body::Parsed,
) -> ApiResult<Response> {
    let params = Params::from_uri(&uri)?;
    let shape = Shape::negotiate(&headers, Answer::One, form)?;
    let body::Parsed { mut value, duplicates } = parsed;
    ensure_body_name(kind, &mut value, &name)?;
    let (mut object, warnings) = admit_body(kind, value, &duplicates, params.field_validation()?)?;
    let current = state.store.get(kind.plural, &name).ok_or_else(|| not_found(kind, &name))?.value();
    let sub = matches!(subresource, Subresource::Status).then_some("status");
    check_update(kind, &object, &current, sub)?;
    admission::check(kind, principal, Some(&current), &mut object, sub, &state.admission_facts())?;
    track_update(Some(&current), &mut object, &manager(&params, &headers), sub);
    let outcome = state
        .store
        .commit(Mutation::Update { kind: kind.plural, object, subresource }, params.dry_run()?)
        .await?;
    let (code, object) = outcome_object(outcome);
    Ok(object_response(code, &object, None, &warnings, shape))
}

/// `PATCH /apis/hive.dev/v1/{plural}/{name}[/status]`: merge patch, JSON patch, or
/// server-side apply. On a route of another `form` the patch is written in that form's
/// terms, and so is the answer.
// The extracted parts of one request, passed through as axum hands them over.
#[allow(clippy::too_many_arguments)]
pub async fn patch(
    state: AppState,
    kind: &'static KindInfo,
    form: Form,
    principal: &Principal,
    name: String,
    subresource: Subresource,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    let params = Params::from_uri(&uri)?;
    let shape = Shape::negotiate(&headers, Answer::One, form)?;
    let media = MediaType::of(&headers);
    let bytes = body::read(body).await?;
    let validation = params.field_validation()?;
    let dry_run = params.dry_run()?;
    let sub = matches!(subresource, Subresource::Status).then_some("status");
    enum Patch {
        Merge(Value),
        Json(json_patch::Patch),
        Apply(Value),
    }
    // The keys the body gave twice: a merge patch's and an applied manifest's are checked
    // with the object's fields, a JSON patch's here.
    let mut duplicates = Duplicates::default();
    let mut patch_warnings = Vec::new();
    let patch = match media {
        MediaType::MergePatch | MediaType::Json => {
            let parsed = body::parse_object(MediaType::Json, &bytes)?;
            duplicates = parsed.duplicates;
            Patch::Merge(parsed.value)
        }
        MediaType::JsonPatch => {
            let parsed = body::parse_json(&bytes)?;
            patch_warnings = json_patch_duplicates(&parsed.duplicates, validation)?;
            let ops: json_patch::Patch = serde_json::from_value(parsed.value)
                .map_err(|e| ApiError::BadRequest(format!("invalid JSON patch: {e}")))?;
            Patch::Json(ops)
        }
        MediaType::ApplyPatch => {
            if params.field_manager.as_deref().is_none_or(str::is_empty) {
                return Err(ApiError::BadRequest(
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
                        .into(),
                ));
            }
            let parsed = body::parse_object(MediaType::ApplyPatch, &bytes)?;
            let mut value = parsed.value;
            duplicates = parsed.duplicates;
            ensure_body_name(kind, &mut value, &name)?;
            Patch::Apply(value)
        }
        // A core Event's fields are flat values and maps, with no list a strategic
        // merge would key: its strategic-merge patch (client-go's recorders send one to
        // count repeats) is a merge patch, without the directives.
        MediaType::StrategicMergePatch if kind.keeps_namespace => {
            let parsed = body::parse_object(MediaType::Json, &bytes)?;
            strategic_directives_refused(kind, &name, &parsed.value)?;
            duplicates = parsed.duplicates;
            Patch::Merge(parsed.value)
        }
        MediaType::StrategicMergePatch => {
            return Err(ApiError::UnsupportedMediaType(format!(
                "strategic merge patch is not supported for {}.hive.dev: use --type merge or --type json \
                 (accepted media types: application/merge-patch+json, application/json-patch+json, \
                 application/apply-patch+yaml)",
                kind.plural
            )))
        }
        MediaType::Yaml | MediaType::Protobuf | MediaType::Other => {
            return Err(ApiError::UnsupportedMediaType(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
                    .into(),
            ))
        }
    };
    let patch = match (form, patch) {
        (Form::EventsV1, Patch::Merge(mut p)) => {
            hive_api::event::from_events_v1(&mut p);
            Patch::Merge(p)
        }
        (Form::EventsV1, Patch::Apply(mut p)) => {
            hive_api::event::from_events_v1(&mut p);
            Patch::Apply(p)
        }
        (Form::EventsV1, Patch::Json(mut ops)) => {
            for op in &mut ops.0 {
                events_v1_op_to_core(op);
            }
            Patch::Json(ops)
        }
        (_, patch) => patch,
    };
    let manager = manager(&params, &headers);
    for attempt in 0..PATCH_RETRIES {
        if attempt > 0 {
            // Spread the racers out a little so they stop landing in the same batch.
            tokio::time::sleep(retry_delay(attempt)).await;
        }
        let current = state.store.get(kind.plural, &name).map(|o| o.value());
        let (mutation, warnings, client_precondition) = match (&patch, current) {
            (Patch::Apply(applied), None) => {
                if sub.is_some() {
                    return Err(not_found(kind, &name));
                }
                // Server-side apply creates an absent object.
                // Check the manifest (unknown fields, validity), but hand apply the
                // manifest as sent: defaults are not the applier's fields.
                let (_, warnings) = admit_body(kind, applied.clone(), &duplicates, validation)?;
                let merged = apply::apply(None, applied, &manager, params.force()?, now())
                    .map_err(|c| conflict(kind, &name, &c))?;
                let (mut object, _) = admit(kind, merged, FieldValidation::Ignore)?;
                if let Some(meta) = body::metadata_mut(&mut object) {
                    meta.remove("resourceVersion");
                }
                clear_status(&mut object);
                admission::check(kind, principal, None, &mut object, None, &state.admission_facts())?;
                (Mutation::Create { kind: kind.plural, object }, warnings, false)
            }
            (_, None) => return Err(not_found(kind, &name)),
            (patch, Some(current)) => {
                let current_rv = resource_version_of(&current).map(str::to_string);
                let (object, warnings) = match patch {
                    Patch::Merge(_) | Patch::Json(_) => {
                        let mut doc = current.clone();
                        match patch {
                            Patch::Merge(p) => json_patch::merge(&mut doc, p),
                            Patch::Json(ops) => {
                                json_patch::patch(&mut doc, ops).map_err(|e| ApiError::Invalid {
                                    kind: kind.kind.into(),
                                    name: name.clone(),
                                    errors: vec![hive_api::validation::ValidationError::new(
                                        field_of_pointer(e.path.as_str()),
                                        hive_api::validation::Reason::Invalid,
                                        format!(
                                            "the JSON patch could not be applied: operation {} ({} {}): {}",
                                            e.operation,
                                            ops.0.get(e.operation).map_or("?", json_patch_op_name),
                                            e.path,
                                            e.kind
                                        ),
                                    )],
                                })?
                            }
                            Patch::Apply(_) => unreachable!("matched above"),
                        }
                        let (mut object, warnings) = admit_body(kind, doc, &duplicates, validation)?;
                        // A patch cannot move the write to another object.
                        if name_of(&object) != name {
                            return Err(name_mismatch(kind, name_of(&object), &name));
                        }
                        // Nor give it another identity: the store would refuse the uid as
                        // a failed precondition, and every retry would repeat it.
                        uid_unchanged(kind, &object, &current)?;
                        track_update(Some(&current), &mut object, &manager, sub);
                        (object, warnings)
                    }
                    Patch::Apply(applied) => {
                        // The configuration's fields are checked here; its values only
                        // in the merged object, below (it may set a label alone).
                        let warnings = hive_api::admit_apply_configuration(
                            kind,
                            applied.clone(),
                            &duplicates,
                            validation,
                        )?;
                        let merged = apply::apply(Some(&current), applied, &manager, params.force()?, now())
                            .map_err(|c| conflict(kind, &name, &c))?;
                        let (object, _) = admit(kind, merged, FieldValidation::Ignore)?;
                        // A manifest that omits defaulted fields (an edge's `AfterOk`, say)
                        // normalizes back to the live object: then nothing changed, and the
                        // applier's ownership timestamp must not move either.
                        if same_apart_from_managed_fields(&object, &current) {
                            (current.clone(), warnings)
                        } else {
                            (object, warnings)
                        }
                    }
                };
                check_update(kind, &object, &current, sub)?;
                let mut object = object;
                admission::check(
                    kind,
                    principal,
                    Some(&current),
                    &mut object,
                    sub,
                    &state.admission_facts(),
                )?;
                let client_rv = resource_version_of(&object).map(str::to_string);
                let client_precondition = client_rv.is_some() && client_rv != current_rv;
                let mut object = object;
                if let (false, Some(meta)) = (client_precondition, body::metadata_mut(&mut object)) {
                    meta.insert("resourceVersion".into(), json!(current_rv));
                }
                (Mutation::Update { kind: kind.plural, object, subresource }, warnings, client_precondition)
            }
        };
        let is_create = matches!(mutation, Mutation::Create { .. });
        let is_apply = matches!(patch, Patch::Apply(_));
        match state.store.commit(mutation, dry_run).await {
            Ok(outcome) => {
                let (code, object) = outcome_object(outcome);
                let warnings: Vec<String> = patch_warnings.into_iter().chain(warnings).collect();
                return Ok(object_response(code, &object, None, &warnings, shape));
            }
            // A concurrent write won the race: re-read and re-apply the patch, unless the
            // client itself asked for a specific resourceVersion.
            Err(crate::store::Error::AlreadyExists { .. }) if is_create => continue,
            Err(crate::store::Error::Conflict { .. }) if !is_create && !client_precondition => continue,
            Err(crate::store::Error::NotFound { .. }) if !is_create && is_apply => continue,
            Err(err) => return Err(err.into()),
        }
    }
    Err(ApiError::Conflict {
        plural: kind.plural.into(),
        name: name.clone(),
        message: format!(
            "Operation cannot be fulfilled on {}.hive.dev \"{name}\": too many concurrent writes; try again",
            kind.plural
        ),
    })
}

/// A short, jittered pause before re-applying a patch: up to `attempt` × 200 µs,
/// capped at 5 ms.
fn retry_delay(attempt: usize) -> std::time::Duration {
    let nanos = crate::host::now().timestamp_subsec_nanos();
    let max_us = (attempt as u64 * 200).min(5_000);
    std::time::Duration::from_micros(u64::from(nanos) % max_us.max(1))
}

fn conflict(kind: &KindInfo, name: &str, conflicts: &[apply::Conflict]) -> ApiError {
    ApiError::ApplyConflict {
        plural: kind.plural.into(),
        name: name.into(),
        message: apply::conflict_message(conflicts),
        causes: apply::conflict_causes(conflicts),
    }
}

/// The body of a DELETE (`DeleteOptions`); every field optional.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeleteOptions {
    #[serde(default)]
    preconditions: Option<Preconditions>,
    #[serde(default)]
    dry_run: Vec<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Preconditions {
    uid: Option<String>,
    resource_version: Option<String>,
}

/// `DELETE /apis/hive.dev/v1/{plural}/{name}`, answered in the route's `form`.
pub async fn delete(
    state: AppState,
    kind: &'static KindInfo,
    form: Form,
    name: String,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    let params = Params::from_uri(&uri)?;
    let shape = Shape::negotiate(&headers, Answer::One, form)?;
    let bytes = body::read(body).await?;
    let options: DeleteOptions = if bytes.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        let value = body::parse_object(MediaType::of(&headers), &bytes)?.value;
        body::decode(&value, "invalid DeleteOptions")?
    };
    let dry_run = params.dry_run()? || options.dry_run.iter().any(|d| d == "All");
    let pre = options.preconditions.unwrap_or_default();
    let outcome = state
        .store
        .commit(
            Mutation::Delete {
                kind: kind.plural,
                name,
                uid: pre.uid,
                resource_version: pre.resource_version,
            },
            dry_run,
        )
        .await?;
    let (_, object) = outcome_object(outcome);
    Ok(object_response(StatusCode::OK, &object, None, &[], shape))
}

/// A strategic-merge patch of a core Event is taken as a merge patch; its directives
/// (`$patch`, `$retainKeys`, `$setElementOrder/…`, `$deleteFromPrimitiveList/…`) would
/// mean something else, so they are refused, naming the first.
fn strategic_directives_refused(kind: &KindInfo, name: &str, patch: &Value) -> ApiResult<()> {
    fn first_directive(value: &Value, path: &str) -> Option<String> {
        let Value::Object(fields) = value else { return None };
        fields.iter().find_map(|(key, inner)| {
            let at = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
            if key.starts_with('$') {
                Some(at)
            } else {
                first_directive(inner, &at)
            }
        })
    }
    match first_directive(patch, "") {
        None => Ok(()),
        Some(at) => Err(ApiError::Invalid {
            kind: kind.kind.into(),
            name: name.into(),
            errors: vec![hive_api::validation::ValidationError::new(
                at,
                hive_api::validation::Reason::NotSupported,
                "strategic-merge directives are not supported for events: the patch is applied as a merge patch",
            )],
        }),
    }
}

/// A JSON patch operation written against an `events.k8s.io/v1` Event, with its paths
/// in the core shape the store keeps.
fn events_v1_op_to_core(op: &mut json_patch::PatchOperation) {
    fn core(path: &json_patch::jsonptr::PointerBuf) -> json_patch::jsonptr::PointerBuf {
        let text = path.as_str();
        let rest_at = text[1.min(text.len())..].find('/').map_or(text.len(), |i| i + 1);
        let (first, rest) = text.split_at(rest_at);
        let renamed = hive_api::event::EVENTS_V1_RENAMES
            .iter()
            .find(|(_, v1)| first.strip_prefix('/') == Some(*v1))
            .map_or_else(|| first.to_string(), |(core, _)| format!("/{core}"));
        json_patch::jsonptr::PointerBuf::parse(format!("{renamed}{rest}")).unwrap_or_else(|_| path.clone())
    }
    use json_patch::PatchOperation as Op;
    match op {
        Op::Add(o) => o.path = core(&o.path),
        Op::Remove(o) => o.path = core(&o.path),
        Op::Replace(o) => o.path = core(&o.path),
        Op::Test(o) => o.path = core(&o.path),
        Op::Move(o) => {
            o.path = core(&o.path);
            o.from = core(&o.from);
        }
        Op::Copy(o) => {
            o.path = core(&o.path);
            o.from = core(&o.from);
        }
    }
}
