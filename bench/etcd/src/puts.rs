//! Durable puts: N clients, each on its own connection (its own `Client`), put new keys
//! with `value_bytes` values for a while. etcd answers a put after the raft entry holding
//! it is in its fsynced WAL: the same durability as hive's `201 Created`.
//!
//! With `creates`, each put is the transaction hive's store on etcd sends for a create
//! (`src/store/etcd`): put the key if its mod revision is 0 (it does not exist yet),
//! otherwise read it back.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::table::{fmt_count, CpuMeter, Row};

/// What one level did.
pub struct PutRun {
    pub clients: usize,
    pub creates: bool,
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
        Row::new(format!("etcd durable {what}, {} client(s)", self.clients), result, Some(&self.latencies))
    }
}

/// `clients` clients put new keys for `duration`; each first puts one key outside the
/// clock, so connection setup is not measured.
pub async fn level(
    endpoint: &str,
    clients: usize,
    duration: Duration,
    value_bytes: usize,
    creates: bool,
    pid: Option<u32>,
) -> Result<Row> {
    let barrier = std::sync::Arc::new(Barrier::new(clients + 1));
    let mut tasks = JoinSet::new();
    for client in 0..clients {
        let mut etcd = Client::connect([endpoint], None).await.context("connecting to etcd")?;
        let barrier = barrier.clone();
        let value = vec![b'v'; value_bytes];
        tasks.spawn(async move {
            let warmed = etcd.put(format!("/bench/put/c{clients}/{client}/warm"), value.clone(), None).await;
            barrier.wait().await;
            warmed.context("warm-up put")?;
            let started = Instant::now();
            let mut run = PutRun {
                clients: 1,
                creates,
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
                let key = format!("/bench/put/c{clients}/{client}/{seq}");
                let sent = Instant::now();
                let answer = if creates {
                    let txn = Txn::new()
                        .when([Compare::mod_revision(key.clone(), CompareOp::Equal, 0)])
                        .and_then([TxnOp::put(key.clone(), value.clone(), None)])
                        .or_else([TxnOp::get(key, None)]);
                    etcd.txn(txn).await.and_then(|t| {
                        if t.succeeded() {
                            Ok(())
                        } else {
                            Err(etcd_client::Error::InvalidArgs("the key existed".into()))
                        }
                    })
                } else {
                    etcd.put(key, value.clone(), None).await.map(|_| ())
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
                etcd.put(format!("/bench/fill/{client}/{n}"), value.clone(), None).await.context("a fill put")?;
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.context("a fill client panicked")??;
    }
    Ok(started.elapsed())
}
