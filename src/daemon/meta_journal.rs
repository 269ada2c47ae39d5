//! The meta repo's journal on etcd (`meta::Journal`), beside the objects: a head record
//! `<prefix>_meta/head` (`{"sequence": N, "commit": SHA}`) and one record per commit
//! under `<prefix>_meta/<sequence>` (20 digits, so keys sort as records do): the sha, a
//! newline, and the git bundle. A record is one transaction that writes both, guarded by
//! the head's `mod_revision` as the leader read it (two writers never both extend one
//! head: no fork) and by the leader's fence (a deposed leader records nothing). A record
//! that folds in those before it (every [`crate::meta::FOLD_EVERY`]: the whole history,
//! or the records since the last fold) deletes them in its transaction; it says which it
//! stands for after its sha (`<sha> <first record>`). Reads are quorum reads.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::meta::{Error, Journal, JournalEntry, JournalHead, Result};
use crate::store::etcd::client::{ClientError, Compare, KeyValue, Op};
use crate::store::etcd::Backend;

/// The largest bundle one record holds: etcd refuses a request over 1.5 MiB
/// (`--max-request-bytes`), and the head record and guards share the request.
pub const MAX_BUNDLE: usize = 1024 * 1024;

/// How many records one range read of [`Journal::entries`] returns at most.
const PAGE: usize = 32;

/// The head record as etcd holds it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeadRecord {
    sequence: u64,
    commit: String,
}

/// The journal of the meta repo of replicas on one etcd (see the module documentation).
pub struct EtcdJournal {
    backend: Arc<Backend>,
}

impl std::fmt::Debug for EtcdJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdJournal").field("head", &String::from_utf8_lossy(&self.head_key())).finish()
    }
}

fn failed(reason: impl Into<String>) -> Error {
    Error::Journal { reason: reason.into() }
}

fn unavailable(e: &ClientError) -> Error {
    failed(format!("etcd: {e}"))
}

impl EtcdJournal {
    /// The journal under `backend`'s key prefix.
    pub fn new(backend: Arc<Backend>) -> EtcdJournal {
        EtcdJournal { backend }
    }

    fn head_key(&self) -> Vec<u8> {
        self.backend.internal_key("meta/head")
    }

    fn entry_key(&self, sequence: u64) -> Vec<u8> {
        self.backend.internal_key(&format!("meta/{sequence:020}"))
    }

    fn decode_head(&self, kv: &KeyValue) -> Result<JournalHead> {
        let record: HeadRecord = serde_json::from_slice(&kv.value).map_err(|e| {
            failed(format!("{} is not a head hive writes: {e}", String::from_utf8_lossy(&kv.key)))
        })?;
        Ok(JournalHead { sequence: record.sequence, commit: record.commit, version: kv.mod_revision })
    }

    async fn read_head(&self) -> Result<Option<JournalHead>> {
        let page =
            self.backend.client().range(&self.head_key(), &[], 1, 0).await.map_err(|e| unavailable(&e))?;
        page.kvs.first().map(|kv| self.decode_head(kv)).transpose()
    }

    /// The record number a key under `meta/` names, if it is a record's.
    fn sequence_of(&self, key: &[u8]) -> Option<u64> {
        let digits = key.strip_prefix(self.backend.internal_key("meta/").as_slice())?;
        let digits = std::str::from_utf8(digits).ok().filter(|d| d.len() == 20)?;
        digits.parse().ok()
    }

    async fn read_entries(&self, sequence: u64) -> Result<Vec<JournalEntry>> {
        let etcd = self.backend.client();
        let end = self.entry_key(sequence + 1);
        let (mut from, mut revision) = (self.entry_key(1), 0);
        let mut entries: Vec<JournalEntry> = Vec::new();
        loop {
            let page = etcd.range(&from, &end, PAGE, revision).await.map_err(|e| unavailable(&e))?;
            // Every page at the first one's revision: one consistent read.
            revision = page.revision;
            for kv in &page.kvs {
                let at = self.sequence_of(&kv.key).ok_or_else(|| {
                    failed(format!("{} is not a record's key", String::from_utf8_lossy(&kv.key)))
                })?;
                let entry = decode_entry(at, &kv.value).ok_or_else(|| {
                    failed(format!(
                        "record {at} is not a record hive writes (a commit and what it folds in, then a bundle)"
                    ))
                })?;
                // Each record's bundle needs the commits of the one kept before it.
                if entry.replaces != entries.last().map_or(1, |last| last.sequence + 1) {
                    let before = match entries.last() {
                        Some(last) => format!("the record kept before it is {}", last.sequence),
                        None => "it is the first kept".to_string(),
                    };
                    return Err(failed(format!(
                        "record {at} holds the commits from record {} on, but {before}: records are missing",
                        entry.replaces
                    )));
                }
                entries.push(entry);
            }
            match page.kvs.last() {
                Some(last) if page.more => {
                    from = last.key.clone();
                    from.push(0);
                }
                _ => break,
            }
        }
        if entries.last().map(|last| last.sequence) != Some(sequence) {
            return Err(failed(format!(
                "it holds {} of the records up to {sequence}, which its head names, ending at {}",
                entries.len(),
                entries.last().map_or("none".to_string(), |last| last.sequence.to_string())
            )));
        }
        Ok(entries)
    }

    async fn write(&self, after: Option<JournalHead>, entry: JournalEntry) -> Result<JournalHead> {
        if entry.bundle.len() > MAX_BUNDLE {
            return Err(failed(format!(
                "the bundle of commit {} is {} bytes, over the {MAX_BUNDLE} one etcd value holds",
                entry.commit,
                entry.bundle.len()
            )));
        }
        let expected = after.as_ref().map_or(1, |head| head.sequence + 1);
        if entry.sequence != expected {
            return Err(failed(format!("record {} does not follow record {}", entry.sequence, expected - 1)));
        }
        let Some(fence) = self.backend.fence() else {
            return Err(failed(
                "this replica does not lead: only the leader records the meta repo's commits",
            ));
        };
        let head_key = self.head_key();
        let head = HeadRecord { sequence: entry.sequence, commit: entry.commit.clone() };
        let compare = [
            Compare::ModRevision(head_key.clone(), after.as_ref().map_or(0, |head| head.version)),
            fence.compare(),
        ];
        let mut puts = vec![
            Op::Put { key: self.entry_key(entry.sequence), value: encode_entry(&entry), lease: 0 },
            Op::Put {
                key: head_key.clone(),
                value: serde_json::to_vec(&head).expect("a head serializes"),
                lease: 0,
            },
        ];
        if entry.replaces < entry.sequence {
            puts.push(Op::DeleteRange {
                from: self.entry_key(entry.replaces),
                to: self.entry_key(entry.sequence),
            });
        }
        let gets = [Op::Get { key: head_key }, Op::Get { key: fence.key.clone() }];
        let written =
            |version| JournalHead { sequence: entry.sequence, commit: entry.commit.clone(), version };
        match self.backend.client().txn(&compare, &puts, &gets).await {
            Ok(answer) if answer.succeeded => Ok(written(answer.revision)),
            Ok(answer) => {
                let mut gets = answer.gets.into_iter();
                let (now, holder) = (gets.next().flatten(), gets.next().flatten());
                if !fence.holds(holder.as_ref()) {
                    return Err(failed(fence.lost()));
                }
                let now = now.map(|kv| self.decode_head(&kv)).transpose()?;
                Err(failed(format!(
                    "its head moved while record {} was written (it is now {}): another leader recorded",
                    entry.sequence,
                    now.map_or("empty".to_string(), |h| format!(
                        "record {} of commit {}",
                        h.sequence, h.commit
                    )),
                )))
            }
            // The answer was lost: it took effect if the head is this record now.
            Err(ClientError::Indeterminate { message, .. }) => match self.read_head().await? {
                Some(now) if now.sequence == entry.sequence && now.commit == entry.commit => Ok(now),
                _ => Err(failed(format!(
                    "etcd did not answer in time, and record {} is not there: {message}",
                    entry.sequence
                ))),
            },
            Err(e) if e.is_too_large() => Err(failed(format!(
                "etcd refused record {} (a bundle of {} bytes) as too large: {e}",
                entry.sequence,
                entry.bundle.len()
            ))),
            Err(e) => Err(unavailable(&e)),
        }
    }
}

/// A record as etcd holds it: the commit's sha (then a space and the first record it
/// stands for, when it folds in others), a newline, the bundle.
fn encode_entry(entry: &JournalEntry) -> Vec<u8> {
    let folds = (entry.replaces != entry.sequence).then(|| format!(" {}", entry.replaces));
    let folds = folds.unwrap_or_default();
    let mut value = Vec::with_capacity(entry.commit.len() + folds.len() + 1 + entry.bundle.len());
    value.extend_from_slice(entry.commit.as_bytes());
    value.extend_from_slice(folds.as_bytes());
    value.push(b'\n');
    value.extend_from_slice(&entry.bundle);
    value
}

fn decode_entry(sequence: u64, value: &[u8]) -> Option<JournalEntry> {
    let newline = value.iter().position(|b| *b == b'\n')?;
    let line = std::str::from_utf8(&value[..newline]).ok()?;
    let (commit, replaces) = match line.split_once(' ') {
        Some((commit, replaces)) => (commit, replaces.parse().ok().filter(|r| (1..sequence).contains(r))?),
        None => (line, sequence),
    };
    if commit.is_empty() || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some(JournalEntry {
        sequence,
        commit: commit.to_string(),
        bundle: value[newline + 1..].to_vec(),
        replaces,
    })
}

impl Journal for EtcdJournal {
    fn head(&self) -> BoxFuture<'_, Result<Option<JournalHead>>> {
        Box::pin(self.read_head())
    }

    fn entries(&self, sequence: u64) -> BoxFuture<'_, Result<Vec<JournalEntry>>> {
        Box::pin(self.read_entries(sequence))
    }

    fn record(&self, after: Option<JournalHead>, entry: JournalEntry) -> BoxFuture<'_, Result<JournalHead>> {
        Box::pin(self.write(after, entry))
    }

    fn largest_bundle(&self) -> usize {
        MAX_BUNDLE
    }
}
