//! The controller: watcher → reflector → work queue → `reconcile`, for one kind.
//!
//! Reconciliation is level-triggered. Events only say *which* name to look at; when a
//! worker takes the name from the queue, it reads the latest cached state from the
//! reflector and hands that to `reconcile` as a [`Target`]: [`Target::Present`] with the
//! object, or [`Target::Absent`] with just the name once the object is gone (deleted, or
//! missing from a relist). So a burst of changes to one object costs one run on its final
//! state, and a deletion is seen even when it happened while the watch was down.
//!
//! `reconcile` returns an [`Action`]: wait for the next change, run again after a delay,
//! or run again after the key's exponential backoff. An error is passed to the
//! `error_policy`, which picks the action (typically [`Action::backoff`]).

use std::fmt::Display;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join, join_all};
use futures_util::StreamExt;
use hive_api::Object;

use crate::backoff::Backoff;
use crate::client::Client;
use crate::queue::WorkQueue;
use crate::reflector::{Store, Writer};
use crate::watcher::{self, watcher};

/// What a reconcile run is about: the latest cached state of one name.
#[derive(Debug)]
pub enum Target<K> {
    /// The object exists; this is its latest cached state.
    Present(Arc<K>),
    /// No object of this name exists (any more); clean up whatever belonged to it.
    Absent(String),
}

impl<K> Clone for Target<K> {
    fn clone(&self) -> Self {
        match self {
            Target::Present(object) => Target::Present(object.clone()),
            Target::Absent(name) => Target::Absent(name.clone()),
        }
    }
}

impl<K: Object> Target<K> {
    /// The object's name.
    pub fn name(&self) -> &str {
        match self {
            Target::Present(object) => &object.metadata().name,
            Target::Absent(name) => name,
        }
    }

    /// The object, if present.
    pub fn object(&self) -> Option<&Arc<K>> {
        match self {
            Target::Present(object) => Some(object),
            Target::Absent(_) => None,
        }
    }
}

/// What to do with a name after a reconcile run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action(Next);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    AwaitChange,
    Requeue(Duration),
    Backoff,
}

impl Action {
    /// Nothing more to do until the object changes.
    pub const fn await_change() -> Action {
        Action(Next::AwaitChange)
    }

    /// Run again after `delay` (sooner if the object changes), e.g. to poll something
    /// outside the API.
    pub const fn requeue(delay: Duration) -> Action {
        Action(Next::Requeue(delay))
    }

    /// Run again after the name's exponential backoff, which grows with each consecutive
    /// backoff of that name and resets when a run ends with any other action. The usual
    /// answer of an `error_policy`.
    pub const fn backoff() -> Action {
        Action(Next::Backoff)
    }

    /// The fixed delay of [`Action::requeue`], if that is what this is.
    pub fn requeue_after(&self) -> Option<Duration> {
        match self.0 {
            Next::Requeue(delay) => Some(delay),
            Next::AwaitChange | Next::Backoff => None,
        }
    }
}

/// How a controller runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// How many names are reconciled at once at most (at least 1). One name is never
    /// reconciled twice at once, whatever this says.
    pub concurrency: usize,
    /// Spacing of [`Action::backoff`] requeues of one name.
    pub backoff: Backoff,
    /// How the watcher retries.
    pub watcher: watcher::Config,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            concurrency: 4,
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(300)),
            watcher: watcher::Config::default(),
        }
    }
}

/// Told about each reconcile run, for metrics: the controller (its kind), how long the
/// run took, whether it failed (an error or a panic), and how many names were queued
/// when it ended. The daemon passes its Prometheus handles; nothing here knows them.
pub trait Observer: Send + Sync {
    /// One reconcile run of a `controller` name ended.
    fn reconciled(&self, controller: &'static str, took: Duration, failed: bool, queued: usize);
}

/// One kind's controller, ready to [`run`](Controller::run).
pub struct Controller<K: Object, C> {
    client: C,
    config: Config,
    writer: Writer<K>,
    queue: WorkQueue,
    observer: Option<Arc<dyn Observer>>,
}

impl<K: Object, C: Client<K>> Controller<K, C> {
    /// A controller that will watch `K` through `client`.
    pub fn new(client: C, config: Config) -> Controller<K, C> {
        Controller {
            client,
            config,
            writer: Writer::new(),
            queue: WorkQueue::new(config.backoff),
            observer: None,
        }
    }

    /// The same controller, telling `observer` about every reconcile run.
    pub fn observed_by(mut self, observer: Arc<dyn Observer>) -> Controller<K, C> {
        self.observer = Some(observer);
        self
    }

    /// A read handle on the controller's cache of `K`, e.g. for the reconcile context.
    pub fn store(&self) -> Store<K> {
        self.writer.store()
    }

    /// The controller's work queue, to trigger reconciles from elsewhere (e.g. when an
    /// object of another kind that belongs to a `K` changes).
    pub fn queue(&self) -> WorkQueue {
        self.queue.clone()
    }

    /// Runs until `shutdown` completes, then stops taking work, waits for the reconcile
    /// runs in progress to finish, and returns.
    ///
    /// Each reconcile run is a spawned task, so a panic in it is contained: it is logged
    /// and the name is requeued with backoff, like an error.
    pub async fn run<Ctx, E, R, F, P>(
        self,
        reconcile: R,
        error_policy: P,
        ctx: Arc<Ctx>,
        shutdown: impl Future<Output = ()> + Send,
    ) where
        Ctx: Send + Sync + 'static,
        R: Fn(Target<K>, Arc<Ctx>) -> F + Send + Sync,
        F: Future<Output = Result<Action, E>> + Send + 'static,
        E: Display + Send + 'static,
        P: Fn(&Target<K>, &E, &Ctx) -> Action + Send + Sync,
    {
        let Controller { client, config, mut writer, queue, observer } = self;
        let store = writer.store();
        let client = Arc::new(client);

        let feed = async {
            let mut events = pin!(watcher(client.clone(), config.watcher));
            while let Some(item) = events.next().await {
                match item {
                    Ok(event) => writer.apply(&event).into_iter().for_each(|name| queue.add(name)),
                    Err(e) if e.is_expired() => tracing::debug!(kind = K::KIND, "{e}; relisting"),
                    Err(e) if e.is_shutting_down() => tracing::debug!(kind = K::KIND, "{e}"),
                    Err(e) => tracing::warn!(kind = K::KIND, "{e}; retrying"),
                }
            }
        };
        let driver = async {
            tokio::select! {
                () = feed => {}
                () = shutdown => tracing::debug!(kind = K::KIND, "controller shutting down"),
            }
            queue.shutdown();
        };
        let workers = (0..config.concurrency.max(1)).map(|_| async {
            while let Some(claim) = queue.next().await {
                let name = claim.key().to_string();
                let target = match store.get(&name) {
                    Some(object) => Target::Present(object),
                    None => Target::Absent(name.clone()),
                };
                let started = std::time::Instant::now();
                let (action, failed) = match tokio::spawn(reconcile(target.clone(), ctx.clone())).await {
                    Ok(Ok(action)) => (action, false),
                    Ok(Err(e)) if client.is_shutting_down() => {
                        tracing::debug!(kind = K::KIND, %name, "reconcile failed while shutting down: {e}");
                        (error_policy(&target, &e, &ctx), true)
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(kind = K::KIND, %name, "reconcile failed: {e}");
                        (error_policy(&target, &e, &ctx), true)
                    }
                    Err(e) => {
                        tracing::error!(kind = K::KIND, %name, "reconcile panicked: {e}");
                        (Action::backoff(), true)
                    }
                };
                if let Some(observer) = &observer {
                    observer.reconciled(K::KIND, started.elapsed(), failed, queue.len());
                }
                match action.0 {
                    Next::AwaitChange => queue.forget(&name),
                    Next::Requeue(delay) => {
                        queue.forget(&name);
                        queue.add_after(name, delay);
                    }
                    Next::Backoff => queue.add_rate_limited(name),
                }
                // Only now may the name run again, on whatever state is cached then.
                drop(claim);
            }
        });
        join(driver, join_all(workers)).await;
    }
}

#[cfg(test)]
mod tests;
