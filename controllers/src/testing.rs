//! Test support: a small kind, [`Widget`], and [`FakeClient`], an in-memory stand-in for
//! the API with a revisioned history that tests can push changes into, end or break
//! watches on, compact (so old revisions get 410 `Expired`), and inspect calls of.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::stream::{self, BoxStream, Stream, StreamExt};
use hive_api::{Object, ObjectMeta};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::client::{Client, ClientError, ObjectList, WatchEvent};

/// A minimal kind: a name and a number.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Widget {
    pub metadata: ObjectMeta,
    pub spec: u32,
}

impl Object for Widget {
    const KIND: &'static str = "Widget";
    const LIST_KIND: &'static str = "WidgetList";
    const PLURAL: &'static str = "widgets";
    const SINGULAR: &'static str = "widget";
    const SHORT_NAMES: &'static [&'static str] = &[];

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A widget named `name` with spec `spec` (no resourceVersion: the fake assigns it).
pub fn widget(name: &str, spec: u32) -> Widget {
    Widget { metadata: ObjectMeta { name: name.to_string(), ..Default::default() }, spec }
}

/// A 410 `Expired`.
pub fn expired() -> ClientError {
    ClientError::Expired("too old resource version".into())
}

/// The next item of `stream`; panics if none comes within an hour of (paused) time.
pub async fn next<S: Stream + Unpin>(stream: &mut S) -> S::Item {
    tokio::time::timeout(Duration::from_secs(3600), stream.next())
        .await
        .expect("no item within an hour")
        .expect("stream ended")
}

/// Polls `stream` for `within` and asserts it yields nothing.
pub async fn nothing_within<S: Stream + Unpin>(stream: &mut S, within: Duration)
where
    S::Item: std::fmt::Debug,
{
    if let Ok(item) = tokio::time::timeout(within, stream.next()).await {
        panic!("unexpected item: {item:?}");
    }
}

/// A request the fake served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    List,
    Watch(String),
}

enum Change<K> {
    Added(K),
    Modified(K),
    Deleted(K),
}

impl<K: Clone> Change<K> {
    fn to_event(&self) -> WatchEvent<K> {
        match self {
            Change::Added(o) => WatchEvent::Added(o.clone()),
            Change::Modified(o) => WatchEvent::Modified(o.clone()),
            Change::Deleted(o) => WatchEvent::Deleted(o.clone()),
        }
    }
}

type Sender<K> = mpsc::UnboundedSender<Result<WatchEvent<K>, ClientError>>;

struct State<K> {
    revision: u64,
    objects: BTreeMap<String, K>,
    history: Vec<(u64, Change<K>)>,
    /// Watching from a revision below this one gets 410.
    compacted: u64,
    watches: Vec<Sender<K>>,
    calls: Vec<Call>,
    list_failures: VecDeque<ClientError>,
    watch_failures: VecDeque<ClientError>,
}

/// An in-memory API for one kind with Kubernetes watch semantics.
pub struct FakeClient<K> {
    state: Arc<Mutex<State<K>>>,
}

impl<K> Clone for FakeClient<K> {
    fn clone(&self) -> Self {
        FakeClient { state: self.state.clone() }
    }
}

impl<K: Object> FakeClient<K> {
    pub fn new() -> Self {
        FakeClient {
            state: Arc::new(Mutex::new(State {
                revision: 0,
                objects: BTreeMap::new(),
                history: Vec::new(),
                compacted: 0,
                watches: Vec::new(),
                calls: Vec::new(),
                list_failures: VecDeque::new(),
                watch_failures: VecDeque::new(),
            })),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<K>> {
        self.state.lock().unwrap()
    }

    /// Creates or replaces an object; returns its new revision.
    pub fn put(&self, mut object: K) -> u64 {
        let mut state = self.state();
        state.revision += 1;
        let revision = state.revision;
        object.metadata_mut().resource_version = Some(revision.to_string());
        let name = object.metadata().name.clone();
        let change = match state.objects.insert(name, object.clone()) {
            None => Change::Added(object),
            Some(_) => Change::Modified(object),
        };
        state.record(revision, change);
        revision
    }

    /// Deletes an object; returns the revision of the deletion.
    pub fn remove(&self, name: &str) -> u64 {
        let mut state = self.state();
        let mut object = state.objects.remove(name).expect("no such object");
        state.revision += 1;
        let revision = state.revision;
        object.metadata_mut().resource_version = Some(revision.to_string());
        state.record(revision, Change::Deleted(object));
        revision
    }

    /// The current state of an object.
    pub fn get(&self, name: &str) -> K {
        self.state().objects[name].clone()
    }

    /// Moves the global revision on without touching this kind, as writes to other kinds do.
    pub fn advance_revision(&self, by: u64) {
        self.state().revision += by;
    }

    /// Sends a bookmark at the current revision to every open watch.
    pub fn bookmark(&self) {
        let mut state = self.state();
        let resource_version = state.revision.to_string();
        state.send(|| Ok(WatchEvent::Bookmark { resource_version: resource_version.clone() }));
    }

    /// Ends every open watch cleanly.
    pub fn end_watches(&self) {
        self.state().watches.clear();
    }

    /// Sends an in-stream `ERROR` event to every open watch, then ends them.
    pub fn fail_watches_in_band(&self, error: impl Fn() -> ClientError) {
        let mut state = self.state();
        state.send(|| Ok(WatchEvent::Error(error())));
        state.watches.clear();
    }

    /// Breaks every open watch with a stream error (e.g. a reset connection).
    pub fn fail_watches_out_of_band(&self, error: impl Fn() -> ClientError) {
        let mut state = self.state();
        state.send(|| Err(error()));
        state.watches.clear();
    }

    /// Forgets all history: watching from any revision before now gets 410.
    pub fn compact(&self) {
        let mut state = self.state();
        state.compacted = state.revision;
        state.history.clear();
    }

    /// Makes the next `list` call fail with `error`.
    pub fn fail_next_list(&self, error: ClientError) {
        self.state().list_failures.push_back(error);
    }

    /// Makes the next `watch` call fail with `error`.
    pub fn fail_next_watch(&self, error: ClientError) {
        self.state().watch_failures.push_back(error);
    }

    /// Every list and watch call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }
}

impl<K: Object> State<K> {
    fn record(&mut self, revision: u64, change: Change<K>) {
        self.send(|| Ok(change.to_event()));
        self.history.push((revision, change));
    }

    fn send(&mut self, event: impl Fn() -> Result<WatchEvent<K>, ClientError>) {
        self.watches.retain(|watch| watch.send(event()).is_ok());
    }
}

impl<K: Object> Client<K> for FakeClient<K> {
    async fn list(&self) -> Result<ObjectList<K>, ClientError> {
        let mut state = self.state();
        state.calls.push(Call::List);
        if let Some(error) = state.list_failures.pop_front() {
            return Err(error);
        }
        Ok(ObjectList {
            items: state.objects.values().cloned().collect(),
            resource_version: state.revision.to_string(),
        })
    }

    async fn watch(
        &self,
        resource_version: &str,
    ) -> Result<BoxStream<'static, Result<WatchEvent<K>, ClientError>>, ClientError> {
        let mut state = self.state();
        state.calls.push(Call::Watch(resource_version.to_string()));
        if let Some(error) = state.watch_failures.pop_front() {
            return Err(error);
        }
        let from: u64 = resource_version.parse().expect("the fake only watches from exact revisions");
        if from < state.compacted {
            return Err(expired());
        }
        let (tx, rx) = mpsc::unbounded_channel();
        for (_, change) in state.history.iter().filter(|(revision, _)| *revision > from) {
            tx.send(Ok(change.to_event())).expect("receiver is alive");
        }
        state.watches.push(tx);
        Ok(stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) }).boxed())
    }
}
