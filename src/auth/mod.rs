//! Bearer tokens and roles: creation, hashed storage, and checks.
//!
//! A client proves who it is with a `hive_…` bearer token (kubectl sends it only over TLS,
//! which is why the server speaks HTTPS by default). The daemon keeps only SHA-256 hashes
//! of tokens in `<state-dir>/tokens.json`; the plaintext is shown once, when created.
//! Each token carries one [`Role`]; a request needs the role its [`Verb`] requires.
//!
//! Architecture Invariant: no token and no token hash is ever logged, returned by a read,
//! or printed by `Debug`. Log lines that might quote a credential go through [`redact`].

pub mod kubeconfig;
mod redact;
pub(crate) mod secret_file;
mod tokens;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use redact::redact;
pub use tokens::{Error, TokenInfo, TokenStore, TOKEN_PREFIX};

/// What a token may do. Roles are ordered: each one may do everything the ones below it may.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything (get, list, watch); changes nothing.
    Viewer,
    /// A token an agent runs with, bound to that one agent: reads everything and
    /// requests approvals for its own config changes (`ApplyCommit`, `MergeConfigPr`
    /// targeting itself). It decides nothing.
    Agent,
    /// Also changes what is wanted: spec writes, status, power, approvals, fleet commands.
    Operator,
    /// Also manages providers and tokens.
    Admin,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Agent, Role::Operator, Role::Admin];

    /// The lowercase name used in files, flags and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Agent => "agent",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is none of `viewer`, `operator`, `admin`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {input:?}: expected one of viewer, agent, operator, admin")]
pub struct ParseRoleError {
    input: String,
}

impl FromStr for Role {
    type Err = ParseRoleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == s)
            .ok_or_else(|| ParseRoleError { input: s.to_owned() })
    }
}

/// The kinds of request a role is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    /// get, list, watch.
    Read,
    /// Creating an approval (admission then checks an agent token asks only for itself).
    Request,
    /// Spec writes, status writes, power verbs, approvals, fleet commands.
    Write,
    /// Providers and tokens.
    Admin,
}

impl Verb {
    /// The lowest role that may perform this verb.
    pub fn required_role(self) -> Role {
        match self {
            Verb::Read => Role::Viewer,
            Verb::Request => Role::Agent,
            Verb::Write => Role::Operator,
            Verb::Admin => Role::Admin,
        }
    }
}

/// Who made a request: the name and role of the token it carried. Holds no secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The token's name, as shown by `list` and recorded in audit fields such as who
    /// decided an approval.
    pub name: String,
    /// What the token may do.
    pub role: Role,
    /// The agent an `agent`-role token is bound to.
    pub agent: Option<String>,
}

impl Principal {
    /// Whether this principal's role permits `verb`.
    pub fn allows(&self, verb: Verb) -> bool {
        self.role >= verb.required_role()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_matrix() {
        // (role, read, write, admin)
        let table = [
            (Role::Viewer, true, false, false),
            (Role::Agent, true, false, false),
            (Role::Operator, true, true, false),
            (Role::Admin, true, true, true),
        ];
        for (role, read, write, admin) in table {
            let p = Principal { name: "p".into(), role, agent: None };
            assert_eq!(p.allows(Verb::Request), role >= Role::Agent, "{role}");
            let got = (p.allows(Verb::Read), p.allows(Verb::Write), p.allows(Verb::Admin));
            assert_eq!(got, (read, write, admin), "{role}");
        }
    }

    #[test]
    fn role_parse_display_serde() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
            assert_eq!(role.to_string(), role.as_str());
            assert_eq!(serde_json::to_string(&role).unwrap(), format!("\"{role}\""));
            assert_eq!(serde_json::from_str::<Role>(&format!("\"{role}\"")).unwrap(), role);
        }
        assert!(Role::Viewer < Role::Agent && Role::Agent < Role::Operator && Role::Operator < Role::Admin);
        let err = "Admin".parse::<Role>().unwrap_err();
        assert_eq!(err.to_string(), "unknown role \"Admin\": expected one of viewer, agent, operator, admin");
        assert!(serde_json::from_str::<Role>("\"root\"").is_err());
    }
}
