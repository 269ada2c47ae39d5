//! Who may do what: the [`Role`] a bearer token carries and the [`Verb`]s a route
//! needs. One type for the server, the CLI and the token file, so the wire form
//! (`"viewer"`, `--role viewer`) is spelled in one place.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a token may do. Roles are ordered: each one may do everything the ones below it
/// may. The serialized form is the lowercase name, as in `tokens.json`, the token API
/// and `hive token create --role`.
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

    /// Whether this role permits `verb`.
    pub fn allows(self, verb: Verb) -> bool {
        self >= verb.required_role()
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is none of `viewer`, `agent`, `operator`, `admin`.
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

/// The kinds of request a role is checked against. Every route of the API declares the
/// one it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
    /// Every verb, weakest first.
    pub const ALL: [Verb; 4] = [Verb::Read, Verb::Request, Verb::Write, Verb::Admin];

    /// The lowest role that may perform this verb.
    pub fn required_role(self) -> Role {
        match self {
            Verb::Read => Role::Viewer,
            Verb::Request => Role::Agent,
            Verb::Write => Role::Operator,
            Verb::Admin => Role::Admin,
        }
    }

    /// The lowercase name, as route tables print it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Read => "read",
            Verb::Request => "request",
            Verb::Write => "write",
            Verb::Admin => "admin",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_matrix() {
        // (role, read, request, write, admin)
        let table = [
            (Role::Viewer, true, false, false, false),
            (Role::Agent, true, true, false, false),
            (Role::Operator, true, true, true, false),
            (Role::Admin, true, true, true, true),
        ];
        for (role, read, request, write, admin) in table {
            let got = Verb::ALL.map(|verb| role.allows(verb));
            assert_eq!(got, [read, request, write, admin], "{role}");
        }
    }

    #[test]
    fn each_verb_needs_a_different_role() {
        let roles = Verb::ALL.map(Verb::required_role);
        assert_eq!(roles, Role::ALL, "the weakest role allowed identifies the verb");
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
