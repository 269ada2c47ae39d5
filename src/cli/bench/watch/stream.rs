//! One watcher of the watch phase: reads its stream, recognises the bench's writes by
//! their [`Stamp`], and says how the stream ended if it ended early.

use serde::Deserialize;

use crate::cli::bench::api::{snippet, wall_ns, Stamp};

/// One write seen by one watcher: which write, when it was sent and when it arrived
/// (Unix ns).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(in crate::cli::bench) struct Delivery {
    pub(in crate::cli::bench) seq: usize,
    pub(in crate::cli::bench) sent_ns: u128,
    pub(in crate::cli::bench) received_ns: u128,
}

impl Delivery {
    pub(in crate::cli::bench) fn latency(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.received_ns.saturating_sub(self.sent_ns) as u64)
    }
}

/// Why a stream ended before its watcher had every write.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::cli::bench) enum StreamEnd {
    /// An in-stream `410 Gone` (`ERROR` event): the daemon dropped the watcher, as it
    /// does with one that falls too far behind.
    Gone(String),
    /// Anything else: the connection closed or failed, another `ERROR`, a line that is
    /// not an event.
    Broke(String),
}

/// What one watcher received.
pub(in crate::cli::bench) struct WatcherSaw {
    pub(in crate::cli::bench) deliveries: Vec<Delivery>,
    pub(in crate::cli::bench) end: Option<StreamEnd>,
}

/// Reads one stream until it has seen each of the `expected` writes of `load` once, it
/// ends, or `stop`.
pub(super) async fn read_watch(
    mut resp: reqwest::Response,
    load: usize,
    expected: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> WatcherSaw {
    let mut saw = WatcherSaw { deliveries: Vec::with_capacity(expected), end: None };
    let mut seen = vec![false; expected];
    let mut distinct = 0;
    let mut buffer: Vec<u8> = Vec::new();
    while distinct < expected && saw.end.is_none() {
        let chunk = tokio::select! {
            chunk = resp.chunk() => chunk,
            _ = stop.changed() => break,
        };
        // One receive time per chunk: parsing is the client's cost, not delivery.
        let received = wall_ns();
        match chunk {
            Ok(Some(bytes)) => buffer.extend_from_slice(&bytes),
            Ok(None) => saw.end = Some(StreamEnd::Broke("the server closed the stream".into())),
            Err(e) => saw.end = Some(StreamEnd::Broke(format!("{e}"))),
        }
        let mut start = 0;
        while let Some(end) = memchr::memchr(b'\n', &buffer[start..]) {
            match classify(&buffer[start..start + end]) {
                Line::Write(stamp) if stamp.load == load => {
                    if seen.get(stamp.seq) == Some(&false) {
                        seen[stamp.seq] = true;
                        distinct += 1;
                    }
                    saw.deliveries.push(Delivery {
                        seq: stamp.seq,
                        sent_ns: stamp.sent_ns,
                        received_ns: received,
                    });
                }
                Line::Write(_) | Line::Other => {}
                Line::Gone(why) => saw.end = Some(StreamEnd::Gone(why)),
                Line::Error(why) => saw.end = Some(StreamEnd::Broke(why)),
            }
            start += end + 1;
        }
        buffer.drain(..start);
    }
    saw
}

/// What a watch line is to the benchmark.
#[derive(Debug, PartialEq)]
pub(super) enum Line {
    /// A bench write.
    Write(Stamp),
    /// An `ERROR` event with code 410: the stream is over, the watcher was dropped.
    Gone(String),
    /// Another `ERROR` event (the stream is over), or a line that is not an event.
    Error(String),
    /// Anything else: bookmarks, objects that are not bench writes.
    Other,
}

/// What a line is, reading as little of it as it can: the client reads 100,000 events a
/// second at the heaviest load, and its CPU is taken from the same two cores as the
/// daemon's.
pub(super) fn classify(line: &[u8]) -> Line {
    if let Some(stamp) = stamp_of(line) {
        return Line::Write(stamp);
    }
    parse(line)
}

/// The fast path of [`classify`]: an `ADDED` or `MODIFIED` line whose object carries both
/// bench annotations, found by their bytes as the daemon writes them (serde_json's compact
/// form; the values are digits and a colon, never escaped). `None` sends the line to the
/// full parse.
fn stamp_of(line: &[u8]) -> Option<Stamp> {
    if !(line.starts_with(br#"{"type":"ADDED","#) || line.starts_with(br#"{"type":"MODIFIED","#)) {
        return None;
    }
    let value = |key: &[u8]| {
        let at = memchr::memmem::find(line, key)? + key.len();
        let len = memchr::memchr(b'"', &line[at..])?;
        std::str::from_utf8(&line[at..at + len]).ok()
    };
    Stamp::parse(value(br#""bench.hive.dev/write":""#)?, value(br#""bench.hive.dev/sent-ns":""#)?)
}

/// The full parse of [`classify`]: only what the bench needs, borrowed.
fn parse(line: &[u8]) -> Line {
    use std::borrow::Cow;
    #[derive(Deserialize)]
    struct Event<'a> {
        #[serde(rename = "type", borrow)]
        type_: Cow<'a, str>,
        #[serde(borrow)]
        object: Object<'a>,
    }
    #[derive(Deserialize)]
    struct Object<'a> {
        #[serde(default, borrow)]
        metadata: Metadata<'a>,
        #[serde(default, borrow)]
        message: Cow<'a, str>,
        #[serde(default)]
        code: u16,
    }
    #[derive(Deserialize, Default)]
    struct Metadata<'a> {
        #[serde(default, borrow)]
        annotations: Annotations<'a>,
    }
    /// The two annotations the writer sets (`WRITE_ANNOTATION`, `SENT_ANNOTATION`).
    #[derive(Deserialize, Default)]
    struct Annotations<'a> {
        #[serde(rename = "bench.hive.dev/write", default, borrow)]
        write: Option<Cow<'a, str>>,
        #[serde(rename = "bench.hive.dev/sent-ns", default, borrow)]
        sent: Option<Cow<'a, str>>,
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Line::Other;
    }
    let event: Result<Event<'_>, _> = serde_json::from_slice(line);
    match event {
        Err(e) => Line::Error(format!("malformed event ({e}): {}", snippet(line))),
        Ok(event) if event.type_ == "ERROR" && event.object.code == 410 => {
            Line::Gone(format!("410: {}", event.object.message))
        }
        Ok(event) if event.type_ == "ERROR" => Line::Error(format!("ERROR event: {}", event.object.message)),
        Ok(event) => match event.object.metadata.annotations {
            Annotations { write: Some(write), sent: Some(sent) } => {
                Stamp::parse(&write, &sent).map_or(Line::Other, Line::Write)
            }
            _ => Line::Other,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::api::{SENT_ANNOTATION, WRITE_ANNOTATION};

    #[test]
    fn watch_lines_are_classified() {
        // The annotations classify reads by name are the ones the writer sets.
        assert_eq!((WRITE_ANNOTATION, SENT_ANNOTATION), ("bench.hive.dev/write", "bench.hive.dev/sent-ns"));
        let escaped = br#"{"type":"MODIFIED","object":{"metadata":{"annotations":{"bench.hive.dev/sent-ns":"4\u0032","bench.hive.dev/write":"1:7","x":"y"}},"spec":{"a":[1,{"b":null}]}}}"#;
        assert_eq!(classify(escaped), Line::Write(Stamp { load: 1, seq: 7, sent_ns: 42 }));
        assert_eq!(stamp_of(escaped), None, "an escape is left to the full parse");
        let compact = br#"{"type":"ADDED","object":{"metadata":{"annotations":{"bench.hive.dev/sent-ns":"42","bench.hive.dev/write":"1:7"}}}}"#;
        assert_eq!(stamp_of(compact), Some(Stamp { load: 1, seq: 7, sent_ns: 42 }));
        assert_eq!(stamp_of(&compact[..60]), None, "a cut line is not a stamp");
        let write = br#"{"type":"ADDED","object":{"kind":"Agent","metadata":{"name":"w","annotations":{"bench.hive.dev/sent-ns":"42","bench.hive.dev/write":"1:7"}},"spec":{}}}"#;
        assert_eq!(classify(write), Line::Write(Stamp { load: 1, seq: 7, sent_ns: 42 }));
        let unnamed = br#"{"type":"ADDED","object":{"kind":"Agent","metadata":{"name":"w","annotations":{"bench.hive.dev/sent-ns":"42"}},"spec":{}}}"#;
        assert_eq!(classify(unnamed), Line::Other);
        let other = br#"{"type":"ADDED","object":{"kind":"Agent","metadata":{"name":"x"}}}"#;
        assert_eq!(classify(other), Line::Other);
        let bookmark = br#"{"type":"BOOKMARK","object":{"kind":"Agent","metadata":{"resourceVersion":"9"}}}"#;
        assert_eq!(classify(bookmark), Line::Other);
        assert_eq!(classify(b"  "), Line::Other);
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}"#;
        assert_eq!(classify(gone), Line::Gone("410: too old".into()));
        let error = br#"{"type":"ERROR","object":{"kind":"Status","code":500,"message":"broken"}}"#;
        assert_eq!(classify(error), Line::Error("ERROR event: broken".into()));
        assert!(matches!(classify(b"{nope"), Line::Error(_)));
    }
}
