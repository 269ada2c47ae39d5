//! Why fleet work failed: a command, one node's provisioning or kill, a recovery, a
//! provider check. The text of these errors is what a Node's or FleetCommand's
//! `status.error` records and the operator reads, so each says what happened and, where
//! there is one, what to do about it. A failure of one node is [`Error::Node`], which
//! names the node first (`node-3: …`), so a command's error joining several nodes'
//! failures still says which is which.

use std::fmt;
use std::time::Duration;

use hive_api::provider::ProviderState;

use super::providers::docker::DockerError;
use super::providers::vastai::VastError;
use crate::{client, store};

/// A fleet error; see the module docs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Something failed for one node.
    #[error("{node}: {source}")]
    Node {
        /// The node's name.
        node: String,
        /// What failed.
        #[source]
        source: Box<Error>,
    },
    /// Several nodes of one command failed; each is an [`Error::Node`].
    #[error("{}", join(.0))]
    Nodes(Vec<Error>),
    /// A command whose spec names neither a provision nor a kill.
    #[error("neither provision nor kill is set")]
    EmptyCommand,
    /// The node's record is gone.
    #[error("no such node")]
    NoSuchNode,
    /// A typed read or write of a Node, FleetCommand or Provider failed (one that does
    /// not decode, one validation refuses, a store failure).
    #[error(transparent)]
    Client(#[from] client::Error),
    /// A Kill named the node before its resource was created, so none was.
    #[error("killed before it was created")]
    KilledBeforeCreate,
    /// A Kill named the node while it waited for its worker to join.
    #[error("killed while waiting for its worker")]
    KilledWhileJoining,
    /// The node ended (killed, deleted, its worker gone) before its telemetry flowed.
    #[error("the node ended ({phase}) before its telemetry flowed")]
    EndedWhileFollowing {
        /// Its phase then, or `gone`.
        phase: String,
    },
    /// The Provider the node names was deleted before its resource was created.
    #[error("the provider {provider:?} no longer exists")]
    ProviderMissing {
        /// The Provider's name.
        provider: String,
    },
    /// The Provider object whose settings a create needs is gone.
    #[error("the Provider {provider:?} is gone")]
    ProviderGone {
        /// The Provider's name.
        provider: String,
    },
    /// The Provider of a node that has a resource is gone, so nothing can destroy it.
    #[error(
        "the Provider {provider:?} no longer exists, so its resource ({resource}) cannot be destroyed; \
         recreate the Provider and kill the node again"
    )]
    ProviderGoneWithResource {
        /// The Provider's name.
        provider: String,
        /// The resource left, e.g. a container id or `instance 42`.
        resource: String,
    },
    /// The provider controller has not checked the Provider yet.
    #[error("provider {provider:?} has not been checked yet")]
    NotChecked {
        /// The Provider's name.
        provider: String,
    },
    /// The Provider's last check did not find it Ready.
    #[error("provider {provider:?} is {}: {message}{}", state.as_str(), configure_hint(provider, *state))]
    NotReady {
        /// The Provider's name.
        provider: String,
        /// What its check found.
        state: ProviderState,
        /// Why it is not ready.
        message: String,
    },
    /// Settings or credentials given to ConfigureProvider failed their check; the
    /// message is the check's (never the key).
    #[error("{message}")]
    CheckFailed {
        /// Why the check failed.
        message: String,
    },
    /// The system's random generator failed while making a join token.
    #[error("the system random generator failed")]
    Random,
    /// The hash of a node's join token could not be recorded.
    #[error("recording the join token failed: {0}")]
    JoinToken(#[source] store::Error),
    /// A local worker process could not be started.
    #[error("starting the worker failed: {0}")]
    Spawn(#[source] std::io::Error),
    /// Neither the command nor the Provider names an image for the node.
    #[error("no image: neither the command nor Provider {provider:?} names one")]
    NoImage {
        /// The Provider's name.
        provider: String,
    },
    /// A Vast.ai node without the offer its Provision selected.
    #[error("no selected offer recorded for this node")]
    NoOffer,
    /// Containers cannot reach a daemon bound to loopback only.
    #[error(
        "the fleet endpoint listens on loopback only, where containers cannot reach it: start hive \
         serve with --fleet-listen 0.0.0.0:PORT"
    )]
    LoopbackOnly,
    /// The Docker network has no gateway address for containers to dial the daemon at.
    #[error("the Docker network {network:?} has no gateway for nodes to reach the daemon at")]
    NoGateway {
        /// The network's name.
        network: String,
    },
    /// The Docker Engine refused or failed a request.
    #[error(transparent)]
    Docker(#[from] DockerError),
    /// Vast.ai refused or failed a request.
    #[error(transparent)]
    Vast(#[from] VastError),
    /// The Provision stopped waiting before the worker's join was handed over.
    #[error("the join waiter was dropped")]
    JoinWaiterDropped,
    /// A local worker exited before it joined.
    #[error("the worker exited before it joined")]
    ExitedBeforeJoin,
    /// The worker did not join in time.
    #[error(
        "the worker did not join within {}s{}",
        .after.as_secs(),
        if *.left_running { "; its resource is left as it is: kill the node to remove it" } else { "" }
    )]
    JoinTimeout {
        /// How long the Provision waited.
        after: Duration,
        /// Whether the node's resource is left running (one that outlives the daemon).
        left_running: bool,
    },
    /// The worker joined, but its telemetry could not be pulled.
    #[error("the worker joined but serves no telemetry: {0}")]
    NoTelemetry(String),
    /// Destroying the node's resource failed; the node keeps its phase.
    #[error("destroying its resource failed: {0}")]
    Destroy(#[source] Box<Error>),
}

/// A fleet result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// `source` as a failure of `node`. An error that already names a node is kept as
    /// it is.
    pub fn node(node: &str, source: Error) -> Error {
        match source {
            named @ Error::Node { .. } => named,
            source => Error::Node { node: node.to_string(), source: Box::new(source) },
        }
    }
}

fn join(errors: &[Error]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// How to configure an Unconfigured provider.
fn configure_hint(provider: &str, state: ProviderState) -> impl fmt::Display + '_ {
    struct Hint<'a>(&'a str, ProviderState);
    impl fmt::Display for Hint<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self.1 {
                ProviderState::Unconfigured => {
                    write!(f, "; configure it: hive fleet configure {} --api-key-file FILE", self.0)
                }
                _ => Ok(()),
            }
        }
    }
    Hint(provider, state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_stay_as_they_were() {
        let cases: Vec<(Error, &str)> = vec![
            (Error::node("node-1", Error::KilledBeforeCreate), "node-1: killed before it was created"),
            (Error::node("node-1", Error::node("node-2", Error::NoSuchNode)), "node-2: no such node"),
            (
                Error::node(
                    "node-3",
                    Error::JoinTimeout { after: Duration::from_secs(30), left_running: false },
                ),
                "node-3: the worker did not join within 30s",
            ),
            (
                Error::JoinTimeout { after: Duration::from_secs(120), left_running: true },
                "the worker did not join within 120s; its resource is left as it is: kill the node to \
                 remove it",
            ),
            (
                Error::NotReady {
                    provider: "vastai".into(),
                    state: ProviderState::Unconfigured,
                    message: "no key".into(),
                },
                "provider \"vastai\" is Unconfigured: no key; configure it: hive fleet configure vastai \
                 --api-key-file FILE",
            ),
            (
                Error::NotReady {
                    provider: "docker".into(),
                    state: ProviderState::ConfigurationError,
                    message: "refused".into(),
                },
                "provider \"docker\" is ConfigurationError: refused",
            ),
            (
                Error::Nodes(vec![
                    Error::node("node-1", Error::ExitedBeforeJoin),
                    Error::node("node-2", Error::Destroy(Box::new(Error::NoOffer))),
                ]),
                "node-1: the worker exited before it joined; node-2: destroying its resource failed: no \
                 selected offer recorded for this node",
            ),
        ];
        for (error, want) in cases {
            assert_eq!(error.to_string(), want);
        }
    }
}
