//! The Provider controller: checks every `Provider` object (its settings and
//! credentials, through [`Providers::check`]) when it appears or its spec changes, and
//! writes the outcome to its status — `state` (`Unconfigured`, `ConfigurationError`,
//! `Ready`), `message` and a `Ready` condition. At start it makes sure the built-in
//! providers exist: `process` always, and the one `hive serve --provider` names.

use std::sync::Arc;
use std::time::Duration;

use hive_api::meta::{set_condition, Condition, ConditionStatus, Time};
use hive_api::provider::{Provider, ProviderState, ProviderType};
use serde_json::{json, Value};

use super::providers::{Entry, Providers};
use crate::store::{EventType, Mutation, Store, Subresource};
use crate::update::update;

/// Creates the Provider `name` of `type_` with `spec` unless it exists (an operator's
/// edits are never overwritten).
pub async fn ensure(store: &Store, name: &str, type_: ProviderType, settings: Value) {
    if store.get("providers", name).is_some() {
        return;
    }
    let mut spec = json!({"type": type_.as_str()});
    if !settings.is_null() {
        spec[type_.as_str()] = settings;
    }
    let object =
        json!({"apiVersion": "hive.dev/v1", "kind": "Provider", "metadata": {"name": name}, "spec": spec});
    let object = match crate::server::resources::admit(
        hive_api::kind_by_kind("Provider").expect("Provider is registered"),
        object,
        crate::server::params::FieldValidation::Strict,
    ) {
        Ok((object, _)) => object,
        Err(err) => {
            tracing::warn!(provider = name, %err, "built-in provider settings are invalid; not created");
            return;
        }
    };
    match store.commit(Mutation::Create { kind: "providers", object }, false).await {
        Ok(_) => tracing::info!(provider = name, type_ = type_.as_str(), "built-in provider created"),
        Err(crate::store::Error::AlreadyExists { .. }) => {}
        Err(err) => tracing::warn!(provider = name, %err, "creating the built-in provider failed"),
    }
}

/// Writes `entry` (the outcome of a check) to the status of Provider `name`.
pub async fn write(store: &Store, name: &str, entry: &Entry) {
    let state = entry.readiness.state;
    let message = entry.readiness.message.clone();
    let generation = entry.generation;
    let result = update(store, "providers", name, Subresource::Status, |object| {
        let mut status: hive_api::provider::ProviderStatus =
            serde_json::from_value(object["status"].clone()).unwrap_or_default();
        status.state = Some(state);
        status.message = (!message.is_empty()).then(|| message.clone());
        status.observed_generation = Some(generation);
        let ready = state == ProviderState::Ready;
        set_condition(
            &mut status.conditions,
            Condition {
                type_: "Ready".into(),
                status: if ready { ConditionStatus::True } else { ConditionStatus::False },
                reason: state.as_str().into(),
                message: message.clone(),
                last_transition_time: None,
                observed_generation: Some(generation),
            },
            Time(chrono::Utc::now()),
        );
        object["status"] = serde_json::to_value(status).unwrap_or_default();
    })
    .await;
    if let Err(err) = result {
        tracing::warn!(provider = name, %err, "writing the provider status failed");
    }
}

/// Checks `object` and writes its status; returns the entry.
pub async fn refresh(store: &Store, providers: &Providers, object: &Value) -> Option<Entry> {
    let provider: Provider = match serde_json::from_value(object.clone()) {
        Ok(p) => p,
        Err(err) => {
            tracing::warn!(%err, "undecodable Provider");
            return None;
        }
    };
    let entry = providers.check(&provider, None).await.ok()?;
    tracing::info!(
        provider = provider.metadata.name,
        state = entry.readiness.state.as_str(),
        message = entry.readiness.message,
        "provider checked"
    );
    write(store, &provider.metadata.name, &entry).await;
    Some(entry)
}

/// Checks every Provider now, then again whenever one is created or its spec changes;
/// `on_ready` is called with the name of each provider found ready (recovery adopts its
/// resources). Runs until the store closes.
pub async fn run(store: Store, providers: Arc<Providers>, on_ready: impl Fn(String) + Send + Sync + 'static) {
    let mut revision = store.revision();
    let (_, all) = store.list("providers");
    for object in all {
        if let Some(entry) = refresh(&store, &providers, &object).await {
            if entry.readiness.state == ProviderState::Ready {
                on_ready(object["metadata"]["name"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    loop {
        let mut watch = match store.watch("providers", revision) {
            Ok(watch) => watch,
            Err(crate::store::Error::Closed) => return,
            Err(err) => {
                tracing::warn!(%err, "watching providers failed; re-listing");
                tokio::time::sleep(Duration::from_secs(1)).await;
                revision = store.revision();
                continue;
            }
        };
        while let Some(Ok(event)) = watch.next().await {
            revision = event.revision;
            let name = event.object["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if event.type_ == EventType::Deleted {
                providers.remove(&name);
                continue;
            }
            let generation = event.object["metadata"]["generation"].as_i64().unwrap_or(0);
            let seen = providers.get(&name).map(|e| e.generation);
            if seen == Some(generation) {
                continue; // a status write, or a spec already checked
            }
            let was_ready = providers.get(&name).is_some_and(|e| e.readiness.state == ProviderState::Ready);
            if let Some(entry) = refresh(&store, &providers, &event.object).await {
                if entry.readiness.state == ProviderState::Ready && !was_ready {
                    on_ready(name);
                }
            }
        }
        revision = revision.max(store.list("providers").0);
    }
}
