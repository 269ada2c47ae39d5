//! The request id: every request gets one, carried on its log span (`request_id`) and
//! sent back in the `X-Request-Id` and `Audit-Id` response headers (kube-apiserver's
//! name for the same thing), so an error a client saw can be found in the daemon's log
//! and in the API audit log.
//!
//! A client may choose the id by sending `X-Request-Id`; one that is not
//! [`well_formed`] is replaced by a fresh id rather than refused, so no client is broken
//! by a tracing header it forwards. The id is not written into `Status` bodies: the
//! Kubernetes `StatusDetails` schema has no field for it, and kubectl shows the headers
//! with `-v=8`.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument as _;

/// The request and response header of the id.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// kube-apiserver's response header for the same id.
pub const AUDIT_ID: HeaderName = HeaderName::from_static("audit-id");

/// The longest id a client may choose.
pub const MAX_LEN: usize = 64;

/// One request's id, in the request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(pub Arc<str>);

impl RequestId {
    /// A fresh random id (a UUID).
    pub fn fresh() -> RequestId {
        RequestId(Arc::from(uuid::Uuid::new_v4().to_string()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether a client's id may be used as it is: 1 to [`MAX_LEN`] characters, each an
/// ASCII letter, digit, `-`, `_`, `.` or `:` (UUIDs, W3C trace ids, most tracers' ids),
/// so it is safe in a header, a log line and a file.
pub fn well_formed(id: &str) -> bool {
    (1..=MAX_LEN).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// The middleware: takes the client's id (or mints one), runs the request inside a
/// `request` span carrying it, and echoes it in the response headers.
pub async fn assign(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(&HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| well_formed(v))
        .map(|v| RequestId(Arc::from(v)))
        .unwrap_or_else(RequestId::fresh);
    request.extensions_mut().insert(id.clone());
    let span = tracing::info_span!("request", request_id = %id.as_str());
    let mut response = next.run(request).instrument(span).await;
    // A well-formed id is a valid header value; a fresh one is a UUID.
    if let Ok(value) = HeaderValue::from_str(id.as_str()) {
        let headers = response.headers_mut();
        headers.insert(AUDIT_ID, value.clone());
        headers.insert(HEADER, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_ids_a_client_may_choose() {
        for good in ["a", "0b7c-4f", "trace_1.2:3", &"x".repeat(MAX_LEN), &RequestId::fresh().0] {
            assert!(well_formed(good), "{good:?}");
        }
        for bad in ["", " ", "a b", "a\nb", "é", "a/b", "a\"b", &"x".repeat(MAX_LEN + 1)] {
            assert!(!well_formed(bad), "{bad:?}");
        }
    }
}
