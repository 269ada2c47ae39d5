//! `labelSelector` and `fieldSelector` of a list or watch, parsed once and matched
//! against each stored object.

use hive_api::selector::{FieldSelector, LabelSelector};
use hive_api::KindInfo;
use serde_json::Value;

use super::error::{ApiError, ApiResult};
use super::params::Params;

/// Parsed selectors of a list or watch.
pub struct Selectors {
    labels: Option<LabelSelector>,
    fields: Option<FieldSelector>,
}

impl Selectors {
    /// Parses `labelSelector` and `fieldSelector`.
    pub fn parse(kind: &KindInfo, params: &Params) -> ApiResult<Selectors> {
        let labels = match params.label_selector.as_deref().filter(|s| !s.trim().is_empty()) {
            Some(s) => Some(
                s.parse::<LabelSelector>()
                    .map_err(|e| ApiError::BadRequest(format!("labelSelector: {e}")))?,
            ),
            None => None,
        };
        let fields = match params.field_selector.as_deref().filter(|s| !s.trim().is_empty()) {
            Some(s) => Some(
                FieldSelector::parse_with(s, kind.field_selectors)
                    .map_err(|e| ApiError::BadRequest(format!("fieldSelector: {e}")))?,
            ),
            None => None,
        };
        Ok(Selectors { labels, fields })
    }

    /// True when neither selector was given (or both were empty): every object passes.
    pub fn is_empty(&self) -> bool {
        self.labels.is_none() && self.fields.is_none()
    }

    /// Whether a stored object passes both selectors (parsed only when there are any).
    pub fn matches_stored(&self, object: &crate::store::Obj) -> bool {
        self.is_empty() || self.matches(&object.value())
    }

    /// Whether an object passes both selectors.
    pub fn matches(&self, object: &Value) -> bool {
        if let Some(fields) = &self.fields {
            if !fields.matches_object(object) {
                return false;
            }
        }
        if let Some(labels) = &self.labels {
            let map: std::collections::BTreeMap<String, String> = object
                .get("metadata")
                .and_then(|m| m.get("labels"))
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
                .unwrap_or_default();
            if !labels.matches(&map) {
                return false;
            }
        }
        true
    }
}
