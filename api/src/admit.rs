//! Admission of a whole object: decode a JSON body as a kind, fill in its defaults,
//! drop (or refuse) unknown fields and validate it — the one pure step every write takes,
//! over HTTP or from inside the daemon.

use serde_json::Value;

use crate::resource::{Decoded, KindInfo};
use crate::validation::{self, summary, ValidationError};

/// What to do with fields the kind does not define, and with keys a body gives twice
/// (`fieldValidation`, as upstream).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldValidation {
    /// Reject the object, naming every unknown field and every key given twice.
    Strict,
    /// Drop unknown fields, keep the last of a key given twice, and report each as a
    /// warning (the default).
    #[default]
    Warn,
    /// Drop unknown fields and keep the last of a key given twice, silently.
    Ignore,
}

/// Keys a body gave more than once, found by the parser that read it (which kept the
/// last value of each): the paths of the first few and how many in all, so that a body of
/// any number of them makes a bounded message. As kube-apiserver's strict decoding,
/// `Strict` refuses them and `Warn` warns about them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Duplicates {
    /// The paths of the first [`validation::MAX_CAUSES`] + 1, e.g. `metadata.labels.app`.
    listed: Vec<String>,
    /// How many in all.
    total: usize,
}

impl Duplicates {
    /// Counts one more key given twice; `field` renders its path, and is called only for
    /// the first [`validation::MAX_CAUSES`] + 1 (the rest are only counted).
    pub fn record(&mut self, field: impl FnOnce() -> String) {
        if self.listed.len() <= validation::MAX_CAUSES {
            self.listed.push(field());
        }
        self.total += 1;
    }

    /// None was found.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// `duplicate field "…"` for each of the first [`validation::MAX_CAUSES`], then one
    /// that counts the rest.
    pub fn warnings(&self) -> Vec<String> {
        field_words("duplicate field", &self.listed, self.total)
    }
}

/// An admitted object.
#[derive(Debug)]
pub struct Admitted {
    /// The normalized object: `apiVersion` and `kind` set, defaults filled in, unknown
    /// fields dropped, fields in canonical order.
    pub object: Value,
    /// With [`FieldValidation::Warn`], one `duplicate field "…"` warning per key given
    /// twice, then one `unknown field "…"` warning per dropped field.
    pub warnings: Vec<String>,
}

/// Why an object was not admitted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmitError {
    /// The body names another `apiVersion`.
    #[error("the API version in the data ({found}) does not match the expected API version ({expected})")]
    ApiVersion {
        /// What the body says.
        found: String,
        /// The kind's `apiVersion`.
        expected: &'static str,
    },
    /// The body names another `kind`.
    #[error("the kind in the data ({found}) does not match the expected kind ({expected})")]
    Kind {
        /// What the body says.
        found: String,
        /// The kind's name.
        expected: &'static str,
    },
    /// The body does not have the kind's shape (a wrong type, a bad enum value …).
    #[error("{kind} in version \"v1\" cannot be handled as a {kind}: {at}{message}", at = at(field))]
    Decode {
        /// The kind's name.
        kind: &'static str,
        /// Path of the offending field (empty for the root).
        field: String,
        /// What was wrong.
        message: String,
    },
    /// Keys given twice, or unknown fields, under [`FieldValidation::Strict`].
    #[error(
        "{kind} in version \"v1\" cannot be handled as a {kind}: strict decoding error: {}",
        strict_list(duplicates, fields)
    )]
    Strict {
        /// The kind's name.
        kind: &'static str,
        /// Keys the body gave twice.
        duplicates: Duplicates,
        /// Paths of the unknown fields.
        fields: Vec<String>,
    },
    /// The object decodes but breaks the kind's rules.
    #[error("{kind} \"{name}\" is invalid: {}", summary(errors))]
    Invalid {
        /// The kind's name.
        kind: &'static str,
        /// The object's name (may be empty).
        name: String,
        /// Every problem, each naming its field.
        errors: Vec<ValidationError>,
    },
}

fn at(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("{field}: ")
    }
}

fn strict_list(duplicates: &Duplicates, unknown: &[String]) -> String {
    let mut words = duplicates.warnings();
    words.extend(unknown_field_warnings(unknown));
    words.join(", ")
}

fn unknown_field_warnings(fields: &[String]) -> Vec<String> {
    field_words("unknown field", fields, fields.len())
}

/// `{what} "…"` for each of the first [`validation::MAX_CAUSES`] of `total` fields (of
/// which `fields` holds the first few, or all), then one that counts the rest: as many
/// unknown or repeated fields as a body holds make neither a message nor the `Warning`
/// headers of an answer grow with them.
fn field_words(what: &str, fields: &[String], total: usize) -> Vec<String> {
    let max = validation::MAX_CAUSES;
    let listed = if total <= max + 1 { fields } else { &fields[..max.min(fields.len())] };
    let mut words: Vec<String> = listed.iter().map(|f| format!("{what} \"{f}\"")).collect();
    if let (true, Some(first)) = (listed.len() < total, fields.get(max)) {
        let more = total - max;
        words.push(format!(
            "{more} more {what}s not listed, the first \"{first}\" (at most {max} are listed)"
        ));
    }
    words
}

/// Decodes, defaults and validates a whole object of `kind`.
pub fn admit(kind: &KindInfo, value: Value, validation: FieldValidation) -> Result<Admitted, AdmitError> {
    admit_body(kind, value, &Duplicates::default(), validation)
}

/// [`admit`] for a body as a client sent it, with the keys it gave twice: under
/// [`FieldValidation::Strict`] they are refused beside the unknown fields, under
/// [`FieldValidation::Warn`] each is a warning before theirs.
pub fn admit_body(
    kind: &KindInfo,
    value: Value,
    duplicates: &Duplicates,
    validation: FieldValidation,
) -> Result<Admitted, AdmitError> {
    let (decoded, warnings) = decode_fields(kind, value, duplicates, validation)?;
    let name = crate::meta::name_of(&decoded.object).to_string();
    let Value::Object(mut object) = decoded.object else {
        // Every kind is a struct, so its serialized form is a JSON object.
        return Err(AdmitError::Decode {
            kind: kind.kind,
            field: String::new(),
            message: "expected an object".into(),
        });
    };
    // Validated on the typed object while decoding (neither check reads apiVersion or
    // kind, which are set here).
    if !decoded.errors.is_empty() {
        return Err(AdmitError::Invalid { kind: kind.kind, name, errors: decoded.errors });
    }
    object.insert("apiVersion".into(), Value::String(kind.api_version.into()));
    object.insert("kind".into(), Value::String(kind.kind.into()));
    Ok(Admitted { object: Value::Object(object), warnings })
}

/// The warnings of a server-side apply configuration, judged as [`admit_body`] judges a
/// body — apiVersion and kind, each field's type, unknown fields and keys given twice
/// under `validation` — but not its values: a configuration names only the fields its
/// manager owns (a label, say), so what is required is judged on the merged object.
pub fn admit_apply_configuration(
    kind: &KindInfo,
    value: Value,
    duplicates: &Duplicates,
    validation: FieldValidation,
) -> Result<Vec<String>, AdmitError> {
    decode_fields(kind, value, duplicates, validation).map(|(_, warnings)| warnings)
}

/// Decodes a body as `kind` and judges its unknown fields and duplicate keys; the
/// validation errors are left in [`Decoded::errors`] for the caller.
fn decode_fields(
    kind: &KindInfo,
    mut value: Value,
    duplicates: &Duplicates,
    validation: FieldValidation,
) -> Result<(Decoded, Vec<String>), AdmitError> {
    if let Some(found) = value.get("apiVersion").and_then(Value::as_str) {
        if found != kind.api_version {
            return Err(AdmitError::ApiVersion { found: found.into(), expected: kind.api_version });
        }
    }
    if let Some(found) = value.get("kind").and_then(Value::as_str) {
        if found != kind.kind {
            return Err(AdmitError::Kind { found: found.into(), expected: kind.kind });
        }
    }
    if let Some(meta) =
        value.get_mut("metadata").and_then(Value::as_object_mut).filter(|_| !kind.keeps_namespace)
    {
        // Cluster-scoped: kubectl and other clients may send a namespace; drop it (one
        // that is not a string is left for decoding to refuse).
        if meta.get("namespace").is_none_or(|n| n.is_string() || n.is_null()) {
            meta.remove("namespace");
        }
    }
    let decoded = (kind.decode)(&value).map_err(|e| AdmitError::Decode {
        kind: kind.kind,
        field: e.field,
        message: e.message,
    })?;
    let mut warnings = Vec::new();
    if !decoded.unknown_fields.is_empty() || !duplicates.is_empty() {
        match validation {
            FieldValidation::Strict => {
                return Err(AdmitError::Strict {
                    kind: kind.kind,
                    duplicates: duplicates.clone(),
                    fields: decoded.unknown_fields,
                })
            }
            FieldValidation::Warn => {
                warnings = duplicates.warnings();
                warnings.extend(unknown_field_warnings(&decoded.unknown_fields));
            }
            FieldValidation::Ignore => {}
        }
    }
    Ok((decoded, warnings))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn agents() -> &'static KindInfo {
        crate::kind_by_plural("agents").expect("agents is a kind")
    }

    #[test]
    fn admitted_objects_are_normalized() {
        let body = json!({"metadata": {"name": "a", "namespace": "default"},
                          "spec": {"config": {"repo": "r"}, "bogus": 1,
                                   "runtime": {"type": "process", "process": {"command": ["x"]}}}});
        let admitted = admit(agents(), body, FieldValidation::Warn).unwrap();
        assert_eq!(admitted.object["apiVersion"], "hive.dev/v1");
        assert_eq!(admitted.object["kind"], "Agent");
        assert!(admitted.object["metadata"].get("namespace").is_none());
        assert_eq!(admitted.warnings, ["unknown field \"spec.bogus\""]);
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let cases = [
            (json!({"apiVersion": "v2"}), "the API version in the data (v2) does not match the expected API version (hive.dev/v1)"),
            (json!({"kind": "Job"}), "the kind in the data (Job) does not match the expected kind (Agent)"),
            (json!({"metadata": [null, null]}), "Agent in version \"v1\" cannot be handled as a Agent: metadata: invalid type: sequence, expected struct ObjectMeta"),
            (json!([1]), "Agent in version \"v1\" cannot be handled as a Agent: invalid type: sequence, expected struct Agent"),
            (json!({"metadata": {"name": "a"}, "bogus": 1}), "Agent in version \"v1\" cannot be handled as a Agent: strict decoding error: unknown field \"bogus\""),
        ];
        for (body, want) in cases {
            let err = admit(agents(), body.clone(), FieldValidation::Strict).unwrap_err();
            assert_eq!(err.to_string(), want, "{body}");
        }
        let invalid = admit(agents(), json!({"metadata": {"name": "Not_A_Name"}}), FieldValidation::Strict);
        let Err(AdmitError::Invalid { name, errors, .. }) = invalid else { panic!("{invalid:?}") };
        assert_eq!(name, "Not_A_Name");
        assert!(errors.iter().any(|e| e.field == "metadata.name"), "{errors:?}");
    }

    #[test]
    fn thousands_of_unknown_fields_are_listed_up_to_a_bound() {
        let mut body = json!({"metadata": {"name": "a"},
                              "spec": {"config": {"repo": "r"}, "runtime": {"type": "process", "process": {"command": ["x"]}}}});
        for i in 0..3000 {
            body["spec"][format!("bogus{i:04}")] = json!(1);
        }
        let warned = admit(agents(), body.clone(), FieldValidation::Warn).unwrap();
        assert_eq!(warned.warnings.len(), validation::MAX_CAUSES + 1);
        assert_eq!(warned.warnings[0], "unknown field \"spec.bogus0000\"");
        assert_eq!(
            warned.warnings[validation::MAX_CAUSES],
            "2950 more unknown fields not listed, the first \"spec.bogus0050\" (at most 50 are listed)"
        );
        let refused = admit(agents(), body, FieldValidation::Strict).unwrap_err().to_string();
        assert_eq!(refused.matches("unknown field \"").count(), validation::MAX_CAUSES);
        assert!(refused.ends_with("unknown field \"spec.bogus0049\", 2950 more unknown fields not listed, the first \"spec.bogus0050\" (at most 50 are listed)"), "{refused}");
    }

    fn twice(fields: &[&str]) -> Duplicates {
        let mut duplicates = Duplicates::default();
        for field in fields {
            duplicates.record(|| field.to_string());
        }
        duplicates
    }

    #[test]
    fn keys_given_twice_are_refused_beside_unknown_fields_or_warned_about_first() {
        let body = json!({"metadata": {"name": "a", "labels": {"app": "b"}},
                          "spec": {"config": {"repo": "r"}, "bogus": 1,
                                   "runtime": {"type": "process", "process": {"command": ["x"]}}}});
        let duplicates = twice(&["metadata.labels.app", "spec.config.repo"]);
        let refused = admit_body(agents(), body.clone(), &duplicates, FieldValidation::Strict).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "Agent in version \"v1\" cannot be handled as a Agent: strict decoding error: duplicate field \
             \"metadata.labels.app\", duplicate field \"spec.config.repo\", unknown field \"spec.bogus\""
        );
        let warned = admit_body(agents(), body.clone(), &duplicates, FieldValidation::Warn).unwrap();
        assert_eq!(
            warned.warnings,
            [
                "duplicate field \"metadata.labels.app\"",
                "duplicate field \"spec.config.repo\"",
                "unknown field \"spec.bogus\""
            ]
        );
        let ignored = admit_body(agents(), body, &duplicates, FieldValidation::Ignore).unwrap();
        assert!(ignored.warnings.is_empty(), "{:?}", ignored.warnings);
        // Keys given twice alone are refused too, before the object's own validity.
        let invalid = json!({"metadata": {"name": "Not_A_Name"}});
        let refused = admit_body(agents(), invalid, &twice(&["metadata.name"]), FieldValidation::Strict);
        assert!(matches!(refused, Err(AdmitError::Strict { .. })), "{refused:?}");
    }

    #[test]
    fn thousands_of_keys_given_twice_are_listed_up_to_a_bound() {
        let mut duplicates = Duplicates::default();
        let mut rendered = 0;
        for i in 0..3000 {
            duplicates.record(|| {
                rendered += 1;
                format!("metadata.labels.l{i:04}")
            });
        }
        assert_eq!(rendered, validation::MAX_CAUSES + 1, "only the listed paths are rendered");
        let warnings = duplicates.warnings();
        assert_eq!(warnings.len(), validation::MAX_CAUSES + 1);
        assert_eq!(warnings[0], "duplicate field \"metadata.labels.l0000\"");
        assert_eq!(
            warnings[validation::MAX_CAUSES],
            "2950 more duplicate fields not listed, the first \"metadata.labels.l0050\" (at most 50 are listed)"
        );
        // Up to one more than the bound is listed whole.
        let exactly = twice(&["a"; validation::MAX_CAUSES + 1]);
        assert_eq!(exactly.warnings().len(), validation::MAX_CAUSES + 1);
        assert!(exactly.warnings().iter().all(|w| w == "duplicate field \"a\""));
    }
}
