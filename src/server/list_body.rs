//! A list's JSON body, streamed in chunks of about [`CHUNK_BYTES`] from the objects'
//! committed JSON: the first bytes leave while the rest is still being put together, and
//! a list of 100,000 objects costs the daemon one chunk of memory in flight, not a copy
//! of all of them. Its length is known from the start, so it still has a
//! `Content-Length` (and is no stream to cut when a token is revoked).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// About how much one chunk holds: it ends before the object that would take it past
/// this (an object larger than this is a chunk of its own).
pub const CHUNK_BYTES: usize = 64 << 10;

/// The body `head` + `[` + the items' JSON, comma-separated + `]}`. `head` is the
/// list's opening up to and including `"items":`; `items` are the objects' JSON as the
/// cache holds it (an `Obj` is its JSON).
pub fn body<T: AsRef<[u8]> + Send + Unpin + 'static>(head: Vec<u8>, items: Vec<T>) -> Body {
    let json: usize = items.iter().map(|item| item.as_ref().len()).sum();
    // `[`, a comma before each item but the first, `]}`.
    let length = head.len() + items.len().max(1) + json + 2;
    let chunks = Chunks { head: Some(head), items: items.into_iter(), first: true, done: false };
    Body::new(ListBody { chunks, remaining: length as u64 })
}

/// The chunks as an HTTP body of a known length.
struct ListBody<T> {
    chunks: Chunks<T>,
    /// Bytes not yet sent.
    remaining: u64,
}

impl<T: AsRef<[u8]> + Unpin> http_body::Body for ListBody<T> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        Poll::Ready(this.chunks.next().map(|chunk| {
            this.remaining = this.remaining.saturating_sub(chunk.len() as u64);
            Ok(Frame::data(chunk))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// The chunks of one list body, in order.
struct Chunks<T> {
    head: Option<Vec<u8>>,
    items: std::vec::IntoIter<T>,
    /// No item has been written yet: the next one opens the array.
    first: bool,
    done: bool,
}

impl<T: AsRef<[u8]>> Iterator for Chunks<T> {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let mut chunk = self.head.take().unwrap_or_else(|| Vec::with_capacity(CHUNK_BYTES));
        while let Some(json) = self.items.as_slice().first().map(AsRef::as_ref) {
            if !self.first && !chunk.is_empty() && chunk.len() + 1 + json.len() > CHUNK_BYTES {
                return Some(Bytes::from(chunk));
            }
            chunk.push(if std::mem::replace(&mut self.first, false) { b'[' } else { b',' });
            chunk.extend_from_slice(json);
            self.items.next();
        }
        if self.first {
            chunk.push(b'[');
        }
        chunk.extend_from_slice(b"]}");
        self.done = true;
        Some(Bytes::from(chunk))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str, filler: usize) -> Bytes {
        let value = serde_json::json!({"metadata": {"name": name}, "x": "y".repeat(filler)});
        Bytes::from(serde_json::to_vec(&value).unwrap())
    }

    fn chunks(items: Vec<Bytes>) -> Vec<Bytes> {
        Chunks { head: Some(b"{\"items\":".to_vec()), items: items.into_iter(), first: true, done: false }
            .collect()
    }

    fn joined(chunks: &[Bytes]) -> serde_json::Value {
        serde_json::from_slice(&chunks.concat()).expect("the chunks join into one JSON document")
    }

    /// The body's stated length is what it sends, for any number of items.
    #[tokio::test]
    async fn the_body_has_the_length_it_states() {
        for n in [0, 1, 2, 700, 2_000] {
            let items: Vec<Bytes> = (0..n).map(|i| object(&format!("a{i}"), 90)).collect();
            let body = body(b"{\"items\":".to_vec(), items);
            let stated = http_body::Body::size_hint(&body).exact().expect("a list states its length");
            let sent = axum::body::to_bytes(body, usize::MAX).await.unwrap();
            assert_eq!(stated, sent.len() as u64, "{n} items");
            let list: serde_json::Value = serde_json::from_slice(&sent).unwrap();
            assert_eq!(list["items"].as_array().unwrap().len(), n);
        }
    }

    #[test]
    fn an_empty_list_is_one_chunk() {
        let chunks = chunks(Vec::new());
        assert_eq!(chunks, vec![Bytes::from_static(b"{\"items\":[]}")]);
    }

    #[test]
    fn items_are_split_into_chunks_no_larger_than_the_limit_unless_one_object_is() {
        let small: Vec<Bytes> = (0..2_000).map(|i| object(&format!("a{i:04}"), 100)).collect();
        let big = object("big", 3 * CHUNK_BYTES);
        let mut items = small.clone();
        items.insert(1_000, big.clone());
        let chunks = chunks(items);
        assert!(chunks.len() > 4, "{} chunks", chunks.len());
        for chunk in &chunks {
            assert!(chunk.len() <= CHUNK_BYTES || chunk.len() == big.len() + 1, "{}", chunk.len());
        }
        let list = joined(&chunks);
        let names: Vec<&str> =
            list["items"].as_array().unwrap().iter().map(hive_api::meta::name_of).collect();
        assert_eq!(names.len(), 2_001);
        assert_eq!(names[1_000], "big");
        assert_eq!((names[0], names[1_001], names[2_000]), ("a0000", "a1000", "a1999"));
    }
}
