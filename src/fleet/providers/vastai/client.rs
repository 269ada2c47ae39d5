//! The HTTP client: the calls, the ambiguous-create rule, retries and redaction.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use hive_api::provider::{OfferFilter, ProviderState, VastaiProvider};
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::*;
use crate::auth::SecretForms;

/// The client's settings.
#[derive(Clone, Debug)]
pub struct VastConfig {
    /// Base URL of the v0 API, e.g. [`DEFAULT_BASE_URL`]. The v1 list endpoint is the
    /// same URL with its final `/v0` replaced by `/v1`.
    pub base_url: String,
    /// The key.
    pub api_key: ApiKey,
    /// CA certificates (PEM) to trust for an `https` base URL; `None` reads the system
    /// bundle (`SSL_CERT_FILE`, or the usual paths).
    pub ca_pem: Option<Vec<u8>>,
    /// Timeout of one request.
    pub request_timeout: Duration,
    /// Timeout of connecting.
    pub connect_timeout: Duration,
    /// Backoff on 429 and retryable failures.
    pub retry: RetryPolicy,
    /// After an ambiguous create whose label is not listed yet, how long to wait before
    /// listing once more (a fresh instance may take a moment to appear in the list).
    pub settle: Duration,
}

impl VastConfig {
    /// Defaults for `api_key`: the public API, 30 s requests, default backoff, 5 s settle.
    pub fn new(api_key: ApiKey) -> VastConfig {
        VastConfig {
            base_url: DEFAULT_BASE_URL.into(),
            api_key,
            ca_pem: None,
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            settle: Duration::from_secs(5),
        }
    }

    /// Defaults overridden by a Provider's settings (its `baseUrl`).
    pub fn from_settings(settings: &VastaiProvider, api_key: ApiKey) -> VastConfig {
        let mut config = VastConfig::new(api_key);
        if let Some(base) = &settings.base_url {
            config.base_url = base.clone();
        }
        config
    }
}

pub(super) const CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/ssl/certs/ca-bundle.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

pub(super) fn system_roots() -> Result<Vec<u8>, VastError> {
    let env = crate::host::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from);
    for path in env.into_iter().chain(CA_BUNDLES.iter().map(std::path::PathBuf::from)) {
        if let Ok(pem) = std::fs::read(&path) {
            return Ok(pem);
        }
    }
    Err(VastError::Config("no CA certificate bundle found to verify Vast.ai: set SSL_CERT_FILE".into()))
}

/// A Vast.ai API client. Cheap to clone.
#[derive(Clone)]
pub struct VastClient {
    http: reqwest::Client,
    base: String,
    pub(super) v1: String,
    key: ApiKey,
    /// Every form of the key, masked in whatever text the client passes on.
    forms: Arc<SecretForms>,
    retry: RetryPolicy,
    settle: Duration,
}

impl fmt::Debug for VastClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VastClient")
            .field("base_url", &self.base)
            .field("api_key", &self.key)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// One answer of the server.
pub(super) struct Reply {
    status: StatusCode,
    body: Value,
    text: String,
    retry_after: Option<Duration>,
}

/// One request that got no answer.
pub(super) enum Lost {
    /// Nothing was sent (connecting failed).
    NotSent(String),
    /// Sent, but the answer was lost (timeout, reset, body cut off).
    Unknown(String),
}

/// What a call ended with when it may not be repeated blindly.
pub(super) enum Outcome {
    Reply(Reply),
    Unknown(String),
}

/// Whether a call may be repeated after a lost answer or a 502/503/504.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Repeat {
    Safe,
    Never,
}

pub(super) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !out.contains(&next) {
            out.push_str(": ");
            out.push_str(&next);
        }
        source = s.source();
    }
    out
}

impl VastClient {
    /// A client for `config`.
    pub fn new(config: VastConfig) -> Result<VastClient, VastError> {
        let base = config.base_url.trim_end_matches('/').to_string();
        let scheme_ok = base.starts_with("https://") || base.starts_with("http://");
        if !scheme_ok || base.contains(char::is_whitespace) {
            return Err(VastError::Config("the base URL must be an http(s) URL".into()));
        }
        if base.contains("api_key") {
            return Err(VastError::Config(
                "the base URL must not carry the API key; it is sent as a header".into(),
            ));
        }
        let v1 = match base.strip_suffix("/v0") {
            Some(root) => format!("{root}/v1"),
            None => base.clone(),
        };
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .user_agent(format!("hive/{}", env!("CARGO_PKG_VERSION")));
        if base.starts_with("https://") {
            let pem = match config.ca_pem {
                Some(pem) => pem,
                None => system_roots()?,
            };
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|_| VastError::Config("the CA certificates are not valid PEM".into()))?;
            if certs.is_empty() {
                return Err(VastError::Config("the CA bundle holds no certificate".into()));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| VastError::Config(error_chain(&e.without_url())))?;
        let forms = Arc::new(SecretForms::of(&config.api_key.0));
        Ok(VastClient {
            http,
            base,
            v1,
            key: config.api_key,
            forms,
            retry: config.retry,
            settle: config.settle,
        })
    }

    /// The v0 base URL in use.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// `text` without the key in any of its forms (see [`SecretForms`]: case variants,
    /// URL, JSON and base64 encodings), without any `api_key=` value, and cut to a sane
    /// length (after masking, so a cut never leaves part of a key unmasked).
    pub(super) fn redact(&self, text: &str) -> String {
        let mut out = self.scrub(text);
        if out.chars().count() > MAX_DETAIL {
            out = out.chars().take(MAX_DETAIL).collect::<String>() + "…";
        }
        out
    }

    /// [`VastClient::redact`] without the cut, for messages this client composes.
    pub(super) fn scrub(&self, text: &str) -> String {
        let mut out = self.forms.redact(text, REDACTED);
        let mut from = 0;
        // Any `api_key=` value, whoever's key it is, in any letter case (ASCII lowercasing
        // keeps byte offsets).
        while let Some(at) = out.to_ascii_lowercase()[from..].find("api_key=").map(|i| i + from) {
            let start = at + "api_key=".len();
            let end = out[start..].find(['&', ' ', '"', '\'', ')', '\n']).map_or(out.len(), |i| i + start);
            out.replace_range(start..end, REDACTED);
            from = start + REDACTED.len();
        }
        out
    }

    /// What the server said, for an error: its `msg`/`message`/`error`/`detail`, else the
    /// text; redacted.
    fn detail(&self, reply: &Reply) -> String {
        let b = &reply.body;
        let said =
            ["msg", "message", "detail", "error"].iter().find_map(|k| b[*k].as_str().map(str::to_string));
        let said = said.unwrap_or_else(|| reply.text.trim().to_string());
        if said.is_empty() {
            format!("HTTP {}", reply.status.as_u16())
        } else {
            self.redact(&said)
        }
    }

    async fn send_once(
        &self,
        method: &Method,
        url: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Reply, Lost> {
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", self.key.0))
            .map_err(|_| Lost::NotSent("the API key cannot be sent in a header".into()))?;
        auth.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, auth);
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let mut request = self.http.request(method.clone(), url).headers(headers);
        if !query.is_empty() {
            request = request.query(query);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| {
            let connect = e.is_connect();
            let detail = self.redact(&error_chain(&e.without_url()));
            if connect {
                Lost::NotSent(detail)
            } else {
                Lost::Unknown(detail)
            }
        })?;
        let status = response.status();
        let retry_after =
            response.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(parse_retry_after);
        let bytes = response.bytes().await.map_err(|e| {
            Lost::Unknown(format!(
                "HTTP {}, then {}",
                status.as_u16(),
                self.redact(&error_chain(&e.without_url()))
            ))
        })?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Reply { status, body, text, retry_after })
    }

    /// Sends one call with the backoff policy. 429 is retried for every call; 502/503/504
    /// and lost answers only when `repeat` is `Safe`; a request that was never sent is
    /// always retried. A `Never` call returns a lost answer or a 5xx as it is.
    async fn call(
        &self,
        what: &'static str,
        method: Method,
        url: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        repeat: Repeat,
    ) -> Result<Outcome, VastError> {
        let path = url.strip_prefix(&self.base).or_else(|| url.strip_prefix(&self.v1)).unwrap_or("");
        let max = self.retry.max_attempts.max(1);
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let result = self.send_once(&method, url, query, body).await;
            let (retry_after, reason) = match &result {
                Ok(r) if r.status == StatusCode::TOO_MANY_REQUESTS => {
                    if attempt >= max {
                        tracing::warn!(what, attempt, "vast.ai: still rate-limited; giving up");
                        return Err(VastError::RateLimited { what, attempts: attempt });
                    }
                    if r.retry_after.is_some_and(|d| d > self.retry.max_retry_after) {
                        tracing::warn!(what, attempt, "vast.ai: Retry-After beyond the policy; giving up");
                        return Err(VastError::RateLimited { what, attempts: attempt });
                    }
                    (r.retry_after, "rate limited (429)".to_string())
                }
                Ok(r)
                    if repeat == Repeat::Safe && matches!(r.status.as_u16(), 502..=504) && attempt < max =>
                {
                    (r.retry_after, format!("HTTP {}", r.status.as_u16()))
                }
                Ok(r) => {
                    tracing::debug!(what, method = %method, path, status = r.status.as_u16(), attempt, "vast.ai call");
                    return Ok(Outcome::Reply(result.ok().expect("matched Ok")));
                }
                Err(Lost::NotSent(d)) if attempt < max => (None, format!("not sent: {d}")),
                Err(Lost::NotSent(d)) => {
                    return Err(VastError::Transport { what, detail: d.clone() });
                }
                Err(Lost::Unknown(d)) if repeat == Repeat::Safe && attempt < max => {
                    (None, format!("lost: {d}"))
                }
                Err(Lost::Unknown(d)) if repeat == Repeat::Safe => {
                    return Err(VastError::Transport { what, detail: d.clone() });
                }
                Err(Lost::Unknown(d)) => {
                    tracing::warn!(what, method = %method, path, attempt, error = %d, "vast.ai: answer lost");
                    return Ok(Outcome::Unknown(d.clone()));
                }
            };
            let delay = backoff_delay(&self.retry, attempt, retry_after, jitter());
            tracing::info!(
                what,
                method = %method,
                path,
                attempt,
                reason = %reason,
                retry_after_ms = retry_after.map(|d| d.as_millis() as u64),
                delay_ms = delay.as_millis() as u64,
                "vast.ai: backing off"
            );
            tokio::time::sleep(delay).await;
        }
    }

    async fn call_safe(
        &self,
        what: &'static str,
        method: Method,
        url: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Reply, VastError> {
        match self.call(what, method, url, query, body, Repeat::Safe).await? {
            Outcome::Reply(r) => Ok(r),
            Outcome::Unknown(detail) => Err(VastError::Transport { what, detail }),
        }
    }

    /// The error for an unsuccessful answer to `what`.
    fn failed(&self, what: &'static str, reply: &Reply) -> VastError {
        let status = reply.status.as_u16();
        match status {
            401 | 403 => VastError::Unauthorized { status },
            500..=599 => VastError::Server { what, status, detail: self.detail(reply) },
            _ => VastError::Rejected { what, status, detail: self.detail(reply) },
        }
    }

    /// The offers matching `filter`, cheapest first: `POST /bundles/` with
    /// [`offer_query`], re-checked on this side with [`offer_matches`]. Leases nothing.
    pub async fn search_offers(&self, filter: &OfferFilter) -> Result<Vec<Offer>, VastError> {
        let url = format!("{}/bundles/", self.base);
        let body = offer_query(filter, SEARCH_LIMIT);
        let reply = self.call_safe("search", Method::POST, &url, &[], Some(&body)).await?;
        if !reply.status.is_success() {
            return Err(self.failed("search", &reply));
        }
        let Some(list) = reply.body["offers"].as_array() else {
            return Err(VastError::Protocol { what: "search", detail: "no \"offers\" list".into() });
        };
        let mut offers: Vec<Offer> =
            list.iter().filter_map(Offer::from_json).filter(|o| offer_matches(filter, o)).collect();
        offers.sort_by(|a, b| a.dollars_per_hour.total_cmp(&b.dollars_per_hour));
        tracing::debug!(found = offers.len(), returned = list.len(), "vast.ai offers searched");
        Ok(offers)
    }

    /// Creates an instance from exactly `offer_id` with `label` (see
    /// [`instance_label`]), `image` and `onstart`; see [`VastClient::create_instance`].
    pub async fn create(
        &self,
        offer_id: u64,
        label: &str,
        image: &str,
        onstart: Option<&str>,
    ) -> Result<InstanceId, VastError> {
        let request = CreateRequest::new(offer_id, label, image, onstart.map(str::to_string));
        Ok(self.create_instance(&request).await?.id)
    }

    /// Creates an instance from exactly `request.offer_id`. An ambiguous failure
    /// (timeout, lost connection, 5xx, an answer without `new_contract`) is settled by
    /// looking for `request.label` before anything is sent again: found → adopted; not
    /// found → one retry. Rate limits (429) are backed off; nothing else is retried. An
    /// offer that is gone is [`VastError::OfferUnavailable`]; no other offer is tried.
    pub async fn create_instance(&self, request: &CreateRequest) -> Result<Created, VastError> {
        request.check()?;
        let offer_id = request.offer_id;
        let label = request.label.as_str();
        let url = format!("{}/asks/{offer_id}/", self.base);
        let body = request.body();
        let mut why = String::new();
        for sent in 1..=2u32 {
            let outcome = self.call("create", Method::PUT, &url, &[], Some(&body), Repeat::Never).await?;
            why = match outcome {
                Outcome::Reply(reply) => {
                    // Vast can answer an error and still have created (dstack saw it):
                    // a `new_contract` is always believed.
                    if let Some(id) = uint(&reply.body["new_contract"]) {
                        if !reply.status.is_success() || reply.body["success"] == false {
                            tracing::warn!(
                                offer_id,
                                label,
                                instance = id,
                                status = reply.status.as_u16(),
                                "vast.ai: create reported an error but named a new instance; keeping it"
                            );
                        }
                        tracing::info!(offer_id, label, instance = id, "vast.ai instance created");
                        return Ok(Created {
                            id: InstanceId(id),
                            adopted: false,
                            duplicates: vec![],
                            creates_sent: sent,
                        });
                    }
                    let gone = matches!(reply.body["error"].as_str(), Some("no_such_ask"));
                    match reply.status.as_u16() {
                        s if gone || s == 404 || s == 410 => {
                            tracing::warn!(offer_id, label, "vast.ai: offer no longer available");
                            let detail = self.detail(&reply);
                            if sent == 1 {
                                return Err(VastError::OfferUnavailable { offer_id, detail });
                            }
                            // The retry found the offer taken: perhaps by the first
                            // create, listed late. Look once more; never claim "nothing
                            // was rented" here.
                            return match self.find_label(label).await {
                                Ok(found) if !found.is_empty() => Ok(adopt(offer_id, label, found, sent)),
                                _ => Err(VastError::Ambiguous {
                                    offer_id,
                                    label: label.into(),
                                    detail: format!(
                                        "{why}; the retry then found the offer taken ({detail}) and no \
                                         instance with the label is listed"
                                    ),
                                }),
                            };
                        }
                        401 | 403 => return Err(VastError::Unauthorized { status: reply.status.as_u16() }),
                        400..=499 => return Err(self.failed("create", &reply)),
                        s if (200..300).contains(&s) => {
                            format!("HTTP {s} without a new instance id: {}", self.detail(&reply))
                        }
                        s => format!("HTTP {s}: {}", self.detail(&reply)),
                    }
                }
                Outcome::Unknown(detail) => detail,
            };
            tracing::warn!(offer_id, label, sent, reason = %why,
                "vast.ai: create outcome unknown; looking for its label before anything else");
            let found = match self.find_label(label).await {
                Ok(found) => found,
                Err(err) => {
                    return Err(VastError::Ambiguous {
                        offer_id,
                        label: label.into(),
                        detail: format!("{why}; looking for the label then failed: {err}"),
                    })
                }
            };
            if !found.is_empty() {
                return Ok(adopt(offer_id, label, found, sent));
            }
            if sent == 1 {
                tracing::info!(
                    offer_id,
                    label,
                    "vast.ai: no instance carries the label; retrying the create once"
                );
            }
        }
        Err(VastError::Ambiguous {
            offer_id,
            label: label.into(),
            detail: format!("{why}; the one retry failed too, and no instance with the label is listed"),
        })
    }

    /// The ids of the instances whose label is exactly `label`, lowest first; lists a
    /// second time after `settle` when the first finds none.
    async fn find_label(&self, label: &str) -> Result<Vec<InstanceId>, VastError> {
        for round in 0..2 {
            let mut ids: Vec<InstanceId> = self
                .list_by_label(label)
                .await?
                .into_iter()
                .filter(|i| i.label.as_deref() == Some(label))
                .map(|i| i.id)
                .collect();
            if !ids.is_empty() || self.settle.is_zero() || round == 1 {
                ids.sort();
                return Ok(ids);
            }
            tokio::time::sleep(self.settle).await;
        }
        Ok(vec![])
    }

    /// One instance (`GET /instances/{id}/`); `None` when Vast.ai has no such instance.
    pub async fn show(&self, id: InstanceId) -> Result<Option<Instance>, VastError> {
        let url = format!("{}/instances/{id}/", self.base);
        let reply = self.call_safe("show", Method::GET, &url, &[], None).await?;
        if reply.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !reply.status.is_success() {
            return Err(self.failed("show", &reply));
        }
        let value = &reply.body["instances"];
        if value.is_null() {
            return Ok(None);
        }
        Instance::from_json(value)
            .map(Some)
            .ok_or_else(|| VastError::Protocol { what: "show", detail: "the instance has no id".into() })
    }

    /// Every instance of the account (`GET /api/v1/instances/`, all pages).
    pub async fn list_instances(&self) -> Result<Vec<Instance>, VastError> {
        let url = format!("{}/instances/", self.v1);
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut query = vec![("limit", LIST_PAGE.to_string())];
            if let Some(token) = &after {
                query.push(("after_token", token.clone()));
            }
            let reply = self.call_safe("list", Method::GET, &url, &query, None).await?;
            if !reply.status.is_success() {
                return Err(self.failed("list", &reply));
            }
            let Some(page) = reply.body["instances"].as_array() else {
                return Err(VastError::Protocol { what: "list", detail: "no \"instances\" list".into() });
            };
            out.extend(page.iter().filter_map(Instance::from_json));
            let next = match &reply.body["next_token"] {
                Value::String(s) if !s.is_empty() => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            };
            if next.is_none() || next == after || page.is_empty() {
                return Ok(out);
            }
            after = next;
        }
        Err(VastError::Protocol { what: "list", detail: format!("more than {MAX_PAGES} pages") })
    }

    /// The instances whose label starts with `prefix` (e.g. [`LABEL_PREFIX`] for all of
    /// hive's, or one full label), filtered on this side.
    pub async fn list_by_label(&self, prefix: &str) -> Result<Vec<Instance>, VastError> {
        let all = self.list_instances().await?;
        Ok(all.into_iter().filter(|i| i.label.as_deref().is_some_and(|l| l.starts_with(prefix))).collect())
    }

    /// Destroys an instance (`DELETE /instances/{id}/`). Idempotent: an instance that is
    /// already gone is [`Destroyed::AlreadyGone`].
    pub async fn destroy(&self, id: InstanceId) -> Result<Destroyed, VastError> {
        let url = format!("{}/instances/{id}/", self.base);
        let reply = self.call_safe("destroy", Method::DELETE, &url, &[], None).await?;
        let gone = matches!(reply.body["error"].as_str(), Some("no_such_instance" | "not_found"));
        if reply.status == StatusCode::NOT_FOUND || gone {
            tracing::info!(instance = id.0, "vast.ai instance already gone");
            return Ok(Destroyed::AlreadyGone);
        }
        if !reply.status.is_success() || reply.body["success"] == false {
            return Err(self.failed("destroy", &reply));
        }
        tracing::info!(instance = id.0, "vast.ai instance destroyed");
        Ok(Destroyed::Destroyed)
    }

    /// The credential check for ConfigureProvider: `GET /users/current/`. 401/403 is a
    /// `ConfigurationError` saying the key was refused (never quoting it); any other
    /// failure is a `ConfigurationError` saying what failed.
    pub async fn validate(&self) -> Readiness {
        let url = format!("{}/users/current/", self.base);
        // Every part is redacted already; the whole once more, as it becomes a status.
        let error = |message: String| Readiness {
            state: ProviderState::ConfigurationError,
            message: self.scrub(&message),
        };
        let reply = match self.call_safe("validate", Method::GET, &url, &[], None).await {
            Ok(reply) => reply,
            Err(err) => return error(format!("checking the Vast.ai credentials failed: {err}")),
        };
        if reply.status.is_success() {
            let user = uint(&reply.body["id"]).map(|id| format!(" (user {id})")).unwrap_or_default();
            tracing::info!("vast.ai credentials accepted");
            return Readiness {
                state: ProviderState::Ready,
                message: format!("Vast.ai accepted the API key{user}"),
            };
        }
        let err = self.failed("validate", &reply);
        tracing::warn!(status = reply.status.as_u16(), "vast.ai credential check failed");
        match err {
            VastError::Unauthorized { .. } => {
                error(format!("{err}; configure a current key (apiKeyFile, apiKeyEnv or ConfigureProvider)"))
            }
            other => error(format!("checking the Vast.ai credentials failed: {other}")),
        }
    }
}
