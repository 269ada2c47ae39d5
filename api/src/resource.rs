//! What makes a type a hive kind: the [`Resource`] trait, the [`resource!`] macro that
//! declares a kind's object and list types, and the dynamic [`KindInfo`] registry entry
//! the server dispatches on.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::meta::ObjectMeta;
use crate::validation::{self, Errors, ValidationError};

mod strict;

/// A server-side printing column (`kubectl get` table output).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// Header, e.g. `Wanted`.
    pub name: &'static str,
    /// OpenAPI type of the cells: `string`, `integer`, `number`, `boolean`, `date`.
    pub type_: &'static str,
    /// What the column shows, e.g. `spec.wanted`.
    pub description: &'static str,
    /// 0 = always shown; 1 = only with `-o wide`.
    pub priority: i32,
}

impl Column {
    /// A string column shown by default.
    pub const fn new(name: &'static str, description: &'static str) -> Column {
        Column { name, type_: "string", description, priority: 0 }
    }

    /// A string column shown only with `-o wide`.
    pub const fn wide(name: &'static str, description: &'static str) -> Column {
        Column { name, type_: "string", description, priority: 1 }
    }
}

/// The object-level surface every kind shares; implemented by [`resource!`].
pub trait Object:
    Serialize + DeserializeOwned + Clone + PartialEq + std::fmt::Debug + Send + Sync + 'static
{
    /// `apiVersion` of the kind's objects: `hive.dev/v1`, or `v1` for core events.
    const API_VERSION: &'static str = crate::meta::API_VERSION;
    /// Kind name, e.g. `Agent`.
    const KIND: &'static str;
    /// List kind name, e.g. `AgentList`.
    const LIST_KIND: &'static str;
    /// Plural resource name used in URLs, e.g. `agents`.
    const PLURAL: &'static str;
    /// Singular resource name, e.g. `agent`.
    const SINGULAR: &'static str;
    /// Short names kubectl accepts, e.g. `ag`.
    const SHORT_NAMES: &'static [&'static str];
    /// How `metadata.name` is checked: a DNS-1123 label for hive's kinds.
    const NAMES: crate::validation::NameRule = crate::validation::NameRule::Label;
    /// Whether `metadata.namespace` is kept as written (core Events, which namespaced
    /// recorders write into a namespace); hive's kinds are cluster-scoped and drop it.
    const KEEPS_NAMESPACE: bool = false;

    /// The object's metadata.
    fn metadata(&self) -> &ObjectMeta;
    /// The object's metadata, mutably.
    fn metadata_mut(&mut self) -> &mut ObjectMeta;
}

/// A kind with a `spec`: what is wanted.
pub trait HasSpec: Object {
    /// The spec type.
    type Spec: Clone + Default + PartialEq + std::fmt::Debug + Send + Sync;
    /// The object's spec.
    fn spec(&self) -> &Self::Spec;
    /// The object's spec, mutably.
    fn spec_mut(&mut self) -> &mut Self::Spec;
}

/// A kind with a `status`: what is observed, written through the `/status` subresource.
pub trait HasStatus: Object {
    /// The status type.
    type Status: Clone + Default + PartialEq + std::fmt::Debug + Send + Sync;
    /// The object's status.
    fn status(&self) -> &Self::Status;
    /// The object's status, mutably.
    fn status_mut(&mut self) -> &mut Self::Status;
}

/// Kind-specific behaviour: validation and table printing.
pub trait Resource: Object {
    /// Records every problem of the spec and status (metadata is checked generically).
    fn validate(&self, errors: &mut Errors);
    /// Columns between `Name` and `Age` (priority 0) and after `Age` (priority 1).
    fn columns() -> Vec<Column>;
    /// One cell per entry of [`Resource::columns`], in the same order.
    fn cells(&self) -> Vec<Value>;

    /// Records every problem of changing `old` into `self` (immutable fields, one-time
    /// decisions). Most kinds allow any valid change.
    fn validate_update(&self, _old: &Self, _errors: &mut Errors) {}

    /// Sets the status fields worked out from the rest of the object (an Agent's
    /// `status.phase`). The daemon's typed client calls it on every status write, so such
    /// a field is never stale against the status it was written with. (HTTP admission
    /// does not: a derived field in a main-resource body would make a write that changes
    /// nothing look like a change.)
    fn derive_status(&mut self) {}
}

/// The outcome of decoding a request body as a kind.
#[derive(Debug)]
pub struct Decoded {
    /// The object re-serialized from its typed form: defaults filled in, unknown fields
    /// dropped, field order canonical.
    pub object: Value,
    /// Paths of fields the kind does not define, e.g. `spec.bogus`.
    pub unknown_fields: Vec<String>,
    /// Every validation problem of the object (metadata and kind-specific), found on
    /// the typed form in the same pass, so admission decodes a body only once.
    pub errors: Vec<ValidationError>,
}

/// A body that does not have the kind's shape (wrong type, bad enum value …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// Path of the offending field, e.g. `spec.wanted` (empty for the root).
    pub field: String,
    /// What serde found wrong.
    pub message: String,
}

/// Decodes a JSON value as `K` (a kind, or any request body), collecting unknown fields
/// instead of failing on them. Stricter than `serde_json` about shapes: a struct is
/// decoded from a JSON object only, never from an array of its fields.
pub fn decode<K: DeserializeOwned>(value: &Value) -> Result<(K, Vec<String>), DecodeError> {
    let mut unknown = Vec::new();
    // Most values decode: first without tracking the path, which costs on every field;
    // a value that fails is decoded again with it, to name the field.
    let untracked = {
        let mut record = |path: serde_ignored::Path<'_>| unknown.push(field_path(&path));
        K::deserialize(serde_ignored::Deserializer::new(strict::Strict(value), &mut record))
    };
    if let Ok(typed) = untracked {
        return Ok((typed, unknown));
    }
    unknown.clear();
    let mut record = |path: serde_ignored::Path<'_>| unknown.push(field_path(&path));
    let de = serde_ignored::Deserializer::new(strict::Strict(value), &mut record);
    let typed: K = serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        DecodeError {
            field: if field == "." { String::new() } else { field },
            message: e.into_inner().to_string(),
        }
    })?;
    Ok((typed, unknown))
}

/// Renders an ignored-field path the way Kubernetes names fields: `spec.nodes[1].bogus`.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => {
            let parent = field_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => {
            field_path(parent)
        }
    }
}

fn decode_value<K: Resource>(value: &Value) -> Result<Decoded, DecodeError> {
    let (typed, unknown_fields) = decode::<K>(value)?;
    let errors = validate(&typed);
    let object = serde_json::to_value(&typed)
        .map_err(|e| DecodeError { field: String::new(), message: e.to_string() })?;
    Ok(Decoded { object, unknown_fields, errors })
}

/// Validates metadata and kind-specific fields of a typed object.
pub fn validate<K: Resource>(object: &K) -> Vec<ValidationError> {
    let mut errors = Errors::default();
    validation::object_meta(&mut errors, object.metadata(), K::NAMES);
    object.validate(&mut errors);
    errors.0
}

fn validate_value<K: Resource>(value: &Value) -> Vec<ValidationError> {
    match decode::<K>(value) {
        Ok((typed, _)) => validate(&typed),
        Err(e) => vec![ValidationError::new(e.field, validation::Reason::Invalid, e.message)],
    }
}

fn validate_update_value<K: Resource>(new: &Value, old: &Value) -> Vec<ValidationError> {
    match (decode::<K>(new), decode::<K>(old)) {
        (Ok((new, _)), Ok((old, _))) => {
            let mut errors = Errors::default();
            new.validate_update(&old, &mut errors);
            errors.0
        }
        (Err(e), _) | (_, Err(e)) => {
            vec![ValidationError::new(e.field, validation::Reason::Invalid, e.message)]
        }
    }
}

fn cells_value<K: Resource>(value: &Value) -> Vec<Value> {
    match decode::<K>(value) {
        Ok((typed, _)) => typed.cells(),
        Err(_) => K::columns().iter().map(|_| Value::String(String::new())).collect(),
    }
}

/// Everything the server needs to serve a kind without knowing its Rust type.
#[derive(Clone, Copy)]
pub struct KindInfo {
    /// `apiVersion` of the kind's objects: `hive.dev/v1`, or `v1` for core events.
    pub api_version: &'static str,
    /// Kind name, e.g. `Agent`.
    pub kind: &'static str,
    /// List kind name, e.g. `AgentList`.
    pub list_kind: &'static str,
    /// Plural resource name, e.g. `agents`.
    pub plural: &'static str,
    /// Singular resource name, e.g. `agent`.
    pub singular: &'static str,
    /// Short names, e.g. `ag`.
    pub short_names: &'static [&'static str],
    /// Fields a `fieldSelector` may name (dotted paths).
    pub field_selectors: &'static [&'static str],
    /// Whether admission keeps `metadata.namespace` ([`Object::KEEPS_NAMESPACE`]).
    pub keeps_namespace: bool,
    /// Decodes a body as this kind and validates it in the same pass
    /// ([`Decoded::errors`]).
    pub decode: fn(&Value) -> Result<Decoded, DecodeError>,
    /// Validates a (decoded) object of this kind.
    pub validate: fn(&Value) -> Vec<ValidationError>,
    /// Validates a change from the stored object (second argument) to a new one.
    pub validate_update: fn(&Value, &Value) -> Vec<ValidationError>,
    /// The kind's printing columns.
    pub columns: fn() -> Vec<Column>,
    /// One row of cells for an object of this kind.
    pub cells: fn(&Value) -> Vec<Value>,
}

impl std::fmt::Debug for KindInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindInfo").field("kind", &self.kind).finish()
    }
}

impl KindInfo {
    /// The registry entry for `K`.
    pub const fn of<K: Resource>() -> KindInfo {
        KindInfo {
            api_version: K::API_VERSION,
            kind: K::KIND,
            list_kind: K::LIST_KIND,
            plural: K::PLURAL,
            singular: K::SINGULAR,
            short_names: K::SHORT_NAMES,
            field_selectors: crate::selector::OBJECT_FIELDS,
            keeps_namespace: K::KEEPS_NAMESPACE,
            decode: decode_value::<K>,
            validate: validate_value::<K>,
            validate_update: validate_update_value::<K>,
            columns: K::columns,
            cells: cells_value::<K>,
        }
    }
}

/// Declares a kind: the object struct (`apiVersion`, `kind`, `metadata`, `spec`,
/// `status`), its list struct, and the [`Object`] impl.
///
/// ```ignore
/// resource! {
///     /// An agent: a supervised workload whose config lives in git.
///     Agent, AgentList, AgentSpec, AgentStatus, plural = "agents", singular = "agent", short = ["ag"]
/// }
/// ```
#[macro_export]
macro_rules! resource {
    (
        $(#[$doc:meta])*
        $kind:ident, $list:ident, $spec:ty, $status:ty,
        plural = $plural:literal, singular = $singular:literal, short = [$($short:literal),*]
    ) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, ::serde::Serialize, ::serde::Deserialize, ::utoipa::ToSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct $kind {
            /// Always `hive.dev/v1`.
            #[serde(default = "::hive_api::resource::default_api_version")]
            pub api_version: String,
            /// The kind name.
            #[serde(default)]
            pub kind: String,
            /// Standard object metadata.
            #[serde(default)]
            pub metadata: $crate::meta::ObjectMeta,
            /// What is wanted. Written by users and the submit layer; a change bumps
            /// `metadata.generation`.
            #[serde(default)]
            pub spec: $spec,
            /// What is observed. Written only by controllers and the scheduler, through
            /// the `/status` subresource.
            #[serde(default)]
            pub status: $status,
        }

        impl $kind {
            /// A new object with the given name and spec, and empty status.
            pub fn new(name: impl Into<String>, spec: $spec) -> Self {
                $kind {
                    api_version: $crate::meta::API_VERSION.to_string(),
                    kind: stringify!($kind).to_string(),
                    metadata: $crate::meta::ObjectMeta { name: name.into(), ..Default::default() },
                    spec,
                    status: Default::default(),
                }
            }
        }

        #[doc = concat!("A list of ", stringify!($kind), " objects.")]
        #[derive(Clone, Debug, Default, PartialEq, ::serde::Serialize, ::serde::Deserialize, ::utoipa::ToSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct $list {
            /// Always `hive.dev/v1`.
            #[serde(default = "::hive_api::resource::default_api_version")]
            pub api_version: String,
            /// The list kind name.
            #[serde(default)]
            pub kind: String,
            /// List metadata: the revision read at and the continue token.
            #[serde(default)]
            pub metadata: $crate::meta::ListMeta,
            /// The objects.
            pub items: Vec<$kind>,
        }

        impl $crate::resource::Object for $kind {
            const KIND: &'static str = stringify!($kind);
            const LIST_KIND: &'static str = stringify!($list);
            const PLURAL: &'static str = $plural;
            const SINGULAR: &'static str = $singular;
            const SHORT_NAMES: &'static [&'static str] = &[$($short),*];

            fn metadata(&self) -> &$crate::meta::ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut $crate::meta::ObjectMeta {
                &mut self.metadata
            }
        }

        impl $crate::resource::HasSpec for $kind {
            type Spec = $spec;

            fn spec(&self) -> &$spec {
                &self.spec
            }

            fn spec_mut(&mut self) -> &mut $spec {
                &mut self.spec
            }
        }

        impl $crate::resource::HasStatus for $kind {
            type Status = $status;

            fn status(&self) -> &$status {
                &self.status
            }

            fn status_mut(&mut self) -> &mut $status {
                &mut self.status
            }
        }
    };
}

/// Default for `apiVersion` when a body omits it.
pub fn default_api_version() -> String {
    crate::meta::API_VERSION.to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::kinds;

    /// Admission uses `Decoded::errors` instead of validating again: they must be
    /// exactly what the separate `validate` finds, valid or not, for every kind.
    #[test]
    fn decode_reports_the_same_errors_as_validate() {
        let bodies = [
            json!({"metadata": {"name": "ok"}, "spec": {}}),
            json!({"metadata": {"name": "Not_A_Name", "labels": {"bad key!": "x"}}, "spec": {}}),
            json!({"metadata": {"name": ""}}),
        ];
        for kind in kinds() {
            for body in &bodies {
                let Ok(decoded) = (kind.decode)(body) else { continue };
                assert_eq!(decoded.errors, (kind.validate)(body), "{} {body}", kind.kind);
            }
        }
        let agent = crate::kind_by_kind("Agent").expect("Agent is a kind");
        let decoded = (agent.decode)(&bodies[1]).expect("decodes");
        assert!(decoded.errors.iter().any(|e| e.field == "metadata.name"), "{:?}", decoded.errors);
    }

    /// A value that decodes is read once, without tracking paths; one that fails is read
    /// again with them: its error names the field, and no unknown field is counted twice.
    #[test]
    fn decoding_names_the_failing_field_and_each_unknown_field_once() {
        let agent = |spec: serde_json::Value| json!({"metadata": {"name": "a", "bogus": 1}, "spec": spec});
        let good = agent(
            json!({"config": {"repo": "/r", "rev": "main", "extra": true}, "runtime": {"type": "process", "process": {"command": ["./run"]}}}),
        );
        let (_, unknown) = super::decode::<crate::agent::Agent>(&good).expect("decodes");
        assert_eq!(unknown, ["metadata.bogus", "spec.config.extra"]);
        let bad = agent(json!({"config": {"repo": "/r", "rev": 7}}));
        let e = super::decode::<crate::agent::Agent>(&bad).expect_err("rev is not a string");
        assert_eq!(e.field, "spec.config.rev");
        assert!(e.message.contains("invalid type"), "{}", e.message);
    }
}
