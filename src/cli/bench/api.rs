//! The bench's HTTP client: one connection pool per simulated client, talking to the
//! daemon's public REST API directly (the status code without parsing every body, the
//! raw bytes of a list), and the Agents it writes.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use bytes::Bytes;
use hive_api::AgentList;
use serde_json::{json, Value};

/// Where Agents are created, listed and watched.
pub(super) const AGENTS: &str = "/apis/hive.dev/v1/agents";
/// The annotation carrying a watch-phase write's send time (Unix nanoseconds).
pub(super) const SENT_ANNOTATION: &str = "bench.hive.dev/sent-ns";
/// The annotation naming a watch-phase write: `load:seq`.
pub(super) const WRITE_ANNOTATION: &str = "bench.hive.dev/write";
/// The label the update phase changes on each replace.
pub(super) const UPDATE_LABEL: &str = "bench.hive.dev/update";
/// Most bytes a body's `Content-Length` may reserve before any arrives (a list of
/// 1,000,000 Agents is ~700 MiB; a larger one grows as it comes).
const MAX_PRESIZE: u64 = 1 << 30;
/// Longest any single create or list may take before the run fails.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How to reach the daemon.
#[derive(Clone)]
pub(super) struct Endpoint {
    pub(super) url: Arc<str>,
    pub(super) ca_pem: Arc<[u8]>,
    pub(super) token: Arc<str>,
}

/// One simulated client: its own connection pool, so its own keep-alive connection(s).
/// A clone shares the pool (the open-loop writer's tasks do).
#[derive(Clone)]
pub(super) struct Api {
    pub(super) http: reqwest::Client,
    pub(super) endpoint: Endpoint,
}

impl Endpoint {
    /// A new HTTP/1.1 client; `timeout` bounds each whole request (none for watches).
    pub(super) fn api(&self, timeout: Option<Duration>) -> Result<Api> {
        self.client(timeout, false)
    }

    /// A new client that speaks HTTP/2 (ALPN `h2`): its requests share one connection.
    pub(super) fn api_http2(&self, timeout: Option<Duration>) -> Result<Api> {
        self.client(timeout, true)
    }

    fn client(&self, timeout: Option<Duration>, http2: bool) -> Result<Api> {
        let mut builder = reqwest::Client::builder().use_rustls_tls().tls_built_in_root_certs(false);
        if !http2 {
            builder = builder.http1_only();
        }
        let mut builder = builder.tcp_nodelay(true).connect_timeout(Duration::from_secs(10));
        for cert in
            reqwest::Certificate::from_pem_bundle(&self.ca_pem).context("the daemon's CA is not PEM")?
        {
            builder = builder.add_root_certificate(cert);
        }
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        Ok(Api { http: builder.build().context("building an HTTP client")?, endpoint: self.clone() })
    }
}

impl Api {
    pub(super) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.endpoint.url)).bearer_auth(&self.endpoint.token)
    }

    /// POSTs an Agent; the status code and body.
    pub(super) async fn create(&self, body: Vec<u8>) -> Result<(u16, Bytes)> {
        let resp = self
            .request(reqwest::Method::POST, AGENTS)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await?;
        let code = resp.status().as_u16();
        Ok((code, resp.bytes().await?))
    }

    /// GETs `path` as JSON; fails unless 200. The body is read chunk by chunk into one
    /// buffer sized by its `Content-Length`, as it arrives: collecting it whole
    /// (`Response::bytes`) kept every chunk of a 70 MB list and then copied them into a
    /// new buffer — the first full list after a fill took 500 ms that way, 320 ms this
    /// way (curl: ~110 ms).
    pub(super) async fn get(&self, path: &str) -> Result<Bytes> {
        let mut resp = self
            .request(reqwest::Method::GET, path)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await?;
        let code = resp.status().as_u16();
        let stated = resp.content_length().unwrap_or(0).min(MAX_PRESIZE);
        let mut body = Vec::with_capacity(usize::try_from(stated).unwrap_or(0));
        while let Some(chunk) = resp.chunk().await? {
            body.extend_from_slice(&chunk);
        }
        ensure!(code == 200, "GET {path}: HTTP {code}: {}", snippet(&body));
        Ok(Bytes::from(body))
    }

    /// The number of Agents and the current revision, from a one-item list.
    pub(super) async fn list_head(&self) -> Result<(usize, u64)> {
        let body = self.get(&format!("{AGENTS}?limit=1")).await?;
        let list: Value = serde_json::from_slice(&body).context("the list is not JSON")?;
        let list: AgentList = crate::cli::client::decode(&list, "AgentList")?;
        list_head(&list).context("the list has no resourceVersion")
    }
}

pub(super) fn list_head(list: &AgentList) -> Option<(usize, u64)> {
    let remaining = list.metadata.remaining_item_count.and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
    let revision = list.metadata.resource_version.as_deref()?.parse().ok()?;
    Some((list.items.len() + remaining, revision))
}

pub(super) fn snippet(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(300).collect()
}

/// What a watch-phase write carries in its annotations, so that every watcher can tell
/// which write of which load it received and when that write was sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Stamp {
    /// The watch load (its index in `--watch-loads`) the write belongs to.
    pub(super) load: usize,
    /// The write's number within its load, from 0.
    pub(super) seq: usize,
    /// Wall-clock Unix nanoseconds when the create was sent.
    pub(super) sent_ns: u128,
}

impl Stamp {
    /// The value of [`WRITE_ANNOTATION`]: `load:seq`.
    fn write_id(&self) -> String {
        format!("{}:{}", self.load, self.seq)
    }

    /// Reads a stamp back from a write's two annotation values.
    pub(super) fn parse(write_id: &str, sent_ns: &str) -> Option<Stamp> {
        let (load, seq) = write_id.split_once(':')?;
        Some(Stamp { load: load.parse().ok()?, seq: seq.parse().ok()?, sent_ns: sent_ns.parse().ok()? })
    }
}

/// A valid Agent, as small as the `agent()` fixture of the integration tests but with a
/// local config path; with a `stamp`, carrying it for the watch measurement.
pub(super) fn agent(name: &str, stamp: Option<&Stamp>) -> Vec<u8> {
    agent_marked(name, stamp, None)
}

/// [`agent`], with the label [`UPDATE_LABEL`] set to `mark` when one is given (each of
/// the update phase's replaces changes it).
pub(super) fn agent_marked(name: &str, stamp: Option<&Stamp>, mark: Option<&str>) -> Vec<u8> {
    let mut labels = serde_json::Map::from_iter([("app".to_owned(), json!("bench"))]);
    if let Some(mark) = mark {
        labels.insert(UPDATE_LABEL.to_owned(), json!(mark));
    }
    let mut metadata = json!({"name": name, "labels": labels});
    if let Some(stamp) = stamp {
        metadata["annotations"] =
            json!({SENT_ANNOTATION: stamp.sent_ns.to_string(), WRITE_ANNOTATION: stamp.write_id()});
    }
    let object = json!({
        "apiVersion": "hive.dev/v1",
        "kind": "Agent",
        "metadata": metadata,
        "spec": {
            // A local path that does not exist: nothing may ever fetch it over the network.
            "config": {"repo": "/nonexistent/hive-bench/config.git", "rev": "main"},
            "runtime": {"type": "process", "process": {"command": ["./run.sh"]}}
        }
    });
    serde_json::to_vec(&object).expect("a JSON value serializes")
}

/// Wall-clock Unix nanoseconds: the watch measurement compares times taken in two
/// tasks, so it needs a clock both read (the daemon's clock plays no part).
pub(super) fn wall_ns() -> u128 {
    crate::host::now().timestamp_nanos_opt().map_or(0, |n| u128::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_heads_count_the_remaining_items() {
        let list = json!({"metadata": {"resourceVersion": "17", "remainingItemCount": 4}, "items": [{}]});
        let head = |list: Value| list_head(&crate::cli::client::decode(&list, "AgentList").expect("a list"));
        assert_eq!(head(list), Some((5, 17)));
        assert_eq!(head(json!({"metadata": {"resourceVersion": "3"}, "items": []})), Some((0, 3)));
    }

    #[test]
    fn stamps_read_back_what_writes_carry() {
        let stamp = Stamp { load: 1, seq: 42, sent_ns: 7 };
        let body: Value = serde_json::from_slice(&agent("w", Some(&stamp))).unwrap();
        let annotations = &body["metadata"]["annotations"];
        let read = |key: &str| annotations[key].as_str().unwrap().to_string();
        assert_eq!(Stamp::parse(&read(WRITE_ANNOTATION), &read(SENT_ANNOTATION)), Some(stamp));
        assert_eq!(Stamp::parse("1", "7"), None);
        assert_eq!(Stamp::parse("a:1", "7"), None);
    }

    /// The update phase's replaces each carry their mark beside the creates' label, and
    /// are valid Agents as the creates are.
    #[test]
    fn a_marked_agent_carries_its_mark_beside_the_bench_label() {
        let marked: Value = serde_json::from_slice(&agent_marked("u-1", None, Some("0-7"))).unwrap();
        let plain: Value = serde_json::from_slice(&agent("u-1", None)).unwrap();
        assert_eq!(marked["metadata"]["labels"], json!({"app": "bench", UPDATE_LABEL: "0-7"}));
        assert_eq!(plain["metadata"]["labels"], json!({"app": "bench"}));
        assert_eq!(marked["spec"], plain["spec"]);
        crate::cli::client::decode::<hive_api::Agent>(&marked, "Agent").expect("a valid Agent");
    }
}
