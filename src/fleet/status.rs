//! The Provider controller: checks every `Provider` object (its settings and
//! credentials, through [`Providers::check`]) when it appears or its spec changes, and
//! writes the outcome to its status — `state` (`Unconfigured`, `ConfigurationError`,
//! `Ready`), `message` and a `Ready` condition. At start it makes sure the built-in
//! providers exist: `process` always, and the one `hive serve --provider` names.

use std::sync::Arc;
use std::time::Duration;

use hive_api::meta::{set_condition, Condition, ConditionStatus, Time};
use hive_api::provider::{Provider, ProviderSpec, ProviderState};

use super::error::Error;
use super::providers::{Entry, Providers};
use hive_controllers::{Action, Config, Controller, Target};

use crate::client::{self, Api};
use crate::store::Store;

/// Creates the Provider `name` with `spec` unless it exists (an operator's edits are
/// never overwritten).
pub async fn ensure(store: &Store, name: &str, spec: ProviderSpec) {
    let providers = Api::<Provider>::new(store);
    if providers.get_raw(name).is_some() {
        return;
    }
    let type_ = spec.type_;
    match providers.create(&Provider::new(name.to_string(), spec)).await {
        Ok(_) => tracing::info!(provider = name, type_ = type_.as_str(), "built-in provider created"),
        Err(client::Error::Store(crate::store::Error::AlreadyExists { .. })) => {}
        Err(err @ client::Error::Invalid { .. }) => {
            tracing::warn!(provider = name, %err, "built-in provider settings are invalid; not created");
        }
        Err(err) => tracing::warn!(provider = name, %err, "creating the built-in provider failed"),
    }
}

/// Writes `entry` (the outcome of a check) to the status of Provider `name`.
pub async fn write(store: &Store, name: &str, entry: &Entry) {
    let state = entry.readiness.state;
    let message = entry.readiness.message.clone();
    let generation = entry.generation;
    let now = Time(store.now());
    let result = Api::<Provider>::new(store)
        .patch_status(name, |status| {
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
                now,
            );
        })
        .await;
    // A Provider deleted meanwhile has no status to write.
    match result {
        Err(err) if !err.is_not_found() => {
            tracing::warn!(provider = name, %err, "writing the provider status failed");
        }
        _ => {}
    }
}

/// How often a provider that is not Ready is checked again (a Docker engine that
/// starts later, a key file written later), besides on every spec change.
pub const RECHECK: Duration = Duration::from_secs(60);

struct Context {
    store: Store,
    providers: Arc<Providers>,
    on_ready: Box<dyn Fn(String) + Send + Sync>,
}

/// Runs the Provider controller (the shared level-triggered reconcile loop): every
/// Provider is checked when it appears and whenever its spec changes, a provider that is
/// not Ready again every [`RECHECK`]; `on_ready` is called with the name of each
/// provider found ready (recovery adopts its resources).
pub async fn run(
    store: Store,
    providers: Arc<Providers>,
    observer: Arc<crate::metrics::ControllerMetrics>,
    on_ready: impl Fn(String) + Send + Sync + 'static,
) {
    let client = Api::<Provider>::new(&store);
    let controller = Controller::new(client, Config::default()).observed_by(observer);
    let ctx = Arc::new(Context { store, providers, on_ready: Box::new(on_ready) });
    controller
        .run(
            reconcile,
            |target: &Target<Provider>, err: &Error, ctx: &Context| {
                if ctx.store.is_shut_down() {
                    tracing::debug!(provider = target.name(), %err, "provider check failed: the daemon is stopping");
                    return Action::backoff();
                }
                tracing::warn!(provider = target.name(), %err, "provider check failed; backing off");
                Action::backoff()
            },
            ctx,
            std::future::pending::<()>(),
        )
        .await;
}

async fn reconcile(target: Target<Provider>, ctx: Arc<Context>) -> Result<Action, Error> {
    let provider = match target {
        Target::Absent(name) => {
            ctx.providers.remove(&name);
            return Ok(Action::await_change());
        }
        Target::Present(provider) => provider,
    };
    let name = provider.metadata.name.clone();
    let generation = provider.metadata.generation.unwrap_or(0);
    let known = ctx.providers.get(&name);
    let was_ready = known.as_ref().is_some_and(|e| e.readiness.state == ProviderState::Ready);
    // Our own status writes change no generation: a provider checked against this spec
    // is checked again only when it is not Ready and RECHECK has passed.
    if let Some(known) = known.as_ref().filter(|e| e.generation == generation) {
        let since = known.checked_at.elapsed();
        if was_ready {
            return Ok(Action::await_change());
        }
        if since < RECHECK {
            return Ok(Action::requeue(RECHECK - since));
        }
    }
    let entry = ctx.providers.check(&provider, None).await?;
    tracing::info!(
        provider = name,
        state = entry.readiness.state.as_str(),
        message = entry.readiness.message,
        "provider checked"
    );
    write(&ctx.store, &name, &entry).await;
    if entry.readiness.state == ProviderState::Ready {
        if !was_ready {
            (ctx.on_ready)(name);
        }
        Ok(Action::await_change())
    } else {
        Ok(Action::requeue(RECHECK))
    }
}
