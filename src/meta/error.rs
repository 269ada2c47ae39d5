//! The meta repo's errors: each names the file or the git command (with its stderr)
//! that failed.

use std::path::PathBuf;

/// Why a meta repo operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory of the meta repo could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done (`reading`, `writing`, …).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The `git` binary could not be started.
    #[error("cannot run `{command}` in {dir}: {source}")]
    Spawn {
        /// The git command line.
        command: String,
        /// The directory it ran in.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A git command exited unsuccessfully.
    #[error("`{command}` failed in {dir}: {stderr}")]
    Git {
        /// The git command line.
        command: String,
        /// The directory it ran in.
        dir: PathBuf,
        /// What git wrote to stderr.
        stderr: String,
    },
    /// A file of an existing meta repo is not what hive writes (the repo is broken).
    #[error("corrupt meta repo file {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// git printed something this module cannot read.
    #[error("unexpected output from `{command}`: {reason}")]
    Output {
        /// The git command line.
        command: String,
        /// What could not be read.
        reason: String,
    },
    /// An agent name that is not a DNS-1123 label (and so could escape `agents/`).
    #[error("invalid agent name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A rev that cannot be written into the lock (empty, or with whitespace).
    #[error("invalid rev {rev:?} for input {input}")]
    InvalidRev {
        /// The input it was meant for.
        input: String,
        /// The rev as given.
        rev: String,
    },
    /// An input URL the meta flake cannot express.
    #[error("unsupported input url {url:?}: expected a path, a git URL or github:<owner>/<repo>")]
    UnsupportedUrl {
        /// The URL as given.
        url: String,
    },
    /// `sync_agents` was given the same agent twice.
    #[error("agent {name} is listed twice")]
    DuplicateAgent {
        /// The agent.
        name: String,
    },
    /// An agent without an input in the lock.
    #[error("agent {name} has no input in the meta flake")]
    UnknownAgent {
        /// The agent.
        name: String,
    },
    /// A lock update names an input the lock does not hold.
    #[error("the meta flake has no input {name}")]
    UnknownInput {
        /// The input name (`hive` or an agent name).
        name: String,
    },
    /// A new agent, or an agent whose URL changed, was given no rev to lock.
    #[error("agent {name} has no locked rev for url {url}: a rev is needed")]
    Unlocked {
        /// The agent.
        name: String,
        /// Its URL.
        url: String,
    },
    /// The gate passed in belongs to another `Meta`.
    #[error("the deploy-window gate belongs to another meta repo")]
    ForeignGate,
    /// A deploy is prepared and not yet finalized or aborted; the lock cannot change.
    #[error("a deploy of agent {agent} is prepared in the meta repo; finalize or abort it first")]
    DeployPending {
        /// The agent being deployed.
        agent: String,
    },
    /// The prepared deploy is not the one this `Meta` has pending.
    #[error("the prepared deploy of agent {agent} is not pending in this meta repo")]
    ForeignDeploy {
        /// The agent it was prepared for.
        agent: String,
    },
    /// A file the operation would write has changes nobody committed.
    #[error("{path} has uncommitted changes")]
    Dirty {
        /// The file.
        path: PathBuf,
    },
    /// The meta repo's journal (its history beyond this host, on etcd) could not be read
    /// or applied, or refused or failed a record (the commit it did not record was
    /// undone).
    #[error("the meta repo's journal: {reason}")]
    Journal {
        /// What went wrong, with the journal's own words.
        reason: String,
    },
    /// The task running the operation panicked or was cancelled by the runtime.
    #[error("meta repo operation did not finish: {reason}")]
    Interrupted {
        /// The join error.
        reason: String,
    },
}

/// This module's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
