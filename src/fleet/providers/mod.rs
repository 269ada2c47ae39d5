//! Fleet providers: what actually creates and destroys a node — `process` (local worker
//! processes), `docker` (containers on a Docker Engine) and `vastai` (leased Vast.ai
//! instances) — and [`Providers`], this daemon's view of every `Provider` object: its
//! readiness and, for Vast.ai, the API key held in memory.
//!
//! Readiness is computed here and written to the Provider's status by the fleet's
//! provider controller (`super::status`): a provider without credentials is
//! `Unconfigured`, one whose settings or credentials fail their check is
//! `ConfigurationError` with the reason, and neither ever keeps the daemon from starting.

pub mod docker;
pub mod process;
pub mod vastai;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use hive_api::provider::{Provider, ProviderState, ProviderType};

use docker::DockerNodes;
use vastai::{ApiKey, Readiness, VastClient, VastConfig};

/// What one Provider object is, as far as this daemon knows.
#[derive(Clone)]
pub struct Entry {
    /// The Provider's type.
    pub type_: ProviderType,
    /// The `metadata.generation` this entry was computed from.
    pub generation: i64,
    /// Whether it takes commands, and why not.
    pub readiness: Readiness,
    /// The Vast.ai client, once a key checked out.
    pub vast: Option<VastClient>,
    /// The Docker client, once the engine answered.
    pub docker: Option<Arc<DockerNodes>>,
    /// When the check ran.
    pub checked_at: std::time::Instant,
}

/// The readiness of every Provider, and the in-memory credentials configured at runtime.
#[derive(Default)]
pub struct Providers {
    entries: Mutex<HashMap<String, Entry>>,
    /// Vast.ai keys given by ConfigureProvider, by Provider name. Never persisted,
    /// returned or logged.
    keys: Mutex<HashMap<String, ApiKey>>,
    /// Serializes checks, so a slow check cannot overwrite a newer one.
    checking: tokio::sync::Mutex<()>,
}

fn readiness(state: ProviderState, message: impl Into<String>) -> Readiness {
    Readiness { state, message: message.into() }
}

impl Providers {
    /// An empty registry.
    pub fn new() -> Arc<Providers> {
        Arc::new(Providers::default())
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The entry of the Provider `name`, if it was checked.
    pub fn get(&self, name: &str) -> Option<Entry> {
        self.entries().get(name).cloned()
    }

    /// The Vast.ai client of `name` when it is ready, else why not.
    pub fn vast(&self, name: &str) -> Result<VastClient, String> {
        let entry = self.get(name).ok_or_else(|| format!("provider {name:?} has not been checked yet"))?;
        match (entry.readiness.state, entry.vast) {
            (ProviderState::Ready, Some(client)) => Ok(client),
            (state, _) => Err(not_ready(name, state, &entry.readiness.message)),
        }
    }

    /// The Docker client of `name` when it is ready, else why not.
    pub fn docker(&self, name: &str) -> Result<Arc<DockerNodes>, String> {
        let entry = self.get(name).ok_or_else(|| format!("provider {name:?} has not been checked yet"))?;
        match (entry.readiness.state, entry.docker) {
            (ProviderState::Ready, Some(client)) => Ok(client),
            (state, _) => Err(not_ready(name, state, &entry.readiness.message)),
        }
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
    pub async fn check(&self, provider: &Provider, key: Option<ApiKey>) -> Result<Entry, String> {
        let _serial = self.checking.lock().await;
        let name = provider.metadata.name.clone();
        let configured = key.is_some();
        let key =
            key.or_else(|| self.keys.lock().unwrap_or_else(PoisonError::into_inner).get(&name).cloned());
        let entry = compute(provider, key.clone()).await;
        if configured {
            if entry.readiness.state != ProviderState::Ready {
                return Err(entry.readiness.message);
            }
            if let Some(key) = key {
                self.keys.lock().unwrap_or_else(PoisonError::into_inner).insert(name.clone(), key);
            }
        }
        self.entries().insert(name, entry.clone());
        Ok(entry)
    }
}

fn not_ready(name: &str, state: ProviderState, message: &str) -> String {
    let hint = match state {
        ProviderState::Unconfigured => {
            format!("; configure it: hive fleet configure {name} --api-key-file FILE")
        }
        _ => String::new(),
    };
    format!("provider {name:?} is {}: {message}{hint}", state.as_str())
}

/// The readiness of `provider` with `key` (the in-memory Vast.ai key, if any).
async fn compute(provider: &Provider, key: Option<ApiKey>) -> Entry {
    let type_ = provider.spec.type_;
    let generation = provider.metadata.generation.unwrap_or(0);
    let mut entry = Entry {
        type_,
        generation,
        readiness: readiness(ProviderState::Ready, ""),
        vast: None,
        docker: None,
        checked_at: std::time::Instant::now(),
    };
    match type_ {
        ProviderType::Process => {
            entry.readiness = readiness(ProviderState::Ready, "local worker processes of this daemon");
        }
        ProviderType::Vastai => {
            let settings = provider.spec.vastai.clone().unwrap_or_default();
            let key = match key.map(Ok).or_else(|| ApiKey::from_settings(&settings).transpose()) {
                None => {
                    entry.readiness = readiness(
                        ProviderState::Unconfigured,
                        "no Vast.ai API key: configure one (hive fleet configure, the dashboard's \
                         /provision page, or spec.vastai.apiKeyFile / apiKeyEnv)",
                    );
                    return entry;
                }
                Some(Err(why)) => {
                    entry.readiness = readiness(ProviderState::ConfigurationError, why);
                    return entry;
                }
                Some(Ok(key)) => key,
            };
            let config = VastConfig::from_settings(&settings, key);
            // The credential check answers an operator who is waiting: one quick retry,
            // not the patient policy the client uses for leases and destroys.
            let mut quick = config.clone();
            quick.retry = vastai::RetryPolicy {
                max_attempts: 2,
                base_delay: std::time::Duration::from_millis(500),
                ..Default::default()
            };
            quick.connect_timeout = std::time::Duration::from_secs(5);
            quick.request_timeout = std::time::Duration::from_secs(15);
            match VastClient::new(quick)
                .and_then(|checker| VastClient::new(config).map(|client| (checker, client)))
            {
                Err(err) => entry.readiness = readiness(ProviderState::ConfigurationError, err.to_string()),
                Ok((checker, client)) => {
                    entry.readiness = checker.validate().await;
                    entry.vast = Some(client);
                }
            }
        }
        ProviderType::Docker => {
            let settings = provider.spec.docker.clone().unwrap_or_default();
            match DockerNodes::connect(settings.host.as_deref()).await {
                Err(err) => entry.readiness = readiness(ProviderState::ConfigurationError, err.to_string()),
                Ok(client) => match client.ping().await {
                    Err(err) => {
                        entry.readiness = readiness(ProviderState::ConfigurationError, err.to_string())
                    }
                    Ok(()) => {
                        entry.readiness = readiness(
                            ProviderState::Ready,
                            format!("Docker Engine answers; image {}", settings.image),
                        );
                        entry.docker = Some(Arc::new(client));
                    }
                },
            }
        }
    }
    entry
}
