//! A small client of etcd's v3 JSON gateway (`/v3/kv/range`, `/v3/kv/txn`, `/v3/watch`,
//! `/v3/lease/*`, `/v3/kv/compaction`), served on every member's client port since etcd
//! 3.4. It speaks the gateway's JSON (keys and values in base64, 64-bit numbers as
//! strings) over the HTTP client hive already has, so the default build needs neither
//! gRPC nor `protoc`.
//!
//! Endpoints are tried in turn: a request that could not be sent (no connection) moves
//! on to the next member at once. A request that was sent and then failed — a timeout,
//! a dropped connection — may have been applied; [`GatewayError::Indeterminate`] says
//! so, and the caller resolves it (see `etcd::resolve`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Value};

/// How long one unary request may take before it is given up (and, for a write,
/// resolved by reading back).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a gateway request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    /// No member could be reached: nothing was sent, so nothing was applied.
    #[error("no etcd member answers ({endpoints}): {last}")]
    Unreachable {
        /// The members tried.
        endpoints: String,
        /// The last connection error.
        last: String,
    },
    /// The request was sent but no answer came back: it may or may not have been applied.
    #[error("etcd did not answer in time ({endpoint}): {message}")]
    Indeterminate {
        /// The member the request went to.
        endpoint: String,
        /// What went wrong.
        message: String,
    },
    /// etcd answered with an error (a gRPC status through the gateway).
    #[error("etcd refused the request: {message}")]
    Refused {
        /// The gRPC status code.
        code: i64,
        /// etcd's message, e.g. `etcdserver: too many operations in txn request`.
        message: String,
    },
}

impl GatewayError {
    /// etcd's "required revision has been compacted" (a range or watch below the
    /// compacted revision).
    pub fn is_compacted(&self) -> bool {
        matches!(self, GatewayError::Refused { message, .. } if message.contains("compacted"))
    }

    /// etcd's refusal of a transaction over its request limits (`--max-txn-ops`,
    /// `--max-request-bytes`).
    pub fn is_too_large(&self) -> bool {
        matches!(self, GatewayError::Refused { message, .. }
            if message.contains("too many operations") || message.contains("request is too large"))
    }
}

/// A key and its value as etcd holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: u64,
    pub mod_revision: u64,
    pub lease: i64,
}

/// One change of a watch: a put, or a delete with the value it removed.
#[derive(Clone, Debug)]
pub struct WatchEvent {
    pub deleted: bool,
    pub kv: KeyValue,
    pub prev: Option<KeyValue>,
}

/// One message of a watch stream.
#[derive(Debug, Default)]
pub struct WatchResponse {
    /// The store's revision when the message was sent.
    pub revision: u64,
    pub created: bool,
    pub canceled: bool,
    /// Set when the watch started below the compacted revision.
    pub compact_revision: u64,
    pub cancel_reason: String,
    pub events: Vec<WatchEvent>,
}

/// A comparison of a transaction's guard.
#[derive(Clone, Debug)]
pub enum Compare {
    /// The key was last written at this revision (0: the key does not exist).
    ModRevision(Vec<u8>, u64),
    /// The key was created at this revision (0: the key does not exist).
    CreateRevision(Vec<u8>, u64),
}

/// An operation of a transaction.
#[derive(Clone, Debug)]
pub enum Op {
    Put { key: Vec<u8>, value: Vec<u8>, lease: i64 },
    Delete { key: Vec<u8> },
    Get { key: Vec<u8> },
}

/// What a transaction did.
#[derive(Debug)]
pub struct TxnResponse {
    /// The store's revision after it: the transaction's own when it wrote something.
    pub revision: u64,
    pub succeeded: bool,
    /// For each `Get` of the branch taken, in order: the key's value, if it exists.
    pub gets: Vec<Option<KeyValue>>,
}

/// A page of a range read.
#[derive(Debug)]
pub struct RangeResponse {
    pub revision: u64,
    pub kvs: Vec<KeyValue>,
    pub more: bool,
}

/// A client of one etcd cluster's JSON gateway.
pub struct Gateway {
    http: reqwest::Client,
    /// `http://host:port` of each member.
    endpoints: Vec<String>,
    /// The member that answered last: tried first.
    current: AtomicUsize,
}

impl Gateway {
    /// A client of the members at `endpoints` (`host:port` or `http://host:port`).
    pub fn new(endpoints: &[String]) -> Result<Gateway, GatewayError> {
        let endpoints: Vec<String> =
            endpoints
                .iter()
                .map(|e| {
                    if e.contains("://") {
                        e.trim_end_matches('/').to_owned()
                    } else {
                        format!("http://{e}")
                    }
                })
                .collect();
        let http = reqwest::Client::builder()
            .http1_only()
            .connect_timeout(Duration::from_secs(1))
            .pool_max_idle_per_host(64)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| GatewayError::Unreachable { endpoints: endpoints.join(","), last: e.to_string() })?;
        Ok(Gateway { http, endpoints, current: AtomicUsize::new(0) })
    }

    /// The members, as `http://host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Sends `body` to `path` on the first member that takes the connection, starting
    /// with the one that answered last, and returns its JSON answer. `timeout: None`
    /// is for streams, which the caller reads as long as it likes.
    async fn send(
        &self,
        path: &str,
        body: &Value,
        timeout: Option<Duration>,
    ) -> Result<(String, reqwest::Response), GatewayError> {
        let start = self.current.load(Ordering::Relaxed);
        let mut last = String::new();
        for i in 0..self.endpoints.len() {
            let index = (start + i) % self.endpoints.len();
            let endpoint = &self.endpoints[index];
            let mut request = self.http.post(format!("{endpoint}{path}")).json(body);
            if let Some(timeout) = timeout {
                request = request.timeout(timeout);
            }
            match request.send().await {
                Ok(response) => {
                    self.current.store(index, Ordering::Relaxed);
                    return Ok((endpoint.clone(), response));
                }
                Err(e) if e.is_connect() => last = format!("{endpoint}: {e}"),
                Err(e) => {
                    // Sent (perhaps), then lost: the next member is tried next time.
                    self.current.store((index + 1) % self.endpoints.len(), Ordering::Relaxed);
                    return Err(GatewayError::Indeterminate {
                        endpoint: endpoint.clone(),
                        message: e.to_string(),
                    });
                }
            }
        }
        Err(GatewayError::Unreachable { endpoints: self.endpoints.join(","), last })
    }

    /// A unary call: `body` to `path`, the answer parsed.
    async fn call(&self, path: &str, body: &Value) -> Result<Value, GatewayError> {
        let (endpoint, response) = self.send(path, body, Some(REQUEST_TIMEOUT)).await?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| GatewayError::Indeterminate {
            endpoint: endpoint.clone(),
            message: e.to_string(),
        })?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| GatewayError::Indeterminate {
            endpoint: endpoint.clone(),
            message: format!("unreadable answer ({status}): {e}"),
        })?;
        if let Some(error) = refusal(&value) {
            return Err(error);
        }
        if !status.is_success() {
            return Err(GatewayError::Refused { code: -1, message: format!("HTTP {status}: {value}") });
        }
        Ok(value)
    }

    /// Keys from `key` up to `range_end` (exclusive; empty: `key` alone), at most `limit`
    /// of them (0: all), at `revision` (0: the latest).
    pub async fn range(
        &self,
        key: &[u8],
        range_end: &[u8],
        limit: usize,
        revision: u64,
    ) -> Result<RangeResponse, GatewayError> {
        let mut body = json!({ "key": B64.encode(key) });
        if !range_end.is_empty() {
            body["range_end"] = B64.encode(range_end).into();
        }
        if limit > 0 {
            body["limit"] = limit.to_string().into();
        }
        if revision > 0 {
            body["revision"] = revision.to_string().into();
        }
        let answer: RangeJson = parse(self.call("/v3/kv/range", &body).await?)?;
        Ok(RangeResponse {
            revision: answer.header.revision,
            kvs: answer.kvs.into_iter().map(KeyValue::try_from).collect::<Result<_, _>>()?,
            more: answer.more,
        })
    }

    /// One transaction: if every comparison holds, `success`, else `failure`.
    pub async fn txn(
        &self,
        compare: &[Compare],
        success: &[Op],
        failure: &[Op],
    ) -> Result<TxnResponse, GatewayError> {
        let body = json!({
            "compare": compare.iter().map(compare_json).collect::<Vec<_>>(),
            "success": success.iter().map(op_json).collect::<Vec<_>>(),
            "failure": failure.iter().map(op_json).collect::<Vec<_>>(),
        });
        let answer: TxnJson = parse(self.call("/v3/kv/txn", &body).await?)?;
        let mut gets = Vec::new();
        for response in answer.responses {
            if let Some(range) = response.response_range {
                let kv = range.kvs.into_iter().next().map(KeyValue::try_from).transpose()?;
                gets.push(kv);
            }
        }
        Ok(TxnResponse { revision: answer.header.revision, succeeded: answer.succeeded, gets })
    }

    /// A lease of `ttl` seconds; returns its id and the TTL etcd granted.
    pub async fn grant(&self, ttl: u64) -> Result<(i64, u64), GatewayError> {
        let answer: GrantJson =
            parse(self.call("/v3/lease/grant", &json!({ "TTL": ttl.to_string() })).await?)?;
        Ok((answer.id, answer.ttl))
    }

    /// Renews lease `id` once; returns the TTL left (0: the lease is gone).
    pub async fn keep_alive(&self, id: i64) -> Result<u64, GatewayError> {
        let value = self.call("/v3/lease/keepalive", &json!({ "ID": id.to_string() })).await?;
        let result = value.get("result").cloned().unwrap_or(value);
        let answer: KeepAliveJson = parse(result)?;
        Ok(answer.ttl)
    }

    /// Ends lease `id` and deletes its keys.
    pub async fn revoke(&self, id: i64) -> Result<(), GatewayError> {
        self.call("/v3/kv/lease/revoke", &json!({ "ID": id.to_string() })).await.map(drop)
    }

    /// Drops history up to `revision`.
    pub async fn compact(&self, revision: u64) -> Result<(), GatewayError> {
        self.call("/v3/kv/compaction", &json!({ "revision": revision.to_string(), "physical": false }))
            .await
            .map(drop)
    }

    /// Opens a watch of the keys from `key` up to `range_end`, from `start_revision`,
    /// with the values deletes removed. The stream ends when the connection does.
    pub async fn watch(
        &self,
        key: &[u8],
        range_end: &[u8],
        start_revision: u64,
    ) -> Result<WatchStream, GatewayError> {
        let body = json!({ "create_request": {
            "key": B64.encode(key),
            "range_end": B64.encode(range_end),
            "start_revision": start_revision.to_string(),
            "prev_kv": true,
            "progress_notify": true,
        }});
        let (endpoint, response) = self.send("/v3/watch", &body, None).await?;
        if !response.status().is_success() {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return Err(GatewayError::Refused { code: -1, message: format!("HTTP {status}: {text}") });
        }
        Ok(WatchStream { endpoint, response, buffer: Vec::new() })
    }
}

/// The messages of one watch, as the gateway streams them: one JSON document a line.
pub struct WatchStream {
    endpoint: String,
    response: reqwest::Response,
    buffer: Vec<u8>,
}

/// The longest watch message accepted (etcd's largest value is 1.5 MiB by default; a
/// message may carry many events).
const MAX_WATCH_MESSAGE: usize = 256 << 20;

impl WatchStream {
    /// The member this watch is open on.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The next message; `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Result<WatchResponse, GatewayError>> {
        loop {
            if let Some(end) = memchr::memchr(b'\n', &self.buffer) {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(decode_watch(&line));
            }
            if self.buffer.len() > MAX_WATCH_MESSAGE {
                return Some(Err(GatewayError::Refused {
                    code: -1,
                    message: "watch message too large".into(),
                }));
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) => return None,
                Err(e) => {
                    return Some(Err(GatewayError::Indeterminate {
                        endpoint: self.endpoint.clone(),
                        message: e.to_string(),
                    }))
                }
            }
        }
    }
}

fn decode_watch(line: &[u8]) -> Result<WatchResponse, GatewayError> {
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| GatewayError::Refused { code: -1, message: format!("unreadable watch message: {e}") })?;
    if let Some(error) = value.get("error").and_then(|e| refusal(&json!({ "error": e }))) {
        return Err(error);
    }
    let result = value.get("result").cloned().unwrap_or(Value::Null);
    let answer: WatchJson = parse(result)?;
    let mut events = Vec::with_capacity(answer.events.len());
    for event in answer.events {
        events.push(WatchEvent {
            deleted: event.type_.as_deref() == Some("DELETE"),
            kv: event.kv.try_into()?,
            prev: event.prev_kv.map(KeyValue::try_from).transpose()?,
        });
    }
    Ok(WatchResponse {
        revision: answer.header.revision,
        created: answer.created,
        canceled: answer.canceled,
        compact_revision: answer.compact_revision,
        cancel_reason: answer.cancel_reason,
        events,
    })
}

/// The gateway's error document (`{"error": …, "code": …, "message": …}`), if `value`
/// is one.
fn refusal(value: &Value) -> Option<GatewayError> {
    let object = value.as_object()?;
    let is_error =
        object.contains_key("error") || (object.contains_key("code") && object.contains_key("message"));
    if !is_error {
        return None;
    }
    let code = object.get("code").and_then(Value::as_i64).unwrap_or(-1);
    let message = match object.get("message").and_then(Value::as_str) {
        Some(message) if !message.is_empty() => message.to_owned(),
        _ => match object.get("error") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Object(e)) => e.get("message").and_then(Value::as_str).unwrap_or_default().to_owned(),
            _ => String::new(),
        },
    };
    Some(GatewayError::Refused { code, message })
}

fn parse<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, GatewayError> {
    serde_json::from_value(value)
        .map_err(|e| GatewayError::Refused { code: -1, message: format!("unexpected answer from etcd: {e}") })
}

fn compare_json(compare: &Compare) -> Value {
    match compare {
        Compare::ModRevision(key, revision) => json!({
            "result": "EQUAL", "target": "MOD", "key": B64.encode(key), "mod_revision": revision.to_string(),
        }),
        Compare::CreateRevision(key, revision) => json!({
            "result": "EQUAL", "target": "CREATE", "key": B64.encode(key), "create_revision": revision.to_string(),
        }),
    }
}

fn op_json(op: &Op) -> Value {
    match op {
        Op::Put { key, value, lease } => {
            let mut put = json!({ "key": B64.encode(key), "value": B64.encode(value) });
            if *lease != 0 {
                put["lease"] = lease.to_string().into();
            }
            json!({ "request_put": put })
        }
        Op::Delete { key } => json!({ "request_delete_range": { "key": B64.encode(key) } }),
        Op::Get { key } => json!({ "request_range": { "key": B64.encode(key) } }),
    }
}

/// A 64-bit number as the gateway writes it: a string (or, leniently, a number).
fn number<'de, D: Deserializer<'de>, T: std::str::FromStr + TryFrom<u64>>(d: D) -> Result<T, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Num {
        Text(String),
        Int(u64),
        Signed(i64),
    }
    let bad = || serde::de::Error::custom("not a number");
    match Num::deserialize(d)? {
        Num::Text(s) => s.parse().map_err(|_| bad()),
        Num::Int(n) => T::try_from(n).map_err(|_| bad()),
        Num::Signed(n) => n.to_string().parse().map_err(|_| bad()),
    }
}

#[derive(Deserialize, Default)]
struct HeaderJson {
    #[serde(default, deserialize_with = "number")]
    revision: u64,
}

#[derive(Deserialize, Serialize, Default)]
struct KvJson {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default, deserialize_with = "number")]
    create_revision: u64,
    #[serde(default, deserialize_with = "number")]
    mod_revision: u64,
    #[serde(default, deserialize_with = "number")]
    lease: i64,
}

impl TryFrom<KvJson> for KeyValue {
    type Error = GatewayError;

    fn try_from(kv: KvJson) -> Result<KeyValue, GatewayError> {
        let bad = |e: base64::DecodeError| GatewayError::Refused {
            code: -1,
            message: format!("bad base64 from etcd: {e}"),
        };
        Ok(KeyValue {
            key: B64.decode(kv.key).map_err(bad)?,
            value: B64.decode(kv.value).map_err(bad)?,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            lease: kv.lease,
        })
    }
}

#[derive(Deserialize)]
struct RangeJson {
    #[serde(default)]
    header: HeaderJson,
    #[serde(default)]
    kvs: Vec<KvJson>,
    #[serde(default)]
    more: bool,
}

#[derive(Deserialize)]
struct TxnJson {
    #[serde(default)]
    header: HeaderJson,
    #[serde(default)]
    succeeded: bool,
    #[serde(default)]
    responses: Vec<TxnResponseJson>,
}

#[derive(Deserialize)]
struct TxnResponseJson {
    #[serde(default)]
    response_range: Option<RangeJson>,
}

#[derive(Deserialize)]
struct GrantJson {
    #[serde(rename = "ID", deserialize_with = "number")]
    id: i64,
    #[serde(rename = "TTL", deserialize_with = "number")]
    ttl: u64,
}

#[derive(Deserialize)]
struct KeepAliveJson {
    #[serde(rename = "TTL", default, deserialize_with = "number")]
    ttl: u64,
}

#[derive(Deserialize, Default)]
struct WatchJson {
    #[serde(default)]
    header: HeaderJson,
    #[serde(default)]
    created: bool,
    #[serde(default)]
    canceled: bool,
    #[serde(default, deserialize_with = "number")]
    compact_revision: u64,
    #[serde(default)]
    cancel_reason: String,
    #[serde(default)]
    events: Vec<EventJson>,
}

#[derive(Deserialize)]
struct EventJson {
    #[serde(rename = "type", default)]
    type_: Option<String>,
    #[serde(default)]
    kv: KvJson,
    #[serde(default)]
    prev_kv: Option<KvJson>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_message_decodes_puts_and_deletes_with_their_revisions() {
        let line = br#"{"result":{"header":{"revision":"9"},"events":[{"kv":{"key":"L2hpdmUvYQ==","create_revision":"2","mod_revision":"9","version":"2","value":"e30="}},{"type":"DELETE","kv":{"key":"L2hpdmUvYg==","mod_revision":"9"},"prev_kv":{"key":"L2hpdmUvYg==","create_revision":"3","mod_revision":"4","value":"e30="}}]}}"#;
        let message = decode_watch(line).unwrap();
        assert_eq!(message.revision, 9);
        assert_eq!(message.events.len(), 2);
        assert!(!message.events[0].deleted);
        assert_eq!(message.events[0].kv.key, b"/hive/a");
        assert_eq!((message.events[0].kv.create_revision, message.events[0].kv.mod_revision), (2, 9));
        assert!(message.events[1].deleted);
        assert_eq!(message.events[1].prev.as_ref().unwrap().mod_revision, 4);
    }

    #[test]
    fn a_compacted_watch_and_a_gateway_error_are_told_apart() {
        let line = br#"{"result":{"header":{"revision":"20"},"canceled":true,"compact_revision":"12","cancel_reason":"etcdserver: mvcc: required revision has been compacted"}}"#;
        let message = decode_watch(line).unwrap();
        assert!(message.canceled);
        assert_eq!(message.compact_revision, 12);
        let error = refusal(&json!({"error": "etcdserver: too many operations in txn request", "code": 3, "message": "etcdserver: too many operations in txn request"})).unwrap();
        assert!(error.is_too_large());
        assert!(refusal(&json!({"header": {}})).is_none());
    }
}
