//! Connections under fault (issue 14, item 3): half-sent headers, idle keep-alive
//! connections, more connections than `--max-connections`, and a daemon whose open-file
//! limit is exhausted. Every connection goes to 127.0.0.1 and every wait is bounded; the
//! figures each test prints are the ones `docs/reliability.md` quotes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::harness::{agent, Daemon};

/// A raw TLS client of the daemon, for the connections reqwest would never make: half a
/// request, a held keep-alive connection, a flood.
struct Raw {
    connector: TlsConnector,
    addr: std::net::SocketAddr,
}

impl Raw {
    fn new(d: &Daemon) -> Raw {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut &d.ca_pem[..]) {
            roots.add(cert.expect("CA PEM")).expect("CA certificate");
        }
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        let addr = d.url.strip_prefix("https://").expect("an https URL").parse().expect("IP:PORT");
        Raw { connector: TlsConnector::from(Arc::new(config)), addr }
    }

    async fn connect(&self) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        let name = rustls::pki_types::ServerName::try_from(self.addr.ip().to_string()).expect("IP name");
        self.connector.connect(name, tcp).await
    }

    /// Connects and completes one `GET /version`, leaving the connection open (idle).
    async fn served(&self) -> std::io::Result<(TlsStream<TcpStream>, u16)> {
        let mut conn = self.connect().await?;
        let code = get(&mut conn, "/version").await?;
        Ok((conn, code))
    }
}

/// Sends one complete `GET path` on `conn` and reads the response; its status code.
async fn get<S: AsyncRead + AsyncWrite + Unpin>(conn: &mut S, path: &str) -> std::io::Result<u16> {
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
    conn.flush().await?;
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("a status line");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("a content-length");
    let mut body = buf.len() - head_end;
    while body < length {
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        body += n;
    }
    Ok(code)
}

/// How the daemon closed a connection.
#[derive(Debug, PartialEq, Eq)]
enum Closed {
    /// A TLS close_notify, then EOF: a graceful close.
    Clean,
    /// EOF without close_notify, or a reset.
    Abrupt,
}

/// Reads (and discards) until the daemon closes `conn`.
async fn closed<S: AsyncRead + Unpin>(conn: &mut S) -> Closed {
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) => return Closed::Clean,
            Ok(_) => continue,
            Err(_) => return Closed::Abrupt,
        }
    }
}

/// Lines of the daemon's log about accepting connections.
fn accept_lines(d: &Daemon) -> usize {
    d.log().lines().filter(|l| l.contains("accept")).count()
}

/// The last lines of the daemon's log, for a failure message.
fn log_tail(d: &Daemon) -> String {
    let log = d.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// `GET /version` on a fresh connection, giving up after `within`; the status code.
async fn probe(d: &Daemon, within: Duration) -> Option<u16> {
    let api = d.client();
    let request = api.http.get(format!("{}/version", api.base)).timeout(within);
    request.send().await.ok().map(|r| r.status().as_u16())
}

/// Probes every 200 ms until a fresh connection gets a 200, at most `bound`; when it did.
async fn served_within(d: &Daemon, bound: Duration) -> Option<Instant> {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if probe(d, Duration::from_secs(2)).await == Some(200) {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// (a) Slowloris: 250 connections that send half a header are closed by the daemon at
/// the header timeout, and a normal client is served while they are held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn half_sent_headers_are_closed_at_the_header_timeout() {
    let d = Daemon::start_with(&["--http-header-timeout", "3s"]);
    let raw = Raw::new(&d);
    let opened = join_all((0..250).map(|_| async {
        let mut conn = raw.connect().await.expect("TLS connect");
        conn.write_all(b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: half-")
            .await
            .expect("write");
        conn.flush().await.expect("flush");
        (conn, Instant::now())
    }))
    .await;

    let reply = d.client().get("/version").await;
    assert_eq!(reply.code, 200, "a normal client is served while 250 connections hold half a header");

    let bound = Duration::from_secs(3 + 15);
    let closes = join_all(opened.into_iter().map(|(mut conn, sent)| async move {
        let how = tokio::time::timeout(bound, closed(&mut conn)).await.ok()?;
        Some((sent.elapsed(), how))
    }))
    .await;
    let closes: Vec<_> = closes.into_iter().flatten().collect();
    let slowest = closes.iter().map(|(after, _)| *after).max();
    let fastest = closes.iter().map(|(after, _)| *after).min();
    eprintln!(
        "fault_connections: {} of 250 half-header connections closed by the daemon, after {fastest:?} … {slowest:?} \
         (header timeout 3s)",
        closes.len()
    );
    assert_eq!(
        closes.len(),
        250,
        "only {} of 250 half-header connections were closed within {bound:?}",
        closes.len()
    );
}

/// (b) An idle keep-alive connection is closed gracefully at the idle timeout (not at the
/// shorter header timeout, which runs only once a request has begun), while a watch on
/// another connection — no events, no bookmarks, longer than the idle timeout — still
/// delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_keep_alive_connection_is_closed_while_a_watch_keeps_streaming() {
    let d = Daemon::start_with(&["--http-header-timeout", "1s", "--http-idle-timeout", "4s"]);
    let api = d.client();
    let mut watch = api.watch("/apis/hive.dev/v1/agents?watch=true").await;

    let (mut conn, code) = Raw::new(&d).served().await.expect("first request");
    assert_eq!(code, 200);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = get(&mut conn, "/version").await;
    assert_eq!(
        again.ok(),
        Some(200),
        "a keep-alive connection idle for 2 s (header timeout 1 s) is still served"
    );

    let idle_from = Instant::now();
    let bound = Duration::from_secs(4 + 15);
    let how = tokio::time::timeout(bound, closed(&mut conn)).await;
    let idle_for = idle_from.elapsed();
    eprintln!("fault_connections: the idle keep-alive connection was closed ({how:?}) after {idle_for:?} (idle timeout 4s)");
    let how = how.unwrap_or_else(|_| {
        panic!("an idle keep-alive connection is still open {bound:?} after its last response")
    });
    assert_eq!(how, Closed::Clean, "an idle connection is closed gracefully, with a TLS close_notify");

    let created = api.post("/apis/hive.dev/v1/agents", &agent("after-idle")).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    let event =
        watch.next(Duration::from_secs(10)).await.expect("the watch still streams after the idle timeout");
    assert_eq!(event["type"], "ADDED", "{event}");
    assert_eq!(event["object"]["metadata"]["name"], "after-idle", "{event}");
}

/// (c) Over `--max-connections` a new connection gets a prompt 503 `Status` with
/// `Retry-After` and is closed; once the held connections close, clients are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_max_connections_a_new_connection_is_refused_then_served_again() {
    let d = Daemon::start_with(&["--max-connections", "4"]);
    let raw = Raw::new(&d);
    let mut held = Vec::new();
    for _ in 0..4 {
        let (conn, code) = raw.served().await.expect("a connection under the cap");
        assert_eq!(code, 200);
        held.push(conn);
    }

    let started = Instant::now();
    let refused = tokio::time::timeout(Duration::from_secs(10), d.client().get("/version"))
        .await
        .expect("a connection over the cap is answered promptly");
    let took = started.elapsed();
    eprintln!(
        "fault_connections: over --max-connections 4 the 5th connection got {} in {took:?}",
        refused.code
    );
    assert_eq!(refused.code, 503, "over --max-connections: {:?}", refused.body);
    assert_eq!(refused.body["kind"], "Status", "{}", refused.body);
    assert_eq!(refused.body["reason"], "ServiceUnavailable", "{}", refused.body);
    assert!(refused.headers.contains_key("retry-after"), "{:?}", refused.headers);

    // The refused socket is not held: the daemon closes it after the answer.
    let mut extra = raw.connect().await.expect("TLS connect over the cap");
    assert_eq!(get(&mut extra, "/version").await.ok(), Some(503));
    let how = tokio::time::timeout(Duration::from_secs(5), closed(&mut extra)).await;
    assert!(how.is_ok(), "the refused connection is closed by the daemon");

    drop(held);
    let again = served_within(&d, Duration::from_secs(20)).await;
    assert!(again.is_some(), "served again once the held connections closed");
    assert!(d.log().contains("refused"), "refusals are logged; the last lines:\n{}", log_tail(&d));
}

/// (d) The daemon under a 256 open-file limit, `--max-connections` above it, exhausted by
/// idle keep-alive connections: accept errors back off (a few log lines, not 20 a second),
/// and once the idle timeout (6 s) closes those connections a new client is served at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exhausted_open_files_back_off_quietly_and_recover() {
    let flags = ["--max-connections", "100000", "--http-idle-timeout", "6s"];
    let Some(d) = Daemon::start_with_open_files(256, &flags) else {
        eprintln!("fault_connections: skipped: `prlimit` (util-linux) is not on PATH");
        return;
    };
    let raw = Arc::new(Raw::new(&d));
    // More connections than descriptors: those beyond the limit wait in the listen
    // backlog and give up after 2 s, before the idle timeout frees anything.
    let attempts =
        join_all((0..300).map(|_| {
            let raw = raw.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(2), raw.served()).await.ok().and_then(Result::ok)
            }
        }))
        .await;
    let exhausted = Instant::now();
    let held: Vec<_> = attempts.into_iter().flatten().filter(|(_, code)| *code == 200).collect();
    let held_count = held.len();
    assert!(held_count < 300, "the open-file limit was not reached: all 300 connections were served");

    let closers: Vec<_> = held
        .into_iter()
        .map(|(mut conn, _)| {
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(40), closed(&mut conn)).await;
                Instant::now()
            })
        })
        .collect();
    let served = served_within(&d, Duration::from_secs(30)).await;
    let freed = join_all(closers).await.into_iter().map(|c| c.expect("closer")).min();
    let lines = accept_lines(&d);
    let window = served.unwrap_or_else(Instant::now) - exhausted;
    let recovery = served.zip(freed).map(|(s, f)| s.saturating_duration_since(f));
    eprintln!(
        "fault_connections: nofile 256: {held_count} of 300 connections served and held; {lines} accept log lines \
         in {window:?}; a new client served {:?} after exhaustion, {recovery:?} after the first idle one closed",
        served.map(|s| s - exhausted)
    );
    assert!(lines <= 6, "{lines} accept log lines in {window:?}; the last lines:\n{}", log_tail(&d));
    assert!(served.is_some(), "no new client was served within 30 s of exhausting the open-file limit");
}

/// (e) Under a 256 open-file limit the default `--max-connections` sits below it: a flood
/// of 300 connections is served up to the cap and refused promptly beyond it, accept
/// never fails, and clients are served again once the flood goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_cap_refuses_before_open_files_run_out() {
    let Some(d) = Daemon::start_with_open_files(256, &[]) else {
        eprintln!("fault_connections: skipped: `prlimit` (util-linux) is not on PATH");
        return;
    };
    let raw = Arc::new(Raw::new(&d));
    let outcomes = join_all((0..300).map(|_| {
        let raw = raw.clone();
        async move { tokio::time::timeout(Duration::from_secs(5), raw.served()).await }
    }))
    .await;
    let mut held = Vec::new();
    let (mut refused, mut closed_at_once, mut hung) = (0, 0, 0);
    for outcome in outcomes {
        match outcome {
            Ok(Ok((conn, 200))) => held.push(conn),
            Ok(Ok((_, 503))) => refused += 1,
            Ok(Ok((_, other))) => panic!("unexpected status {other}"),
            Ok(Err(_)) => closed_at_once += 1,
            Err(_) => hung += 1,
        }
    }
    eprintln!(
        "fault_connections: nofile 256, default cap: {} served, {refused} refused with 503, {closed_at_once} closed at \
         once, {hung} left hanging",
        held.len()
    );
    assert_eq!(hung, 0, "every connection over the cap is answered or closed within 5 s");
    assert!(
        held.len() <= 128,
        "the default cap under a 256 open-file limit is 128; {} were served",
        held.len()
    );
    assert!(refused >= 1, "some connections over the cap get a 503");
    assert_eq!(accept_lines(&d), 0, "accept never failed; the last lines:\n{}", log_tail(&d));
    drop(held);
    assert!(served_within(&d, Duration::from_secs(20)).await.is_some(), "served again once the flood went");
}
