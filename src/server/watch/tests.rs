//! The watch body's joining of queued lines, and its abort.

use bytes::Bytes;
use futures_util::{FutureExt as _, StreamExt as _};
use tokio::sync::{mpsc, oneshot};

use super::{Lines, JOIN_BYTES};

/// A line of `len` bytes (newline included) made of `fill`.
fn line(fill: u8, len: usize) -> Bytes {
    let mut bytes = vec![fill; len - 1];
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// A body with `queued` already sent to it, and the abort's sender.
fn body(queued: &[Bytes]) -> (Lines, mpsc::Sender<Bytes>, oneshot::Sender<()>) {
    let (tx, rx) = mpsc::channel(queued.len().max(1));
    for l in queued {
        tx.try_send(l.clone()).expect("room for every line");
    }
    let (abort, aborted) = oneshot::channel();
    (Lines::new(rx, aborted), tx, abort)
}

/// Polls once: the chunk ready now, if any.
fn poll(lines: &mut Lines) -> Option<Result<Bytes, std::io::Error>> {
    lines.next().now_or_never().flatten()
}

#[test]
fn each_poll_joins_the_queued_lines_up_to_the_bound() {
    let small = |fill| line(fill, 300);
    let half = |fill| line(fill, JOIN_BYTES / 2);
    // (name, lines queued, the lengths of the chunks the polls yield)
    let cases: Vec<(&str, Vec<Bytes>, Vec<usize>)> = vec![
        ("one line goes as it is", vec![small(b'a')], vec![300]),
        ("every queued line in one chunk", (0..16).map(|i| small(b'a' + i)).collect(), vec![16 * 300]),
        ("two halves fill one chunk exactly", vec![half(b'a'), half(b'b')], vec![JOIN_BYTES]),
        (
            "a line that would pass the bound starts the next chunk",
            vec![half(b'a'), small(b'b'), half(b'c'), small(b'd')],
            vec![JOIN_BYTES / 2 + 300, JOIN_BYTES / 2 + 300],
        ),
        (
            "a line larger than the bound goes alone, with what comes before and after in their own chunks",
            vec![small(b'a'), line(b'b', 3 * JOIN_BYTES), small(b'c'), small(b'd')],
            vec![300, 3 * JOIN_BYTES, 600],
        ),
    ];
    for (name, queued, expected) in cases {
        let (mut lines, _tx, _abort) = body(&queued);
        let mut chunks = Vec::new();
        while let Some(chunk) = poll(&mut lines) {
            chunks.push(chunk.expect("no error"));
        }
        let lengths: Vec<usize> = chunks.iter().map(Bytes::len).collect();
        assert_eq!(lengths, expected, "{name}");
        assert_eq!(chunks.concat(), queued.concat(), "{name}: the same bytes in the same order");
    }
}

#[test]
fn a_line_at_least_the_bound_is_not_copied() {
    let big = line(b'x', JOIN_BYTES);
    let (mut lines, _tx, _abort) = body(&[big.clone(), line(b'y', 10)]);
    let chunk = poll(&mut lines).expect("a chunk").expect("no error");
    assert_eq!(chunk.as_ptr(), big.as_ptr(), "the line's own bytes, not a copy");
}

#[test]
fn the_abort_ends_the_stream_before_the_queued_lines() {
    let (mut lines, tx, abort) = body(&[line(b'a', 100), line(b'b', 100)]);
    abort.send(()).expect("the body listens");
    let err = poll(&mut lines).expect("an answer").expect_err("the abort");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    drop(tx);
}

#[test]
fn the_stream_ends_when_the_task_is_done_and_its_lines_are_sent() {
    let (mut lines, tx, _abort) = body(&[line(b'a', 100)]);
    drop(tx);
    assert_eq!(poll(&mut lines).expect("a chunk").expect("no error").len(), 100);
    assert!(lines.next().now_or_never().expect("ready").is_none(), "the end of the stream");
}
