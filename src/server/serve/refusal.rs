//! A connection over `--max-connections`: answered with a 503 `Status` and
//! `Retry-After` when that is cheap, closed at once otherwise — never held open.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use bytes::Bytes;
use hive_api::meta::Status;
use http_body_util::Full;
use hyper::Response;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// How many refused connections may be getting their 503 at once. Each costs a TLS
/// handshake and a descriptor for up to [`ANSWER_WITHIN`]; past this many, a refused
/// connection is closed without an answer.
pub(super) const ANSWERED_AT_ONCE: usize = 16;

/// How long a refused connection may take for its handshake, its request head and the
/// 503, all told.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// What clients are told to wait before they try again, in seconds.
const RETRY_AFTER_SECONDS: &str = "1";

/// Refuses `tcp`: a 503 when one of the [`ANSWERED_AT_ONCE`] places is free, else an
/// immediate close. Returns at once; the answer is written in its own task.
pub(super) fn refuse(tcp: TcpStream, acceptor: TlsAcceptor, answering: &Arc<Semaphore>) {
    let Ok(place) = answering.clone().try_acquire_owned() else {
        drop(tcp);
        return;
    };
    tokio::spawn(async move {
        let _place = place;
        let answer = async {
            let tls = acceptor.accept(tcp).await.ok()?;
            let service = hyper::service::service_fn(|_request| async { Ok::<_, Infallible>(unavailable()) });
            hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(tls), service)
                .await
                .ok()
        };
        let _ = tokio::time::timeout(ANSWER_WITHIN, answer).await;
    });
}

/// The 503: a Kubernetes `Status` (`ServiceUnavailable`), `Retry-After`, and
/// `Connection: close` (the connection is not kept alive).
fn unavailable() -> Response<Full<Bytes>> {
    let status = Status::failure(
        StatusCode::SERVICE_UNAVAILABLE.as_u16(),
        "ServiceUnavailable",
        "the server has too many open connections; retry later",
    );
    let body = serde_json::to_vec(&status).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECONDS));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_a_503_status_with_retry_after() {
        let response = unavailable();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    }
}
