//! Revisions packed into the rows of the `CHUNKS` table: consecutive stored revisions,
//! each with its revision and length, in one value of at most about a page.
//!
//! ```text
//! per revision:  revision u64 LE | n u32 LE | n bytes (a row of record.rs)
//! ```
//!
//! A chunk's key is its first revision, and every revision in it is below the next
//! chunk's key, so the chunks in key order are the stored revisions in order.
//!
//! Why not one row per revision: redb splits a full B-tree leaf in half, and the keys
//! only grow, so the left half of every split is never written again: one ~750-byte row
//! per revision left leaves about half full, and with the pages copy-on-write freed by
//! each checkpoint, a store of 1,000,000 Agents took 2,281 MiB for 724 MiB of JSON
//! (issue 34). A chunk of about a page fills a leaf by itself.

use std::ops::Bound;

use redb::{ReadableTable, Table};

/// Most bytes of records in one chunk: what fits, with redb's leaf head (4 bytes), one
/// value end (4) and the key (8), in one 4 KiB page. A revision larger than this is a
/// chunk by itself.
pub(super) const CHUNK_BYTES: usize = 4096 - 16;

/// The bytes before each record: its revision and length.
const RECORD_HEAD: usize = 12;

/// Appends revision `revision`'s row to `chunk`.
pub(super) fn push(chunk: &mut Vec<u8>, revision: u64, row: &[u8]) {
    let len = u32::try_from(row.len()).expect("a stored revision is smaller than 4 GiB");
    chunk.reserve(RECORD_HEAD + row.len());
    chunk.extend_from_slice(&revision.to_le_bytes());
    chunk.extend_from_slice(&len.to_le_bytes());
    chunk.extend_from_slice(row);
}

/// The bytes `row` takes in a chunk.
pub(super) fn cost(row: &[u8]) -> usize {
    RECORD_HEAD + row.len()
}

/// The revisions of one chunk, in order: each revision and its row; or why the chunk is
/// damaged (empty, a length past its end, revisions not ascending, the first not its key).
pub(super) fn records(key: u64, chunk: &[u8]) -> Result<Vec<(u64, &[u8])>, String> {
    let mut records: Vec<(u64, &[u8])> = Vec::with_capacity(8);
    let mut at = 0usize;
    while at < chunk.len() {
        let Some(head) = chunk.get(at..at + RECORD_HEAD) else {
            return Err(format!("{} bytes at the end of the chunk at {key}", chunk.len() - at));
        };
        let revision = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(head[8..].try_into().expect("4 bytes")) as usize;
        let start = at + RECORD_HEAD;
        let Some(row) = chunk.get(start..start.saturating_add(len)) else {
            return Err(format!("revision {revision} ({len} bytes) runs past its chunk"));
        };
        match records.last() {
            None if revision != key => {
                return Err(format!("the chunk at {key} starts with revision {revision}"))
            }
            Some(&(previous, _)) if revision <= previous => {
                return Err(format!("revision {revision} follows {previous} in its chunk"))
            }
            _ => {}
        }
        records.push((revision, row));
        at = start + len;
    }
    if records.is_empty() {
        return Err(format!("the chunk at {key} is empty"));
    }
    Ok(records)
}

/// The chunk holding `revision`, if any: its key and bytes.
fn holding(
    table: &Table<'_, u64, &[u8]>,
    revision: u64,
) -> Result<Option<(u64, Vec<u8>)>, redb::StorageError> {
    let mut before = table.range::<u64>((Bound::Unbounded, Bound::Included(revision)))?;
    match before.next_back() {
        Some(found) => {
            let (key, chunk) = found?;
            Ok(Some((key.value(), chunk.value().to_vec())))
        }
        None => Ok(None),
    }
}

/// Writes revisions to the `CHUNKS` table: appended to the last chunk while it has
/// room, else a new chunk; removed from the chunk holding them. One per transaction.
pub(super) struct Chunks<'t, 'txn> {
    table: &'t mut Table<'txn, u64, &'static [u8]>,
    /// The last chunk, read or begun but not yet written back: its key and bytes.
    tail: Option<(u64, Vec<u8>)>,
}

impl<'t, 'txn> Chunks<'t, 'txn> {
    pub(super) fn new(table: &'t mut Table<'txn, u64, &'static [u8]>) -> Chunks<'t, 'txn> {
        Chunks { table, tail: None }
    }

    /// Stores revision `revision`'s row; revisions come in ascending order, above every
    /// stored one.
    pub(super) fn append(&mut self, revision: u64, row: &[u8]) -> Result<(), redb::StorageError> {
        if self.tail.is_none() {
            self.tail = self.table.last()?.map(|(key, chunk)| (key.value(), chunk.value().to_vec()));
        }
        match &mut self.tail {
            Some((_, chunk)) if chunk.len() + cost(row) <= CHUNK_BYTES => push(chunk, revision, row),
            _ => {
                self.flush()?;
                let mut chunk = Vec::with_capacity(CHUNK_BYTES.max(cost(row)));
                push(&mut chunk, revision, row);
                self.tail = Some((revision, chunk));
            }
        }
        Ok(())
    }

    /// Removes revision `revision` from its chunk (nothing when it is not stored); a
    /// chunk left empty goes, and one whose first revision went moves to its new first.
    pub(super) fn remove(&mut self, revision: u64) -> Result<(), redb::StorageError> {
        self.flush()?;
        let Some((key, chunk)) = holding(self.table, revision)? else { return Ok(()) };
        // A damaged chunk is left as it is: the next load names it.
        let Ok(records) = records(key, &chunk) else { return Ok(()) };
        let mut kept = Vec::with_capacity(chunk.len());
        let mut first = None;
        let mut found = false;
        for (at, row) in records {
            if at == revision {
                found = true;
                continue;
            }
            first.get_or_insert(at);
            push(&mut kept, at, row);
        }
        if !found {
            return Ok(());
        }
        match first {
            Some(first) if first == key => {
                self.table.insert(key, kept.as_slice())?;
            }
            Some(first) => {
                self.table.remove(key)?;
                self.table.insert(first, kept.as_slice())?;
            }
            None => {
                self.table.remove(key)?;
            }
        }
        Ok(())
    }

    /// Writes the last chunk back, if one is pending.
    pub(super) fn flush(&mut self) -> Result<(), redb::StorageError> {
        if let Some((key, chunk)) = self.tail.take() {
            self.table.insert(key, chunk.as_slice())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use redb::{Database, ReadableTableMetadata};

    use super::*;
    use crate::store::tables::CHUNKS;

    fn chunk(rows: &[(u64, &[u8])]) -> Vec<u8> {
        let mut chunk = Vec::new();
        for (revision, row) in rows {
            push(&mut chunk, *revision, row);
        }
        chunk
    }

    #[test]
    fn a_chunk_reads_back_as_written() {
        let bytes = chunk(&[(7, b"seven"), (9, b""), (12, b"twelve")]);
        let read = records(7, &bytes).unwrap();
        assert_eq!(read, [(7, &b"seven"[..]), (9, &b""[..]), (12, &b"twelve"[..])]);
        assert_eq!(cost(b"seven"), RECORD_HEAD + 5);
    }

    #[test]
    fn a_damaged_chunk_is_an_error_not_a_panic() {
        let bytes = chunk(&[(7, b"seven"), (9, b"nine")]);
        let first = cost(b"seven");
        for cut in (1..bytes.len()).filter(|&cut| cut != first) {
            assert!(records(7, &bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(
            records(7, &bytes[..first]).unwrap().len(),
            1,
            "a cut between revisions is a shorter chunk"
        );
        assert_eq!(records(7, &[]).unwrap_err(), "the chunk at 7 is empty");
        assert_eq!(records(6, &bytes).unwrap_err(), "the chunk at 6 starts with revision 7");
        let backwards = chunk(&[(7, b"seven"), (7, b"again")]);
        assert_eq!(records(7, &backwards).unwrap_err(), "revision 7 follows 7 in its chunk");
        let mut huge = bytes.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(records(7, &huge).is_err());
    }

    /// What the table holds, as revision → row, checking every chunk on the way.
    fn stored(db: &Database) -> BTreeMap<u64, Vec<u8>> {
        let read = db.begin_read().unwrap();
        let table = read.open_table(CHUNKS).unwrap();
        let mut stored = BTreeMap::new();
        let mut last = None;
        for entry in table.iter().unwrap() {
            let (key, chunk) = entry.unwrap();
            assert!(last < Some(key.value()), "chunks overlap");
            for (revision, row) in records(key.value(), chunk.value()).unwrap() {
                assert!(
                    chunk.value().len() <= CHUNK_BYTES
                        || records(key.value(), chunk.value()).unwrap().len() == 1
                );
                stored.insert(revision, row.to_vec());
                last = Some(revision);
            }
        }
        stored
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Store the next revision with a row of this many bytes.
        Append(usize),
        /// Remove the stored revision at this position (modulo how many there are).
        Remove(usize),
        /// Commit the transaction and begin another.
        Commit,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0usize..2000).prop_map(Op::Append),
            1 => (5000usize..9000).prop_map(Op::Append),
            3 => any::<usize>().prop_map(Op::Remove),
            1 => Just(Op::Commit),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Appends and removals, over several transactions, leave exactly what a map of
        /// revision → row would hold, in chunks within their bound and in order.
        #[test]
        fn chunks_hold_what_a_map_holds(ops in proptest::collection::vec(op(), 1..120)) {
            let dir = tempfile::tempdir().unwrap();
            let db = Database::create(dir.path().join("chunks.redb")).unwrap();
            let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
            let mut next = 1u64;
            let mut ops = ops.into_iter().peekable();
            while ops.peek().is_some() {
                let txn = db.begin_write().unwrap();
                {
                    let mut table = txn.open_table(CHUNKS).unwrap();
                    let mut chunks = Chunks::new(&mut table);
                    for op in ops.by_ref() {
                        match op {
                            Op::Append(len) => {
                                let row = vec![(next % 251) as u8; len];
                                chunks.append(next, &row).unwrap();
                                model.insert(next, row);
                                next += 1 + (len as u64 % 3);
                            }
                            Op::Remove(at) if !model.is_empty() => {
                                let revision = *model.keys().nth(at % model.len()).unwrap();
                                chunks.remove(revision).unwrap();
                                model.remove(&revision);
                            }
                            Op::Remove(_) => chunks.remove(next + 5).unwrap(),
                            Op::Commit => break,
                        }
                    }
                    chunks.flush().unwrap();
                }
                txn.commit().unwrap();
                prop_assert_eq!(&stored(&db), &model);
            }
            let read = db.begin_read().unwrap();
            let table = read.open_table(CHUNKS).unwrap();
            prop_assert!(table.len().unwrap() as usize <= model.len());
        }
    }
}
