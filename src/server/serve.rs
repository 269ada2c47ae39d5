//! The TLS listeners: accept TCP connections up to `--max-connections` (refusing the
//! rest promptly), back off while `accept` fails (out of file descriptors, typically),
//! complete the rustls handshake and serve each connection (`connection.rs`: hyper with
//! the axum router over HTTP/2 or HTTP/1.1 as ALPN chose, the header-read and idle
//! timeouts; `http2.rs`: the HTTP/2 limits), until shutdown.

mod backoff;
mod connection;
mod end_stream;
mod http2;
mod refusal;

pub use connection::{current_group, Timeouts, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT};
pub use end_stream::EndStream;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use backoff::{Backoff, LogThrottle};

/// How long a client may take to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// At most one line per this long about a failure that repeats (accept errors,
/// refusals); each line carries the count since the previous one.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The ceiling of the default `--max-connections`: each idle TLS connection holds tens
/// of KiB of buffers, so a huge open-file limit must not become a huge memory bound.
const DEFAULT_MAX_CONNECTIONS_CEILING: u64 = 10_000;

/// The descriptors the default `--max-connections` leaves to the rest of the daemon —
/// the store, agents' pipes and logs, git, the fleet's sockets — at least.
const MIN_HEADROOM: u64 = 128;

/// The limits of every listener of one daemon, from `hive serve`'s flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeConfig {
    /// The header-read and idle timeouts of each connection.
    pub timeouts: Timeouts,
    /// Open connections at most, over all listeners together.
    pub max_connections: usize,
}

impl ServeConfig {
    /// The default `--max-connections` for a soft open-file limit (`None`: unlimited):
    /// the limit less a headroom of a quarter of it (at least 128) for the rest of the
    /// daemon, but at least half of it, and at most 10,000.
    pub fn default_max_connections(open_files: Option<u64>) -> usize {
        let Some(limit) = open_files else {
            return DEFAULT_MAX_CONNECTIONS_CEILING as usize;
        };
        let headroom = (limit / 4).max(MIN_HEADROOM);
        let cap = limit.saturating_sub(headroom).max(limit / 2);
        usize::try_from(cap.clamp(1, DEFAULT_MAX_CONNECTIONS_CEILING)).unwrap_or(1)
    }
}

/// The open connections of a daemon's listeners (the API's and the dashboard's), under
/// one cap: they share the process's file descriptors.
#[derive(Clone)]
pub struct Connections {
    inner: Arc<Shared>,
}

struct Shared {
    config: ServeConfig,
    /// One permit per connection that may be open.
    open: Arc<Semaphore>,
    /// One permit per refused connection that may be answered with a 503 at once.
    answering: Arc<Semaphore>,
    /// Woken whenever a connection closes, so a listener backing off from a failed
    /// `accept` retries as soon as a descriptor is free.
    closed: Notify,
    refusals: Mutex<LogThrottle>,
}

impl Connections {
    /// Connections limited by `config`.
    pub fn new(config: ServeConfig) -> Connections {
        Connections {
            inner: Arc::new(Shared {
                config,
                open: Arc::new(Semaphore::new(config.max_connections)),
                answering: Arc::new(Semaphore::new(refusal::ANSWERED_AT_ONCE)),
                closed: Notify::new(),
                refusals: Mutex::new(LogThrottle::new(LOG_EVERY)),
            }),
        }
    }

    /// A place for one more connection, if the cap allows it.
    fn admit(&self) -> Option<Place> {
        let permit = self.inner.open.clone().try_acquire_owned().ok()?;
        Some(Place { permit: Some(permit), connections: self.clone() })
    }

    /// Counts and logs (rate-limited) one refused connection.
    fn refused(&self) {
        let due = self.inner.refusals.lock().unwrap_or_else(|e| e.into_inner()).occurred(Instant::now());
        if let Some(refused) = due {
            tracing::warn!(
                refused,
                max_connections = self.inner.config.max_connections,
                "connections refused: --max-connections are open (one line per 10 s at most, counting the refusals since the last)"
            );
        }
    }
}

/// One open connection's place under the cap; dropping it frees the place and wakes
/// listeners that wait for a descriptor.
struct Place {
    permit: Option<OwnedSemaphorePermit>,
    connections: Connections,
}

impl Drop for Place {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.connections.inner.closed.notify_waiters();
    }
}

/// A listener's failing `accept`s: the backoff (reset by a success) and the
/// rate-limited log. Under descriptor exhaustion successes and failures interleave (each
/// closing connection lets one more in), so both lines are rate-limited over the
/// listener's life, not per run of failures.
struct AcceptFailures {
    backoff: Backoff,
    failed_log: LogThrottle,
    recovered_log: LogThrottle,
    failing: bool,
}

impl Default for AcceptFailures {
    fn default() -> AcceptFailures {
        AcceptFailures {
            backoff: Backoff::default(),
            failed_log: LogThrottle::new(LOG_EVERY),
            recovered_log: LogThrottle::new(LOG_EVERY),
            failing: false,
        }
    }
}

impl AcceptFailures {
    /// One more failure: logs it (rate-limited) and says how long to wait.
    fn failed(&mut self, err: &std::io::Error, now: Instant) -> Duration {
        self.failing = true;
        let wait = self.backoff.failed();
        if let Some(failures) = self.failed_log.occurred(now) {
            tracing::warn!(
                error = %err,
                failures,
                retry_in_ms = wait.as_millis() as u64,
                "accept failed; backing off (one line per 10 s at most, counting the failures since the last)"
            );
        }
        wait
    }

    /// An `accept` succeeded: the next failure waits the shortest time again.
    fn succeeded(&mut self, now: Instant) {
        if !std::mem::take(&mut self.failing) {
            return;
        }
        self.backoff.reset();
        if self.recovered_log.occurred(now).is_some() {
            tracing::info!("accepting connections again (one line per 10 s at most)");
        }
    }
}

/// Serves `app` over TLS on `listener` until `shutdown` resolves, each connection
/// counted against `connections`. Open connections (watches, in particular) end with
/// the runtime.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    connections: Connections,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    // A refused connection is offered HTTP/1.1 only: its 503 is one response and a
    // close, which needs no HTTP/2 connection, and every client speaks HTTP/1.1.
    let refusing = TlsAcceptor::from(crate::server::tls::http1_only(&tls));
    let acceptor = TlsAcceptor::from(tls);
    let timeouts = connections.inner.config.timeouts;
    let mut failures = AcceptFailures::default();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut shutdown => return Ok(()),
        };
        let (tcp, peer) = match accepted {
            Ok(conn) => conn,
            Err(err) => {
                // Running out of file descriptors must not end the server, nor spin:
                // the failing connection stays in the backlog, so `accept` would fail
                // again at once. Wait, and retry sooner when one of ours closes.
                let wait = failures.failed(&err, Instant::now());
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = connections.inner.closed.notified() => {}
                    _ = &mut shutdown => return Ok(()),
                }
                continue;
            }
        };
        failures.succeeded(Instant::now());
        let Some(place) = connections.admit() else {
            connections.refused();
            refusal::refuse(tcp, refusing.clone(), &connections.inner.answering);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let _place = place;
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(err)) => {
                    tracing::debug!(%peer, error = %err, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let protocol = connection::Protocol::negotiated(stream.get_ref().1.alpn_protocol());
            connection::serve(stream, protocol, app, timeouts, peer).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_headroom_below_the_open_file_limit() {
        // (soft open-file limit, default --max-connections)
        let cases = [
            (Some(64), 32),
            (Some(256), 128),
            (Some(1024), 768),
            (Some(4096), 3072),
            (Some(20_000), 10_000),
            (Some(1 << 20), 10_000),
            (None, 10_000),
            (Some(1), 1),
            (Some(0), 1),
        ];
        for (limit, expected) in cases {
            assert_eq!(ServeConfig::default_max_connections(limit), expected, "limit {limit:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_closing_connection_frees_its_place() {
        let connections = Connections::new(ServeConfig { timeouts: Timeouts::default(), max_connections: 2 });
        let first = connections.admit().expect("first");
        let _second = connections.admit().expect("second");
        assert!(connections.admit().is_none(), "the cap holds");
        let woken = connections.inner.closed.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        drop(first);
        tokio::time::timeout(Duration::from_millis(1), woken).await.expect("a waiting listener is woken");
        assert!(connections.admit().is_some(), "the freed place is taken again");
    }
}
