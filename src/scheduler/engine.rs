//! The scheduler task: owns every DAG, receives requests and node completions on one
//! channel, starts ready nodes whose resources are free, and publishes one batch of Job
//! updates per turn.
//!
//! A turn handles every message already waiting (up to a bound), then settles DAGs that
//! became terminal (releasing their leases, applying history), then makes one pass over
//! the dep-ready nodes in (submit order, node order), then publishes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::FutureExt;
use hive_api::{JobSpec, Time};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::dag::{Dag, Ending, RunHandle};
use super::error::{Error, NodeError, Result};
use super::executor::{Executor, NodeContext, NodeOutcome, NodeRun, StepSink};
use super::history::{History, Kept};
use super::log::NodeLog;
use super::resources::{would_deadlock, Resources};
use super::snapshot::{JobSink, JobSnapshot, JobUpdate};
use super::{CancelledJob, SchedulerConfig, SettledJob};

/// Messages handled per turn at most, so requests stay answered under a flood of
/// completions.
const MAX_BATCH: usize = 4096;

/// What the scheduler task receives: requests from handles, and reports from nodes.
#[derive(Debug)]
pub(crate) enum Msg {
    Submit { name: String, spec: Box<JobSpec>, reply: oneshot::Sender<Result<()>> },
    Cancel { name: String, reply: oneshot::Sender<Result<CancelledJob>> },
    CancelChildren { name: String, reply: oneshot::Sender<Result<Vec<CancelledJob>>> },
    Snapshot { name: String, reply: oneshot::Sender<Result<JobSnapshot>> },
    List { reply: oneshot::Sender<Vec<JobSnapshot>> },
    Settled { names: Vec<String>, reply: oneshot::Sender<HashMap<String, bool>> },
    Adopt { jobs: Vec<SettledJob> },
    Log { job: String, node: String, reply: oneshot::Sender<Result<Arc<NodeLog>>> },
    Step { seq: u64, index: u32, label: String },
    Finished { seq: u64, index: u32, result: Result<NodeOutcome, NodeError>, children: Vec<JobSpec> },
    Shutdown { reply: oneshot::Sender<()> },
}

/// What a timer of the engine does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// DAG `seq` reached its deadline.
    Deadline(u64),
    /// Node `.1` of DAG `.0` may run again after a failed try.
    Retry(u64, u32),
}

pub(super) struct Engine<E, S> {
    executor: Arc<E>,
    sink: S,
    config: SchedulerConfig,
    /// For node contexts; weak so the task ends once every handle and node is gone.
    tx: mpsc::WeakUnboundedSender<Msg>,
    dags: BTreeMap<u64, Dag>,
    names: HashMap<String, u64>,
    next_seq: u64,
    /// Dep-ready queued nodes, in the order they compete: the DAG's rank (priority with
    /// aging, see [`Engine::rank`]), then submit order, then node order.
    ready: BTreeSet<(i128, u64, u32)>,
    /// Where ranks are counted from.
    epoch: Instant,
    /// Pending timers, earliest first.
    timers: BTreeSet<(Instant, Timer)>,
    resources: Resources,
    history: History,
    tasks: JoinSet<()>,
    /// DAGs changed this turn, each once (see `touched_set`).
    touched: Vec<u64>,
    touched_set: BTreeSet<u64>,
    created: Vec<JobUpdate>,
    removed: Vec<JobUpdate>,
}

impl<E: Executor, S: JobSink> Engine<E, S> {
    pub(super) fn new(
        executor: E,
        sink: S,
        config: SchedulerConfig,
        tx: mpsc::WeakUnboundedSender<Msg>,
        resources: Resources,
    ) -> Self {
        Engine {
            executor: Arc::new(executor),
            sink,
            history: History::new(config.history_per_template),
            config,
            tx,
            dags: BTreeMap::new(),
            names: HashMap::new(),
            next_seq: 1,
            ready: BTreeSet::new(),
            epoch: Instant::now(),
            timers: BTreeSet::new(),
            resources,
            tasks: JoinSet::new(),
            touched: Vec::new(),
            touched_set: BTreeSet::new(),
            created: Vec::new(),
            removed: Vec::new(),
        }
    }

    /// Begins the history with the terminal Jobs an earlier daemon run left in the
    /// store, oldest first, and publishes at once the removal of those past the kept
    /// number per template.
    pub(super) fn adopt(&mut self, settled: Vec<SettledJob>) {
        for job in settled {
            // Once per name: a Job deleted and settled again under its name is one Job.
            self.history.forget_stored(&job.name);
            let fallen = self.history.record(job.template, Kept::Stored(job.name.into()));
            self.evict(fallen);
        }
        if !self.removed.is_empty() {
            self.sink.publish(std::mem::take(&mut self.removed));
        }
    }

    /// Drops Jobs that fell out of the history and reports each [`JobUpdate::Removed`].
    fn evict(&mut self, fallen: Vec<Kept>) {
        for kept in fallen {
            match kept {
                Kept::Dag(seq) => {
                    if let Some(gone) = self.dags.remove(&seq) {
                        self.names.remove(&*gone.name);
                        self.removed.push(JobUpdate::Removed { name: gone.name.to_string() });
                    }
                }
                Kept::Stored(name) => self.removed.push(JobUpdate::Removed { name: name.to_string() }),
            }
        }
    }

    /// The task loop; returns at shutdown or when every sender is gone. A turn begins
    /// with a message or a timer.
    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        loop {
            let wake = self.timers.first().map(|(at, _)| *at);
            let first = tokio::select! {
                biased;
                msg = rx.recv() => match msg {
                    Some(msg) => Some(msg),
                    None => return,
                },
                () = sleep_until(wake) => None,
            };
            let now = Time(crate::host::now());
            self.fire_timers(now);
            let mut stop = None;
            let mut next = first;
            let mut handled = 0;
            while let Some(msg) = next.take() {
                match msg {
                    Msg::Shutdown { reply } => {
                        stop = Some(reply);
                        break;
                    }
                    msg => self.handle(msg, now),
                }
                handled += 1;
                if handled < MAX_BATCH {
                    next = rx.try_recv().ok();
                }
            }
            self.end_turn(now);
            while self.tasks.try_join_next().is_some() {}
            if let Some(reply) = stop {
                // Running nodes are abandoned; the daemon marks their Jobs interrupted
                // at its next start.
                self.tasks.shutdown().await;
                let _ = reply.send(());
                return;
            }
        }
    }

    /// Runs every timer that is due.
    fn fire_timers(&mut self, now: Time) {
        let due = Instant::now();
        while let Some(&(at, timer)) = self.timers.first() {
            if at > due {
                break;
            }
            self.timers.pop_first();
            match timer {
                Timer::Deadline(seq) => self.deadline(seq, now),
                Timer::Retry(seq, i) => {
                    let Some(dag) = self.dags.get(&seq) else { continue };
                    let node = &dag.nodes[i as usize];
                    if node.state == hive_api::job::JobNodeState::Queued && node.retry_at.is_some() {
                        self.ready.insert((dag.rank, seq, i));
                    }
                }
            }
        }
    }

    /// Where a DAG submitted now at `priority` competes: lower first. Its submit time
    /// less `priority` aging steps — so a Job waiting one step (a minute) since its
    /// submit ranks as one a point higher submitted now. At equal priority that is
    /// submit order; a lower priority waits, but only until its age makes up the
    /// difference: nothing starves.
    fn rank(&self, priority: i32) -> i128 {
        let since = Instant::now().duration_since(self.epoch).as_nanos() as i128;
        since - i128::from(priority) * self.config.aging.as_nanos() as i128
    }

    /// DAG `seq` ran past its deadline: see [`Dag::exceed_deadline`]. Its stoppable
    /// running nodes (builds) are stopped now, failed with why.
    fn deadline(&mut self, seq: u64, now: Time) {
        let Some(dag) = self.dags.get_mut(&seq) else { return };
        if dag.is_terminal() {
            return;
        }
        let mut ready = Vec::new();
        let stop = dag.exceed_deadline(now, &mut ready);
        self.ready.extend(ready.into_iter().map(|i| (dag.rank, seq, i)));
        self.drop_unready(seq);
        for i in stop {
            let Some(run) = self.dags.get_mut(&seq).and_then(|d| d.nodes[i as usize].run.take()) else {
                continue;
            };
            run.abort.abort();
            let error = NodeError::Failed(super::dag::DEADLINE_STOP.into());
            self.finished(seq, i, Err(error), Vec::new(), now);
        }
        self.touch(seq);
    }

    /// Drops from the ready set the nodes of DAG `seq` that are no longer queued.
    fn drop_unready(&mut self, seq: u64) {
        let Some(dag) = self.dags.get(&seq) else { return };
        let rank = dag.rank;
        let stale: Vec<(i128, u64, u32)> = self
            .ready
            .range((rank, seq, 0)..=(rank, seq, u32::MAX))
            .filter(|(_, _, i)| dag.nodes[*i as usize].state != hive_api::job::JobNodeState::Queued)
            .copied()
            .collect();
        for key in stale {
            self.ready.remove(&key);
        }
    }

    fn handle(&mut self, msg: Msg, now: Time) {
        match msg {
            Msg::Submit { name, spec, reply } => {
                let _ = reply.send(self.submit(name, *spec, now).map(|_| ()));
            }
            Msg::Cancel { name, reply } => {
                let _ = reply.send(self.cancel(&name, now));
            }
            Msg::CancelChildren { name, reply } => {
                let _ = reply.send(self.cancel_children(&name, now));
            }
            Msg::Snapshot { name, reply } => {
                let _ = reply.send(self.dag(&name).map(Dag::snapshot));
            }
            Msg::List { reply } => {
                let _ = reply.send(self.dags.values().map(Dag::snapshot).collect());
            }
            Msg::Adopt { jobs } => self.adopt(jobs),
            Msg::Settled { names, reply } => {
                let held = names.into_iter().filter_map(|name| {
                    let finished = self.dag(&name).ok()?.is_finished();
                    Some((name, finished))
                });
                let _ = reply.send(held.collect());
            }
            Msg::Log { job, node, reply } => {
                let _ = reply.send(self.log(&job, &node));
            }
            Msg::Step { seq, index, label } => {
                if let Some(dag) = self.dags.get_mut(&seq) {
                    dag.set_step(index, label);
                    self.touch(seq);
                }
            }
            Msg::Finished { seq, index, result, children } => {
                self.finished(seq, index, result, children, now)
            }
            Msg::Shutdown { .. } => unreachable!("handled by the loop"),
        }
    }

    fn dag(&self, name: &str) -> Result<&Dag> {
        self.names
            .get(name)
            .and_then(|seq| self.dags.get(seq))
            .ok_or_else(|| Error::NotFound { name: name.to_string() })
    }

    fn touch(&mut self, seq: u64) {
        if self.touched_set.insert(seq) {
            self.touched.push(seq);
        }
    }

    /// Adds a validated DAG; its roots become ready. A settled DAG of the same name in
    /// history gives way: a Job is submitted only after its object was stored, so the
    /// object of the one before was deleted, and the name is the new Job's (its old
    /// memory is dropped without a removal, which would delete the new object).
    fn submit(&mut self, name: String, spec: JobSpec, now: Time) -> Result<u64> {
        if let Some(&old) = self.names.get(&name) {
            if !self.dags.get(&old).is_some_and(Dag::is_finished) {
                return Err(Error::AlreadyExists { name });
            }
            self.dags.remove(&old);
            self.names.remove(&name);
            self.history.forget(old);
        }
        self.history.forget_stored(&name);
        let seq = self.next_seq;
        self.next_seq += 1;
        let rank = self.rank(spec.priority);
        let deadline = spec
            .active_deadline_seconds
            .map(|seconds| Instant::now() + std::time::Duration::from_secs(seconds));
        if let Some(at) = deadline {
            self.timers.insert((at, Timer::Deadline(seq)));
        }
        let mut dag = Dag::ranked(seq, rank, deadline, name.as_str().into(), Arc::new(spec), now);
        for (i, node) in dag.spec.nodes.iter().enumerate() {
            let Some(agent) = node.agent.as_deref().filter(|_| node.kind.is_heavy()) else { continue };
            if let Some((host, slots)) = self.config.build_hosts.of(agent) {
                let host: Arc<str> = host.into();
                self.resources.host_slots(&host, slots);
                dag.build_host[i] = Some(host);
            }
        }
        self.ready.extend(dag.roots().map(|i| (rank, seq, i)));
        self.names.insert(name, seq);
        self.dags.insert(seq, dag);
        self.touch(seq);
        Ok(seq)
    }

    fn cancel(&mut self, name: &str, now: Time) -> Result<CancelledJob> {
        let seq = self.dag(name)?.seq;
        self.cancel_seq(seq, now)
    }

    fn cancel_seq(&mut self, seq: u64, now: Time) -> Result<CancelledJob> {
        let dag = self.dags.get_mut(&seq).expect("caller checked");
        if !dag.is_cancellable() {
            return Err(Error::NotCancellable { name: dag.name.to_string(), phase: dag.phase() });
        }
        dag.cancel_all("cancelled while queued", now);
        let cancelled = CancelledJob::of(&dag.name, &dag.spec);
        self.drop_unready(seq);
        self.touch(seq);
        Ok(cancelled)
    }

    fn cancel_children(&mut self, name: &str, now: Time) -> Result<Vec<CancelledJob>> {
        self.dag(name)?;
        let children: Vec<u64> = self
            .dags
            .values()
            .filter(|d| d.spec.parent.as_deref() == Some(name) && d.is_fully_queued())
            .map(|d| d.seq)
            .collect();
        children.into_iter().map(|seq| self.cancel_seq(seq, now)).collect()
    }

    fn log(&mut self, job: &str, node: &str) -> Result<Arc<NodeLog>> {
        let seq = self.dag(job)?.seq;
        let limit = self.config.log_limit;
        let dag = self.dags.get_mut(&seq).expect("looked up");
        let index = dag
            .node_index(node)
            .ok_or_else(|| Error::NodeNotFound { job: job.to_string(), node: node.to_string() })?;
        let slot = &mut dag.nodes[index as usize];
        let terminal = slot.state.is_terminal();
        Ok(slot
            .log
            .get_or_insert_with(|| {
                let log = NodeLog::new(limit);
                if terminal {
                    log.close();
                }
                log
            })
            .clone())
    }

    fn finished(
        &mut self,
        seq: u64,
        index: u32,
        result: Result<NodeOutcome, NodeError>,
        children: Vec<JobSpec>,
        now: Time,
    ) {
        let Some(dag) = self.dags.get_mut(&seq) else { return };
        if !dag.is_running(index) {
            return; // stopped at its deadline; this is the report of its last moment
        }
        if dag.is_heavy(index) {
            let host = dag.build_host[index as usize].as_ref();
            self.resources.give_slot(host);
            if host.is_none() {
                self.config.metrics.build_slots_in_use.dec();
            }
        }
        if let Some(started) = dag.node_started_at(index) {
            let took = (now.0 - started.0).to_std().unwrap_or_default();
            let kind = format!("{:?}", dag.spec.nodes[index as usize].kind);
            self.config
                .metrics
                .node_duration
                .get_or_create(&crate::metrics::NodeKindLabels { kind })
                .observe(crate::metrics::seconds(took));
        }
        if let Err(error) = &result {
            if self.retry(seq, index, error, now) {
                return;
            }
        }
        let Some(dag) = self.dags.get_mut(&seq) else { return };
        let ok = result.is_ok();
        let ending = match result {
            Ok(outcome) => Ending::Done(outcome.step),
            Err(e) => Ending::Failed(e.to_string()),
        };
        let mut ready = Vec::new();
        dag.finish(index, ending, now, &mut ready);
        let rank = dag.rank;
        self.ready.extend(ready.into_iter().map(|i| (rank, seq, i)));
        self.touch(seq);
        if ok {
            for spec in children {
                self.fan_out(seq, spec, now);
            }
        }
    }

    /// Submits a child of DAG `parent` under a name derived from the parent's.
    /// Whether failed node `index` of DAG `seq` runs again: when it retries and has tries
    /// left, and the DAG's deadline has not passed. It is queued again, and a timer puts
    /// it back among the ready nodes after its backoff (it takes a slot and lease as any
    /// node then); its log says so.
    fn retry(&mut self, seq: u64, index: u32, error: &NodeError, now: Time) -> bool {
        let Some(dag) = self.dags.get_mut(&seq) else { return false };
        let Some(policy) = dag.retry_policy(index) else { return false };
        let attempt = dag.nodes[index as usize].attempt;
        if attempt > policy.limit || dag.deadline_exceeded() {
            return false;
        }
        let wait = policy.backoff(attempt);
        let at = Time(now.0 + chrono::Duration::from_std(wait).unwrap_or_default());
        if let Some(log) = &dag.nodes[index as usize].log {
            let line = format!(
                "hive: attempt {attempt} of {} failed: {error}; the next in {wait:?}\n",
                policy.limit + 1
            );
            log.append(line.as_bytes());
        }
        dag.retry(index, format!("attempt {attempt} failed: {error}"), at);
        self.timers.insert((Instant::now() + wait, Timer::Retry(seq, index)));
        self.touch(seq);
        true
    }

    /// A child runs at its parent's priority unless it names its own.
    fn fan_out(&mut self, parent: u64, mut spec: JobSpec, now: Time) {
        let parent_dag = &self.dags[&parent];
        if spec.priority == 0 {
            spec.priority = parent_dag.spec.priority;
        }
        let mut k = parent_dag.children.len() + 1;
        let name = loop {
            let candidate = child_name(&parent_dag.name, k);
            if !self.names.contains_key(&candidate) {
                break candidate;
            }
            k += 1;
        };
        let seq = self.submit(name.clone(), spec, now).expect("name is free");
        let spec = self.dags[&seq].spec.clone();
        self.created.push(JobUpdate::Created { name: name.clone(), spec });
        let parent_dag = self.dags.get_mut(&parent).expect("parent exists");
        parent_dag.children.push(name);
        parent_dag.touch();
    }

    fn end_turn(&mut self, now: Time) {
        self.settle(now);
        self.pass(now);
        self.resources.publish();
        let mut batch = std::mem::take(&mut self.created);
        for seq in std::mem::take(&mut self.touched) {
            if let Some(update) = self.dags.get_mut(&seq).and_then(Dag::take_update) {
                batch.push(JobUpdate::Changed(update));
            }
        }
        self.touched_set.clear();
        batch.append(&mut self.removed);
        if !batch.is_empty() {
            self.sink.publish(batch);
        }
    }

    /// Finishes DAGs that became terminal this turn: releases their leases and applies
    /// history.
    fn settle(&mut self, now: Time) {
        for k in 0..self.touched.len() {
            let seq = self.touched[k];
            let Some(dag) = self.dags.get_mut(&seq) else { continue };
            if !dag.is_terminal() || dag.is_finished() {
                continue;
            }
            dag.set_finished(now);
            if let Some(at) = dag.deadline {
                self.timers.remove(&(at, Timer::Deadline(seq)));
            }
            for agent in std::mem::take(&mut dag.held) {
                self.resources.release(&agent);
            }
            let template = dag.spec.template;
            let fallen = self.history.record(template, Kept::Dag(seq));
            self.evict(fallen);
        }
    }

    /// Starts every dep-ready node whose resources are free, in competition order.
    ///
    /// FIFO: a node that could take its agent's lease but waits for a build slot
    /// reserves that lease for the rest of the pass, so a later DAG's cheap node cannot
    /// take the lease and starve it. A node waiting for a lease held by another DAG
    /// reserves nothing (so builds elsewhere keep going); when the lease frees, the
    /// earliest waiter is first in the next pass.
    fn pass(&mut self, now: Time) {
        if self.ready.is_empty() {
            self.config.metrics.lease_waits.set(0);
            return;
        }
        let mut lease_waits = 0;
        // Leases taken in this pass are applied at once, so the deadlock check of a
        // later candidate sees them.
        let candidates: Vec<(i128, u64, u32)> = self.ready.iter().copied().collect();
        let mut reserved: Vec<(String, u64)> = Vec::new();
        for (rank, seq, i) in candidates {
            let dag = &self.dags[&seq];
            let heavy = dag.is_heavy(i);
            let slot_free = self.resources.slots_left(dag.build_host[i as usize].as_deref()) > 0;
            let acquire = match dag.lease_of(i) {
                None => None,
                Some(agent) if dag.holds(agent) => None,
                Some(agent) => {
                    let free = self.resources.holder(agent).is_none()
                        && !reserved.iter().any(|(a, s)| a == agent && *s != seq);
                    if !free || would_deadlock(&self.dags, &self.resources, seq, agent) {
                        lease_waits += 1;
                        continue;
                    }
                    Some(agent.to_string())
                }
            };
            if heavy && !slot_free {
                reserved.extend(acquire.map(|agent| (agent, seq)));
                continue;
            }
            if let Some(agent) = acquire {
                self.resources.acquire(&agent, seq);
                self.dags.get_mut(&seq).expect("ready DAG exists").held.push(agent);
            }
            self.ready.remove(&(rank, seq, i));
            self.start_node(seq, i, now);
        }
        self.config.metrics.lease_waits.set(lease_waits);
    }

    fn start_node(&mut self, seq: u64, i: u32, now: Time) {
        let limit = self.config.log_limit;
        let dag = self.dags.get_mut(&seq).expect("ready DAG exists");
        if dag.is_heavy(i) {
            let host = dag.build_host[i as usize].as_ref();
            self.resources.take_slot(host);
            if host.is_none() {
                self.config.metrics.build_slots_in_use.inc();
            }
        }
        let log = dag.nodes[i as usize].log.clone().unwrap_or_else(|| NodeLog::new(limit));
        let retry_of = dag.nodes[i as usize].retry_at.and(dag.nodes[i as usize].error.clone());
        dag.start(i, now, log.clone());
        let attempt = dag.nodes[i as usize].attempt;
        let attempts = dag.retry_policy(i).map_or(1, |p| p.limit + 1);
        if attempt > 1 {
            log.append(format!("hive: attempt {attempt} of {attempts}\n").as_bytes());
        }
        self.touch(seq);
        let Some(tx) = self.tx.upgrade() else { return };
        let dag = &self.dags[&seq];
        let kind = dag.spec.nodes[i as usize].kind;
        let fan_out = Arc::new(Mutex::new(Vec::new()));
        let interruptible = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let steps = tx.clone();
        let ctx = NodeContext {
            job: dag.name.clone(),
            log,
            // The scheduler only goes away at shutdown, when nobody reads the label anyway.
            steps: StepSink(Arc::new(move |label| {
                let _ = steps.send(Msg::Step { seq, index: i, label });
            })),
            fan_out: fan_out.clone(),
            interruptible: interruptible.clone(),
        };
        let run = NodeRun {
            job: dag.name.clone(),
            spec: dag.spec.clone(),
            actions: dag.actions.clone(),
            index: i as usize,
            ctx,
            attempt,
            attempts,
            retry_of,
        };
        let executor = self.executor.clone();
        let abort = self.tasks.spawn(async move {
            let result = AssertUnwindSafe(executor.run(run))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Err(NodeError::Panicked(kind, panic_message(&panic))));
            let children = std::mem::take(&mut *fan_out.lock().unwrap_or_else(PoisonError::into_inner));
            let _ = tx.send(Msg::Finished { seq, index: i, result, children });
        });
        let dag = self.dags.get_mut(&seq).expect("ready DAG exists");
        dag.nodes[i as usize].run = Some(RunHandle { abort, interruptible });
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

/// `parent-k`, with the parent's name cut so the result is a DNS-1123 label (≤ 63).
fn child_name(parent: &str, k: usize) -> String {
    let suffix = format!("-{k}");
    let room = hive_api::validation::MAX_NAME_LEN - suffix.len();
    let base = parent[..parent.len().min(room)].trim_end_matches('-');
    format!("{base}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_names_stay_labels() {
        assert_eq!(child_name("meta-update", 1), "meta-update-1");
        let long = format!("{}-{}", "a".repeat(59), "b".repeat(3));
        let name = child_name(&long, 12);
        assert_eq!(name.len(), 62);
        assert!(name.ends_with("aaa-12"), "{name}");
        assert!(hive_api::validation::dns1123_label(&child_name(&"x".repeat(63), 100)).is_ok());
    }
}
