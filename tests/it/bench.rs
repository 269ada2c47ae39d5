//! `hive bench` run for real, briefly: the phases whose rows no other test reads.

use std::process::Command;

use crate::harness::hive_bin;

/// The update phase creates its Agents, replaces them for the duration at each level
/// (every replace answered 200), and reports the state directory's files after each.
#[test]
fn the_update_phase_replaces_its_agents_and_reports_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(hive_bin())
        .args([
            "bench",
            "--phases",
            "updates",
            "--clients",
            "1,4",
            "--duration",
            "1s",
            "--update-objects",
            "20",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for clients in [1, 4] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("durable updates (PUT), {clients} client(s), 20 Agents")))
            .unwrap_or_else(|| panic!("no update row for {clients} client(s):\n{stdout}"));
        assert!(!row.contains("failed"), "{row}");
        // "<rate>/s (<count> in <seconds>s)": some updates were done.
        let count: u64 = row
            .split("/s (")
            .nth(1)
            .and_then(|r| r.split(" in ").next())
            .map(|n| n.replace(',', "").parse().unwrap())
            .unwrap_or_else(|| panic!("no count in {row}"));
        assert!(count > 0, "{row}");
        let files = stdout
            .lines()
            .find(|l| l.starts_with(&format!("state directory after c={clients}")))
            .unwrap_or_else(|| panic!("no state row after c={clients}:\n{stdout}"));
        assert!(files.contains("hive.redb") && files.contains("MiB on disk"), "{files}");
    }
    // The temporary state directory is gone with the daemon.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
