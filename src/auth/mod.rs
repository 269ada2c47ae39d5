//! Bearer tokens and roles: creation, hashed storage, and checks.
//!
//! A client proves who it is with a `hive_…` bearer token (kubectl sends it only over TLS,
//! which is why the server speaks HTTPS by default). The daemon keeps only SHA-256 hashes
//! of tokens in `<state-dir>/tokens.json`; the plaintext is shown once, when created.
//! Each token carries one [`Role`] (the one role type, from `hive_api::role`, shared with
//! the CLI); a request needs the role its route's [`Verb`] requires.
//!
//! Architecture Invariant: no token and no token hash is ever logged, returned by a read,
//! or printed by `Debug`. Log lines that might quote a credential go through [`redact`].

pub mod kubeconfig;
mod redact;
pub(crate) mod secret_file;
pub mod sessions;
mod tokens;

pub use hive_api::role::{ParseRoleError, Role, Verb};
pub use redact::{redact, SecretForms};
pub use tokens::{hex, token_sha256, Error, SharedTokens, Swapped, TokenInfo, TokenStore, TOKEN_PREFIX};

/// Who made a request: the name and role of the token it carried. Holds no secret.
/// Cheap to clone (shared strings): every request copies it into its extensions, its
/// extractors and its audit entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The token's name, as shown by `list` and recorded in audit fields such as who
    /// decided an approval.
    pub name: std::sync::Arc<str>,
    /// What the token may do.
    pub role: Role,
    /// The agent an `agent`-role token is bound to.
    pub agent: Option<std::sync::Arc<str>>,
}

impl Principal {
    /// Whether this principal's role permits `verb`.
    pub fn allows(&self, verb: Verb) -> bool {
        self.role.allows(verb)
    }
}
