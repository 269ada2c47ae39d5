//! Stage trace of bench-stamped writes (a measuring tool, not part of hive: see
//! bench/stage-trace/README.md). Each hook records, for a write the bench stamped, the
//! time from its send to the hook; a thread writes the percentiles of every stage to
//! /tmp/hive-trace.txt every 2 s.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

tokio::task_local! {
    pub static REQ_T: (std::cell::Cell<u64>, std::cell::Cell<u64>);
}

pub static LAST: AtomicU64 = AtomicU64::new(0);
pub static LAST_LINE: AtomicU64 = AtomicU64::new(0);
pub static FANOUT_T: AtomicU64 = AtomicU64::new(0);
pub static LINES: AtomicU64 = AtomicU64::new(0);
pub static WRITES: AtomicU64 = AtomicU64::new(0);
static DATA: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());
static STARTED: std::sync::Once = std::sync::Once::new();

pub const NAMES: [&str; 19] = [
    "0 commit_all entry",
    "1 commit thread batch start",
    "2 after log write (fdatasync)",
    "3 after apply+hand",
    "4 fanout task wakes",
    "5 watch body line_of",
    "6 connection write (last line's)",
    "7 writer reply sent (oneshot)",
    "8 Tracking::call (conn task)",
    "9 stream task first poll",
    "10 line 0 after fanout",
    "11 line 1-9 after fanout",
    "12 line 10-49 after fanout",
    "13 line 50+ after fanout",
    "14 write 0 after fanout",
    "15 write 1-3 after fanout",
    "16 write 4-7 after fanout",
    "17 write 8-15 after fanout",
    "18 write 16+ after fanout",
];

pub fn wall() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The bench's send stamp in an object's JSON.
pub fn sent(json: &[u8]) -> Option<u64> {
    let key = b"\"bench.hive.dev/sent-ns\":\"";
    let at = memchr::memmem::find(json, key)? + key.len();
    let digits = json[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&json[at..at + digits]).ok()?.parse().ok()
}

pub fn sent_value(v: &serde_json::Value) -> Option<u64> {
    v.pointer("/metadata/annotations/bench.hive.dev~1sent-ns")?.as_str()?.parse().ok()
}

pub fn mark_at(stage: usize, sent: u64, now: u64) {
    if sent == 0 {
        return;
    }
    STARTED.call_once(|| {
        std::thread::spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_secs(2));
            dump();
        });
    });
    let mut d = DATA.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if d.is_empty() {
        d.resize(NAMES.len(), Vec::new());
    }
    d[stage].push(now.saturating_sub(sent));
}

pub fn mark_last(stage: usize, from: &AtomicU64) {
    let s = from.load(Ordering::Relaxed);
    if s != 0 {
        mark_at(stage, s, wall());
    }
}

/// A batch's wakes are being given: lines and writes count from here.
pub fn fanout_start() {
    FANOUT_T.store(wall(), Ordering::Relaxed);
    LINES.store(0, Ordering::Relaxed);
    WRITES.store(0, Ordering::Relaxed);
}

/// The n-th line of an event, by stages 10–13 (lines 0, 1–9, 10–49, 50+).
pub fn line_mark() {
    nth_mark(&LINES, |n| match n {
        0 => 10,
        1..=9 => 11,
        10..=49 => 12,
        _ => 13,
    });
}

/// The n-th write of an event, by stages 14–18 (writes 0, 1–3, 4–7, 8–15, 16+).
pub fn write_mark() {
    nth_mark(&WRITES, |n| match n {
        0 => 14,
        1..=3 => 15,
        4..=7 => 16,
        8..=15 => 17,
        _ => 18,
    });
}

/// Time since the fan-out task's start, recorded at the stage `stage` picks for this
/// count of `counter`.
fn nth_mark(counter: &AtomicU64, stage: impl Fn(u64) -> usize) {
    let t0 = FANOUT_T.load(Ordering::Relaxed);
    if t0 == 0 {
        return;
    }
    mark_at(stage(counter.fetch_add(1, Ordering::Relaxed)), t0, wall());
}

fn dump() {
    let d = DATA.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    let mut out = String::new();
    for (i, v) in d.iter().enumerate() {
        let mut v = v.clone();
        v.sort_unstable();
        if v.is_empty() {
            continue;
        }
        let p = |q: f64| v[((v.len() - 1) as f64 * q) as usize] as f64 / 1e3;
        out += &format!(
            "{:40} n={:8} p10={:8.0} p50={:8.0} p90={:8.0} p99={:8.0} us\n",
            NAMES[i],
            v.len(),
            p(0.1),
            p(0.5),
            p(0.9),
            p(0.99)
        );
    }
    let _ = std::fs::write("/tmp/hive-trace.txt", out);
}
