//! What an agent's process tree uses now, read from `/proc`: the main process (the pid
//! the runtime observes) and every live descendant, found by parent pid, so a child that
//! left the process group still counts. CPU is the tree's user + system time in clock
//! ticks, a counter: two samples over a window give a rate ([`cpu_percent`]). Memory is
//! the resident set (`VmRSS`) of each process, summed (shared pages count once per
//! process, as `top` and `kubectl top` count them).

use std::collections::HashMap;
use std::path::Path;

/// The clock ticks per second `/proc/<pid>/stat` counts CPU time in: Linux's `USER_HZ`,
/// 100 on every architecture hive runs on (`sysconf(_SC_CLK_TCK)`).
pub const TICKS_PER_SECOND: u64 = 100;

/// One reading of a process tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// User + system CPU time of the live processes, in clock ticks.
    pub cpu_ticks: u64,
    /// Their resident memory, in bytes.
    pub memory_bytes: u64,
    /// How many processes the tree holds.
    pub processes: u32,
}

/// One process as `/proc/<pid>/stat` and `status` describe it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Proc {
    parent: u32,
    cpu_ticks: u64,
    memory_bytes: u64,
}

/// The tree rooted at `root` now, read from `proc` (`/proc` but in tests); `None` when
/// `root` is gone.
pub fn sample(proc: &Path, root: u32) -> Option<Sample> {
    let mut all = HashMap::new();
    for entry in std::fs::read_dir(proc).ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Some(p) = read(&entry.path()) {
            all.insert(pid, p);
        }
    }
    tree(&all, root)
}

/// Sums the tree of `root` over `all` (pid → process).
fn tree(all: &HashMap<u32, Proc>, root: u32) -> Option<Sample> {
    let first = all.get(&root)?;
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&pid, p) in all {
        children.entry(p.parent).or_default().push(pid);
    }
    let mut out = Sample { cpu_ticks: first.cpu_ticks, memory_bytes: first.memory_bytes, processes: 1 };
    let mut todo = children.get(&root).cloned().unwrap_or_default();
    let mut seen = std::collections::HashSet::from([root]);
    while let Some(pid) = todo.pop() {
        if !seen.insert(pid) {
            continue;
        }
        let p = &all[&pid];
        out.cpu_ticks += p.cpu_ticks;
        out.memory_bytes += p.memory_bytes;
        out.processes += 1;
        todo.extend(children.get(&pid).into_iter().flatten().copied());
    }
    Some(out)
}

/// One process from its directory under `/proc`; `None` when it went away meanwhile or
/// does not parse.
fn read(dir: &Path) -> Option<Proc> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
    parse(&stat, &status)
}

fn parse(stat: &str, status: &str) -> Option<Proc> {
    // The command name (field 2) may hold spaces and parentheses; what follows the last
    // `)` is plain space-separated fields, starting with field 3 (state).
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let parent = u32::try_from(field(4)?).ok()?;
    let cpu_ticks = field(14)? + field(15)?;
    // A zombie or kernel thread has no VmRSS line: no resident memory.
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    Some(Proc { parent, cpu_ticks, memory_bytes: kib * 1024 })
}

/// The CPU the tree used between `before` and `after`, `seconds` apart, in percent of
/// one core; a process that ended in between takes its ticks with it, so a drop reads 0.
pub fn cpu_percent(before: &Sample, after: &Sample, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    let ticks = after.cpu_ticks.saturating_sub(before.cpu_ticks);
    ticks as f64 / TICKS_PER_SECOND as f64 / seconds * 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, name: &str, parent: u32, utime: u64, stime: u64) -> String {
        // Fields 3 … 15: state, ppid, pgrp, session, tty, tpgid, flags, minflt, cminflt,
        // majflt, cmajflt, utime, stime; then the rest.
        format!(
            "{pid} ({name}) S {parent} {pid} {pid} 0 -1 4194304 100 0 0 0 {utime} {stime} 0 0 20 0 1 0 12345"
        )
    }

    #[test]
    fn parses_a_stat_line_whose_name_has_spaces_and_parentheses() {
        let p = parse(&stat(42, "my (odd) agent", 7, 30, 12), "Name:\tx\nVmRSS:\t   2048 kB\n").unwrap();
        assert_eq!(p, Proc { parent: 7, cpu_ticks: 42, memory_bytes: 2048 * 1024 });
        let zombie = parse(&stat(43, "sh", 7, 1, 1), "Name:\tsh\nState:\tZ (zombie)\n").unwrap();
        assert_eq!(zombie.memory_bytes, 0);
        assert_eq!(parse("garbage", ""), None);
    }

    #[test]
    fn a_tree_is_its_root_and_every_descendant() {
        let p = |parent, cpu_ticks, mib: u64| Proc { parent, cpu_ticks, memory_bytes: mib << 20 };
        // 10 ← 11 ← 12 (a grandchild, maybe in a group of its own); 20 is someone else's.
        let all =
            HashMap::from([(10, p(1, 5, 10)), (11, p(10, 7, 20)), (12, p(11, 1, 1)), (20, p(1, 99, 99))]);
        assert_eq!(tree(&all, 10), Some(Sample { cpu_ticks: 13, memory_bytes: 31 << 20, processes: 3 }));
        assert_eq!(tree(&all, 11), Some(Sample { cpu_ticks: 8, memory_bytes: 21 << 20, processes: 2 }));
        assert_eq!(tree(&all, 30), None);
    }

    #[test]
    fn cpu_percent_is_ticks_over_the_window() {
        let at = |cpu_ticks| Sample { cpu_ticks, ..Sample::default() };
        assert_eq!(cpu_percent(&at(100), &at(150), 1.0), 50.0);
        assert_eq!(cpu_percent(&at(100), &at(300), 1.0), 200.0, "two cores");
        assert_eq!(cpu_percent(&at(100), &at(40), 1.0), 0.0, "a child ended");
        assert_eq!(cpu_percent(&at(0), &at(10), 0.0), 0.0);
    }

    #[test]
    fn samples_this_process() {
        let own = std::process::id();
        let s = sample(Path::new("/proc"), own).expect("this process is in /proc");
        assert!(s.processes >= 1 && s.memory_bytes > 0, "{s:?}");
    }
}
