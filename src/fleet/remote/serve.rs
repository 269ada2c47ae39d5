//! The worker's side of the agent runtime protocol: it runs the node's agents with its
//! own [`Runtime`] (the process runtime, in the worker's state directory) and answers
//! the daemon it joined, and no one else, one call per stream.
//!
//! A build arrives with the config repository as a git bundle: the worker never reaches
//! the agent's git remote itself. The bundle lands beside the agent's directory and the
//! build runs from it at the commit the daemon resolved, so what runs on the node is
//! exactly the commit the daemon's deploy trail names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use hive_api::agent::Agent;
use iroh::endpoint::{Connection, RecvStream, SendStream};
use iroh::protocol::{AcceptError, ProtocolHandler};
use iroh::EndpointId;
use tokio::io::AsyncWriteExt;
use tokio::sync::{broadcast, mpsc};

use super::wire::{self as msg, AgentState, Reply, Request, MAX_BUNDLE};
use crate::fleet::net::wire;
use crate::runtime::{self, Fallback, Runtime};

/// How often a watch lists the worker's agents again when nothing changed.
pub const WATCH_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(10);

/// The worker's agent runtime service.
#[derive(Clone)]
pub struct RuntimeService {
    inner: Arc<Inner>,
}

struct Inner {
    node: String,
    daemon: EndpointId,
    runtime: Arc<dyn Runtime>,
    /// Where bundles land: `<dir>/<agent>.bundle`.
    incoming: PathBuf,
    /// The agents' directories (one per agent the runtime has), for a watch's first list.
    agents_dir: PathBuf,
    /// The newest object of each agent the daemon named, to stop it when the worker ends.
    seen: Mutex<HashMap<String, Agent>>,
}

impl std::fmt::Debug for RuntimeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeService").field("node", &self.inner.node).finish_non_exhaustive()
    }
}

impl RuntimeService {
    /// A service for `node` running agents with `runtime` (whose agents live in
    /// `agents_dir`), answering only `daemon`; bundles land in `incoming`.
    pub fn new(
        node: &str,
        daemon: EndpointId,
        runtime: Arc<dyn Runtime>,
        agents_dir: PathBuf,
        incoming: PathBuf,
    ) -> RuntimeService {
        RuntimeService {
            inner: Arc::new(Inner {
                node: node.to_string(),
                daemon,
                runtime,
                incoming,
                agents_dir,
                seen: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Stops every agent that runs (the worker is ending: a process worker's agents end
    /// with it, as the Myelin document has local children end with their daemon).
    pub async fn stop_all(&self) {
        let seen: Vec<Agent> =
            self.inner.seen.lock().unwrap_or_else(PoisonError::into_inner).values().cloned().collect();
        for agent in seen {
            if self.inner.runtime.running_now(&agent.metadata.name) {
                if let Err(err) = self.inner.runtime.stop(&agent).await {
                    tracing::warn!(agent = agent.metadata.name, %err, "fleet worker: stopping the agent failed");
                }
            }
        }
    }

    fn remember(&self, agent: &Agent) {
        self.inner
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(agent.metadata.name.clone(), agent.clone());
    }

    /// The agents this worker has a directory for.
    fn known(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.inner.agents_dir) else { return Vec::new() };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| is_agent_name(n))
            .collect();
        names.sort();
        names
    }

    fn states(&self) -> Vec<AgentState> {
        self.known()
            .into_iter()
            .map(|agent| AgentState {
                installed: self.inner.runtime.installed(&agent),
                running: self.inner.runtime.running_now(&agent),
                agent,
            })
            .collect()
    }

    async fn call(self, mut send: SendStream, mut recv: RecvStream) {
        let request: Request = match wire::read_message(&mut recv).await {
            Ok(request) => request,
            Err(wire::WireError::Ended) => return,
            Err(err) => {
                let reply =
                    Reply::Failed { message: format!("unreadable request: {err}"), no_previous_run: false };
                let _ = wire::write_message(&mut send, &reply).await;
                let _ = send.finish();
                return;
            }
        };
        if let Some(name) = request.agent().filter(|n| !is_agent_name(n)) {
            let reply =
                Reply::Failed { message: format!("{name:?} is not an agent name"), no_previous_run: false };
            let _ = wire::write_message(&mut send, &reply).await;
            let _ = send.finish();
            return;
        }
        let rt = &self.inner.runtime;
        let reply = match request {
            Request::Prebuild { agent, rev, bundle } => {
                self.remember(&agent);
                self.build(&mut send, &mut recv, *agent, rev, bundle, false).await
            }
            Request::Create { agent, rev, bundle } => {
                self.remember(&agent);
                self.build(&mut send, &mut recv, *agent, rev, bundle, true).await
            }
            Request::Logs { agent, options } => return self.logs(send, &agent, options).await,
            Request::Watch => return self.watch(send).await,
            Request::StopForUpdate { agent } => done(rt.stop_for_update(&agent).await),
            Request::Swap { agent, generation } => done(rt.swap(&agent, &generation.into()).await),
            Request::Start { agent, cold_start } => {
                self.remember(&agent);
                let fallback = if cold_start { Fallback::ColdStart } else { Fallback::Never };
                match rt.start_with(&agent, fallback).await {
                    Ok(started) => Reply::Started {
                        pid: started.pid,
                        recovered_from: started.recovered_from.map(|e| e.to_string()),
                    },
                    Err(err) => msg::failed(&err),
                }
            }
            Request::Stop { agent } => done(rt.stop(&agent).await),
            Request::Kill { agent } => done(rt.kill(&agent).await),
            Request::Signal { agent } => match rt.signal(&agent).await {
                Ok(kick) => Reply::Kick { kick: (&kick).into() },
                Err(err) => msg::failed(&err),
            },
            Request::Drain { agent } => match rt.drain(&agent).await {
                Ok(drain) => Reply::Drain { drained: drain == runtime::Drain::Drained },
                Err(err) => msg::failed(&err),
            },
            Request::WriteLimits { agent } => match rt.write_limits(&agent).await {
                Ok(l) => Reply::Limits {
                    cpu_quota: l.cpu_quota,
                    memory_max: l.memory_max,
                    enforced: l.enforced,
                    message: l.message,
                },
                Err(err) => msg::failed(&err),
            },
            Request::WritePermissions { agent } => done(rt.write_permissions(&agent).await),
            Request::Observe { agent } => match rt.observed(&agent).await {
                Ok(observed) => Reply::Observed((&observed).into()),
                Err(err) => msg::failed(&err),
            },
            Request::Destroy { agent } => {
                let result = rt.destroy(&agent).await;
                if result.is_ok() {
                    self.inner
                        .seen
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&agent.metadata.name);
                    let _ = std::fs::remove_file(self.bundle_path(&agent.metadata.name));
                }
                done(result)
            }
        };
        let _ = wire::write_message(&mut send, &reply).await;
        let _ = send.finish();
    }

    fn bundle_path(&self, agent: &str) -> PathBuf {
        self.inner.incoming.join(format!("{agent}.bundle"))
    }

    /// Receives the bundle, then builds from it at `rev`, sending each build line.
    async fn build(
        &self,
        send: &mut SendStream,
        recv: &mut RecvStream,
        mut agent: Agent,
        rev: String,
        len: u64,
        create: bool,
    ) -> Reply {
        let name = agent.metadata.name.clone();
        let path = self.bundle_path(&name);
        if let Err(message) = receive_bundle(recv, &path, len).await {
            return Reply::Failed {
                message: format!("agent {name:?}: receiving its config bundle: {message}"),
                no_previous_run: false,
            };
        }
        agent.spec.config.repo = path.to_string_lossy().into_owned();
        agent.spec.config.rev = Some(rev);
        let (lines, mut rx) = mpsc::unbounded_channel::<String>();
        let log = move |line: &str| {
            let _ = lines.send(line.to_string());
        };
        let rt = &self.inner.runtime;
        let result = {
            let build = async {
                if create {
                    rt.create(&agent, &log).await
                } else {
                    rt.prebuild(&agent, &log).await
                }
            };
            tokio::pin!(build);
            let mut open = true;
            loop {
                tokio::select! {
                    result = &mut build => break result,
                    Some(line) = rx.recv(), if open => {
                        open = wire::write_message(send, &Reply::Line { line }).await.is_ok();
                    }
                }
            }
        };
        while let Ok(line) = rx.try_recv() {
            if wire::write_message(send, &Reply::Line { line }).await.is_err() {
                break;
            }
        }
        match result {
            Ok(generation) => Reply::Generation((&generation).into()),
            Err(err) => msg::failed(&err),
        }
    }

    async fn logs(&self, mut send: SendStream, agent: &str, options: msg::WireLogOptions) {
        let mut chunks = match self.inner.runtime.logs(agent, options.into()).await {
            Ok(chunks) => chunks,
            Err(err) => {
                let _ = wire::write_message(&mut send, &msg::failed(&err)).await;
                let _ = send.finish();
                return;
            }
        };
        if wire::write_message(&mut send, &Reply::Logs).await.is_err() {
            return;
        }
        while let Some(chunk) = chunks.recv().await {
            if write_chunk(&mut send, &chunk).await.is_err() {
                return;
            }
        }
        let _ = send.finish();
    }

    async fn watch(&self, mut send: SendStream) {
        let mut events = self.inner.runtime.subscribe();
        if wire::write_message(&mut send, &Reply::Agents { agents: self.states() }).await.is_err() {
            return;
        }
        let mut heartbeat = tokio::time::interval(WATCH_HEARTBEAT);
        heartbeat.tick().await;
        loop {
            let reply = tokio::select! {
                event = events.recv() => match event {
                    Ok(event) => Reply::Event((&event).into()),
                    // Behind: a fresh list puts the daemon's view right again.
                    Err(broadcast::error::RecvError::Lagged(_)) => Reply::Agents { agents: self.states() },
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                // The list again now and then: the daemon hears the node is there.
                _ = heartbeat.tick() => Reply::Agents { agents: self.states() },
            };
            if wire::write_message(&mut send, &reply).await.is_err() {
                return;
            }
        }
    }
}

impl ProtocolHandler for RuntimeService {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        if conn.remote_id() != self.inner.daemon {
            tracing::warn!(
                node = self.inner.node,
                peer = %conn.remote_id().fmt_short(),
                "fleet worker: refused a runtime connection from an endpoint that is not its daemon"
            );
            conn.close(1u32.into(), b"not the daemon this worker joined");
            return Ok(());
        }
        loop {
            let (send, recv) = match conn.accept_bi().await {
                Ok(stream) => stream,
                Err(_) => return Ok(()),
            };
            tokio::spawn(self.clone().call(send, recv));
        }
    }
}

fn done(result: runtime::Result<()>) -> Reply {
    match result {
        Ok(()) => Reply::Done,
        Err(err) => msg::failed(&err),
    }
}

/// A DNS-1123 label, as Agent names are: safe as a file name.
fn is_agent_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Writes one raw log chunk: a `u32` length, then the bytes.
pub(super) async fn write_chunk(send: &mut SendStream, chunk: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(chunk.len()).map_err(|_| std::io::Error::other("log chunk too large"))?;
    send.write_all(&len.to_be_bytes()).await?;
    send.write_all(chunk).await?;
    Ok(())
}

/// Copies exactly `len` bytes of bundle from `recv` to `path` (through a temp file).
async fn receive_bundle(recv: &mut RecvStream, path: &Path, len: u64) -> Result<(), String> {
    if len > MAX_BUNDLE {
        return Err(format!("a bundle of {len} bytes exceeds the limit of {MAX_BUNDLE} bytes"));
    }
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await.map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let tmp = path.with_extension("bundle.tmp");
    let mut file =
        tokio::fs::File::create(&tmp).await.map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let mut left = len;
    let mut buf = vec![0u8; 64 * 1024];
    while left > 0 {
        let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        let Some(n) = recv.read(&mut buf[..want]).await.map_err(|e| format!("reading: {e}"))? else {
            return Err(format!("the stream ended after {} of {len} bytes", len - left));
        };
        file.write_all(&buf[..n]).await.map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        left -= n as u64;
    }
    file.flush().await.map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    drop(file);
    tokio::fs::rename(&tmp, path).await.map_err(|e| format!("renaming {}: {e}", tmp.display()))
}
