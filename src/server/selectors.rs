//! `labelSelector` and `fieldSelector` of a list or watch, parsed once and matched
//! against each stored object: labels from the form the store keeps beside each
//! object's JSON, `metadata.name` from the store's key, so neither parses the object.

use std::borrow::Cow;

use hive_api::selector::{Field, FieldSelector, LabelSelector};
use hive_api::KindInfo;

use super::error::{ApiError, ApiResult};
use super::params::Params;
use crate::store::Obj;

/// Parsed selectors of a list or watch.
pub struct Selectors {
    labels: Option<LabelSelector>,
    fields: Option<FieldSelector>,
    /// Whether the kind's objects keep a namespace (core Events): then
    /// `metadata.namespace` is read from the object, not taken as `""`.
    keeps_namespace: bool,
    /// The namespace of a namespaced route (`/api/v1/namespaces/{ns}/events`): its own
    /// objects and those of none (hive's own events, which every namespace shows).
    namespace: Option<String>,
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
        Ok(Selectors { labels, fields, keeps_namespace: kind.keeps_namespace, namespace: None })
    }

    /// The same selectors, on a namespaced route of `namespace`.
    pub fn in_namespace(mut self, namespace: Option<String>) -> Selectors {
        self.namespace = namespace;
        self
    }

    /// True when neither selector was given (or both were empty) on a route of no
    /// namespace: every object passes.
    pub fn is_empty(&self) -> bool {
        self.labels.is_none() && self.fields.is_none() && self.namespace.is_none()
    }

    /// Whether matching parses objects: a field selector on a path other than
    /// `metadata.name` and `metadata.namespace` (an Event's `involvedObject.name`), or
    /// on the namespace of a kind that keeps one, or a namespaced route.
    pub fn parses_objects(&self) -> bool {
        self.namespace.is_some()
            || self.fields.iter().flat_map(FieldSelector::requirements).any(|r| match r.field {
                Field::Path(_) => true,
                Field::Namespace => self.keeps_namespace,
                Field::Name => false,
            })
    }

    /// Whether the stored object `name` passes both selectors.
    pub fn matches_stored(&self, name: &str, object: &Obj) -> bool {
        self.matches_with(object, || Cow::Borrowed(name))
    }

    /// Whether a stored object whose name is not at hand (a watch event's) passes both
    /// selectors; its name is read from its JSON, without parsing the rest, only when a
    /// field selector asks for it.
    pub fn matches_object(&self, object: &Obj) -> bool {
        self.matches_with(object, || Cow::Owned(object.name()))
    }

    /// Labels first: they are at hand, and most selectors are only labels. hive's kinds
    /// are cluster-scoped, so their `metadata.namespace` is `""` without looking; an
    /// Event's (and a namespaced route's filter) is read from the object.
    fn matches_with<'a>(&self, object: &Obj, name: impl FnOnce() -> Cow<'a, str>) -> bool {
        if self.labels.as_ref().is_some_and(|labels| !labels.matches(&object.labels())) {
            return false;
        }
        if !self.parses_objects() {
            return self.fields.as_ref().is_none_or(|fields| fields.matches(&name()));
        }
        let value = object.value();
        if let Some(namespace) = &self.namespace {
            let own = Field::Namespace.value_in(&value);
            if !own.is_empty() && own != namespace.as_str() {
                return false;
            }
        }
        self.fields.as_ref().is_none_or(|fields| fields.matches_object(&value))
    }
}

#[cfg(test)]
mod tests;
