//! The `vastai` provider's client: the documented Vast.ai REST API (offer search,
//! create from an offer, show, list, destroy, the credential check), with the safety
//! rules Myelin needs on top of an API that has no idempotency key.
//!
//! - **Exact offers.** A create leases exactly the offer id it is given
//!   (`PUT /asks/{offer_id}/`); an offer that is gone or rented is an error
//!   ([`VastError::OfferUnavailable`]), never a reason to pick another one.
//! - **Labels instead of idempotency keys.** Every create carries a label naming the
//!   command and the node ([`instance_label`]). When a create fails ambiguously (a
//!   timeout, a dropped connection, a 5xx, a reply without `new_contract`), the client
//!   lists the account's instances and looks for that exact label *before* it tries
//!   again: found → that instance is adopted; not found → one retry. A create is sent
//!   at most twice, and the second time only after the first is known not to have rented.
//! - **429.** Every call backs off exponentially with jitter, a bounded number of times,
//!   honouring `Retry-After` when the server sends one (Vast usually does not). Read-only
//!   calls and `destroy` also retry 502/503/504 and lost connections; a create never does
//!   (that is the ambiguous path above). Timing uses `tokio::time`.
//! - **The key.** It is held in memory ([`ApiKey`]), sent only as
//!   `Authorization: Bearer` (a sensitive header), and never appears in `Debug`, in a
//!   log line or in an error: error text is redacted of the key in every form it may
//!   take (`crate::auth::SecretForms`: any letter case, URL, JSON and base64 encodings)
//!   and of any `api_key=` query parameter, and transport errors are rendered without
//!   their URL. Where a key may come from on the host is `super::keys`'s.

mod client;
pub mod provider;
mod retry;
#[cfg(test)]
mod tests;
mod wire;

pub use client::*;
pub use retry::*;
pub use wire::*;

use std::fmt;

use serde::{Deserialize, Serialize};

/// The base URL used when the Provider names none.
pub const DEFAULT_BASE_URL: &str = "https://console.vast.ai/api/v0";
/// Disk requested per instance when the Provider names none, in GB.
pub const DEFAULT_DISK_GB: u32 = 32;
/// Vast's smallest disk, in GB.
pub const MIN_DISK_GB: u32 = 8;
/// Vast's limit on a label, in characters.
pub const MAX_LABEL: usize = 256;
/// Vast's limit on an image reference, in characters.
pub const MAX_IMAGE: usize = 1024;
/// Vast's limit on `onstart` (with `args`), in characters.
pub const MAX_ONSTART: usize = 4096;
/// The prefix of every label this client's callers give instances: `hive:`.
pub const LABEL_PREFIX: &str = "hive:";
/// Offers asked for per search.
pub const SEARCH_LIMIT: u32 = 100;
/// Page size of the instance list (Vast's maximum).
pub(super) const LIST_PAGE: u32 = 25;
/// A bound on list pages, against a server that never stops paginating.
pub(super) const MAX_PAGES: usize = 400;
/// How much of a server's error text is kept in an error.
pub(super) const MAX_DETAIL: usize = 300;
pub(super) const REDACTED: &str = "[redacted]";
/// A longer key is not a Vast.ai key (theirs have 64 characters); it is refused, never
/// sent as a header.
pub const MAX_KEY_LEN: usize = 4096;

/// The label of the instance created for `node` by the command `command_id`:
/// `hive:<command-id>:<node>`. It is how an ambiguous create is resolved and how a
/// restarted daemon finds (adopts) its instances.
pub fn instance_label(command_id: &str, node: &str) -> String {
    format!("{LABEL_PREFIX}{command_id}:{node}")
}

/// A Vast.ai API key, held in memory only. Its `Debug` never shows it and nothing in
/// this module logs it or puts it into an error.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key from its text (surrounding whitespace is trimmed). An error when it is empty
    /// or holds characters an HTTP header cannot carry; the reason never quotes the key.
    pub fn new(text: impl Into<String>) -> Result<ApiKey, String> {
        let text: String = text.into();
        let key = text.trim();
        if key.is_empty() {
            return Err("the Vast.ai API key is empty".into());
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the Vast.ai API key holds whitespace or non-ASCII characters".into());
        }
        if key.len() > MAX_KEY_LEN {
            return Err(format!("the Vast.ai API key is longer than {MAX_KEY_LEN} characters"));
        }
        Ok(ApiKey(key.to_string()))
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(")?;
        f.write_str(REDACTED)?;
        f.write_str(")")
    }
}

/// A Vast.ai instance (contract) id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InstanceId(pub u64);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Errors of the Vast.ai client. No variant's text contains the API key.
#[derive(Debug, thiserror::Error)]
pub enum VastError {
    /// Vast.ai refused the API key (HTTP 401 or 403): it is wrong, expired or revoked.
    #[error("Vast.ai refused the API key (HTTP {status}): it is wrong, expired or revoked")]
    Unauthorized {
        /// 401 or 403.
        status: u16,
    },
    /// The selected offer cannot be rented any more (HTTP 404 `no_such_ask`, 410, or it
    /// is no longer rentable). Nothing was rented; no other offer was tried.
    #[error(
        "offer {offer_id} is no longer available ({detail}); nothing was rented and no other offer \
         was tried: search the offers again and select a current one"
    )]
    OfferUnavailable {
        /// The offer asked for.
        offer_id: u64,
        /// What Vast.ai said.
        detail: String,
    },
    /// Vast.ai rejected the request as invalid (another 4xx).
    #[error("Vast.ai rejected the {what} request (HTTP {status}): {detail}")]
    Rejected {
        /// The call, e.g. `create`.
        what: &'static str,
        /// The HTTP status.
        status: u16,
        /// What Vast.ai said.
        detail: String,
    },
    /// Still rate-limited (HTTP 429) after the bounded attempts, or told to wait longer
    /// than the policy allows.
    #[error(
        "Vast.ai rate limit: the {what} call was refused with HTTP 429 {attempts} time(s); try again later"
    )]
    RateLimited {
        /// The call, e.g. `search`.
        what: &'static str,
        /// How many requests were refused.
        attempts: u32,
    },
    /// Vast.ai answered a server error (5xx) to a call that is safe to repeat, after the
    /// bounded attempts.
    #[error("Vast.ai server error on {what} (HTTP {status}): {detail}")]
    Server {
        /// The call.
        what: &'static str,
        /// The HTTP status.
        status: u16,
        /// What Vast.ai said.
        detail: String,
    },
    /// The API could not be reached, or the connection failed, for a call that is safe
    /// to repeat, after the bounded attempts.
    #[error("cannot reach Vast.ai for {what}: {detail}")]
    Transport {
        /// The call.
        what: &'static str,
        /// The (URL-free, redacted) transport error.
        detail: String,
    },
    /// A create's outcome is unknown and could not be settled by looking for its label:
    /// an instance may or may not be billing. Nothing more was sent.
    #[error(
        "creating an instance from offer {offer_id} (label {label:?}) had an unknown outcome: {detail}; \
         check the Vast.ai console for an instance with that label"
    )]
    Ambiguous {
        /// The offer asked for.
        offer_id: u64,
        /// The label the create carried.
        label: String,
        /// What happened.
        detail: String,
    },
    /// Vast.ai answered something this client does not understand.
    #[error("unexpected answer from Vast.ai to {what}: {detail}")]
    Protocol {
        /// The call.
        what: &'static str,
        /// What was wrong with it.
        detail: String,
    },
    /// The request was refused before anything was sent (a limit of the API, e.g. a
    /// label over 256 characters).
    #[error("invalid Vast.ai request: {0}")]
    Invalid(String),
    /// The client could not be built (base URL, CA certificates, TLS).
    #[error("Vast.ai client configuration: {0}")]
    Config(String),
}
