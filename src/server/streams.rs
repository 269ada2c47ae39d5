//! What a request may hold while it is answered, and for how long.
//!
//! **Caps.** Every request of a principal other than an admin counts against two caps of
//! its own and two shared ones, as kube-apiserver's max-requests-inflight does: the
//! long-running ones (watches, logs, telemetry — they hold a file or a store buffer
//! for as long as the client keeps them) and the others while they are answered (a list
//! streamed to a slow client included). Past a cap the answer is 429 `TooManyRequests`
//! with `Retry-After`. Admins are counted in the shared totals but refused only past them
//! plus a reserve, so that a viewer filling the shared caps never locks an operator out;
//! `/readyz`, `/healthz` and `/version` are outside every cap.
//!
//! **Streams.** Every answer whose body is a stream (a watch, a log, telemetry, a large
//! list) ends when
//! - the credential that opened it stops being valid: a revoked token or a dead
//!   dashboard session is checked every [`LIVENESS_CHECK`], not only when the client
//!   reconnects;
//! - its client takes nothing for the write timeout (`--watch-write-timeout`): it is
//!   not reading, and what the stream buffered is freed.
//!
//! Both are watched by a task beside the body, not by the body itself: hyper polls no body
//! whose writes are blocked (a full socket, or an HTTP/2 stream out of flow-control window,
//! which is what a client that reads nothing makes), so a body that only checked when
//! polled would never end. The stream is ended from outside hyper ([`EndStream`]).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use axum::body::{Body, Bytes, HttpBody as _};
use axum::http::{Method, Uri};
use axum::response::Response;
use futures_util::Stream;
use prometheus_client::metrics::counter::Counter;

use super::serve::EndStream;
use crate::auth::{Principal, Role};

/// How often an open stream checks that its credential is still valid; it ends within
/// this long after the token is revoked (or the session ends).
pub const LIVENESS_CHECK: Duration = Duration::from_secs(15);

/// What a request is, for the caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// A watch, a log (followed or not: kube counts every log read), telemetry.
    LongRunning,
    /// Everything else, while it is answered.
    Other,
}

impl Class {
    /// The class of a request: watches (`watch=true|1`), the `log` and `telemetry`
    /// subresources are long-running.
    pub fn of(method: &Method, uri: &Uri) -> Class {
        if method != Method::GET {
            return Class::Other;
        }
        let path = uri.path();
        let watch = uri.query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        if watch || path.ends_with("/log") || path.ends_with("/telemetry") {
            Class::LongRunning
        } else {
            Class::Other
        }
    }

    fn index(self) -> usize {
        match self {
            Class::LongRunning => 0,
            Class::Other => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Class::LongRunning => "long-running",
            Class::Other => "in-flight",
        }
    }
}

/// The caps, from `hive serve`'s flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Long-running requests open at once, everyone's together (`--max-long-running`).
    pub long_running: usize,
    /// … of one principal (`--max-long-running-per-client`).
    pub long_running_per_client: usize,
    /// Other requests being answered at once, everyone's together (`--max-requests-inflight`).
    pub inflight: usize,
    /// … of one principal (`--max-requests-inflight-per-client`).
    pub inflight_per_client: usize,
}

impl Limits {
    /// The defaults for a soft open-file limit (`None`: unlimited). A long-running
    /// request may hold a descriptor (a log file) besides its connection's, so all of
    /// them together stay within a quarter of the limit (at most 2,000); one principal
    /// may hold 100 of each kind; 400 others in flight, as kube-apiserver's
    /// `--max-requests-inflight`.
    pub fn default_for(open_files: Option<u64>) -> Limits {
        let quarter = open_files.map_or(2_000, |n| (n / 4).clamp(16, 2_000)) as usize;
        Limits {
            long_running: quarter,
            long_running_per_client: 100.min(quarter),
            inflight: 400,
            inflight_per_client: 100,
        }
    }

    fn total(&self, class: Class) -> usize {
        match class {
            Class::LongRunning => self.long_running,
            Class::Other => self.inflight,
        }
    }

    fn per_client(&self, class: Class) -> usize {
        match class {
            Class::LongRunning => self.long_running_per_client,
            Class::Other => self.inflight_per_client,
        }
    }

    /// What admins may hold beyond the shared total: an eighth of it, at least 8.
    fn admin_reserve(&self, class: Class) -> usize {
        (self.total(class) / 8).max(8)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::default_for(None)
    }
}

/// The counters of refusals and of streams ended, taken once.
#[derive(Clone)]
pub struct Counts {
    refused: [[Counter; 2]; 2],
    not_reading: Counter,
    revoked: Counter,
}

impl Counts {
    /// The counters in `metrics` (`hive_limit_refusals_total{limit}`,
    /// `hive_streams_ended_total{reason}`).
    pub fn of(metrics: &crate::metrics::ApiMetrics) -> Counts {
        let refused = |limit: &'static str| metrics.refused(limit);
        Counts {
            refused: [
                [refused("long_running_total"), refused("long_running_per_client")],
                [refused("inflight_total"), refused("inflight_per_client")],
            ],
            not_reading: metrics.stream_ended("not_reading"),
            revoked: metrics.stream_ended("credential_ended"),
        }
    }
}

/// The requests held now, against [`Limits`].
pub struct Held {
    limits: Limits,
    counts: Counts,
    inner: Mutex<Tally>,
}

#[derive(Default)]
struct Tally {
    total: [usize; 2],
    by_principal: HashMap<Arc<str>, [usize; 2]>,
}

impl Held {
    /// Nothing held yet.
    pub fn new(limits: Limits, counts: Counts) -> Arc<Held> {
        Arc::new(Held { limits, counts, inner: Mutex::new(Tally::default()) })
    }

    /// The caps this counts against.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The counters of refusals and ended streams.
    pub fn counts(&self) -> Counts {
        self.counts.clone()
    }

    /// A place for one request of `class` by `principal`, or why not: the message of
    /// the 429 (`ApiError::TooManyRequests`), naming the cap it would pass.
    pub fn admit(self: &Arc<Held>, principal: &Principal, class: Class) -> Result<Permit, String> {
        let i = class.index();
        let admin = principal.role == Role::Admin;
        let mut tally = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let total = self.limits.total(class);
        let ceiling = if admin { total + self.limits.admin_reserve(class) } else { total };
        if tally.total[i] >= ceiling {
            self.counts.refused[i][0].inc();
            return Err(format!(
                "too many {} requests: the server holds {} (--max-{}), try again later",
                class.name(),
                tally.total[i],
                flag(class)
            ));
        }
        if !admin {
            let mine = tally.by_principal.get(&principal.name).map_or(0, |held| held[i]);
            let cap = self.limits.per_client(class);
            if mine >= cap {
                self.counts.refused[i][1].inc();
                return Err(format!(
                    "too many {} requests: {:?} holds {mine}, the most one client may \
                     (--max-{}-per-client); close some, or try again later",
                    class.name(),
                    &*principal.name,
                    flag(class)
                ));
            }
            tally.by_principal.entry(principal.name.clone()).or_default()[i] += 1;
        }
        tally.total[i] += 1;
        Ok(Permit { held: self.clone(), principal: (!admin).then(|| principal.name.clone()), class })
    }

    /// What is held now: `(long-running, others)` in all.
    pub fn now(&self) -> (usize, usize) {
        let tally = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        (tally.total[0], tally.total[1])
    }
}

fn flag(class: Class) -> &'static str {
    match class {
        Class::LongRunning => "long-running",
        Class::Other => "requests-inflight",
    }
}

/// One place under the caps, given back when dropped.
pub struct Permit {
    held: Arc<Held>,
    principal: Option<Arc<str>>,
    class: Class,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let i = self.class.index();
        let mut tally = self.held.inner.lock().unwrap_or_else(PoisonError::into_inner);
        tally.total[i] = tally.total[i].saturating_sub(1);
        if let Some(name) = &self.principal {
            if let Some(held) = tally.by_principal.get_mut(name) {
                held[i] = held[i].saturating_sub(1);
                if *held == [0, 0] {
                    tally.by_principal.remove(name);
                }
            }
        }
    }
}

/// Whether `response` has a body of known size, i.e. is not a stream.
pub fn is_sized(response: &Response) -> bool {
    response.body().size_hint().exact().is_some()
}

/// How one stream is kept: its credential's check, its write timeout, the permit it
/// holds and the way to end it.
pub struct Keep {
    /// Whether the credential that opened the stream is still valid.
    pub live: Box<dyn Fn() -> bool + Send + Sync>,
    /// How long the client may take nothing before the stream is ended.
    pub write_timeout: Duration,
    /// The place the request holds under the caps, until the body ends.
    pub permit: Option<Permit>,
    /// The counters of ended streams.
    pub counts: Option<Counts>,
}

/// `response` with its body kept as [`Keep`] says (see the module's note). A body of
/// known size (any non-streaming answer) is returned as it is, keeping its
/// `Content-Length`.
pub fn keep(response: Response, keep: Keep) -> Response {
    if is_sized(&response) {
        return response;
    }
    let shared = Arc::new(Watched {
        started: Instant::now(),
        waiting_since: AtomicU64::new(0),
        ended: AtomicBool::new(false),
    });
    let (gone_tx, gone_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(watch_stream(
        shared.clone(),
        keep.live,
        keep.write_timeout,
        keep.counts,
        EndStream::current(),
        gone_rx,
    ));
    let (parts, body) = response.into_parts();
    let body = Kept { body: Box::pin(body.into_data_stream()), shared, _permit: keep.permit, _gone: gone_tx };
    Response::from_parts(parts, Body::from_stream(body))
}

/// What a kept body and its watcher share.
struct Watched {
    started: Instant,
    /// When the body last gave hyper a chunk that hyper has not come back for, as
    /// milliseconds after `started` plus one; 0 while hyper waits on the body.
    waiting_since: AtomicU64,
    /// The watcher ended the stream: the body ends at its next poll.
    ended: AtomicBool,
}

impl Watched {
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64 + 1
    }
}

/// The watcher of one kept stream: ends it when its credential dies or its client
/// stops reading, and stops when the body is dropped.
async fn watch_stream(
    shared: Arc<Watched>,
    live: Box<dyn Fn() -> bool + Send + Sync>,
    write_timeout: Duration,
    counts: Option<Counts>,
    end: Option<EndStream>,
    mut gone: tokio::sync::oneshot::Receiver<()>,
) {
    let tick = (write_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut check = tokio::time::interval(tick);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    check.tick().await; // the first tick is immediate; the request was just allowed
    let mut last_liveness = Instant::now();
    let timeout_ms = write_timeout.as_millis() as u64;
    loop {
        tokio::select! {
            _ = &mut gone => return,
            _ = check.tick() => {}
        }
        let waiting = shared.waiting_since.load(Ordering::Acquire);
        let stalled = waiting != 0 && shared.now().saturating_sub(waiting) >= timeout_ms;
        let dead = last_liveness.elapsed() >= LIVENESS_CHECK && {
            last_liveness = Instant::now();
            !live()
        };
        if stalled || dead {
            if let Some(counts) = &counts {
                if stalled { &counts.not_reading } else { &counts.revoked }.inc();
            }
            shared.ended.store(true, Ordering::Release);
            if let Some(end) = &end {
                end.end();
            }
            return;
        }
    }
}

/// A kept body: the response's own, noting when it waits on hyper.
struct Kept {
    body: Pin<Box<dyn Stream<Item = Result<Bytes, axum::Error>> + Send>>,
    shared: Arc<Watched>,
    _permit: Option<Permit>,
    /// Dropped with the body: tells the watcher to stop.
    _gone: tokio::sync::oneshot::Sender<()>,
}

impl Stream for Kept {
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // hyper is back for more: whatever it was given, it took.
        self.shared.waiting_since.store(0, Ordering::Release);
        if self.shared.ended.load(Ordering::Acquire) {
            return Poll::Ready(None);
        }
        let next = self.body.as_mut().poll_next(cx);
        if let Poll::Ready(Some(Ok(_))) = &next {
            let now = self.shared.now();
            self.shared.waiting_since.store(now, Ordering::Release);
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str, role: Role) -> Principal {
        Principal { name: Arc::from(name), role, agent: None }
    }

    fn held(limits: Limits) -> Arc<Held> {
        Held::new(limits, Counts::of(&crate::metrics::ApiMetrics::default()))
    }

    #[test]
    fn requests_are_classed_as_kube_does() {
        let class = |method: Method, uri: &str| Class::of(&method, &uri.parse().unwrap());
        assert_eq!(class(Method::GET, "/apis/hive.dev/v1/agents?watch=true"), Class::LongRunning);
        assert_eq!(class(Method::GET, "/api/v1/events?labelSelector=a&watch=1"), Class::LongRunning);
        assert_eq!(class(Method::GET, "/apis/hive.dev/v1/agents/a/log"), Class::LongRunning);
        assert_eq!(class(Method::GET, "/apis/hive.dev/v1/jobs/j/log?node=a/b"), Class::LongRunning);
        assert_eq!(class(Method::GET, "/hive/v1/fleet/nodes/n/telemetry"), Class::LongRunning);
        assert_eq!(class(Method::GET, "/apis/hive.dev/v1/agents?watch=false"), Class::Other);
        assert_eq!(class(Method::GET, "/apis/hive.dev/v1/agents/log"), Class::LongRunning);
        assert_eq!(class(Method::POST, "/apis/hive.dev/v1/agents?watch=true"), Class::Other);
    }

    #[test]
    fn a_principal_is_capped_alone_and_everyone_together_and_admins_have_a_reserve() {
        let limits =
            Limits { long_running: 20, long_running_per_client: 3, inflight: 5, inflight_per_client: 5 };
        let held = held(limits);
        let viewer = principal("v", Role::Viewer);
        let mine: Vec<Permit> = (0..3).map(|_| held.admit(&viewer, Class::LongRunning).unwrap()).collect();
        let refused = held.admit(&viewer, Class::LongRunning).err().expect("past the per-client cap");
        assert!(refused.contains("--max-long-running-per-client"), "{refused}");
        // The other class is counted apart.
        let other = held.admit(&viewer, Class::Other).unwrap();
        drop(other);
        drop(mine);
        assert!(held.admit(&viewer, Class::LongRunning).is_ok(), "a dropped permit gives its place back");
        assert_eq!(held.now(), (0, 0));

        // Others fill the shared total; an admin still gets its reserve, then is refused.
        let others: Vec<Permit> = (0..20)
            .map(|i| held.admit(&principal(&format!("v{i}"), Role::Viewer), Class::LongRunning).unwrap())
            .collect();
        let late = held.admit(&principal("late", Role::Viewer), Class::LongRunning).err().unwrap();
        assert!(late.contains("--max-long-running)"), "{late}");
        let admin = principal("root", Role::Admin);
        let reserve: Vec<Permit> = (0..8).map(|_| held.admit(&admin, Class::LongRunning).unwrap()).collect();
        assert!(held.admit(&admin, Class::LongRunning).is_err(), "the reserve is bounded too");
        drop((others, reserve));
        assert_eq!(held.now(), (0, 0));
    }

    #[test]
    fn default_caps_follow_the_open_file_limit() {
        assert_eq!(Limits::default_for(Some(1024)).long_running, 256);
        assert_eq!(Limits::default_for(Some(1024)).long_running_per_client, 100);
        assert_eq!(Limits::default_for(Some(64)).long_running_per_client, 16);
        assert_eq!(Limits::default_for(None).long_running, 2_000);
    }

    /// A body hyper stops polling after one chunk (its client reads nothing) is ended by
    /// the watcher after the write timeout, and the ending is counted.
    #[tokio::test(start_paused = true)]
    async fn a_stream_whose_client_takes_nothing_is_ended_after_the_write_timeout() {
        use futures_util::StreamExt as _;
        let metrics = crate::metrics::ApiMetrics::default();
        let counts = Counts::of(&metrics);
        let end = EndStream::default();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        let response = Response::new(Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)));
        let kept = end
            .clone()
            .scope(async {
                keep(
                    response,
                    Keep {
                        live: Box::new(|| true),
                        write_timeout: Duration::from_secs(2),
                        permit: None,
                        counts: Some(counts.clone()),
                    },
                )
            })
            .await;
        let mut body = kept.into_body().into_data_stream();
        tx.send(Ok(Bytes::from_static(b"one\n"))).await.unwrap();
        assert_eq!(body.next().await.unwrap().unwrap(), "one\n");
        // Nothing polls the body now: the client is not reading.
        tokio::time::timeout(Duration::from_secs(10), end.requested()).await.expect("ended");
        assert_eq!(counts.not_reading.get(), 1);
        assert!(body.next().await.is_none(), "the body ends at its next poll");
    }

    /// A body that waits for data (hyper polled it; nothing to send) is not stalled, and
    /// a revoked credential ends it even though nothing polls it.
    #[tokio::test(start_paused = true)]
    async fn an_idle_stream_lives_until_its_credential_dies() {
        use futures_util::StreamExt as _;
        let counts = Counts::of(&crate::metrics::ApiMetrics::default());
        let end = EndStream::default();
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        let response = Response::new(Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)));
        let alive = Arc::new(AtomicBool::new(true));
        let flag = alive.clone();
        let kept = end
            .clone()
            .scope(async {
                keep(
                    response,
                    Keep {
                        live: Box::new(move || flag.load(Ordering::SeqCst)),
                        write_timeout: Duration::from_secs(2),
                        permit: None,
                        counts: Some(counts.clone()),
                    },
                )
            })
            .await;
        let mut body = kept.into_body().into_data_stream();
        assert!(tokio::time::timeout(Duration::from_secs(60), body.next()).await.is_err(), "idle, not ended");
        alive.store(false, Ordering::SeqCst);
        tokio::time::timeout(LIVENESS_CHECK * 2, end.requested()).await.expect("ended on revocation");
        assert_eq!((counts.revoked.get(), counts.not_reading.get()), (1, 0));
    }
}
