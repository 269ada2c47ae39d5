//! A list's JSON body, streamed in chunks of about [`CHUNK_BYTES`] from the objects'
//! committed JSON: the first bytes leave while the rest is still being put together, and
//! a list of 100,000 objects costs the daemon one chunk of memory in flight, not a copy
//! of all of them.

use axum::body::Body;
use bytes::Bytes;

/// About how much one chunk holds: it ends before the object that would take it past
/// this (an object larger than this is a chunk of its own).
pub const CHUNK_BYTES: usize = 64 << 10;

/// The body `head` + `[` + the items' JSON, comma-separated + `]}`. `head` is the
/// list's opening up to and including `"items":`; `items` are the objects' JSON as the
/// cache holds it (an `Obj` is its JSON).
pub fn body<T: AsRef<[u8]> + Send + 'static>(head: Vec<u8>, items: Vec<T>) -> Body {
    let chunks = Chunks { head: Some(head), items: items.into_iter(), first: true, done: false };
    Body::from_stream(futures_util::stream::iter(chunks.map(Ok::<_, std::convert::Infallible>)))
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
        let names: Vec<&str> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), 2_001);
        assert_eq!(names[1_000], "big");
        assert_eq!((names[0], names[1_001], names[2_000]), ("a0000", "a1000", "a1999"));
    }
}
