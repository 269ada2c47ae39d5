//! One HTTP connection after its TLS handshake: served by hyper with the axum router —
//! HTTP/2 when the client chose `h2` by ALPN (`http2.rs`), HTTP/1.1 otherwise — closed
//! when the first request's head does not arrive within the header timeout, and closed
//! gracefully once it has been idle for the idle timeout. A request in flight (a watch,
//! a followed log) is never cut by either.
//!
//! Both timers are ours, not hyper's `header_read_timeout`: hyper starts that one as
//! soon as a response is written, so on a keep-alive connection it would also run while
//! the connection is merely idle and close every idle connection at the header timeout.
//! Here, as in Go's `net/http` (`ReadHeaderTimeout`, `IdleTimeout`), the header timer of
//! a kept-alive HTTP/1.1 connection starts with the next request's first byte.
//!
//! On HTTP/2 the header timer covers the connection preface, the SETTINGS and the first
//! request's HEADERS (later streams' heads arrive as single frames, bounded by
//! [`http2::MAX_HEADER_LIST_BYTES`]); idle means no stream open, whatever frames
//! (PING, WINDOW_UPDATE) still arrive — Go's server counts idleness the same way — and
//! the graceful close is a GOAWAY. A client that does not finish closing within
//! [`GOODBYE_WITHIN`] of the GOAWAY (or of the HTTP/1.1 close) is dropped.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::ServiceExt as _;

use super::end_stream::EndStream;
use super::http2;
use crate::store::Group;

/// The header-read timeout when `--http-header-timeout` is not given (Go's and
/// kube-apiserver's usual choice).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The idle keep-alive timeout when `--http-idle-timeout` is not given (Go's
/// `http.Transport` keeps idle connections this long too, so clients rarely reuse one
/// the server has just closed).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How long a connection closed gracefully (idle) may take to finish closing: an
/// HTTP/2 client acknowledges the GOAWAY's PING within a round trip.
const GOODBYE_WITHIN: Duration = Duration::from_secs(5);

/// The timeouts of one connection; `None` turns one off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// From a new connection, or from the first byte of a kept-alive connection's next
    /// request, until that request's head has been read.
    pub header: Option<Duration>,
    /// How long a connection with no request in flight may go without a byte read.
    pub idle: Option<Duration>,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts { header: Some(DEFAULT_HEADER_TIMEOUT), idle: Some(DEFAULT_IDLE_TIMEOUT) }
    }
}

/// The HTTP a connection speaks, as its TLS handshake's ALPN chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Protocol {
    Http1,
    Http2,
}

impl Protocol {
    /// HTTP/2 when ALPN chose `h2`; HTTP/1.1 otherwise (also without ALPN).
    pub(super) fn negotiated(alpn: Option<&[u8]>) -> Protocol {
        match alpn {
            Some(b"h2") => Protocol::Http2,
            _ => Protocol::Http1,
        }
    }
}

tokio::task_local! {
    /// The watch group of the connection the request being answered came in on.
    static CONNECTION: Arc<Group>;
}

/// The watch group of the connection the request being answered came in on; `None`
/// outside a request. A watch is registered in its connection's group
/// (`Store::watch_grouped`), so the watches of one connection are handed an event one
/// after another, and the connection writes their frames once they all have (see
/// [`Tracked`]).
pub fn current_group() -> Option<Arc<Group>> {
    CONNECTION.try_with(Arc::clone).ok()
}

/// Serves one connection until the client closes it, a timeout closes it, or the
/// runtime ends.
pub(super) async fn serve<S>(io: S, protocol: Protocol, app: Router, timeouts: Timeouts, peer: SocketAddr)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new(Instant::now()));
    let group = Group::new();
    let io = TokioIo::new(Tracked::new(io, activity.clone(), protocol, group.clone()));
    let service =
        TowerToHyperService::new(Tracking { app, activity: activity.clone(), peer, protocol, group });
    let result = match protocol {
        Protocol::Http1 => {
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                // Our own header timer (see the module's note) replaces hyper's.
                .header_read_timeout(None)
                .serve_connection(io, service);
            drive(conn, |conn| conn.graceful_shutdown(), &activity, timeouts, peer).await
        }
        Protocol::Http2 => {
            tracing::debug!(%peer, "serving a connection over HTTP/2");
            let conn = http2::builder().serve_connection(io, service);
            drive(conn, |conn| conn.graceful_shutdown(), &activity, timeouts, peer).await
        }
    };
    if let Some(Err(err)) = result {
        tracing::debug!(%peer, error = %err, "connection ended with an error");
    }
}

/// Runs `conn` until it ends (`Some`), or a timeout or [`EndStream`] closes it (`None`).
async fn drive<C>(
    conn: C,
    graceful_shutdown: impl Fn(Pin<&mut C>),
    activity: &Activity,
    timeouts: Timeouts,
    peer: SocketAddr,
) -> Option<hyper::Result<()>>
where
    C: Future<Output = hyper::Result<()>>,
{
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => return Some(result),
        () = activity.closing() => {
            tracing::debug!(%peer, "closing a connection: a response on it could not end otherwise");
            return None;
        }
        expiry = activity.expiry(timeouts) => match expiry {
            Expiry::Header => {
                // Dropping the connection closes the socket; there is no request to answer.
                tracing::debug!(%peer, "closing a connection: no complete request head within the header timeout");
                return None;
            }
            Expiry::Idle => tracing::debug!(%peer, "closing an idle connection"),
        },
    }
    // Idle means no request in flight, so HTTP/1.1 closes at once (with a TLS
    // close_notify) and HTTP/2 sends GOAWAY; a request that raced in is finished first.
    // A client that holds the connection open after that, with nothing in flight, is
    // dropped.
    graceful_shutdown(conn.as_mut());
    activity.update(|phase| match phase {
        Phase::Idle { .. } => Phase::Idle { since: Instant::now() },
        other => other,
    });
    let goodbye = Timeouts { header: Some(GOODBYE_WITHIN), idle: Some(GOODBYE_WITHIN) };
    tokio::select! {
        result = conn.as_mut() => Some(result),
        () = activity.closing() => None,
        _ = activity.expiry(goodbye) => {
            tracing::debug!(%peer, "dropping a connection that did not finish its graceful close");
            None
        }
    }
}

/// Where a connection is between requests, as the timeouts see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request head: on a new connection since it was accepted, on a
    /// kept-alive one since the head's first byte.
    Head { since: Instant },
    /// This many requests have been read whose responses are not finished.
    Busy { requests: usize },
    /// No request in flight and no byte read since `since`.
    Idle { since: Instant },
}

/// Which timeout ended a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expiry {
    Header,
    Idle,
}

impl Phase {
    /// Bytes arrived at `now`: on an idle connection, a request head has begun.
    fn read(self, now: Instant) -> Phase {
        match self {
            Phase::Idle { .. } => Phase::Head { since: now },
            other => other,
        }
    }

    /// hyper read a request's head and called the router.
    fn request(self) -> Phase {
        match self {
            Phase::Busy { requests } => Phase::Busy { requests: requests + 1 },
            Phase::Head { .. } | Phase::Idle { .. } => Phase::Busy { requests: 1 },
        }
    }

    /// A response finished (its body was written, or dropped) at `now`.
    fn responded(self, now: Instant) -> Phase {
        match self {
            Phase::Busy { requests } if requests > 1 => Phase::Busy { requests: requests - 1 },
            Phase::Busy { .. } => Phase::Idle { since: now },
            other => other,
        }
    }

    /// When, and by which timeout, the connection is to be closed if nothing happens.
    fn deadline(self, timeouts: Timeouts) -> Option<(Instant, Expiry)> {
        match self {
            Phase::Head { since } => timeouts.header.map(|d| (since + d, Expiry::Header)),
            Phase::Idle { since } => timeouts.idle.map(|d| (since + d, Expiry::Idle)),
            Phase::Busy { .. } => None,
        }
    }
}

/// A connection's phase, shared by its reader, its requests and its watchdog.
struct Activity {
    phase: Mutex<Phase>,
    changed: Notify,
    /// Ended by an HTTP/1.1 request's [`EndStream`]: the connection is to be closed.
    close: EndStream,
}

impl Activity {
    fn new(now: Instant) -> Activity {
        Activity {
            phase: Mutex::new(Phase::Head { since: now }),
            changed: Notify::new(),
            close: EndStream::default(),
        }
    }

    /// Resolves once a response asked for the connection to be closed.
    async fn closing(&self) {
        self.close.requested().await
    }

    fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the phase on, waking the watchdog when it changed.
    fn update(&self, step: impl FnOnce(Phase) -> Phase) {
        let mut phase = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        let next = step(*phase);
        if next != *phase {
            *phase = next;
            self.changed.notify_one();
        }
    }

    /// Resolves when the current phase outlives its timeout. A phase change wakes it
    /// (`notify_one` keeps the wake-up if it comes before the wait), and it re-reads.
    async fn expiry(&self, timeouts: Timeouts) -> Expiry {
        loop {
            match self.phase().deadline(timeouts) {
                Some((at, why)) if at <= Instant::now() => return why,
                Some((at, _)) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.changed.notified() => {}
                    }
                }
                None => self.changed.notified().await,
            }
        }
    }
}

/// The connection's byte stream, telling [`Activity`] when bytes arrive on an idle
/// HTTP/1.1 connection (the next request's head has begun; on HTTP/2 bytes may be any
/// frame, and only a stream ends idleness).
///
/// On HTTP/2 it also gathers the frames of a flush into one write. A thousand watches of
/// one kind get each event at once: every watch's task queues its line, and the
/// connection's task, woken by the first, would write that one frame alone, then the
/// next — one `writev`, one TLS record and one TCP segment a watcher per event (measured:
/// exactly one `writev` a delivery). So what h2 writes is copied into a buffer of this
/// connection's (up to [`GATHER_BYTES`]) and goes out when h2 flushes; and with more than
/// one stream open a flush is held until the tasks already ready on this worker have run
/// (tokio's `yield_now` defers a wake-up to when the worker has nothing else ready, or to
/// its next maintenance, 61 tasks on), however often other streams wake the connection's
/// task meanwhile: their frames join the buffer and leave in the same write. h2 writes a
/// DATA frame of 1 KiB or more on its own and flushes behind it (it chains the frame
/// rather than copying it, and a chained frame is flushed before the next is encoded), so
/// holding its writes alone left a flush in two or three writes whenever the lines were
/// that long (measured: about three `writev` per event per connection at 100 watchers ×
/// 1,000 Agents a second); gathered, the writes of a flush are one. This stream says it
/// does not write vectors, so h2 copies the small frames it does not chain.
///
/// The connection's watches are a [`Group`]. While some of them owe lines for events they
/// were handed, a flush is held for those lines instead, and goes out once every one has
/// sent on what it took, without waiting for the rest of the worker's ready tasks (the
/// other connections' watches): each connection writes as soon as its own lines are in,
/// not when the whole event's are, nor at the worker's next maintenance, which took some
/// connections' writes in halves. A watch that does not send (its stream out of flow
/// control window) holds a flush for at most [`HOLD_AT_MOST`]. Measured on 16
/// connections against the deferred release alone: delivery p50 5–17% lower at 1,000
/// watchers × 10 writes a second (6 pairs of 6), about 3% at 100 × 1,000/s (lower in 11
/// pairs of 15); the number of writes unchanged (docs/benchmarks.md).
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    protocol: Protocol,
    /// The connection's watches.
    group: Arc<Group>,
    /// The bound on a flush held for the watches' lines.
    fallback: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The hold on this flush, once it was held.
    hold: Option<Arc<Hold>>,
    /// HTTP/2: what h2 wrote since the last flush went out.
    gathered: bytes::BytesMut,
}

/// The most an HTTP/2 connection gathers before it writes, whatever the hold: a flush of
/// more goes out in writes of this size (h2's frames are at most 16 KiB).
const GATHER_BYTES: usize = 64 * 1024;

/// The longest a flush is held for lines the connection's watches owe.
const HOLD_AT_MOST: Duration = Duration::from_millis(1);

/// A held flush: released by the deferred wake (the worker's ready tasks have run), the
/// group settling (the connection's watches sent their lines), or the timer.
struct Hold {
    released: AtomicBool,
    task: std::task::Waker,
}

impl std::task::Wake for Hold {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // The first of its releases wakes the task; a later one (a timer that fires after
        // the group settled) is spent.
        if !self.released.swap(true, Ordering::AcqRel) {
            self.task.wake_by_ref();
        }
    }
}

impl<S> Tracked<S> {
    fn new(inner: S, activity: Arc<Activity>, protocol: Protocol, group: Arc<Group>) -> Tracked<S> {
        Tracked {
            inner,
            activity,
            protocol,
            group,
            fallback: None,
            hold: None,
            gathered: bytes::BytesMut::new(),
        }
    }

    /// Whether this flush waits: a flush on an HTTP/2 connection with more than one
    /// stream open is held until the connection's watches have sent on what they were
    /// handed (for at most [`HOLD_AT_MOST`]) when they owe lines, else until the worker's
    /// ready tasks have run or the watches' group settles. A held flush's task is woken
    /// when released.
    fn waits(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(hold) = &self.hold {
            return !hold.released.load(Ordering::Acquire);
        }
        if self.protocol != Protocol::Http2 {
            return false;
        }
        if !matches!(self.activity.phase(), Phase::Busy { requests } if requests > 1) {
            return false;
        }
        if self.group.take_settled() {
            // Every line the watches owed is in this flush.
            return false;
        }
        let hold = Arc::new(Hold { released: AtomicBool::new(false), task: cx.waker().clone() });
        let release = std::task::Waker::from(hold.clone());
        if self.group.owes_lines() {
            // Released when the group settles, or at the latest after HOLD_AT_MOST.
            let deadline = tokio::time::Instant::now() + HOLD_AT_MOST;
            let timer = self.fallback.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            timer.as_mut().reset(deadline);
            let _ = timer.as_mut().poll(&mut Context::from_waker(&release));
        } else {
            // The first poll of `yield_now` hands its waker to the worker's deferred list
            // (or wakes it at once outside a runtime) and is pending; it is not polled
            // again.
            let yielded = std::pin::pin!(tokio::task::yield_now());
            let _ = yielded.poll(&mut Context::from_waker(&release));
        }
        self.group.wake_when_settled(&release);
        if self.group.take_settled() {
            // It settled before the waker was in place.
            hold.released.store(true, Ordering::Release);
        }
        self.hold = Some(hold);
        !self.hold.as_ref().is_some_and(|h| h.released.load(Ordering::Acquire))
    }
}

impl<S: AsyncWrite + Unpin> Tracked<S> {
    /// Writes out what was gathered.
    fn write_gathered(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.gathered.is_empty() {
            let written = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.gathered))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            bytes::Buf::advance(&mut self.gathered, written);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        if this.protocol == Protocol::Http1
            && matches!(poll, Poll::Ready(Ok(())))
            && buf.filled().len() > before
        {
            this.activity.update(|phase| match phase {
                Phase::Idle { .. } => phase.read(Instant::now()),
                other => other,
            });
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.protocol != Protocol::Http2 {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        if this.gathered.len() + buf.len() > GATHER_BYTES {
            ready!(this.write_gathered(cx))?;
        }
        if buf.len() >= GATHER_BYTES {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        this.gathered.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.protocol != Protocol::Http2 {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        // Not asked for (this stream says it does not write vectors): the first buffer.
        let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &b[..]);
        Pin::new(this).poll_write(cx, first)
    }

    fn is_write_vectored(&self) -> bool {
        // On HTTP/2, h2 copies small frames (see the type's doc).
        self.protocol == Protocol::Http1 && self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.gathered.is_empty() {
            if this.waits(cx) {
                return Poll::Pending;
            }
            if this.hold.is_some() {
                // What settled the group is in this write; a mark it left is spent.
                this.group.take_settled();
            }
            ready!(this.write_gathered(cx))?;
        }
        let flushed = Pin::new(&mut this.inner).poll_flush(cx);
        if flushed.is_ready() {
            this.hold = None;
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.write_gathered(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// The router, telling [`Activity`] when a request starts and when its response ends.
#[derive(Clone)]
struct Tracking {
    app: Router,
    activity: Arc<Activity>,
    /// The client's address, handed to the router as `ConnectInfo` (the audit log's
    /// source address).
    peer: SocketAddr,
    protocol: Protocol,
    /// This connection's watch group ([`current_group`]).
    group: Arc<Group>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl tower::Service<Request<Incoming>> for Tracking {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready; `oneshot` below asks it anyway.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Incoming>) -> Answer {
        request.extensions_mut().insert(axum::extract::ConnectInfo(self.peer));
        let in_flight = InFlight::start(self.activity.clone());
        let app = self.app.clone();
        let answer = CONNECTION.scope(self.group.clone(), async move {
            let response = app.oneshot(request).await?;
            Ok(response.map(|body| Body::new(Finishing { body, _in_flight: in_flight })))
        });
        match self.protocol {
            // This runs in the stream's own task, whose `EndStream` is in scope.
            Protocol::Http2 => Box::pin(answer),
            // An HTTP/1.1 response ends early only with its connection.
            Protocol::Http1 => Box::pin(self.activity.close.clone().scope(answer)),
        }
    }
}

/// One request in flight; dropping it (with its response body) ends it.
struct InFlight {
    activity: Arc<Activity>,
}

impl InFlight {
    fn start(activity: Arc<Activity>) -> InFlight {
        activity.update(Phase::request);
        InFlight { activity }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.activity.update(|phase| phase.responded(Instant::now()));
    }
}

/// A response body that keeps its request in flight until hyper has written it all (a
/// watch's body, until the watch ends) and drops it.
struct Finishing {
    body: Body,
    _in_flight: InFlight,
}

impl HttpBody for Finishing {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUTS: Timeouts =
        Timeouts { header: Some(Duration::from_secs(10)), idle: Some(Duration::from_secs(90)) };

    #[test]
    fn phases_and_their_deadlines() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // (name, steps applied to a new connection at t0, expected deadline)
        type Step = fn(Phase, Instant) -> Phase;
        let read: Step = |p, now| p.read(now);
        let request: Step = |p, _| p.request();
        let responded: Step = |p, now| p.responded(now);
        type Case = (&'static str, Vec<(Step, u64)>, Option<(Instant, Expiry)>);
        let cases: [Case; 7] = [
            ("a new connection waits for its head", vec![], Some((at(10), Expiry::Header))),
            (
                "bytes of the first head do not move its deadline",
                vec![(read, 3)],
                Some((at(10), Expiry::Header)),
            ),
            ("a request in flight has no deadline", vec![(request, 1)], None),
            (
                "after the response the idle timer runs",
                vec![(request, 1), (responded, 5)],
                Some((at(95), Expiry::Idle)),
            ),
            (
                "the next head's first byte starts the header timer",
                vec![(request, 1), (responded, 5), (read, 60)],
                Some((at(70), Expiry::Header)),
            ),
            (
                "two requests in flight: one finished is still busy",
                vec![(request, 1), (request, 2), (responded, 3)],
                None,
            ),
            (
                "both finished: idle from the last",
                vec![(request, 1), (request, 2), (responded, 3), (responded, 4)],
                Some((at(94), Expiry::Idle)),
            ),
        ];
        for (name, steps, expected) in cases {
            let phase = steps.iter().fold(Phase::Head { since: t0 }, |p, (step, s)| step(p, at(*s)));
            assert_eq!(phase.deadline(TIMEOUTS), expected, "{name}");
        }
    }

    #[test]
    fn a_timeout_that_is_off_sets_no_deadline() {
        let t0 = Instant::now();
        let off = Timeouts { header: None, idle: None };
        assert_eq!(Phase::Head { since: t0 }.deadline(off), None);
        assert_eq!(Phase::Idle { since: t0 }.deadline(off), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_follows_phase_changes() {
        let activity = Arc::new(Activity::new(Instant::now()));
        let watchdog = tokio::spawn({
            let activity = activity.clone();
            async move { activity.expiry(TIMEOUTS).await }
        });
        // A request arrives before the header timeout, and lasts longer than both.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let in_flight = InFlight::start(activity.clone());
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!watchdog.is_finished(), "a request in flight is never timed out");
        drop(in_flight);
        let idle_from = Instant::now();
        assert_eq!(watchdog.await.unwrap(), Expiry::Idle);
        assert_eq!(Instant::now() - idle_from, Duration::from_secs(90));
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_begun_on_an_idle_connection_gets_the_header_timeout() {
        let activity = Arc::new(Activity::new(Instant::now()));
        drop(InFlight::start(activity.clone()));
        let watchdog = tokio::spawn({
            let activity = activity.clone();
            async move { activity.expiry(TIMEOUTS).await }
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        activity.update(|p| p.read(Instant::now()));
        let begun = Instant::now();
        assert_eq!(watchdog.await.unwrap(), Expiry::Header);
        assert_eq!(Instant::now() - begun, Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_on_an_idle_connection_begin_a_head_on_http1_only() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        // (protocol, the phase after a byte arrives on an idle connection)
        for (protocol, begins_head) in [(Protocol::Http1, true), (Protocol::Http2, false)] {
            let activity = Arc::new(Activity::new(Instant::now()));
            drop(InFlight::start(activity.clone()));
            let idle = activity.phase();
            let (mut client, server) = tokio::io::duplex(64);
            let mut tracked = Tracked::new(server, activity.clone(), protocol, Group::new());
            // A PING frame's worth of bytes, on HTTP/2; the start of a request, on HTTP/1.1.
            client.write_all(b"x").await.unwrap();
            let mut byte = [0u8; 1];
            tracked.read_exact(&mut byte).await.unwrap();
            let phase = activity.phase();
            assert_eq!(matches!(phase, Phase::Head { .. }), begins_head, "{protocol:?}: {phase:?}");
            if !begins_head {
                assert_eq!(phase, idle, "{protocol:?}: still idle since the response");
            }
        }
    }

    #[tokio::test]
    async fn an_http2_connections_flush_leaves_in_one_write_behind_the_ready_tasks() {
        use tokio::io::AsyncWriteExt as _;
        // A DATA frame of 1.5 KiB, as h2 writes one it chains: its head and first KiB, then
        // the rest, each written and flushed before the next frame.
        async fn frame(tracked: &mut Tracked<Recorder>) {
            tracked.write_all(&[7; 1024]).await.unwrap();
            tracked.write_all(&[7; 512]).await.unwrap();
        }
        // (protocol, streams open, whether a flush waits for the ready tasks, the writes
        // that reach the socket)
        let cases = [
            (Protocol::Http2, 2, true, vec![3 * 1536]),
            (Protocol::Http2, 1, false, vec![1536, 1536, 1536]),
            (Protocol::Http1, 2, false, vec![1024, 512, 1024, 512, 1024, 512]),
        ];
        for (protocol, streams, waits, writes) in cases {
            let activity = Arc::new(Activity::new(Instant::now()));
            let _open: Vec<InFlight> = (0..streams).map(|_| InFlight::start(activity.clone())).collect();
            let recorder = Recorder::default();
            let mut tracked = Tracked::new(recorder.clone(), activity.clone(), protocol, Group::new());
            let case = format!("{protocol:?} with {streams} stream(s) open");
            let ran = Arc::new(AtomicBool::new(false));
            let ready = tokio::spawn({
                let ran = ran.clone();
                async move { ran.store(true, Ordering::SeqCst) }
            });
            // Three frames from three streams, the connection's task polled by each: h2
            // flushes after each, and on HTTP/2 the first flush is held, so is the next.
            let mut flushed = Vec::new();
            for _ in 0..3 {
                frame(&mut tracked).await;
                let flush =
                    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut tracked).poll_flush(cx))).await;
                flushed.push(flush.is_ready());
            }
            assert_eq!(flushed, [!waits; 3], "{case}: flushes polled before the ready tasks ran");
            tracked.flush().await.unwrap();
            assert_eq!(ran.load(Ordering::SeqCst), waits, "{case}: the ready task ran before the write");
            ready.await.unwrap();
            assert_eq!(recorder.writes(), writes, "{case}: the socket's writes");
            // The next flush is held again.
            frame(&mut tracked).await;
            let flush = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut tracked).poll_flush(cx))).await;
            assert_eq!(flush.is_ready(), !waits, "{case}: the next flush");
            tracked.flush().await.unwrap();
        }
        // More than GATHER_BYTES between flushes goes out in writes of at most that.
        let activity = Arc::new(Activity::new(Instant::now()));
        let recorder = Recorder::default();
        let mut tracked = Tracked::new(recorder.clone(), activity.clone(), Protocol::Http2, Group::new());
        for _ in 0..100 {
            tracked.write_all(&[7; 1536]).await.unwrap();
        }
        tracked.flush().await.unwrap();
        let writes = recorder.writes();
        assert_eq!(writes.iter().sum::<usize>(), 100 * 1536);
        assert!(writes.len() == 3 && writes.iter().all(|&w| w <= GATHER_BYTES), "{writes:?}");
        // HTTP/2 has h2 copy small frames instead of writing vectors; HTTP/1.1 keeps what
        // the stream does.
        let tcp = |protocol| Tracked::new(VectoredSink, activity.clone(), protocol, Group::new());
        assert!(!tcp(Protocol::Http2).is_write_vectored());
        assert!(tcp(Protocol::Http1).is_write_vectored());
    }

    /// A held flush goes out as soon as the connection's watches have each sent on the
    /// event they were handed, while other ready tasks of the worker (another
    /// connection's watches) have not run; and not while one of them still owes its line.
    #[tokio::test]
    async fn a_held_flush_leaves_once_the_connections_watches_sent_their_lines() {
        use crate::store::{Mutation, Store, StoreConfig};
        use futures_util::StreamExt as _;
        use tokio::io::AsyncWriteExt as _;
        let agent = |name: &str| Mutation::Create {
            kind: "agents",
            object: serde_json::json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name}}),
        };
        // Polled once with the test task's waker: whether the flush went out.
        async fn poll_flush(tracked: &mut Tracked<Recorder>) -> bool {
            std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *tracked).poll_flush(cx).is_ready())).await
        }
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let group = Group::new();
        let mut watches: Vec<_> =
            (0..2).map(|_| store.watch_grouped("agents", 0, Some(group.clone())).unwrap()).collect();
        let activity = Arc::new(Activity::new(Instant::now()));
        let _open: Vec<InFlight> = (0..2).map(|_| InFlight::start(activity.clone())).collect();
        let recorder = Recorder::default();
        let mut tracked = Tracked::new(recorder.clone(), activity.clone(), Protocol::Http2, group.clone());

        store.commit(agent("a"), false).await.unwrap();
        // Both watches hold the event (handed over before the commit returned).
        for watch in &mut watches {
            let taken = std::future::poll_fn(|cx| Poll::Ready(watch.poll_next_unpin(cx))).await;
            assert!(matches!(taken, Poll::Ready(Some(Ok(_)))), "{taken:?}");
        }
        // A task ready on this worker from here on (nothing below awaits until it is
        // checked).
        let ran = Arc::new(AtomicBool::new(false));
        let ready = tokio::spawn({
            let ran = ran.clone();
            async move { ran.store(true, Ordering::SeqCst) }
        });
        // The first watch's line: the flush is held, the second still owes its line.
        tracked.write_all(&[7; 1536]).await.unwrap();
        watches[0].sent();
        assert!(!poll_flush(&mut tracked).await, "flushed while a watch still owed its line");
        // The second's: the group settles and the flush goes out, the ready task not run.
        tracked.write_all(&[7; 1536]).await.unwrap();
        watches[1].sent();
        assert!(poll_flush(&mut tracked).await, "held after every watch sent its line");
        assert!(!ran.load(Ordering::SeqCst), "the write waited for the worker's ready task");
        assert_eq!(recorder.writes(), [2 * 1536]);
        ready.await.unwrap();

        // Settled before the next flush was asked for: it goes out at once; the one after,
        // with nothing settled, is held until the worker has nothing else ready.
        store.commit(agent("b"), false).await.unwrap();
        for watch in &mut watches {
            watch.next().await.unwrap().unwrap();
            watch.sent();
        }
        tracked.write_all(&[7; 100]).await.unwrap();
        assert!(poll_flush(&mut tracked).await, "held after the group settled");
        tracked.write_all(&[7; 100]).await.unwrap();
        assert!(!poll_flush(&mut tracked).await, "a flush with no watch's line in it went out at once");
        tracked.flush().await.unwrap();
        assert_eq!(recorder.writes(), [2 * 1536, 100, 100]);

        // A watch that takes an event and never says it sent it (its stream out of
        // window) holds the flush for HOLD_AT_MOST, not for good, and not only until the
        // worker's ready tasks have run.
        store.commit(agent("c"), false).await.unwrap();
        watches[0].next().await.unwrap().unwrap();
        watches[0].sent();
        watches[1].next().await.unwrap().unwrap();
        assert!(group.owes_lines());
        tracked.write_all(&[7; 300]).await.unwrap();
        let held = tokio::time::Instant::now();
        assert!(!poll_flush(&mut tracked).await, "a flush went out while a watch owed its line");
        let ready = tokio::spawn(async {});
        tracked.flush().await.unwrap();
        assert!(held.elapsed() >= HOLD_AT_MOST, "released after {:?}", held.elapsed());
        assert!(ready.is_finished());
        assert_eq!(recorder.writes(), [2 * 1536, 100, 100, 300]);
    }

    /// A byte stream that records the length of each write it takes.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<usize>>>);

    impl Recorder {
        fn writes(&self) -> Vec<usize> {
            self.0.lock().unwrap().clone()
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            self.0.lock().unwrap().push(buf.len());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A byte stream that takes everything and writes vectors.
    struct VectoredSink;

    impl AsyncWrite for VectoredSink {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(buf.len()))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }
}
