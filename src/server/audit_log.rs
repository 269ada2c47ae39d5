//! The API audit log, in the manner of kube-apiserver's: every mutation (POST, PUT,
//! PATCH, DELETE, subresources included; with `reads`, every read too) as one JSON line
//! saying when, which request, who (token name and role), what (verb, resource, name,
//! subresource), how it ended (response code, resulting resourceVersion) and from where.
//! No body and no credential is ever written: the resulting resourceVersion and a
//! create's name come from what the handler wrote (a [`Written`]), else the writer reads
//! them from the response, which it keeps nothing else of.
//!
//! The request path only moves an [`Entry`] of owned pieces into a bounded channel (no
//! formatting, no parsing: `authenticate` takes it, so the log adds no layer of its own);
//! one writer thread formats, appends and rotates (by size, keeping numbered backups
//! `PATH.1` … `PATH.N`), fsyncs what it wrote at most [`SYNC_EVERY`] later, and at
//! shutdown writes, flushes and fsyncs what is queued ([`AuditLog::close`]): a power cut
//! loses at most the last second of lines. Lines written, dropped and failed are counted in `/metrics`.
//! When the channel is full — the disk is not keeping up — the request waits for room, up
//! to [`SEND_WAIT`], so a burst is recorded in full, as kube-apiserver's default
//! `blocking` mode does; past that the entry is dropped, counted and warned about, so a
//! stalled disk cannot stall the API.

use std::borrow::Cow;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::request_id::RequestId;
use super::streams;
use crate::auth::Principal;
use crate::metrics::AuditMetrics;
use crate::store::Obj;

/// Entries waiting for the writer at most.
pub const CHANNEL: usize = 4096;

/// How long a request waits for room in a full channel before its entry is dropped.
pub const SEND_WAIT: Duration = Duration::from_secs(1);

/// How long the writer waits after each flush before it takes the next entries: under
/// load, one wake-up and one write per this much time instead of one per request (the
/// wake-ups were most of the log's cost); an entry is written at most this much later.
const LINGER: Duration = Duration::from_millis(5);

/// A written line is fsynced at most this much later, so a power cut loses at most this
/// much of the log (one fsync per this much time under load, none while idle).
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

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
    /// The replica that writes the log, named in every line (replicas on etcd).
    pub replica: Option<String>,
}

/// One line of the audit log, as `hive audit --api` reads it (the writer writes the
/// same fields from a borrowed `Record`).
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
    /// The replica that answered (replicas on etcd; absent for a daemon on its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

/// What the request path hands the writer: owned pieces it already had, moved or
/// cloned without copying (the request id and the principal's names are shared
/// strings, the URI shares the bytes hyper parsed). All of a line's text — the time, the
/// verb, the resource, name and subresource, the JSON — is formatted on the writer
/// thread as the line is written; the request path parses nothing.
struct Entry {
    time: DateTime<Utc>,
    request_id: Option<RequestId>,
    principal: Option<Principal>,
    method: Method,
    uri: Uri,
    code: u16,
    source: Option<SocketAddr>,
    /// What the handler said it wrote, when it said so.
    written: Option<Written>,
    /// Else a mutation's response body, read for its resourceVersion and name only.
    body: Option<Bytes>,
}

/// What the writer is handed, in order.
// Entries are nearly every message, and the channel's slots are this size either way:
// boxing the entry would cost every request an allocation to shrink the one close.
#[allow(clippy::large_enum_variant)]
enum Message {
    /// One entry to append.
    Entry(Entry),
    /// Write everything queued before this, flush and fsync, answer, and stop.
    Close(oneshot::Sender<()>),
}

/// The handle the server holds: a sender to the writer, and its counters.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<Message>,
    reads: bool,
    metrics: AuditMetrics,
}

impl AuditLog {
    /// Opens (creating, mode 0600) the log and starts its writer thread, which counts
    /// what it writes, drops and fails to write into `metrics`.
    pub fn start(config: AuditConfig, metrics: AuditMetrics) -> std::io::Result<AuditLog> {
        let file = Appender::open(&config)?;
        let (tx, rx) = mpsc::channel(CHANNEL);
        let reads = config.reads;
        let writer_metrics = metrics.clone();
        // The writer's own single-threaded runtime: only for its timers (the linger and
        // the sync deadline), so the API's runtime never runs a blocking write.
        let timers = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
        std::thread::Builder::new()
            .name("hive-audit-log".into())
            .spawn(move || timers.block_on(write_all(rx, file, &writer_metrics)))?;
        Ok(AuditLog { tx, reads, metrics })
    }

    /// Entries dropped because the writer did not keep up (or had stopped).
    pub fn dropped(&self) -> u64 {
        self.metrics.dropped.get()
    }

    /// Entries the writer could not write (I/O errors).
    pub fn failed(&self) -> u64 {
        self.metrics.failed.get()
    }

    /// At shutdown: waits, at most `within`, until every entry queued so far is written,
    /// flushed and fsynced, and stops the writer (later entries are dropped and counted).
    /// Returns how many entries were left unwritten (0 when all of them made it), and
    /// warns when any were.
    pub async fn close(&self, within: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + within;
        let (ack, done) = oneshot::channel();
        let sent = tokio::time::timeout_at(deadline, self.tx.send(Message::Close(ack))).await;
        let closed = match sent {
            Ok(Ok(())) => matches!(tokio::time::timeout_at(deadline, done).await, Ok(Ok(()))),
            Ok(Err(_)) | Err(_) => false,
        };
        if closed {
            return 0;
        }
        // The queue's length, less the close message itself when it is still in it.
        let queued = self.tx.max_capacity() - self.tx.capacity();
        let left = queued.saturating_sub(usize::from(matches!(sent, Ok(Ok(())))));
        tracing::warn!(
            left,
            within = ?within,
            "audit log: shutting down before every queued entry was written; these are lost"
        );
        left
    }

    async fn send(&self, entry: Entry) {
        // The common case takes no timer: only a full queue waits.
        let message = match self.tx.try_send(Message::Entry(entry)) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(message)) => message,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.metrics.dropped.inc();
                return;
            }
        };
        if self.tx.send_timeout(message, SEND_WAIT).await.is_err() {
            let n = self.metrics.dropped.inc() + 1;
            if n == 1 || n % 1000 == 0 {
                tracing::warn!(dropped = n, "audit log: the writer is not keeping up; entries dropped");
            }
        }
    }

    /// What the audit log takes from `request` before it runs: `None` when the request
    /// is not recorded (a read, unless reads are). Called by `authenticate`, which knows
    /// who called, so the log needs no layer of its own (outside `authenticate`, so a
    /// 401 is recorded too).
    pub fn begin(&self, request: &Request) -> Option<Pending> {
        let method = request.method();
        let mutation = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        if !mutation && !self.reads {
            return None;
        }
        Some(Pending {
            mutation,
            request_id: request.extensions().get::<RequestId>().cloned(),
            source: request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0),
            method: method.clone(),
            uri: request.uri().clone(),
        })
    }
}

/// A request being recorded: what was taken from it before it ran.
pub struct Pending {
    mutation: bool,
    request_id: Option<RequestId>,
    source: Option<SocketAddr>,
    method: Method,
    uri: Uri,
}

impl Pending {
    /// Records the request in `log` as `principal` made it and `response` answered it,
    /// once the response is ready; hands the response back (the same, unless a body
    /// without a handler's [`Written`] had to be read for its resourceVersion).
    pub async fn finish(
        self,
        log: &AuditLog,
        principal: Option<Principal>,
        mut response: Response,
    ) -> Response {
        let written = response.extensions_mut().remove::<Written>();
        let code = response.status().as_u16();
        let mut body = None;
        if self.mutation && written.is_none() && streams::is_sized(&response) {
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
        let Pending { mutation: _, request_id, source, method, uri } = self;
        let entry = Entry {
            time: crate::host::now(),
            request_id,
            principal,
            method,
            uri,
            code,
            source,
            written,
            body,
        };
        log.send(entry).await;
        response
    }
}

/// The writer thread: takes every entry waiting, appends them, flushes, lingers, waits
/// again; what it wrote is fsynced once [`SYNC_EVERY`] has passed since the first line
/// not yet synced (when the next entries come later than that, while waiting for them).
/// Ends when every sender is gone (after writing what they sent), or when asked to
/// close: then it refuses further entries (their senders count them dropped), writes
/// every one already queued, flushes, fsyncs and answers.
async fn write_all(mut rx: mpsc::Receiver<Message>, mut file: Appender, metrics: &AuditMetrics) {
    let mut close = None;
    // When the oldest line written and not yet synced must be synced.
    let mut sync_by: Option<tokio::time::Instant> = None;
    loop {
        let first = match sync_by {
            None => rx.recv().await,
            Some(deadline) => match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(message) => message,
                Err(_) => {
                    file.sync_counted(metrics);
                    sync_by = None;
                    continue;
                }
            },
        };
        let Some(first) = first else { break };
        let mut next = Some(first);
        while let Some(message) = next {
            match message {
                Message::Entry(entry) => file.write(entry, metrics),
                Message::Close(ack) => {
                    rx.close();
                    close = Some(ack);
                }
            }
            next = rx.try_recv().ok();
        }
        file.flush_counted(metrics);
        if close.is_some() {
            break;
        }
        let deadline = *sync_by.get_or_insert_with(|| tokio::time::Instant::now() + SYNC_EVERY);
        if tokio::time::Instant::now() >= deadline {
            file.sync_counted(metrics);
            sync_by = None;
        }
        tokio::time::sleep(LINGER).await;
    }
    file.flush_counted(metrics);
    file.sync_counted(metrics);
    if let Some(ack) = close {
        let _ = ack.send(());
    }
}

/// A line as the writer writes it: [`Line`]'s fields, in its order and with its names
/// (it reads them back), borrowed from the entry and formatted as they are serialized,
/// so a line costs no string of its own.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Record<'a> {
    #[serde(serialize_with = "rfc3339")]
    time: DateTime<Utc>,
    request_id: &'a str,
    user: Option<&'a str>,
    #[serde(serialize_with = "display")]
    role: Option<crate::auth::Role>,
    verb: Cow<'static, str>,
    resource: Option<Cow<'a, str>>,
    name: Option<&'a str>,
    subresource: Option<Cow<'a, str>>,
    code: u16,
    #[serde(serialize_with = "display")]
    resource_version: Option<u64>,
    #[serde(serialize_with = "display")]
    source_address: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replica: Option<&'a str>,
}

/// RFC 3339 in UTC with microseconds, as `to_rfc3339_opts(Micros, true)` writes it.
fn rfc3339<S: serde::Serializer>(time: &DateTime<Utc>, out: S) -> Result<S::Ok, S::Error> {
    out.collect_str(&time.format("%Y-%m-%dT%H:%M:%S%.6fZ"))
}

/// A value as its `Display` text (a JSON string), or null.
fn display<T: std::fmt::Display, S: serde::Serializer>(value: &Option<T>, out: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => out.collect_str(value),
        None => out.serialize_none(),
    }
}

/// An entry as its line: the path parsed into resource, name and subresource; the name
/// of a create and the resourceVersion from `written` (the handler's, or what the
/// writer read from a mutation's response body).
fn record<'a>(entry: &'a Entry, written: Option<&'a Written>) -> Record<'a> {
    let target = Target::of(entry.uri.path());
    let watch =
        entry.uri.query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match entry.method {
        Method::POST => "create".into(),
        Method::PUT => "update".into(),
        Method::PATCH => "patch".into(),
        Method::DELETE if target.name.is_none() && target.resource.is_some() => "deletecollection".into(),
        Method::DELETE => "delete".into(),
        Method::GET | Method::HEAD if watch => "watch".into(),
        Method::GET | Method::HEAD if target.name.is_none() => "list".into(),
        Method::GET | Method::HEAD => "get".into(),
        _ => Cow::Owned(entry.method.as_str().to_ascii_lowercase()),
    };
    Record {
        time: entry.time,
        request_id: entry.request_id.as_ref().map_or("", RequestId::as_str),
        user: entry.principal.as_ref().map(|p| &*p.name),
        role: entry.principal.as_ref().map(|p| p.role),
        verb,
        resource: target.resource,
        name: target.name.or_else(|| written.and_then(|w| w.name.as_deref())),
        subresource: target.subresource,
        code: entry.code,
        resource_version: written.map(|w| w.revision).filter(|rv| *rv > 0),
        source_address: entry.source,
        replica: None,
    }
}

/// What a path names.
#[derive(Debug, Default, PartialEq, Eq)]
struct Target<'a> {
    resource: Option<Cow<'a, str>>,
    name: Option<&'a str>,
    subresource: Option<Cow<'a, str>>,
}

impl<'a> Target<'a> {
    /// `/apis/GROUP/VERSION/R[/NAME[/SUB]]`, `/api/v1/[namespaces/NS/]R[/NAME[/SUB]]`,
    /// `/hive/v1/R[/NAME[/SUB]]` (`/hive/v1/fleet/R/…` as `fleet/R`).
    fn of(path: &'a str) -> Target<'a> {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let rest: &[&str] = match segments.as_slice() {
            ["apis", _group, _version, rest @ ..] => rest,
            ["api", _version, "namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
            ["api", _version, rest @ ..] => rest,
            ["hive", _version, "fleet", kind, rest @ ..] => {
                return Target::from_parts(Some(format!("fleet/{kind}").into()), rest);
            }
            ["hive", _version, rest @ ..] => rest,
            _ => &[],
        };
        match rest {
            [] => Target::default(),
            [resource, rest @ ..] => Target::from_parts(Some(Cow::Borrowed(*resource)), rest),
        }
    }

    fn from_parts(resource: Option<Cow<'a, str>>, rest: &[&'a str]) -> Target<'a> {
        let subresource = match rest {
            [] | [_] => None,
            [_, sub] => Some(Cow::Borrowed(*sub)),
            [_, subs @ ..] => Some(Cow::Owned(subs.join("/"))),
        };
        Target { resource, name: rest.first().copied(), subresource }
    }
}

/// The two facts an audit line takes from an answer: the object's name and its
/// resourceVersion. A handler that answers with a stored object (or an error naming
/// one) leaves this in the response's extensions from what it already knows — the
/// store's [`Obj::revision`], the name it wrote — so neither the request path nor the
/// writer parses the object; without it, the writer reads them from the body.
#[derive(Clone, Debug, Default)]
pub struct Written {
    /// The object's name, when the path does not say it (a create, a refusal).
    pub name: Option<String>,
    /// Its resourceVersion in the answer as a number; 0 for none.
    pub revision: u64,
}

impl Written {
    /// A stored object answered: its revision, and `name` when the path does not name
    /// it (a create).
    pub fn object(object: &Obj, name: Option<String>) -> Written {
        Written { name, revision: object.revision() }
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
            revision: meta.resource_version.and_then(|rv| rv.parse().ok()).unwrap_or(0),
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
    /// One line's JSON, reused from line to line.
    scratch: Vec<u8>,
    /// fsyncs done, for tests that hold the writer to its bound.
    syncs: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The replica named in every line.
    replica: Option<std::sync::Arc<str>>,
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
            scratch: Vec::with_capacity(512),
            syncs: Default::default(),
            replica: config.replica.as_deref().map(Into::into),
        })
    }

    fn append(&mut self, line: &Record<'_>) -> std::io::Result<()> {
        self.scratch.clear();
        serde_json::to_writer(&mut self.scratch, line).map_err(std::io::Error::other)?;
        self.scratch.push(b'\n');
        let len = self.scratch.len() as u64;
        if self.size > 0 && self.size + len > self.max_size {
            self.rotate()?;
        }
        self.out.write_all(&self.scratch)?;
        self.size += len;
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    /// Appends `entry`'s line, counting it written or failed.
    fn write(&mut self, entry: Entry, metrics: &AuditMetrics) {
        let read_back;
        let written = match &entry.written {
            Some(written) => Some(written),
            None => {
                read_back = entry.body.as_deref().and_then(Written::of);
                read_back.as_ref()
            }
        };
        let replica = self.replica.clone();
        let mut line = record(&entry, written);
        line.replica = replica.as_deref();
        match self.append(&line) {
            Ok(()) => {
                metrics.events.inc();
            }
            Err(err) => {
                let n = metrics.failed.inc() + 1;
                if n == 1 || n % 1000 == 0 {
                    tracing::warn!(failed = n, error = %err, path = %self.path.display(), "audit log: writing failed");
                }
            }
        }
    }

    /// Flushes, counting a failure.
    fn flush_counted(&mut self, metrics: &AuditMetrics) {
        if let Err(err) = self.flush() {
            metrics.failed.inc();
            tracing::warn!(error = %err, path = %self.path.display(), "audit log: flushing failed");
        }
    }

    /// What was flushed, on disk.
    fn sync(&mut self) -> std::io::Result<()> {
        self.out.get_ref().sync_data()?;
        self.syncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// [`Appender::sync`], counting a failure.
    fn sync_counted(&mut self, metrics: &AuditMetrics) {
        if let Err(err) = self.sync() {
            metrics.failed.inc();
            tracing::warn!(error = %err, path = %self.path.display(), "audit log: fsync failed");
        }
    }

    /// `PATH.(N-1)` → `PATH.N` … `PATH` → `PATH.1`, then a new empty `PATH`. What the
    /// old file holds is synced before it is renamed, and the directory after the new
    /// one is made, so a power cut never loses a rotated file's lines or the renames.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        self.out.get_ref().sync_data()?;
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
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        crate::durable::sync_dir(dir)
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

    /// An entry's line, as the writer writes it (the body read as the writer reads it).
    fn text(entry: &Entry) -> String {
        let read_back = entry.body.as_deref().and_then(Written::of);
        serde_json::to_string(&record(entry, entry.written.as_ref().or(read_back.as_ref()))).unwrap()
    }

    /// An entry's line, read back as `hive audit --api` reads it.
    fn line(entry: Entry) -> Line {
        serde_json::from_str(&text(&entry)).unwrap()
    }

    #[test]
    fn what_a_path_names() {
        let t = |resource: Option<&'static str>, name: Option<&'static str>, sub: Option<&'static str>| {
            Target { resource: resource.map(Cow::Borrowed), name, subresource: sub.map(Cow::Borrowed) }
        };
        for (path, want) in [
            ("/apis/hive.dev/v1/agents", t(Some("agents"), None, None)),
            ("/apis/hive.dev/v1/agents/a1", t(Some("agents"), Some("a1"), None)),
            ("/apis/hive.dev/v1/agents/a1/status", t(Some("agents"), Some("a1"), Some("status"))),
            ("/apis/hive.dev/v1/jobs/j/cancel", t(Some("jobs"), Some("j"), Some("cancel"))),
            ("/api/v1/nodes/n/proxy/a/b", t(Some("nodes"), Some("n"), Some("proxy/a/b"))),
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
        assert_eq!((w.name.as_deref(), w.revision), (Some("a1"), 42));
        let w = Written::of(br#"{"name":"ops","role":"operator","token":"hive_secret"}"#).unwrap();
        assert_eq!((w.name.as_deref(), w.revision), (Some("ops"), 0));
        let w = Written::of(
            br#"{"kind":"Status","metadata":{},"code":422,"details":{"name":"a2","kind":"Agent"}}"#,
        );
        assert_eq!(w.unwrap().name.as_deref(), Some("a2"));
        assert!(Written::of(b"not json").is_none());
    }

    fn entry(method: Method, path: &str, body: Option<&'static [u8]>) -> Entry {
        Entry {
            time: "2026-12-01T10:00:00Z".parse().unwrap(),
            request_id: Some(RequestId("r1".into())),
            principal: Some(Principal { name: "ops".into(), role: crate::auth::Role::Operator, agent: None }),
            method,
            uri: path.parse().unwrap(),
            code: 201,
            source: Some("127.0.0.1:5000".parse().unwrap()),
            written: None,
            body: body.map(Bytes::from_static),
        }
    }

    #[test]
    fn a_token_create_line_names_the_token_but_holds_no_secret() {
        let e = entry(
            Method::POST,
            "/hive/v1/tokens",
            Some(br#"{"name":"ops","role":"operator","token":"hive_s3cret"}"#),
        );
        let written = text(&e);
        assert!(!written.contains("hive_s3cret"), "{written}");
        let expected = r#"{"time":"2026-12-01T10:00:00.000000Z","requestId":"r1","user":"ops","role":"operator","verb":"create","resource":"tokens","name":"ops","subresource":null,"code":201,"resourceVersion":null,"sourceAddress":"127.0.0.1:5000"}"#;
        assert_eq!(written, expected);
        // What the writer writes is what the reader's `Line` writes: one shape.
        assert_eq!(serde_json::to_string(&line(e)).unwrap(), expected);
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
        assert_eq!(verb(Method::GET, "/apis/hive.dev/v1/agents?watch=true&resourceVersion=3"), "watch");
    }

    /// What a handler leaves in the answer is all the line takes: the create's name and
    /// the store's revision, with no body to read.
    #[test]
    fn a_handler_s_written_names_the_create_and_its_revision() {
        let mut e = entry(Method::POST, "/apis/hive.dev/v1/agents", None);
        e.written = Some(Written { name: Some("a1".into()), revision: 42 });
        let l = line(e);
        assert_eq!((l.name.as_deref(), l.resource_version.as_deref()), (Some("a1"), Some("42")));
        let mut e = entry(Method::PUT, "/apis/hive.dev/v1/agents/a2/status", None);
        e.written = Some(Written { name: None, revision: 7 });
        let l = line(e);
        assert_eq!((l.name.as_deref(), l.resource_version.as_deref()), (Some("a2"), Some("7")));
    }

    /// A full queue makes a request wait [`SEND_WAIT`], then drops its entry and counts
    /// it; the request goes on.
    #[tokio::test(start_paused = true)]
    async fn a_full_queue_waits_then_drops_and_counts() {
        let (tx, mut rx) = mpsc::channel(1);
        let log = AuditLog { tx, reads: false, metrics: AuditMetrics::default() };
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
        let config =
            AuditConfig { path: path.clone(), max_size: 600, max_backups: 2, reads: false, replica: None };
        let mut file = Appender::open(&config).unwrap();
        let e = entry(Method::POST, "/apis/hive.dev/v1/agents", None);
        let one = record(&e, None);
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

    /// Closing (at shutdown) writes every entry queued before it, and counts them; an
    /// entry sent after it is dropped and counted.
    #[tokio::test]
    async fn closing_writes_everything_queued_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let config = AuditConfig {
            path: path.clone(),
            max_size: 1 << 20,
            max_backups: 1,
            reads: false,
            replica: None,
        };
        let metrics = AuditMetrics::default();
        let log = AuditLog::start(config, metrics.clone()).unwrap();
        for _ in 0..500 {
            log.send(entry(Method::POST, "/apis/hive.dev/v1/agents", None)).await;
        }
        assert_eq!(log.close(Duration::from_secs(5)).await, 0, "nothing left");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!((text.lines().count(), metrics.events.get()), (500, 500));
        log.send(entry(Method::POST, "/apis/hive.dev/v1/agents", None)).await;
        assert_eq!(log.dropped(), 1, "the writer has stopped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_written_line_is_fsynced_within_a_second_idle_or_under_load() {
        let dir = tempfile::tempdir().unwrap();
        let config = AuditConfig {
            path: dir.path().join("audit.log"),
            max_size: 1 << 20,
            max_backups: 1,
            reads: false,
            replica: None,
        };
        let file = Appender::open(&config).unwrap();
        let syncs = file.syncs.clone();
        let synced = || syncs.load(std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(CHANNEL);
        let metrics = AuditMetrics::default();
        let writer = tokio::spawn({
            let metrics = metrics.clone();
            async move { write_all(rx, file, &metrics).await }
        });
        let send = |tx: &mpsc::Sender<Message>| {
            let tx = tx.clone();
            async move { tx.send(Message::Entry(entry(Method::POST, "/apis/hive.dev/v1/agents", None))).await }
        };

        // One line, then quiet: synced once, by the end of the second.
        send(&tx).await.unwrap();
        tokio::time::sleep(SYNC_EVERY - Duration::from_millis(100)).await;
        assert_eq!(synced(), 0, "synced before the bound (once a second is the promise, not every line)");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(synced(), 1, "a line written and quiet after it was not synced within {SYNC_EVERY:?}");
        // Idle: nothing to sync.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(synced(), 1);

        // Under load, a line every 100 ms for 5 s: never more than a second unsynced.
        for _ in 0..50 {
            send(&tx).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let under_load = synced() - 1;
        assert!((4..=6).contains(&under_load), "{under_load} syncs in 5 s of load: not once a second");

        // Every sender gone: what is left is written and synced.
        drop(tx);
        writer.await.unwrap();
        assert_eq!(metrics.events.get(), 51);
        assert_eq!(std::fs::read_to_string(&config.path).unwrap().lines().count(), 51);
    }
}
