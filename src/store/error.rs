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
    /// Appending to the write-ahead log failed (an I/O error, not a full disk): nothing of
    /// the batch was applied. The log starts over before the next write.
    #[error("cannot write the state database's write-ahead log {}", path.display())]
    Log {
        /// The log file.
        path: PathBuf,
        /// The underlying error, shared by every writer of the batch.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The file system holding the database is full (or over quota): nothing was
    /// written. The store recovers by itself once space is freed (HTTP 507).
    /// The message names no path: clients see it, the log has the file.
    #[error("the disk holding the state database is full: nothing was written; free space there and retry")]
    DiskFull {
        /// The database file.
        path: PathBuf,
    },
    /// An earlier transaction failed and the database could not be reopened yet: nothing
    /// was written (HTTP 503, retry).
    #[error("the state database cannot take writes right now: {message}")]
    Unavailable {
        /// Why, for the operator.
        message: String,
    },
    /// The write is larger than the store takes in one transaction (etcd's limits on
    /// operations and bytes a transaction); nothing was written.
    #[error("{message}")]
    TooLarge {
        /// What was too large, and the limit.
        message: String,
    },
    /// A leader-only write from a replica whose leadership has ended (on etcd): nothing
    /// was written; the replica stops its leader work.
    #[error("{message}")]
    NotLeader {
        /// Which leadership ended.
        message: String,
    },
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

    /// What a failed commit tells its writers: `DiskFull` when the file system is out of
    /// space or quota, else the redb error itself.
    pub(super) fn from_commit(path: &std::path::Path, e: Arc<redb::Error>) -> Error {
        if is_disk_full(&e) {
            Error::DiskFull { path: path.to_owned() }
        } else {
            Error::Db(e)
        }
    }

    /// What a failed log append tells its writers: `DiskFull` when the file system is out
    /// of space or quota, else the I/O error.
    pub(super) fn from_log(path: PathBuf, e: std::io::Error) -> Error {
        if is_full(&e) {
            Error::DiskFull { path }
        } else {
            Error::Log { path, source: Arc::new(e) }
        }
    }

    /// The same error for another writer of a failed batch.
    pub(super) fn again(&self) -> Error {
        match self {
            Error::Db(e) => Error::Db(e.clone()),
            Error::DiskFull { path } => Error::DiskFull { path: path.clone() },
            Error::Log { path, source } => Error::Log { path: path.clone(), source: source.clone() },
            other => Error::Unavailable { message: other.to_string() },
        }
    }

    /// The error's sources, for the log.
    pub(super) fn cause(&self) -> String {
        let mut text = String::new();
        let mut source = std::error::Error::source(self);
        while let Some(e) = source {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&e.to_string());
            source = e.source();
        }
        text
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

/// True when `e` is the file system saying it is out of space (ENOSPC) or quota (EDQUOT).
pub(super) fn is_disk_full(e: &redb::Error) -> bool {
    let redb::Error::Io(io) = e else { return false };
    is_full(io)
}

/// True when the file system said it is out of space or quota.
fn is_full(io: &std::io::Error) -> bool {
    let full = [rustix::io::Errno::NOSPC.raw_os_error(), rustix::io::Errno::DQUOT.raw_os_error()];
    io.kind() == std::io::ErrorKind::StorageFull || io.raw_os_error().is_some_and(|code| full.contains(&code))
}
