//! [`FleetService`]: what the server's fleet routes ask of the running fleet — the
//! default provider, where Providers may read a key, SearchOffers, ConfigureProvider,
//! a node's telemetry — as plain data in and out. The server holds an
//! `Arc<dyn FleetService>` and never the [`Fleet`], so a replica that does not lead can
//! answer through an implementation that reaches the leader (issue 30, high
//! availability); the one implementation today is this process's fleet.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use hive_api::provider::{OfferFilter, Provider, ProviderState, ProviderType};
use tokio::sync::broadcast;

use super::net::{Frame, TelemetrySnapshot};
use super::providers::keys::KeySources;
use super::providers::vastai::{ApiKey, Offer, VastError};
use super::Fleet;
use crate::client::{self, Api};

/// Why a [`FleetService`] call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The provider cannot answer now: it is not ready, or was never checked.
    #[error(transparent)]
    NotReady(super::Error),
    /// Vast.ai answered an offer search with an error.
    #[error("searching Vast.ai offers failed: {0}")]
    Search(#[source] VastError),
    /// The settings or the key did not check out; nothing was changed.
    #[error("{0}; nothing was changed")]
    Check(#[source] super::Error),
    /// Storing the Provider failed.
    #[error(transparent)]
    Client(#[from] client::Error),
}

/// A node's telemetry: what the hub holds now and, when followed, the frames after it.
pub struct Telemetry {
    /// Its channels and recent frames.
    pub snapshot: TelemetrySnapshot,
    /// The live frames (subscribed before the snapshot was taken, so none falls between
    /// them), when asked to follow.
    pub live: Option<broadcast::Receiver<Frame>>,
}

/// What the server's fleet routes ask of the fleet (see the module documentation).
pub trait FleetService: Send + Sync {
    /// The name of the provider commands use when they name none.
    fn default_provider(&self) -> String;

    /// The type of the default provider, if its Provider object exists.
    fn default_provider_type(&self) -> Option<ProviderType>;

    /// Where Providers may take a Vast.ai key from on this host (`hive serve`'s flags).
    fn key_sources(&self) -> &KeySources;

    /// SearchOffers: Vast.ai provider `provider`'s offers matching `filter`, leasing
    /// nothing.
    fn search_offers(
        &self,
        provider: String,
        filter: OfferFilter,
    ) -> BoxFuture<'_, Result<Vec<Offer>, Error>>;

    /// ConfigureProvider, after admission: checks `wanted` with `key`; only when they
    /// check out, keeps the key, stores `wanted` when it is new or its spec differs from
    /// `current`'s, records the check (against the stored generation) and the Provider's
    /// status, and starts the provider's recovery once it is ready.
    fn configure_provider(
        &self,
        current: Option<Provider>,
        wanted: Provider,
        key: Option<ApiKey>,
    ) -> BoxFuture<'_, Result<(), Error>>;

    /// Node `node`'s telemetry, with its live frames when `follow`.
    fn telemetry(&self, node: String, follow: bool) -> BoxFuture<'_, Telemetry>;
}

impl FleetService for Arc<Fleet> {
    fn default_provider(&self) -> String {
        Fleet::default_provider(self).to_string()
    }

    fn default_provider_type(&self) -> Option<ProviderType> {
        Fleet::default_provider_type(self)
    }

    fn key_sources(&self) -> &KeySources {
        self.providers.key_sources()
    }

    fn search_offers(
        &self,
        provider: String,
        filter: OfferFilter,
    ) -> BoxFuture<'_, Result<Vec<Offer>, Error>> {
        Box::pin(async move {
            let client = self.providers.vast(&provider).map_err(Error::NotReady)?;
            client.search_offers(&filter).await.map_err(Error::Search)
        })
    }

    fn configure_provider(
        &self,
        current: Option<Provider>,
        mut wanted: Provider,
        key: Option<ApiKey>,
    ) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let name = wanted.metadata.name.clone();
            let entry = self.providers.check(&wanted, key).await.map_err(Error::Check)?;
            let ready = entry.readiness.state == ProviderState::Ready;
            if current.as_ref().is_none_or(|current| wanted.spec != current.spec) {
                // No resourceVersion precondition: the settings just checked are what is stored.
                wanted.metadata.resource_version = None;
                let providers = Api::<Provider>::new(&self.store);
                let stored = match current {
                    Some(_) => providers.replace(&wanted).await?,
                    None => providers.create(&wanted).await?,
                };
                // The check ran against the new spec; record it against the new generation.
                let mut entry = entry;
                entry.generation = stored.metadata.generation.unwrap_or(entry.generation);
                self.providers.record(&name, entry.clone());
                super::status::write(&self.store, &name, &entry).await;
                tracing::info!(
                    provider = name,
                    state = entry.readiness.state.as_str(),
                    "provider configured"
                );
            } else {
                super::status::write(&self.store, &name, &entry).await;
                tracing::info!(
                    provider = name,
                    state = entry.readiness.state.as_str(),
                    "provider configured"
                );
            }
            if ready {
                self.provider_ready(&name);
            }
            Ok(())
        })
    }

    fn telemetry(&self, node: String, follow: bool) -> BoxFuture<'_, Telemetry> {
        Box::pin(async move {
            let hub = Fleet::telemetry(self);
            // Subscribe first, so no frame falls between the snapshot and the live feed.
            let live = follow.then(|| hub.subscribe(&node));
            let snapshot = hub.snapshot(&node).unwrap_or_default();
            Telemetry { snapshot, live }
        })
    }
}
