//! `ApiError`: the one error type of the HTTP layer, rendered as a Kubernetes `Status`.
//! Internal causes are logged, never sent.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hive_api::meta::{Status, StatusCause, StatusDetails, GROUP};
use hive_api::validation::{self, summary, ValidationError};

use crate::store;

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The object (or route) does not exist.
    #[error("{plural}.{GROUP} \"{name}\" not found")]
    NotFound {
        /// Resource plural, e.g. `agents`.
        plural: String,
        /// Object name.
        name: String,
    },
    /// No route serves the path.
    #[error("the server could not find the requested resource")]
    BadRoute,
    /// A create named an object that exists.
    #[error("{plural}.{GROUP} \"{name}\" already exists")]
    AlreadyExists {
        /// Resource plural.
        plural: String,
        /// Object name.
        name: String,
    },
    /// Optimistic concurrency failed or a precondition did not hold.
    #[error("{message}")]
    Conflict {
        /// Resource plural.
        plural: String,
        /// Object name.
        name: String,
        /// The full message.
        message: String,
    },
    /// Server-side apply conflicts with other field managers.
    #[error("{message}")]
    ApplyConflict {
        /// Resource plural.
        plural: String,
        /// Object name.
        name: String,
        /// Upstream-worded message.
        message: String,
        /// One cause per conflicting field.
        causes: Vec<StatusCause>,
    },
    /// The object failed validation; every problem is listed with its field.
    #[error("{kind} \"{name}\" is invalid: {}", summary(.errors))]
    Invalid {
        /// Kind name, e.g. `Agent`.
        kind: String,
        /// Object name.
        name: String,
        /// The problems.
        errors: Vec<ValidationError>,
    },
    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The body is larger than the limit.
    #[error("request entity too large: the body is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The write is larger than the store takes in one transaction (on etcd).
    #[error("request entity too large: {0}")]
    WriteTooLarge(String),
    /// The object the write would store is larger than an object may be.
    #[error(
        "request entity too large: the {kind} would take {size} bytes as JSON, more than the {limit} an object may take"
    )]
    ObjectTooLarge {
        /// The kind, e.g. `Approval`.
        kind: String,
        /// Its size as JSON.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The request's content type is not one the route accepts.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The `Accept` header names only forms this server cannot answer in.
    #[error("{0}")]
    NotAcceptable(String),
    /// The method is not served on this path.
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    /// No or an unknown bearer token.
    #[error("Unauthorized")]
    Unauthorized,
    /// The caller's role does not allow the request.
    #[error("{0}")]
    Forbidden(String),
    /// The requested resource version is older than the retained history.
    #[error("{0}")]
    Expired(String),
    /// A read named a revision the store has not reached, and it did not get there within
    /// the wait (kube-apiserver's `Too large resource version`, a 504 to retry).
    #[error("Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion {
        /// The revision asked for.
        requested: u64,
        /// The store's revision when the wait ended.
        current: u64,
    },
    /// The disk holding the store is full; nothing was written.
    #[error("{0}")]
    InsufficientStorage(String),
    /// The store cannot take writes for now (it is recovering from a failed write).
    #[error("{0}")]
    Unavailable(String),
    /// The request needs what only the leader runs (the scheduler, the fleet), and no
    /// replica runs it right now: the forwarding layer sends it to the leader, or answers
    /// 503 with this message while no replica leads, or while the one just elected starts
    /// what the leader runs (a fraction of a second).
    #[error("no replica runs {0} right now (a leader is being elected, or the one just elected is starting it): {0} runs on the leader only; try again shortly")]
    OnLeader(&'static str),
    /// The caller, or everyone together, holds as many requests of this kind as a limit
    /// allows (`streams.rs`); the message names the limit and its flag.
    #[error("{0}")]
    TooManyRequests(String),
    /// Something failed inside the server; the cause is logged, not sent.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl From<hive_api::AdmitError> for ApiError {
    fn from(err: hive_api::AdmitError) -> ApiError {
        match err {
            hive_api::AdmitError::Invalid { kind, name, errors } => {
                ApiError::Invalid { kind: kind.into(), name, errors }
            }
            other => ApiError::BadRequest(other.to_string()),
        }
    }
}

impl From<crate::client::Error> for ApiError {
    fn from(err: crate::client::Error) -> ApiError {
        use crate::client::Error as E;
        match err {
            E::NotFound { kind, name } => ApiError::NotFound { plural: kind.into(), name },
            E::Invalid { kind, name, errors } => ApiError::Invalid { kind: kind.into(), name, errors },
            E::Store(err) => err.into(),
            other @ (E::Decode { .. } | E::Contended { .. }) => ApiError::Internal(anyhow::Error::new(other)),
        }
    }
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// The HTTP status code.
    pub fn code(&self) -> StatusCode {
        match self {
            ApiError::NotFound { .. } | ApiError::BadRoute => StatusCode::NOT_FOUND,
            ApiError::AlreadyExists { .. } | ApiError::Conflict { .. } | ApiError::ApplyConflict { .. } => {
                StatusCode::CONFLICT
            }
            ApiError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::TooLarge { .. } | ApiError::ObjectTooLarge { .. } | ApiError::WriteTooLarge(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::Expired(_) => StatusCode::GONE,
            ApiError::TooLargeResourceVersion { .. } => StatusCode::GATEWAY_TIMEOUT,
            ApiError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::Unavailable(_) | ApiError::OnLeader(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The Kubernetes `Status` object describing this error.
    pub fn status(&self) -> Status {
        let code = self.code().as_u16();
        let (reason, details) = match self {
            ApiError::NotFound { plural, name } => ("NotFound", Some(details(plural, name, vec![]))),
            ApiError::AlreadyExists { plural, name } => {
                ("AlreadyExists", Some(details(plural, name, vec![])))
            }
            ApiError::Conflict { plural, name, .. } => ("Conflict", Some(details(plural, name, vec![]))),
            ApiError::ApplyConflict { plural, name, causes, .. } => {
                ("Conflict", Some(details(plural, name, bounded_causes(causes))))
            }
            ApiError::Invalid { kind, name, errors } => {
                let causes = validation::bounded(errors.clone())
                    .into_iter()
                    .map(|e| StatusCause {
                        reason: e.reason.as_str().into(),
                        message: e.cause_message(),
                        field: e.field,
                    })
                    .collect();
                (
                    "Invalid",
                    Some(StatusDetails {
                        name: name.clone(),
                        group: GROUP.into(),
                        kind: kind.clone(),
                        causes,
                        ..Default::default()
                    }),
                )
            }
            ApiError::BadRoute => ("NotFound", None),
            ApiError::BadRequest(_) => ("BadRequest", None),
            ApiError::TooLarge { .. } | ApiError::ObjectTooLarge { .. } | ApiError::WriteTooLarge(_) => {
                ("RequestEntityTooLarge", None)
            }
            ApiError::UnsupportedMediaType(_) => ("UnsupportedMediaType", None),
            ApiError::NotAcceptable(_) => ("NotAcceptable", None),
            ApiError::MethodNotAllowed => ("MethodNotAllowed", None),
            ApiError::Unauthorized => ("Unauthorized", None),
            ApiError::Forbidden(_) => ("Forbidden", None),
            ApiError::Expired(_) => ("Expired", None),
            ApiError::TooLargeResourceVersion { .. } => (
                "Timeout",
                Some(StatusDetails {
                    causes: vec![StatusCause {
                        reason: "ResourceVersionTooLarge".into(),
                        message: "Too large resource version".into(),
                        field: String::new(),
                    }],
                    retry_after_seconds: Some(1),
                    ..Default::default()
                }),
            ),
            ApiError::InsufficientStorage(_) => ("InsufficientStorage", Some(retry_after(5))),
            ApiError::Unavailable(_) | ApiError::OnLeader(_) => ("ServiceUnavailable", Some(retry_after(1))),
            ApiError::TooManyRequests(_) => ("TooManyRequests", Some(retry_after(1))),
            ApiError::Internal(_) => ("InternalError", None),
        };
        let mut status = Status::failure(code, reason, self.to_string());
        status.details = details;
        status
    }
}

fn retry_after(seconds: i64) -> StatusDetails {
    StatusDetails { retry_after_seconds: Some(seconds), ..Default::default() }
}

/// The first [`validation::MAX_CAUSES`] causes, then one at the first field left out
/// that counts the rest, as [`validation::bounded`] does for validation errors.
fn bounded_causes(causes: &[StatusCause]) -> Vec<StatusCause> {
    let max = validation::MAX_CAUSES;
    if causes.len() <= max + 1 {
        return causes.to_vec();
    }
    let mut listed = causes[..max].to_vec();
    listed.push(StatusCause {
        reason: validation::Reason::TooMany.as_str().into(),
        message: validation::not_listed(causes.len() - max, "conflicts"),
        field: causes[max].field.clone(),
    });
    listed
}

fn details(plural: &str, name: &str, causes: Vec<StatusCause>) -> StatusDetails {
    StatusDetails {
        name: name.into(),
        group: GROUP.into(),
        kind: plural.into(),
        causes,
        ..Default::default()
    }
}

/// Marks a response whose request belongs on the leader (set by [`ApiError::OnLeader`];
/// the server's `forward` layer sends such a request on).
#[derive(Clone, Copy, Debug)]
pub struct ToLeader;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(err) = &self {
            tracing::error!(error = format!("{err:#}"), "request failed");
        }
        let status = self.status();
        let retry_after = status.details.as_ref().and_then(|d| d.retry_after_seconds);
        // For the audit log: the object a refusal names, so it need not parse the body.
        let written = super::audit_log::Written {
            name: status.details.as_ref().map(|d| d.name.clone()).filter(|n| !n.is_empty()),
            revision: 0,
        };
        let body = serde_json::to_vec(&status).unwrap_or_default();
        let mut response = (self.code(), body).into_response();
        let headers = response.headers_mut();
        headers.insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(seconds) = retry_after {
            headers.insert(axum::http::header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response.extensions_mut().insert(written);
        if matches!(self, ApiError::OnLeader(_)) {
            response.extensions_mut().insert(ToLeader);
        }
        response
    }
}

impl From<store::Error> for ApiError {
    fn from(err: store::Error) -> Self {
        match err {
            store::Error::NotFound { kind, name } => ApiError::NotFound { plural: kind.to_string(), name },
            store::Error::AlreadyExists { kind, name } => {
                ApiError::AlreadyExists { plural: kind.to_string(), name }
            }
            store::Error::Conflict { kind, name, message } => {
                ApiError::Conflict { plural: kind.to_string(), name, message }
            }
            store::Error::Expired { requested, oldest } => {
                ApiError::Expired(format!("too old resource version: {requested} ({oldest})"))
            }
            full @ store::Error::DiskFull { .. } => ApiError::InsufficientStorage(full.to_string()),
            down @ (store::Error::Unavailable { .. } | store::Error::NotLeader { .. }) => {
                ApiError::Unavailable(down.to_string())
            }
            store::Error::TooLarge { message } => ApiError::WriteTooLarge(message),
            other => ApiError::Internal(anyhow::Error::new(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use hive_api::validation::{Reason, MAX_CAUSES};

    use super::*;

    fn causes_of(err: &ApiError) -> Vec<StatusCause> {
        err.status().details.map(|d| d.causes).unwrap_or_default()
    }

    #[test]
    fn every_refusal_lists_at_most_max_causes_and_counts_the_rest() {
        let errors: Vec<ValidationError> = (0..5000)
            .map(|i| ValidationError::new(format!("spec.nodes[{i}].id"), Reason::Invalid, "bad"))
            .collect();
        let invalid = ApiError::Invalid { kind: "Job".into(), name: "j".into(), errors };
        let causes = causes_of(&invalid);
        assert_eq!(causes.len(), MAX_CAUSES + 1);
        let last = &causes[MAX_CAUSES];
        assert_eq!((last.field.as_str(), last.reason.as_str()), ("spec.nodes[50].id", "FieldValueTooMany"));
        assert!(last.message.starts_with("Too many: 4950 more problems not listed"), "{}", last.message);
        let message = invalid.status().message;
        assert!(message.len() < 4 * 1024, "{} bytes", message.len());
        assert!(message.contains("4950 more problems not listed"), "{message}");

        let conflicts: Vec<StatusCause> = (0..3000)
            .map(|i| StatusCause {
                reason: "FieldManagerConflict".into(),
                message: "conflict with \"alice\"".into(),
                field: format!(".metadata.labels.l{i}"),
            })
            .collect();
        let conflict = ApiError::ApplyConflict {
            plural: "agents".into(),
            name: "a".into(),
            message: "Apply failed with 3000 conflicts".into(),
            causes: conflicts,
        };
        let causes = causes_of(&conflict);
        assert_eq!(causes.len(), MAX_CAUSES + 1);
        assert_eq!(causes[MAX_CAUSES].field, ".metadata.labels.l50");
        assert!(causes[MAX_CAUSES].message.starts_with("2950 more conflicts not listed"));
    }
}
