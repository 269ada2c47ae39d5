//! The narrow read-side view of the API that the controller runtime needs: list a kind
//! and watch it from a revision. The daemon implements [`Client`] (in-process over the
//! store, or over HTTP); this crate does no IO of its own.

use std::future::Future;
use std::sync::Arc;

use futures_util::stream::BoxStream;
use hive_api::{Object, Status};

/// Every object of one kind, read at one store revision.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectList<K> {
    /// The objects.
    pub items: Vec<K>,
    /// The store revision the list was read at (`metadata.resourceVersion` of the list);
    /// watching from it yields every later change and nothing earlier.
    pub resource_version: String,
}

/// One change reported by a watch, typed.
#[derive(Debug)]
pub enum WatchEvent<K> {
    /// The object was created (`ADDED`).
    Added(K),
    /// The object was changed (`MODIFIED`).
    Modified(K),
    /// The object was removed (`DELETED`); this is its last state, carrying the revision
    /// of the deletion.
    Deleted(K),
    /// Nothing of this kind changed up to `resource_version` (`BOOKMARK`); a watch resumed
    /// from it misses nothing.
    Bookmark {
        /// The revision the watch has progressed to.
        resource_version: String,
    },
    /// The server reported an error in the stream (`ERROR` carrying a `Status`); the
    /// stream should be considered finished.
    Error(ClientError),
}

/// Why a list or watch failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The requested revision is older than the history the server keeps (HTTP 410,
    /// reason `Expired` or `Gone`). Resuming is impossible: the caller must list again.
    #[error("resource version expired: {0}")]
    Expired(String),
    /// The server answered with a failure `Status` other than 410.
    #[error("api error {} ({}): {}", .0.code, .0.reason, .0.message)]
    Api(Box<Status>),
    /// The server is shutting down (its store stopped taking requests): nothing more will
    /// come, and retrying is only waiting for the process to end.
    #[error("the server is shutting down: {0}")]
    ShuttingDown(String),
    /// The request did not complete: the connection failed or broke, or the answer could
    /// not be decoded.
    #[error("transport error: {message}")]
    Transport {
        /// What went wrong, for logs.
        message: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl ClientError {
    /// A transport error with a message and no underlying cause.
    pub fn transport(message: impl Into<String>) -> ClientError {
        ClientError::Transport { message: message.into(), source: None }
    }

    /// True for [`ClientError::Expired`]: the watch cannot resume and a relist is needed.
    pub fn is_expired(&self) -> bool {
        matches!(self, ClientError::Expired(_))
    }

    /// True for [`ClientError::ShuttingDown`]: routine at a daemon's stop, not worth a
    /// warning.
    pub fn is_shutting_down(&self) -> bool {
        matches!(self, ClientError::ShuttingDown(_))
    }
}

impl From<Status> for ClientError {
    /// Maps a failure `Status` (an error response, or the object of an in-stream `ERROR`
    /// event): code 410 becomes [`ClientError::Expired`], anything else
    /// [`ClientError::Api`].
    fn from(status: Status) -> ClientError {
        if status.code == 410 {
            ClientError::Expired(status.message)
        } else {
            ClientError::Api(Box::new(status))
        }
    }
}

/// Read access to one kind, as the controller runtime needs it.
///
/// Watch semantics are Kubernetes' "start at exact": `watch(rv)` yields every change with
/// a revision strictly after `rv`, in order, and fails with [`ClientError::Expired`] (or
/// reports it in the stream) when `rv` is older than the server's retained history.
pub trait Client<K: Object>: Send + Sync + 'static {
    /// Lists every object of the kind, with the revision the list was read at.
    fn list(&self) -> impl Future<Output = Result<ObjectList<K>, ClientError>> + Send;

    /// Opens a watch that yields every change after `resource_version`.
    fn watch(
        &self,
        resource_version: &str,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<WatchEvent<K>, ClientError>>, ClientError>> + Send;

    /// Whether the server behind the client is shutting down: a reconcile that fails
    /// then is the process ending, not news (logged quietly). False unless the client
    /// can tell.
    fn is_shutting_down(&self) -> bool {
        false
    }
}

impl<K: Object, C: Client<K>> Client<K> for Arc<C> {
    fn is_shutting_down(&self) -> bool {
        (**self).is_shutting_down()
    }

    fn list(&self) -> impl Future<Output = Result<ObjectList<K>, ClientError>> + Send {
        (**self).list()
    }

    fn watch(
        &self,
        resource_version: &str,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<WatchEvent<K>, ClientError>>, ClientError>> + Send
    {
        (**self).watch(resource_version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_410_is_expired_and_others_are_api_errors() {
        let gone = ClientError::from(Status::failure(410, "Expired", "too old resource version: 1 (9)"));
        assert!(gone.is_expired());
        assert_eq!(gone.to_string(), "resource version expired: too old resource version: 1 (9)");

        let other = ClientError::from(Status::failure(500, "InternalError", "boom"));
        assert!(!other.is_expired());
        assert_eq!(other.to_string(), "api error 500 (InternalError): boom");
    }
}
