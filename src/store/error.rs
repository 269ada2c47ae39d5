//! The store's error type: what a write, a watch or opening the database can fail with.

use std::path::PathBuf;
use std::sync::Arc;

/// A store result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a store operation failed. `kind` fields carry the plural resource name
/// (`agents`), as the caller passed it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object does not exist (update, status update or delete of a missing name).
    #[error("{kind}.hive.dev \"{name}\" not found")]
    NotFound {
        /// Plural resource name.
        kind: String,
        /// Object name.
        name: String,
    },
    /// A create named an object that already exists.
    #[error("{kind}.hive.dev \"{name}\" already exists")]
    AlreadyExists {
        /// Plural resource name.
        kind: String,
        /// Object name.
        name: String,
    },
    /// A precondition failed: the `resourceVersion` or `uid` the writer sent is not the
    /// object's current one. `message` is the full Kubernetes-style text
    /// (`Operation cannot be fulfilled on agents.hive.dev "a1": …`).
    #[error("{message}")]
    Conflict {
        /// Plural resource name.
        kind: String,
        /// Object name.
        name: String,
        /// Human-readable explanation, suitable for a `Status` message.
        message: String,
    },
    /// The object handed to the store is not a JSON object with a non-empty
    /// `metadata.name`. The server validates before it writes, so this is a bug there.
    #[error("invalid {kind} object: {message}")]
    Invalid {
        /// Plural resource name.
        kind: String,
        /// What is wrong.
        message: String,
    },
    /// A watch asked for events after `requested`, but retention has already dropped
    /// events up to `oldest`; the client must list again and watch from the list's
    /// revision (HTTP 410 Gone).
    #[error("too old resource version: {requested} ({oldest})")]
    Expired {
        /// The revision the watch was asked to start after.
        requested: u64,
        /// The oldest revision a watch can still start after.
        oldest: u64,
    },
    /// The watcher did not keep up: its buffer filled, so the store dropped it. The
    /// watch yields this once, after every event it did receive, and then ends.
    #[error("watch fell too far behind and was closed; list again and re-watch")]
    WatchOverflow,
    /// The database file cannot be opened, is not a hive store, has an unknown schema
    /// version or holds undecodable data. The store never starts empty over it.
    #[error(
        "state database {} is corrupt or unreadable (`hive serve --reset-state` discards it)",
        path.display()
    )]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What exactly failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Another process (or another `Store` in this one) holds the database open.
    #[error("state database {} is already in use by another process", path.display())]
    Locked {
        /// The database file.
        path: PathBuf,
    },
    /// A file-system operation on the database file failed (creating or resetting it).
    #[error("cannot access state database {}", path.display())]
    Io {
        /// The file the operation was on.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The commit thread could not be started.
    #[error("cannot start the store's commit thread")]
    Thread(#[source] std::io::Error),
    /// redb failed while writing or reading; for a failed commit every writer of the
    /// batch gets (a shared handle to) the same error and nothing was applied.
    #[error("state database error")]
    Db(#[source] Arc<redb::Error>),
    /// The store has been shut down (or its commit thread died); nothing was written.
    #[error("the store is shut down")]
    Closed,
}

impl Error {
    /// The Conflict every stale-`resourceVersion` write gets, worded as Kubernetes does.
    pub(super) fn conflict(kind: &str, name: &str, reason: &str) -> Error {
        Error::Conflict {
            kind: kind.to_owned(),
            name: name.to_owned(),
            message: format!("Operation cannot be fulfilled on {kind}.hive.dev \"{name}\": {reason}"),
        }
    }

    /// Wraps any redb error.
    pub(super) fn db(e: impl Into<redb::Error>) -> Error {
        Error::Db(Arc::new(e.into()))
    }

    /// Wraps why the file at `path` cannot be used as a store.
    pub(super) fn corrupt(
        path: impl Into<PathBuf>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Error {
        Error::Corrupt { path: path.into(), source: source.into() }
    }
}
