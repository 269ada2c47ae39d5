//! The fleet's membership sink: a worker's Join or RejoinHello is checked against its
//! node record and persisted (endpoint, addresses, GPUs, runtime facts, the control
//! generation it binds to) before the daemon welcomes it. A Join ends the wait of the
//! Provision that created the node; a Rejoin (a worker that survived a daemon restart)
//! restarts the node's telemetry pull.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use hive_api::meta::Time;
use hive_api::node::{Gpu, Node, NodePhase, RuntimeFacts};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::error::{Error, Result};
use super::net::control::AdmitFuture;
use super::net::{Hello, HelloKind, Members};
use super::Fleet;
use crate::client::Api;
use crate::store::{Mutation, Store, Subresource};

/// Persists joins; see the module docs.
pub(super) struct Membership {
    store: Store,
    nodes: Api<Node>,
    waiters: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
    fleet: OnceLock<Weak<Fleet>>,
    /// This run's control generation, which a welcomed worker binds to.
    generation: u64,
}

impl Membership {
    pub(super) fn new(store: Store, generation: u64) -> Arc<Membership> {
        Arc::new(Membership {
            nodes: Api::new(&store),
            store,
            waiters: Arc::default(),
            fleet: OnceLock::new(),
            generation,
        })
    }

    /// Lets admitted Rejoins restart telemetry through `fleet`.
    pub(super) fn attach(&self, fleet: &Arc<Fleet>) {
        let _ = self.fleet.set(Arc::downgrade(fleet));
    }

    /// Resolves at `node`'s next admitted Join or Rejoin.
    pub(super) fn waiter(&self, node: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner).insert(node.to_string(), tx);
        rx
    }

    /// Drops the waiter of `node` (its Provision stopped waiting).
    pub(super) fn forget_waiter(&self, node: &str) {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner).remove(node);
    }

    fn fleet(&self) -> Option<Arc<Fleet>> {
        self.fleet.get().and_then(Weak::upgrade)
    }
}

/// The internal (unserved) store kind holding each node's join-token hash.
pub(super) const TOKEN_KIND: &str = "fleetjointokens";

/// One node's join-token record, an object of [`TOKEN_KIND`].
#[derive(Debug, Serialize, Deserialize)]
struct TokenRecord {
    metadata: TokenMeta,
    /// The hex SHA-256 of the token.
    sha256: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct TokenMeta {
    name: String,
}

/// Makes `node` a new join token and records its hash durably (before the node's
/// resource exists); returns the token, which only the worker is given.
pub(super) async fn issue_token(store: &Store, node: &str) -> Result<String> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| Error::Random)?;
    let token = crate::auth::hex(&bytes);
    let record = TokenRecord {
        metadata: TokenMeta { name: node.to_string() },
        sha256: crate::auth::token_sha256(&token),
    };
    let object = serde_json::to_value(&record).expect("a token record encodes");
    // No resourceVersion: a newer token replaces whatever was recorded.
    let mutation = match store.get(TOKEN_KIND, node) {
        Some(_) => Mutation::Update { kind: TOKEN_KIND, object, subresource: Subresource::Main },
        None => Mutation::Create { kind: TOKEN_KIND, object },
    };
    store.commit(mutation, false).await.map_err(Error::JoinToken)?;
    Ok(token)
}

/// Whether `hello` carries the join token recorded for its node.
fn token_matches(store: &Store, hello: &Hello) -> bool {
    let Some(recorded) = store.get(TOKEN_KIND, &hello.node) else { return false };
    let Ok(recorded) = recorded.decode::<TokenRecord>() else { return false };
    let Some(token) = &hello.join_token else { return false };
    let (want, got) = (recorded.sha256.as_str(), crate::auth::token_sha256(&token.0));
    // Digests of a 256-bit secret: compared without an early exit all the same.
    want.len() == got.len() && want.bytes().zip(got.bytes()).fold(0, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Why a Hello for `node` (as stored) is refused, if it is.
fn refusal(hello: &Hello, node: Option<&Node>) -> Option<String> {
    let Some(node) = node else {
        return Some(format!("{}: no such node in this fleet", hello.node));
    };
    if node.spec.logical_id != hello.logical_id {
        return Some(format!(
            "{}: logical id {} does not match the record ({})",
            hello.node, hello.logical_id, node.spec.logical_id
        ));
    }
    let recorded = node.status.endpoint_id.as_deref();
    if hello.kind == HelloKind::Rejoin && recorded.is_some_and(|e| e != hello.endpoint_id) {
        return Some(format!(
            "{}: a rejoin must come from the endpoint that joined ({}), not {}",
            hello.node,
            recorded.unwrap_or_default(),
            hello.endpoint_id
        ));
    }
    // Provider state is ground truth: a Failed node (its join timed out, its resource
    // left running) or a Stopped one (found stopped at start, started again since) whose
    // worker proves itself with the node's token is live again.
    match node.status.phase {
        Some(
            NodePhase::Pending
            | NodePhase::Provisioning
            | NodePhase::Running
            | NodePhase::Failed
            | NodePhase::Stopped,
        ) => None,
        Some(phase) => Some(format!("{}: the node is {} and takes no worker", hello.node, phase.as_str())),
        None => Some(format!("{}: the node was not created by a command", hello.node)),
    }
}

impl Members for Membership {
    fn admit(&self, hello: Hello) -> AdmitFuture {
        let store = self.store.clone();
        let nodes = self.nodes.clone();
        let fleet = self.fleet();
        let generation = self.generation;
        let waiters = self.waiters.clone();
        Box::pin(async move {
            // A record that does not decode is no node this fleet can admit a worker for.
            let stored = nodes.get(&hello.node).ok().flatten();
            let why = refusal(&hello, stored.as_ref()).or_else(|| {
                (!token_matches(&store, &hello)).then(|| {
                    format!(
                        "{}: the join token is missing or wrong (it is given to the node's worker only)",
                        hello.node
                    )
                })
            });
            if let Some(why) = why {
                tracing::warn!(node = hello.node, why, "fleet: worker refused");
                return Err(why);
            }
            let generation = Some(generation);
            let facts = RuntimeFacts {
                hostname: hello.facts.hostname.clone(),
                cpus: hello.facts.cpus,
                memory_total_bytes: hello.facts.memory_total_bytes,
                agent_only: hello.facts.agent_only,
                started_at: Some(Time(hello.facts.started_at)),
                joined_by: format!("{:?}", hello.kind),
                joined_at: Some(Time(store.now())),
                control_generation: generation,
            };
            let gpus: Vec<Gpu> = hello
                .facts
                .gpus
                .iter()
                // A Node's GPUs must have names: one the worker could not name is recorded as
                // such rather than refusing the worker.
                .map(|g| Gpu {
                    name: if g.name.trim().is_empty() { "unknown".into() } else { g.name.clone() },
                    memory_mib: Some(g.memory_mib),
                })
                .collect();
            let addresses: Vec<String> = hello.addresses.iter().map(ToString::to_string).collect();
            let back = format!("its worker joined again ({:?}); waiting for its telemetry", hello.kind);
            let written = nodes
                .patch_status(&hello.node, |s| {
                    if matches!(s.phase, Some(NodePhase::Failed | NodePhase::Stopped)) {
                        // Observed alive: the telemetry pull that follows makes it Running.
                        s.phase = Some(NodePhase::Provisioning);
                        s.error = Some(back.clone());
                        s.finished_at = None;
                    }
                    s.endpoint_id = Some(hello.endpoint_id.clone());
                    s.addresses = addresses.clone();
                    s.gpus = gpus.clone();
                    s.runtime = Some(facts.clone());
                    s.sync_ready(Time(store.now()));
                })
                .await;
            if let Err(err) = written {
                tracing::warn!(node = hello.node, %err, "fleet: persisting a worker's facts failed");
                return Err(format!("{}: persisting the worker's facts failed; retry", hello.node));
            }
            tracing::info!(node = hello.node, kind = ?hello.kind, generation, "fleet: worker admitted");
            // Taken only now: a Hello that failed to persist leaves the Provision waiting
            // for the worker's retry.
            let waiter = waiters.lock().unwrap_or_else(PoisonError::into_inner).remove(&hello.node);
            // The Provision that created the node, if still waiting, pulls telemetry next;
            // otherwise (a worker back after a lost connection or a daemon restart, or one
            // that joined after its Provision gave up) the pull restarts here, after the
            // Welcome has gone out.
            let handed = waiter.is_some_and(|w| w.send(()).is_ok());
            if !handed {
                if let Some(fleet) = fleet {
                    let node = hello.node.clone();
                    let owner = fleet.clone();
                    owner.spawn(async move {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        if let Err(err) = fleet.resume_telemetry(&node).await {
                            tracing::warn!(node, %err, "fleet: telemetry after rejoin failed");
                        }
                    });
                }
            }
            Ok(())
        })
    }
}
