//! What the Vast.ai API sends and takes: offers and the search query, instances, create
//! requests and their outcomes.

use hive_api::provider::{OfferFilter, ProviderState};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::*;

/// One offer (an "ask") from a search: what the operator selects by `id`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Offer {
    /// The offer id: what a Provision's `selectedOfferIds` holds.
    pub id: u64,
    /// The machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<u64>,
    /// The host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<u64>,
    /// GPU model, e.g. `RTX 4090`.
    #[serde(default)]
    pub gpu_name: String,
    /// Number of GPUs.
    #[serde(default)]
    pub num_gpus: u32,
    /// Memory per GPU, in MB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_ram_mb: Option<f64>,
    /// Total price, in dollars per hour.
    #[serde(default)]
    pub dollars_per_hour: f64,
    /// Host reliability, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reliability: Option<f64>,
    /// Whether the host is verified.
    #[serde(default)]
    pub verified: bool,
    /// `City, CC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub geolocation: Option<String>,
    /// CPU cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<f64>,
    /// Disk available, in GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gb: Option<f64>,
    /// Download bandwidth, in Mbit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inet_down_mbps: Option<f64>,
    /// Highest CUDA version the driver supports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_max_good: Option<f64>,
    /// Whether it can be rented now (absent means yes).
    #[serde(default)]
    pub rentable: bool,
    /// Whether it is rented already.
    #[serde(default)]
    pub rented: bool,
}

pub(super) fn num(v: &Value) -> Option<f64> {
    v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

pub(super) fn uint(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

pub(super) fn text(v: &Value) -> Option<String> {
    v.as_str().map(str::to_string)
}

impl Offer {
    /// Reads one offer of a search answer; `None` without a usable `id`. Tolerant of
    /// missing or oddly typed fields.
    pub fn from_json(v: &Value) -> Option<Offer> {
        Some(Offer {
            id: uint(&v["id"])?,
            machine_id: uint(&v["machine_id"]),
            host_id: uint(&v["host_id"]),
            gpu_name: text(&v["gpu_name"]).unwrap_or_default(),
            num_gpus: uint(&v["num_gpus"]).and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
            gpu_ram_mb: num(&v["gpu_ram"]),
            dollars_per_hour: num(&v["dph_total"]).unwrap_or(0.0),
            reliability: num(&v["reliability2"]).or_else(|| num(&v["reliability"])),
            verified: v["verified"].as_bool().unwrap_or(false) || v["verification"] == "verified",
            geolocation: text(&v["geolocation"]),
            cpu_cores: num(&v["cpu_cores_effective"]).or_else(|| num(&v["cpu_cores"])),
            disk_gb: num(&v["disk_space"]),
            inet_down_mbps: num(&v["inet_down"]),
            cuda_max_good: num(&v["cuda_max_good"]),
            rentable: v["rentable"].as_bool().unwrap_or(true),
            rented: v["rented"].as_bool().unwrap_or(false),
        })
    }

    /// The two-letter country code of `geolocation` (`Austin, US` → `US`).
    pub fn country(&self) -> Option<&str> {
        let geo = self.geolocation.as_deref()?.trim();
        let code = geo.rsplit(',').next()?.trim();
        (code.len() == 2).then_some(code)
    }
}

/// The body of `POST /bundles/` for `filter`: each set filter becomes a
/// `field: {op: value}` constraint; offers must be rentable and not rented; cheapest
/// first; at most `limit`. Pure.
pub fn offer_query(filter: &OfferFilter, limit: u32) -> Value {
    let mut q = Map::new();
    q.insert("rentable".into(), json!({"eq": true}));
    q.insert("rented".into(), json!({"eq": false}));
    q.insert("external".into(), json!({"eq": false}));
    if let Some(name) = &filter.gpu_name {
        q.insert("gpu_name".into(), json!({"eq": name}));
    }
    if let Some(n) = filter.num_gpus {
        q.insert("num_gpus".into(), json!({"eq": n}));
    }
    if let Some(gb) = filter.min_gpu_ram_gb {
        // Offers state gpu_ram in MB; the Vast CLI converts GB filters ×1000.
        q.insert("gpu_ram".into(), json!({"gte": u64::from(gb) * 1000}));
    }
    if let Some(max) = filter.max_dollars_per_hour {
        q.insert("dph_total".into(), json!({"lte": max}));
    }
    if let Some(min) = filter.min_reliability {
        q.insert("reliability".into(), json!({"gte": min}));
    }
    if filter.verified == Some(true) {
        q.insert("verified".into(), json!({"eq": true}));
    }
    if !filter.geolocation.is_empty() {
        q.insert("geolocation".into(), json!({"in": filter.geolocation}));
    }
    q.insert("order".into(), json!([["dph_total", "asc"]]));
    q.insert("limit".into(), json!(limit));
    q.insert("type".into(), json!("on-demand"));
    Value::Object(q)
}

/// Whether `offer` satisfies `filter` (and is rentable, not rented): the client-side
/// re-check of what the server returned. Pure.
pub fn offer_matches(filter: &OfferFilter, offer: &Offer) -> bool {
    if !offer.rentable || offer.rented {
        return false;
    }
    if let Some(name) = &filter.gpu_name {
        if !offer.gpu_name.eq_ignore_ascii_case(name.trim()) {
            return false;
        }
    }
    if filter.num_gpus.is_some_and(|n| n != offer.num_gpus) {
        return false;
    }
    if let Some(gb) = filter.min_gpu_ram_gb {
        if offer.gpu_ram_mb.is_none_or(|mb| mb < f64::from(gb) * 1000.0) {
            return false;
        }
    }
    if filter.max_dollars_per_hour.is_some_and(|max| offer.dollars_per_hour > max) {
        return false;
    }
    if let Some(min) = filter.min_reliability {
        if offer.reliability.is_none_or(|r| r < min) {
            return false;
        }
    }
    if filter.verified == Some(true) && !offer.verified {
        return false;
    }
    if !filter.geolocation.is_empty()
        && !offer.country().is_some_and(|c| filter.geolocation.iter().any(|g| g.eq_ignore_ascii_case(c)))
    {
        return false;
    }
    true
}

/// A Vast.ai instance as `show` and the list report it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// The instance (contract) id.
    pub id: InstanceId,
    /// Its label (`hive:<command-id>:<node>` for ours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// `created`, `loading`, `running`, `stopped`, `exited`, `offline`, …; `None` while
    /// provisioning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_status: Option<String>,
    /// What it is meant to be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intended_status: Option<String>,
    /// Vast's status message (e.g. an image pull error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_msg: Option<String>,
    /// Public IP address of the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ipaddr: Option<String>,
    /// SSH gateway host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_host: Option<String>,
    /// SSH gateway port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_port: Option<u16>,
    /// The machine it runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<u64>,
    /// GPU model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_name: Option<String>,
    /// Number of GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_gpus: Option<u32>,
    /// Price, in dollars per hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dollars_per_hour: Option<f64>,
}

impl Instance {
    /// Reads one instance; `None` without a usable `id`.
    pub fn from_json(v: &Value) -> Option<Instance> {
        Some(Instance {
            id: InstanceId(uint(&v["id"])?),
            label: text(&v["label"]),
            actual_status: text(&v["actual_status"]),
            intended_status: text(&v["intended_status"]),
            status_msg: text(&v["status_msg"]),
            public_ipaddr: text(&v["public_ipaddr"]).map(|s| s.trim().to_string()),
            ssh_host: text(&v["ssh_host"]),
            ssh_port: uint(&v["ssh_port"]).and_then(|p| u16::try_from(p).ok()),
            machine_id: uint(&v["machine_id"]),
            gpu_name: text(&v["gpu_name"]),
            num_gpus: uint(&v["num_gpus"]).and_then(|n| u32::try_from(n).ok()),
            dollars_per_hour: num(&v["dph_total"]),
        })
    }
}

/// The `Created` for an instance found by its label (the lowest id; others are reported).
pub(super) fn adopt(offer_id: u64, label: &str, found: Vec<InstanceId>, sent: u32) -> Created {
    let (first, rest) = (found[0], found[1..].to_vec());
    if !rest.is_empty() {
        tracing::warn!(label, instance = first.0, duplicates = ?rest, "vast.ai: several instances carry one label");
    }
    tracing::info!(offer_id, label, instance = first.0, "vast.ai: adopted the instance the create made");
    Created { id: first, adopted: true, duplicates: rest, creates_sent: sent }
}

/// A create from one offer.
#[derive(Clone, Debug, PartialEq)]
pub struct CreateRequest {
    /// The offer to lease: exactly this one.
    pub offer_id: u64,
    /// The label, normally [`instance_label`].
    pub label: String,
    /// The image.
    pub image: String,
    /// The on-start (bootstrap) script, run after Vast's entrypoint.
    pub onstart: Option<String>,
    /// Disk, in GB (at least [`MIN_DISK_GB`]).
    pub disk_gb: u32,
    /// Environment of the instance (Vast takes a JSON object).
    pub env: std::collections::BTreeMap<String, String>,
    /// Vast's launch mode; `ssh` runs `onstart`.
    pub runtype: String,
}

impl CreateRequest {
    /// A create of `offer_id` with `label`, `image` and `onstart`, the default disk, no
    /// environment and runtype `ssh`.
    pub fn new(
        offer_id: u64,
        label: impl Into<String>,
        image: impl Into<String>,
        onstart: Option<String>,
    ) -> Self {
        CreateRequest {
            offer_id,
            label: label.into(),
            image: image.into(),
            onstart,
            disk_gb: DEFAULT_DISK_GB,
            env: Default::default(),
            runtype: "ssh".into(),
        }
    }

    /// The API's documented limits, checked before anything is sent.
    pub fn check(&self) -> Result<(), VastError> {
        let invalid = |m: String| Err(VastError::Invalid(m));
        if self.label.is_empty() || self.label.chars().count() > MAX_LABEL {
            return invalid(format!("the label must have 1 to {MAX_LABEL} characters"));
        }
        if self.image.trim().is_empty() || self.image.chars().count() > MAX_IMAGE {
            return invalid(format!("the image must have 1 to {MAX_IMAGE} characters"));
        }
        if self.onstart.as_ref().is_some_and(|s| s.chars().count() > MAX_ONSTART) {
            return invalid(format!("the on-start script must have at most {MAX_ONSTART} characters"));
        }
        if self.disk_gb < MIN_DISK_GB {
            return invalid(format!("disk must be at least {MIN_DISK_GB} GB"));
        }
        Ok(())
    }

    /// The body of `PUT /asks/{offer_id}/`. Pure.
    pub fn body(&self) -> Value {
        let mut body = json!({
            "client_id": "me",
            "image": self.image,
            "label": self.label,
            "disk": self.disk_gb,
            "runtype": self.runtype,
            "env": self.env,
        });
        if let Some(onstart) = &self.onstart {
            body["onstart"] = json!(onstart);
        }
        body
    }
}

/// A created (or adopted) instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    /// The instance.
    pub id: InstanceId,
    /// True when the create's outcome was unknown and the instance was found by its
    /// label (adopted) rather than named by the create's answer.
    pub adopted: bool,
    /// Other instances carrying the same label (a double rental made outside this
    /// client, or by an earlier daemon): reported, never destroyed here.
    pub duplicates: Vec<InstanceId>,
    /// Create requests sent (1 or 2).
    pub creates_sent: u32,
}

/// What `destroy` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destroyed {
    /// The instance was destroyed now.
    Destroyed,
    /// It was already gone (404 / `no_such_instance`): nothing to do.
    AlreadyGone,
}

/// The outcome of the credential check, for the Provider's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// `Ready` or `ConfigurationError` (`Unconfigured` is decided before a client
    /// exists: no key).
    pub state: ProviderState,
    /// Detail for `status.message`; never contains the key.
    pub message: String,
}
