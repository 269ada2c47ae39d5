//! The meta repo's journal on etcd, against a real cluster: only the leader records,
//! a deposed leader's record is refused, two records cannot extend one head, a record
//! too large for etcd is refused clearly, and what was recorded reads back in order
//! through any replica.

use crate::meta::{Error, Journal, JournalEntry, JournalHead};
use crate::store::etcd::client::Op;
use crate::store::etcd::cluster::LocalCluster;
use crate::store::etcd::lease::Fence;
use crate::store::etcd::EtcdConfig;
use crate::store::{Store, StoreConfig};

use super::meta_journal::{EtcdJournal, MAX_BUNDLE};

async fn replica(cluster: &LocalCluster) -> Store {
    let config = StoreConfig::new("/nonexistent/not-used-on-etcd");
    let etcd = EtcdConfig { endpoints: cluster.endpoints(), prefix: "/journal/".into() };
    Store::open_etcd(config, &etcd).await.unwrap()
}

fn journal(store: &Store) -> EtcdJournal {
    EtcdJournal::new(store.etcd().unwrap().clone())
}

/// Makes `store` the leader: the leader key made anew (a new epoch, as an election
/// does), and the store's writes fenced with it.
async fn lead(store: &Store) -> Fence {
    let backend = store.etcd().unwrap();
    let key = backend.internal_key("leader");
    let etcd = backend.client();
    etcd.txn(&[], &[Op::Delete { key: key.clone() }], &[]).await.unwrap();
    let put = Op::Put { key: key.clone(), value: b"test".to_vec(), lease: 0 };
    let answer = etcd.txn(&[], &[put], &[]).await.unwrap();
    let fence = Fence { key, epoch: answer.revision };
    backend.set_fence(Some(fence.clone()));
    fence
}

/// A replica on `cluster` that leads, and its journal.
async fn leading_journal(cluster: &LocalCluster) -> (Store, EtcdJournal) {
    let store = replica(cluster).await;
    lead(&store).await;
    let journal = journal(&store);
    (store, journal)
}

/// Records 1 to `records`, each one commit's (sha: its number in hex) with `bundle(n)`.
async fn record_commits(
    journal: &EtcdJournal,
    records: u64,
    bundle: impl Fn(u64) -> Vec<u8>,
) -> Option<JournalHead> {
    let mut head = None;
    for sequence in 1..=records {
        let commit = format!("{sequence:040x}");
        head = Some(journal.record(head, entry(sequence, &commit, &bundle(sequence))).await.unwrap());
    }
    head
}

fn entry(sequence: u64, commit: &str, bundle: &[u8]) -> JournalEntry {
    JournalEntry { sequence, commit: commit.into(), bundle: bundle.to_vec(), replaces: sequence }
}

fn refused<T: std::fmt::Debug>(result: crate::meta::Result<T>, says: &str) {
    match result {
        Err(Error::Journal { reason }) => assert!(reason.contains(says), "{reason:?} should say {says:?}"),
        other => panic!("expected a refusal saying {says:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_records_a_deposed_one_is_refused_and_no_two_records_extend_one_head() {
    let cluster = LocalCluster::start(1).unwrap();
    let (a, b) = (replica(&cluster).await, replica(&cluster).await);
    let (first, second) = (journal(&a), journal(&b));
    assert_eq!(first.head().await.unwrap(), None);
    refused(first.record(None, entry(1, "aa", b"one")).await, "does not lead");

    lead(&a).await;
    let one = first.record(None, entry(1, "aa", b"one")).await.unwrap();
    assert_eq!(second.head().await.unwrap(), Some(one.clone()), "read through another replica");
    let two = first.record(Some(one.clone()), entry(2, "bb", b"two")).await.unwrap();
    // A writer that still sees the first head cannot extend it: no fork.
    refused(first.record(Some(one.clone()), entry(2, "cc", b"fork")).await, "head moved");
    refused(first.record(None, entry(1, "dd", b"fork")).await, "head moved");

    // Another replica is elected: the deposed one records nothing more.
    lead(&b).await;
    refused(first.record(Some(two.clone()), entry(3, "ee", b"deposed")).await, "no longer leads");
    assert_eq!(second.head().await.unwrap(), Some(two.clone()));
    let three = second.record(Some(two), entry(3, "ff", b"three")).await.unwrap();

    // A bundle over what one etcd value holds is refused, and nothing changes.
    let huge = vec![7u8; MAX_BUNDLE + 1];
    refused(second.record(Some(three.clone()), entry(4, "ab", &huge)).await, "over the");
    assert_eq!(first.head().await.unwrap(), Some(three.clone()));

    let read = first.entries(3).await.unwrap();
    let got: Vec<(u64, &str, &[u8])> =
        read.iter().map(|e| (e.sequence, e.commit.as_str(), e.bundle.as_slice())).collect();
    assert_eq!(got, [(1, "aa", &b"one"[..]), (2, "bb", &b"two"[..]), (3, "ff", &b"three"[..])]);
    assert_eq!(three, JournalHead { sequence: 3, commit: "ff".into(), version: three.version });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_records_read_back_in_order_across_pages() {
    let cluster = LocalCluster::start(1).unwrap();
    let (_store, journal) = leading_journal(&cluster).await;
    record_commits(&journal, 70, |sequence| sequence.to_string().into_bytes()).await;
    let read = journal.entries(70).await.unwrap();
    assert_eq!(read.len(), 70);
    assert!(read.iter().enumerate().all(|(i, e)| e.sequence == i as u64 + 1
        && e.commit == format!("{:040x}", i + 1)
        && e.bundle == (i + 1).to_string().as_bytes()));
    refused(journal.entries(71).await, "holds 70 of the records up to 71");
}

/// A record that folds in those before it deletes them in its own transaction, and reads
/// back saying so; the whole history's (from record 1) leaves it the first kept. A record
/// kept out of that order (a stray one where a fold took its place) is refused by name,
/// not applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_folds_in_others_drops_them() {
    let cluster = LocalCluster::start(1).unwrap();
    let (store, journal) = leading_journal(&cluster).await;
    let sha = |n: u64| format!("{n:040x}");
    let mut head = record_commits(&journal, 5, |_| b"one commit".to_vec()).await;
    let fold = JournalEntry { replaces: 3, ..entry(6, &sha(6), b"records 3 to 6") };
    head = Some(journal.record(head, fold).await.unwrap());
    head = Some(journal.record(head, entry(7, &sha(7), b"one commit")).await.unwrap());
    let read = |entries: Vec<JournalEntry>| -> Vec<(u64, u64)> {
        entries.iter().map(|e| (e.sequence, e.replaces)).collect()
    };
    assert_eq!(read(journal.entries(7).await.unwrap()), [(1, 1), (2, 2), (6, 3), (7, 7)]);

    let whole = JournalEntry { replaces: 1, ..entry(8, &sha(8), b"the whole history") };
    head = Some(journal.record(head, whole).await.unwrap());
    assert_eq!(read(journal.entries(8).await.unwrap()), [(8, 1)]);
    let backend = store.etcd().unwrap();
    let prefix = backend.internal_key("meta/0");
    let mut end = prefix.clone();
    *end.last_mut().unwrap() += 1;
    let keys = backend.client().range(&prefix, &end, 0, 0).await.unwrap();
    assert_eq!(keys.kvs.len(), 1, "records 1 to 7 are gone from etcd");

    // A record where the fold left none: the journal is damaged, and says where.
    let stray = Op::Put {
        key: backend.internal_key(&format!("meta/{:020}", 5)),
        value: format!("{}\none commit", sha(5)).into_bytes(),
        lease: 0,
    };
    backend.client().txn(&[], &[stray], &[]).await.unwrap();
    refused(
        journal.entries(8).await,
        "record 5 holds the commits from record 5 on, but it is the first kept",
    );
    assert_eq!(journal.head().await.unwrap(), head);
}
