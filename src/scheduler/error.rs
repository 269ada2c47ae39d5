//! What a scheduler request can fail with, and what an executor reports when a node fails.

use hive_api::job::{JobNodeKind, JobPhase};
use hive_api::validation::{summary, ValidationError};

/// A scheduler result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a scheduler request failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The submitted Job is not a valid DAG or has a bad name (dangling deps, cycles,
    /// missing agents …). Every problem is listed with its field path, as admission
    /// reports it (a 422 at the API).
    #[error("job {name:?} is invalid: {}", summary(.errors))]
    Invalid {
        /// The Job's name.
        name: String,
        /// Each invalid field.
        errors: Vec<ValidationError>,
    },
    /// A Job with this name is already queued, running or in history.
    #[error("job {name:?} already exists")]
    AlreadyExists {
        /// The Job's name.
        name: String,
    },
    /// No Job with this name is queued, running or kept in history.
    #[error("job {name:?} not found")]
    NotFound {
        /// The Job's name.
        name: String,
    },
    /// The Job exists but has no node with this id.
    #[error("job {job:?} has no node {node:?}")]
    NodeNotFound {
        /// The Job's name.
        job: String,
        /// The node id asked for.
        node: String,
    },
    /// Cancel applies only to a Job none of whose nodes has started: a running build
    /// cannot be interrupted.
    #[error("job {name:?} is {}; only a job whose nodes are all still queued can be cancelled", .phase.as_str())]
    NotCancellable {
        /// The Job's name.
        name: String,
        /// Its roll-up phase when the cancel arrived.
        phase: JobPhase,
    },
    /// The scheduler task has shut down; nothing more can be submitted or read.
    #[error("the scheduler has shut down")]
    Stopped,
}

/// Why a node failed, as its executor reports it. The message becomes the node's
/// `status.nodes[].error`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NodeError {
    /// The node ran and failed; the message says why.
    #[error("{0}")]
    Failed(String),
    /// The executor panicked while running the node.
    #[error("the {kind} executor panicked: {message}", kind = .0.as_str(), message = .1)]
    Panicked(JobNodeKind, String),
}

impl NodeError {
    /// A failure with the given message.
    pub fn failed(message: impl std::fmt::Display) -> NodeError {
        NodeError::Failed(message.to_string())
    }
}
