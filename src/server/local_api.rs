//! The authenticated API as an in-process service: a page shell (the dashboard's) asks
//! it what any client would ask over HTTP — whether an object exists — with the page
//! request's own session cookie, so the answer passes the same authentication, roles,
//! audit and store path as the browser's own calls. Nothing here reads the store.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::Router;
use tower::ServiceExt as _;

use super::request_id::RequestId;
use crate::auth::sessions::Sessions;

/// The API routes behind `authenticate` (and the audit log), with their state, in every
/// request's extensions.
#[derive(Clone)]
pub struct LocalApi(pub(super) Router);

impl LocalApi {
    /// The status of `GET path` asked with the cookie in `headers`, the page's
    /// `sessions` and its request id (so the audit log ties it to the page request).
    pub async fn status_of(
        &self,
        path: &str,
        headers: &HeaderMap,
        sessions: &Sessions,
        id: Option<&RequestId>,
    ) -> StatusCode {
        let mut request = Request::get(path);
        if let Some(cookie) = headers.get(header::COOKIE) {
            request = request.header(header::COOKIE, cookie);
        }
        let Ok(mut request) = request.header(header::ACCEPT, "application/json").body(Body::empty()) else {
            return StatusCode::BAD_REQUEST;
        };
        request.extensions_mut().insert(sessions.clone());
        if let Some(id) = id {
            request.extensions_mut().insert(id.clone());
        }
        match self.0.clone().oneshot(request).await {
            Ok(response) => response.status(),
            Err(never) => match never {},
        }
    }
}
