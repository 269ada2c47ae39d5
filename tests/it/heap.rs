//! How the daemon takes memory from the kernel.

use crate::harness::{agent, Daemon};

const AGENTS: &str = "/apis/hive.dev/v1/agents";

/// A field of `/proc/<pid>/smaps_rollup`, in KiB.
fn rollup_kib(pid: u32, field: &str) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).expect("/proc smaps_rollup");
    let line = rollup.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} in {rollup}"));
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a number")
}

/// Where transparent huge pages are `madvise` (Debian's default), a heap advised into
/// them takes 2 MiB, zeroed on the spot, at the first touch of each: a daemon whose
/// allocator asked for them had 32 MiB of its 70 MiB in huge pages right after it
/// started (measured), and on a VM whose host had taken back the guest's free memory one
/// such fault held the commit thread 85 ms. The daemon's allocator is built not to ask
/// (`no_thp`, src/main.rs), so its heap, even after work, is in ordinary pages.
#[tokio::test]
async fn the_daemon_does_not_ask_for_transparent_huge_pages() {
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if !mode.contains("[madvise]") {
        eprintln!("skipped: transparent huge pages are not `madvise` here ({})", mode.trim());
        return;
    }
    let d = Daemon::start_with(&["--agent-controller=false"]);
    let api = d.client();
    for i in 0..300 {
        let created = api.post(AGENTS, &agent(&format!("heap-{i}"))).await;
        assert_eq!(created.code, 201, "{:?}", created.body);
    }
    let listed = api.get(AGENTS).await;
    assert_eq!(listed.code, 200);
    assert_eq!(listed.body["items"].as_array().map(Vec::len), Some(300));
    let rss = rollup_kib(d.pid(), "Rss:");
    let huge = rollup_kib(d.pid(), "AnonHugePages:");
    assert_eq!(huge, 0, "{huge} KiB of the daemon's {rss} KiB resident are transparent huge pages");
}
