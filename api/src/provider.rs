//! The `Provider` kind: the non-secret settings of one fleet provider (local worker
//! processes, Docker, Vast.ai) and whether it is ready. Secrets never appear here: a
//! Vast.ai API key is named by a file or an environment variable the operator of the
//! host allowed (`hive serve --provider-key-dir`, `--provider-key-env`), or configured
//! at runtime and held in memory only.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::meta::Condition;
use crate::resource::{Column, Resource};
use crate::validation::{self, Errors, Reason};

crate::resource! {
    /// A fleet provider: where Provision commands create nodes. A provider whose settings
    /// are missing or wrong is reported `Unconfigured` or `ConfigurationError` and can be
    /// corrected at runtime; it never keeps the daemon from starting.
    Provider, ProviderList, ProviderSpec, ProviderStatus,
    plural = "providers", singular = "provider", short = ["prov"]
}

/// The provider's type and settings. Only the settings block named by `type` may be set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpec {
    /// `process`, `docker` or `vastai`.
    #[serde(rename = "type")]
    pub type_: ProviderType,
    /// Settings of the `process` provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessProvider>,
    /// Settings of the `docker` provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docker: Option<DockerProvider>,
    /// Settings of the `vastai` provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vastai: Option<VastaiProvider>,
}

/// The kinds of fleet provider. Each value is also the name of the spec field that
/// holds its settings, so it is written in lowercase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderType {
    /// Local worker processes: the daemon re-enters its own executable in worker mode and
    /// supervises each worker over its stdin pipe.
    #[default]
    Process,
    /// Containers on a Docker Engine.
    Docker,
    /// Leased Vast.ai instances.
    Vastai,
}

impl ProviderType {
    /// The serialized name, which is also the settings field it selects.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderType::Process => "process",
            ProviderType::Docker => "docker",
            ProviderType::Vastai => "vastai",
        }
    }
}

/// Settings of the `process` provider.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessProvider {
    /// Executable to run in worker mode. Unset (recommended) means the running `hive`
    /// executable itself, so a worker is never a separately built, stale binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executable: Option<String>,
    /// Environment variables of the worker processes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// Settings of the `docker` provider.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DockerProvider {
    /// Docker Engine address: `unix:///var/run/docker.sock` (the default), `tcp://…`,
    /// `http://…` or `https://…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Default image of the nodes. Required.
    #[serde(default)]
    pub image: String,
    /// Docker network to attach node containers to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// GPUs to give each container, as `docker run --gpus` takes them: `all` or a count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<String>,
}

/// Settings of the `vastai` provider. The API key is never part of them: name a file or
/// an environment variable holding it, among those the operator of the daemon's host
/// allowed, or configure it at runtime (`hive fleet configure`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VastaiProvider {
    /// Base URL of the Vast.ai REST API. Defaults to `https://console.vast.ai/api/v0`.
    /// A key from `apiKeyFile` or `apiKeyEnv` is sent only to the default or to a base URL
    /// the operator allowed (`hive serve --provider-base-url`); a key configured at
    /// runtime, to any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// A file holding the API key (one line), read when the provider is checked: its path
    /// relative to the directory the operator allowed with `hive serve
    /// --provider-key-dir`, e.g. `vastai-api-key` (an absolute path inside that directory
    /// is accepted too). No `..`; symbolic links may not lead out of the directory. Refused
    /// when the daemon allows no key directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<String>,
    /// Name of an environment variable of the daemon holding the API key, read when the
    /// provider is checked; one the operator allowed with `hive serve --provider-key-env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Default image of the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Disk to request per instance, in GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gb: Option<u32>,
    /// Default on-start (bootstrap) script of the instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onstart: Option<String>,
    /// Filters applied when searching offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<OfferFilter>,
}

/// Filters for a Vast.ai offer search; unset filters do not constrain.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OfferFilter {
    /// GPU model, e.g. `RTX 4090`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_name: Option<String>,
    /// Number of GPUs per instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_gpus: Option<u32>,
    /// Minimum memory per GPU, in GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_gpu_ram_gb: Option<u32>,
    /// Maximum total price, in dollars per hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_dollars_per_hour: Option<f64>,
    /// Minimum host reliability, from 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_reliability: Option<f64>,
    /// Only verified hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
    /// Country codes the host may be in, e.g. `["US", "DE"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub geolocation: Vec<String>,
}

/// What is observed of a provider.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    /// Whether the provider can take commands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ProviderState>,
    /// Human-readable detail, e.g. what is wrong with the configuration. Never contains
    /// a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The `metadata.generation` the state was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions of the provider, e.g. `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Whether a provider can take commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum ProviderState {
    /// Settings or credentials are missing.
    Unconfigured,
    /// Settings or credentials were given but do not work; see `message`.
    ConfigurationError,
    /// The provider accepts Provision and Kill commands.
    Ready,
}

impl ProviderState {
    /// The serialized name, e.g. `Ready`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderState::Unconfigured => "Unconfigured",
            ProviderState::ConfigurationError => "ConfigurationError",
            ProviderState::Ready => "Ready",
        }
    }
}

impl Resource for Provider {
    fn validate(&self, errors: &mut Errors) {
        let spec = &self.spec;
        let blocks = [
            (ProviderType::Process, spec.process.is_some()),
            (ProviderType::Docker, spec.docker.is_some()),
            (ProviderType::Vastai, spec.vastai.is_some()),
        ];
        for (type_, present) in blocks {
            if present && type_ != spec.type_ {
                errors.push(
                    format!("spec.{}", type_.as_str()),
                    Reason::Forbidden,
                    format!("may only be set when spec.type is {:?}", type_.as_str()),
                );
            }
        }
        match spec.type_ {
            ProviderType::Process => {
                if let Some(process) = &spec.process {
                    if let Some(exe) = &process.executable {
                        absolute_path(errors, "spec.process.executable", exe);
                    }
                    validation::env(errors, "spec.process.env", &process.env);
                }
            }
            ProviderType::Docker => match &spec.docker {
                None => {
                    errors.push("spec.docker", Reason::Required, "the docker provider needs a default image")
                }
                Some(docker) => validate_docker(errors, docker),
            },
            ProviderType::Vastai => {
                if let Some(vastai) = &spec.vastai {
                    validate_vastai(errors, vastai);
                }
            }
        }
        validation::conditions(errors, "status.conditions", &self.status.conditions);
    }

    fn columns() -> Vec<Column> {
        vec![
            Column::new("Type", "The provider type, spec.type."),
            Column::new("State", "Whether it can take commands, status.state."),
            Column::wide("Message", "Detail of the state, status.message."),
        ]
    }

    fn cells(&self) -> Vec<Value> {
        vec![
            self.spec.type_.as_str().into(),
            self.status.state.map_or("", ProviderState::as_str).into(),
            self.status.message.clone().unwrap_or_default().into(),
        ]
    }
}

fn absolute_path(errors: &mut Errors, field: &str, value: &str) {
    if !value.starts_with('/') || value.split('/').any(|part| part == "..") {
        errors.push(field, Reason::Invalid, format!("{value:?}: must be an absolute path without '..'"));
    }
}

/// The longest key file path taken (the kernel's own `PATH_MAX`).
const MAX_KEY_FILE_PATH: usize = 4096;

/// A key file's path, as far as it can be judged without the daemon's flags: not empty,
/// no `..` component, no control characters. Whether it lies inside the directory the
/// operator allowed is the daemon's admission.
fn key_file(errors: &mut Errors, field: &str, value: &str) {
    let problem = if value.is_empty() {
        Some("must name a file")
    } else if value.len() > MAX_KEY_FILE_PATH {
        Some("longer than 4096 bytes")
    } else if value.chars().any(char::is_control) {
        Some("must not contain control characters")
    } else if value.split('/').any(|part| part == "..") {
        Some("must not contain '..': name a file inside the provider key directory by its relative path")
    } else {
        None
    };
    if let Some(problem) = problem {
        let shown: String = value.chars().take(100).collect();
        errors.push(field, Reason::Invalid, format!("{shown:?}: {problem}"));
    }
}

fn url(errors: &mut Errors, field: &str, value: &str, schemes: &[&str]) {
    let ok = schemes
        .iter()
        .any(|s| value.strip_prefix(s).is_some_and(|rest| rest.len() > 3 && rest.starts_with("://")))
        && !value.chars().any(|c| c.is_whitespace() || c.is_control());
    if !ok {
        errors.push(
            field,
            Reason::Invalid,
            format!("{value:?}: must be a URL with scheme {}", schemes.join(", ")),
        );
    }
}

fn validate_docker(errors: &mut Errors, docker: &DockerProvider) {
    if let Some(host) = &docker.host {
        url(errors, "spec.docker.host", host, &["unix", "tcp", "http", "https"]);
    }
    validation::argument(errors, "spec.docker.image", &docker.image);
    if let Some(network) = &docker.network {
        validation::argument(errors, "spec.docker.network", network);
    }
    if let Some(gpus) = &docker.gpus {
        if gpus != "all" && !gpus.parse::<u32>().is_ok_and(|n| n > 0) {
            errors.push(
                "spec.docker.gpus",
                Reason::Invalid,
                format!("{gpus:?}: must be \"all\" or a positive count"),
            );
        }
    }
}

fn validate_vastai(errors: &mut Errors, vastai: &VastaiProvider) {
    if let Some(base) = &vastai.base_url {
        url(errors, "spec.vastai.baseUrl", base, &["https", "http"]);
    }
    if let Some(file) = &vastai.api_key_file {
        key_file(errors, "spec.vastai.apiKeyFile", file);
    }
    if let Some(env) = &vastai.api_key_env {
        if !validation::is_env_name(env) {
            errors.push(
                "spec.vastai.apiKeyEnv",
                Reason::Invalid,
                format!("{env:?}: must be an environment variable name"),
            );
        }
        if vastai.api_key_file.is_some() {
            errors.push(
                "spec.vastai.apiKeyEnv",
                Reason::Forbidden,
                "name the API key by apiKeyFile or apiKeyEnv, not both",
            );
        }
    }
    if let Some(image) = &vastai.image {
        validation::argument(errors, "spec.vastai.image", image);
    }
    if vastai.disk_gb == Some(0) {
        errors.push("spec.vastai.diskGb", Reason::Invalid, "0: must be at least 1");
    }
    if let Some(search) = &vastai.search {
        if search.num_gpus == Some(0) {
            errors.push("spec.vastai.search.numGpus", Reason::Invalid, "0: must be at least 1");
        }
        if let Some(price) = search.max_dollars_per_hour {
            if !(price.is_finite() && price > 0.0) {
                errors.push(
                    "spec.vastai.search.maxDollarsPerHour",
                    Reason::Invalid,
                    format!("{price}: must be positive"),
                );
            }
        }
        if let Some(r) = search.min_reliability {
            if !(0.0..=1.0).contains(&r) {
                errors.push(
                    "spec.vastai.search.minReliability",
                    Reason::Invalid,
                    format!("{r}: must be between 0 and 1"),
                );
            }
        }
        for (i, code) in search.geolocation.iter().enumerate() {
            if code.len() != 2 || !code.bytes().all(|b| b.is_ascii_uppercase()) {
                errors.push(
                    format!("spec.vastai.search.geolocation[{i}]"),
                    Reason::Invalid,
                    format!("{code:?}: must be a two-letter country code such as \"US\""),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resource::{decode, validate};
    use crate::testing::{error_fields, merge};

    fn valid() -> Value {
        json!({
            "apiVersion": "hive.dev/v1",
            "kind": "Provider",
            "metadata": {"name": "vastai"},
            "spec": {
                "type": "vastai",
                "vastai": {
                    "apiKeyFile": "/run/secrets/vastai-api-key",
                    "image": "ghcr.io/example/myelin-node:cuda",
                    "diskGb": 64,
                    "search": {"gpuName": "RTX 4090", "numGpus": 1, "maxDollarsPerHour": 0.6,
                        "minReliability": 0.98, "verified": true, "geolocation": ["US"]}
                }
            }
        })
    }

    fn check(patch: Value) -> Vec<String> {
        let mut value = valid();
        merge(&mut value, patch);
        error_fields::<Provider>(&value)
    }

    #[test]
    fn valid_provider_round_trips() {
        let (provider, unknown) = decode::<Provider>(&valid()).unwrap();
        assert!(unknown.is_empty());
        assert_eq!(validate(&provider), vec![]);
        let mut want = valid();
        want["status"] = json!({});
        assert_eq!(serde_json::to_value(&provider).unwrap(), want);
    }

    #[test]
    fn validation_rules_name_their_fields() {
        let cases: Vec<(Value, &[&str])> = vec![
            (json!({}), &[]),
            (json!({"spec": {"type": "process"}}), &["spec.vastai"]),
            (json!({"spec": {"type": "process", "vastai": null}}), &[]),
            (json!({"spec": {"type": "docker", "vastai": null}}), &["spec.docker"]),
            (json!({"spec": {"type": "docker", "vastai": null, "docker": {"image": "node:1"}}}), &[]),
            (
                json!({"spec": {"type": "docker", "vastai": null,
                    "docker": {"image": "", "host": "/var/run/docker.sock", "gpus": "some"}}}),
                &["spec.docker.host", "spec.docker.image", "spec.docker.gpus"],
            ),
            (json!({"spec": {"vastai": {"apiKeyFile": "key.txt"}}}), &[]),
            (json!({"spec": {"vastai": {"apiKeyFile": "..data/key"}}}), &[]),
            (json!({"spec": {"vastai": {"apiKeyFile": "../key"}}}), &["spec.vastai.apiKeyFile"]),
            (json!({"spec": {"vastai": {"apiKeyFile": "/run/../etc/x"}}}), &["spec.vastai.apiKeyFile"]),
            (json!({"spec": {"vastai": {"apiKeyFile": ""}}}), &["spec.vastai.apiKeyFile"]),
            (json!({"spec": {"vastai": {"apiKeyFile": "a\nb"}}}), &["spec.vastai.apiKeyFile"]),
            (json!({"spec": {"vastai": {"apiKeyEnv": "VAST_API_KEY"}}}), &["spec.vastai.apiKeyEnv"]),
            (json!({"spec": {"vastai": {"apiKeyFile": null, "apiKeyEnv": "VAST_API_KEY"}}}), &[]),
            (
                json!({"spec": {"vastai": {"apiKeyFile": null, "apiKeyEnv": "1KEY"}}}),
                &["spec.vastai.apiKeyEnv"],
            ),
            (json!({"spec": {"vastai": {"baseUrl": "console.vast.ai"}}}), &["spec.vastai.baseUrl"]),
            (json!({"spec": {"vastai": {"diskGb": 0}}}), &["spec.vastai.diskGb"]),
            (
                json!({"spec": {"vastai": {"search": {"minReliability": 1.5}}}}),
                &["spec.vastai.search.minReliability"],
            ),
            (
                json!({"spec": {"vastai": {"search": {"maxDollarsPerHour": 0}}}}),
                &["spec.vastai.search.maxDollarsPerHour"],
            ),
            (
                json!({"spec": {"vastai": {"search": {"geolocation": ["usa"]}}}}),
                &["spec.vastai.search.geolocation[0]"],
            ),
            (
                json!({"spec": {"process": {"executable": "hive"}, "type": "process", "vastai": null}}),
                &["spec.process.executable"],
            ),
        ];
        for (patch, want) in cases {
            assert_eq!(check(patch.clone()), want, "patch {patch}");
        }
    }

    #[test]
    fn an_api_key_in_the_spec_is_an_unknown_field_and_is_dropped() {
        let mut value = valid();
        value["spec"]["vastai"]["apiKey"] = json!("secret-value");
        let decoded = (crate::KindInfo::of::<Provider>().decode)(&value).unwrap();
        assert_eq!(decoded.unknown_fields, ["spec.vastai.apiKey"]);
        assert!(!decoded.object.to_string().contains("secret-value"));
    }

    #[test]
    fn cells_match_columns() {
        let (mut provider, _) = decode::<Provider>(&valid()).unwrap();
        provider.status.state = Some(ProviderState::ConfigurationError);
        provider.status.message = Some("API key rejected (401)".into());
        assert_eq!(Provider::columns().len(), provider.cells().len());
        assert_eq!(
            provider.cells(),
            vec![json!("vastai"), json!("ConfigurationError"), json!("API key rejected (401)")]
        );
    }
}
