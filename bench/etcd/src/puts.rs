//! Durable puts: N clients, each on its own connection (its own `Client`), put new keys
//! with `value_bytes` values for a while. etcd answers a put after the raft entry holding
//! it is in its fsynced WAL: the same durability as hive's `201 Created`.
//!
//! With `creates`, each put is the transaction hive's store on etcd sends for a create
//! (`src/store/etcd`): put the key if its mod revision is 0 (it does not exist yet),
//! otherwise read it back.
//!
//! With `gateway`, each client sends its puts or transactions as JSON to etcd's gRPC
//! gateway (`/v3/kv/put`, `/v3/kv/txn`) over its own HTTP/1.1 connection, as hive's
//! store on etcd does: the gateway's cost, measured against the same calls over gRPC.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::table::{fmt_count, CpuMeter, Row};

/// What one level did.
pub struct PutRun {
    pub clients: usize,
    pub creates: bool,
    pub gateway: bool,
    pub acked: usize,
    pub failed: usize,
    pub first_failure: Option<String>,
    pub elapsed: Duration,
    pub latencies: Vec<Duration>,
}

impl PutRun {
    pub fn row(&self) -> Row {
        let rate = self.acked as f64 / self.elapsed.as_secs_f64().max(1e-9);
        let mut result = format!(
            "{}/s ({} in {:.1}s)",
            fmt_count(rate as u64),
            fmt_count(self.acked as u64),
            self.elapsed.as_secs_f64()
        );
        if self.failed > 0 {
            result +=
                &format!("; {} failed, first: {}", self.failed, self.first_failure.as_deref().unwrap_or("?"));
        }
        let what = if self.creates { "creates (txn)" } else { "puts" };
        let what = if self.gateway { format!("{what} via the JSON gateway") } else { what.to_owned() };
        Row::new(format!("etcd durable {what}, {} client(s)", self.clients), result, Some(&self.latencies))
    }
}

/// One put level: how many clients, for how long, what each sends and how.
pub struct Level {
    pub clients: usize,
    pub duration: Duration,
    pub value_bytes: usize,
    /// Each put the create transaction.
    pub creates: bool,
    /// Through etcd's JSON gateway instead of gRPC.
    pub gateway: bool,
}

/// `level.clients` clients put new keys for `level.duration`; each first puts one key
/// outside the clock, so connection setup is not measured.
pub async fn level(endpoint: &str, level: &Level, pid: Option<u32>) -> Result<Row> {
    let &Level { clients, duration, value_bytes, creates, gateway } = level;
    let barrier = std::sync::Arc::new(Barrier::new(clients + 1));
    let mut tasks = JoinSet::new();
    for client in 0..clients {
        let mut etcd = Client::connect([endpoint], None).await.context("connecting to etcd")?;
        let json = Gateway::new(endpoint)?;
        let barrier = barrier.clone();
        let value = vec![b'v'; value_bytes];
        // Each way of sending has keys of its own: a create finds its key absent.
        let via = if gateway { "g" } else { "" };
        tasks.spawn(async move {
            let warm = format!("/bench/put/{via}c{clients}/{client}/warm");
            let warmed = if gateway {
                json.put(&warm, &value).await
            } else {
                etcd.put(warm, value.clone(), None).await.map(|_| ()).map_err(Into::into)
            };
            barrier.wait().await;
            warmed.context("warm-up put")?;
            let started = Instant::now();
            let mut run = PutRun {
                clients: 1,
                creates,
                gateway,
                acked: 0,
                failed: 0,
                first_failure: None,
                elapsed: Duration::ZERO,
                latencies: Vec::new(),
            };
            for seq in 0.. {
                if started.elapsed() >= duration {
                    break;
                }
                let key = format!("/bench/put/{via}c{clients}/{client}/{seq}");
                let sent = Instant::now();
                let answer = if gateway {
                    if creates {
                        json.create(&key, &value).await
                    } else {
                        json.put(&key, &value).await
                    }
                } else if creates {
                    let txn = Txn::new()
                        .when([Compare::mod_revision(key.clone(), CompareOp::Equal, 0)])
                        .and_then([TxnOp::put(key.clone(), value.clone(), None)])
                        .or_else([TxnOp::get(key, None)]);
                    etcd.txn(txn)
                        .await
                        .and_then(|t| {
                            if t.succeeded() {
                                Ok(())
                            } else {
                                Err(etcd_client::Error::InvalidArgs("the key existed".into()))
                            }
                        })
                        .map_err(Into::into)
                } else {
                    etcd.put(key, value.clone(), None).await.map(|_| ()).map_err(Into::into)
                };
                match answer {
                    Ok(()) => {
                        run.latencies.push(sent.elapsed());
                        run.acked += 1;
                    }
                    Err(e) => {
                        run.failed += 1;
                        run.first_failure.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            anyhow::Ok(run)
        });
    }
    barrier.wait().await;
    let meter = CpuMeter::start(pid);
    let started = Instant::now();
    let mut total = PutRun {
        clients,
        creates,
        gateway,
        acked: 0,
        failed: 0,
        first_failure: None,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    while let Some(joined) = tasks.join_next().await {
        let run = joined.context("a put client panicked")??;
        total.acked += run.acked;
        total.failed += run.failed;
        total.first_failure = total.first_failure.or(run.first_failure);
        total.latencies.extend(run.latencies);
    }
    total.elapsed = started.elapsed();
    Ok(total.row().with_cpu(meter.stop()))
}

/// One client's HTTP/1.1 connection to etcd's JSON gateway.
struct Gateway {
    http: reqwest::Client,
    endpoint: String,
}

impl Gateway {
    fn new(endpoint: &str) -> Result<Gateway> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .tcp_nodelay(true)
            .build()
            .context("an HTTP client for etcd's gateway")?;
        Ok(Gateway { http, endpoint: endpoint.trim_end_matches('/').to_owned() })
    }

    async fn call(&self, path: &str, body: String) -> Result<String> {
        let response = self.http.post(format!("{}{path}", self.endpoint)).body(body).send().await?;
        let status = response.status();
        let text = response.text().await?;
        anyhow::ensure!(status.is_success(), "HTTP {status}: {text}");
        Ok(text)
    }

    async fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let body = format!(r#"{{"key":"{}","value":"{}"}}"#, B64.encode(key), B64.encode(value));
        self.call("/v3/kv/put", body).await.map(|_| ())
    }

    /// The create transaction hive's store sends, as its gateway client writes it.
    async fn create(&self, key: &str, value: &[u8]) -> Result<()> {
        let key = B64.encode(key);
        let body = format!(
            r#"{{"compare":[{{"result":"EQUAL","target":"MOD","key":"{key}","mod_revision":"0"}}],"success":[{{"request_put":{{"key":"{key}","value":"{}"}}}}],"failure":[{{"request_range":{{"key":"{key}"}}}}]}}"#,
            B64.encode(value)
        );
        let answer = self.call("/v3/kv/txn", body).await?;
        anyhow::ensure!(answer.contains(r#""succeeded":true"#), "the key existed");
        Ok(())
    }
}

/// Puts `keys` new keys of `value_bytes` under `/bench/fill/` with `clients` clients, for
/// a restart with that many keys to be timed (`run.sh` with `ETCD_RESTART=1`).
pub async fn fill(endpoint: &str, keys: usize, clients: usize, value_bytes: usize) -> Result<Duration> {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for client in 0..clients.max(1) {
        let mut etcd = Client::connect([endpoint], None).await.context("connecting to etcd")?;
        let next = next.clone();
        let value = vec![b'v'; value_bytes];
        tasks.spawn(async move {
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= keys {
                    return anyhow::Ok(());
                }
                etcd.put(format!("/bench/fill/{client}/{n}"), value.clone(), None)
                    .await
                    .context("a fill put")?;
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.context("a fill client panicked")??;
    }
    Ok(started.elapsed())
}
