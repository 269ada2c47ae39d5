//! [`Error`]: why a request to the [`JobService`](super::JobService) failed, in the
//! API's vocabulary without HTTP; and how the engine's, the scheduler's, the submit
//! layer's and the intake's errors become it.

use hive_api::validation::ValidationError;

use super::engine::SubmitError;
use super::intake;
use crate::client;
use crate::store;

/// Why a request to the [`JobService`](super::JobService) failed. Every variant is one answer of the API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Job (or its body) is invalid: each field path and why (a 422).
    #[error("job {name:?} is invalid")]
    Invalid {
        /// The Job's name, empty when it has none yet.
        name: String,
        /// What is wrong, by field path.
        errors: Vec<ValidationError>,
    },
    /// The body failed admission: a wrong kind, unknown or duplicated fields under
    /// strict field validation, a spec that does not validate.
    #[error(transparent)]
    Admit(#[from] hive_api::AdmitError),
    /// The request cannot be taken as asked; the message names what to change (a 400).
    #[error("{0}")]
    BadRequest(String),
    /// An object the request names does not exist (a 404).
    #[error("{plural}.hive.dev {name:?} not found")]
    NotFound {
        /// Its kind's plural: `jobs`, `agents`.
        plural: &'static str,
        /// Its name.
        name: String,
    },
    /// A Job of this name exists (a 409).
    #[error("jobs.hive.dev {name:?} already exists")]
    AlreadyExists {
        /// The Job's name.
        name: String,
    },
    /// The Job is in a state that refuses the request, e.g. a cancel of a started Job
    /// (a 409).
    #[error("{message}")]
    Conflict {
        /// The Job's name.
        name: String,
        /// Why, for the client.
        message: String,
    },
    /// A config repository could not be compared; the message names the agent and its
    /// repository, never a path of the daemon's (the log has the error itself).
    #[error("{0}")]
    Compare(String),
    /// The store refused or failed a write.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// A read or write through the typed client failed.
    #[error(transparent)]
    Client(#[from] client::Error),
    /// Anything else: logged by the server, never sent.
    #[error(transparent)]
    Internal(anyhow::Error),
}

/// The result of a [`JobService`](super::JobService) call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn invalid(field: &str, message: impl Into<String>) -> Error {
    Error::Invalid {
        name: String::new(),
        errors: vec![ValidationError::new(field, hive_api::validation::Reason::Invalid, message)],
    }
}

impl From<crate::scheduler::Error> for Error {
    fn from(err: crate::scheduler::Error) -> Error {
        use crate::scheduler::Error as E;
        match err {
            E::Invalid { name, errors } => Error::Invalid { name, errors },
            E::AlreadyExists { name } => Error::AlreadyExists { name },
            E::NotFound { name } => Error::NotFound { plural: "jobs", name },
            E::NodeNotFound { job, node } => {
                Error::BadRequest(format!("node: job {job:?} has no node {node:?}"))
            }
            E::NotCancellable { name, phase } => Error::Conflict {
                message: format!(
                    "job {name:?} is {phase:?}: only a Job none of whose nodes has started can be cancelled"
                ),
                name,
            },
            other => Error::Internal(anyhow::Error::new(other)),
        }
    }
}

impl From<SubmitError> for Error {
    fn from(err: SubmitError) -> Error {
        use crate::submit::Error as E;
        match err {
            SubmitError::Submit(E::UnknownAgent(name)) => Error::NotFound { plural: "agents", name },
            SubmitError::Submit(E::NoAgents) => invalid("spec.agents", "name at least one agent"),
            SubmitError::Submit(E::NotAgentTemplate(t)) => {
                invalid("spec.template", format!("{t:?} is not built from agents; give spec.nodes instead"))
            }
            SubmitError::Submit(E::Store(err)) => err.into(),
            SubmitError::Submit(E::Client(err)) => err.into(),
            SubmitError::Submit(other) => Error::Internal(anyhow::Error::new(other)),
            SubmitError::Scheduler(err) => err.into(),
            SubmitError::Intake(err) => err.into(),
        }
    }
}

impl From<intake::Error> for Error {
    fn from(err: intake::Error) -> Error {
        match err {
            intake::Error::Gone(name) => Error::NotFound { plural: "jobs", name },
            intake::Error::Client(err) => err.into(),
            intake::Error::Store(err) => err.into(),
            intake::Error::Scheduler(err) => err.into(),
            other => Error::Internal(anyhow::Error::new(other)),
        }
    }
}
