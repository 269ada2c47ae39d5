//! Forwarding to the leader. With the store on etcd every replica serves the API from
//! its own cache, but only the elected leader runs the scheduler and the fleet. A route
//! that needs them answers [`ApiError::OnLeader`] on a replica that does not lead; this
//! layer then sends the request, as the client made it (its token, its body), to the
//! leader's API and streams the leader's answer back, so a client may talk to any
//! replica. While no replica leads the client gets that 503 with `Retry-After: 1`.
//!
//! Architecture Invariant: a request is forwarded at most once (the leader it reaches
//! answers it itself, even if it has just stopped leading), and only a request a route
//! refused before it changed anything: `OnLeader` is returned before any write.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ToLeader};
use super::AppState;

/// Who leads, as this replica knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leader {
    /// Nobody, or not known yet.
    Unknown,
    /// This replica.
    Me,
    /// Another replica: its name and API URL.
    Other { name: String, url: String },
}

/// The header a forwarded request carries: the replica that forwarded it.
pub const FORWARDED_BY: &str = "hive-forwarded-by";

/// This replica among others on one store (see the module documentation).
pub struct Replication {
    name: String,
    leader: tokio::sync::watch::Receiver<Leader>,
    client: reqwest::Client,
}

impl std::fmt::Debug for Replication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replication")
            .field("name", &self.name)
            .field("leader", &*self.leader.borrow())
            .finish()
    }
}

impl Replication {
    /// Replica `name`, following `leader`, reaching other replicas over HTTPS that
    /// `ca_pem` (the CA every replica's serving certificate is issued by) vouches for.
    pub fn new(
        name: String,
        leader: tokio::sync::watch::Receiver<Leader>,
        ca_pem: Option<&str>,
    ) -> anyhow::Result<Replication> {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .connect_timeout(std::time::Duration::from_secs(2))
            .user_agent(format!("hive/{} (replica {name})", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem.as_bytes())? {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(Replication { name, leader, client: builder.build()? })
    }

    /// This replica's name (host and API address).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Who leads now.
    pub fn leader(&self) -> Leader {
        self.leader.borrow().clone()
    }
}

/// The layer (see the module documentation), inside authentication. A replica that
/// leads, or that is not one of several, passes every request straight through without
/// buffering it.
pub async fn layer(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(replication) = state.replication.clone() else {
        return next.run(request).await;
    };
    if state.jobs.get().is_some() || request.headers().contains_key(FORWARDED_BY) {
        return next.run(request).await;
    }
    let method = request.method().clone();
    let uri = request.uri().clone();
    let headers = request.headers().clone();
    // A dashboard session's cookie and CSRF header go to the leader unchanged: the
    // replicas share the sessions, so the leader checks them as this replica did.

    // Kept, so that the request can be sent on if the route says it belongs on the
    // leader: at most what a handler would read of it.
    let (request, body) = if has_body(&method) {
        let (parts, body) = request.into_parts();
        let bytes = match super::body::read(body).await {
            Ok(bytes) => bytes,
            Err(e) => return e.into_response(),
        };
        (Request::from_parts(parts, Body::from(bytes.clone())), bytes)
    } else {
        (request, bytes::Bytes::new())
    };
    let response = next.run(request).await;
    if response.extensions().get::<ToLeader>().is_none() {
        return response;
    }
    match replication.leader() {
        Leader::Other { url, name } => {
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            tracing::debug!(%method, path, leader = name, "forwarding to the leader");
            send(&replication, method, &url, path, &headers, body).await
        }
        Leader::Me | Leader::Unknown => response,
    }
}

fn has_body(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

/// Headers of one hop that are not sent on (RFC 9110 §7.6.1), and those the client
/// computes again.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

async fn send(
    replication: &Replication,
    method: Method,
    leader: &str,
    path: &str,
    headers: &HeaderMap,
    body: bytes::Bytes,
) -> Response {
    let mut request = replication.client.request(method, format!("{}{path}", leader.trim_end_matches('/')));
    for (name, value) in headers.iter().filter(|(name, _)| !hop_by_hop(name)) {
        request = request.header(name, value);
    }
    request = request.header(FORWARDED_BY, replication.name.as_str()).body(body);
    match request.send().await {
        Ok(answer) => {
            let mut response = Response::builder().status(answer.status());
            for (name, value) in answer.headers().iter().filter(|(name, _)| !hop_by_hop(name)) {
                response = response.header(name, value);
            }
            response
                .header(header::VIA, format!("1.1 {}", replication.name))
                .body(Body::from_stream(answer.bytes_stream()))
                .unwrap_or_else(|e| ApiError::Internal(e.into()).into_response())
        }
        Err(e) => {
            tracing::warn!(leader, error = %e, "cannot reach the leader to forward a request");
            ApiError::Unavailable(format!(
                "this replica does not lead and the leader ({leader}) cannot be reached now; try again shortly"
            ))
            .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;
    use crate::auth::{Role, TokenStore};
    use crate::server::{app, ServerConfig};
    use crate::store::{Store, StoreConfig};

    #[tokio::test]
    async fn what_only_the_leader_runs_is_a_503_to_retry_while_no_replica_leads_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let tokens = TokenStore::open(dir.path()).unwrap();
        let token = tokens.create("ops", Role::Operator).unwrap();
        let (_leader, following) = tokio::sync::watch::channel(Leader::Unknown);
        let replication = Replication::new("here/127.0.0.1:1".into(), following, None).unwrap();
        let app =
            app(AppState::new(store.clone(), tokens, ServerConfig::default()).with_replication(replication));
        let job = serde_json::json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"template": "Reconcile", "nodes": [
                {"id": "n", "kind": "SetWanted", "agent": "a", "params": {"wanted": "Offline"}}]}});
        let request = Request::post("/apis/hive.dev/v1/jobs")
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(Body::from(job.to_string()))
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status["reason"], "ServiceUnavailable", "{status}");
        assert!(
            status["message"].as_str().unwrap().contains("the scheduler runs on the leader only"),
            "{status}"
        );
        assert!(store.get("jobs", "j").is_none(), "nothing was written");

        // A plain write is this replica's own to answer.
        let agent = serde_json::json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "a"},
            "spec": {"config": {"repo": "https://git.example.invalid/a.git", "rev": "main"},
                     "runtime": {"type": "process", "process": {"command": ["./run.sh"]}}}});
        let request = Request::post("/apis/hive.dev/v1/agents")
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(Body::from(agent.to_string()))
            .unwrap();
        assert_eq!(app.oneshot(request).await.unwrap().status(), StatusCode::CREATED);
    }
}
