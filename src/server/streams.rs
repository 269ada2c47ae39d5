//! Streaming answers (watches, followed logs, telemetry) end when the credential that
//! opened them stops being valid: a revoked token or a dead dashboard session is checked
//! every [`LIVENESS_CHECK`], not only when the client reconnects.

use std::time::Duration;

use axum::body::{Body, HttpBody as _};
use axum::response::Response;
use futures_util::StreamExt as _;

/// How often an open stream checks that its credential is still valid; it ends within
/// this long after the token is revoked (or the session ends).
pub const LIVENESS_CHECK: Duration = Duration::from_secs(15);

/// Whether `response` has a body of known size, i.e. is not a stream.
pub fn is_sized(response: &Response) -> bool {
    response.body().size_hint().exact().is_some()
}

/// `response` with its body cut off once `live()` says no (checked every
/// [`LIVENESS_CHECK`]). A body of known size (any non-streaming answer) is returned as it
/// is, keeping its `Content-Length`.
pub fn end_when_dead(response: Response, live: impl Fn() -> bool + Send + 'static) -> Response {
    if is_sized(&response) {
        return response;
    }
    let ended = async move {
        let mut check = tokio::time::interval(LIVENESS_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        check.tick().await; // the first tick is immediate; the request was just allowed
        loop {
            check.tick().await;
            if !live() {
                return;
            }
        }
    };
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::from_stream(body.into_data_stream().take_until(ended)))
}
