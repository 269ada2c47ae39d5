//! The watcher: one kind's list-then-watch loop as an endless stream of [`Event`]s.
//!
//! It lists, then watches from the list's revision. A watch that ends or fails is resumed
//! from the last revision seen (an object's `resourceVersion`, or a bookmark's), so no
//! change is lost and none is delivered twice. A 410 `Expired`, whether returned by
//! `watch` or reported in the stream, means the history between that revision and now is
//! gone: the watcher lists again and emits [`Event::Restarted`] with the full state.
//! Consecutive failures are spaced by an exponential [`Backoff`], reset by any progress.

use std::time::Duration;

use futures_util::stream::{self, BoxStream, Stream, StreamExt};
use hive_api::Object;

use crate::backoff::Backoff;
use crate::client::{Client, ClientError, WatchEvent};

/// What the watcher observed.
#[derive(Clone, Debug, PartialEq)]
pub enum Event<K> {
    /// A (re)list: the complete current state of the kind. Anything not in it is gone.
    Restarted(Vec<K>),
    /// An object was created or changed; this is its new state.
    Applied(K),
    /// An object was deleted; this is its last state.
    Deleted(K),
}

/// How the watcher retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Spacing of consecutive failed (or empty-handed) list and watch attempts.
    pub backoff: Backoff,
}

impl Default for Config {
    fn default() -> Config {
        Config { backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)) }
    }
}

/// A failure the watcher recovered from. It is reported for logging only: the stream
/// goes on, retrying after a backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Listing failed; the watcher lists again.
    #[error("list failed: {0}")]
    List(#[source] ClientError),
    /// Opening a watch failed; the watcher retries from the same revision, or lists again
    /// if the revision expired.
    #[error("watch failed: {0}")]
    Watch(#[source] ClientError),
    /// An open watch reported an error (an in-stream `ERROR` or a broken stream); the
    /// watcher resumes from the last revision seen, or lists again if it expired.
    #[error("watch stream failed: {0}")]
    Stream(#[source] ClientError),
}

impl Error {
    /// True when the cause is a 410 `Expired`: routine after a long disconnection, and
    /// answered by a relist.
    pub fn is_expired(&self) -> bool {
        match self {
            Error::List(e) | Error::Watch(e) | Error::Stream(e) => e.is_expired(),
        }
    }

    /// True when the server is shutting down: the process ends next.
    pub fn is_shutting_down(&self) -> bool {
        match self {
            Error::List(e) | Error::Watch(e) | Error::Stream(e) => e.is_shutting_down(),
        }
    }
}

/// An endless stream of `K`'s events: an [`Event::Restarted`] first, then changes, with
/// recovered failures interleaved as `Err` items. Drop the stream to stop watching.
pub fn watcher<K: Object, C: Client<K>>(
    client: C,
    config: Config,
) -> impl Stream<Item = Result<Event<K>, Error>> + Send {
    let state = Watcher { client, config, phase: Phase::List, failures: 0 };
    stream::unfold(state, |mut state| async move {
        let item = state.step().await;
        Some((item, state))
    })
}

/// Where the watcher stands.
enum Phase<K> {
    /// The next step is a list.
    List,
    /// The next step is opening a watch from `resource_version`, the last revision seen.
    Watch { resource_version: String },
    /// A watch is open. `resource_version` is the last revision it delivered;
    /// `progressed` tells whether it delivered anything at all.
    Streaming {
        resource_version: String,
        stream: BoxStream<'static, Result<WatchEvent<K>, ClientError>>,
        progressed: bool,
    },
}

struct Watcher<K, C> {
    client: C,
    config: Config,
    phase: Phase<K>,
    /// Consecutive attempts that failed or made no progress; the next attempt waits
    /// `backoff.delay(failures - 1)`.
    failures: u32,
}

impl<K: Object, C: Client<K>> Watcher<K, C> {
    /// Runs until there is something to report.
    async fn step(&mut self) -> Result<Event<K>, Error> {
        loop {
            match std::mem::replace(&mut self.phase, Phase::List) {
                Phase::List => {
                    pause(self.failures, self.config.backoff).await;
                    match self.client.list().await {
                        Ok(list) => {
                            self.failures = 0;
                            if list.resource_version.is_empty() {
                                tracing::warn!(kind = K::KIND, "list carried no resourceVersion");
                            }
                            tracing::debug!(
                                kind = K::KIND,
                                resource_version = %list.resource_version,
                                objects = list.items.len(),
                                "listed"
                            );
                            self.phase = Phase::Watch { resource_version: list.resource_version };
                            return Ok(Event::Restarted(list.items));
                        }
                        Err(e) => {
                            self.failures += 1;
                            return Err(Error::List(e));
                        }
                    }
                }
                Phase::Watch { resource_version } => {
                    pause(self.failures, self.config.backoff).await;
                    match self.client.watch(&resource_version).await {
                        Ok(stream) => {
                            tracing::debug!(kind = K::KIND, %resource_version, "watching");
                            self.phase = Phase::Streaming { resource_version, stream, progressed: false };
                        }
                        Err(e) => {
                            self.failures += 1;
                            if !e.is_expired() {
                                self.phase = Phase::Watch { resource_version };
                            }
                            return Err(Error::Watch(e));
                        }
                    }
                }
                Phase::Streaming { mut resource_version, mut stream, progressed } => {
                    let event = match stream.next().await {
                        None => {
                            // A server ends watches routinely (timeouts); resume at once if
                            // this one was useful, otherwise count it as a failure.
                            if !progressed {
                                self.failures += 1;
                            }
                            tracing::debug!(kind = K::KIND, %resource_version, "watch ended; resuming");
                            self.phase = Phase::Watch { resource_version };
                            continue;
                        }
                        Some(Ok(WatchEvent::Error(e)) | Err(e)) => {
                            self.failures += 1;
                            if !e.is_expired() {
                                self.phase = Phase::Watch { resource_version };
                            }
                            return Err(Error::Stream(e));
                        }
                        Some(Ok(WatchEvent::Bookmark { resource_version: bookmark })) => {
                            self.failures = 0;
                            self.phase =
                                Phase::Streaming { resource_version: bookmark, stream, progressed: true };
                            continue;
                        }
                        Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                            Event::Applied(object)
                        }
                        Some(Ok(WatchEvent::Deleted(object))) => Event::Deleted(object),
                    };
                    // Advance before handing the event out: a resume then starts after it.
                    let object = match &event {
                        Event::Applied(o) | Event::Deleted(o) => o,
                        Event::Restarted(_) => unreachable!("a watch never restarts"),
                    };
                    match &object.metadata().resource_version {
                        Some(rv) if !rv.is_empty() => resource_version.clone_from(rv),
                        _ => tracing::warn!(
                            kind = K::KIND,
                            name = %object.metadata().name,
                            "watch event without resourceVersion"
                        ),
                    }
                    self.failures = 0;
                    self.phase = Phase::Streaming { resource_version, stream, progressed: true };
                    return Ok(event);
                }
            }
        }
    }
}

/// Waits out the backoff owed for `failures` consecutive failures.
async fn pause(failures: u32, backoff: Backoff) {
    if let Some(attempt) = failures.checked_sub(1) {
        tokio::time::sleep(backoff.delay(attempt)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;

    use tokio::time::Instant;

    use super::*;
    use crate::testing::{expired, next, nothing_within, widget, Call, FakeClient, Widget};

    type Events = Pin<Box<dyn Stream<Item = Result<Event<Widget>, Error>> + Send>>;

    fn start(client: &FakeClient<Widget>) -> Events {
        let config = Config { backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(8)) };
        Box::pin(watcher(client.clone(), config))
    }

    fn names(event: &Event<Widget>) -> Vec<(&str, u32)> {
        match event {
            Event::Restarted(items) => items.iter().map(|w| (w.metadata.name.as_str(), w.spec)).collect(),
            Event::Applied(w) | Event::Deleted(w) => vec![(w.metadata.name.as_str(), w.spec)],
        }
    }

    fn watch(rv: &str) -> Call {
        Call::Watch(rv.to_string())
    }

    #[tokio::test(start_paused = true)]
    async fn resumes_from_the_last_seen_revision_after_the_stream_ends() {
        let client = FakeClient::new();
        client.put(widget("a", 1)); // rv 1
        client.put(widget("b", 1)); // rv 2
        let mut events = start(&client);
        assert_eq!(names(&next(&mut events).await.unwrap()), [("a", 1), ("b", 1)]);

        client.put(widget("a", 2)); // rv 3
        assert_eq!(next(&mut events).await.unwrap(), Event::Applied(client.get("a")));

        // Changes made while disconnected arrive exactly once after the resume.
        client.end_watches();
        client.put(widget("c", 1)); // rv 4
        client.remove("b"); // rv 5
        assert_eq!(names(&next(&mut events).await.unwrap()), [("c", 1)]);
        assert!(matches!(next(&mut events).await.unwrap(), Event::Deleted(w) if w.metadata.name == "b"));
        client.put(widget("d", 1)); // rv 6
        assert_eq!(names(&next(&mut events).await.unwrap()), [("d", 1)]);

        assert_eq!(client.calls(), [Call::List, watch("2"), watch("3")]);
    }

    #[tokio::test(start_paused = true)]
    async fn relists_when_watch_returns_expired() {
        let client = FakeClient::new();
        client.put(widget("a", 1)); // rv 1
        client.put(widget("b", 1)); // rv 2
        let mut events = start(&client);
        next(&mut events).await.unwrap();
        nothing_within(&mut events, Duration::from_secs(1)).await; // the watch from 2 is open

        client.end_watches();
        client.remove("a"); // rv 3
        client.put(widget("c", 1)); // rv 4
        client.compact(); // watching from 2 is now impossible
        let error = next(&mut events).await.unwrap_err();
        assert!(matches!(error, Error::Watch(_)) && error.is_expired(), "{error:?}");
        assert_eq!(names(&next(&mut events).await.unwrap()), [("b", 1), ("c", 1)]);

        client.put(widget("d", 1)); // rv 5
        assert_eq!(names(&next(&mut events).await.unwrap()), [("d", 1)]);
        assert_eq!(client.calls(), [Call::List, watch("2"), watch("2"), Call::List, watch("4")]);
    }

    #[tokio::test(start_paused = true)]
    async fn relists_on_an_in_stream_expired_error() {
        let client = FakeClient::new();
        client.put(widget("a", 1)); // rv 1
        let mut events = start(&client);
        next(&mut events).await.unwrap();
        nothing_within(&mut events, Duration::from_secs(1)).await; // the watch from 1 is open

        client.put(widget("b", 1)); // rv 2
        client.fail_watches_in_band(expired);
        assert_eq!(names(&next(&mut events).await.unwrap()), [("b", 1)]);
        let error = next(&mut events).await.unwrap_err();
        assert!(matches!(error, Error::Stream(_)) && error.is_expired(), "{error:?}");
        assert_eq!(names(&next(&mut events).await.unwrap()), [("a", 1), ("b", 1)]);
        assert_eq!(client.calls(), [Call::List, watch("1"), Call::List]);
    }

    #[tokio::test(start_paused = true)]
    async fn bookmarks_advance_the_resume_revision() {
        let client = FakeClient::new();
        client.put(widget("a", 1)); // rv 1
        let mut events = start(&client);
        next(&mut events).await.unwrap();
        nothing_within(&mut events, Duration::from_secs(1)).await; // the watch from 1 is open

        client.advance_revision(5); // other kinds were written: rv 6
        client.bookmark();
        client.end_watches();
        nothing_within(&mut events, Duration::from_secs(60)).await;
        assert_eq!(client.calls(), [Call::List, watch("1"), watch("6")]);
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_resume_from_the_last_revision_with_exponential_backoff() {
        let client = FakeClient::new();
        client.put(widget("a", 1)); // rv 1
        let mut events = start(&client);
        next(&mut events).await.unwrap();
        client.put(widget("a", 2)); // rv 2
        next(&mut events).await.unwrap();

        // A broken stream, then three refused watches: retried at 1 s, 2 s, 4 s spacing,
        // always from rv 2, never relisting.
        for _ in 0..3 {
            client.fail_next_watch(ClientError::transport("connection refused"));
        }
        client.fail_watches_out_of_band(|| ClientError::transport("connection reset"));
        let started = Instant::now();
        assert!(matches!(next(&mut events).await, Err(Error::Stream(_))));
        let mut elapsed = Vec::new();
        for _ in 0..3 {
            assert!(matches!(next(&mut events).await, Err(Error::Watch(_))));
            elapsed.push((Instant::now() - started).as_secs());
        }
        assert_eq!(elapsed, [1, 3, 7]);

        client.put(widget("b", 1)); // rv 3
        assert_eq!(names(&next(&mut events).await.unwrap()), [("b", 1)]);
        assert_eq!((Instant::now() - started).as_secs(), 7 + 8, "fourth retry waits the capped 8 s");
        assert_eq!(client.calls(), [Call::List, watch("1"), watch("2"), watch("2"), watch("2"), watch("2")]);

        // Progress reset the backoff: the next failure is retried after 1 s again.
        client.fail_watches_in_band(|| ClientError::transport("internal error"));
        let failed = Instant::now();
        assert!(matches!(next(&mut events).await, Err(Error::Stream(_))));
        client.put(widget("c", 1)); // rv 4
        assert_eq!(names(&next(&mut events).await.unwrap()), [("c", 1)]);
        assert_eq!((Instant::now() - failed).as_secs(), 1);
        assert_eq!(client.calls().last(), Some(&watch("3")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_list_is_retried_after_backoff() {
        let client = FakeClient::new();
        client.put(widget("a", 1));
        client.fail_next_list(ClientError::transport("connection refused"));
        let mut events = start(&client);
        let started = Instant::now();
        assert!(matches!(next(&mut events).await, Err(Error::List(_))));
        assert_eq!(names(&next(&mut events).await.unwrap()), [("a", 1)]);
        assert_eq!((Instant::now() - started).as_secs(), 1);
    }
}
