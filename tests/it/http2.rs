//! HTTP/2 by ALPN beside HTTP/1.1 (issue 13): many watches on one connection, stock
//! kubectl, HTTP/1.1-only clients, the header and idle timeouts on HTTP/2, and a stuck
//! watch reset without its connection. Each connection here is made by hand (hyper's
//! HTTP/2 client over our own TLS stream), so "one connection" is exactly one. Every
//! connection goes to 127.0.0.1 and every wait is bounded.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::harness::{agent, Daemon};

const AGENTS: &str = "/apis/hive.dev/v1/agents";

/// A TLS connection to the daemon offering `alpn`.
pub(crate) async fn tls(d: &Daemon, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &d.ca_pem[..]) {
        roots.add(cert.expect("CA PEM")).expect("CA certificate");
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let addr: std::net::SocketAddr =
        d.url.strip_prefix("https://").expect("an https URL").parse().expect("IP:PORT");
    let tcp = TcpStream::connect(addr).await.expect("TCP connect");
    let name = rustls::pki_types::ServerName::try_from(addr.ip().to_string()).expect("IP name");
    tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.expect("TLS handshake")
}

/// One HTTP/2 connection: its request sender, and the task driving it (it ends when
/// the daemon closes the connection).
pub(crate) struct H2 {
    send: SendRequest<Full<Bytes>>,
    conn: tokio::task::JoinHandle<hyper::Result<()>>,
    /// The bearer token its requests carry (the daemon's admin token unless changed).
    pub(crate) token: String,
}

impl H2 {
    pub(crate) async fn connect(d: &Daemon) -> H2 {
        let tls = tls(d, &[b"h2"]).await;
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "the daemon chose h2");
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("HTTP/2 handshake");
        H2 { send, conn: tokio::spawn(conn), token: d.token.clone() }
    }

    pub(crate) async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> hyper::Response<hyper::body::Incoming> {
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("https://127.0.0.1{path}"))
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .body(Full::new(body.map(|b| Bytes::from(b.to_string())).unwrap_or_default()))
            .expect("request");
        let mut send = self.send.clone();
        let response = tokio::time::timeout(Duration::from_secs(30), send.send_request(request))
            .await
            .expect("an answer within 30 s")
            .expect("the request is served");
        assert_eq!(response.version(), hyper::Version::HTTP_2);
        response
    }

    /// A request's status and JSON body.
    pub(crate) async fn json(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let response = self.request(method, path, body).await;
        let code = response.status().as_u16();
        let bytes = response.into_body().collect().await.expect("the body").to_bytes();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// Opens a watch of Agents from `rv` on this connection.
    async fn watch(&self, rv: &str) -> Events {
        let response = self.request("GET", &format!("{AGENTS}?watch=true&resourceVersion={rv}"), None).await;
        assert_eq!(response.status().as_u16(), 200, "watch status");
        Events { body: response.into_body(), buf: Vec::new() }
    }
}

/// A watch's events, read line by line.
struct Events {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
}

impl Events {
    /// The next event; `Err` when the stream ends or fails (`true` if it failed) or
    /// `within` passes first.
    async fn next(&mut self, within: Duration) -> Result<Value, &'static str> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(at) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=at).collect();
                return Ok(serde_json::from_slice(&line).expect("an event is JSON"));
            }
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) => return Err("no event in time"),
                Ok(None) => return Err("the stream ended"),
                Ok(Some(Err(_))) => return Err("the stream failed"),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

/// The current resourceVersion of the Agents list.
async fn list_rv(h2: &H2) -> String {
    let (code, list) = h2.json("GET", AGENTS, None).await;
    assert_eq!(code, 200);
    list["metadata"]["resourceVersion"].as_str().expect("a list RV").to_string()
}

/// Twenty watches on ONE connection — under a cap of two connections — each receive
/// every event, while the writes go over the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_watches_share_one_http2_connection_and_each_gets_every_event() {
    const WATCHES: usize = 20;
    const WRITES: usize = 5;
    let d = Daemon::start_with(&["--max-connections", "2"]);
    let h2 = H2::connect(&d).await;
    let rv = list_rv(&h2).await;
    let mut watches = join_all((0..WATCHES).map(|_| h2.watch(&rv))).await;
    for i in 0..WRITES {
        let (code, body) = h2.json("POST", AGENTS, Some(&agent(&format!("a{i}")))).await;
        assert_eq!(code, 201, "create a{i}: {body}");
    }
    let seen = join_all(watches.iter_mut().map(|watch| async move {
        let mut names = Vec::new();
        while names.len() < WRITES {
            match watch.next(Duration::from_secs(60)).await {
                Ok(event) if event["type"] == "ADDED" => {
                    names.push(event["object"]["metadata"]["name"].as_str().unwrap_or_default().to_string())
                }
                Ok(_) => {}
                Err(why) => return Err(format!("{why} after {names:?}")),
            }
        }
        Ok(names)
    }))
    .await;
    let expected: Vec<String> = (0..WRITES).map(|i| format!("a{i}")).collect();
    for (i, names) in seen.into_iter().enumerate() {
        assert_eq!(names.as_ref(), Ok(&expected), "watch {i}");
    }
    assert!(!h2.conn.is_finished(), "the connection is still open");
}

/// A client that speaks only HTTP/1.1 is served as before; one that offers both gets
/// HTTP/2.
#[tokio::test]
async fn http1_only_clients_are_still_served_and_others_get_http2() {
    let d = Daemon::start();
    let cert = reqwest::Certificate::from_pem(&d.ca_pem).expect("CA PEM");
    let http1 = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(cert)
        .http1_only()
        .build()
        .expect("client");
    let get = |client: reqwest::Client, path: String| {
        let token = d.token.clone();
        let url = format!("{}{path}", d.url);
        async move { client.get(url).bearer_auth(token).send().await.expect("a response") }
    };
    let version = get(http1.clone(), "/version".into()).await;
    assert_eq!((version.status().as_u16(), version.version()), (200, reqwest::Version::HTTP_11));

    // A watch over HTTP/1.1 gets its event.
    let mut watch = get(http1, format!("{AGENTS}?watch=true&resourceVersion=0")).await;
    assert_eq!(watch.version(), reqwest::Version::HTTP_11);
    let api = d.client();
    assert_eq!(api.post(AGENTS, &agent("old-school")).await.code, 201);
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("old-school") {
        let chunk = tokio::time::timeout(Duration::from_secs(30), watch.chunk()).await;
        got.extend_from_slice(&chunk.expect("an event within 30 s").expect("the stream").expect("open"));
    }

    // The suite's own client offers h2 and http/1.1: it gets HTTP/2.
    let version = get(api.http.clone(), "/version".into()).await;
    assert_eq!(version.version(), reqwest::Version::HTTP_2);
}

/// Stock kubectl negotiates HTTP/2 and works over it.
#[test]
fn kubectl_is_served_over_http2() {
    let d = Daemon::start_with(&["--log", "info,hive::server::serve=debug"]);
    let out = d.kubectl(&["get", "agents"]);
    assert!(out.status.success(), "kubectl failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(
        d.log().contains("serving a connection over HTTP/2"),
        "kubectl's connection was not HTTP/2:\n{}",
        d.log()
    );
}

/// A connection that negotiated h2 and sends the preface and its SETTINGS but no
/// request is closed at the header timeout.
#[tokio::test]
async fn a_silent_http2_connection_is_closed_at_the_header_timeout() {
    let d = Daemon::start_with(&["--http-header-timeout", "2s"]);
    let mut conn = tls(&d, &[b"h2"]).await;
    assert_eq!(conn.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    // The client preface: the magic, then an empty SETTINGS frame.
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await.unwrap();
    conn.flush().await.unwrap();
    // The daemon answers with its own SETTINGS (it speaks HTTP/2), then, with no request
    // coming, closes the connection.
    let mut head = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut head))
        .await
        .expect("the daemon's SETTINGS within 10 s")
        .expect("a frame head");
    assert_eq!(head[3], 0x4, "the first frame is SETTINGS");
    let closed = tokio::time::timeout(Duration::from_secs(30), async {
        let mut buf = [0u8; 4096];
        while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
    assert!(closed.is_ok(), "the silent connection is still open 30 s later");
}

/// An HTTP/2 connection stays open while a watch is open on it, however long; once no
/// stream is open it is closed (GOAWAY, cleanly) after the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed_but_not_while_a_watch_is_open() {
    let d = Daemon::start_with(&["--http-header-timeout", "1s", "--http-idle-timeout", "2s"]);
    let h2 = H2::connect(&d).await;
    let rv = list_rv(&h2).await;
    let mut watch = h2.watch(&rv).await;
    // Three idle timeouts with only the watch open: nothing is closed.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!h2.conn.is_finished(), "the connection was closed under an open watch");
    let (code, _) = h2.json("POST", AGENTS, Some(&agent("late"))).await;
    assert_eq!(code, 201);
    let event = watch.next(Duration::from_secs(30)).await.expect("the watch still delivers");
    assert_eq!(event["object"]["metadata"]["name"], "late");
    // The watch ends (the client resets its stream); the connection is now idle.
    drop(watch);
    let H2 { send, conn, .. } = h2;
    let ended = tokio::time::timeout(Duration::from_secs(30), conn).await;
    let ended = ended.expect("the idle connection is still open 30 s later").expect("the task");
    assert!(ended.is_ok(), "the connection was not closed cleanly: {ended:?}");
    drop(send);
}

/// A watch whose client reads nothing is ended after the write timeout even though
/// HTTP/2 flow control stops the daemon from writing to it: its stream is reset, and a
/// watch on the same connection that keeps up goes on getting every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_http2_watch_is_reset_and_its_connection_goes_on() {
    const WRITES: usize = 60;
    let d = Daemon::start_with(&["--watch-buffer-bytes", "256M", "--watch-write-timeout", "2s"]);
    let h2 = H2::connect(&d).await;
    let (code, created) = h2.json("POST", AGENTS, Some(&agent("big"))).await;
    assert_eq!(code, 201);
    let rv = created["metadata"]["resourceVersion"].as_str().expect("RV").to_string();
    let mut stuck = h2.watch(&rv).await;
    let mut keeping_up = h2.watch(&rv).await;
    let reader = tokio::spawn(async move {
        let mut modified = 0;
        while modified < WRITES {
            match keeping_up.next(Duration::from_secs(60)).await {
                Ok(event) if event["type"] == "MODIFIED" => modified += 1,
                Ok(event) => panic!("the watch that keeps up got {event}"),
                Err(why) => panic!("the watch that keeps up: {why} after {modified} events"),
            }
        }
        keeping_up
    });
    // 60 × 200 KiB: far more than the stuck stream's flow-control window.
    let blob = "x".repeat(200 * 1024);
    for i in 0..WRITES {
        let patch = json!({"metadata": {"annotations": {"blob": format!("{i}{blob}")}}});
        let request = hyper::Request::builder()
            .method("PATCH")
            .uri(format!("https://127.0.0.1{AGENTS}/big"))
            .header("authorization", format!("Bearer {}", h2.token))
            .header("content-type", "application/merge-patch+json")
            .body(Full::new(Bytes::from(patch.to_string())))
            .unwrap();
        let response = h2.send.clone().send_request(request).await.expect("the patch is served");
        assert_eq!(response.status().as_u16(), 200, "patch {i}");
    }
    let mut keeping_up = reader.await.expect("the watch that keeps up got every event");
    // Without a byte read from it, the stuck stream is gone from the daemon: only the
    // watch that keeps up is still open. (Reading it would unblock it: hyper would then
    // see the body's own error.)
    open_watches_become(&d, 1).await;
    // The stuck stream: what fit in its window, then a reset.
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match stuck.next(Duration::from_secs(30)).await {
                Ok(_) => continue,
                Err(why) => return why,
            }
        }
    })
    .await;
    assert_eq!(ended, Ok("the stream failed"), "the stuck watch was not reset");
    // The connection and its other watch are alive.
    let (code, _) = h2.json("POST", AGENTS, Some(&agent("after"))).await;
    assert_eq!(code, 201);
    let event = keeping_up.next(Duration::from_secs(30)).await.expect("the other watch goes on");
    assert_eq!(event["object"]["metadata"]["name"], "after");
}

/// The same over HTTP/1.1: a watch whose client reads nothing, its socket full, is
/// closed after the write timeout without a byte read from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_http1_watch_is_closed_without_reading_it() {
    const WRITES: usize = 100;
    let d = Daemon::start_with(&["--watch-buffer-bytes", "256M", "--watch-write-timeout", "2s"]);
    let api = d.client();
    let created = api.post(AGENTS, &agent("big")).await;
    assert_eq!(created.code, 201);
    let rv = created.body["metadata"]["resourceVersion"].as_str().expect("RV").to_string();
    let cert = reqwest::Certificate::from_pem(&d.ca_pem).expect("CA PEM");
    let http1 = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(cert)
        .http1_only()
        .build()
        .expect("client");
    let stuck = http1
        .get(format!("{}{AGENTS}?watch=true&resourceVersion={rv}", d.url))
        .bearer_auth(&d.token)
        .send()
        .await
        .expect("the watch");
    assert_eq!((stuck.status().as_u16(), stuck.version()), (200, reqwest::Version::HTTP_11));
    // 100 × 200 KiB: far more than the sockets' buffers and the lines in flight hold.
    let blob = "x".repeat(200 * 1024);
    for i in 0..WRITES {
        let patch = json!({"metadata": {"annotations": {"blob": format!("{i}{blob}")}}});
        let reply = api.patch(&format!("{AGENTS}/big"), "application/merge-patch+json", &patch).await;
        assert_eq!(reply.code, 200, "patch {i}");
    }
    open_watches_become(&d, 0).await;
    drop(stuck);
}

/// Waits (at most 30 s) until the daemon has `n` watches of Agents open, by its
/// `apiserver_longrunning_requests` gauge (over a connection of its own).
async fn open_watches_become(d: &Daemon, n: u64) {
    let api = d.client();
    let mut open = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        let metrics = api.get("/metrics").await;
        let text = metrics.body.as_str().unwrap_or_default().to_string();
        let count = text
            .lines()
            .filter(|l| l.starts_with("apiserver_longrunning_requests{") && l.contains("\"agents\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64;
        if count == n {
            return;
        }
        open = Some(count);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{open:?} watches of Agents open 30 s later, not {n}");
}
