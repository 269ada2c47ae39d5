//! Watch streams: chunked, one JSON event per line — ADDED, MODIFIED, DELETED,
//! BOOKMARK, ERROR — with the `resourceVersion` semantics of the Kubernetes API
//! concepts, bookmarks, `sendInitialEvents`, timeouts, selectors and Table rows.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hive_api::meta::Status;
use hive_api::KindInfo;
use prometheus_client::metrics::counter::Counter;
use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};
use super::params::Params;
use super::selectors::Selectors;
use super::shape::{Answer, Shape};
use super::table::{self, IncludeObject};
use super::AppState;
use crate::store::{self, EventType, Obj};

/// The most bytes of lines one poll of a watch's body joins into one chunk.
///
/// Every chunk the body yields becomes one HTTP/1.1 chunk (or HTTP/2 DATA frames), one
/// pass through rustls and, usually, one `write`: per chunk, not per byte, is where a
/// watcher's delivery cost lies (`docs/benchmarks.md`). 64 KiB is four full TLS records
/// (16 KiB each) and an HTTP/2 stream's initial window, about what one `write` to a
/// socket takes; copying that much costs a few microseconds, less than the writes it
/// saves, and it keeps the first of the joined lines from waiting behind a large copy.
/// A line this large or larger goes alone, uncopied.
const JOIN_BYTES: usize = 64 * 1024;

/// Events one poll of a watch's body takes while the store has them ready, at most:
/// bounds one poll's work when the events are small and many.
const READY_RUN: usize = 256;

/// Initial objects one poll of a watch's body looks at, at most: bounds one poll's work
/// when a selector skips most of them.
const INITIAL_RUN: usize = 4096;

/// How far [`WatchBody::add_initial`] got.
enum Initial {
    /// Every initial event, and the bookmark that ends them, is in.
    Done,
    /// The chunk is full.
    Full,
    /// It looked at [`INITIAL_RUN`] objects; more are left.
    More,
}

/// The counters one watch adds to (`apiserver_watch_events_total`,
/// `hive_watch_dropped_total`), taken once when it starts. A watch whose client reads
/// nothing is ended by the stream's keeper (`streams.rs`) and counted there
/// (`hive_streams_ended_total{reason="not_reading"}`).
struct WatchCounts {
    sent: Counter,
    overflow: Counter,
    expired: Counter,
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
        }
    }
}

/// Lines joined into one chunk of at most [`JOIN_BYTES`] (a line that large or larger
/// alone).
#[derive(Default)]
struct Chunk {
    lines: Vec<Bytes>,
    bytes: usize,
}

impl Chunk {
    /// Adds `line`, or gives it back when it would take the chunk past the bound (it
    /// starts the next one).
    fn push(&mut self, line: Bytes) -> Result<(), Bytes> {
        if !self.lines.is_empty() && self.bytes + line.len() > JOIN_BYTES {
            return Err(line);
        }
        self.bytes += line.len();
        self.lines.push(line);
        Ok(())
    }

    fn is_full(&self) -> bool {
        self.bytes >= JOIN_BYTES
    }

    fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// The joined lines (a single line as it is, uncopied), leaving the chunk empty.
    fn take(&mut self) -> Bytes {
        self.bytes = 0;
        if self.lines.len() == 1 {
            return self.lines.pop().unwrap_or_default();
        }
        let mut chunk = bytes::BytesMut::with_capacity(self.lines.iter().map(Bytes::len).sum());
        for line in self.lines.drain(..) {
            chunk.extend_from_slice(&line);
        }
        chunk.freeze()
    }
}

/// The HTTP body of a watch, which is the watch itself: each poll takes what the store
/// has ready for it (the initial events first, when asked for), turns it into lines and
/// yields them joined as one chunk; with nothing ready it waits on the store, the
/// bookmark ticker and the deadline together. No task sits between the store and the
/// connection: a delivery wakes the stream's own task, which hands the chunk to h2 (or
/// hyper's HTTP/1.1 writer) in the same poll.
///
/// A client that stops reading stops hyper polling this body; the store then drops the
/// watcher once its buffer is full (`--watch-buffer`, `--watch-buffer-bytes`), and the
/// stream's keeper ends the stream after the write timeout (`streams.rs`), freeing
/// what the store had buffered.
struct WatchBody {
    /// The current state as synthetic `ADDED`s, not yet sent (`None` once all are).
    initial: Option<std::vec::IntoIter<(Arc<str>, Obj)>>,
    /// The `BOOKMARK` that ends the initial events (`sendInitialEvents`), not yet sent.
    initial_end: Option<u64>,
    /// A line that did not fit in the last chunk: it starts the next.
    held: Option<Bytes>,
    /// The store's events; `None` once they ended (or the watch could not start).
    events: Option<store::Watch>,
    /// The revision of the last event taken (what a bookmark carries).
    last: u64,
    encoder: Encoder,
    selectors: Selectors,
    bookmarks: Option<tokio::time::Interval>,
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    counts: WatchCounts,
    chunk: Chunk,
    /// Nothing more to send once the chunk being joined is out.
    ending: bool,
}

impl WatchBody {
    /// Adds `line` to the chunk; false when the chunk is full (the line is held for the
    /// next).
    fn add(&mut self, line: Bytes) -> bool {
        match self.chunk.push(line) {
            Ok(()) => !self.chunk.is_full(),
            Err(line) => {
                self.held = Some(line);
                false
            }
        }
    }

    /// Adds the initial events while they fit, looking at most [`INITIAL_RUN`] objects
    /// in one poll (a selector may skip a million of them).
    fn add_initial(&mut self) -> Initial {
        let mut looked = 0;
        while let Some(initial) = self.initial.as_mut() {
            if looked == INITIAL_RUN {
                return Initial::More;
            }
            looked += 1;
            let Some((name, object)) = initial.next() else {
                self.initial = None;
                break;
            };
            if !self.selectors.matches_stored(&name, &object) {
                continue;
            }
            let line = self.encoder.object_event("ADDED", &object);
            self.counts.sent.inc();
            if !self.add(line) {
                return Initial::Full;
            }
        }
        if let Some(revision) = self.initial_end.take() {
            let line = self.encoder.bookmark(revision, true);
            if !self.add(line) {
                return Initial::Full;
            }
        }
        Initial::Done
    }

    /// The line of one store event for this watcher, if it sees the event.
    fn line_of(&mut self, event: &store::StoreEvent) -> Option<Bytes> {
        self.last = event.revision;
        let line = match selected(&self.selectors, event) {
            Selected::Nothing => return None,
            // Plain JSON lines of the stored event are the same for every watcher:
            // built once, around the object's JSON from the commit.
            Selected::AsStored if !self.encoder.as_table && self.encoder.shape == Shape::Stored => {
                let type_ = event.type_.as_str();
                event.encoded.get_or_init(|| line_with_encoded(type_, event.object.json()))
            }
            Selected::AsStored => self.encoder.object_event(event.type_.as_str(), &event.object),
            Selected::Added => self.encoder.object_event("ADDED", &event.object),
            Selected::Left(previous) => {
                self.encoder.value_event("DELETED", &at_revision(previous, event.revision))
            }
        };
        self.counts.sent.inc();
        Some(line)
    }

    /// The in-stream 410 of a watch the store ended.
    fn ended_line(&self, err: store::Error) -> Bytes {
        match err {
            store::Error::WatchOverflow => self.counts.overflow.inc(),
            _ => self.counts.expired.inc(),
        };
        let message = match err {
            store::Error::WatchOverflow => format!(
                "the watch fell behind the event stream and was closed; list again from revision {} or later",
                self.last
            ),
            other => format!("watch ended: {other}"),
        };
        error_line(410, "Expired", message)
    }

    /// Adds the events the store has ready, at most [`READY_RUN`], while they fit. True
    /// when it stopped at that bound with events perhaps still ready: nobody will wake
    /// the body for those, so it must wake itself if it yields nothing.
    fn add_ready(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        use std::task::Poll;
        for _ in 0..READY_RUN {
            let Some(events) = self.events.as_mut() else { return false };
            let line = match futures_util::Stream::poll_next(std::pin::Pin::new(events), cx) {
                Poll::Pending => return false,
                Poll::Ready(Some(Ok(event))) => match self.line_of(&event) {
                    Some(line) => line,
                    None => continue,
                },
                Poll::Ready(Some(Err(err))) => {
                    self.events = None;
                    self.ending = true;
                    self.ended_line(err)
                }
                Poll::Ready(None) => {
                    self.events = None;
                    self.ending = true;
                    return false;
                }
            };
            if !self.add(line) {
                return false;
            }
        }
        true
    }
}

impl futures_util::Stream for WatchBody {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::future::Future;
        use std::task::Poll;
        let this = self.get_mut();
        if let Some(deadline) = this.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                // timeoutSeconds: the stream ends cleanly, as kube-apiserver ends it.
                this.chunk = Chunk::default();
                return Poll::Ready(None);
            }
        }
        let mut room = true;
        if let Some(line) = this.held.take() {
            room = this.add(line);
        }
        let mut more_ready = false;
        if room {
            match this.add_initial() {
                Initial::Done if !this.chunk.is_full() && this.held.is_none() => {
                    more_ready = this.add_ready(cx);
                }
                Initial::More => more_ready = true,
                Initial::Done | Initial::Full => {}
            }
        }
        // With events still coming, a bookmark is due when its interval is (it carries
        // the revision of the last event before it).
        let bookmark = this.held.is_none()
            && !this.ending
            && this.initial.is_none()
            && this.initial_end.is_none()
            && this.bookmarks.as_mut().is_some_and(|ticker| ticker.poll_tick(cx).is_ready());
        if bookmark {
            let line = this.encoder.bookmark(this.last, false);
            this.add(line);
        }
        if !this.chunk.is_empty() {
            return Poll::Ready(Some(Ok(this.chunk.take())));
        }
        if this.ending || (this.events.is_none() && this.initial.is_none()) {
            return Poll::Ready(None);
        }
        if more_ready {
            // A run of events or objects this watcher does not see (a selector's): let
            // other tasks run, then take the rest.
            cx.waker().wake_by_ref();
        } else if let Some(events) = &this.events {
            // Polled again after its last chunk went to the connection, and nothing is
            // ready: every line it owed is there (the connection may write now).
            events.sent();
        }
        Poll::Pending
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
    let encoder = Encoder { kind, as_table, shape, include, sent_columns: false };

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
    let counts = WatchCounts::of(&state.metrics.api, kind.plural);
    // Grouped by connection: see `Store::watch_grouped`.
    let group = super::serve::current_group();
    let (events, held) = match state.store.watch_grouped(kind.plural, start, group) {
        Ok(w) => (Some(w), None),
        Err(store::Error::Expired { requested, oldest }) => {
            counts.expired.inc();
            let gone =
                error_line(410, "Expired", format!("too old resource version: {requested} ({oldest})"));
            (None, Some(gone))
        }
        Err(other) => return Err(other.into()),
    };
    let bookmarks = bookmarks.then(|| {
        let every = state.config.bookmark_interval;
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker
    });
    let body = WatchBody {
        initial: initial.map(Vec::into_iter),
        initial_end: (send_initial && events.is_some()).then_some(start),
        ending: held.is_some(),
        held,
        events,
        last: start,
        encoder,
        selectors,
        bookmarks,
        deadline: timeout.map(|t| Box::pin(tokio::time::sleep(t))),
        counts,
        chunk: Chunk::default(),
    };
    let body = Body::from_stream(body);
    let mut response = (StatusCode::OK, body).into_response();
    let content_type = if as_table { table::TABLE_CONTENT_TYPE } else { shape.content_type(Answer::Watch) };
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    Ok(response)
}

#[cfg(test)]
mod tests;
