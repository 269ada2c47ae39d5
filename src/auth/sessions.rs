//! Dashboard sessions: a signed-in browser holds only a random session id in an
//! HttpOnly cookie; the session (the SHA-256 of the token it signed in with, the token's
//! name, a CSRF token and an expiry) is found by the SHA-256 of that id, and its token is
//! re-checked against the token store on every request, so revoking the token ends the
//! session at once.
//!
//! A daemon on its own keeps its sessions in memory. Replicas on one etcd share them
//! through [`SharedSessions`] (wired in `daemon::shared`): each session is one key,
//! bound to a lease that ends with it. Every replica keeps a bounded cache of the
//! sessions it has signed in or read; one it does not know it reads from the shared
//! store (a quorum read) once — an id the store does not hold is remembered as absent,
//! and a cookie no id can have is not looked up — and one ended on another replica is
//! dropped from its cache
//! when the store's feed hears the key deleted ([`Sessions::ended_elsewhere`]).
//! Neither the session id nor the token is ever stored outside this process's memory.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::http::{header, HeaderMap, Method};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use crate::auth::{token_sha256, Principal, TokenStore};

/// The cookie that carries the session id.
pub const COOKIE: &str = "hive_session";
/// The header a cookie-authenticated mutation must carry.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a session lives after sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);
/// At most this many live sessions in a cache; the oldest go first beyond it, so memory
/// is bounded. Reached only across many tokens, thanks to [`MAX_SESSIONS_PER_TOKEN`].
const MAX_SESSIONS: usize = 10_000;
/// At most this many live sessions per token: signing in again with one token ends
/// that token's oldest session (of those this replica knows), never another token's.
const MAX_SESSIONS_PER_TOKEN: usize = 16;
/// How many ended sessions a cache remembers, so a read of the shared store that raced
/// the session's end does not bring it back into the cache.
const ENDED_KEPT: usize = 1024;
/// How many ids the shared store said it does not hold a cache remembers, so a browser
/// that keeps sending a cookie of a session ended elsewhere (or long expired) costs one
/// quorum read of etcd per replica, not one a request. An id is 256 random bits made at
/// sign-in: one found absent never becomes a session later.
const ABSENT_KEPT: usize = 4096;

/// A pending call of [`SharedSessions`].
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = std::io::Result<T>> + Send + 'a>>;

/// Where replicas keep the sessions they share, by key: the SHA-256 of a session id in
/// hex, never the id. A record is JSON with the token's SHA-256, never the token.
pub trait SharedSessions: Send + Sync {
    /// Stores `record` under `key`, to be dropped by the store itself after `ttl`.
    fn put(&self, key: String, record: Vec<u8>, ttl: Duration) -> Pending<'_, ()>;
    /// The record under `key`, read so that it sees every write acknowledged before.
    fn get(&self, key: String) -> Pending<'_, Option<Vec<u8>>>;
    /// Deletes the record under `key` (nothing if there is none).
    fn delete(&self, key: String) -> Pending<'_, ()>;
}

/// A session as it is cached and shared.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// The SHA-256 (hex) of the token it signed in with, as the token store keeps it.
    token_sha256: String,
    /// The token's name, so one token's sign-ins evict only its own sessions.
    token_name: String,
    csrf: String,
    /// Wall-clock time, so every replica agrees when the session ends.
    expires_at: DateTime<Utc>,
}

/// A live session, as a request sees it.
#[derive(Clone, Debug)]
pub struct SignedIn {
    /// Who the session's token belongs to (re-read from the token store).
    pub principal: Principal,
    /// The session's CSRF token, rendered into each page's `<meta name="csrf-token">`.
    pub csrf: String,
}

/// What the session cookie of a request amounts to for the API.
#[derive(Debug)]
pub enum CookieAuth {
    /// No cookie, or one naming no live session.
    None,
    /// A live session; a mutation also carried the right CSRF token.
    Allowed {
        /// Who the session's token belongs to.
        principal: Principal,
        /// The session id, to end a streaming response when the session ends.
        session: String,
    },
    /// A live session, but a mutation without a matching `X-CSRF-Token`; the message
    /// says which.
    CsrfRefused(&'static str),
}

/// Why a sign-in made no session.
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    /// The token is unknown or revoked.
    #[error("the token is unknown or revoked")]
    Unknown,
    /// The session could not be made or stored (no randomness, the shared store
    /// unreachable).
    #[error("the session could not be stored")]
    Unavailable(#[source] std::io::Error),
}

/// The sessions this process caches, by the SHA-256 of their id.
#[derive(Default)]
struct Cache {
    live: HashMap<String, Record>,
    /// The last sessions ended (see [`ENDED_KEPT`]).
    ended: VecDeque<String>,
    /// The last keys the shared store did not hold (see [`ABSENT_KEPT`]), in order and
    /// as a set.
    absent: VecDeque<String>,
    absent_set: std::collections::HashSet<String>,
}

impl Cache {
    /// Caches `record` under `key`, dropping expired sessions and, beyond the limits,
    /// the oldest of the same token, then the oldest of all; returns the keys dropped
    /// for the limits.
    fn insert(&mut self, key: String, record: Record, now: DateTime<Utc>) -> Vec<String> {
        self.live.retain(|_, r| r.expires_at > now);
        let mut dropped = Vec::new();
        let own = self.live.iter().filter(|(k, r)| r.token_name == record.token_name && **k != key);
        if own.clone().count() >= MAX_SESSIONS_PER_TOKEN {
            dropped.extend(own.min_by_key(|(_, r)| r.expires_at).map(|(k, _)| k.clone()));
        }
        for k in &dropped {
            self.live.remove(k);
        }
        if self.live.len() >= MAX_SESSIONS && !self.live.contains_key(&key) {
            if let Some(oldest) = self.live.iter().min_by_key(|(_, r)| r.expires_at).map(|(k, _)| k.clone()) {
                self.live.remove(&oldest);
                dropped.push(oldest);
            }
        }
        self.live.insert(key, record);
        dropped
    }

    /// Remembers that the shared store does not hold `key`.
    fn absent(&mut self, key: &str) {
        if self.absent_set.insert(key.to_string()) {
            self.absent.push_back(key.to_string());
            if self.absent.len() > ABSENT_KEPT {
                if let Some(oldest) = self.absent.pop_front() {
                    self.absent_set.remove(&oldest);
                }
            }
        }
    }

    /// Forgets the session under `key` and remembers that it ended.
    fn end(&mut self, key: &str) {
        self.live.remove(key);
        if !self.ended.iter().any(|k| k == key) {
            self.ended.push_back(key.to_string());
            if self.ended.len() > ENDED_KEPT {
                self.ended.pop_front();
            }
        }
    }
}

/// Every session this daemon knows: its own only, in memory (a restart signs everyone
/// out), or a cache of those its replicas share.
#[derive(Clone, Default)]
pub struct Sessions {
    cache: Arc<Mutex<Cache>>,
    shared: Option<Arc<dyn SharedSessions>>,
}

impl fmt::Debug for Sessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sessions").field("shared", &self.shared.is_some()).finish_non_exhaustive()
    }
}

/// 32 random bytes, URL-safe base64.
fn random_id() -> Option<String> {
    let mut bytes = [0u8; 32];
    SystemRandom::new().fill(&mut bytes).ok()?;
    Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// Whether `id` has the shape [`random_id`] gives one (43 characters of URL-safe
/// base64): a cookie of any other shape names no session, and is not looked up.
fn could_be_id(id: &str) -> bool {
    id.len() == 43 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Where session `id` is kept: its SHA-256 in hex, so what is stored is no live cookie.
fn key_of(id: &str) -> String {
    super::token_sha256(id)
}

/// Compares without an early exit, so timing says nothing about a guessed CSRF token.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

impl Sessions {
    /// Sessions its replicas share through `shared`.
    pub fn shared(shared: Arc<dyn SharedSessions>) -> Sessions {
        Sessions { cache: Arc::default(), shared: Some(shared) }
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Signs in with `token`: the new session id and who signed in.
    pub async fn sign_in(
        &self,
        tokens: &TokenStore,
        token: &str,
    ) -> Result<(String, Principal), SignInError> {
        let token = token.trim();
        let principal = tokens.authenticate(token).ok_or(SignInError::Unknown)?;
        let no_randomness = || SignInError::Unavailable(std::io::Error::other("no randomness"));
        let (id, csrf) = (random_id().ok_or_else(no_randomness)?, random_id().ok_or_else(no_randomness)?);
        let now = crate::host::now();
        let record = Record {
            token_sha256: token_sha256(token),
            token_name: principal.name.to_string(),
            csrf,
            expires_at: now + SESSION_TTL,
        };
        let key = key_of(&id);
        if let Some(shared) = &self.shared {
            let value = serde_json::to_vec(&record).expect("a session record serializes");
            shared.put(key.clone(), value, SESSION_TTL).await.map_err(SignInError::Unavailable)?;
        }
        let dropped = self.lock().insert(key, record, now);
        // A session pushed out by the limits is signed out, on every replica.
        for old in dropped {
            if let Err(e) = self.end(old).await {
                tracing::warn!(error = %e, "cannot end a session pushed out by the session limits; it ends with its lease");
            }
        }
        Ok((id, principal))
    }

    /// Ends the session with this id (if any), on every replica.
    pub async fn sign_out(&self, id: &str) -> std::io::Result<()> {
        self.end(key_of(id)).await
    }

    async fn end(&self, key: String) -> std::io::Result<()> {
        if let Some(shared) = &self.shared {
            shared.delete(key.clone()).await?;
        }
        self.lock().end(&key);
        Ok(())
    }

    /// The shared store says session `key` (the SHA-256 of its id, hex) ended: signed
    /// out on another replica, or its lease ran out.
    pub fn ended_elsewhere(&self, key: &str) {
        self.lock().end(key);
    }

    /// The live session named by the request's cookie: unexpired, and its token still
    /// valid.
    pub async fn current(&self, tokens: &TokenStore, headers: &HeaderMap) -> Option<SignedIn> {
        self.live(tokens, cookie(headers, COOKIE)?).await
    }

    /// The session `id` if it is live. One this process does not cache is read from the
    /// shared store; a dead one is dropped from the cache.
    async fn live(&self, tokens: &TokenStore, id: &str) -> Option<SignedIn> {
        if !could_be_id(id) {
            return None;
        }
        let key = key_of(id);
        let cached = {
            let cache = self.lock();
            if cache.absent_set.contains(&key) {
                return None;
            }
            cache.live.get(&key).cloned()
        };
        let record = match cached {
            Some(record) => record,
            None => self.read(&key).await?,
        };
        match alive(&record, tokens) {
            Some(principal) => Some(SignedIn { principal, csrf: record.csrf }),
            None => {
                self.lock().live.remove(&key);
                None
            }
        }
    }

    /// Session `key` from the shared store, cached unless it ended meanwhile.
    async fn read(&self, key: &str) -> Option<Record> {
        let shared = self.shared.as_ref()?;
        let value = match shared.get(key.to_string()).await {
            Ok(Some(value)) => value,
            Ok(None) => {
                self.lock().absent(key);
                return None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a session from the shared store; it counts as signed out");
                return None;
            }
        };
        let record: Record = match serde_json::from_slice(&value) {
            Ok(record) => record,
            Err(e) => {
                tracing::warn!(error = %e, "a shared session is not what hive stores; it counts as signed out");
                return None;
            }
        };
        let mut cache = self.lock();
        if !cache.ended.iter().any(|k| k == key) {
            cache.insert(key.to_string(), record.clone(), crate::host::now());
        }
        Some(record)
    }

    /// Whether session `id` is still live: signed in, unexpired, its token unrevoked,
    /// and not ended on any replica. What a stream opened with the cookie checks to end
    /// with its session (the request that opened it cached the session).
    pub fn is_session_live(&self, id: &str, tokens: &TokenStore) -> bool {
        self.lock().live.get(&key_of(id)).is_some_and(|record| alive(record, tokens).is_some())
    }

    /// How an API request's cookie authenticates it. Reads need only the session; any
    /// other method also needs `X-CSRF-Token` equal to the session's CSRF token (a page
    /// of another site can make the browser send the cookie, but cannot read the token).
    pub async fn authenticate(
        &self,
        tokens: &TokenStore,
        method: &Method,
        headers: &HeaderMap,
    ) -> CookieAuth {
        let Some(id) = cookie(headers, COOKIE) else { return CookieAuth::None };
        let Some(signed_in) = self.live(tokens, id).await else { return CookieAuth::None };
        let allowed = CookieAuth::Allowed { principal: signed_in.principal, session: id.to_string() };
        if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return allowed;
        }
        match headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()) {
            None => CookieAuth::CsrfRefused("the X-CSRF-Token header is missing: a request signed in with the dashboard's session cookie must send the CSRF token of its page"),
            Some(sent) if !same(sent, &signed_in.csrf) => {
                CookieAuth::CsrfRefused("the X-CSRF-Token header does not match this session's CSRF token")
            }
            Some(_) => allowed,
        }
    }

    /// Whether `sent` is the CSRF token of the session named by the request's cookie
    /// (for the dashboard's own form posts, which cannot set headers).
    pub async fn csrf_matches(&self, tokens: &TokenStore, headers: &HeaderMap, sent: &str) -> bool {
        self.current(tokens, headers).await.is_some_and(|s| same(sent, &s.csrf))
    }
}

/// Who `record`'s token belongs to, if the session is unexpired and the token unrevoked.
fn alive(record: &Record, tokens: &TokenStore) -> Option<Principal> {
    (record.expires_at > crate::host::now())
        .then(|| tokens.authenticate_sha256(&record.token_sha256))
        .flatten()
}

/// The `Set-Cookie` value for a new session.
pub fn set_cookie(id: &str) -> String {
    format!("{COOKIE}={id}; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age={}", SESSION_TTL.as_secs())
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;

    /// The shared store as a map, standing in for etcd's keys.
    #[derive(Default)]
    struct Map(Mutex<HashMap<String, Vec<u8>>>, std::sync::atomic::AtomicUsize);

    impl SharedSessions for Map {
        fn put(&self, key: String, record: Vec<u8>, _ttl: Duration) -> Pending<'_, ()> {
            self.0.lock().unwrap().insert(key, record);
            Box::pin(async { Ok(()) })
        }
        fn get(&self, key: String) -> Pending<'_, Option<Vec<u8>>> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let found = self.0.lock().unwrap().get(&key).cloned();
            Box::pin(async move { Ok(found) })
        }
        fn delete(&self, key: String) -> Pending<'_, ()> {
            self.0.lock().unwrap().remove(&key);
            Box::pin(async { Ok(()) })
        }
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        tokens: TokenStore,
        token: String,
        map: Arc<Map>,
        /// Two replicas' sessions over one shared store.
        a: Sessions,
        b: Sessions,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let tokens = TokenStore::open(dir.path()).unwrap();
        let token = tokens.create("browser", Role::Operator).unwrap();
        let map = Arc::new(Map::default());
        let (a, b) = (Sessions::shared(map.clone()), Sessions::shared(map.clone()));
        Fixture { _dir: dir, tokens, token, map, a, b }
    }

    fn with_cookie(id: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, format!("{COOKIE}={id}").parse().unwrap());
        headers
    }

    #[tokio::test]
    async fn a_session_is_stored_by_hashes_read_by_another_replica_and_ended_there_by_the_feed() {
        let f = fixture();
        let (id, _) = f.a.sign_in(&f.tokens, &f.token).await.unwrap();
        let stored = f.map.0.lock().unwrap().clone();
        let (key, value) = stored.iter().next().unwrap();
        assert_eq!(*key, key_of(&id));
        let text = String::from_utf8(value.clone()).unwrap();
        assert!(!text.contains(&f.token) && !text.contains(&id), "{text}");
        assert!(text.contains(&token_sha256(&f.token)), "{text}");

        let on_b = f.b.current(&f.tokens, &with_cookie(&id)).await.expect("B reads the session A signed in");
        assert_eq!(on_b.csrf, f.a.current(&f.tokens, &with_cookie(&id)).await.unwrap().csrf);
        assert!(f.b.is_session_live(&id, &f.tokens), "B caches what it read");

        f.a.sign_out(&id).await.unwrap();
        assert!(f.map.0.lock().unwrap().is_empty());
        // The feed tells B the key was deleted.
        f.b.ended_elsewhere(&key_of(&id));
        assert!(!f.b.is_session_live(&id, &f.tokens));
        assert!(f.b.current(&f.tokens, &with_cookie(&id)).await.is_none());
    }

    #[tokio::test]
    async fn a_cookie_of_no_session_costs_one_read_of_the_shared_store_and_a_misshapen_one_none() {
        let f = fixture();
        let reads = || f.map.1.load(std::sync::atomic::Ordering::SeqCst);
        let (id, _) = f.a.sign_in(&f.tokens, &f.token).await.unwrap();
        f.a.sign_out(&id).await.unwrap();
        // B never heard of it: it asks the shared store once, then remembers the answer.
        for _ in 0..5 {
            assert!(f.b.current(&f.tokens, &with_cookie(&id)).await.is_none());
        }
        assert_eq!(reads(), 1);
        for misshapen in ["", "x", "not a session id", &format!("{id}x"), &format!("+{}", &id[1..])] {
            assert!(f.b.current(&f.tokens, &with_cookie(misshapen)).await.is_none(), "{misshapen:?}");
        }
        assert!(f.b.current(&f.tokens, &with_cookie(&"é".repeat(22))).await.is_none());
        assert_eq!(reads(), 1, "a cookie no id can have is not looked up");
        // A live session is still read by a replica that does not know it.
        let (live, _) = f.a.sign_in(&f.tokens, &f.token).await.unwrap();
        assert!(f.b.current(&f.tokens, &with_cookie(&live)).await.is_some());
        assert_eq!(reads(), 2);
        // What is remembered as absent is bounded.
        for n in 0..ABSENT_KEPT + 10 {
            f.b.lock().absent(&format!("{n}"));
        }
        let cache = f.b.lock();
        assert_eq!((cache.absent.len(), cache.absent_set.len()), (ABSENT_KEPT, ABSENT_KEPT));
    }

    #[tokio::test]
    async fn a_read_that_raced_the_sessions_end_does_not_cache_it() {
        let f = fixture();
        let (id, _) = f.a.sign_in(&f.tokens, &f.token).await.unwrap();
        // B hears the delete before its read of the (then still present) key answers.
        f.b.ended_elsewhere(&key_of(&id));
        assert!(f.b.current(&f.tokens, &with_cookie(&id)).await.is_some());
        assert!(!f.b.is_session_live(&id, &f.tokens), "an ended session is not cached again");
    }

    #[tokio::test]
    async fn an_expired_or_revoked_session_is_refused_on_every_replica() {
        let f = fixture();
        let expired = Record {
            token_sha256: token_sha256(&f.token),
            token_name: "browser".into(),
            csrf: "c".into(),
            expires_at: crate::host::now() - chrono::Duration::seconds(1),
        };
        f.map.0.lock().unwrap().insert(key_of("old"), serde_json::to_vec(&expired).unwrap());
        assert!(f.b.current(&f.tokens, &with_cookie("old")).await.is_none());

        let (id, _) = f.a.sign_in(&f.tokens, &f.token).await.unwrap();
        assert!(f.b.current(&f.tokens, &with_cookie(&id)).await.is_some());
        f.tokens.revoke("browser").unwrap();
        for replica in [&f.a, &f.b] {
            assert!(replica.current(&f.tokens, &with_cookie(&id)).await.is_none());
            assert!(!replica.is_session_live(&id, &f.tokens));
        }
    }

    #[tokio::test]
    async fn signing_in_past_the_token_limit_ends_its_oldest_session_in_the_shared_store() {
        let f = fixture();
        let other = f.tokens.create("other", Role::Viewer).unwrap();
        let (theirs, _) = f.a.sign_in(&f.tokens, &other).await.unwrap();
        let mut ids = Vec::new();
        for _ in 0..=MAX_SESSIONS_PER_TOKEN {
            ids.push(f.a.sign_in(&f.tokens, &f.token).await.unwrap().0);
        }
        assert!(!f.map.0.lock().unwrap().contains_key(&key_of(&ids[0])), "the oldest is gone from the store");
        assert!(f.b.current(&f.tokens, &with_cookie(&ids[0])).await.is_none());
        for id in ids[1..].iter().chain([&theirs]) {
            assert!(f.b.current(&f.tokens, &with_cookie(id)).await.is_some());
        }
        assert_eq!(f.map.0.lock().unwrap().len(), MAX_SESSIONS_PER_TOKEN + 1);
    }
}
