//! Kubernetes object conventions shared by every kind: object and list metadata,
//! conditions, the `Status` error object, watch events and the timestamp type.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::ToSchema;

/// The API group every hive kind belongs to.
pub const GROUP: &str = "hive.dev";
/// The one served version of the group.
pub const VERSION: &str = "v1";
/// `group/version`, the `apiVersion` of every hive object.
pub const API_VERSION: &str = "hive.dev/v1";

/// A point in time, serialized as RFC 3339 in UTC with second precision
/// (`2026-11-29T14:39:19Z`), as Kubernetes `metav1.Time` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub DateTime<Utc>);

impl Time {
    /// Builds a time from seconds since the Unix epoch.
    pub fn from_unix(secs: i64) -> Option<Time> {
        Utc.timestamp_opt(secs, 0).single().map(Time)
    }

    /// Seconds since the Unix epoch.
    pub fn unix(&self) -> i64 {
        self.0.timestamp()
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_rfc3339_opts(SecondsFormat::Secs, true))
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        rfc3339(d).map(Time)
    }
}

/// Reads an RFC 3339 time (any offset, any precision) as UTC.
fn rfc3339<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
    let text = String::deserialize(d)?;
    DateTime::parse_from_rfc3339(&text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| serde::de::Error::custom(format!("invalid RFC 3339 time {text:?}: {e}")))
}

/// The OpenAPI schema of a time: a `date-time` string, described.
fn time_schema(description: &str) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
        .description(Some(description))
        .into()
}

impl utoipa::PartialSchema for Time {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        time_schema("An RFC 3339 timestamp in UTC with second precision, e.g. 2026-11-29T14:39:19Z.")
    }
}

impl ToSchema for Time {}

/// A point in time with microsecond precision, serialized as RFC 3339 in UTC with six
/// fractional digits (`2026-11-29T14:39:19.123456Z`), as Kubernetes `metav1.MicroTime`
/// is: what orders events that happen within one second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MicroTime(pub DateTime<Utc>);

impl Serialize for MicroTime {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_rfc3339_opts(SecondsFormat::Micros, true))
    }
}

impl<'de> Deserialize<'de> for MicroTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        rfc3339(d).map(MicroTime)
    }
}

impl utoipa::PartialSchema for MicroTime {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        time_schema(
            "An RFC 3339 timestamp in UTC with microsecond precision, e.g. 2026-11-29T14:39:19.123456Z.",
        )
    }
}

impl ToSchema for MicroTime {}

/// Metadata every persisted object carries. Names are DNS-1123 labels; every kind is
/// cluster-scoped. The server owns `uid`, `resourceVersion`, `generation`,
/// `creationTimestamp`, `deletionTimestamp` and `managedFields`; values a client sends
/// for them are ignored on create (`resourceVersion` is a precondition on update).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Unique name of the object within its kind: a DNS-1123 label (lowercase letters,
    /// digits and '-', starting and ending alphanumeric, at most 63 characters); a core
    /// Event's a DNS-1123 subdomain (labels joined by '.', at most 253 characters).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length = 63)]
    pub name: String,
    /// On create, when `name` is empty: a prefix the server completes with 5 random
    /// characters to make the name (as kube-apiserver does; a prefix over 58 characters
    /// is cut). A generated name that is taken is generated again, a few times, before
    /// the create answers 409 AlreadyExists. Kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_name: Option<String>,
    /// Ignored for hive's kinds, which are cluster-scoped: accepted so that manifests
    /// written for namespaced tools apply, and cleared. A core Event keeps it (recorders
    /// write events into a namespace; hive's own events have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Server-assigned unique identifier of this incarnation of the object; a deleted and
    /// re-created object gets a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Opaque version of the object: the store revision of its last write. Send it back
    /// on update for optimistic concurrency (a stale value gets 409 Conflict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Sequence number of the wanted state; bumps only when `spec` changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// When the object was created (server-set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Time>,
    /// When deletion was requested. Set while finalizers remain; the object disappears
    /// once the last finalizer is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<Time>,
    /// Key/value pairs used to select objects (`-l key=value`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Free-form key/value pairs, stored verbatim (kubectl keeps its last-applied
    /// configuration here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Names of pending cleanups that must be removed before the object is deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
    /// Objects this one depends on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
    /// Which field manager owns which fields, maintained by server-side apply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub managed_fields: Vec<ManagedFieldsEntry>,
}

/// A reference from an object to the object that owns it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    /// API version of the owner, e.g. `hive.dev/v1`.
    pub api_version: String,
    /// Kind of the owner, e.g. `Agent`.
    pub kind: String,
    /// Name of the owner.
    pub name: String,
    /// UID of the owner.
    pub uid: String,
    /// True if the owner is the managing controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
    /// True if the owner cannot be deleted before this object is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_owner_deletion: Option<bool>,
}

/// One field manager's ownership record (server-side apply).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedFieldsEntry {
    /// Name of the manager (the `fieldManager` query parameter).
    #[serde(default)]
    pub manager: String,
    /// `Apply` for server-side apply, `Update` for other writes.
    #[serde(default)]
    pub operation: String,
    /// API version of the fields recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// When the manager last wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// Always `FieldsV1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields_type: Option<String>,
    /// The set of owned fields in the `FieldsV1` trie format (`f:spec: {f:wanted: {}}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub fields_v1: Option<serde_json::Value>,
    /// Subresource the manager wrote through (`status`), empty for the main resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subresource: Option<String>,
}

/// Metadata of a list response.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    /// The store revision the list was read at; watch from it to get every later change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Opaque token to fetch the next page (`continue=`); absent on the last page.
    #[serde(default, rename = "continue", skip_serializing_if = "Option::is_none")]
    pub continue_: Option<String>,
    /// How many items remain after this page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_item_count: Option<i64>,
}

/// Truth value of a condition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// The controller cannot tell (yet).
    #[default]
    Unknown,
}

/// One observed aspect of an object's state, Kubernetes-style: a list keyed by `type`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// CamelCase name of the condition, e.g. `Ready`, `Converged`, `Crashed`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// CamelCase machine-readable reason for the last transition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Human-readable detail of the last transition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When `status` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// The `metadata.generation` this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// `metadata.name` of a JSON object, or `""` when the object has none or the value is not
/// shaped like an object at all; never panics, whatever the shape.
pub fn name_of(object: &serde_json::Value) -> &str {
    object.get("metadata").and_then(|m| m.get("name")).and_then(serde_json::Value::as_str).unwrap_or("")
}

/// The characters a generated name's suffix is made of (kube-apiserver's: no vowels,
/// no look-alikes).
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// How many random characters complete a `generateName` prefix.
pub const GENERATED_SUFFIX_LEN: usize = 5;

/// The name `metadata.generateName` = `prefix` makes with `random` (one byte per suffix
/// character): the prefix cut to leave room for the suffix in a 63-character name, then
/// the suffix. The caller checks the prefix first ([`generate_name_problem`]).
pub fn generated_name(prefix: &str, random: [u8; GENERATED_SUFFIX_LEN]) -> String {
    let room = crate::validation::MAX_NAME_LEN - GENERATED_SUFFIX_LEN;
    let mut end = prefix.len().min(room);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    let mut name = prefix[..end].to_string();
    name.extend(random.iter().map(|b| SUFFIX_ALPHABET[*b as usize % SUFFIX_ALPHABET.len()] as char));
    name
}

/// Why `prefix` cannot start a name (`metadata.generateName`), if it cannot: a name it
/// makes must be a DNS-1123 label.
pub fn generate_name_problem(prefix: &str) -> Option<String> {
    let sample = generated_name(prefix, [0; GENERATED_SUFFIX_LEN]);
    crate::validation::dns1123_label(&sample)
        .err()
        .map(|why| format!("{prefix:?}: a name made from it would be invalid: {why}"))
}

/// `metadata.resourceVersion` of a JSON object as a number, or `None` when it has none
/// or it is not one; never panics, whatever the shape.
pub fn resource_version_of(object: &serde_json::Value) -> Option<u64> {
    object.get("metadata")?.get("resourceVersion")?.as_str()?.parse().ok()
}

/// The condition of type `type_`, if `conditions` has one.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Sets `cond` in `conditions` (keyed by type), keeping `lastTransitionTime` when the
/// status did not change. Returns true when anything changed.
pub fn set_condition(conditions: &mut Vec<Condition>, mut cond: Condition, now: Time) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == cond.type_) {
        Some(existing) => {
            cond.last_transition_time = if existing.status == cond.status {
                existing.last_transition_time.or(Some(now))
            } else {
                Some(now)
            };
            let changed = *existing != cond;
            *existing = cond;
            changed
        }
        None => {
            cond.last_transition_time = Some(now);
            conditions.push(cond);
            true
        }
    }
}

/// The Kubernetes `Status` object: every error response, and the body of some
/// successful deletes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Always `Status`.
    pub kind: String,
    /// Always `v1`.
    pub api_version: String,
    /// Empty list metadata.
    #[serde(default)]
    pub metadata: ListMeta,
    /// `Success` or `Failure`.
    pub status: String,
    /// Human-readable description of the outcome.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// CamelCase machine-readable reason, e.g. `NotFound`, `Conflict`, `Invalid`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Extended data about the outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<StatusDetails>,
    /// The HTTP status code.
    pub code: u16,
}

impl Status {
    /// A `Failure` status with the given code, reason and message.
    pub fn failure(code: u16, reason: &str, message: impl Into<String>) -> Status {
        Status {
            kind: "Status".into(),
            api_version: "v1".into(),
            metadata: ListMeta::default(),
            status: "Failure".into(),
            message: message.into(),
            reason: reason.into(),
            details: None,
            code,
        }
    }

    /// A `Success` status.
    pub fn success(details: Option<StatusDetails>) -> Status {
        Status { status: "Success".into(), details, ..Status::failure(200, "", "") }
    }
}

/// Extended data of a `Status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusDetails {
    /// Name of the object concerned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// API group of the object concerned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// Kind (or resource) of the object concerned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// UID of the object concerned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Every individual problem, each naming its field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<StatusCause>,
    /// Suggested seconds to wait before retrying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<i64>,
}

/// One problem within a failed request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusCause {
    /// CamelCase reason, e.g. `FieldValueInvalid`, `FieldManagerConflict`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Human-readable description.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Path of the field concerned, e.g. `spec.resources.memoryMax`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
}

/// One line of a watch stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WatchEvent {
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK` or `ERROR`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The object (its state after the change; for `DELETED` its last state), a
    /// bookmark carrying only `metadata.resourceVersion`, or a `Status` for `ERROR`.
    #[schema(value_type = Object)]
    pub object: serde_json::Value,
}
