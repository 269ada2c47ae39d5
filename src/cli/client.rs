//! The one HTTP client of the CLI: base URL, CA and bearer token come from the
//! kubeconfig; every answer is either the JSON body or an [`ApiError`] carrying the
//! server's `Status`, and every transport failure names the server it could not reach.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use hive_api::meta::StatusDetails;
use hive_api::{Status, WatchEvent};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::{HeaderMap, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// `Accept` for server-side printing (kubectl's table negotiation), falling back to JSON.
pub const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
/// `Accept` / `Content-Type` for plain JSON.
pub const JSON: &str = "application/json";
/// `Content-Type` of a server-side apply patch (the body may be JSON, which is YAML).
pub const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// Characters kept verbatim in a query value or path segment (RFC 3986 unreserved).
const ENCODE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// Percent-encodes one path segment or query value.
pub fn encode(value: &str) -> String {
    utf8_percent_encode(value, ENCODE).to_string()
}

/// A query string built in order: `Query::default().push("limit", "500").to_string()`
/// is `?limit=500`; empty queries render as the empty string.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Query(Vec<(String, String)>);

impl Query {
    /// Appends `key=value`.
    pub fn push(mut self, key: &str, value: impl AsRef<str>) -> Query {
        self.0.push((key.to_string(), value.as_ref().to_string()));
        self
    }

    /// Appends `key=value` when `value` is present and not empty.
    pub fn push_opt(self, key: &str, value: Option<impl AsRef<str>>) -> Query {
        match value {
            Some(v) if !v.as_ref().is_empty() => self.push(key, v),
            _ => self,
        }
    }
}

impl std::fmt::Display for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (key, value)) in self.0.iter().enumerate() {
            let sep = if i == 0 { '?' } else { '&' };
            write!(f, "{sep}{}={}", encode(key), encode(value))?;
        }
        Ok(())
    }
}

/// A failed request, as the server described it in its `Status` (or as we reconstructed
/// it from the HTTP code when the body was not a `Status`).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The server's `Status`.
    pub status: Status,
    /// What we were doing, e.g. `error when applying "agent.yaml"`; kubectl puts it
    /// between the reason and the message.
    pub operation: Option<String>,
}

impl ApiError {
    /// Wraps a `Status`.
    pub fn new(status: Status) -> ApiError {
        ApiError { status, operation: None }
    }

    /// Builds the error for a non-2xx answer: the body's `Status` when it is one,
    /// otherwise one made from the code and whatever text the body holds.
    pub fn from_response(code: u16, body: &[u8]) -> ApiError {
        if let Ok(mut status) = serde_json::from_slice::<Status>(body) {
            if status.kind == "Status" {
                if status.code == 0 {
                    status.code = code;
                }
                if status.reason.is_empty() {
                    status.reason = reason_for(code).to_string();
                }
                return ApiError::new(status);
            }
        }
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        let message = if text.is_empty() || text.starts_with('{') || text.starts_with('<') {
            default_message(code).to_string()
        } else {
            text.chars().take(300).collect()
        };
        ApiError::new(Status::failure(code, reason_for(code), message))
    }

    /// The HTTP code.
    pub fn code(&self) -> u16 {
        self.status.code
    }

    /// The kubectl rendering: `Error from server (NotFound): agents.hive.dev "x" not
    /// found`; 422s list one cause per line; 401 asks the user to log in.
    pub fn render(&self) -> String {
        let status = &self.status;
        let message = if status.message.is_empty() { default_message(status.code) } else { &status.message };
        if status.code == 401 {
            return format!("error: You must be logged in to the server ({message})");
        }
        if status.code == 422 || status.reason == "Invalid" {
            let details = status.details.clone().unwrap_or_default();
            let subject = invalid_subject(&details);
            if details.causes.is_empty() {
                return format!("{subject}: {message}");
            }
            return details
                .causes
                .iter()
                .map(|c| match (c.field.is_empty(), c.message.is_empty()) {
                    (false, false) => format!("{subject}: {}: {}", c.field, c.message),
                    (false, true) => format!("{subject}: {}", c.field),
                    (true, _) => format!("{subject}: {}", c.message),
                })
                .collect::<Vec<_>>()
                .join("\n");
        }
        let reason = if status.reason.is_empty() { reason_for(status.code) } else { &status.reason };
        match &self.operation {
            Some(op) => format!("Error from server ({reason}): {op}: {message}"),
            None => format!("Error from server ({reason}): {message}"),
        }
    }
}

fn invalid_subject(details: &StatusDetails) -> String {
    if details.kind.is_empty() && details.name.is_empty() {
        "The request is invalid".to_string()
    } else {
        format!("The {} {:?} is invalid", details.kind, details.name)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

impl std::error::Error for ApiError {}

/// The `ApiError` inside `err`, if the failure came from the server.
pub fn api_error(err: &anyhow::Error) -> Option<&ApiError> {
    err.chain().find_map(|e| e.downcast_ref::<ApiError>())
}

/// True when `err` is the server saying 404.
pub fn is_not_found(err: &anyhow::Error) -> bool {
    api_error(err).is_some_and(|e| e.code() == 404)
}

/// Records what we were doing when the server refused, kubectl-style
/// (`Error from server (BadRequest): error when applying "a.yaml": …`).
pub fn with_operation(err: anyhow::Error, operation: impl Into<String>) -> anyhow::Error {
    match err.downcast::<ApiError>() {
        Ok(mut api) => {
            api.operation = Some(operation.into());
            anyhow::Error::new(api)
        }
        Err(other) => other.context(operation.into()),
    }
}

/// Reads a server answer as `T` (a kind or its list), naming what did not decode and
/// where: `the server sent a malformed NodeList at items[0].spec.logicalId: …`. Fields
/// the CLI does not know are ignored, so an answer from a newer server still reads.
pub fn decode<T: DeserializeOwned>(body: &Value, what: &str) -> Result<T> {
    hive_api::resource::decode::<T>(body).map(|(typed, _unknown)| typed).map_err(|e| {
        let at = if e.field.is_empty() { String::new() } else { format!(" at {}", e.field) };
        anyhow!("the server sent a malformed {what}{at}: {}", e.message)
    })
}

/// Kubernetes' reason for an HTTP code, for errors whose body carried none.
pub fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

fn default_message(code: u16) -> &'static str {
    match code {
        400 => "the server rejected our request for an unknown reason",
        401 => "Unauthorized",
        403 => "the server does not allow access to the requested resource",
        404 => "the server could not find the requested resource",
        405 => "the server does not allow this method on the requested resource",
        409 => "the server reported a conflict",
        410 => "the requested resource version is too old",
        415 => "the server does not support the media type of the request",
        422 => "the server rejected our request due to an error in our request",
        429 => "the server has received too many requests and has asked us to try again later",
        500 => "an error on the server has prevented the request from succeeding",
        503 => "the server is currently unable to handle the request",
        504 => "the server was unable to return a response in the time allotted",
        _ => "an error on the server has prevented the request from succeeding",
    }
}

/// The server could not be reached (DNS, TCP, TLS) or the connection broke.
#[derive(Debug)]
pub struct ConnectError {
    /// The server URL from the kubeconfig.
    pub server: String,
    /// Why, innermost causes included (`Connection refused (os error 111)`).
    pub cause: String,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unable to connect to the server at {}: {}", self.server, self.cause)
    }
}

impl std::error::Error for ConnectError {}

/// The readable part of a reqwest error: its source chain without the generic wrapper
/// lines (`error sending request for url …`, `client error (Connect)`).
fn transport_cause(err: &reqwest::Error) -> String {
    if err.is_timeout() {
        return "the request timed out".to_string();
    }
    let mut parts: Vec<String> = Vec::new();
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        let text = e.to_string();
        let generic = text.starts_with("client error (") || text.starts_with("error sending request");
        if !generic && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = e.source();
    }
    if parts.is_empty() {
        err.to_string()
    } else {
        parts.join(": ")
    }
}

/// A successful answer: HTTP code and JSON body.
#[derive(Debug, Clone)]
pub struct Response {
    /// 200, 201, …
    pub code: u16,
    /// The parsed body (`Value::Null` when empty).
    pub body: Value,
}

/// The CLI's connection to one hive server.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    server: String,
    token: Option<String>,
}

impl Client {
    /// Reads the kubeconfig (flag, then `$HIVE_KUBECONFIG`, then the default path) and
    /// builds a client for its current context.
    pub fn from_kubeconfig(flag: Option<&Path>) -> Result<Client> {
        let path = crate::auth::kubeconfig::resolve_path(flag).ok_or_else(|| {
            anyhow!(
                "no kubeconfig found: pass --kubeconfig PATH, set HIVE_KUBECONFIG, \
                 or start a server with `hive serve` (it writes one)"
            )
        })?;
        // Both name the file in their errors.
        let resolved = crate::auth::kubeconfig::load(&path)?.current()?;
        Client::new(&resolved.server, resolved.ca_pem.as_deref(), resolved.token.clone(), resolved.insecure)
    }

    /// A client for `server` that trusts only `ca_pem` (or, with `insecure`, any
    /// certificate) and sends `token` as a bearer token.
    pub fn new(server: &str, ca_pem: Option<&[u8]>, token: Option<String>, insecure: bool) -> Result<Client> {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .connect_timeout(Duration::from_secs(10))
            .user_agent(format!("hive/{}", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .context("the kubeconfig's certificate-authority-data is not valid PEM")?;
            if certs.is_empty() {
                anyhow::bail!("the kubeconfig's certificate-authority-data holds no certificate");
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        if insecure {
            builder = builder.danger_accept_invalid_certs(true);
        }
        let http = builder.build().context("cannot build the HTTP client")?;
        Ok(Client { http, server: server.trim_end_matches('/').to_string(), token })
    }

    /// The server URL, for messages.
    pub fn server(&self) -> &str {
        &self.server
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        accept: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<reqwest::Response> {
        let url = format!("{}{}", self.server, path);
        let mut req = self.http.request(method, &url).header(ACCEPT, accept);
        if let Some(token) = &self.token {
            req = req.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        if let Some((content_type, bytes)) = body {
            req = req.header(CONTENT_TYPE, content_type).body(bytes);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| ConnectError { server: self.server.clone(), cause: transport_cause(&e) })?;
        print_warnings(resp.headers());
        let code = resp.status().as_u16();
        if resp.status().is_success() {
            return Ok(resp);
        }
        let bytes = resp.bytes().await.unwrap_or_default();
        Err(ApiError::from_response(code, &bytes).into())
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        accept: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Response> {
        let resp = self.send(method, path, accept, body).await?;
        let code = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ConnectError { server: self.server.clone(), cause: transport_cause(&e) })?;
        let body = if bytes.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .with_context(|| format!("the server at {} sent a response that is not JSON", self.server))?
        };
        Ok(Response { code, body })
    }

    /// `GET path` as JSON.
    pub async fn get(&self, path: &str) -> Result<Value> {
        Ok(self.call(Method::GET, path, JSON, None).await?.body)
    }

    /// `GET path`, with 404 as `None`.
    pub async fn get_opt(&self, path: &str) -> Result<Option<Value>> {
        match self.get(path).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `GET path` asking for a server-side `Table` (the server may still answer with a
    /// plain object or list).
    pub async fn get_table(&self, path: &str) -> Result<Value> {
        Ok(self.call(Method::GET, path, TABLE_ACCEPT, None).await?.body)
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        Ok(self.call(Method::POST, path, JSON, Some((JSON, serde_json::to_vec(body)?))).await?.body)
    }

    /// `PUT path` with a JSON body.
    pub async fn put(&self, path: &str, body: &Value) -> Result<Value> {
        Ok(self.call(Method::PUT, path, JSON, Some((JSON, serde_json::to_vec(body)?))).await?.body)
    }

    /// `PATCH path` with the given patch content type; the code tells 201 (created by
    /// an apply) from 200.
    pub async fn patch(&self, path: &str, content_type: &str, body: &Value) -> Result<Response> {
        self.call(Method::PATCH, path, JSON, Some((content_type, serde_json::to_vec(body)?))).await
    }

    /// `DELETE path` with a `DeleteOptions` body.
    pub async fn delete(&self, path: &str, body: &Value) -> Result<Value> {
        Ok(self.call(Method::DELETE, path, JSON, Some((JSON, serde_json::to_vec(body)?))).await?.body)
    }

    /// `GET path` as a byte stream (`text/plain` logs), read with [`TextStream::next`].
    pub async fn stream(&self, path: &str) -> Result<TextStream> {
        let response = self.send(Method::GET, path, "text/plain", None).await?;
        Ok(TextStream { response, server: self.server.clone() })
    }

    /// Opens a watch stream (`path` must carry `watch=true`).
    pub async fn watch(&self, path: &str, accept: &str) -> Result<Watch> {
        let response = self.send(Method::GET, path, accept, None).await?;
        Ok(Watch { response, buffer: Vec::new(), done: false, server: self.server.clone() })
    }
}

/// Prints the server's `Warning: 299 - "text"` headers as kubectl does.
fn print_warnings(headers: &HeaderMap) {
    for value in headers.get_all("warning") {
        if let Ok(text) = value.to_str() {
            super::terminal::eprint_line(&format!("Warning: {}", warning_text(text)));
        }
    }
}

/// The text of an RFC 7234 warning value (`299 - "unknown field \"x\""`).
fn warning_text(value: &str) -> String {
    let mut parts = value.splitn(3, ' ');
    let (_code, _agent, rest) = (parts.next(), parts.next(), parts.next());
    match rest.map(str::trim) {
        Some(quoted) if quoted.starts_with('"') => {
            let inner = &quoted[1..];
            let mut out = String::new();
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => out.extend(chars.next()),
                    '"' => break,
                    c => out.push(c),
                }
            }
            out
        }
        _ => value.to_string(),
    }
}

/// An open `text/plain` stream (a log).
#[derive(Debug)]
pub struct TextStream {
    response: reqwest::Response,
    server: String,
}

impl TextStream {
    /// The next chunk of bytes, or `None` once the server has closed the stream.
    pub async fn next(&mut self) -> Result<Option<bytes::Bytes>> {
        self.response.chunk().await.map_err(|e| {
            ConnectError {
                server: self.server.clone(),
                cause: format!("log stream broke: {}", transport_cause(&e)),
            }
            .into()
        })
    }
}

/// An open watch: newline-delimited `{"type","object"}` events.
#[derive(Debug)]
pub struct Watch {
    response: reqwest::Response,
    buffer: Vec<u8>,
    done: bool,
    server: String,
}

impl Watch {
    /// The next event, or `None` once the server has closed the stream.
    pub async fn next(&mut self) -> Result<Option<WatchEvent>> {
        loop {
            if let Some(pos) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=pos).collect();
                if let Some(event) = parse_event(&line)? {
                    return Ok(Some(event));
                }
                continue;
            }
            if self.done {
                let rest = std::mem::take(&mut self.buffer);
                return parse_event(&rest);
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.buffer.extend_from_slice(&bytes),
                Ok(None) => self.done = true,
                // A connection dropped between two events lost nothing: treat it as
                // the end of the stream, as kubectl does. Mid-event, it is an error.
                Err(_) if self.buffer.iter().all(u8::is_ascii_whitespace) => self.done = true,
                Err(e) => {
                    return Err(ConnectError {
                        server: self.server.clone(),
                        cause: format!("watch stream broke: {}", transport_cause(&e)),
                    }
                    .into())
                }
            }
        }
    }
}

fn parse_event(line: &[u8]) -> Result<Option<WatchEvent>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let event: WatchEvent = serde_json::from_slice(line).with_context(|| {
        format!(
            "malformed watch event: {}",
            String::from_utf8_lossy(line).chars().take(200).collect::<String>()
        )
    })?;
    Ok(Some(event))
}

/// The `ApiError` an in-stream `ERROR` event carries.
pub fn event_error(event: &WatchEvent) -> ApiError {
    match serde_json::from_value::<Status>(event.object.clone()) {
        Ok(status) => ApiError::new(status),
        Err(_) => {
            ApiError::new(Status::failure(500, "InternalError", format!("watch error: {}", event.object)))
        }
    }
}

#[cfg(test)]
mod tests {
    use hive_api::meta::StatusCause;
    use serde_json::json;

    use super::*;

    #[test]
    fn a_malformed_answer_names_the_type_and_the_field() {
        let list = json!({"items": [{"metadata": {"name": "node-1"}, "spec": {"logicalId": "one"}}]});
        let err = decode::<hive_api::NodeList>(&list, "NodeList").unwrap_err().to_string();
        assert!(
            err.starts_with("the server sent a malformed NodeList at items[0].spec.logicalId: "),
            "{err}"
        );
        let err = decode::<hive_api::Node>(&json!({"status": {"phase": "Exploded"}}), "Node").unwrap_err();
        assert!(err.to_string().contains("at status.phase: unknown variant `Exploded`"), "{err}");
        // What a newer server adds does not stop an older CLI from reading the rest.
        let node: hive_api::Node =
            decode(&json!({"metadata": {"name": "n"}, "spec": {"logicalId": 1, "later": 1}}), "Node")
                .unwrap();
        assert_eq!(node.metadata.name, "n");
    }

    #[test]
    fn query_encodes_selectors() {
        let q = Query::default()
            .push("fieldSelector", "metadata.name=a1")
            .push("labelSelector", "app in (x,y)")
            .push_opt("continue", None::<&str>)
            .push_opt("limit", Some(""));
        assert_eq!(q.to_string(), "?fieldSelector=metadata.name%3Da1&labelSelector=app%20in%20%28x%2Cy%29");
        assert_eq!(Query::default().to_string(), "");
    }

    #[test]
    fn not_found_renders_like_kubectl() {
        let body = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"NotFound","code":404,"message":"agents.hive.dev \"nope\" not found"}"#;
        let err = ApiError::from_response(404, body);
        assert_eq!(err.render(), r#"Error from server (NotFound): agents.hive.dev "nope" not found"#);
        let mut with_op = err.clone();
        with_op.operation = Some("error when applying \"a.yaml\"".into());
        assert_eq!(
            with_op.render(),
            r#"Error from server (NotFound): error when applying "a.yaml": agents.hive.dev "nope" not found"#
        );
    }

    #[test]
    fn invalid_prints_one_cause_per_line() {
        let mut status = Status::failure(422, "Invalid", "Agent.hive.dev \"x\" is invalid: …");
        status.details = Some(StatusDetails {
            name: "x".into(),
            kind: "Agent".into(),
            causes: vec![
                StatusCause {
                    reason: "FieldValueInvalid".into(),
                    message: "Invalid value: \"-1\": must be >= 0".into(),
                    field: "spec.a".into(),
                },
                StatusCause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value".into(),
                    field: "spec.b".into(),
                },
            ],
            ..Default::default()
        });
        assert_eq!(
            ApiError::new(status).render(),
            "The Agent \"x\" is invalid: spec.a: Invalid value: \"-1\": must be >= 0\n\
             The Agent \"x\" is invalid: spec.b: Required value"
        );
    }

    #[test]
    fn non_status_bodies_keep_the_code() {
        let err = ApiError::from_response(404, b"");
        assert_eq!(
            err.render(),
            "Error from server (NotFound): the server could not find the requested resource"
        );
        let err = ApiError::from_response(503, b"upstream down\n");
        assert_eq!(err.render(), "Error from server (ServiceUnavailable): upstream down");
        let err = ApiError::from_response(
            401,
            br#"{"kind":"Status","status":"Failure","apiVersion":"v1","code":401,"message":"Unauthorized"}"#,
        );
        assert_eq!(err.render(), "error: You must be logged in to the server (Unauthorized)");
    }

    #[test]
    fn warning_header_text_is_unquoted() {
        assert_eq!(warning_text(r#"299 - "unknown field \"spec.bogus\"""#), r#"unknown field "spec.bogus""#);
        assert_eq!(warning_text("garbage"), "garbage");
    }

    #[test]
    fn with_operation_targets_api_errors_only() {
        let err = anyhow::Error::new(ApiError::from_response(400, b"bad"));
        let err = with_operation(err, "error when applying \"x.yaml\"");
        assert_eq!(api_error(&err).unwrap().operation.as_deref(), Some("error when applying \"x.yaml\""));
        let err = with_operation(anyhow!("io"), "reading");
        assert_eq!(format!("{err:#}"), "reading: io");
    }
}
