//! How a store is opened: file, retention, watch buffers, batch size, the write-ahead
//! log and checkpoints, and the clock it stamps objects and events with.

use std::path::PathBuf;
use std::time::Duration;

pub use crate::host::Clock;

/// Settings for [`Store::open`](super::Store::open).
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// The redb database file. Created (atomically) when absent.
    pub path: PathBuf,
    /// At most this many events are retained for watches (default 100 000).
    pub retention_events: usize,
    /// Events older than this are dropped at the next commit (default 1 h).
    pub retention_age: Duration,
    /// The retained events may hold about this much memory (their objects parsed and
    /// encoded); the oldest are dropped beyond it (default 256 MiB).
    pub retention_bytes: usize,
    /// Live events a watcher may have pending before it is dropped as too slow
    /// (default 1024).
    pub watch_buffer: usize,
    /// How much memory a watcher's pending live events may hold before it is dropped
    /// as too slow (default 16 MiB; one event is always let through).
    pub watch_buffer_bytes: usize,
    /// At most this many pending commit requests go into one batch: one record of the
    /// write-ahead log (default 256).
    pub max_batch: usize,
    /// Each of the write-ahead log's two files grows to at most this many bytes
    /// (default 16 MiB). A batch larger than that goes to redb directly.
    pub wal_bytes: u64,
    /// The checkpointer takes logged batches to redb once the oldest has waited this long
    /// (default 250 ms)...
    pub checkpoint_interval: Duration,
    /// ...or once they hold this many bytes (default 4 MiB).
    pub checkpoint_bytes: usize,
    /// Where `creationTimestamp`, `deletionTimestamp` and event ages come from.
    pub clock: Clock,
    /// Where the commit thread records each batch's latency and size.
    pub metrics: crate::metrics::StoreMetrics,
}

impl StoreConfig {
    /// The defaults, for the database at `path`.
    pub fn new(path: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig {
            path: path.into(),
            retention_events: 100_000,
            retention_age: Duration::from_secs(3600),
            retention_bytes: 256 << 20,
            watch_buffer: 1024,
            watch_buffer_bytes: 16 << 20,
            max_batch: 256,
            wal_bytes: 16 << 20,
            checkpoint_interval: Duration::from_millis(250),
            checkpoint_bytes: 4 << 20,
            clock: Clock::system(),
            metrics: crate::metrics::StoreMetrics::default(),
        }
    }
}
