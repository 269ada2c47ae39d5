//! The event recorder: lifecycle outcomes (Spawned, Built, Started, Crashed, BackOff …)
//! become core `Event` objects about the object they concern. A repeat of the same
//! event (same object, reason and message) folds into the existing one — `count` goes
//! up and `lastTimestamp` moves — and events past their time to live are deleted.

use std::time::Duration;

use chrono::Utc;
use hive_api::event::Event;
use hive_api::meta::Time;
use serde_json::{json, Value};

use crate::store::{self, Mutation, Store, Subresource};

/// Where events are stored (the `events` resource).
const KIND: &str = "events";

/// How many times a fold is retried when the event changed under it.
const RETRIES: usize = 8;

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
    store: Store,
    component: String,
}

impl Recorder {
    /// A recorder writing as `component` (e.g. `hive-scheduler`).
    pub fn new(store: Store, component: impl Into<String>) -> Recorder {
        Recorder { store, component: component.into() }
    }

    /// Records that `reason` happened to `object` (a stored object), folding repeats.
    pub async fn record(
        &self,
        object: &Value,
        type_: EventType,
        reason: &str,
        message: &str,
    ) -> store::Result<()> {
        let meta = &object["metadata"];
        let kind = object["kind"].as_str().unwrap_or("");
        let name = meta["name"].as_str().unwrap_or("");
        let uid = meta["uid"].as_str().unwrap_or("");
        let event_name = event_name(kind, name, uid, reason, message);
        let now = Time(Utc::now());
        for _ in 0..RETRIES {
            let mutation = match self.store.get(KIND, &event_name) {
                Some(existing) => {
                    let mut folded = (*existing).clone();
                    let count = folded["count"].as_i64().unwrap_or(1) + 1;
                    folded["count"] = json!(count);
                    folded["lastTimestamp"] = json!(now);
                    Mutation::Update { kind: KIND, object: folded, subresource: Subresource::Main }
                }
                None => {
                    let event = json!({
                        "apiVersion": "v1",
                        "kind": Event::KIND_NAME,
                        "metadata": {"name": event_name},
                        "involvedObject": {
                            "apiVersion": object["apiVersion"],
                            "kind": kind,
                            "name": name,
                            "uid": uid,
                            "resourceVersion": meta["resourceVersion"],
                        },
                        "reason": reason,
                        "message": message,
                        "type": type_.as_str(),
                        "count": 1,
                        "firstTimestamp": now,
                        "lastTimestamp": now,
                        "source": {"component": self.component},
                        "reportingComponent": self.component,
                    });
                    Mutation::Create { kind: KIND, object: event }
                }
            };
            match self.store.commit(mutation, false).await {
                Ok(_) => return Ok(()),
                // Someone folded or created the same event meanwhile: fold again.
                Err(
                    store::Error::Conflict { .. }
                    | store::Error::AlreadyExists { .. }
                    | store::Error::NotFound { .. },
                ) => continue,
                Err(err) => return Err(err),
            }
        }
        tracing::warn!(event = event_name, "event not recorded: it kept changing");
        Ok(())
    }

    /// Deletes events whose `lastTimestamp` is older than `ttl`. Returns how many.
    pub async fn expire(&self, ttl: Duration) -> store::Result<usize> {
        let cutoff = Utc::now() - chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
        let (_, events) = self.store.list(KIND);
        let mut removed = 0;
        for event in events {
            let last = event["lastTimestamp"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc));
            if last.is_some_and(|t| t < cutoff) {
                let name = event["metadata"]["name"].as_str().unwrap_or("").to_string();
                let rv = event["metadata"]["resourceVersion"].as_str().map(str::to_string);
                let delete = Mutation::Delete { kind: KIND, name, uid: None, resource_version: rv };
                match self.store.commit(delete, false).await {
                    Ok(_) => removed += 1,
                    // Folded (so no longer expired) or already gone.
                    Err(store::Error::Conflict { .. } | store::Error::NotFound { .. }) => {}
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
        let agent = json!({"apiVersion": "hive.dev/v1", "kind": "Agent",
                           "metadata": {"name": "a1", "uid": "u-1", "resourceVersion": "3"}});
        let recorder = Recorder::new(store.clone(), "hive-test");
        recorder.record(&agent, EventType::Warning, "Crashed", "exited with status 1").await.unwrap();
        recorder.record(&agent, EventType::Warning, "Crashed", "exited with status 1").await.unwrap();
        recorder.record(&agent, EventType::Normal, "Started", "started generation 2").await.unwrap();
        let (_, events) = store.list(KIND);
        assert_eq!(events.len(), 2);
        let crashed = events.iter().find(|e| e["reason"] == "Crashed").unwrap();
        assert_eq!(crashed["count"], 2);
        assert_eq!(crashed["involvedObject"]["name"], "a1");
        assert_eq!(crashed["type"], "Warning");
        let decoded: Event = serde_json::from_value((**crashed).clone()).unwrap();
        assert!(hive_api::resource::validate(&decoded).is_empty());

        assert_eq!(recorder.expire(Duration::from_secs(3600)).await.unwrap(), 0);
        assert_eq!(recorder.expire(Duration::ZERO).await.unwrap(), 2);
        assert!(store.list(KIND).1.is_empty());
    }

    #[test]
    fn names_are_labels_even_for_long_object_names() {
        let long = "a".repeat(63);
        let name = event_name("Agent", &long, "u", "Started", "m");
        assert!(hive_api::validation::dns1123_label(&name).is_ok(), "{name}");
        assert_ne!(name, event_name("Agent", &long, "u", "Started", "other"));
    }
}
