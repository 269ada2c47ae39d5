//! Query parameters of the resource routes, parsed with errors that name the parameter.

use axum::http::Uri;
use serde::Deserialize;

use super::error::{ApiError, ApiResult};

/// Every query parameter the resource routes understand. Unknown parameters are
/// ignored, as the Kubernetes API server does (kubectl sends `timeout=32s` and others).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Params {
    /// Label selector for list and watch.
    pub label_selector: Option<String>,
    /// Field selector for list and watch (`metadata.name=`).
    pub field_selector: Option<String>,
    /// Page size of a list.
    pub limit: Option<String>,
    /// Continue token of a list.
    #[serde(rename = "continue")]
    pub continue_: Option<String>,
    /// Resource version to list or watch from.
    pub resource_version: Option<String>,
    /// `NotOlderThan` / `Exact`.
    pub resource_version_match: Option<String>,
    /// Start a watch instead of listing.
    pub watch: Option<String>,
    /// Send periodic BOOKMARK events.
    pub allow_watch_bookmarks: Option<String>,
    /// End the watch after this many seconds.
    pub timeout_seconds: Option<String>,
    /// Start a watch with ADDED events for every current object and a bookmark.
    pub send_initial_events: Option<String>,
    /// `All` to run the request without persisting.
    pub dry_run: Option<String>,
    /// Name of the actor making the change (server-side apply and managedFields).
    pub field_manager: Option<String>,
    /// `Strict`, `Warn` or `Ignore`: how unknown fields and keys given twice are treated.
    pub field_validation: Option<String>,
    /// Server-side apply: take ownership of conflicting fields.
    pub force: Option<String>,
    /// Table output: what `rows[].object` carries.
    pub include_object: Option<String>,
}

fn flag(name: &str, value: &Option<String>) -> ApiResult<bool> {
    match value.as_deref() {
        None | Some("") | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => {
            Err(ApiError::BadRequest(format!("{name}: invalid boolean {other:?}; use true or false")))
        }
    }
}

pub use hive_api::FieldValidation;

impl Params {
    /// Parses the query string of `uri`.
    pub fn from_uri(uri: &Uri) -> ApiResult<Params> {
        let query = uri.query().unwrap_or("");
        let params = axum::extract::Query::<Params>::try_from_uri(uri).map(|q| q.0).map_err(|e| {
            ApiError::BadRequest(format!("invalid query string {query:?}: {}", e.body_text()))
        })?;
        params.check()?;
        Ok(params)
    }

    /// Checks every parameter the request carries, whether or not its route reads it: a
    /// list used to ignore its watch-only flags, so `allowWatchBookmarks=-1` was a 200
    /// there and a 400 on a watch. A bad value is a 400 naming the parameter.
    fn check(&self) -> ApiResult<()> {
        self.watch()?;
        self.bookmarks()?;
        self.send_initial_events()?;
        self.force()?;
        self.dry_run()?;
        self.limit()?;
        self.timeout_seconds()?;
        self.field_validation()?;
        super::table::IncludeObject::parse(self.include_object.as_deref()).map_err(ApiError::BadRequest)?;
        match self.resource_version_match.as_deref() {
            None | Some("") | Some("NotOlderThan") | Some("Exact") => Ok(()),
            Some(other) => Err(ApiError::BadRequest(format!(
                "resourceVersionMatch: unsupported value {other:?}: supported values are NotOlderThan, Exact"
            ))),
        }
    }

    /// `watch=true`.
    pub fn watch(&self) -> ApiResult<bool> {
        flag("watch", &self.watch)
    }

    /// `allowWatchBookmarks=true`.
    pub fn bookmarks(&self) -> ApiResult<bool> {
        flag("allowWatchBookmarks", &self.allow_watch_bookmarks)
    }

    /// `sendInitialEvents=true`.
    pub fn send_initial_events(&self) -> ApiResult<bool> {
        flag("sendInitialEvents", &self.send_initial_events)
    }

    /// `force=true`.
    pub fn force(&self) -> ApiResult<bool> {
        flag("force", &self.force)
    }

    /// `dryRun=All` (any other non-empty value is an error, as upstream).
    pub fn dry_run(&self) -> ApiResult<bool> {
        match self.dry_run.as_deref() {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::BadRequest(format!(
                "dryRun: unsupported value {other:?}: supported values are All"
            ))),
        }
    }

    /// `limit=N` (0 or absent: no limit).
    pub fn limit(&self) -> ApiResult<Option<usize>> {
        match self.limit.as_deref() {
            None | Some("") | Some("0") => Ok(None),
            Some(n) => n.parse::<usize>().map(Some).map_err(|_| {
                ApiError::BadRequest(format!("limit: invalid value {n:?}; expected a non-negative integer"))
            }),
        }
    }

    /// `timeoutSeconds=N`.
    pub fn timeout_seconds(&self) -> ApiResult<Option<u64>> {
        match self.timeout_seconds.as_deref() {
            None | Some("") => Ok(None),
            Some(n) => n.parse::<u64>().map(Some).map_err(|_| {
                ApiError::BadRequest(format!(
                    "timeoutSeconds: invalid value {n:?}; expected a non-negative integer"
                ))
            }),
        }
    }

    /// `fieldValidation`; absent means `Warn`, as in Kubernetes 1.27+.
    pub fn field_validation(&self) -> ApiResult<FieldValidation> {
        match self.field_validation.as_deref() {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(ApiError::BadRequest(format!(
                "fieldValidation: unsupported value {other:?}: supported values are Strict, Warn, Ignore"
            ))),
        }
    }

    /// `resourceVersion` parsed as a store revision: `None` for unset or `"0"`.
    pub fn revision(&self) -> ApiResult<Option<u64>> {
        match self.resource_version.as_deref() {
            None | Some("") | Some("0") => Ok(None),
            Some(rv) => rv.parse::<u64>().map(Some).map_err(|_| {
                ApiError::BadRequest(format!(
                    "resourceVersion: invalid value {rv:?}; expected a revision number"
                ))
            }),
        }
    }

    /// `resourceVersion` parsed as [`Params::revision`], once the store has reached it: a
    /// revision newer than any committed yet waits up to [`FUTURE_REVISION_WAIT`], then
    /// is a 504 `Too large resource version` (as kube-apiserver answers), never a watch
    /// that stays silent or a list older than what was asked for.
    pub async fn reached_revision(&self, store: &crate::store::Store) -> ApiResult<Option<u64>> {
        let requested = self.revision()?;
        let most_recent = matches!(self.resource_version.as_deref(), None | Some(""));
        if most_recent && self.continue_.as_deref().is_none_or(str::is_empty) {
            // No resourceVersion: "the most recent", as of when the request came, so it
            // holds what another replica acknowledged just before (a continued list
            // stays at its first page's revision).
            store.sync().await?;
        }
        if let Some(requested) = requested {
            if requested > store.revision() && !store.wait_for_revision(requested, FUTURE_REVISION_WAIT).await
            {
                return Err(ApiError::TooLargeResourceVersion { requested, current: store.revision() });
            }
        }
        Ok(requested)
    }
}

/// How long a read that names a future revision waits for it (kube-apiserver's 3 s).
pub const FUTURE_REVISION_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
