//! Dashboard sessions: a signed-in browser holds only a random session id in an
//! HttpOnly cookie; the token it signed in with stays in this process's memory and is
//! re-checked against the token store on every request, so revoking the token ends
//! the session at once.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, Method};
use base64::Engine as _;
use ring::rand::{SecureRandom, SystemRandom};

use crate::auth::{Principal, TokenStore};

/// The cookie that carries the session id.
pub const COOKIE: &str = "hive_session";
/// The header a cookie-authenticated mutation must carry.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a session lives after sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);
/// At most this many live sessions in all; the oldest go first beyond it, so memory is
/// bounded. Reached only across many tokens, thanks to [`MAX_SESSIONS_PER_TOKEN`].
const MAX_SESSIONS: usize = 10_000;
/// At most this many live sessions per token: signing in again with one token evicts
/// that token's oldest session, never another token's.
const MAX_SESSIONS_PER_TOKEN: usize = 16;

/// A bearer token held in memory only; `Debug` never prints it.
#[derive(Clone)]
struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[derive(Clone, Debug)]
struct Session {
    token: Secret,
    /// The token's name, so one token's sign-ins evict only its own sessions.
    token_name: String,
    csrf: String,
    expires_at: Instant,
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

/// Every live session of this daemon (in memory: a restart signs everyone out).
#[derive(Clone, Default)]
pub struct Sessions {
    inner: Arc<Mutex<HashMap<String, Session>>>,
}

impl fmt::Debug for Sessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

/// 32 random bytes, URL-safe base64.
fn random_id() -> Option<String> {
    let mut bytes = [0u8; 32];
    SystemRandom::new().fill(&mut bytes).ok()?;
    Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
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
    /// Signs in with `token`: `None` when the token is unknown (or randomness failed).
    /// Returns the new session id and who signed in.
    pub fn sign_in(&self, tokens: &TokenStore, token: &str) -> Option<(String, Principal)> {
        let principal = tokens.authenticate(token.trim())?;
        let (id, csrf) = (random_id()?, random_id()?);
        let now = Instant::now();
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| s.expires_at > now);
        // A token holder can push out only its own token's sessions.
        let own: Vec<(&String, Instant)> = map
            .iter()
            .filter(|(_, s)| *s.token_name == *principal.name)
            .map(|(k, s)| (k, s.expires_at))
            .collect();
        if own.len() >= MAX_SESSIONS_PER_TOKEN {
            if let Some(oldest) = own.into_iter().min_by_key(|(_, at)| *at).map(|(k, _)| k.clone()) {
                map.remove(&oldest);
            }
        }
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map.iter().min_by_key(|(_, s)| s.expires_at).map(|(k, _)| k.clone()) {
                map.remove(&oldest);
            }
        }
        let session = Session {
            token: Secret(token.trim().to_string()),
            token_name: principal.name.to_string(),
            csrf,
            expires_at: now + SESSION_TTL,
        };
        map.insert(id.clone(), session);
        Some((id, principal))
    }

    /// Ends the session with this id (if any).
    pub fn sign_out(&self, id: &str) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    /// The live session named by the request's cookie: unexpired, and its token still
    /// valid. A session whose token was revoked or that expired is removed.
    pub fn current(&self, tokens: &TokenStore, headers: &HeaderMap) -> Option<SignedIn> {
        self.live(tokens, cookie(headers, COOKIE)?)
    }

    /// Whether the session `id` is still live (unexpired, its token still valid).
    pub fn is_live(&self, id: &str, tokens: &TokenStore) -> bool {
        self.live(tokens, id).is_some()
    }

    /// The session `id` if it is live; a dead one is removed.
    fn live(&self, tokens: &TokenStore, id: &str) -> Option<SignedIn> {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let session = map.get(id)?;
        let principal =
            (session.expires_at > Instant::now()).then(|| tokens.authenticate(&session.token.0)).flatten();
        match principal {
            Some(principal) => Some(SignedIn { principal, csrf: session.csrf.clone() }),
            None => {
                map.remove(id);
                None
            }
        }
    }

    /// The token behind the live session named by the request's cookie: what a replica
    /// that forwards the request to the leader sends instead of the cookie (the session
    /// lives in this replica's memory only). Never logged.
    pub fn bearer(&self, tokens: &TokenStore, headers: &HeaderMap) -> Option<String> {
        let id = cookie(headers, COOKIE)?;
        self.live(tokens, id)?;
        let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        map.get(id).map(|session| session.token.0.clone())
    }

    /// Whether session `id` is still live: signed in, unexpired, its token unrevoked.
    /// What a stream opened with the cookie checks to end with its session.
    pub fn is_session_live(&self, id: &str, tokens: &TokenStore) -> bool {
        self.is_live(id, tokens)
    }

    /// How an API request's cookie authenticates it. Reads need only the session; any
    /// other method also needs `X-CSRF-Token` equal to the session's CSRF token (a page
    /// of another site can make the browser send the cookie, but cannot read the token).
    pub fn authenticate(&self, tokens: &TokenStore, method: &Method, headers: &HeaderMap) -> CookieAuth {
        let Some(id) = cookie(headers, COOKIE) else { return CookieAuth::None };
        let Some(signed_in) = self.live(tokens, id) else { return CookieAuth::None };
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
    pub fn csrf_matches(&self, tokens: &TokenStore, headers: &HeaderMap, sent: &str) -> bool {
        self.current(tokens, headers).is_some_and(|s| same(sent, &s.csrf))
    }
}

/// The `Set-Cookie` value for a new session.
pub fn set_cookie(id: &str) -> String {
    format!("{COOKIE}={id}; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age={}", SESSION_TTL.as_secs())
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age=0")
}
