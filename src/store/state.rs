//! The in-memory picture of the database: every object by kind and name, the retained
//! event log, and the registered watchers. Only the commit thread changes it, and only
//! after the batch it reflects is durable.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use super::error::{Error, Result};
use super::mutation::Change;
use super::watch::{EventType, Group, History, StoreEvent, Watch, Watcher, Woken};
use super::Obj;

/// One retained event and when it was committed (Unix milliseconds), for retention.
pub(super) struct LogEntry {
    pub event: StoreEvent,
    pub time_ms: i64,
    /// Whether this revision is still its object's current one: its stored row outlives
    /// retention then, as the object's (see `tables::REVISIONS`).
    pub current: bool,
}

#[derive(Default)]
pub(super) struct State {
    /// Revision of the last committed mutation.
    pub revision: u64,
    /// Events at or below this revision are gone.
    pub compacted: u64,
    /// kind → name → object. Names are shared, so a page of a list copies none.
    pub objects: HashMap<String, BTreeMap<Arc<str>, Obj>>,
    /// Exactly the events `compacted + 1 ..= revision`, in order.
    pub log: VecDeque<LogEntry>,
    /// The sum of the retained events' `cost`, for retention by bytes.
    pub log_bytes: usize,
    /// kind → live watchers of that kind.
    watchers: HashMap<String, Vec<Watcher>>,
    /// The wakes owed to watchers handed events since [`State::take_woken`].
    woken: Woken,
    /// One shared name per kind, so events do not each allocate one.
    kinds: HashMap<String, Arc<str>>,
    /// Set when the commit thread has stopped: no more writes or watches.
    pub closed: bool,
}

/// One page of a list: see [`State::page`] and [`State::select`].
#[derive(Debug, Default)]
pub struct Page {
    /// The revision the page is current at.
    pub revision: u64,
    pub items: Vec<Obj>,
    /// The name of the last item, if any.
    pub last: Option<Arc<str>>,
    /// How many objects come after the page, when it counted them: a page of every
    /// object does; a selected one stops at the first match after its last item, so it
    /// does not know (as kube-apiserver leaves `remainingItemCount` out of such pages).
    pub remaining: Option<usize>,
    /// Whether an object comes after the page (for a selected page, one that matches).
    pub more: bool,
}

impl State {
    /// An empty cache at the given counters (filled by `disk::load`).
    pub fn new(revision: u64, compacted: u64) -> State {
        State { revision, compacted, ..State::default() }
    }

    pub fn get(&self, kind: &str, name: &str) -> Option<Obj> {
        self.objects.get(kind)?.get(name).cloned()
    }

    pub fn list(&self, kind: &str) -> Vec<Obj> {
        self.objects.get(kind).map(|objects| objects.values().cloned().collect()).unwrap_or_default()
    }

    /// The objects of `kind` named after `after` (all of them for `None`), by name.
    pub fn list_after(&self, kind: &str, after: Option<&str>) -> Vec<(Arc<str>, Obj)> {
        use std::ops::Bound;
        let Some(objects) = self.objects.get(kind) else { return Vec::new() };
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        objects.range::<str, _>((from, Bound::Unbounded)).map(|(n, o)| (n.clone(), o.clone())).collect()
    }

    /// Up to `limit` objects of `kind` named after `after` (every one for `None`), the
    /// name of the last one taken, and how many more there are: one page of a list, with
    /// no copy of a name and no clone of an object past the page.
    pub fn page(&self, kind: &str, after: Option<&str>, limit: Option<usize>) -> Page {
        use std::ops::Bound;
        let mut page = Page { revision: self.revision, remaining: Some(0), ..Page::default() };
        let Some(objects) = self.objects.get(kind) else { return page };
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut range = objects.range::<str, _>((from, Bound::Unbounded));
        let limit = limit.unwrap_or(usize::MAX);
        page.items.reserve(limit.min(objects.len()));
        let mut last = None;
        for (name, object) in range.by_ref().take(limit) {
            page.items.push(object.clone());
            last = Some(name);
        }
        page.last = last.cloned();
        let remaining = range.count();
        (page.remaining, page.more) = (Some(remaining), remaining > 0);
        page
    }

    /// Adds to `page` the objects of `kind` named after `after` that `keep` selects, by
    /// name, until it holds `limit` and one more matched (then `page.more` is set),
    /// looking at no more than `budget` objects. Returns the name of the last object
    /// looked at when the budget ran out first: where the page goes on.
    pub fn select(
        &self,
        kind: &str,
        after: Option<&str>,
        limit: usize,
        budget: usize,
        keep: &mut impl FnMut(&str, &Obj) -> bool,
        page: &mut Page,
    ) -> Option<Arc<str>> {
        use std::ops::Bound;
        let objects = self.objects.get(kind)?;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut looked_at: Option<&Arc<str>> = None;
        for (looked, (name, object)) in objects.range::<str, _>((from, Bound::Unbounded)).enumerate() {
            if looked == budget.max(1) {
                return looked_at.cloned();
            }
            looked_at = Some(name);
            if keep(name, object) {
                if page.items.len() >= limit {
                    page.more = true;
                    return None;
                }
                page.items.push(object.clone());
                page.last = Some(name.clone());
            }
        }
        None
    }

    pub fn object_count(&self) -> usize {
        self.objects.values().map(BTreeMap::len).sum()
    }

    /// The shared name of `kind`.
    pub fn intern(&mut self, kind: &str) -> Arc<str> {
        if let Some(name) = self.kinds.get(kind) {
            return name.clone();
        }
        let name: Arc<str> = Arc::from(kind);
        self.kinds.insert(kind.to_owned(), name.clone());
        name
    }

    /// Puts a loaded object in place (opening the store).
    pub fn load_object(&mut self, kind: &str, name: &str, object: Obj) {
        self.objects.entry(kind.to_owned()).or_default().insert(Arc::from(name), object);
    }

    /// Removes a loaded object (opening the store: a deletion in the log).
    pub fn remove_object(&mut self, kind: &str, name: &str) {
        if let Some(objects) = self.objects.get_mut(kind) {
            objects.remove(name);
        }
    }

    /// Applies one durable change: the object, the log, and every watcher of its kind.
    /// Never blocks: a watcher whose buffer is full is dropped as overflowed. The
    /// watchers handed the event are woken once the caller gives [`State::take_woken`]'s
    /// wakes.
    pub fn apply(&mut self, change: &Change, time_ms: i64) {
        let objects = self.objects.entry(change.kind.to_owned()).or_default();
        let previous = if change.type_ == EventType::Deleted {
            objects.remove(change.name.as_str())
        } else {
            objects.insert(Arc::from(change.name.as_str()), change.object.clone())
        };
        let event = StoreEvent {
            revision: change.revision,
            kind: self.intern(change.kind),
            type_: change.type_,
            object: change.object.clone(),
            previous,
            encoded: Default::default(),
            cost: change.cost,
        };
        if let Some(watchers) = self.watchers.get_mut(change.kind) {
            let woken = &mut self.woken;
            watchers.retain(|w| w.offer(event.clone(), woken));
        }
        if let Some(replaced) = change.supersedes.and_then(|r| self.log_index(r)) {
            self.log[replaced].current = false;
        }
        self.revision = change.revision;
        let current = change.type_ != EventType::Deleted;
        self.push_log(LogEntry { event, time_ms, current });
    }

    /// The wakes owed to the watchers handed events since the last call: to be given
    /// once the lock on the state is released (dropped, they are given at once).
    pub fn take_woken(&mut self) -> Woken {
        std::mem::take(&mut self.woken)
    }

    /// Where revision `revision` sits in the log, if it is retained.
    pub fn log_index(&self, revision: u64) -> Option<usize> {
        let index = self.log.partition_point(|e| e.event.revision < revision);
        (self.log.get(index)?.event.revision == revision).then_some(index)
    }

    /// Appends a retained event.
    pub fn push_log(&mut self, entry: LogEntry) {
        self.log_bytes += entry.event.cost;
        self.log.push_back(entry);
    }

    /// Drops retained events up to and including `revision`.
    pub fn compact(&mut self, revision: u64) {
        while self.log.front().is_some_and(|e| e.event.revision <= revision) {
            if let Some(entry) = self.log.pop_front() {
                self.log_bytes -= entry.event.cost;
            }
        }
        self.compacted = self.compacted.max(revision);
    }

    /// Up to `max` retained events of `kind` after revision `cursor`, up to `end`, and
    /// the revision read up to; `Expired` once retention dropped what comes after
    /// `cursor`.
    pub fn retained(&self, kind: &str, cursor: u64, end: u64, max: usize) -> Result<(Vec<StoreEvent>, u64)> {
        if cursor < self.compacted {
            return Err(Error::Expired { requested: cursor, oldest: self.compacted });
        }
        // The log is in revision order: on the embedded store one event a revision,
        // without gaps; on etcd a transaction's events share one, and revisions skip.
        let start = self.log.partition_point(|e| e.event.revision <= cursor);
        let mut events = Vec::new();
        let mut read_to = end;
        let mut full_at = None;
        for entry in self.log.range(start..) {
            let revision = entry.event.revision;
            if revision > end || full_at.is_some_and(|full| revision > full) {
                break;
            }
            if &*entry.event.kind == kind {
                events.push(entry.event.clone());
                if events.len() >= max && full_at.is_none() {
                    // The rest of this revision's events come along: the next read
                    // starts after it.
                    full_at = Some(revision);
                    read_to = revision;
                }
            }
        }
        Ok((events, read_to))
    }

    /// Registers a watch of `kind` after `after`. Its retained events are the log's
    /// `after+1 ..= revision` (read as it goes); live ones come after, so nothing falls
    /// between the two. `limits` are the live buffer's events and bytes.
    pub fn watch(
        &mut self,
        history: Arc<dyn History>,
        kind: &str,
        after: u64,
        limits: (usize, usize),
        group: Option<Arc<Group>>,
    ) -> Result<Watch> {
        if self.closed {
            return Err(Error::Closed);
        }
        if after < self.compacted {
            return Err(Error::Expired { requested: after, oldest: self.compacted });
        }
        let kind_name = self.intern(kind);
        let order = group.as_ref().map_or(0, |g| g.id());
        let (watch, watcher) = Watch::new(history, kind_name, after, self.revision.max(after), limits, group);
        let watchers = self.watchers.entry(kind.to_owned()).or_default();
        watchers.retain(|w| !w.is_closed());
        // After the group's last watcher: a group's watchers stay together, in the order
        // they came (offers keep that order).
        let at = watchers.partition_point(|w| w.group <= order);
        watchers.insert(at, watcher);
        Ok(watch)
    }

    /// Takes `fresh` (a new load) in place of everything: objects, counters and log.
    /// Every watch ends as overflowed, since events between the two are unknown.
    pub fn replace(&mut self, fresh: State) {
        self.objects = fresh.objects;
        self.revision = fresh.revision;
        self.compacted = fresh.compacted;
        self.log = fresh.log;
        self.log_bytes = fresh.log_bytes;
        for watcher in self.watchers.drain().flat_map(|(_, watchers)| watchers) {
            watcher.overflow();
        }
    }

    /// Ends every watch (the store is shutting down).
    pub fn close(&mut self) {
        self.closed = true;
        self.watchers.clear();
    }
}
