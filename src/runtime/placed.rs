//! The daemon's one runtime when agents may live on fleet nodes: [`Placed`] sends each
//! call to the runtime of the agent's placement — the local driver for an agent without
//! `spec.placement`, the node's runtime (`fleet::remote`) for one placed on a node — so
//! the scheduler, the executor and crash-watch hold one `Arc<dyn Runtime>` as before.
//!
//! Calls that name an agent only by name (installed, running now, logs) find its
//! placement through the [`Remotes`] the composition root gives, which reads it from the
//! stored Agent (a move's Job is taken after the placement edit it carries out).

use std::sync::Arc;

use futures_util::future::BoxFuture;
use hive_api::agent::Agent;
use tokio::sync::broadcast;

use super::{
    BuildLog, Drain, Error, Fallback, Generation, Kick, Limits, LogOptions, LogStream, Observed, Result,
    Runtime, RuntimeEvent, Started, Unanswerable,
};

/// The runtimes of fleet nodes, and where agents are placed.
pub trait Remotes: Send + Sync + std::fmt::Debug {
    /// The node a stored agent is placed on, if any.
    fn placement(&self, agent: &str) -> Option<String>;
    /// The runtime of `node`'s agents; an error says why there is none (no such node,
    /// not joined).
    fn runtime(&self, node: &str) -> std::result::Result<Arc<dyn Runtime>, String>;
    /// How many builds run at once on `node` (its `spec.buildSlots`; 1 when unknown).
    fn build_slots(&self, node: &str) -> usize;
    /// Every remote runtime's changes (one channel for all nodes).
    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent>;
}

/// The local runtime and the fleet nodes' runtimes behind one [`Runtime`].
pub struct Placed {
    local: Arc<dyn Runtime>,
    remotes: Arc<dyn Remotes>,
    events: broadcast::Sender<RuntimeEvent>,
}

impl Placed {
    /// Routes between `local` and `remotes`; both runtimes' changes reach [`Runtime::subscribe`].
    pub fn new(local: Arc<dyn Runtime>, remotes: Arc<dyn Remotes>) -> Placed {
        let (events, _) = broadcast::channel(1024);
        for mut source in [local.subscribe(), remotes.subscribe()] {
            let events = events.clone();
            tokio::spawn(async move {
                loop {
                    match source.recv().await {
                        Ok(event) => {
                            let _ = events.send(event);
                        }
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(missed = n, "runtime events fell behind");
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    }
                }
            });
        }
        Placed { local, remotes, events }
    }

    fn of(&self, agent: &Agent) -> Result<Arc<dyn Runtime>> {
        match agent.spec.node() {
            None => Ok(self.local.clone()),
            Some(node) => self.remote(&agent.metadata.name, node),
        }
    }

    fn named(&self, agent: &str) -> Result<Arc<dyn Runtime>> {
        match self.remotes.placement(agent) {
            None => Ok(self.local.clone()),
            Some(node) => self.remote(agent, &node),
        }
    }

    fn remote(&self, agent: &str, node: &str) -> Result<Arc<dyn Runtime>> {
        self.remotes.runtime(node).map_err(|message| Error::Remote {
            agent: agent.into(),
            node: node.into(),
            message,
        })
    }
}

impl Runtime for Placed {
    fn prebuild<'a>(&'a self, agent: &'a Agent, log: &'a dyn BuildLog) -> BoxFuture<'a, Result<Generation>> {
        Box::pin(async move { self.of(agent)?.prebuild(agent, log).await })
    }

    fn stop_for_update<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.of(agent)?.stop_for_update(agent).await })
    }

    fn swap<'a>(&'a self, agent: &'a Agent, generation: &'a Generation) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.of(agent)?.swap(agent, generation).await })
    }

    fn create<'a>(&'a self, agent: &'a Agent, log: &'a dyn BuildLog) -> BoxFuture<'a, Result<Generation>> {
        Box::pin(async move { self.of(agent)?.create(agent, log).await })
    }

    fn start_with<'a>(&'a self, agent: &'a Agent, fallback: Fallback) -> BoxFuture<'a, Result<Started>> {
        Box::pin(async move { self.of(agent)?.start_with(agent, fallback).await })
    }

    fn stop<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.of(agent)?.stop(agent).await })
    }

    fn kill<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.of(agent)?.kill(agent).await })
    }

    fn signal<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Kick>> {
        Box::pin(async move { self.of(agent)?.signal(agent).await })
    }

    fn drain<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Drain>> {
        Box::pin(async move { self.of(agent)?.drain(agent).await })
    }

    fn write_limits<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Limits>> {
        Box::pin(async move { self.of(agent)?.write_limits(agent).await })
    }

    fn write_permissions<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.of(agent)?.write_permissions(agent).await })
    }

    fn is_running<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move { self.of(agent)?.is_running(agent).await })
    }

    fn observed<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Observed>> {
        Box::pin(async move { self.of(agent)?.observed(agent).await })
    }

    fn destroy<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.of(agent)?.destroy(agent).await })
    }

    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.events.subscribe()
    }

    fn installed(&self, agent: &str) -> bool {
        self.named(agent).is_ok_and(|rt| rt.installed(agent))
    }

    /// This host's: a node's agents are installed on the node, which answers for them
    /// once its worker rejoins (the boot sweep takes a placed agent whatever this says).
    fn installed_here(&self) -> Option<std::collections::BTreeSet<String>> {
        self.local.installed_here()
    }

    fn running_now(&self, agent: &str) -> bool {
        self.named(agent).is_ok_and(|rt| rt.running_now(agent))
    }

    fn logs<'a>(&'a self, agent: &'a str, options: LogOptions) -> BoxFuture<'a, Result<LogStream>> {
        Box::pin(async move { self.named(agent)?.logs(agent, options).await })
    }

    fn attach<'a>(&'a self, agents: &'a (dyn Fn() -> Vec<Agent> + Send + Sync)) -> BoxFuture<'a, ()> {
        // A node's runtime starts following its worker when first asked (`answerable`).
        self.local.attach(agents)
    }

    fn answerable(&self, agent: &Agent) -> std::result::Result<(), Unanswerable> {
        match agent.spec.node() {
            None => self.local.answerable(agent),
            Some(node) => match self.remotes.runtime(node) {
                Ok(runtime) => runtime.answerable(agent),
                Err(why) => Err(Unanswerable::Lost(why)),
            },
        }
    }

    fn agents_outlive_daemon(&self) -> bool {
        self.local.agents_outlive_daemon()
    }
}
