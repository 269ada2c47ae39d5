//! Watch streams: chunked, one JSON event per line — ADDED, MODIFIED, DELETED,
//! BOOKMARK, ERROR — with the `resourceVersion` semantics of the Kubernetes API
//! concepts, bookmarks, `sendInitialEvents`, timeouts, selectors and Table rows.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hive_api::meta::Status;
use hive_api::KindInfo;
use prometheus_client::metrics::counter::Counter;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::error::{ApiError, ApiResult};
use super::params::Params;
use super::selectors::Selectors;
use super::serve::EndStream;
use super::shape::{Answer, Shape};
use super::table::{self, IncludeObject};
use super::AppState;
use crate::store::{self, EventType, Obj};

/// Lines buffered between the watch task and the HTTP body. With objects of up to
/// `MAX_BODY_BYTES` (3 MiB), a watch holds at most this many of them beyond its store
/// buffer.
const LINE_BUFFER: usize = 16;

/// Events a watch task handles in a row while the store has them ready, before it looks
/// at its bookmark ticker, deadline and client again.
const READY_RUN: usize = 64;

/// The watch task's end of the HTTP body: lines, and ways to end the stream.
struct Sink {
    lines: mpsc::Sender<Bytes>,
    abort: Option<oneshot::Sender<()>>,
    /// The connection's way to end this response's stream, which works even when hyper
    /// has stopped polling the body (`None` outside a connection, in router tests).
    end: Option<EndStream>,
    write_timeout: Duration,
    counts: WatchCounts,
}

/// The counters one watch adds to (`apiserver_watch_events_total`,
/// `hive_watch_dropped_total`), taken once when it starts.
struct WatchCounts {
    sent: Counter,
    overflow: Counter,
    expired: Counter,
    not_reading: Counter,
}

impl WatchCounts {
    fn of(metrics: &crate::metrics::ApiMetrics, resource: &str) -> WatchCounts {
        let dropped = |reason| {
            metrics.watch_dropped.get_or_create_owned(&crate::metrics::DroppedLabels {
                resource: resource.to_string(),
                reason,
            })
        };
        WatchCounts {
            sent: metrics
                .watch_events
                .get_or_create_owned(&crate::metrics::ResourceLabels { resource: resource.to_string() }),
            overflow: dropped("overflow"),
            expired: dropped("expired"),
            not_reading: dropped("not_reading"),
        }
    }
}

/// Why a watch task stops sending.
enum Stop {
    /// The client went away.
    Gone,
    /// The client did not take a line for the write timeout: it is not reading.
    NotReading,
}

impl Sink {
    /// Queues `line` for the client, waiting at most the write timeout for room. A client
    /// that takes nothing for that long has its stream ended (its memory freed) — over
    /// HTTP/1.1 its connection is aborted, over HTTP/2 the stream is reset: it cannot
    /// read an in-stream error either.
    async fn send(&mut self, line: Bytes) -> Result<(), Stop> {
        // With room in the channel (the usual case) no timer is started.
        let line = match self.lines.try_send(line) {
            Ok(()) => return Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(Stop::Gone),
            Err(mpsc::error::TrySendError::Full(line)) => line,
        };
        match tokio::time::timeout(self.write_timeout, self.lines.send(line)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Stop::Gone),
            Err(_) => {
                self.counts.not_reading.inc();
                // The body ends with an error when hyper next polls it. hyper polls no
                // body whose writes are blocked — by a full socket, or on HTTP/2 by flow
                // control, which is what a client that reads nothing does — so the
                // stream is also ended from outside hyper.
                if let Some(abort) = self.abort.take() {
                    let _ = abort.send(());
                }
                if let Some(end) = self.end.take() {
                    end.end();
                }
                Err(Stop::NotReading)
            }
        }
    }
}

/// The most bytes of queued lines one poll of a watch's body joins into one chunk.
///
/// Every chunk the body yields becomes one HTTP/1.1 chunk (or HTTP/2 DATA frames), one
/// pass through rustls and, usually, one `write`: per chunk, not per byte, is where a
/// watcher's delivery cost lies (`docs/benchmarks.md`). 64 KiB is four full TLS records
/// (16 KiB each) and an HTTP/2 stream's initial window, about what one `write` to a
/// socket takes; copying that much costs a few microseconds, less than the writes it
/// saves, and it keeps the first of the joined lines from waiting behind a large copy.
/// A line this large or larger goes alone, uncopied.
const JOIN_BYTES: usize = 64 * 1024;

/// The HTTP body of a watch: the task's lines, until it aborts the connection. Each poll
/// yields every line already queued (up to [`JOIN_BYTES`]) as one chunk, in order, so a
/// watcher that falls a few events behind catches up in one write instead of one each.
struct Lines {
    lines: mpsc::Receiver<Bytes>,
    /// A line taken from the channel that did not fit in the previous chunk; it starts
    /// the next one.
    held: Option<Bytes>,
    /// The lines being joined into one chunk (kept to reuse its allocation).
    joining: Vec<Bytes>,
    abort: Option<oneshot::Receiver<()>>,
}

impl Lines {
    fn new(lines: mpsc::Receiver<Bytes>, abort: oneshot::Receiver<()>) -> Lines {
        Lines { lines, held: None, joining: Vec::new(), abort: Some(abort) }
    }

    /// `first` and every line already queued after it that fits in [`JOIN_BYTES`], as one
    /// chunk; a queued line that does not fit is held for the next chunk.
    fn join_queued(&mut self, first: Bytes) -> Bytes {
        let mut total = first.len();
        self.joining.push(first);
        while total < JOIN_BYTES {
            let Ok(line) = self.lines.try_recv() else { break };
            if total + line.len() > JOIN_BYTES {
                self.held = Some(line);
                break;
            }
            total += line.len();
            self.joining.push(line);
        }
        if self.joining.len() == 1 {
            return self.joining.pop().unwrap_or_default();
        }
        let mut chunk = bytes::BytesMut::with_capacity(total);
        for line in self.joining.drain(..) {
            chunk.extend_from_slice(&line);
        }
        chunk.freeze()
    }
}

impl futures_util::Stream for Lines {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::future::Future;
        use std::task::Poll;
        if let Some(abort) = self.abort.as_mut() {
            if let Poll::Ready(aborted) = std::pin::Pin::new(abort).poll(cx) {
                self.abort = None;
                if aborted.is_ok() {
                    let not_reading = std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the watch's client took no data for the write timeout",
                    );
                    return Poll::Ready(Some(Err(not_reading)));
                }
            }
        }
        let first = match self.held.take() {
            Some(line) => line,
            None => match std::task::ready!(self.lines.poll_recv(cx)) {
                Some(line) => line,
                None => return Poll::Ready(None),
            },
        };
        Poll::Ready(Some(Ok(self.join_queued(first))))
    }
}

struct Encoder {
    kind: &'static KindInfo,
    as_table: bool,
    /// The shape of each event's object when not a table.
    shape: Shape,
    include: IncludeObject,
    sent_columns: bool,
}

impl Encoder {
    /// One event line of a stored object: its JSON as committed, or its table row.
    fn object_event(&mut self, type_: &str, object: &Obj) -> Bytes {
        if self.as_table {
            return self.value_event(type_, &object.value());
        }
        match self.shape {
            Shape::Stored => line_with_encoded(type_, object.json()),
            other => line_with_encoded(type_, &other.bytes(object.json_bytes())),
        }
    }

    /// One event line of an object the watch changed (a `DELETED` of an object that
    /// stopped matching, at the event's revision).
    fn value_event(&mut self, type_: &str, object: &Value) -> Bytes {
        if !self.as_table {
            return line(&json!({"type": type_, "object": self.shape.value(object.clone())}));
        }
        let rv = object.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null);
        let rendered = table::table(
            self.kind,
            std::slice::from_ref(object),
            self.include,
            json!({"resourceVersion": rv}),
            !self.sent_columns,
        );
        self.sent_columns = true;
        line(&json!({"type": type_, "object": rendered}))
    }

    fn bookmark(&self, revision: u64, initial_events_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let (api_version, kind) = self.shape.object_kind(self.kind);
        line(
            &json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version, "metadata": metadata}}),
        )
    }
}

fn line(value: &Value) -> Bytes {
    let mut out = serde_json::to_vec(value).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

/// Writes `{"type":T,"object":<object JSON>}` around an object's committed encoding,
/// without encoding anything.
fn line_with_encoded(type_: &str, encoded: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(32 + encoded.len());
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(type_.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(encoded);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn error_line(code: u16, reason: &str, message: String) -> Bytes {
    line(&json!({"type": "ERROR", "object": Status::failure(code, reason, message)}))
}

/// What a selector watch sends for one stored event.
#[derive(Debug, PartialEq)]
enum Selected<'a> {
    /// The object neither matched before nor matches now.
    Nothing,
    /// The event as stored: an `ADDED`, a `MODIFIED` of an object that matched before
    /// and after, or a `DELETED` of one that matched.
    AsStored,
    /// A `MODIFIED` object that starts matching: `ADDED`, with the object as it is now.
    Added,
    /// A `MODIFIED` object that stops matching: `DELETED`, with the object as the watcher
    /// last saw it (its previous version) at the event's revision — what kube-apiserver's
    /// watch cache sends, so the deleted object still matches the watcher's selector.
    Left(&'a Obj),
}

/// Decides, as kube-apiserver's watch cache does, what the watcher of `selectors` sees
/// of `event`: whether the object passes the selectors now and whether it passed them
/// just before. Without selectors every event is sent as stored. A `MODIFIED` whose
/// previous version is unknown (it left the log before the store was reopened) is
/// judged by the object as it is now, as if its labels had not changed.
fn selected<'a>(selectors: &Selectors, event: &'a store::StoreEvent) -> Selected<'a> {
    if selectors.is_empty() {
        return Selected::AsStored;
    }
    let now = event.type_ != EventType::Deleted && selectors.matches_object(&event.object);
    let before = match (&event.previous, event.type_) {
        (Some(previous), _) => selectors.matches_object(previous),
        (None, EventType::Added) => false,
        (None, EventType::Modified) => now,
        (None, EventType::Deleted) => selectors.matches_object(&event.object),
    };
    match (before, now) {
        (false, false) => Selected::Nothing,
        (false, true) if event.type_ == EventType::Added => Selected::AsStored,
        (false, true) => Selected::Added,
        (true, true) => Selected::AsStored,
        (true, false) if event.type_ == EventType::Deleted => Selected::AsStored,
        (true, false) => match &event.previous {
            Some(previous) => Selected::Left(previous),
            None => Selected::AsStored,
        },
    }
}

/// `object` with `metadata.resourceVersion` set to `revision`.
fn at_revision(object: &Obj, revision: u64) -> Value {
    let mut object = object.value();
    if let Some(rv) = object.pointer_mut("/metadata/resourceVersion") {
        *rv = Value::String(revision.to_string());
    }
    object
}

/// Starts a watch of `kind` and returns the streaming response.
pub async fn serve(
    state: AppState,
    kind: &'static KindInfo,
    params: &Params,
    selectors: Selectors,
    as_table: bool,
    shape: Shape,
) -> ApiResult<Response> {
    let bookmarks = params.bookmarks()?;
    let send_initial = params.send_initial_events()?;
    let timeout = params.timeout_seconds()?.map(Duration::from_secs);
    let include = IncludeObject::parse(params.include_object.as_deref()).map_err(ApiError::BadRequest)?;
    let requested = params.reached_revision(&state.store).await?;
    let mut encoder = Encoder { kind, as_table, shape, include, sent_columns: false };

    // Unset or "0": synthetic ADDED for the current state, then every later change.
    // "N": every change after N, or an in-stream 410 when N is no longer retained.
    let (start, initial) = match requested {
        None => {
            let (revision, objects) = state.store.list_after(kind.plural, None);
            (revision, Some(objects))
        }
        Some(n) if send_initial => {
            // sendInitialEvents with resourceVersionMatch=NotOlderThan: the current
            // state (which is not older than N), then live.
            let _ = n;
            let (revision, objects) = state.store.list_after(kind.plural, None);
            (revision, Some(objects))
        }
        Some(n) => (n, None),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(LINE_BUFFER);
    let (abort, aborted) = oneshot::channel();
    let counts = WatchCounts::of(&state.metrics.api, kind.plural);
    let mut events = match state.store.watch(kind.plural, start) {
        Ok(w) => Some(w),
        Err(store::Error::Expired { requested, oldest }) => {
            counts.expired.inc();
            let _ = tx.try_send(error_line(
                410,
                "Expired",
                format!("too old resource version: {requested} ({oldest})"),
            ));
            None
        }
        Err(other) => return Err(other.into()),
    };
    let bookmark_every = state.config.bookmark_interval;
    let mut tx = Sink {
        lines: tx,
        abort: Some(abort),
        end: EndStream::current(),
        write_timeout: state.config.watch_write_timeout,
        counts,
    };
    tokio::spawn(async move {
        if let Some(objects) = initial {
            for (_, object) in objects.iter().filter(|(name, o)| selectors.matches_stored(name, o)) {
                if tx.send(encoder.object_event("ADDED", object)).await.is_err() {
                    return;
                }
                tx.counts.sent.inc();
            }
            if send_initial && tx.send(encoder.bookmark(start, true)).await.is_err() {
                return;
            }
        }
        let Some(events) = events.as_mut() else { return };
        let mut last = start;
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let expired = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expired);
        let mut ticker = tokio::time::interval(bookmark_every);
        ticker.tick().await;
        // Events already waiting are taken without the select below (its timers and
        // wake-ups cost more than handling the event), a bounded run at a time so the
        // bookmark ticker, the deadline and a closed client are still looked at.
        let mut ready_in_a_row = 0;
        loop {
            let ready = if ready_in_a_row < READY_RUN {
                futures_util::FutureExt::now_or_never(events.next())
            } else {
                None
            };
            let next = match ready {
                Some(event) => {
                    ready_in_a_row += 1;
                    event
                }
                None => {
                    ready_in_a_row = 0;
                    tokio::select! {
                        event = events.next() => event,
                        _ = ticker.tick(), if bookmarks => {
                            if tx.send(encoder.bookmark(last, false)).await.is_err() { return; }
                            continue;
                        }
                        _ = &mut expired => return,
                        _ = tx.lines.closed() => return,
                    }
                }
            };
            match next {
                Some(Ok(event)) => {
                    last = event.revision;
                    let line = match selected(&selectors, &event) {
                        Selected::Nothing => continue,
                        // Plain JSON lines of the stored event are the same for every
                        // watcher: built once, around the object's JSON from the commit.
                        Selected::AsStored if !encoder.as_table && encoder.shape == Shape::Stored => {
                            let type_ = event.type_.as_str();
                            event.encoded.get_or_init(|| line_with_encoded(type_, event.object.json()))
                        }
                        Selected::AsStored => encoder.object_event(event.type_.as_str(), &event.object),
                        Selected::Added => encoder.object_event("ADDED", &event.object),
                        Selected::Left(previous) => {
                            encoder.value_event("DELETED", &at_revision(previous, event.revision))
                        }
                    };
                    if tx.send(line).await.is_err() {
                        return;
                    }
                    tx.counts.sent.inc();
                }
                Some(Err(err)) => {
                    match err {
                        store::Error::WatchOverflow => tx.counts.overflow.inc(),
                        _ => tx.counts.expired.inc(),
                    };
                    let message = match err {
                        store::Error::WatchOverflow => format!(
                            "the watch fell behind the event stream and was closed; list again from revision {last} or later"
                        ),
                        other => format!("watch ended: {other}"),
                    };
                    let _ = tx.send(error_line(410, "Expired", message)).await;
                    return;
                }
                None => return,
            }
        }
    });
    let body = Body::from_stream(Lines::new(rx, aborted));
    let mut response = (StatusCode::OK, body).into_response();
    let content_type = if as_table { table::TABLE_CONTENT_TYPE } else { shape.content_type(Answer::Watch) };
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    Ok(response)
}

#[cfg(test)]
mod tests;
