//! The token store: `<state-dir>/tokens.json`, holding a SHA-256 hash, name, role and
//! creation time per token, and never the token itself. Replicas of one hive on etcd
//! share one such file instead ([`SharedTokens`]): a token made or revoked through any
//! replica is known to every one.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use base64::Engine as _;
use chrono::{DateTime, Utc};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use super::secret_file::{write_atomic, SECRET_MODE};
use super::{Principal, Role};

/// Every hive token starts with this, so it is recognisable in a leaked log or a paste.
pub const TOKEN_PREFIX: &str = "hive_";
/// Random bytes per token: 256 bits, so guessing is hopeless and the hash needs no salt.
const TOKEN_BYTES: usize = 32;
/// The file name under the state directory.
const FILE_NAME: &str = "tokens.json";
/// The name of the token `ensure_admin` creates.
const FIRST_ADMIN: &str = "admin";

/// Errors of the token store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing the token file failed.
    #[error("token file {}: {action}", path.display())]
    Io {
        /// The token file.
        path: PathBuf,
        /// What was being done, e.g. "reading".
        action: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The token file exists but is not valid JSON of the expected shape. This is a hard
    /// error: starting with no tokens would silently lock everyone out (or, worse, mint a
    /// new admin token).
    #[error("token file {} is corrupt", path.display())]
    Corrupt {
        /// The token file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The token file parses but breaks an invariant (duplicate name, malformed hash).
    #[error("token file {} is invalid: {reason}", path.display())]
    Invalid {
        /// The token file.
        path: PathBuf,
        /// Which invariant, naming the entry.
        reason: String,
    },
    /// A token name is not a DNS-1123 label.
    #[error("invalid token name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it is not a DNS-1123 label.
        reason: String,
    },
    /// An `agent`-role token names no agent, or another role names one.
    #[error("token {name:?}: {reason}")]
    Binding {
        /// The token's name.
        name: String,
        /// What is wrong, e.g. `role agent needs the agent it is bound to`.
        reason: String,
    },
    /// A token with this name exists already; names identify tokens for `revoke`.
    #[error("a token named {0:?} already exists")]
    Duplicate(String),
    /// No token has this name.
    #[error("no token named {0:?}")]
    NotFound(String),
    /// The operating system's random number generator failed.
    #[error("the system random number generator failed")]
    Random,
}

/// Result of token store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What `list` shows about a token: never its hash or secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    /// The token's name (a DNS-1123 label, unique).
    pub name: String,
    /// What the token may do.
    pub role: Role,
    /// The agent an `agent`-role token is bound to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// When the token was created.
    pub created_at: DateTime<Utc>,
}

/// One entry of `tokens.json`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Record {
    name: String,
    role: Role,
    /// The agent an `agent`-role token is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent: Option<String>,
    /// Lowercase hex SHA-256 of the whole token string, prefix included.
    sha256: String,
    created_at: DateTime<Utc>,
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("agent", &self.agent)
            .field("created_at", &self.created_at)
            .finish_non_exhaustive()
    }
}

/// The whole of `tokens.json`.
#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<Record>,
}

type Hash = [u8; 32];

/// The tokens in memory, indexed both ways.
#[derive(Clone, Default)]
struct Tokens {
    /// The shared file's revision these were read at (0: absent, or a local file).
    revision: u64,
    by_name: BTreeMap<String, Record>,
    /// SHA-256 → who the token is, ready to hand to each request without copying.
    by_hash: HashMap<Hash, Principal>,
}

impl Tokens {
    fn insert(&mut self, record: Record, hash: Hash) {
        let principal = Principal {
            name: record.name.as_str().into(),
            role: record.role,
            agent: record.agent.as_deref().map(Into::into),
        };
        self.by_hash.insert(hash, principal);
        self.by_name.insert(record.name.clone(), record);
    }

    fn to_file(&self) -> TokenFile {
        TokenFile { tokens: self.by_name.values().cloned().collect() }
    }
}

/// The token store. Cheap to clone; clones share one state. Every change is written to
/// disk (atomically, fsynced) before it becomes visible, so an acknowledged create or
/// revoke survives a crash, and a failed write changes nothing.
#[derive(Clone)]
pub struct TokenStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The local file, or how the shared one is named in errors.
    path: PathBuf,
    /// Where changes go: the local file when `None`.
    shared: Option<Arc<dyn SharedTokens>>,
    rng: SystemRandom,
    tokens: RwLock<Tokens>,
    /// Held by the one change under way.
    changing: std::sync::Mutex<()>,
}

/// What a swap of the shared token file did: the new revision, or (not written) the file
/// as it is now and its revision (`None`: absent).
pub type Swapped = Result<u64, Option<(Vec<u8>, u64)>>;

/// The token file of replicas that share one (the store on etcd), read and replaced by
/// compare-and-swap. Its calls block: the store calls them on blocking threads.
pub trait SharedTokens: Send + Sync {
    /// Writes `file` if the shared file is still at `revision` (0: absent), and returns
    /// the new revision; otherwise writes nothing and returns the file as it is now and
    /// its revision (`None`: absent).
    fn swap(&self, revision: u64, file: Vec<u8>) -> io::Result<Swapped>;
}

/// What a change of the token file did.
enum Persisted {
    /// Written; at this revision when shared.
    Done(u64),
    /// Not written: another replica changed the shared file first; here it is.
    Moved(Tokens),
}

impl fmt::Debug for TokenStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenStore")
            .field("path", &self.inner.path)
            .field("tokens", &self.read().by_name.len())
            .finish()
    }
}

impl TokenStore {
    /// Opens `<state_dir>/tokens.json`. A missing file is an empty store (first start);
    /// a file that cannot be read or parsed is an error naming it.
    pub fn open(state_dir: &Path) -> Result<TokenStore> {
        let path = state_dir.join(FILE_NAME);
        let tokens = match std::fs::read(&path) {
            Ok(bytes) => parse(&path, &bytes)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Tokens::default(),
            Err(source) => return Err(Error::Io { path, action: "reading", source }),
        };
        Ok(TokenStore {
            inner: Arc::new(Inner {
                path,
                shared: None,
                rng: SystemRandom::new(),
                tokens: RwLock::new(tokens),
                changing: Default::default(),
            }),
        })
    }

    /// A store over a token file that several replicas share, as it was read (`None`:
    /// no file yet). `name` says where it lives, in errors. A file that does not parse
    /// is an error naming it, as a local one is.
    pub fn open_shared(
        name: &str,
        shared: Arc<dyn SharedTokens>,
        current: Option<(Vec<u8>, u64)>,
    ) -> Result<TokenStore> {
        let path = PathBuf::from(name);
        let tokens = match current {
            Some((bytes, revision)) => Tokens { revision, ..parse(&path, &bytes)? },
            None => Tokens::default(),
        };
        Ok(TokenStore {
            inner: Arc::new(Inner {
                path,
                shared: Some(shared),
                rng: SystemRandom::new(),
                tokens: RwLock::new(tokens),
                changing: Default::default(),
            }),
        })
    }

    /// Takes the shared file as another replica wrote it at `revision`, unless this store
    /// holds a newer one. A file that does not parse is ignored (and said), keeping the
    /// tokens held: locking everyone out is worse than a late revocation.
    pub fn follow(&self, bytes: &[u8], revision: u64) {
        let mut tokens = self.write();
        if revision <= tokens.revision {
            return;
        }
        match parse(&self.inner.path, bytes) {
            Ok(fresh) => *tokens = Tokens { revision, ..fresh },
            Err(e) => {
                tracing::error!(error = %e, revision, "the shared token file changed and does not parse; keeping the tokens held")
            }
        }
    }

    /// Whether the tokens live in a file replicas share.
    pub fn is_shared(&self) -> bool {
        self.inner.shared.is_some()
    }

    /// Whether no token exists.
    pub fn is_empty(&self) -> bool {
        self.read().by_name.is_empty()
    }

    /// The whole token file (hashes only), as written to disk.
    pub fn to_bytes(&self) -> Vec<u8> {
        encode(&self.read().to_file())
    }

    /// The file this store persists to.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Creates a token and returns its plaintext. This is the only time the plaintext
    /// exists outside the client: show it to the user once, never log it.
    pub fn create(&self, name: &str, role: Role) -> Result<String> {
        self.create_bound(name, role, None)
    }

    /// [`TokenStore::create`] for a token bound to an agent: `role` `agent` needs
    /// `agent`, every other role refuses one.
    pub fn create_bound(&self, name: &str, role: Role, agent: Option<&str>) -> Result<String> {
        self.change(|tokens| self.create_in(tokens, name, role, agent))
    }

    /// Creates the first `admin` token when no token exists at all, and returns it; returns
    /// `None` when any token exists (even if the first admin was revoked: an operator who
    /// removed it meant to).
    pub fn ensure_admin(&self) -> Result<Option<String>> {
        self.change(|tokens| {
            if !tokens.by_name.is_empty() {
                return Ok(None);
            }
            self.create_in(tokens, FIRST_ADMIN, Role::Admin, None).map(Some)
        })
    }

    /// Finds the principal a bearer token belongs to, or `None` for an unknown token.
    pub fn authenticate(&self, bearer: &str) -> Option<Principal> {
        // The prefix is public, so rejecting on it early leaks nothing.
        if !bearer.starts_with(TOKEN_PREFIX) {
            return None;
        }
        // Timing safety: the map is keyed by the SHA-256 of the presented token, never by
        // the token. Whatever a timing side channel in the lookup reveals (which bucket,
        // how many leading bytes of a key compared equal) is about the hash of the
        // attacker's own guess, and knowing how many hash bytes match a stored hash does not
        // help forge a token: that would take a SHA-256 preimage. So the variable-time
        // comparison inside `HashMap` does not leak the secret, unlike a direct `==` on
        // token strings would.
        let hash = sha256(bearer);
        let tokens = self.read();
        tokens.by_hash.get(&hash).cloned()
    }

    /// Finds the principal of the token whose SHA-256 is `sha256` (hex), as a session
    /// keeps it (see [`token_sha256`]); `None` for an unknown or revoked token.
    pub fn authenticate_sha256(&self, sha256: &str) -> Option<Principal> {
        let hash = unhex(sha256)?;
        self.read().by_hash.get(&hash).cloned()
    }

    /// Every token's name, role and creation time, sorted by name.
    pub fn list(&self) -> Vec<TokenInfo> {
        self.read()
            .by_name
            .values()
            .map(|r| TokenInfo {
                name: r.name.clone(),
                role: r.role,
                agent: r.agent.clone(),
                created_at: r.created_at,
            })
            .collect()
    }

    /// Deletes the token called `name`; requests carrying it fail from now on.
    pub fn revoke(&self, name: &str) -> Result<()> {
        self.change(|tokens| {
            if tokens.by_name.remove(name).is_none() {
                return Err(Error::NotFound(name.to_owned()));
            }
            tokens.by_hash.retain(|_, p| &*p.name != name);
            Ok(())
        })
    }

    /// Applies `op` to a copy of the tokens, persists the copy, and only then makes it
    /// the tokens held; a failed write changes nothing. When another replica changed the
    /// shared file first, `op` runs again on what it wrote (its checks too). Changes go
    /// one at a time; requests authenticate meanwhile against the tokens held.
    fn change<T>(&self, op: impl Fn(&mut Tokens) -> Result<T>) -> Result<T> {
        let _one_at_a_time = self.inner.changing.lock().unwrap_or_else(|e| e.into_inner());
        let mut base = self.read().clone();
        loop {
            let mut next = base.clone();
            let out = op(&mut next)?;
            match self.persist(&next.to_file(), base.revision)? {
                Persisted::Done(revision) => {
                    next.revision = revision;
                    self.install(next);
                    return Ok(out);
                }
                Persisted::Moved(now) => {
                    self.install(now.clone());
                    base = now;
                }
            }
        }
    }

    /// Makes `next` the tokens held, unless they are older than those held (a shared
    /// file followed past them meanwhile).
    fn install(&self, next: Tokens) {
        let mut tokens = self.write();
        if self.inner.shared.is_none() || next.revision > tokens.revision {
            *tokens = next;
        }
    }

    fn create_in(&self, tokens: &mut Tokens, name: &str, role: Role, agent: Option<&str>) -> Result<String> {
        hive_api::validation::dns1123_label(name)
            .map_err(|reason| Error::InvalidName { name: name.to_owned(), reason })?;
        let binding = |reason: String| Error::Binding { name: name.to_owned(), reason };
        match (role, agent) {
            (Role::Agent, None) => return Err(binding("role agent needs the agent it is bound to".into())),
            (Role::Agent, Some(agent)) => hive_api::validation::dns1123_label(agent)
                .map_err(|reason| binding(format!("agent {agent:?}: {reason}")))?,
            (role, Some(agent)) => {
                return Err(binding(format!(
                    "only role agent is bound to an agent; role {role} cannot name {agent:?}"
                )))
            }
            (_, None) => {}
        }
        if tokens.by_name.contains_key(name) {
            return Err(Error::Duplicate(name.to_owned()));
        }
        let mut secret = [0u8; TOKEN_BYTES];
        self.inner.rng.fill(&mut secret).map_err(|_| Error::Random)?;
        let token =
            format!("{TOKEN_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret));
        let hash = sha256(&token);
        let record = Record {
            name: name.to_owned(),
            role,
            agent: agent.map(str::to_owned),
            sha256: hex(&hash),
            created_at: crate::host::now(),
        };
        tokens.insert(record, hash);
        tracing::info!(token.name = name, token.role = %role, "created token");
        Ok(token)
    }

    fn persist(&self, file: &TokenFile, revision: u64) -> Result<Persisted> {
        let json = encode(file);
        let io = |source| Error::Io { path: self.inner.path.clone(), action: "writing", source };
        match &self.inner.shared {
            None => {
                write_atomic(&self.inner.path, &json, SECRET_MODE).map(|()| Persisted::Done(0)).map_err(io)
            }
            Some(shared) => match shared.swap(revision, json).map_err(io)? {
                Ok(revision) => Ok(Persisted::Done(revision)),
                Err(Some((bytes, revision))) => {
                    Ok(Persisted::Moved(Tokens { revision, ..parse(&self.inner.path, &bytes)? }))
                }
                Err(None) => Ok(Persisted::Moved(Tokens::default())),
            },
        }
    }

    // The lock guards plain data that is only replaced after a successful write, so a
    // panic while holding it cannot leave it half-updated: poisoning is safe to ignore.
    fn read(&self) -> RwLockReadGuard<'_, Tokens> {
        self.inner.tokens.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Tokens> {
        self.inner.tokens.write().unwrap_or_else(|e| e.into_inner())
    }
}

fn encode(file: &TokenFile) -> Vec<u8> {
    let mut json = serde_json::to_vec_pretty(file).expect("token file serializes");
    json.push(b'\n');
    json
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Tokens> {
    let file: TokenFile =
        serde_json::from_slice(bytes).map_err(|source| Error::Corrupt { path: path.to_owned(), source })?;
    let invalid = |reason: String| Error::Invalid { path: path.to_owned(), reason };
    let mut tokens = Tokens::default();
    for record in file.tokens {
        if let Err(why) = hive_api::validation::dns1123_label(&record.name) {
            return Err(invalid(format!("token name {:?}: {why}", record.name)));
        }
        let hash = unhex(&record.sha256)
            .ok_or_else(|| invalid(format!("token {:?}: sha256 is not 64 hex digits", record.name)))?;
        if (record.role == Role::Agent) != record.agent.is_some() {
            return Err(invalid(format!(
                "token {:?}: role {} and agent {:?} do not go together (exactly the agent role names an agent)",
                record.name, record.role, record.agent
            )));
        }
        if tokens.by_name.contains_key(&record.name) {
            return Err(invalid(format!("token name {:?} appears twice", record.name)));
        }
        if tokens.by_hash.contains_key(&hash) {
            return Err(invalid(format!("token {:?} has the same hash as another token", record.name)));
        }
        tokens.insert(record, hash);
    }
    Ok(tokens)
}

/// The SHA-256 of `token` in hex: what the token store keeps instead of the token, and
/// what [`TokenStore::authenticate_sha256`] takes.
pub fn token_sha256(token: &str) -> String {
    hex(&sha256(token))
}

fn sha256(token: &str) -> Hash {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    digest.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// `bytes` in lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Hash> {
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Verb;
    use std::os::unix::fs::PermissionsExt;

    fn store() -> (tempfile::TempDir, TokenStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = TokenStore::open(dir.path()).unwrap();
        (dir, store)
    }

    #[test]
    fn token_shape() {
        let (_dir, store) = store();
        let token = store.create("ci", Role::Viewer).unwrap();
        let body = token.strip_prefix(TOKEN_PREFIX).unwrap();
        assert_eq!(body.len(), 43, "32 bytes, base64url without padding");
        assert!(body.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        let other = store.create("ci2", Role::Viewer).unwrap();
        assert_ne!(token, other);
    }

    #[test]
    fn create_authenticate_revoke() {
        let (_dir, store) = store();
        let token = store.create("deployer", Role::Operator).unwrap();
        let p = store.authenticate(&token).unwrap();
        assert_eq!(p, Principal { name: "deployer".into(), role: Role::Operator, agent: None });
        assert!(p.allows(Verb::Write) && !p.allows(Verb::Admin));

        assert_eq!(store.authenticate("hive_not-a-real-token"), None);
        assert_eq!(store.authenticate(""), None);
        assert_eq!(store.authenticate(&token[..token.len() - 1]), None);
        assert_eq!(store.authenticate(&format!("{token}x")), None);
        assert_eq!(store.authenticate(&token.to_uppercase()), None);

        store.revoke("deployer").unwrap();
        assert_eq!(store.authenticate(&token), None);
        assert!(matches!(store.revoke("deployer"), Err(Error::NotFound(n)) if n == "deployer"));
    }

    #[test]
    fn names_are_dns_labels_and_unique() {
        let (_dir, store) = store();
        for bad in ["", "Admin", "has space", "-lead", "trail-", "a_b", &"x".repeat(64)] {
            assert!(matches!(store.create(bad, Role::Viewer), Err(Error::InvalidName { .. })), "{bad:?}");
        }
        store.create("ops", Role::Viewer).unwrap();
        let err = store.create("ops", Role::Admin).unwrap_err();
        assert!(matches!(&err, Error::Duplicate(n) if n == "ops"));
        assert_eq!(err.to_string(), "a token named \"ops\" already exists");
        // The failed create changed nothing.
        assert_eq!(store.list().len(), 1);
        assert_eq!(store.list()[0].role, Role::Viewer);
    }

    #[test]
    fn agent_tokens_are_bound_to_exactly_one_agent() {
        let (_dir, store) = store();
        let token = store.create_bound("alpha-token", Role::Agent, Some("alpha")).unwrap();
        let p = store.authenticate(&token).unwrap();
        assert_eq!((p.role, p.agent.as_deref()), (Role::Agent, Some("alpha")));
        let err = store.create_bound("loose", Role::Agent, None).unwrap_err().to_string();
        assert!(err.contains("role agent needs the agent"), "{err}");
        let err = store.create_bound("op", Role::Operator, Some("alpha")).unwrap_err().to_string();
        assert!(err.contains("only role agent"), "{err}");
        let err = store.create_bound("bad", Role::Agent, Some("Not_A_Name")).unwrap_err().to_string();
        assert!(err.contains("Not_A_Name"), "{err}");
        assert_eq!(store.list().len(), 1, "refused tokens are not stored");
        let reopened = TokenStore::open(_dir.path()).unwrap();
        assert_eq!(reopened.authenticate(&token).unwrap().agent.as_deref(), Some("alpha"));
    }

    #[test]
    fn ensure_admin_only_on_empty_store() {
        let (dir, store) = store();
        let token = store.ensure_admin().unwrap().expect("first start creates an admin token");
        assert_eq!(store.authenticate(&token).unwrap().role, Role::Admin);
        assert_eq!(store.ensure_admin().unwrap(), None);
        // Also after a restart.
        let reopened = TokenStore::open(dir.path()).unwrap();
        assert_eq!(reopened.ensure_admin().unwrap(), None);
        // And after the admin was revoked while another token exists.
        reopened.create("viewer", Role::Viewer).unwrap();
        reopened.revoke("admin").unwrap();
        assert_eq!(reopened.ensure_admin().unwrap(), None);
    }

    #[test]
    fn persists_hashes_only_with_mode_0600() {
        let (dir, store) = store();
        let token = store.create("ci", Role::Operator).unwrap();
        let path = dir.path().join("tokens.json");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&token));
        assert!(!text.contains(token.strip_prefix(TOKEN_PREFIX).unwrap()));
        assert!(text.contains(&hex(&sha256(&token))));
        assert!(text.contains("\"createdAt\""));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);

        let reopened = TokenStore::open(dir.path()).unwrap();
        assert_eq!(&*reopened.authenticate(&token).unwrap().name, "ci");
        assert_eq!(reopened.list(), store.list());
    }

    #[test]
    fn clones_share_state() {
        let (_dir, store) = store();
        let clone = store.clone();
        let token = store.create("a", Role::Viewer).unwrap();
        assert!(clone.authenticate(&token).is_some());
        std::thread::spawn(move || clone.revoke("a").unwrap()).join().unwrap();
        assert!(store.authenticate(&token).is_none());
    }

    #[test]
    fn corrupt_or_invalid_file_is_a_hard_error_naming_it() {
        let hash = "ab".repeat(32);
        let cases = [
            ("{not json", "is corrupt"),
            (r#"{"tokens": [{"name": "a"}]}"#, "is corrupt"),
            (
                r#"{"tokens": [{"name":"A","role":"admin","sha256":"HASH","createdAt":"2024-01-01T00:00:00Z"}]}"#,
                "is invalid",
            ),
            (
                r#"{"tokens": [{"name":"a","role":"root","sha256":"HASH","createdAt":"2024-01-01T00:00:00Z"}]}"#,
                "is corrupt",
            ),
            (
                r#"{"tokens": [{"name":"a","role":"admin","sha256":"xyz","createdAt":"2024-01-01T00:00:00Z"}]}"#,
                "is invalid",
            ),
            (
                r#"{"tokens": [{"name":"a","role":"admin","sha256":"HASH","createdAt":"2024-01-01T00:00:00Z"},
                            {"name":"a","role":"viewer","sha256":"HASH","createdAt":"2024-01-01T00:00:00Z"}]}"#,
                "is invalid",
            ),
        ];
        for (content, expect) in cases {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tokens.json");
            std::fs::write(&path, content.replace("HASH", &hash)).unwrap();
            let err = TokenStore::open(dir.path()).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(&path.display().to_string()) && msg.contains(expect), "{content}: {msg}");
        }
    }

    #[test]
    fn debug_shows_no_secret() {
        let (_dir, store) = store();
        let token = store.create("ci", Role::Admin).unwrap();
        let hash = hex(&sha256(&token));
        let record = store.read().by_name["ci"].clone();
        for debug in [format!("{store:?}"), format!("{record:?}"), format!("{:?}", store.list())] {
            assert!(!debug.contains(&token) && !debug.contains(&hash), "{debug}");
        }
    }

    /// A shared token file as etcd keeps it: a value and the revision that wrote it.
    #[derive(Default)]
    struct SharedFile(std::sync::Mutex<(Vec<u8>, u64, u64)>);

    impl SharedTokens for SharedFile {
        fn swap(&self, revision: u64, file: Vec<u8>) -> io::Result<Swapped> {
            let mut held = self.0.lock().unwrap();
            let (bytes, at, clock) = &mut *held;
            if *at != revision {
                return Ok(Err((*at > 0).then(|| (bytes.clone(), *at))));
            }
            *clock += 1;
            *bytes = file;
            *at = *clock;
            Ok(Ok(*at))
        }
    }

    #[test]
    fn replicas_sharing_a_token_file_lose_no_change_and_follow_each_other() {
        let file = Arc::new(SharedFile::default());
        let a = TokenStore::open_shared("etcd /hive/_tokens", file.clone(), None).unwrap();
        let b = TokenStore::open_shared("etcd /hive/_tokens", file.clone(), None).unwrap();
        let admin = a.ensure_admin().unwrap().expect("the first admin");
        // B read the file before A wrote it: its change is made again on A's file, and
        // its own first-admin check sees A's admin.
        assert_eq!(b.ensure_admin().unwrap(), None);
        let ops = b.create("ops", Role::Operator).unwrap();
        assert!(b.authenticate(&admin).is_some(), "B took A's write when its swap failed");
        // A has not heard of "ops": its swap fails, and the create made again on B's
        // file finds the duplicate.
        assert!(matches!(a.create("ops", Role::Viewer), Err(Error::Duplicate(_))));
        assert_eq!(a.authenticate(&ops).map(|p| p.role), Some(Role::Operator));

        b.revoke("ops").unwrap();
        let (bytes, revision, _) = file.0.lock().unwrap().clone();
        a.follow(&bytes, revision);
        assert!(a.authenticate(&ops).is_none(), "a revocation through B reaches A");
        // An older file than the one held is ignored.
        a.follow(b"{\"tokens\": []}", 1);
        assert!(a.authenticate(&admin).is_some());
        // Nothing was written to a local file.
        assert!(!Path::new("etcd /hive/_tokens").exists());
    }
}
