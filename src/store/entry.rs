//! One batch as the write-ahead log holds it: everything the batch does to the
//! `REVISIONS` table and the counters, so that the checkpointer (and the replay when the
//! store opens) can apply it to redb without the cache.
//!
//! ```text
//! first revision   u64 LE   the batch's revisions are first ..= last
//! last revision    u64 LE
//! compacted        u64 LE   the compacted revision after the batch
//! rows             u32 LE   then per row: revision u64 LE, n u32 LE, n bytes (record.rs)
//! garbage          u32 LE   then per revision it removes: u64 LE
//! ```
//!
//! A batch whose every change retention drops at once has no rows; one of all-new
//! objects has no garbage. The decoder checks every length before it hands out a slice,
//! so a damaged entry is an error, never a panic or a read past its end.

use super::mutation::Change;
use super::record::Record;

/// Everything one batch writes.
pub(super) struct BatchWrite<'a> {
    /// The successful changes of the batch, in revision order.
    pub changes: &'a [Change],
    /// Whether each change's revision is stored: all but those retention drops at once
    /// that are no object's current one at the end of the batch.
    pub stored: &'a [bool],
    /// Stored revisions this batch makes garbage: retention passed them and they are no
    /// object's current one (any more). Ascending.
    pub garbage: &'a [u64],
    /// Commit time of the batch, Unix milliseconds.
    pub time_ms: i64,
    /// The compacted revision after this batch.
    pub compacted: u64,
}

/// The fixed part before the rows: first, last, compacted, row count.
const FIXED: usize = 8 + 8 + 8 + 4;

/// Appends the entry for `batch` to `out` (after whatever `out` holds: the log's record
/// head). `batch` has at least one change.
pub(super) fn encode_into(batch: &BatchWrite<'_>, out: &mut Vec<u8>) {
    let (Some(first), Some(last)) = (batch.changes.first(), batch.changes.last()) else {
        unreachable!("a batch written to the log has changes")
    };
    let rows = batch.stored.iter().filter(|&&stored| stored).count();
    let bytes: usize = batch
        .changes
        .iter()
        .zip(batch.stored)
        .filter(|(_, &stored)| stored)
        .map(|(c, _)| 12 + super::record::HEAD + c.kind.len() + c.object.len())
        .sum();
    out.reserve(FIXED + bytes + 4 + 8 * batch.garbage.len());
    out.extend_from_slice(&first.revision.to_le_bytes());
    out.extend_from_slice(&last.revision.to_le_bytes());
    out.extend_from_slice(&batch.compacted.to_le_bytes());
    out.extend_from_slice(&count(rows).to_le_bytes());
    for (change, &stored) in batch.changes.iter().zip(batch.stored) {
        if !stored {
            continue;
        }
        let record = Record {
            type_: change.type_,
            time_ms: batch.time_ms,
            kind: change.kind,
            object: change.object.json(),
        };
        out.extend_from_slice(&change.revision.to_le_bytes());
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        record.encode_into(out);
        let len = count(out.len() - at - 4);
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
    out.extend_from_slice(&count(batch.garbage.len()).to_le_bytes());
    for revision in batch.garbage {
        out.extend_from_slice(&revision.to_le_bytes());
    }
}

/// A count or length as the entry stores it. The log's records are far below 4 GiB (a
/// record must fit in one log file), so this never truncates.
fn count(n: usize) -> u32 {
    u32::try_from(n).expect("a log entry is smaller than 4 GiB")
}

/// One decoded entry, borrowing the log's bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry<'a> {
    /// The batch's first revision.
    pub first: u64,
    /// The batch's last revision: the store's revision after it.
    pub last: u64,
    /// The compacted revision after the batch.
    pub compacted: u64,
    rows: u32,
    /// The rows, then the garbage count and revisions.
    body: &'a [u8],
    /// Where the garbage count starts in `body`.
    garbage_at: usize,
}

impl<'a> Entry<'a> {
    /// Reads an entry, checking its whole shape; the error says what is wrong.
    pub fn decode(bytes: &'a [u8]) -> Result<Entry<'a>, String> {
        let Some((fixed, body)) = bytes.split_first_chunk::<FIXED>() else {
            return Err(format!("{} bytes is too short for a log entry", bytes.len()));
        };
        let u64_at = |i: usize| u64::from_le_bytes(fixed[i..i + 8].try_into().expect("8 bytes"));
        let (first, last, compacted) = (u64_at(0), u64_at(8), u64_at(16));
        let rows = u32::from_le_bytes(fixed[24..28].try_into().expect("4 bytes"));
        if first == 0 || last < first {
            return Err(format!("revisions {first}..={last} are not a batch"));
        }
        let mut at = 0usize;
        for i in 0..rows {
            let Some(head) = body.get(at..at + 12) else {
                return Err(format!("row {i} of {rows} runs past the entry"));
            };
            let revision = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(head[8..].try_into().expect("4 bytes")) as usize;
            if !(first..=last).contains(&revision) {
                return Err(format!("row {i} is at revision {revision}, outside {first}..={last}"));
            }
            let Some(row) = body.get(at + 12..(at + 12).saturating_add(len)) else {
                return Err(format!("row {i} ({len} bytes) runs past the entry"));
            };
            Record::decode(row).map_err(|e| format!("row {i} (revision {revision}): {e}"))?;
            at += 12 + len;
        }
        let garbage_at = at;
        let Some(head) = body.get(at..at + 4) else {
            return Err("the garbage count is missing".into());
        };
        let garbage = u32::from_le_bytes(head.try_into().expect("4 bytes")) as usize;
        if body.len() - at - 4 != garbage.saturating_mul(8) {
            return Err(format!(
                "{} bytes after the rows for {garbage} garbage revisions",
                body.len() - at - 4
            ));
        }
        Ok(Entry { first, last, compacted, rows, body, garbage_at })
    }

    /// The stored rows: revision and row bytes (checked by `decode` to be records).
    pub fn rows(&self) -> impl Iterator<Item = (u64, &'a [u8])> + 'a {
        let body = self.body;
        let mut at = 0usize;
        (0..self.rows).map(move |_| {
            let revision = u64::from_le_bytes(body[at..at + 8].try_into().expect("checked by decode"));
            let len =
                u32::from_le_bytes(body[at + 8..at + 12].try_into().expect("checked by decode")) as usize;
            let row = &body[at + 12..at + 12 + len];
            at += 12 + len;
            (revision, row)
        })
    }

    /// The stored revisions the batch removes, ascending.
    pub fn garbage(&self) -> impl Iterator<Item = u64> + 'a {
        self.body[self.garbage_at + 4..]
            .chunks_exact(8)
            .map(|r| u64::from_le_bytes(r.try_into().expect("chunks of 8")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mutation::Change;
    use crate::store::watch::EventType;
    use crate::store::Obj;

    fn change(revision: u64, type_: EventType, json: &str) -> Change {
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        Change {
            kind: "agents",
            name: "a".into(),
            revision,
            type_,
            object: Obj::encode(&value, revision),
            cost: 1,
            supersedes: None,
        }
    }

    fn encoded(changes: &[Change], stored: &[bool], garbage: &[u64]) -> Vec<u8> {
        let batch = BatchWrite { changes, stored, garbage, time_ms: 7, compacted: 3 };
        let mut out = Vec::new();
        encode_into(&batch, &mut out);
        out
    }

    #[test]
    fn an_entry_reads_back_as_written() {
        let changes = [
            change(10, EventType::Added, r#"{"metadata":{"name":"a"}}"#),
            change(11, EventType::Modified, r#"{"metadata":{"name":"a"},"x":1}"#),
            change(12, EventType::Deleted, r#"{"metadata":{"name":"a"},"x":1}"#),
        ];
        let bytes = encoded(&changes, &[true, false, true], &[2, 5]);
        let entry = Entry::decode(&bytes).unwrap();
        assert_eq!((entry.first, entry.last, entry.compacted), (10, 12, 3));
        let rows: Vec<_> = entry.rows().map(|(r, row)| (r, Record::decode(row).unwrap())).collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].0, 10);
        assert_eq!(rows[0].1.object, changes[0].object.json());
        assert_eq!((rows[1].0, rows[1].1.type_, rows[1].1.time_ms), (12, EventType::Deleted, 7));
        assert_eq!(entry.garbage().collect::<Vec<_>>(), [2, 5]);

        let none = encoded(&changes[..1], &[false], &[]);
        let entry = Entry::decode(&none).unwrap();
        assert_eq!((entry.rows().count(), entry.garbage().count()), (0, 0));
    }

    #[test]
    fn a_damaged_entry_is_an_error_not_a_panic() {
        let changes = [change(4, EventType::Added, r#"{"metadata":{"name":"a"}}"#)];
        let bytes = encoded(&changes, &[true], &[1]);
        for cut in 0..bytes.len() {
            assert!(Entry::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Entry::decode(&longer).is_err());
        let mut outside = bytes.clone();
        outside[FIXED..FIXED + 8].copy_from_slice(&9u64.to_le_bytes());
        assert!(Entry::decode(&outside).unwrap_err().contains("outside 4..=4"));
        let mut huge = bytes.clone();
        huge[FIXED + 8..FIXED + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Entry::decode(&huge).is_err());
        let mut backwards = bytes;
        backwards[8..16].copy_from_slice(&1u64.to_le_bytes());
        assert!(Entry::decode(&backwards).is_err());
    }
}
