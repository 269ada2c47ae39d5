//! Scheduler overhead, measured with an executor that does nothing: how long the
//! scheduler itself takes per node (submit with validation, readiness, resources,
//! spawning the node task, completion, roll-up, publishing) for one big DAG and for
//! many small concurrent ones. A later `hive bench` subcommand prints this report.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hive_api::job::{Edge, JobNode, JobNodeKind, JobTemplate};
use hive_api::JobSpec;
use tokio::sync::Notify;

use super::{
    Executor, JobSink, JobUpdate, NodeError, NodeOutcome, NodeRun, Scheduler, SchedulerConfig,
    SchedulerHandle,
};

/// One measured scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measurement {
    /// What ran, e.g. `chain of 10000 nodes`.
    pub label: String,
    /// Nodes run in total.
    pub nodes: usize,
    /// From the first submit until every DAG was reported terminal.
    pub total: Duration,
    /// `total / nodes`: the scheduler's overhead per node.
    pub per_node: Duration,
}

/// The three scenarios of [`bench_overhead`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchReport {
    /// One DAG whose nodes form a chain (each depends on the previous).
    pub chain: Measurement,
    /// One DAG: a root and every other node depending on it.
    pub fan: Measurement,
    /// Many concurrent 4-node DAGs (a graceful-stop shape), one agent each.
    pub dags: Measurement,
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for m in [&self.chain, &self.fan, &self.dags] {
            writeln!(f, "{:<40} {:>10.2?} total {:>8.2?}/node", m.label, m.total, m.per_node)?;
        }
        Ok(())
    }
}

/// Runs every node successfully, at once.
struct NoopExecutor;

impl Executor for NoopExecutor {
    async fn run(&self, _node: NodeRun) -> Result<NodeOutcome, NodeError> {
        Ok(NodeOutcome::default())
    }
}

/// Wakes the benchmark once `remaining` DAGs were reported terminal.
struct DoneSink {
    remaining: AtomicUsize,
    done: Arc<Notify>,
}

impl JobSink for Arc<DoneSink> {
    fn publish(&self, updates: Vec<JobUpdate>) {
        for update in updates {
            if let JobUpdate::Changed(snapshot) = update {
                if snapshot.finished_at.is_some() && self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                    self.done.notify_one();
                }
            }
        }
    }
}

/// Measures the scheduler's overhead per node for one `nodes`-node DAG (as a chain and
/// as a wide fan) and for `dags` concurrent 4-node DAGs, with a no-op executor. Runs on
/// the caller's tokio runtime.
pub async fn bench_overhead(nodes: usize, dags: usize) -> BenchReport {
    let nodes = nodes.max(2);
    let chain = (0..nodes)
        .map(|i| {
            let node = JobNode::new(format!("n{i}"), JobNodeKind::Reconcile, Some("bench"));
            if i == 0 {
                node
            } else {
                node.after(format!("n{}", i - 1), Edge::AfterOk)
            }
        })
        .collect();
    let fan = (0..nodes)
        .map(|i| {
            let node = JobNode::new(format!("n{i}"), JobNodeKind::Reconcile, Some("bench"));
            if i == 0 {
                node
            } else {
                node.after("n0", Edge::AfterOk)
            }
        })
        .collect();
    let small: Vec<JobSpec> = (0..dags).map(|i| stop_shape(&format!("agent-{i}"))).collect();
    // A Job holds at most `MAX_NODES` (5,000): more nodes are measured as that many DAGs
    // of the shape, run at once.
    let per = hive_api::job::MAX_NODES;
    let parts =
        |nodes: Vec<JobNode>| -> Vec<JobSpec> { nodes.chunks(per).map(|part| spec(rebase(part))).collect() };
    BenchReport {
        chain: measure(format!("chain of {nodes} nodes"), parts(chain)).await,
        fan: measure(format!("fan of {nodes} nodes"), parts(fan)).await,
        dags: measure(format!("{dags} concurrent DAGs of 4 nodes"), small).await,
    }
}

/// A part of a chain or fan as a DAG of its own: deps on nodes outside it are dropped.
fn rebase(part: &[JobNode]) -> Vec<JobNode> {
    let ids: std::collections::HashSet<&str> = part.iter().map(|n| n.id.as_str()).collect();
    let mut part = part.to_vec();
    for node in &mut part {
        node.deps.retain(|d| ids.contains(d.node.as_str()));
    }
    if let Some(first) = part.first().map(|n| n.id.clone()) {
        // A fan's later parts hang off their own first node.
        for node in part.iter_mut().skip(1) {
            if node.deps.is_empty() {
                node.deps.push(hive_api::job::Dep { node: first.clone(), edge: Edge::AfterOk });
            }
        }
    }
    part
}

fn spec(nodes: Vec<JobNode>) -> JobSpec {
    JobSpec { template: JobTemplate::Reconcile, nodes, ..Default::default() }
}

fn stop_shape(agent: &str) -> JobSpec {
    use JobNodeKind::*;
    let nodes = vec![
        JobNode::new("wanted", SetWanted, Some(agent)),
        JobNode::new("signal", Signal, Some(agent)).after("wanted", Edge::AfterOk),
        JobNode::new("drain", Drain, Some(agent)).after("signal", Edge::AfterOk),
        JobNode::new("reconcile", Reconcile, Some(agent)).after("drain", Edge::AfterOk),
    ];
    JobSpec { template: JobTemplate::Stop, nodes, ..Default::default() }
}

async fn measure(label: String, specs: Vec<JobSpec>) -> Measurement {
    let nodes: usize = specs.iter().map(|s| s.nodes.len()).sum();
    let done = Arc::new(Notify::new());
    let sink = Arc::new(DoneSink { remaining: AtomicUsize::new(specs.len()), done: done.clone() });
    // Keep every DAG in history so none is dropped before it is counted.
    let config = SchedulerConfig { history_per_template: specs.len(), ..SchedulerConfig::default() };
    let scheduler: SchedulerHandle = Scheduler::start(NoopExecutor, sink, config);
    let started = Instant::now();
    for (i, spec) in specs.into_iter().enumerate() {
        scheduler.submit(format!("bench-{i}"), spec).await.expect("benchmark DAGs are valid");
    }
    done.notified().await;
    let total = started.elapsed();
    scheduler.shutdown().await;
    Measurement { label, nodes, total, per_node: total / nodes.max(1) as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bench_runs_small() {
        let report = bench_overhead(200, 20).await;
        assert_eq!(report.chain.nodes, 200);
        assert_eq!(report.fan.nodes, 200);
        assert_eq!(report.dags.nodes, 80);
        println!("{report}");
    }

    /// The full-size run; `cargo test --release -p hive --lib scheduler::bench -- \
    /// --ignored --nocapture` prints the numbers for docs/benchmarks.md. 10,000 nodes are
    /// two DAGs of 5,000 (a Job's most).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "full-size benchmark; run in release"]
    async fn bench_full_size() {
        println!("{}", bench_overhead(10_000, 1_000).await);
    }
}
