//! `metadata.generateName` on create, as kube-apiserver serves it: an object without a
//! name whose `generateName` is a prefix gets the prefix plus 5 random characters
//! ([`hive_api::meta::generated_name`]); a generated name that is taken is generated
//! again, up to [`TRIES`] names in all, before the create answers 409 AlreadyExists.
//! A prefix that cannot start a DNS-1123 label is a 422 naming `metadata.generateName`.

use hive_api::meta::{generate_name_problem, generated_name, GENERATED_SUFFIX_LEN};
use hive_api::validation::{Reason, ValidationError};
use serde::Deserialize as _;
use serde_json::Value;

use super::error::ApiError;
use crate::store::{self, Mutation, Outcome, Store};

/// How many generated names one create tries.
pub const TRIES: usize = 8;

/// The `generateName` prefix `object` asks for, when it has no name: `None` when it has
/// a name (the name wins, as in kube) or no prefix.
pub fn prefix_of(kind: &str, object: &Value) -> Result<Option<String>, ApiError> {
    // Read typed: only the two fields, whatever else the object holds.
    #[derive(serde::Deserialize)]
    struct Object {
        #[serde(default)]
        metadata: Option<Names>,
    }
    #[derive(serde::Deserialize)]
    struct Names {
        #[serde(default)]
        name: Option<Value>,
        #[serde(default, rename = "generateName")]
        generate_name: Option<Value>,
    }
    let Ok(Object { metadata: Some(names) }) = Object::deserialize(object) else { return Ok(None) };
    if names.name.as_ref().and_then(Value::as_str).is_some_and(|n| !n.is_empty()) {
        return Ok(None);
    }
    let prefix = match names.generate_name {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(prefix)) if prefix.is_empty() => return Ok(None),
        Some(Value::String(prefix)) => prefix,
        Some(other) => return Err(invalid(kind, format!("{other}: must be a string"))),
    };
    match generate_name_problem(&prefix) {
        Some(why) => Err(invalid(kind, why)),
        None => Ok(Some(prefix)),
    }
}

/// A new name made from `prefix`.
pub fn new_name(prefix: &str) -> String {
    generated_name(prefix, random())
}

/// Gives `object` a new name made from `prefix`; returns it.
pub fn name_it(object: &mut Value, prefix: &str) -> String {
    let name = new_name(prefix);
    if let Some(meta) = super::body::metadata_mut(object) {
        meta.insert("name".into(), Value::String(name.clone()));
    }
    name
}

/// Creates `object` (already named by [`name_it`]) in `kind`, naming it again from
/// `prefix` each time its name is taken, at most [`TRIES`] names in all.
pub async fn create(
    store: &Store,
    kind: &'static str,
    mut object: Value,
    prefix: &str,
    dry_run: bool,
) -> Result<Outcome, store::Error> {
    let mut tried = 1;
    loop {
        match store.commit(Mutation::Create { kind, object: object.clone() }, dry_run).await {
            Err(store::Error::AlreadyExists { .. }) if tried < TRIES => {
                tried += 1;
                name_it(&mut object, prefix);
            }
            other => return other,
        }
    }
}

fn random() -> [u8; GENERATED_SUFFIX_LEN] {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    let mut out = [0; GENERATED_SUFFIX_LEN];
    out.copy_from_slice(&bytes[..GENERATED_SUFFIX_LEN]);
    out
}

fn invalid(kind: &str, message: String) -> ApiError {
    ApiError::Invalid {
        kind: kind.into(),
        name: String::new(),
        errors: vec![ValidationError::new("metadata.generateName", Reason::Invalid, message)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_prefix_is_asked_for_only_without_a_name_and_must_start_a_label() {
        let asks = |meta: Value| prefix_of("Agent", &json!({"metadata": meta}));
        assert_eq!(asks(json!({"generateName": "web-"})).unwrap(), Some("web-".into()));
        assert_eq!(asks(json!({"name": "a", "generateName": "web-"})).unwrap(), None);
        assert_eq!(asks(json!({"name": "", "generateName": "web-"})).unwrap(), Some("web-".into()));
        assert_eq!(asks(json!({"generateName": ""})).unwrap(), None);
        assert_eq!(asks(json!({})).unwrap(), None);
        for bad in
            [json!({"generateName": "Web-"}), json!({"generateName": "-web"}), json!({"generateName": 7})]
        {
            let err = asks(bad.clone()).unwrap_err().to_string();
            assert!(err.contains("metadata.generateName"), "{bad}: {err}");
        }
    }

    #[test]
    fn generated_names_are_labels_and_a_long_prefix_is_cut() {
        let mut object = json!({"metadata": {"generateName": "web-"}});
        let name = name_it(&mut object, "web-");
        assert_eq!(object["metadata"]["name"], name.as_str());
        assert!(name.starts_with("web-") && name.len() == 9, "{name}");
        hive_api::validation::dns1123_label(&name).unwrap();
        let long = "a".repeat(80);
        let name = name_it(&mut object, &long);
        assert_eq!(name.len(), 63, "{name}");
        hive_api::validation::dns1123_label(&name).unwrap();
    }

    #[tokio::test]
    async fn a_taken_generated_name_is_generated_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(crate::store::StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let taken = json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "x-taken"}});
        store.commit(Mutation::Create { kind: "agents", object: taken.clone() }, false).await.unwrap();
        // The first name tried is taken: the create goes on to another.
        let outcome = create(&store, "agents", taken, "x-", false).await.unwrap();
        let Outcome::Created(created) = outcome else { panic!("not created") };
        assert!(created.name().starts_with("x-") && created.name() != "x-taken", "{}", created.name());
    }
}
