//! The daemon's side of the agent runtime protocol: [`RemoteRuntime`] is the
//! [`Runtime`] of the agents placed on one fleet node. Each primitive is one call to the
//! node's worker over `hive/fleet-runtime/0` (the daemon dials; the node never dials
//! back). A build first bundles the agent's config commit from the daemon's own mirror
//! and ships it with the call, so the node needs no access to the git remote.
//!
//! What the trait asks without IO (installed, running now) is answered from a view the
//! daemon keeps of the worker's agents: a watch stream that lists them and then sends
//! each change, which are also the events crash-watch subscribes to.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use hive_api::agent::Agent;
use iroh::endpoint::{Connection, RecvStream, SendStream};
use iroh::{Endpoint, EndpointAddr};
use tokio::sync::broadcast;
use tokio::task::AbortHandle;

use super::wire::{AgentState, Reply, Request, WireLogOptions, RUNTIME_ALPN};
use crate::fleet::net::{wire, Backoff};
use crate::runtime::process::git;
use crate::runtime::{
    BuildLog, Change, Drain, Error, Fallback, Generation, Kick, Limits, LogOptions, LogStream, Observed,
    Result, Runtime, RuntimeEvent, Started, Unanswerable,
};

/// How long dialling a worker may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a watch may hear nothing before the worker counts as unreachable; a worker
/// lists its agents every [`super::serve::WATCH_HEARTBEAT`].
const WATCH_SILENCE: Duration = Duration::from_secs(30);
/// How long a call that is neither a build, a stop nor a start may take (and what a stop
/// or start gets beyond twice the agent's graceful-stop time).
const QUICK_CALL: Duration = Duration::from_secs(120);
/// A worker's graceful-stop time for an agent that names none (the process runtime's).
const DEFAULT_GRACEFUL: Duration = Duration::from_secs(180);
/// The largest log chunk a worker may send.
const MAX_CHUNK: usize = 1 << 20;

/// Where the node's worker is now: its endpoint and addresses, from the Node's status.
pub type Locate = Arc<dyn Fn() -> std::result::Result<EndpointAddr, Unanswerable> + Send + Sync>;

/// The runtime of the agents placed on one node.
pub struct RemoteRuntime {
    inner: Arc<Inner>,
    /// How long a call that is not a build, a stop or a start may take.
    quick: Duration,
    watch: Mutex<Option<AbortHandle>>,
}

struct Inner {
    node: String,
    endpoint: Endpoint,
    locate: Locate,
    /// The daemon's mirrors of config repositories and the bundles made from them.
    ship: PathBuf,
    conn: tokio::sync::Mutex<Option<Connection>>,
    states: Mutex<HashMap<String, AgentState>>,
    /// Whether the worker listed its agents since the view was started; else why not yet.
    listed: Mutex<std::result::Result<(), Unanswerable>>,
    events: broadcast::Sender<RuntimeEvent>,
}

impl Drop for RemoteRuntime {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.lock().unwrap_or_else(PoisonError::into_inner).take() {
            watch.abort();
        }
    }
}

impl RemoteRuntime {
    /// The runtime of `node`'s agents, dialled from `endpoint` at what `locate` says;
    /// config mirrors and bundles live in `ship`; changes are published on `events`.
    pub fn new(
        node: &str,
        endpoint: Endpoint,
        locate: Locate,
        ship: PathBuf,
        events: broadcast::Sender<RuntimeEvent>,
    ) -> RemoteRuntime {
        RemoteRuntime {
            inner: Arc::new(Inner {
                node: node.to_string(),
                endpoint,
                locate,
                ship,
                conn: tokio::sync::Mutex::new(None),
                states: Mutex::new(HashMap::new()),
                listed: Mutex::new(Err(Unanswerable::Waiting(
                    "its worker has not listed its agents yet".into(),
                ))),
                events,
            }),
            watch: Mutex::new(None),
            quick: QUICK_CALL,
        }
    }

    /// The same runtime with another bound on quick calls (stops and starts get twice
    /// the agent's graceful-stop time on top of it).
    pub fn with_quick_bound(mut self, quick: Duration) -> RemoteRuntime {
        self.quick = quick;
        self
    }

    /// Starts following the worker's agents (idempotent): their list, then each change.
    pub fn watch(&self) {
        let mut watch = self.watch.lock().unwrap_or_else(PoisonError::into_inner);
        if watch.is_none() {
            *watch = Some(tokio::spawn(follow(self.inner.clone(), Backoff::default())).abort_handle());
        }
    }

    fn remote(&self, agent: &str, message: impl Into<String>) -> Error {
        Error::Remote { agent: agent.into(), node: self.inner.node.clone(), message: message.into() }
    }

    fn set_state(&self, agent: &str, update: impl FnOnce(&mut AgentState)) {
        let mut states = self.inner.states.lock().unwrap_or_else(PoisonError::into_inner);
        let state = states.entry(agent.to_string()).or_insert_with(|| AgentState {
            agent: agent.to_string(),
            installed: false,
            running: false,
        });
        update(state);
    }

    /// One call: the request (and the bundle after it), the build lines to `log`, the
    /// final reply.
    async fn call(
        &self,
        agent: &str,
        request: Request,
        bundle: Option<PathBuf>,
        log: Option<&dyn BuildLog>,
    ) -> Result<Reply> {
        // A build takes as long as it takes (its lines keep coming, and a worker that dies
        // ends the connection); any other call has a bound, so a worker that takes a call
        // and never answers cannot hold a Job (and its lease) forever.
        let bound = match &request {
            Request::Prebuild { .. } | Request::Create { .. } => None,
            Request::StopForUpdate { agent }
            | Request::Stop { agent }
            | Request::Kill { agent }
            | Request::Drain { agent }
            | Request::Destroy { agent }
            | Request::Start { agent, .. } => {
                let graceful = agent
                    .spec
                    .runtime
                    .graceful_stop_seconds
                    .map_or(DEFAULT_GRACEFUL, |s| Duration::from_secs(s.into()));
                Some(graceful * 2 + self.quick)
            }
            _ => Some(self.quick),
        };
        let exchange = self.exchange(agent, request, bundle, log);
        match bound {
            None => exchange.await,
            Some(bound) => match tokio::time::timeout(bound, exchange).await {
                Ok(reply) => reply,
                Err(_) => Err(self.remote(agent, format!("the worker did not answer within {bound:?}"))),
            },
        }
    }

    async fn exchange(
        &self,
        agent: &str,
        request: Request,
        bundle: Option<PathBuf>,
        log: Option<&dyn BuildLog>,
    ) -> Result<Reply> {
        self.watch();
        let (mut send, mut recv) = self.inner.open().await.map_err(|e| self.remote(agent, e.to_string()))?;
        wire::write_message(&mut send, &request).await.map_err(|e| self.remote(agent, e.to_string()))?;
        if let Some(bundle) = bundle {
            let mut file = tokio::fs::File::open(&bundle)
                .await
                .map_err(|e| self.remote(agent, format!("opening the config bundle: {e}")))?;
            tokio::io::copy(&mut file, &mut send)
                .await
                .map_err(|e| self.remote(agent, format!("sending the config bundle: {e}")))?;
        }
        let _ = send.finish();
        loop {
            let reply: Reply = wire::read_message(&mut recv)
                .await
                .map_err(|e| self.remote(agent, format!("the worker's answer was lost: {e}")))?;
            match reply {
                Reply::Line { line } => {
                    if let Some(log) = log {
                        log.line(&line);
                    }
                }
                Reply::Failed { message, no_previous_run: true } => {
                    let _ = message;
                    return Err(Error::NoPreviousRun { agent: agent.into() });
                }
                Reply::Failed { message, .. } => return Err(self.remote(agent, message)),
                reply => return Ok(reply),
            }
        }
    }

    fn unexpected(&self, agent: &str, reply: &Reply) -> Error {
        self.remote(agent, format!("unexpected answer from the worker: {reply:?}"))
    }

    async fn unit(&self, agent: &Agent, request: Request) -> Result<()> {
        let name = &agent.metadata.name;
        match self.call(name, request, None, None).await? {
            Reply::Done => Ok(()),
            other => Err(self.unexpected(name, &other)),
        }
    }

    /// Ships the agent's config commit and builds it on the node.
    async fn build(&self, agent: &Agent, log: &dyn BuildLog, create: bool) -> Result<Generation> {
        let name = &agent.metadata.name;
        let mirror = self.inner.ship.join(format!("{name}.git"));
        tokio::fs::create_dir_all(&self.inner.ship).await.map_err(|source| Error::Io {
            agent: name.clone(),
            action: "cannot create",
            path: self.inner.ship.clone(),
            source,
        })?;
        log.line(&format!("shipping the config of {name} to node {}", self.inner.node));
        git::sync_mirror(name, &agent.spec.config.repo, &mirror, log).await?;
        let rev = git::resolve(name, &mirror, agent.spec.config.rev.as_deref(), log).await?;
        let file = self.inner.ship.join(format!("{name}.bundle"));
        git::bundle(name, &mirror, &rev, &file, log).await?;
        let len = tokio::fs::metadata(&file)
            .await
            .map_err(|source| Error::Io {
                agent: name.clone(),
                action: "cannot read",
                path: file.clone(),
                source,
            })?
            .len();
        let boxed = Box::new(agent.clone());
        let request = if create {
            Request::Create { agent: boxed, rev, bundle: len }
        } else {
            Request::Prebuild { agent: boxed, rev, bundle: len }
        };
        let reply = self.call(name, request, Some(file.clone()), Some(log)).await;
        let _ = tokio::fs::remove_file(&file).await;
        match reply? {
            Reply::Generation(generation) => {
                if create {
                    self.set_state(name, |s| s.installed = true);
                }
                Ok(generation.into())
            }
            other => Err(self.unexpected(name, &other)),
        }
    }
}

impl Inner {
    /// A stream on the worker's connection, dialling it when there is none.
    async fn open(&self) -> std::result::Result<(SendStream, RecvStream), Unanswerable> {
        let conn = self.connection().await?;
        match conn.open_bi().await {
            Ok(stream) => Ok(stream),
            Err(_) => {
                // The connection died since: dial once more.
                *self.conn.lock().await = None;
                let conn = self.connection().await?;
                conn.open_bi()
                    .await
                    .map_err(|e| Unanswerable::Waiting(format!("opening a stream to the worker: {e}")))
            }
        }
    }

    async fn connection(&self) -> std::result::Result<Connection, Unanswerable> {
        let mut held = self.conn.lock().await;
        if let Some(conn) = held.as_ref().filter(|c| c.close_reason().is_none()) {
            return Ok(conn.clone());
        }
        let addr = (self.locate)()?;
        let dial = self.endpoint.connect(addr, RUNTIME_ALPN);
        let conn = match tokio::time::timeout(DIAL_TIMEOUT, dial).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(err)) => return Err(Unanswerable::Waiting(format!("dialling the worker failed: {err}"))),
            Err(_) => {
                return Err(Unanswerable::Waiting(format!(
                    "the worker did not answer within {DIAL_TIMEOUT:?}"
                )))
            }
        };
        *held = Some(conn.clone());
        Ok(conn)
    }
}

/// Follows the worker's agents until aborted: a list, then changes; redialled with
/// backoff. A watch that had listed and ends is redialled at once; when that fails too,
/// or the node is gone (its record says so, checked at every list), the node is lost: each agent it had gets a
/// [`Change::NodeLost`], and a [`Change::NodeBack`] when a later watch lists them again.
/// Until a first list in this daemon run, a worker not reached yet is waited for.
async fn follow(inner: Arc<Inner>, backoff: Backoff) {
    let mut delay = backoff.min;
    let (mut lost, mut ever_listed, mut retry_at_once) = (false, false, false);
    loop {
        let mut listed = false;
        let why = follow_once(&inner, &mut listed, &mut lost).await;
        tracing::debug!(node = inner.node, %why, retry_in = ?delay, "fleet runtime watch ended");
        if listed {
            // It ran: try again (almost) at once before calling the node lost.
            ever_listed = true;
            retry_at_once = true;
            delay = backoff.min;
            tokio::time::sleep(backoff.min).await;
            continue;
        }
        let verdict = match why {
            Unanswerable::Waiting(why) if ever_listed && retry_at_once => Unanswerable::Lost(why),
            other => other,
        };
        match verdict {
            Unanswerable::Lost(why) if !lost => {
                lost = true;
                inner.lose(&why);
            }
            Unanswerable::Lost(_) => {}
            waiting @ Unanswerable::Waiting(_) => {
                if !lost {
                    *inner.listed.lock().unwrap_or_else(PoisonError::into_inner) = Err(waiting);
                }
            }
        }
        retry_at_once = false;
        tokio::time::sleep(delay).await;
        delay = backoff.next(delay);
    }
}

impl Inner {
    /// Marks every agent of the node lost and tells the subscribers.
    fn lose(&self, why: &str) {
        *self.listed.lock().unwrap_or_else(PoisonError::into_inner) =
            Err(Unanswerable::Lost(why.to_string()));
        let agents: Vec<String> = {
            let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
            states.values_mut().for_each(|s| s.running = false);
            states.keys().cloned().collect()
        };
        for agent in agents {
            tracing::warn!(node = self.node, agent, why, "fleet node lost");
            let change = Change::NodeLost { node: self.node.clone(), why: why.to_string() };
            let _ = self.events.send(RuntimeEvent { agent, change, at: crate::host::now() });
        }
    }
}

/// One watch: returns why it ended. `listed` says whether the worker listed its agents;
/// `lost` is cleared (and each listed agent told [`Change::NodeBack`]) when it does.
async fn follow_once(inner: &Inner, listed: &mut bool, lost: &mut bool) -> Unanswerable {
    let (mut send, mut recv) = match inner.open().await {
        Ok(stream) => stream,
        Err(err) => return err,
    };
    if let Err(err) = wire::write_message(&mut send, &Request::Watch).await {
        return Unanswerable::Waiting(format!("its worker cannot be reached: {err}"));
    }
    loop {
        let reply = match tokio::time::timeout(WATCH_SILENCE, wire::read_message::<_, Reply>(&mut recv)).await
        {
            Ok(Ok(reply)) => reply,
            Ok(Err(err)) => return Unanswerable::Waiting(format!("its worker stopped answering: {err}")),
            Err(_) => return Unanswerable::Waiting(format!("its worker sent nothing for {WATCH_SILENCE:?}")),
        };
        match reply {
            Reply::Agents { agents } => {
                // The node's record is ground truth: a node killed or stopped by command
                // is lost to the daemon even while its worker still answers.
                if let Err(Unanswerable::Lost(why)) = (inner.locate)() {
                    if let Some(conn) = inner.conn.lock().await.take() {
                        conn.close(0u32.into(), b"the node's record says it is gone");
                    }
                    return Unanswerable::Lost(why);
                }
                let names: Vec<String> = agents.iter().map(|s| s.agent.clone()).collect();
                {
                    let mut states = inner.states.lock().unwrap_or_else(PoisonError::into_inner);
                    *states = agents.into_iter().map(|s| (s.agent.clone(), s)).collect();
                }
                *inner.listed.lock().unwrap_or_else(PoisonError::into_inner) = Ok(());
                *listed = true;
                if std::mem::take(lost) {
                    tracing::info!(node = inner.node, "fleet node reachable again");
                    for agent in names {
                        let change = Change::NodeBack { node: inner.node.clone() };
                        let _ = inner.events.send(RuntimeEvent { agent, change, at: crate::host::now() });
                    }
                }
            }
            Reply::Event(event) => {
                let event = RuntimeEvent::from(event);
                {
                    let mut states = inner.states.lock().unwrap_or_else(PoisonError::into_inner);
                    let state = states.entry(event.agent.clone()).or_insert_with(|| AgentState {
                        agent: event.agent.clone(),
                        installed: true,
                        running: false,
                    });
                    match &event.change {
                        Change::Started { .. } => state.running = true,
                        Change::Exited(_) => state.running = false,
                        Change::Swapped(_) => state.installed = true,
                        Change::Destroyed => {
                            states.remove(&event.agent);
                        }
                        // Only the daemon's side makes these.
                        Change::NodeLost { .. } | Change::NodeBack { .. } => continue,
                    }
                }
                let _ = inner.events.send(event);
            }
            other => {
                return Unanswerable::Lost(format!("its worker sent an unexpected watch message {other:?}"))
            }
        }
    }
}

/// Reads raw log chunks into `tx` until the stream or the reader ends.
async fn pump_logs(mut recv: RecvStream, tx: tokio::sync::mpsc::Sender<bytes::Bytes>) {
    loop {
        let mut len = [0u8; 4];
        if recv.read_exact(&mut len).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_CHUNK {
            tracing::warn!(len, "fleet runtime: a log chunk over the limit; ending the stream");
            return;
        }
        let mut chunk = vec![0u8; len];
        if recv.read_exact(&mut chunk).await.is_err() {
            return;
        }
        if tx.send(chunk.into()).await.is_err() {
            return;
        }
    }
}

impl Runtime for RemoteRuntime {
    fn prebuild<'a>(&'a self, agent: &'a Agent, log: &'a dyn BuildLog) -> BoxFuture<'a, Result<Generation>> {
        Box::pin(self.build(agent, log, false))
    }

    fn stop_for_update<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.unit(agent, Request::StopForUpdate { agent: Box::new(agent.clone()) }).await?;
            self.set_state(&agent.metadata.name, |s| s.running = false);
            Ok(())
        })
    }

    fn swap<'a>(&'a self, agent: &'a Agent, generation: &'a Generation) -> BoxFuture<'a, Result<()>> {
        Box::pin(
            self.unit(agent, Request::Swap { agent: Box::new(agent.clone()), generation: generation.into() }),
        )
    }

    fn create<'a>(&'a self, agent: &'a Agent, log: &'a dyn BuildLog) -> BoxFuture<'a, Result<Generation>> {
        Box::pin(self.build(agent, log, true))
    }

    fn start_with<'a>(&'a self, agent: &'a Agent, fallback: Fallback) -> BoxFuture<'a, Result<Started>> {
        Box::pin(async move {
            let name = &agent.metadata.name;
            let request = Request::Start {
                agent: Box::new(agent.clone()),
                cold_start: fallback == Fallback::ColdStart,
            };
            match self.call(name, request, None, None).await? {
                Reply::Started { pid, recovered_from } => {
                    self.set_state(name, |s| s.running = true);
                    Ok(Started {
                        pid,
                        recovered_from: recovered_from.map(|m| Box::new(self.remote(name, m))),
                    })
                }
                other => Err(self.unexpected(name, &other)),
            }
        })
    }

    fn stop<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.unit(agent, Request::Stop { agent: Box::new(agent.clone()) }).await?;
            self.set_state(&agent.metadata.name, |s| s.running = false);
            Ok(())
        })
    }

    fn kill<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.unit(agent, Request::Kill { agent: Box::new(agent.clone()) }).await?;
            self.set_state(&agent.metadata.name, |s| s.running = false);
            Ok(())
        })
    }

    fn signal<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Kick>> {
        Box::pin(async move {
            let name = &agent.metadata.name;
            match self.call(name, Request::Signal { agent: Box::new(agent.clone()) }, None, None).await? {
                Reply::Kick { kick } => Ok(kick.into()),
                other => Err(self.unexpected(name, &other)),
            }
        })
    }

    fn drain<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Drain>> {
        Box::pin(async move {
            let name = &agent.metadata.name;
            match self.call(name, Request::Drain { agent: Box::new(agent.clone()) }, None, None).await? {
                Reply::Drain { drained: true } => Ok(Drain::Drained),
                Reply::Drain { drained: false } => Ok(Drain::TimedOut),
                other => Err(self.unexpected(name, &other)),
            }
        })
    }

    fn write_limits<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Limits>> {
        Box::pin(async move {
            let name = &agent.metadata.name;
            match self.call(name, Request::WriteLimits { agent: Box::new(agent.clone()) }, None, None).await?
            {
                Reply::Limits { cpu_quota, memory_max, enforced, message } => Ok(Limits {
                    cpu_quota,
                    memory_max,
                    enforced,
                    message: format!("on node {}: {message}", self.inner.node),
                }),
                other => Err(self.unexpected(name, &other)),
            }
        })
    }

    fn write_permissions<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.unit(agent, Request::WritePermissions { agent: Box::new(agent.clone()) }))
    }

    fn is_running<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move { Ok(self.observed(agent).await?.running()) })
    }

    fn observed<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Observed>> {
        Box::pin(async move {
            let name = &agent.metadata.name;
            match self.call(name, Request::Observe { agent: Box::new(agent.clone()) }, None, None).await? {
                Reply::Observed(observed) => {
                    let observed = Observed::from(observed);
                    self.set_state(name, |s| {
                        s.running = observed.running();
                        s.installed = observed.generation.is_some();
                    });
                    Ok(observed)
                }
                other => Err(self.unexpected(name, &other)),
            }
        })
    }

    fn destroy<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.unit(agent, Request::Destroy { agent: Box::new(agent.clone()) }).await?;
            self.inner.states.lock().unwrap_or_else(PoisonError::into_inner).remove(&agent.metadata.name);
            Ok(())
        })
    }

    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.inner.events.subscribe()
    }

    fn installed(&self, agent: &str) -> bool {
        self.inner
            .states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(agent)
            .is_some_and(|s| s.installed)
    }

    fn running_now(&self, agent: &str) -> bool {
        self.inner.states.lock().unwrap_or_else(PoisonError::into_inner).get(agent).is_some_and(|s| s.running)
    }

    fn logs<'a>(&'a self, agent: &'a str, options: LogOptions) -> BoxFuture<'a, Result<LogStream>> {
        Box::pin(async move {
            let (mut send, mut recv) =
                self.inner.open().await.map_err(|e| self.remote(agent, e.to_string()))?;
            let request = Request::Logs { agent: agent.to_string(), options: WireLogOptions::from(options) };
            wire::write_message(&mut send, &request).await.map_err(|e| self.remote(agent, e.to_string()))?;
            let _ = send.finish();
            match wire::read_message::<_, Reply>(&mut recv)
                .await
                .map_err(|e| self.remote(agent, e.to_string()))?
            {
                Reply::Logs => {}
                Reply::Failed { no_previous_run: true, .. } => {
                    return Err(Error::NoPreviousRun { agent: agent.into() })
                }
                Reply::Failed { message, .. } => return Err(self.remote(agent, message)),
                other => return Err(self.unexpected(agent, &other)),
            }
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tokio::spawn(pump_logs(recv, tx));
            Ok(rx)
        })
    }

    fn attach<'a>(&'a self, _agents: &'a (dyn Fn() -> Vec<Agent> + Send + Sync)) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.watch() })
    }

    fn answerable(&self, _agent: &Agent) -> std::result::Result<(), Unanswerable> {
        self.watch();
        self.inner.listed.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn agents_outlive_daemon(&self) -> bool {
        // The worker owns them: a container's or a rented machine's worker outlives the
        // daemon with its agents; a local process worker stops them when it ends.
        true
    }
}
