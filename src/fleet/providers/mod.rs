//! Fleet providers: what actually creates and destroys a node — `process` (local worker
//! processes), `docker` (containers on a Docker Engine) and `vastai` (leased Vast.ai
//! instances), each an implementation of [`Provider`] — and [`Providers`], this daemon's
//! view of every `Provider` object: its readiness, its checked implementation and, for
//! Vast.ai, the API key held in memory.
//!
//! Readiness is computed here and written to the Provider's status by the fleet's
//! provider controller (`super::status`): a provider without credentials is
//! `Unconfigured`, one whose settings or credentials fail their check is
//! `ConfigurationError` with the reason, and neither ever keeps the daemon from starting.
//!
//! [`Provider`] methods return [`BoxFuture`]s: the trait must be object-safe, so that an
//! [`Entry`] holds one `Arc<dyn Provider>` whatever the type, and an `async fn` in a
//! trait is not (the crate does not use `async-trait`, which boxes the same way behind
//! a macro). An enum of the three would put back the `match` on the provider type in
//! every operation. One allocation per call is nothing beside a process spawn or an
//! HTTP request.

pub mod docker;
pub mod keys;
pub mod process;
pub mod vastai;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use hive_api::node::{Node, ProviderRef};
use hive_api::provider::{Provider as ProviderObject, ProviderSpec, ProviderState, ProviderType};
use tokio::sync::oneshot;

use super::error::{Error, Result};
use super::net::FleetNet;
use docker::provider::DockerFleet;
use keys::KeySources;
use process::{LocalWorkers, ProcessProvider};
use vastai::provider::VastFleet;
use vastai::{ApiKey, VastClient};

pub use vastai::Readiness;

/// The environment variable that gives a worker its node's join token.
pub const JOIN_TOKEN_ENV: &str = "HIVE_JOIN_TOKEN";

/// How long a command waits for its provider's first check after the daemon started.
pub const PROVIDER_CHECK_WAIT: Duration = Duration::from_secs(30);

/// What the fleet does with one kind of provider: create a node's resource, destroy it,
/// list what this fleet owns there (recovery), and check settings and credentials. An
/// implementation holds the provider's clients; the Provider's settings come with each
/// create, as stored then.
pub trait Provider: Send + Sync {
    /// Checks the provider's settings and credentials against it (the Docker Engine
    /// answers; Vast.ai accepts the key).
    fn check(&self) -> BoxFuture<'_, Readiness>;

    /// Creates the resource of `launch.node`, whose worker is given `launch.token` and
    /// told where the daemon is. Called once per node, by its Provision only.
    fn create<'a>(&'a self, launch: &'a Launch<'a>) -> BoxFuture<'a, Result<Created>>;

    /// Destroys the resource `reference` of `node` (gone already is success); says what
    /// was done, for the log. Called by a Kill only.
    fn destroy<'a>(&'a self, node: &'a str, reference: &'a ProviderRef) -> BoxFuture<'a, Result<String>>;

    /// Every resource at the provider carrying this daemon's `fleet` label, for recovery
    /// to adopt, mark Stopped or report as Orphaned. Reads only.
    fn list<'a>(&'a self, fleet: &'a str) -> BoxFuture<'a, Result<Vec<Found>>>;

    /// Whether the provider's resources end with this daemon or outlive it.
    fn lifetime(&self) -> Lifetime;

    /// The Vast.ai client, for the offer search only Vast.ai has.
    fn vast(&self) -> Option<VastClient> {
        None
    }
}

/// Whether a provider's resources outlive the daemon that created them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// They end with this daemon (local workers on its stdin pipe): nothing is recovered
    /// after a restart, and a node whose worker never joined is stopped at once.
    Supervised,
    /// They outlive it (containers, instances): recovery adopts them, and a node whose
    /// worker never joined is left as it is until a Kill.
    Detached,
}

/// What a node's create needs besides the provider itself.
pub struct Launch<'a> {
    /// The node record; its spec says what was asked for.
    pub node: &'a Node,
    /// The join token only the node's worker is given.
    pub token: &'a str,
    /// The Provider's spec as stored now, `None` when there is no Provider object (the
    /// built-in `process` needs none).
    pub spec: Option<&'a ProviderSpec>,
    /// The daemon's iroh endpoint, which the worker dials.
    pub net: &'a FleetNet,
    /// This daemon's fleet label (its identity's fingerprint), which resources carry.
    pub fleet_label: &'a str,
    /// This run's id, which containers carry.
    pub run_id: &'a str,
    /// The addresses workers on other hosts dial, when not the bound one (every
    /// replica's, among replicas).
    pub advertise: &'a [SocketAddr],
    /// The Docker network of nodes whose Provider names none.
    pub docker_network: &'a str,
}

impl Launch<'_> {
    /// The Provider's spec; an error when its object is gone.
    pub fn spec(&self) -> Result<&ProviderSpec> {
        self.spec.ok_or_else(|| Error::ProviderGone { provider: self.node.spec.provider.clone() })
    }

    /// The node's image: the command's, else `provider_default`.
    pub fn image(&self, provider_default: Option<&str>) -> Result<String> {
        self.node
            .spec
            .image
            .clone()
            .or_else(|| provider_default.map(str::to_string))
            .filter(|i| !i.trim().is_empty())
            .ok_or_else(|| Error::NoImage { provider: self.node.spec.provider.clone() })
    }
}

/// The arguments every worker takes: its logical id and where the daemon is.
pub fn worker_args(node: &Node, control: String) -> Vec<String> {
    vec!["--logical-id".into(), node.spec.logical_id.to_string(), "--control".into(), control]
}

/// A node's resource, just created.
pub struct Created {
    /// The provider's handle on it, recorded in the node's status.
    pub reference: ProviderRef,
    /// For a local worker: resolves once it printed its ready line, and fails when it
    /// exits first.
    pub ready: Option<oneshot::Receiver<()>>,
    /// How long its worker may take to join.
    pub join_timeout: Duration,
}

/// What recovery found of one node at its provider.
#[derive(Debug)]
pub struct Found {
    /// The node its labels name, if any.
    pub node: Option<String>,
    /// The logical id its labels name, if any.
    pub logical_id: Option<u64>,
    /// The command its labels name, if any.
    pub command: Option<String>,
    /// The provider's handle on it.
    pub reference: ProviderRef,
    /// Whether the resource runs.
    pub running: bool,
    /// The provider's word for its state.
    pub state: String,
}

/// What one Provider object is, as far as this daemon knows.
#[derive(Clone)]
pub struct Entry {
    /// The Provider's type.
    pub type_: ProviderType,
    /// The `metadata.generation` this entry was computed from.
    pub generation: i64,
    /// Whether it takes commands, and why not.
    pub readiness: Readiness,
    /// The implementation the check ran against, once its clients could be built (it
    /// takes commands only when `readiness` is Ready).
    pub provider: Option<Arc<dyn Provider>>,
    /// When the check ran.
    pub checked_at: std::time::Instant,
}

/// The readiness of every Provider, and the in-memory credentials configured at runtime.
pub struct Providers {
    entries: Mutex<HashMap<String, Entry>>,
    /// Vast.ai keys given by ConfigureProvider, by Provider name. Never persisted,
    /// returned or logged.
    keys: Mutex<HashMap<String, ApiKey>>,
    /// Serializes checks, so a slow check cannot overwrite a newer one.
    checking: tokio::sync::Mutex<()>,
    /// This daemon's local workers: every `process` Provider's implementation, ready
    /// without a check, and what is left to stop of a node whose Provider is gone.
    local: Arc<dyn Provider>,
    /// Where Providers may take a key from on this host (`hive serve`'s flags).
    sources: KeySources,
    /// Whether the fleet endpoint listens on loopback only: then no container can reach
    /// it, and a `docker` Provider is not Ready, saying why.
    loopback_only: bool,
}

fn readiness(state: ProviderState, message: impl Into<String>) -> Readiness {
    Readiness { state, message: message.into() }
}

impl Providers {
    /// An empty registry whose `process` providers run workers through `process` and
    /// whose Vast.ai providers read keys only from `sources`.
    pub fn new(process: Arc<ProcessProvider>, sources: KeySources) -> Arc<Providers> {
        Providers::listening(process, sources, false)
    }

    /// [`Providers::new`] for a fleet endpoint bound to loopback addresses only when
    /// `loopback_only`: `docker` Providers are then a configuration error.
    pub fn listening(
        process: Arc<ProcessProvider>,
        sources: KeySources,
        loopback_only: bool,
    ) -> Arc<Providers> {
        Arc::new(Providers {
            entries: Mutex::default(),
            keys: Mutex::default(),
            checking: tokio::sync::Mutex::const_new(()),
            local: Arc::new(LocalWorkers(process)),
            sources,
            loopback_only,
        })
    }

    /// Where Providers may take a key from on this host: admission checks every
    /// Provider write against it.
    pub fn key_sources(&self) -> &KeySources {
        &self.sources
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The entry of the Provider `name`, if it was checked.
    pub fn get(&self, name: &str) -> Option<Entry> {
        self.entries().get(name).cloned()
    }

    /// The local workers' implementation.
    pub fn local(&self) -> Arc<dyn Provider> {
        self.local.clone()
    }

    /// The implementation of Provider `name` (of `type_`) when it is ready, else why
    /// not. Local workers need no check.
    pub fn ready(&self, name: &str, type_: ProviderType) -> Result<Arc<dyn Provider>> {
        if type_ == ProviderType::Process {
            return Ok(self.local());
        }
        let entry = self.get(name).ok_or_else(|| Error::NotChecked { provider: name.to_string() })?;
        match (entry.readiness.state, entry.provider) {
            (ProviderState::Ready, Some(provider)) => Ok(provider),
            (state, _) => {
                Err(Error::NotReady { provider: name.to_string(), state, message: entry.readiness.message })
            }
        }
    }

    /// [`Providers::ready`], after waiting (boundedly) until the provider controller
    /// checked `name` once: a command that arrives right after the daemon started must
    /// not fail for being early.
    pub async fn checked(&self, name: &str, type_: ProviderType) -> Result<Arc<dyn Provider>> {
        if type_ != ProviderType::Process {
            let deadline = tokio::time::Instant::now() + PROVIDER_CHECK_WAIT;
            while self.get(name).is_none() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        self.ready(name, type_)
    }

    /// The Vast.ai client of `name` when it is ready, else why not.
    pub fn vast(&self, name: &str) -> Result<VastClient> {
        self.ready(name, ProviderType::Vastai)?
            .vast()
            .ok_or_else(|| Error::NotChecked { provider: name.to_string() })
    }

    /// Records `entry` as the readiness of `name` (after a check against a spec that was
    /// then stored under a new generation).
    pub fn record(&self, name: &str, entry: Entry) {
        self.entries().insert(name.to_string(), entry);
    }

    /// Forgets a deleted Provider (and its in-memory key).
    pub fn remove(&self, name: &str) {
        self.entries().remove(name);
        self.keys.lock().unwrap_or_else(PoisonError::into_inner).remove(name);
    }

    /// Checks `provider` (its settings and credentials) and records the outcome.
    /// `key` replaces the in-memory Vast.ai key when the check with it succeeds; a key
    /// that fails changes nothing and the error is returned.
    pub async fn check(&self, provider: &ProviderObject, key: Option<ApiKey>) -> Result<Entry> {
        let _serial = self.checking.lock().await;
        let name = provider.metadata.name.clone();
        let configured = key.is_some();
        let key =
            key.or_else(|| self.keys.lock().unwrap_or_else(PoisonError::into_inner).get(&name).cloned());
        let entry = self.compute(provider, key.clone()).await;
        if configured {
            if entry.readiness.state != ProviderState::Ready {
                return Err(Error::CheckFailed { message: entry.readiness.message });
            }
            if let Some(key) = key {
                self.keys.lock().unwrap_or_else(PoisonError::into_inner).insert(name.clone(), key);
            }
        }
        self.entries().insert(name, entry.clone());
        Ok(entry)
    }

    /// The readiness of `provider` with `key` (the in-memory Vast.ai key, if any): its
    /// implementation is built from its settings, then checked.
    async fn compute(&self, provider: &ProviderObject, key: Option<ApiKey>) -> Entry {
        let type_ = provider.spec.type_;
        let checked_at = std::time::Instant::now();
        let built = match type_ {
            ProviderType::Process => Ok(self.local()),
            ProviderType::Vastai => {
                let settings = provider.spec.vastai.clone().unwrap_or_default();
                let name = provider.metadata.name.as_str();
                match key.map(Ok).or_else(|| self.sources.key(name, &settings).transpose()) {
                    None => Err(readiness(
                        ProviderState::Unconfigured,
                        "no Vast.ai API key: configure one (hive fleet configure, the dashboard's \
                         /provision page, or spec.vastai.apiKeyFile / apiKeyEnv naming a source the \
                         operator allowed with --provider-key-dir / --provider-key-env)",
                    )),
                    Some(Err(why)) => Err(readiness(ProviderState::ConfigurationError, why)),
                    Some(Ok(key)) => VastFleet::connect(&settings, key),
                }
            }
            // Whatever the engine says, no container could reach this daemon: not Ready,
            // in the words a create would fail with.
            ProviderType::Docker if self.loopback_only => {
                Err(readiness(ProviderState::ConfigurationError, Error::LoopbackOnly.to_string()))
            }
            ProviderType::Docker => {
                DockerFleet::connect(&provider.spec.docker.clone().unwrap_or_default()).await
            }
        };
        let (readiness, provider_impl) = match built {
            Ok(implementation) => (implementation.check().await, Some(implementation)),
            Err(readiness) => (readiness, None),
        };
        Entry {
            type_,
            generation: provider.metadata.generation.unwrap_or(0),
            readiness,
            provider: provider_impl,
            checked_at,
        }
    }
}
