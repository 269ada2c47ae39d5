//! Loading the database file into memory when the store opens: every stored revision
//! read, checked and made an object of on one thread, and taken into the cache and the
//! event log, in revision order, on the opening thread meanwhile.
//!
//! Why two threads: at 1,000,000 Agents (issue 34) the opening thread spent about half
//! its time reading pages and parsing each object's name and labels, and most of the
//! rest in the page faults of the memory the objects move into, which the thread that
//! allocates them takes. Split so, the two halves run on two cores at once; the order
//! in which revisions reach the cache, and every check, are what they were on one thread.

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use redb::{Database, ReadableTable};

use super::chunk;
use super::error::{Error, Result};
use super::record::Record;
use super::state::{LogEntry, State};
use super::tables::CHUNKS;
use super::watch::{EventType, StoreEvent};
use super::Obj;

/// Revisions handed from the reading thread to the opening one at a time.
const BATCH: usize = 2048;
/// Batches read ahead of the opening thread, at most.
const AHEAD: usize = 8;

/// One stored revision, read and checked on its own: what it wrote to which object.
struct Loaded {
    at: u64,
    type_: EventType,
    time_ms: i64,
    kind: Arc<str>,
    name: String,
    object: Obj,
}

/// Reads everything into memory, checking that the file holds exactly the retained log
/// `compacted + 1 ..= revision` and, below it, only revisions that are still an object's
/// current one. The objects are what the revisions leave, as etcd rebuilds its key index
/// from its revisions.
pub(super) fn load(db: &Database, path: &Path, revision: u64, compacted: u64) -> Result<State> {
    let mut state = State::new(revision, compacted);
    let mut expected = compacted + 1;
    std::thread::scope(|scope| {
        let (sender, batches) = sync_channel(AHEAD);
        // When the opening thread fails first it drops `batches`, and the reader stops at
        // its next send.
        let reader = std::thread::Builder::new()
            .name("hive-store-load".into())
            .spawn_scoped(scope, || read(db, path, sender))
            .map_err(Error::Thread)?;
        let applied = apply_all(&mut state, path, &batches, &mut expected);
        drop(batches);
        let read = reader.join().map_err(|_| Error::corrupt(path, "reading the file panicked"));
        applied.and(read)
    })?;
    if expected != revision + 1 {
        return Err(Error::corrupt(
            path,
            format!("event log ends at revision {}, but the store is at {revision}", expected - 1),
        ));
    }
    Ok(state)
}

/// Takes every batch the reader sends into `state`, in order; the first error ends it.
fn apply_all(
    state: &mut State,
    path: &Path,
    batches: &Receiver<Result<Vec<Loaded>>>,
    expected: &mut u64,
) -> Result<()> {
    for batch in batches {
        for loaded in batch? {
            apply(state, path, loaded, expected)?;
        }
    }
    Ok(())
}

/// The reading thread: every chunk in key order, uncompressed, each revision decoded and
/// made an object, sent in batches; a damaged one is sent as the error it is, and ends it.
fn read(db: &Database, path: &Path, sender: SyncSender<Result<Vec<Loaded>>>) {
    let corrupt = |e: redb::Error| Error::corrupt(path, e);
    let mut kinds: HashMap<String, Arc<str>> = HashMap::new();
    let mut batch = Vec::with_capacity(BATCH);
    let mut records = Vec::new();
    let mut last = 0;
    let outcome = (|| {
        let read = db.begin_read().map_err(|e| corrupt(e.into()))?;
        let chunks = read.open_table(CHUNKS).map_err(|e| corrupt(e.into()))?;
        for chunk in chunks.iter().map_err(|e| corrupt(e.into()))? {
            let (key, chunk) = chunk.map_err(|e| corrupt(e.into()))?;
            let key = key.value();
            if key <= last {
                return Err(Error::corrupt(path, format!("the chunk at {key} overlaps revision {last}")));
            }
            chunk::open(key, chunk.value(), &mut records).map_err(|why| Error::corrupt(path, why))?;
            for (at, row) in chunk::records(key, &records).map_err(|why| Error::corrupt(path, why))? {
                last = at;
                batch.push(decode(path, at, row, &mut kinds)?);
            }
            if batch.len() >= BATCH {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                if sender.send(Ok(full)).is_err() {
                    return Ok(());
                }
            }
        }
        Ok(())
    })();
    // Whatever went wrong reaches the opening thread after every revision before it.
    if sender.send(Ok(batch)).is_ok() {
        if let Err(e) = outcome {
            let _ = sender.send(Err(e));
        }
    }
}

/// One stored revision, decoded: its record, its object, its object's name.
fn decode(path: &Path, at: u64, row: &[u8], kinds: &mut HashMap<String, Arc<str>>) -> Result<Loaded> {
    let bad = |why: String| Error::corrupt(path, format!("revision {at}: {why}"));
    let record = Record::decode(row).map_err(bad)?;
    let (object, name) = Obj::load(record.object, at).map_err(|e| bad(e.to_string()))?;
    if name.is_empty() {
        return Err(bad("the object has no name".into()));
    }
    let kind = match kinds.get(record.kind) {
        Some(kind) => kind.clone(),
        None => kinds.entry(record.kind.to_owned()).or_insert_with(|| Arc::from(record.kind)).clone(),
    };
    Ok(Loaded { at, type_: record.type_, time_ms: record.time_ms, kind, name, object })
}

/// Takes stored revision `loaded.at` into `state`: its object, and its event when it is
/// in the retained log (the next `expected` one of it); checks it is what the file may
/// hold.
fn apply(state: &mut State, path: &Path, loaded: Loaded, expected: &mut u64) -> Result<()> {
    let Loaded { at, type_, time_ms, kind, name, object } = loaded;
    let (revision, compacted) = (state.revision, state.compacted);
    let bad = |why: String| Error::corrupt(path, format!("revision {at}: {why}"));
    if at > revision {
        return Err(bad(format!("past the store's revision {revision}")));
    }
    if at > compacted {
        if at != *expected {
            return Err(Error::corrupt(path, format!("event log has revision {at}, expected {expected}")));
        }
        *expected += 1;
    } else if type_ == EventType::Deleted {
        return Err(bad(format!("a deletion below the retained log (after {compacted})")));
    }
    let previous = state.get(&kind, &name);
    if let Some(previous) = &previous {
        // A revision below the log is kept only while it is its object's current one.
        if previous.revision() <= compacted {
            return Err(Error::corrupt(
                path,
                format!(
                    "revision {} of {kind}/{name} is below the retained log (after {compacted}) but revision {at} replaced it",
                    previous.revision(),
                ),
            ));
        }
        if let Some(index) = state.log_index(previous.revision()) {
            state.log[index].current = false;
        }
    }
    match (type_, &previous) {
        (EventType::Added, Some(previous)) => {
            return Err(bad(format!("{kind}/{name} added while it is at revision {}", previous.revision())))
        }
        (EventType::Deleted, _) => state.remove_object(&kind, &name),
        _ => state.load_object(&kind, &name, object.clone()),
    }
    if at <= compacted {
        return Ok(());
    }
    let event = StoreEvent {
        revision: at,
        kind: state.intern(&kind),
        type_,
        cost: super::watch::event_cost(object.len()),
        object,
        previous: previous.filter(|_| type_ != EventType::Added),
        encoded: Default::default(),
    };
    let current = type_ != EventType::Deleted;
    state.push_log(LogEntry { event, time_ms, current });
    Ok(())
}
