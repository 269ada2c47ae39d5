//! The fleet's own routes beside the resource API (`/hive/v1/fleet/...`): SearchOffers,
//! ConfigureProvider and the live telemetry stream of a node. Provision, Kill and Query
//! are the resource API itself (`fleetcommands`, `nodes`, `providers`).
//!
//! - `GET /hive/v1/fleet/offers?provider=&gpu=&numGpus=&minGpuRamGb=&maxPrice=&minReliability=&verified=&geo=`
//!   searches a ready Vast.ai provider's offers without leasing anything; unset filters
//!   fall back to the Provider's `spec.vastai.search`.
//! - `POST /hive/v1/fleet/providers/{name}/configure` (admin) validates a Vast.ai key and
//!   bootstrap settings and, only when they check out, keeps the key in memory and
//!   stores the non-secret settings; a key that fails changes nothing (422 naming
//!   `apiKey`). The key is never stored, returned or logged.
//! - `GET /hive/v1/fleet/nodes/{name}/telemetry`: see [`super::telemetry`].

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hive_api::fleet_command::FleetCommand;
use hive_api::provider::{OfferFilter, Provider, ProviderType};
use hive_api::validation::{Reason, ValidationError};
use serde::Deserialize;
use serde_json::{json, Value};

use super::body::MediaType;
use super::error::{ApiError, ApiResult};
use super::params::Params;
use super::routes::{self, ApiRouter};
use super::AppState;
use crate::auth::Verb;
use crate::client::Api;
use crate::fleet::providers::vastai::{self, ApiKey};
use crate::fleet::service::{self, FleetService};

/// The fleet routes. Searching offers is a write: it spends the admin-configured Vast.ai
/// key and its quota. Configuring a provider sets its credentials, which, like every
/// Provider write, are admin's.
pub fn router() -> ApiRouter {
    ApiRouter::new()
        .route("/hive/v1/fleet/offers", routes::get(Verb::Write, offers))
        .route("/hive/v1/fleet/providers/{name}/configure", routes::post(Verb::Admin, configure))
        .route("/hive/v1/fleet/nodes/{name}/telemetry", routes::get(Verb::Read, super::telemetry::stream))
}

fn invalid(kind: &str, name: &str, field: &str, message: impl Into<String>) -> ApiError {
    ApiError::Invalid {
        kind: kind.into(),
        name: name.into(),
        errors: vec![ValidationError::new(field, Reason::Invalid, message)],
    }
}

/// The query of SearchOffers.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OfferQuery {
    provider: Option<String>,
    gpu: Option<String>,
    num_gpus: Option<u32>,
    min_gpu_ram_gb: Option<u32>,
    max_price: Option<f64>,
    min_reliability: Option<f64>,
    verified: Option<bool>,
    /// Comma-separated country codes.
    geo: Option<String>,
}

impl OfferQuery {
    /// `base` (the Provider's search settings) with every filter the query sets.
    fn filter(&self, base: Option<OfferFilter>) -> OfferFilter {
        let mut filter = base.unwrap_or_default();
        if let Some(gpu) = &self.gpu {
            filter.gpu_name = Some(gpu.clone());
        }
        filter.num_gpus = self.num_gpus.or(filter.num_gpus);
        filter.min_gpu_ram_gb = self.min_gpu_ram_gb.or(filter.min_gpu_ram_gb);
        filter.max_dollars_per_hour = self.max_price.or(filter.max_dollars_per_hour);
        filter.min_reliability = self.min_reliability.or(filter.min_reliability);
        filter.verified = self.verified.or(filter.verified);
        if let Some(geo) = &self.geo {
            filter.geolocation =
                geo.split(',').map(str::trim).filter(|g| !g.is_empty()).map(str::to_uppercase).collect();
        }
        filter
    }
}

fn provider_object(state: &AppState, name: &str) -> ApiResult<Provider> {
    Ok(Api::<Provider>::new(&state.store).get_existing(name)?)
}

/// The Vast.ai provider a request means: the one named, else the daemon's default when it
/// is a Vast.ai provider, else the one named `vastai`.
fn vast_provider_name(fleet: &dyn FleetService, named: Option<&str>) -> String {
    match named {
        Some(name) => name.to_string(),
        None if fleet.default_provider_type() == Some(ProviderType::Vastai) => fleet.default_provider(),
        None => "vastai".to_string(),
    }
}

async fn offers(
    State(state): State<AppState>,
    query: Result<Query<OfferQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("offer search: {}", e.body_text())))?;
    if query.max_price.is_some_and(|p| !(p.is_finite() && p > 0.0)) {
        return Err(ApiError::BadRequest("maxPrice must be a positive number of dollars per hour".into()));
    }
    if query.min_reliability.is_some_and(|r| !(0.0..=1.0).contains(&r)) {
        return Err(ApiError::BadRequest("minReliability must be between 0 and 1".into()));
    }
    let fleet = state.running_fleet()?;
    let name = vast_provider_name(fleet.as_ref(), query.provider.as_deref().filter(|p| !p.is_empty()));
    let provider = provider_object(&state, &name)?;
    if provider.spec.type_ != ProviderType::Vastai {
        return Err(ApiError::BadRequest(format!(
            "provider {name:?} is a {} provider; only Vast.ai providers have offers",
            provider.spec.type_.as_str()
        )));
    }
    let filter = query.filter(provider.spec.vastai.and_then(|v| v.search));
    let offers = fleet.search_offers(name.clone(), filter.clone()).await.map_err(|err| {
        ApiError::Conflict { plural: "providers".into(), name: name.clone(), message: err.to_string() }
    })?;
    let offers: Vec<Value> = offers
        .iter()
        .map(|offer| {
            let mut v = serde_json::to_value(offer).unwrap_or_default();
            if let Some(mb) = offer.gpu_ram_mb {
                v["gpuRamGb"] = json!((mb / 1000.0 * 10.0).round() / 10.0);
            }
            v
        })
        .collect();
    Ok(Json(json!({"provider": name, "filter": filter_json(&filter), "offers": offers})).into_response())
}

fn filter_json(filter: &OfferFilter) -> Value {
    serde_json::to_value(filter).unwrap_or_default()
}

/// The body of ConfigureProvider. The key is write-only.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Configure {
    api_key: Option<String>,
    base_url: Option<String>,
    image: Option<String>,
    onstart: Option<String>,
    disk_gb: Option<u32>,
}

impl std::fmt::Debug for Configure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Configure")
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

/// Parses a ConfigureProvider body. An error never echoes the body, which may hold the
/// key: a misshapen field is named, its value is not.
fn configure_request(bytes: &[u8]) -> ApiResult<Configure> {
    let fail = |what: String| {
        ApiError::BadRequest(format!(
            "ConfigureProvider body: {what}; expected a JSON object with apiKey, baseUrl, image, onstart, diskGb"
        ))
    };
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| fail(format!("not a valid body at line {} column {}", e.line(), e.column())))?;
    hive_api::resource::decode::<Configure>(&value).map(|(request, _)| request).map_err(|e| {
        // serde quotes wrongly typed values, which may be the key: say only where.
        let what = if e.message.starts_with("unknown field") || e.message.starts_with("missing field") {
            e.message
        } else {
            "not a valid value".to_string()
        };
        fail(if e.field.is_empty() { what } else { format!("{}: {what}", e.field) })
    })
}

async fn configure(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<Response> {
    let bytes = crate::server::body::read(body).await?;
    let request = configure_request(&bytes)?;
    let fleet = state.running_fleet()?;
    // The Provider `vastai` may be configured before it exists: it is created only once
    // its settings check out.
    let providers = Api::<Provider>::new(&state.store);
    let (current, exists) = match providers.get(&name)? {
        Some(provider) => (provider, true),
        None if name == "vastai" => {
            let mut provider = Provider::new(
                name.clone(),
                hive_api::provider::ProviderSpec { type_: ProviderType::Vastai, ..Default::default() },
            );
            provider.spec.vastai = Some(Default::default());
            (provider, false)
        }
        None => return Err(ApiError::NotFound { plural: "providers".into(), name }),
    };
    if current.spec.type_ != ProviderType::Vastai {
        return Err(invalid(
            "Provider",
            &name,
            "spec.type",
            format!(
                "ConfigureProvider takes Vast.ai credentials; {name:?} is a {} provider: edit its spec instead",
                current.spec.type_.as_str()
            ),
        ));
    }
    let mut wanted = current.clone();
    let settings = wanted.spec.vastai.get_or_insert_with(Default::default);
    if let Some(base) = request.base_url {
        settings.base_url = Some(base);
    }
    if let Some(image) = request.image {
        settings.image = Some(image);
    }
    if let Some(onstart) = request.onstart {
        settings.onstart = Some(onstart);
    }
    if let Some(disk) = request.disk_gb {
        if disk < vastai::MIN_DISK_GB {
            return Err(invalid(
                "Provider",
                &name,
                "diskGb",
                format!("{disk}: must be at least {} GB", vastai::MIN_DISK_GB),
            ));
        }
        settings.disk_gb = Some(disk);
    }
    let mut errors = hive_api::validation::Errors::default();
    hive_api::resource::Resource::validate(&wanted, &mut errors);
    if !errors.is_empty() {
        return Err(ApiError::Invalid { kind: "Provider".into(), name, errors: errors.0 });
    }
    // A key the spec names on the host goes only where the operator allowed.
    super::admission::provider_key_sources(exists.then_some(&current), &wanted, state.key_sources())?;
    let key = match request.api_key {
        Some(text) => Some(ApiKey::new(text).map_err(|why| invalid("Provider", &name, "apiKey", why))?),
        None => None,
    };
    fleet.configure_provider(exists.then_some(current), wanted, key).await.map_err(|err| match err {
        service::Error::Check(_) => invalid("Provider", &name, "apiKey", err.to_string()),
        service::Error::Client(err) => err.into(),
        other => ApiError::Internal(anyhow::Error::new(other)),
    })?;
    let object =
        providers.get_raw(&name).ok_or_else(|| ApiError::NotFound { plural: "providers".into(), name })?;
    Ok((StatusCode::OK, Json(object.value())).into_response())
}

/// `POST /apis/hive.dev/v1/fleetcommands` (routed here by `kinds.rs`): admits the body,
/// fills in the default provider, and records the command through the fleet's idempotent
/// [`commands::record`](crate::fleet::commands::record): 201 and the new command, or 200
/// and the original record for a used id (also one whose command was deleted), with a
/// `Warning` when the body differs from the original's.
pub async fn create_command(
    state: AppState,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> ApiResult<Response> {
    use crate::fleet::commands::{self, RecordError, Recorded};
    let params = Params::from_uri(&uri)?;
    let bytes = super::body::read(body).await?;
    let parsed = super::body::parse_object(MediaType::of(&headers), &bytes)?;
    let admitted = hive_api::admit_body(
        &hive_api::KindInfo::of::<FleetCommand>(),
        parsed.value,
        &parsed.duplicates,
        params.field_validation()?,
    )?;
    let mut command: FleetCommand = crate::client::decode_value(&admitted.object)?;
    if let Some(provision) = command.spec.provision.as_mut().filter(|p| p.provider.is_empty()) {
        provision.provider = match state.running_fleet() {
            Ok(fleet) => fleet.default_provider(),
            Err(on_leader @ ApiError::OnLeader(_)) => return Err(on_leader),
            Err(_) => commands::DEFAULT_PROVIDER.to_string(),
        };
    }
    let mut warnings = admitted.warnings;
    let (code, command) = match commands::record(&state.store, command, params.dry_run()?).await {
        Ok(Recorded::Created(command)) => (StatusCode::CREATED, command),
        Ok(Recorded::Replayed(replay)) => {
            warnings.extend(replay.warning());
            (StatusCode::OK, replay.command)
        }
        Err(RecordError::Invalid { name, errors }) => {
            return Err(ApiError::Invalid { kind: "FleetCommand".into(), name, errors })
        }
        Err(RecordError::Conflict { name, message }) => {
            return Err(ApiError::Conflict { plural: "fleetcommands".into(), name, message })
        }
        Err(RecordError::Client(err)) => return Err(err.into()),
        Err(RecordError::Store(err)) => return Err(err.into()),
    };
    let value = serde_json::to_value(&command).map_err(|e| ApiError::Internal(e.into()))?;
    Ok(super::resources::json_response(code, &value, &warnings))
}
