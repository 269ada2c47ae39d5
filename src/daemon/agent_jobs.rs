//! The Jobs of each agent, for the Agent controller: an in-memory index by agent, kept
//! from one watch of the Jobs, so a reconcile reads the few Jobs that touch its agent
//! ([`touches`]: those naming it, and every BootSweep or MetaUpdate whose fan-out is not
//! known yet) instead of listing and decoding every stored Job.
//!
//! Why an index fed by the watch, and not a label on Jobs: a Job may touch several
//! agents, or all of them, and a label selector is still a walk of every Job in the
//! store's cache. The index is the controller's own, as a kube-rs reflector with an
//! index would be.
//!
//! A read is never older than the store was when it began ([`AgentJobs::of`]): the
//! task owning the watch reads the store's revision, then takes every event already in
//! its watch (the store hands a batch's events to its watchers before that revision is
//! visible), then answers. So a reconcile woken by an Agent write sees the Job written
//! in the same transaction (a power verb's intent and its Job), exactly as the list it
//! replaces did, and never submits that Job a second time. (While the watch waits out a
//! backoff to relist after falling behind its buffer — rare, as the task reads it
//! steadily — a read answers from the index as it stands.)

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use futures_util::{FutureExt as _, StreamExt as _};
use hive_api::job::Job;
use hive_controllers::agent::{touches, Touches};
use hive_controllers::Event;
use tokio::sync::{mpsc, oneshot};

use crate::client::Api;
use crate::store::Store;

/// A handle on the index: cheap to clone.
#[derive(Clone)]
pub struct AgentJobs {
    index: Arc<RwLock<Index>>,
    syncs: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

/// Starts the task that watches the Jobs of `store` into the index; `changed` is called
/// with each Job the watch reports changed or deleted (every one, at a relist) after the
/// index holds the change.
pub fn spawn(store: Store, changed: impl Fn(&Job) + Send + Sync + 'static) -> AgentJobs {
    let index = Arc::new(RwLock::new(Index::default()));
    let (syncs, requests) = mpsc::unbounded_channel();
    tokio::spawn(run(store, index.clone(), requests, changed));
    AgentJobs { index, syncs }
}

impl AgentJobs {
    /// The Jobs that touch `agent`, as the store held them when this call began (or
    /// later). Before the watch's first list, waits for it.
    pub async fn of(&self, agent: &str) -> Vec<Arc<Job>> {
        let (reply, caught_up) = oneshot::channel();
        if self.syncs.send(reply).is_ok() {
            // A task that ended (the runtime shutting down) answers from what it had.
            let _ = caught_up.await;
        }
        self.index.read().unwrap_or_else(PoisonError::into_inner).of(agent)
    }
}

/// The task: applies the watch's events to the index and answers catch-up requests.
async fn run(
    store: Store,
    index: Arc<RwLock<Index>>,
    mut requests: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    changed: impl Fn(&Job) + Send + Sync,
) {
    let apply = |item: Result<Event<Job>, hive_controllers::watcher::Error>| match item {
        Ok(event) => {
            let touched = index.write().unwrap_or_else(PoisonError::into_inner).apply(event);
            touched.iter().for_each(|job| changed(job));
        }
        Err(err) => tracing::debug!(error = %err, "the Agent controller's Job watch retries"),
    };
    let mut events = std::pin::pin!(hive_controllers::watcher(Api::<Job>::new(&store), Default::default()));
    // Requests that came before the first list; answered once it is applied.
    let mut early: Vec<oneshot::Sender<()>> = Vec::new();
    let mut listed = false;
    loop {
        tokio::select! {
            item = events.next() => {
                let Some(item) = item else { return };
                listed |= matches!(item, Ok(Event::Restarted(_)));
                apply(item);
                if listed {
                    early.drain(..).for_each(|reply| { let _ = reply.send(()); });
                }
            }
            request = requests.recv() => {
                let Some(reply) = request else { return };
                if !listed {
                    early.push(reply);
                    continue;
                }
                // Every Job change committed up to this revision is in the watch now.
                let _ = store.revision();
                while let Some(Some(item)) = events.next().now_or_never() {
                    apply(item);
                }
                let _ = reply.send(());
            }
        }
    }
}

/// Jobs by name, and the names of those that touch each agent.
#[derive(Debug, Default)]
struct Index {
    jobs: HashMap<String, Arc<Job>>,
    by_agent: HashMap<String, BTreeSet<String>>,
    /// Jobs that touch every agent ([`Touches::All`]).
    everyone: BTreeSet<String>,
}

impl Index {
    /// Applies one watcher event; returns the Jobs it changed (for a relist, every Job
    /// held before or after it).
    fn apply(&mut self, event: Event<Job>) -> Vec<Arc<Job>> {
        match event {
            Event::Applied(job) => vec![self.insert(job)],
            Event::Deleted(job) => self.remove(&job.metadata.name).into_iter().collect(),
            Event::Restarted(jobs) => {
                let before = std::mem::take(self);
                let mut touched: Vec<Arc<Job>> = before.jobs.into_values().collect();
                touched.extend(jobs.into_iter().map(|job| self.insert(job)));
                touched
            }
        }
    }

    fn insert(&mut self, job: Job) -> Arc<Job> {
        let name = job.metadata.name.clone();
        self.remove(&name);
        match touches(&job.spec) {
            Touches::All => {
                self.everyone.insert(name.clone());
            }
            Touches::Agents(agents) => {
                for agent in agents {
                    self.by_agent.entry(agent).or_default().insert(name.clone());
                }
            }
        }
        let job = Arc::new(job);
        self.jobs.insert(name, job.clone());
        job
    }

    fn remove(&mut self, name: &str) -> Option<Arc<Job>> {
        let old = self.jobs.remove(name)?;
        match touches(&old.spec) {
            Touches::All => {
                self.everyone.remove(name);
            }
            Touches::Agents(agents) => {
                for agent in agents {
                    if let Some(names) = self.by_agent.get_mut(&agent) {
                        names.remove(name);
                        if names.is_empty() {
                            self.by_agent.remove(&agent);
                        }
                    }
                }
            }
        }
        Some(old)
    }

    /// The Jobs that touch `agent`, by name.
    fn of(&self, agent: &str) -> Vec<Arc<Job>> {
        let names = self.by_agent.get(agent).into_iter().flatten().chain(&self.everyone);
        names.filter_map(|name| self.jobs.get(name).cloned()).collect()
    }
}

#[cfg(test)]
mod tests {
    use hive_api::job::{JobNode, JobNodeKind, JobSpec, JobTemplate};
    use serde_json::json;

    use super::*;
    use crate::store::{Mutation, StoreConfig};

    fn job(name: &str, template: JobTemplate, agents: &[&str]) -> Job {
        let nodes = agents
            .iter()
            .map(|agent| JobNode::new(format!("{agent}/reconcile"), JobNodeKind::Reconcile, Some(agent)))
            .collect();
        Job::new(name, JobSpec { template, nodes, ..Default::default() })
    }

    fn names(jobs: Vec<Arc<Job>>) -> Vec<String> {
        let mut names: Vec<String> = jobs.iter().map(|j| j.metadata.name.clone()).collect();
        names.sort();
        names
    }

    #[test]
    fn the_index_holds_the_jobs_that_touch_each_agent() {
        let mut index = Index::default();
        index.apply(Event::Restarted(vec![
            job("start-a", JobTemplate::Start, &["a"]),
            job("stop-ab", JobTemplate::Stop, &["a", "b"]),
            job("sweep", JobTemplate::BootSweep, &[]),
        ]));
        assert_eq!(names(index.of("a")), ["start-a", "stop-ab", "sweep"]);
        assert_eq!(names(index.of("b")), ["stop-ab", "sweep"]);
        assert_eq!(names(index.of("c")), ["sweep"], "a boot sweep touches every agent");

        // A new version that names other agents moves the Job.
        let touched = index.apply(Event::Applied(job("stop-ab", JobTemplate::Stop, &["c"])));
        assert_eq!(names(touched), ["stop-ab"]);
        assert_eq!(names(index.of("a")), ["start-a", "sweep"]);
        assert_eq!(names(index.of("b")), ["sweep"]);
        assert_eq!(names(index.of("c")), ["stop-ab", "sweep"]);

        index.apply(Event::Deleted(job("sweep", JobTemplate::BootSweep, &[])));
        assert_eq!(names(index.of("b")), Vec::<String>::new());
        assert!(!index.by_agent.contains_key("b"), "no empty sets are kept");

        // A relist replaces everything, and reports what it held before too.
        let touched = index.apply(Event::Restarted(vec![job("kill-b", JobTemplate::Kill, &["b"])]));
        assert_eq!(names(touched), ["kill-b", "start-a", "stop-ab"]);
        assert_eq!(names(index.of("a")), Vec::<String>::new());
        assert_eq!(names(index.of("b")), ["kill-b"]);
    }

    fn stored(name: &str, agent: &str) -> serde_json::Value {
        json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": name},
               "spec": {"template": "Reconcile", "nodes": [{"id": format!("{agent}/reconcile"), "kind": "Reconcile", "agent": agent}]}})
    }

    /// A Job committed before a read is in the read, with no wait for the watch: the
    /// reconcile that follows a power verb's write must see its Job.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_sees_every_job_committed_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        store.commit(Mutation::Create { kind: "jobs", object: stored("before", "a") }, false).await.unwrap();
        let changes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = changes.clone();
        let jobs =
            spawn(store.clone(), move |job: &Job| seen.lock().unwrap().push(job.metadata.name.clone()));
        assert_eq!(names(jobs.of("a").await), ["before"], "the first read waits for the list");
        for i in 0..200 {
            let name = format!("job-{i}");
            store.commit(Mutation::Create { kind: "jobs", object: stored(&name, "b") }, false).await.unwrap();
            assert_eq!(jobs.of("b").await.len(), i + 1, "{name} is in the read right after its commit");
        }
        store
            .commit(
                Mutation::Delete { kind: "jobs", name: "before".into(), uid: None, resource_version: None },
                false,
            )
            .await
            .unwrap();
        assert!(jobs.of("a").await.is_empty());
        let changes = changes.lock().unwrap().clone();
        assert_eq!(changes.first().map(String::as_str), Some("before"));
        assert_eq!(changes.len(), 1 + 200 + 1, "each change once: {changes:?}");
    }
}
