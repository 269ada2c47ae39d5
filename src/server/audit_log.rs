//! The API audit log, in the manner of kube-apiserver's: every mutation (POST, PUT,
//! PATCH, DELETE, subresources included; with `reads`, every read too) as one JSON line
//! saying when, which request, who (token name and role), what (verb, resource, name,
//! subresource), how it ended (response code, resulting resourceVersion) and from where.
//! No body and no credential is ever written: the resulting resourceVersion and a
//! create's name are read from the response by the writer, which keeps nothing else.
//!
//! The request path only hands an [`Entry`] to a bounded channel; one writer thread
//! formats, appends and rotates (by size, keeping numbered backups `PATH.1` … `PATH.N`).
//! When the channel is full — the disk is not keeping up — the request waits for room, up
//! to [`SEND_WAIT`], so a burst is recorded in full, as kube-apiserver's default
//! `blocking` mode does; past that the entry is dropped, counted and warned about, so a
//! stalled disk cannot stall the API.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::request_id::RequestId;
use super::{streams, AppState};
use crate::auth::Principal;

/// Entries waiting for the writer at most.
pub const CHANNEL: usize = 4096;

/// How long a request waits for room in a full channel before its entry is dropped.
pub const SEND_WAIT: Duration = Duration::from_secs(1);

/// How long the writer waits after each flush before it takes the next entries: under
/// load, one wake-up and one write per this much time instead of one per request (the
/// wake-ups were most of the log's cost); an entry is on disk at most this much later.
const LINGER: Duration = Duration::from_millis(5);

/// The largest response body read for its resourceVersion (objects are far smaller; a
/// larger body is passed through and its entry has no resourceVersion).
const BODY_LIMIT: usize = 8 << 20;

/// Where and how the audit log is written.
#[derive(Clone, Debug)]
pub struct AuditConfig {
    /// The log file; backups are `PATH.1` (newest) … `PATH.max_backups`.
    pub path: PathBuf,
    /// Rotate before a line would take the file past this many bytes.
    pub max_size: u64,
    /// Rotated files kept; 0 keeps none (the file is started afresh).
    pub max_backups: usize,
    /// Also record reads (GET, HEAD: get, list, watch).
    pub reads: bool,
}

/// One line of the audit log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Line {
    /// When the response was ready (RFC 3339, microseconds, UTC).
    pub time: String,
    /// The request id (`X-Request-Id` / `Audit-Id` of the response).
    pub request_id: String,
    /// The token's name; null when the request was not authenticated.
    pub user: Option<String>,
    /// The token's role; null when the request was not authenticated.
    pub role: Option<String>,
    /// kube's verb: create, update, patch, delete, deletecollection, get, list, watch.
    pub verb: String,
    /// The resource (plural, e.g. `agents`, `events`, `tokens`, `fleet/providers`); null
    /// for a path that names none.
    pub resource: Option<String>,
    /// The object's name: from the path, or for a create from the response.
    pub name: Option<String>,
    /// The subresource (`status`, `cancel`, `configure`, `log`), if any.
    pub subresource: Option<String>,
    /// The HTTP response code.
    pub code: u16,
    /// The object's resourceVersion after the write, when the response carried one.
    pub resource_version: Option<String>,
    /// The client's address (`IP:port`).
    pub source_address: Option<String>,
}

/// What the request path hands the writer.
struct Entry {
    time: DateTime<Utc>,
    request_id: String,
    principal: Option<Principal>,
    method: Method,
    path: String,
    watch: bool,
    code: u16,
    source: Option<SocketAddr>,
    /// What the handler said it wrote, when it said so.
    written: Option<Written>,
    /// Else a mutation's response body, read for its resourceVersion and name only.
    body: Option<Bytes>,
}

/// The handle the server holds: a sender to the writer, and its counters.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<Entry>,
    reads: bool,
    counters: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    dropped: AtomicU64,
    failed: AtomicU64,
}

impl AuditLog {
    /// Opens (creating, mode 0600) the log and starts its writer thread.
    pub fn start(config: AuditConfig) -> std::io::Result<AuditLog> {
        let file = Appender::open(&config)?;
        let (tx, rx) = mpsc::channel(CHANNEL);
        let counters = Arc::new(Counters::default());
        let reads = config.reads;
        let writer_counters = counters.clone();
        std::thread::Builder::new()
            .name("hive-audit-log".into())
            .spawn(move || write_all(rx, file, &writer_counters))?;
        Ok(AuditLog { tx, reads, counters })
    }

    /// Entries dropped because the writer did not keep up.
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    /// Entries the writer could not write (I/O errors).
    pub fn failed(&self) -> u64 {
        self.counters.failed.load(Ordering::Relaxed)
    }

    async fn send(&self, entry: Entry) {
        // The common case takes no timer: only a full queue waits.
        let entry = match self.tx.try_send(entry) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(entry)) => entry,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        if self.tx.send_timeout(entry, SEND_WAIT).await.is_err() {
            let n = self.counters.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n == 1 || n % 1000 == 0 {
                tracing::warn!(dropped = n, "audit log: the writer is not keeping up; entries dropped");
            }
        }
    }
}

/// The middleware around the authenticated API (outside `authenticate`, so a 401 is
/// recorded too): records each mutation, and each read when asked, once its response is
/// ready. `authenticate` leaves the caller's [`Principal`] in the response's extensions.
pub async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(log) = state.audit.clone() else {
        return next.run(request).await;
    };
    let method = request.method().clone();
    let mutation = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    if !mutation && !log.reads {
        return next.run(request).await;
    }
    let request_id = request.extensions().get::<RequestId>().map(|id| id.as_str().to_string());
    let source = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    let path = request.uri().path().to_string();
    let watch =
        request.uri().query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let mut response = next.run(request).await;
    let principal = response.extensions_mut().remove::<Principal>();
    let written = response.extensions_mut().remove::<Written>();
    let code = response.status().as_u16();
    let mut body = None;
    if mutation && written.is_none() && streams::is_sized(&response) {
        let (parts, inner) = response.into_parts();
        match axum::body::to_bytes(inner, BODY_LIMIT).await {
            Ok(bytes) => {
                body = Some(bytes.clone());
                response = Response::from_parts(parts, Body::from(bytes));
            }
            Err(err) => {
                // As `ApiError::Internal` answers (error.rs depends on this module, so
                // not through it): the cause logged, not sent.
                tracing::error!(error = %err, "request failed: reading a response body");
                let status = hive_api::meta::Status::failure(500, "InternalError", "internal error");
                let body = serde_json::to_vec(&status).unwrap_or_default();
                let mut failed = (axum::http::StatusCode::INTERNAL_SERVER_ERROR, body).into_response();
                failed.headers_mut().insert(
                    axum::http::header::CONTENT_TYPE,
                    axum::http::HeaderValue::from_static("application/json"),
                );
                response = failed;
            }
        }
    }
    let entry = Entry {
        time: crate::host::now(),
        request_id: request_id.unwrap_or_default(),
        principal,
        method,
        path,
        watch,
        code,
        source,
        written,
        body,
    };
    log.send(entry).await;
    response
}

/// The writer thread: takes every entry waiting, appends them, flushes, lingers, waits
/// again. Ends when every sender is gone (after writing what they sent).
fn write_all(mut rx: mpsc::Receiver<Entry>, mut file: Appender, counters: &Counters) {
    while let Some(first) = rx.blocking_recv() {
        let mut next = Some(first);
        while let Some(entry) = next {
            let line = line(entry);
            if let Err(err) = file.append(&line) {
                let n = counters.failed.fetch_add(1, Ordering::Relaxed) + 1;
                if n == 1 || n % 1000 == 0 {
                    tracing::warn!(failed = n, error = %err, path = %file.path.display(), "audit log: writing failed");
                }
            }
            next = rx.try_recv().ok();
        }
        if let Err(err) = file.flush() {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %err, path = %file.path.display(), "audit log: flushing failed");
        }
        std::thread::sleep(LINGER);
    }
    let _ = file.flush();
}

/// An entry as its line: the path parsed into resource, name and subresource; from a
/// mutation's response body only its resourceVersion and name (a refusal's
/// `details.name`).
fn line(entry: Entry) -> Line {
    let target = Target::of(&entry.path);
    let written = entry.written.or_else(|| entry.body.as_deref().and_then(Written::of));
    let name = target.name.clone().or_else(|| written.as_ref().and_then(|w| w.name.clone()));
    let verb = match entry.method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if target.name.is_none() && target.resource.is_some() => "deletecollection",
        Method::DELETE => "delete",
        Method::GET | Method::HEAD if entry.watch => "watch",
        Method::GET | Method::HEAD if target.name.is_none() => "list",
        Method::GET | Method::HEAD => "get",
        _ => entry.method.as_str(),
    };
    Line {
        time: entry.time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        request_id: entry.request_id,
        user: entry.principal.as_ref().map(|p| p.name.to_string()),
        role: entry.principal.as_ref().map(|p| p.role.to_string()),
        verb: verb.to_lowercase(),
        resource: target.resource,
        name,
        subresource: target.subresource,
        code: entry.code,
        resource_version: written.and_then(|w| w.resource_version),
        source_address: entry.source.map(|s| s.to_string()),
    }
}

/// What a path names.
#[derive(Debug, Default, PartialEq, Eq)]
struct Target {
    resource: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target {
    /// `/apis/GROUP/VERSION/R[/NAME[/SUB]]`, `/api/v1/[namespaces/NS/]R[/NAME[/SUB]]`,
    /// `/hive/v1/R[/NAME[/SUB]]` (`/hive/v1/fleet/R/…` as `fleet/R`).
    fn of(path: &str) -> Target {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let rest: &[&str] = match segments.as_slice() {
            ["apis", _group, _version, rest @ ..] => rest,
            ["api", _version, "namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
            ["api", _version, rest @ ..] => rest,
            ["hive", _version, "fleet", kind, rest @ ..] => {
                return Target::from_parts(Some(format!("fleet/{kind}")), rest);
            }
            ["hive", _version, rest @ ..] => rest,
            _ => &[],
        };
        match rest {
            [] => Target::default(),
            [resource, rest @ ..] => Target::from_parts(Some(resource.to_string()), rest),
        }
    }

    fn from_parts(resource: Option<String>, rest: &[&str]) -> Target {
        Target {
            resource,
            name: rest.first().map(|s| s.to_string()),
            subresource: (rest.len() > 1).then(|| rest[1..].join("/")),
        }
    }
}

/// The two facts an audit line takes from an answer: the object's name and its
/// resourceVersion. A handler that answers with a stored object (or an error naming
/// one) leaves this in the response's extensions, so the audit layer neither buffers nor
/// parses the body; without it, the writer reads them from the body.
#[derive(Clone, Debug, Default)]
pub struct Written {
    /// The object's name.
    pub name: Option<String>,
    /// Its resourceVersion in the answer.
    pub resource_version: Option<String>,
}

impl Written {
    /// From an object (`metadata.name`, `metadata.resourceVersion`).
    pub fn of_object(object: &crate::store::Obj) -> Written {
        #[derive(serde::Deserialize)]
        struct Meta {
            #[serde(default)]
            name: Option<String>,
            #[serde(default, rename = "resourceVersion")]
            resource_version: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Shape {
            #[serde(default)]
            metadata: Option<Meta>,
        }
        let meta = object.decode::<Shape>().ok().and_then(|s| s.metadata);
        let text = |s: Option<String>| s.filter(|s| !s.is_empty());
        let (name, resource_version) = meta.map_or((None, None), |m| (m.name, m.resource_version));
        Written { name: text(name), resource_version: text(resource_version) }
    }

    fn of(body: &[u8]) -> Option<Written> {
        #[derive(Deserialize)]
        struct Object {
            #[serde(default)]
            metadata: Option<Meta>,
            /// A token create answers `{name, role, token}` without metadata.
            #[serde(default)]
            name: Option<serde_json::Value>,
            /// A refusal (a `Status`) names its object here.
            #[serde(default)]
            details: Option<Details>,
        }
        #[derive(Deserialize)]
        struct Details {
            #[serde(default)]
            name: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta {
            #[serde(default)]
            name: Option<String>,
            #[serde(default)]
            resource_version: Option<String>,
        }
        let object: Object = serde_json::from_slice(body).ok()?;
        let meta = object.metadata.unwrap_or(Meta { name: None, resource_version: None });
        let top_name = object.name.and_then(|v| v.as_str().map(str::to_string));
        let refused_name = object.details.and_then(|d| d.name);
        Some(Written {
            name: meta.name.filter(|n| !n.is_empty()).or(top_name).or(refused_name.filter(|n| !n.is_empty())),
            resource_version: meta.resource_version.filter(|rv| !rv.is_empty()),
        })
    }
}

/// The open log file and its size, rotated by size.
struct Appender {
    path: PathBuf,
    max_size: u64,
    max_backups: usize,
    out: std::io::BufWriter<std::fs::File>,
    size: u64,
}

impl Appender {
    fn open(config: &AuditConfig) -> std::io::Result<Appender> {
        let file = open_append(&config.path)?;
        let size = file.metadata()?.len();
        Ok(Appender {
            path: config.path.clone(),
            max_size: config.max_size.max(1),
            max_backups: config.max_backups,
            out: std::io::BufWriter::new(file),
            size,
        })
    }

    fn append(&mut self, line: &Line) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec(line).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        if self.size > 0 && self.size + bytes.len() as u64 > self.max_size {
            self.rotate()?;
        }
        self.out.write_all(&bytes)?;
        self.size += bytes.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    /// `PATH.(N-1)` → `PATH.N` … `PATH` → `PATH.1`, then a new empty `PATH`.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        for n in (1..self.max_backups).rev() {
            match std::fs::rename(backup(&self.path, n), backup(&self.path, n + 1)) {
                Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
                _ => {}
            }
        }
        if self.max_backups == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            std::fs::rename(&self.path, backup(&self.path, 1))?;
        }
        self.out = std::io::BufWriter::new(open_append(&self.path)?);
        self.size = 0;
        Ok(())
    }
}

/// The `n`th backup of `path`: `PATH.n`.
pub fn backup(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_path_names() {
        let t = |resource: Option<&str>, name: Option<&str>, sub: Option<&str>| Target {
            resource: resource.map(Into::into),
            name: name.map(Into::into),
            subresource: sub.map(Into::into),
        };
        for (path, want) in [
            ("/apis/hive.dev/v1/agents", t(Some("agents"), None, None)),
            ("/apis/hive.dev/v1/agents/a1", t(Some("agents"), Some("a1"), None)),
            ("/apis/hive.dev/v1/agents/a1/status", t(Some("agents"), Some("a1"), Some("status"))),
            ("/apis/hive.dev/v1/jobs/j/cancel", t(Some("jobs"), Some("j"), Some("cancel"))),
            ("/api/v1/events/e1", t(Some("events"), Some("e1"), None)),
            ("/api/v1/namespaces/default/events/e1", t(Some("events"), Some("e1"), None)),
            ("/hive/v1/tokens/ops", t(Some("tokens"), Some("ops"), None)),
            ("/hive/v1/tokens", t(Some("tokens"), None, None)),
            (
                "/hive/v1/fleet/providers/vastai/configure",
                t(Some("fleet/providers"), Some("vastai"), Some("configure")),
            ),
            ("/apis", t(None, None, None)),
            ("/nothing/here", t(None, None, None)),
        ] {
            assert_eq!(Target::of(path), want, "{path}");
        }
    }

    #[test]
    fn only_the_name_and_resource_version_are_read_from_a_body() {
        let w = Written::of(br#"{"metadata":{"name":"a1","resourceVersion":"42"},"spec":{"x":1}}"#).unwrap();
        assert_eq!((w.name.as_deref(), w.resource_version.as_deref()), (Some("a1"), Some("42")));
        let w = Written::of(br#"{"name":"ops","role":"operator","token":"hive_secret"}"#).unwrap();
        assert_eq!((w.name.as_deref(), w.resource_version), (Some("ops"), None));
        let w = Written::of(
            br#"{"kind":"Status","metadata":{},"code":422,"details":{"name":"a2","kind":"Agent"}}"#,
        );
        assert_eq!(w.unwrap().name.as_deref(), Some("a2"));
        assert!(Written::of(b"not json").is_none());
    }

    fn entry(method: Method, path: &str, body: Option<&'static [u8]>) -> Entry {
        Entry {
            time: "2026-12-01T10:00:00Z".parse().unwrap(),
            request_id: "r1".into(),
            principal: Some(Principal { name: "ops".into(), role: crate::auth::Role::Operator, agent: None }),
            method,
            path: path.into(),
            watch: false,
            code: 201,
            source: Some("127.0.0.1:5000".parse().unwrap()),
            written: None,
            body: body.map(Bytes::from_static),
        }
    }

    #[test]
    fn a_token_create_line_names_the_token_but_holds_no_secret() {
        let l = line(entry(
            Method::POST,
            "/hive/v1/tokens",
            Some(br#"{"name":"ops","role":"operator","token":"hive_s3cret"}"#),
        ));
        let text = serde_json::to_string(&l).unwrap();
        assert!(!text.contains("hive_s3cret"), "{text}");
        assert_eq!(
            text,
            r#"{"time":"2026-12-01T10:00:00.000000Z","requestId":"r1","user":"ops","role":"operator","verb":"create","resource":"tokens","name":"ops","subresource":null,"code":201,"resourceVersion":null,"sourceAddress":"127.0.0.1:5000"}"#
        );
    }

    #[test]
    fn verbs_as_kube_names_them() {
        let verb = |method: Method, path: &str| line(entry(method, path, None)).verb;
        assert_eq!(verb(Method::POST, "/apis/hive.dev/v1/agents"), "create");
        assert_eq!(verb(Method::PUT, "/apis/hive.dev/v1/agents/a/status"), "update");
        assert_eq!(verb(Method::PATCH, "/apis/hive.dev/v1/agents/a"), "patch");
        assert_eq!(verb(Method::DELETE, "/apis/hive.dev/v1/agents/a"), "delete");
        assert_eq!(verb(Method::DELETE, "/apis/hive.dev/v1/agents"), "deletecollection");
        assert_eq!(verb(Method::GET, "/apis/hive.dev/v1/agents"), "list");
        assert_eq!(verb(Method::GET, "/apis/hive.dev/v1/agents/a"), "get");
    }

    /// A full queue makes a request wait [`SEND_WAIT`], then drops its entry and counts
    /// it; the request goes on.
    #[tokio::test(start_paused = true)]
    async fn a_full_queue_waits_then_drops_and_counts() {
        let (tx, mut rx) = mpsc::channel(1);
        let log = AuditLog { tx, reads: false, counters: Arc::default() };
        log.send(entry(Method::POST, "/apis/hive.dev/v1/agents", None)).await;
        assert_eq!(log.dropped(), 0);
        let started = tokio::time::Instant::now();
        log.send(entry(Method::POST, "/apis/hive.dev/v1/agents", None)).await;
        assert_eq!((log.dropped(), started.elapsed()), (1, SEND_WAIT));
        assert!(rx.try_recv().is_ok(), "the first entry is queued");
        log.send(entry(Method::POST, "/apis/hive.dev/v1/agents", None)).await;
        assert_eq!(log.dropped(), 1, "room again: nothing dropped");
    }

    #[test]
    fn rotation_keeps_max_backups_numbered_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let config = AuditConfig { path: path.clone(), max_size: 600, max_backups: 2, reads: false };
        let mut file = Appender::open(&config).unwrap();
        let one = line(entry(Method::POST, "/apis/hive.dev/v1/agents", None));
        for _ in 0..20 {
            file.append(&one).unwrap();
        }
        file.flush().unwrap();
        for p in [&path, &backup(&path, 1), &backup(&path, 2)] {
            let len = std::fs::metadata(p).unwrap().len();
            assert!(len > 0 && len <= 600, "{} is {len} bytes", p.display());
        }
        assert!(!backup(&path, 3).exists());
    }
}
