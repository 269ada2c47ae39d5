//! The event recorder: lifecycle outcomes (Spawned, Built, Started, Crashed, BackOff …)
//! become core `Event` objects about the object they concern. A repeat of the same
//! event (same object, reason and message) folds into the existing one — `count` goes
//! up and `lastTimestamp` moves — and events past their time to live are deleted.

use std::time::Duration;

use hive_api::event::{Event, EventSource, ObjectReference};
use hive_api::meta::Time;
use hive_api::Object;

use crate::client::{self, Api};
use crate::store::{self, Store};

/// Normal or Warning, as Kubernetes types events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something went wrong.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Records events into the store on behalf of one component.
#[derive(Clone)]
pub struct Recorder {
    events: Api<Event>,
    component: String,
}

impl Recorder {
    /// A recorder writing as `component` (e.g. `hive-scheduler`).
    pub fn new(store: Store, component: impl Into<String>) -> Recorder {
        Recorder { events: Api::new(&store), component: component.into() }
    }

    /// Records that `reason` happened to `object` (a stored object), folding repeats.
    pub async fn record<K: Object>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        message: &str,
    ) -> client::Result<()> {
        let meta = object.metadata();
        let about = ObjectReference {
            api_version: K::API_VERSION.into(),
            kind: K::KIND.into(),
            name: meta.name.clone(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            ..Default::default()
        };
        self.record_about(about, type_, reason, message).await
    }

    /// Records that `reason` happened to what `about` names, which need not be a stored
    /// object (the meta repo is not one), folding repeats.
    pub async fn record_about(
        &self,
        about: ObjectReference,
        type_: EventType,
        reason: &str,
        message: &str,
    ) -> client::Result<()> {
        let event_name = event_name(&about.kind, &about.name, &about.uid, reason, message);
        let at = self.events.store().now();
        let (now, micro) = (Time(at), hive_api::MicroTime(at));
        let event = Event {
            api_version: Event::API_VERSION.into(),
            kind: Event::KIND.into(),
            metadata: hive_api::ObjectMeta { name: event_name.clone(), ..Default::default() },
            involved_object: about,
            reason: reason.into(),
            message: message.into(),
            type_: type_.as_str().into(),
            count: Some(1),
            first_timestamp: Some(now),
            last_timestamp: Some(now),
            event_time: Some(micro),
            series: None,
            source: Some(EventSource { component: self.component.clone(), ..Default::default() }),
            reporting_component: self.component.clone(),
            reporting_instance: String::new(),
            action: String::new(),
            related: None,
        };
        let fold = |e: &mut Event| {
            let count = e.count.unwrap_or(1).saturating_add(1);
            e.count = Some(count);
            e.last_timestamp = Some(now);
            e.series = Some(hive_api::event::EventSeries { count, last_observed_time: Some(micro) });
        };
        for _ in 0..2 {
            match self.events.patch(&event_name, fold).await {
                Ok(_) => return Ok(()),
                Err(err) if err.is_not_found() => {}
                Err(err) => return Err(err),
            }
            match self.events.create(&event).await {
                Ok(_) => return Ok(()),
                // Someone created the same event meanwhile: fold into theirs.
                Err(client::Error::Store(store::Error::AlreadyExists { .. })) => continue,
                Err(err) => return Err(err),
            }
        }
        tracing::warn!(event = event_name, "event not recorded: it kept changing");
        Ok(())
    }

    /// Deletes events whose `lastTimestamp` is older than `ttl`. Returns how many.
    pub async fn expire(&self, ttl: Duration) -> client::Result<usize> {
        let cutoff =
            self.events.store().now() - chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
        let mut removed = 0;
        for event in self.events.list().1 {
            if event.last_timestamp.is_some_and(|t| t.0 < cutoff) {
                // Only this very version: one folded meanwhile is no longer expired.
                match self.events.delete_version(&event).await {
                    Ok(true) => removed += 1,
                    Ok(false) => {}
                    Err(err) => return Err(err),
                }
            }
        }
        Ok(removed)
    }
}

/// A DNS-1123 label naming one (object, reason, message) event: the object's name
/// (shortened) and a hash of the rest, so repeats find the same event.
fn event_name(kind: &str, name: &str, uid: &str, reason: &str, message: &str) -> String {
    let key = format!("{kind}\0{name}\0{uid}\0{reason}\0{message}");
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let hash: String = digest.as_ref()[..5].iter().map(|b| format!("{b:02x}")).collect();
    let prefix: String = name.chars().take(63 - hash.len() - 1).collect();
    let prefix = prefix.trim_end_matches('-');
    format!("{prefix}-{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreConfig;

    #[tokio::test]
    async fn repeats_fold_into_a_count_and_old_events_expire() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let agent: hive_api::Agent =
            serde_json::from_value(serde_json::json!({"apiVersion": "hive.dev/v1", "kind": "Agent",
                           "metadata": {"name": "a1", "uid": "u-1", "resourceVersion": "3"}}))
            .unwrap();
        let recorder = Recorder::new(store.clone(), "hive-test");
        recorder.record(&agent, EventType::Warning, "Crashed", "exited with status 1").await.unwrap();
        recorder.record(&agent, EventType::Warning, "Crashed", "exited with status 1").await.unwrap();
        recorder.record(&agent, EventType::Normal, "Started", "started generation 2").await.unwrap();
        let (_, events) = store.list("events");
        assert_eq!(events.len(), 2);
        let crashed = events.iter().find(|e| e.value()["reason"] == "Crashed").unwrap();
        assert_eq!(crashed.value()["count"], 2);
        assert_eq!(crashed.value()["involvedObject"]["name"], "a1");
        assert_eq!(crashed.value()["type"], "Warning");
        let decoded: Event = crashed.decode().unwrap();
        assert!(hive_api::resource::validate(&decoded).is_empty());
        // Microsecond times: the first occurrence, and the repeat's in its series.
        let first = crashed.value()["eventTime"].as_str().unwrap().to_string();
        let last = crashed.value()["series"]["lastObservedTime"].as_str().unwrap().to_string();
        assert_eq!((first.len(), last.len()), (27, 27), "{first} {last}: six fractional digits");
        assert!(last >= first);
        assert_eq!(crashed.value()["series"]["count"], 2);
        let started = events.iter().find(|e| e.value()["reason"] == "Started").unwrap();
        assert!(started.value()["eventTime"].as_str().unwrap() >= last.as_str());
        assert!(started.value().get("series").is_none(), "a single occurrence has no series");

        assert_eq!(recorder.expire(Duration::from_secs(3600)).await.unwrap(), 0);
        assert_eq!(recorder.expire(Duration::ZERO).await.unwrap(), 2);
        assert!(store.list("events").1.is_empty());
    }

    #[test]
    fn names_are_labels_even_for_long_object_names() {
        let long = "a".repeat(63);
        let name = event_name("Agent", &long, "u", "Started", "m");
        assert!(hive_api::validation::dns1123_label(&name).is_ok(), "{name}");
        assert_ne!(name, event_name("Agent", &long, "u", "Started", "other"));
    }
}
