//! The core `v1` `Event`: a record of something that happened to an object (Spawned,
//! Built, Started, Crashed …), served at `/api/v1/events` so that `kubectl describe`
//! lists an agent's history as it does a pod's. Repeats fold into `count`.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

use crate::meta::{ObjectMeta, Time};
use crate::resource::{Column, KindInfo, Object, Resource};
use crate::validation::{Errors, Reason};

/// The registry entry of core events: served at `/api/v1/events`, cluster-scoped like
/// every hive object, selectable on the `involvedObject` fields kubectl uses.
pub static EVENT_KIND: KindInfo = KindInfo { field_selectors: EVENT_FIELDS, ..KindInfo::of::<Event>() };

/// The fields `/api/v1/events` can be selected on, as kubectl uses them.
pub const EVENT_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// An event about an object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Always `v1`.
    #[serde(default = "core_v1")]
    pub api_version: String,
    /// Always `Event`.
    #[serde(default)]
    pub kind: String,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The object this event is about.
    #[serde(default)]
    pub involved_object: ObjectReference,
    /// CamelCase reason, e.g. `Started`, `Crashed`, `BackOff`.
    #[serde(default)]
    pub reason: String,
    /// What happened, for humans.
    #[serde(default)]
    pub message: String,
    /// `Normal` or `Warning`.
    #[serde(default, rename = "type")]
    pub type_: String,
    /// How many times this event happened (repeats are folded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
    /// When it first happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_timestamp: Option<Time>,
    /// When it last happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_timestamp: Option<Time>,
    /// When it first happened, to the microsecond (events of one second are ordered by
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<crate::meta::MicroTime>,
    /// Its repeats, once it happened more than once: how often and when last, to the
    /// microsecond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<EventSeries>,
    /// Which component reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<EventSource>,
    /// Which component reported it (the newer field kubectl also reads).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reporting_component: String,
    /// Which instance of the component reported it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reporting_instance: String,
    /// What was done or failed about the object, e.g. `Reconcile` (events.k8s.io's
    /// recorders set it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub action: String,
    /// A second object the event is about, e.g. the node an agent was placed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub related: Option<ObjectReference>,
}

impl Event {
    /// The kind name, `Event`.
    pub const KIND_NAME: &'static str = "Event";
}

/// The `apiVersion` of the same events served by the `events.k8s.io` group.
pub const EVENTS_V1: &str = "events.k8s.io/v1";

/// The fields whose names differ between a core Event and an `events.k8s.io/v1` one,
/// as (core, events.k8s.io); every other field is the same in both, as kube-apiserver
/// converts them (one stored object, two served shapes).
pub const EVENTS_V1_RENAMES: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// An `events.k8s.io/v1` Event (or a patch of one) in the core shape: its renamed
/// top-level fields take their core names and `apiVersion`, when given, becomes `v1`.
/// Anything else is left for admission to judge.
pub fn from_events_v1(value: &mut Value) {
    let Some(fields) = value.as_object_mut() else { return };
    for (core, v1) in EVENTS_V1_RENAMES {
        if let Some(field) = fields.remove(*v1) {
            fields.insert((*core).into(), field);
        }
    }
    if fields.get("apiVersion").and_then(Value::as_str) == Some(EVENTS_V1) {
        fields.insert("apiVersion".into(), Value::String("v1".into()));
    }
}

/// A stored core Event in the `events.k8s.io/v1` shape.
pub fn to_events_v1(value: &mut Value) {
    let Some(fields) = value.as_object_mut() else { return };
    for (core, v1) in EVENTS_V1_RENAMES {
        if let Some(field) = fields.remove(*core) {
            fields.insert((*v1).into(), field);
        }
    }
    fields.insert("apiVersion".into(), Value::String(EVENTS_V1.into()));
}

/// A field path of the core shape (`involvedObject.name`) in the `events.k8s.io/v1`
/// shape (`regarding.name`), for errors answered on that group's routes.
pub fn events_v1_path(core_path: &str) -> String {
    for (core, v1) in EVENTS_V1_RENAMES {
        if let Some(rest) = core_path.strip_prefix(core) {
            if rest.is_empty() || rest.starts_with('.') || rest.starts_with('[') {
                return format!("{v1}{rest}");
            }
        }
    }
    core_path.to_string()
}

fn core_v1() -> String {
    "v1".into()
}

/// A reference to an object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// API version of the object, e.g. `hive.dev/v1`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// Kind of the object, e.g. `Agent`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Name of the object.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Namespace of the object (empty for cluster-scoped hive objects).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// UID of the object.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The object's resourceVersion when the event was recorded.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    /// A part of the object, e.g. `spec.nodes{prebuild}`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field_path: String,
}

/// The repeats of an event (events.k8s.io's `series`, also on core/v1 Events).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventSeries {
    /// How many times it happened.
    #[serde(default)]
    pub count: i32,
    /// When it last happened, to the microsecond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_observed_time: Option<crate::meta::MicroTime>,
}

/// The component that reported an event.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventSource {
    /// The component, e.g. `hive-scheduler`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub component: String,
    /// The host it runs on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
}

/// A list of events.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventList {
    /// Always `v1`.
    #[serde(default = "core_v1")]
    pub api_version: String,
    /// Always `EventList`.
    #[serde(default)]
    pub kind: String,
    /// List metadata.
    #[serde(default)]
    pub metadata: crate::meta::ListMeta,
    /// The events.
    pub items: Vec<Event>,
}

impl Object for Event {
    const API_VERSION: &'static str = "v1";
    const KIND: &'static str = "Event";
    const LIST_KIND: &'static str = "EventList";
    const PLURAL: &'static str = "events";
    const SINGULAR: &'static str = "event";
    const SHORT_NAMES: &'static [&'static str] = &["ev"];
    const NAMES: crate::validation::NameRule = crate::validation::NameRule::Subdomain;
    const KEEPS_NAMESPACE: bool = true;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Resource for Event {
    fn validate(&self, errors: &mut Errors) {
        if self.involved_object.name.is_empty() {
            errors.push("involvedObject.name", Reason::Required, "the object the event is about");
        }
        if self.reason.is_empty() {
            errors.push("reason", Reason::Required, "a CamelCase reason such as Started");
        }
        if !matches!(self.type_.as_str(), "" | "Normal" | "Warning") {
            errors.push(
                "type",
                Reason::NotSupported,
                format!("{:?}: supported values: \"Normal\", \"Warning\"", self.type_),
            );
        }
        if self.message.len() > 4096 {
            errors.push("message", Reason::TooLong, format!("{} bytes; at most 4096", self.message.len()));
        }
    }

    fn columns() -> Vec<Column> {
        vec![
            Column::new("Type", "type"),
            Column::new("Reason", "reason"),
            Column::new("Object", "involvedObject"),
            Column { name: "Count", type_: "integer", description: "count", priority: 0 },
            Column::new("Message", "message"),
            Column::wide("Source", "source.component"),
            Column::wide("Last Seen", "lastTimestamp"),
        ]
    }

    fn cells(&self) -> Vec<Value> {
        let object = format!("{}/{}", self.involved_object.kind.to_lowercase(), self.involved_object.name);
        vec![
            json!(self.type_),
            json!(self.reason),
            json!(object),
            json!(self.count.unwrap_or(1)),
            json!(self.message),
            json!(self.source.as_ref().map(|s| s.component.as_str()).unwrap_or(&self.reporting_component)),
            json!(self.last_timestamp.map(|t| t.0.to_rfc3339()).unwrap_or_default()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_shapes_convert_into_each_other() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "a.1"},
            "regarding": {"kind": "Agent", "name": "a"}, "note": "n", "reportingController": "c",
            "reportingInstance": "i", "action": "Do", "reason": "R", "type": "Normal",
            "deprecatedCount": 2, "series": {"count": 2}});
        let mut core = v1.clone();
        from_events_v1(&mut core);
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(
            (&core["involvedObject"]["name"], &core["message"], &core["count"]),
            (&json!("a"), &json!("n"), &json!(2))
        );
        assert_eq!((&core["reportingComponent"], &core["action"]), (&json!("c"), &json!("Do")));
        let event: Event = serde_json::from_value(core.clone()).expect("a core Event");
        assert_eq!(event.action, "Do");
        to_events_v1(&mut core);
        assert_eq!(core, v1);
        assert_eq!(events_v1_path("involvedObject.name"), "regarding.name");
        assert_eq!(events_v1_path("messageX"), "messageX");
        assert_eq!(events_v1_path("reason"), "reason");
    }

    #[test]
    fn validation_names_fields() {
        let mut errors = Errors::default();
        Event { type_: "Loud".into(), ..Default::default() }.validate(&mut errors);
        let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["involvedObject.name", "reason", "type"]);
    }
}
