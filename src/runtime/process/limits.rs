//! Resource limits of process agents: parsing `spec.resources` into cgroup v2 values,
//! deciding once per runtime whether this host lets hive enforce them, and writing each
//! agent's `cpu.max` and `memory.max`.
//!
//! The layout, under the daemon's own cgroup `<own>` (from `/proc/self/cgroup`):
//!
//! ```text
//! <own>/                     cgroup.subtree_control: +cpu +memory
//!   hive-daemon/             the daemon (and children it had) moved here first
//!   hive-agents/             cgroup.subtree_control: +cpu +memory
//!     <agent>/               cpu.max, memory.max; the agent joins cgroup.procs
//! ```
//!
//! cgroup v2 allows no processes in a cgroup that hands controllers to its children
//! ("no internal processes"), which is why the daemon leaves `<own>` for `hive-daemon/`
//! before controllers are enabled. hive needs `<own>` delegated to it (systemd
//! `Delegate=yes`); it never writes above it. When any step fails, nothing is enforced
//! and the decision names the step, the file and the OS error. A daemon already moved
//! to `hive-daemon/` stays there: it is a leaf with the same limits as `<own>`.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The cgroup v2 CPU period hive writes into `cpu.max`, in microseconds (the kernel's
/// default): a quota of `N%` of one core is `N * 1000` microseconds per period.
pub const CPU_PERIOD_US: u64 = 100_000;

/// The daemon's own leaf, beside the agents.
pub const DAEMON_CGROUP: &str = "hive-daemon";

/// The parent of the agents' cgroups.
pub const AGENTS_CGROUP: &str = "hive-agents";

/// The controllers hive enables for the agents.
const CONTROLLERS: [&str; 2] = ["cpu", "memory"];

/// A CPU cap as cgroup v2 `cpu.max` holds it: `<quota_us> <period_us>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuMax {
    /// Microseconds of CPU time per [`CPU_PERIOD_US`].
    pub quota_us: u64,
}

impl fmt::Display for CpuMax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {CPU_PERIOD_US}", self.quota_us)
    }
}

/// A memory cap as cgroup v2 `memory.max` holds it: bytes, or `max` for none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryMax {
    /// At most this many bytes.
    Bytes(u64),
    /// No cap (`infinity` in the spec).
    Unlimited,
}

impl fmt::Display for MemoryMax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryMax::Bytes(bytes) => write!(f, "{bytes}"),
            MemoryMax::Unlimited => f.write_str("max"),
        }
    }
}

/// Parses a CPU quota as systemd `CPUQuota=` takes it: a positive percentage of one
/// core, `200%` being two cores.
pub fn parse_cpu_quota(value: &str) -> Result<CpuMax, String> {
    let invalid = || format!("{value:?}: must be a positive percentage of one core, such as \"200%\"");
    let digits = value.strip_suffix('%').filter(|d| is_digits(d)).ok_or_else(invalid)?;
    let percent: u64 = digits.parse().map_err(|_| invalid())?;
    match percent.checked_mul(CPU_PERIOD_US / 100) {
        Some(0) => Err(invalid()),
        Some(quota_us) => Ok(CpuMax { quota_us }),
        None => Err(format!("{value:?}: is too large")),
    }
}

/// Parses a memory cap as systemd `MemoryMax=` takes it: a positive byte count with an
/// optional 1024-based `K`, `M`, `G` or `T` suffix, or `infinity`.
pub fn parse_memory_max(value: &str) -> Result<MemoryMax, String> {
    if value == "infinity" {
        return Ok(MemoryMax::Unlimited);
    }
    let invalid = || {
        format!(
            "{value:?}: must be a positive byte count with an optional K, M, G or T suffix \
             (1024-based), such as \"4G\", or \"infinity\""
        )
    };
    let (digits, shift) = match value.as_bytes().last() {
        Some(b'K') => (&value[..value.len() - 1], 10),
        Some(b'M') => (&value[..value.len() - 1], 20),
        Some(b'G') => (&value[..value.len() - 1], 30),
        Some(b'T') => (&value[..value.len() - 1], 40),
        _ => (value, 0),
    };
    if !is_digits(digits) {
        return Err(invalid());
    }
    let count: u64 = digits.parse().map_err(|_| format!("{value:?}: is too large"))?;
    match count.checked_mul(1 << shift) {
        Some(0) => Err(invalid()),
        Some(bytes) => Ok(MemoryMax::Bytes(bytes)),
        None => Err(format!("{value:?}: is too large")),
    }
}

/// Plain ASCII digits, at least one (no sign, no space: `str::parse` takes a `+`).
fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Whether this runtime can enforce limits, decided once per runtime by [`detect`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cgroups {
    /// cgroup v2 with `cpu` and `memory` delegated to `hive-agents/`.
    Enforced {
        /// `<own>/hive-agents`, where each agent gets its cgroup.
        agents: PathBuf,
    },
    /// Limits cannot be enforced on this host.
    NotEnforced {
        /// Which step failed, and why.
        reason: String,
    },
}

/// What [`Cgroups::apply`] did for one agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// `cgroup.procs` of the agent's cgroup, which its process joins at start; `None`
    /// when the limits are not enforced.
    pub procs: Option<PathBuf>,
    /// How they are enforced, or why not.
    pub message: String,
}

impl Cgroups {
    /// Writes `cpu.max` and `memory.max` of agent `agent`'s cgroup, creating it. Not
    /// enforced, with the reason, when the runtime's decision or a write says so.
    pub fn apply(&self, agent: &str, cpu: CpuMax, memory: MemoryMax) -> Applied {
        let agents = match self {
            Cgroups::Enforced { agents } => agents,
            Cgroups::NotEnforced { reason } => return Applied { procs: None, message: reason.clone() },
        };
        let cgroup = agents.join(agent);
        let written = create_dir(&cgroup)
            .and_then(|()| write_file(&cgroup.join("cpu.max"), &cpu.to_string()))
            .and_then(|()| write_file(&cgroup.join("memory.max"), &memory.to_string()));
        match written {
            Ok(()) => Applied {
                procs: Some(cgroup.join("cgroup.procs")),
                message: format!("cgroup v2: {} (cpu.max {cpu}, memory.max {memory})", cgroup.display()),
            },
            Err(reason) => Applied { procs: None, message: reason },
        }
    }

    /// Removes agent `agent`'s cgroup, if it has one and no process is left in it.
    pub fn remove(&self, agent: &str) {
        if let Cgroups::Enforced { agents } = self {
            // Fails while a process lingers (or on a fake cgroupfs of plain files); the
            // cgroup is then reused by the next agent of that name.
            let _ = fs::remove_dir(agents.join(agent));
        }
    }
}

/// Decides whether limits can be enforced under the cgroup v2 hierarchy at `root`, for
/// the daemon whose cgroup membership `self_cgroup` (normally `/proc/self/cgroup`)
/// lists, and prepares the layout of the module docs when they can: moves the daemon
/// into `hive-daemon/`, creates `hive-agents/` and enables `+cpu +memory` for it.
pub fn detect(root: &Path, self_cgroup: &Path) -> Cgroups {
    match prepare(root, self_cgroup) {
        Ok(agents) => Cgroups::Enforced { agents },
        Err(reason) => Cgroups::NotEnforced { reason },
    }
}

fn prepare(root: &Path, self_cgroup: &Path) -> Result<PathBuf, String> {
    if !root.join("cgroup.controllers").is_file() {
        return Err(not_unified(root));
    }
    let membership =
        fs::read_to_string(self_cgroup).map_err(|e| format!("cannot read {}: {e}", self_cgroup.display()))?;
    let Some(own) = membership.lines().find_map(|line| line.strip_prefix("0::")) else {
        return Err(format!("{} has no cgroup v2 entry (a `0::<path>` line)", self_cgroup.display()));
    };
    let mut own = match own.trim().trim_start_matches('/') {
        "" => root.to_path_buf(),
        path => root.join(path),
    };
    // A daemon restarted in place is still in the leaf an earlier run moved it to.
    if own.file_name().is_some_and(|name| name == DAEMON_CGROUP) {
        own.pop();
    }

    let listed = own.join("cgroup.controllers");
    let controllers =
        fs::read_to_string(&listed).map_err(|e| format!("cannot read {}: {e}", listed.display()))?;
    let missing: Vec<&str> =
        CONTROLLERS.into_iter().filter(|c| !controllers.split_whitespace().any(|l| l == *c)).collect();
    if !missing.is_empty() {
        return Err(format!(
            "the {} controller{} not available to {} (its cgroup.controllers lists: {})",
            missing.join(" and "),
            if missing.len() == 1 { " is" } else { "s are" },
            own.display(),
            match controllers.trim() {
                "" => "nothing",
                listed => listed,
            },
        ));
    }

    let daemon = own.join(DAEMON_CGROUP);
    create_dir(&daemon)?;
    move_daemon(&own, &daemon)?;
    let agents = own.join(AGENTS_CGROUP);
    create_dir(&agents)?;
    let enable = CONTROLLERS.map(|c| format!("+{c}")).join(" ");
    for parent in [&own, &agents] {
        write_file(&parent.join("cgroup.subtree_control"), &enable).map_err(|reason| {
            if parent == &own && reason.contains(&busy()) {
                format!(
                    "{reason} (processes other than the daemon's are in {}, and cgroup v2 allows \
                     none in a cgroup that delegates controllers: give hive a cgroup of its own, \
                     e.g. systemd Delegate=yes)",
                    own.display()
                )
            } else {
                reason
            }
        })?;
    }
    Ok(agents)
}

/// Why `root` is not a usable unified cgroup v2 hierarchy, as precisely as its layout
/// tells.
fn not_unified(root: &Path) -> String {
    let at = root.display();
    if !root.is_dir() {
        return format!("cgroup v2 is not mounted at {at} ({at} does not exist)");
    }
    let unified = root.join("unified");
    let v1 = ["cpu", "memory", "systemd"].iter().any(|c| root.join(c).is_dir());
    match fs::read_to_string(unified.join("cgroup.controllers")) {
        Ok(listed) => {
            let listed = listed.split_whitespace().collect::<Vec<_>>();
            let offers = if listed.is_empty() { "nothing".to_string() } else { listed.join(" ") };
            format!(
                "cgroup v2 is not mounted at {at} (found a cgroup v1 hierarchy; its hybrid cgroup v2 \
                 tree at {} offers {offers}, and hive needs cpu and memory in a unified hierarchy)",
                unified.display()
            )
        }
        Err(_) if v1 => format!("cgroup v2 is not mounted at {at} (found a cgroup v1 hierarchy)"),
        Err(_) => format!("cgroup v2 is not mounted at {at} (there is no {at}/cgroup.controllers)"),
    }
}

/// Moves the daemon into `daemon`, then every process of `own` that descends from it
/// (build commands it was running), so `own` can hand controllers to its children.
fn move_daemon(own: &Path, daemon: &Path) -> Result<(), String> {
    let procs = daemon.join("cgroup.procs");
    let me = std::process::id();
    append_file(&procs, &me.to_string())
        .map_err(|reason| format!("cannot move the daemon into {}: {reason}", daemon.display()))?;
    // Read after the daemon moved: a child forked since then is born in `daemon`.
    let listed = fs::read_to_string(own.join("cgroup.procs")).unwrap_or_default();
    for pid in listed.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
        if pid != me && descends_from(pid, me) {
            // A child that exited meanwhile is fine; one that cannot move makes
            // enabling the controllers fail, which is reported there.
            let _ = append_file(&procs, &pid.to_string());
        }
    }
    Ok(())
}

/// Whether process `pid` is a descendant of `ancestor`, by its `/proc` parent chain.
fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut current = pid;
    // Bounded, in case `/proc` changes under the walk.
    for _ in 0..64 {
        match parent_pid(current) {
            Some(parent) if parent == ancestor => return true,
            Some(parent) if parent > 1 => current = parent,
            _ => return false,
        }
    }
    false
}

/// The parent of `pid` (field 4 of `/proc/<pid>/stat`), `None` when it is gone.
fn parent_pid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split(' ').nth(1)?.parse().ok()
}

/// The text of `EBUSY` as [`io::Error`] renders it.
fn busy() -> String {
    io::Error::from(rustix::io::Errno::BUSY).to_string()
}

fn create_dir(path: &Path) -> Result<(), String> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(e) => Err(format!("cannot create {}: {e}", path.display())),
    }
}

/// Writes one cgroup control value, replacing what a plain file held (cgroupfs files
/// take each write as one command; creating is for fake cgroupfs trees in tests, a
/// real one refuses it).
fn write_file(path: &Path, value: &str) -> Result<(), String> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .and_then(|mut file| file.write_all(value.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Writes one pid to a `cgroup.procs`, appending (so a plain file in a fake tree keeps
/// every pid written to it).
fn append_file(path: &Path, value: &str) -> Result<(), String> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .and_then(|mut file| file.write_all(format!("{value}\n").as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn cpu_quota_forms() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("200%", Ok("200000 100000")),
            ("100%", Ok("100000 100000")),
            ("50%", Ok("50000 100000")),
            ("1%", Ok("1000 100000")),
            ("1600%", Ok("1600000 100000")),
            ("0%", Err("must be a positive percentage")),
            ("200", Err("must be a positive percentage")),
            ("2.5%", Err("must be a positive percentage")),
            ("-5%", Err("must be a positive percentage")),
            ("+5%", Err("must be a positive percentage")),
            (" 200%", Err("must be a positive percentage")),
            ("%", Err("must be a positive percentage")),
            ("", Err("must be a positive percentage")),
            ("two%", Err("must be a positive percentage")),
            ("99999999999999999999%", Err("must be a positive percentage")),
            ("99999999999999999%", Err("is too large")),
        ];
        for (input, expected) in cases {
            let got = parse_cpu_quota(input).map(|c| c.to_string());
            match (expected, &got) {
                (Ok(want), Ok(got)) => assert_eq!(got, want, "{input:?}"),
                (Err(want), Err(got)) => assert!(got.contains(want), "{input:?}: {got}"),
                _ => panic!("{input:?}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn memory_max_forms() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("4G", Ok("4294967296")),
            ("512M", Ok("536870912")),
            ("1K", Ok("1024")),
            ("2T", Ok("2199023255552")),
            ("1073741824", Ok("1073741824")),
            ("infinity", Ok("max")),
            ("0", Err("must be a positive byte count")),
            ("0G", Err("must be a positive byte count")),
            ("4GB", Err("must be a positive byte count")),
            ("4g", Err("must be a positive byte count")),
            ("1.5G", Err("must be a positive byte count")),
            ("-1", Err("must be a positive byte count")),
            ("+4G", Err("must be a positive byte count")),
            ("G", Err("must be a positive byte count")),
            ("", Err("must be a positive byte count")),
            ("max", Err("must be a positive byte count")),
            ("Infinity", Err("must be a positive byte count")),
            ("16777216T", Err("is too large")),
            ("99999999999999999999", Err("is too large")),
        ];
        for (input, expected) in cases {
            let got = parse_memory_max(input).map(|m| m.to_string());
            match (expected, &got) {
                (Ok(want), Ok(got)) => assert_eq!(got, want, "{input:?}"),
                (Err(want), Err(got)) => assert!(got.contains(want), "{input:?}: {got}"),
                _ => panic!("{input:?}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    /// A fake cgroupfs of plain files: a unified root and the daemon's cgroup
    /// `/hive.service` listing `controllers`.
    pub(crate) struct FakeCgroupfs {
        pub tmp: tempfile::TempDir,
    }

    impl FakeCgroupfs {
        pub fn new(controllers: &str) -> FakeCgroupfs {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().join("cgroup");
            let own = root.join("hive.service");
            fs::create_dir_all(&own).unwrap();
            fs::write(root.join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
            fs::write(own.join("cgroup.controllers"), format!("{controllers}\n")).unwrap();
            fs::write(own.join("cgroup.subtree_control"), "").unwrap();
            fs::write(tmp.path().join("self-cgroup"), "0::/hive.service\n").unwrap();
            FakeCgroupfs { tmp }
        }

        pub fn root(&self) -> PathBuf {
            self.tmp.path().join("cgroup")
        }

        pub fn own(&self) -> PathBuf {
            self.root().join("hive.service")
        }

        pub fn self_cgroup(&self) -> PathBuf {
            self.tmp.path().join("self-cgroup")
        }

        pub fn detect(&self) -> Cgroups {
            detect(&self.root(), &self.self_cgroup())
        }
    }

    fn reason(cgroups: Cgroups) -> String {
        match cgroups {
            Cgroups::NotEnforced { reason } => reason,
            enforced => panic!("expected not enforced, got {enforced:?}"),
        }
    }

    #[test]
    fn v2_with_cpu_and_memory_is_enforced_in_the_layout() {
        let fake = FakeCgroupfs::new("cpu io memory pids");
        let own = fake.own();
        let cgroups = fake.detect();
        assert_eq!(cgroups, Cgroups::Enforced { agents: own.join("hive-agents") });
        let read = |path: PathBuf| fs::read_to_string(path).unwrap();
        assert_eq!(read(own.join("cgroup.subtree_control")), "+cpu +memory");
        assert_eq!(read(own.join("hive-agents/cgroup.subtree_control")), "+cpu +memory");
        let moved = read(own.join("hive-daemon/cgroup.procs"));
        assert!(moved.lines().any(|l| l == std::process::id().to_string()), "{moved}");

        let applied =
            cgroups.apply("alpha", parse_cpu_quota("200%").unwrap(), parse_memory_max("4G").unwrap());
        let cgroup = own.join("hive-agents/alpha");
        assert_eq!(applied.procs, Some(cgroup.join("cgroup.procs")));
        assert_eq!(
            applied.message,
            format!("cgroup v2: {} (cpu.max 200000 100000, memory.max 4294967296)", cgroup.display())
        );
        assert_eq!(read(cgroup.join("cpu.max")), "200000 100000");
        assert_eq!(read(cgroup.join("memory.max")), "4294967296");

        let unlimited =
            cgroups.apply("alpha", parse_cpu_quota("50%").unwrap(), parse_memory_max("infinity").unwrap());
        assert!(unlimited.procs.is_some(), "{unlimited:?}");
        assert_eq!(read(cgroup.join("cpu.max")), "50000 100000");
        assert_eq!(read(cgroup.join("memory.max")), "max");
    }

    #[test]
    fn a_daemon_restarted_in_its_leaf_keeps_the_same_layout() {
        let fake = FakeCgroupfs::new("cpu memory");
        fs::write(fake.self_cgroup(), "0::/hive.service/hive-daemon\n").unwrap();
        assert_eq!(fake.detect(), Cgroups::Enforced { agents: fake.own().join("hive-agents") });
    }

    #[test]
    fn no_unified_hierarchy_is_not_enforced_with_the_v1_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cgroup");
        fs::create_dir_all(root.join("cpu")).unwrap();
        fs::create_dir_all(root.join("memory")).unwrap();
        let self_cgroup = tmp.path().join("self-cgroup");
        fs::write(&self_cgroup, "4:memory:/x\n0::/\n").unwrap();
        let at = root.display();
        assert_eq!(
            reason(detect(&root, &self_cgroup)),
            format!("cgroup v2 is not mounted at {at} (found a cgroup v1 hierarchy)")
        );

        // This machine's layout: v1 controllers plus a hybrid v2 tree holding only hugetlb.
        fs::create_dir_all(root.join("unified")).unwrap();
        fs::write(root.join("unified/cgroup.controllers"), "hugetlb\n").unwrap();
        assert_eq!(
            reason(detect(&root, &self_cgroup)),
            format!(
                "cgroup v2 is not mounted at {at} (found a cgroup v1 hierarchy; its hybrid cgroup v2 \
                 tree at {at}/unified offers hugetlb, and hive needs cpu and memory in a unified \
                 hierarchy)"
            )
        );

        let missing = tmp.path().join("nowhere");
        assert_eq!(
            reason(detect(&missing, &self_cgroup)),
            format!("cgroup v2 is not mounted at {0} ({0} does not exist)", missing.display())
        );
    }

    #[test]
    fn a_missing_controller_is_not_enforced_and_named() {
        let fake = FakeCgroupfs::new("cpu io pids");
        let reason = reason(fake.detect());
        assert_eq!(
            reason,
            format!(
                "the memory controller is not available to {} (its cgroup.controllers lists: cpu io pids)",
                fake.own().display()
            )
        );
        assert!(!fake.own().join("hive-daemon").exists(), "nothing is touched before the checks pass");

        let none = FakeCgroupfs::new("");
        let reason = super::tests::reason(none.detect());
        assert!(reason.starts_with("the cpu and memory controllers are not available"), "{reason}");
    }

    #[test]
    fn an_unwritable_subtree_control_is_not_enforced_with_its_path() {
        // A directory where the file should be fails every write, for root too
        // (a chmod would not stop root).
        let fake = FakeCgroupfs::new("cpu memory");
        let control = fake.own().join("cgroup.subtree_control");
        fs::remove_file(&control).unwrap();
        fs::create_dir(&control).unwrap();
        let reason = reason(fake.detect());
        assert!(reason.starts_with(&format!("cannot write {}: ", control.display())), "{reason}");
        assert!(reason.to_lowercase().contains("directory"), "{reason}");
    }

    #[test]
    fn a_membership_without_a_v2_entry_is_not_enforced() {
        let fake = FakeCgroupfs::new("cpu memory");
        fs::write(fake.self_cgroup(), "4:memory:/x\n").unwrap();
        let reason = reason(fake.detect());
        assert_eq!(
            reason,
            format!("{} has no cgroup v2 entry (a `0::<path>` line)", fake.self_cgroup().display())
        );
        let gone = fake.tmp.path().join("no-such-file");
        let reason = super::tests::reason(detect(&fake.root(), &gone));
        assert!(reason.starts_with(&format!("cannot read {}: ", gone.display())), "{reason}");
    }

    #[test]
    fn a_failed_agent_write_is_not_enforced_with_its_path() {
        let fake = FakeCgroupfs::new("cpu memory");
        let cgroups = fake.detect();
        let cpu_max = fake.own().join("hive-agents/alpha/cpu.max");
        fs::create_dir_all(&cpu_max).unwrap();
        let applied = cgroups.apply("alpha", CpuMax { quota_us: 1000 }, MemoryMax::Unlimited);
        assert_eq!(applied.procs, None);
        assert!(applied.message.starts_with(&format!("cannot write {}: ", cpu_max.display())), "{applied:?}");
    }

    /// Runs the real detection on this host: it must decide, either way, and say why.
    #[test]
    fn the_real_host_gets_a_decision_with_a_reason() {
        let cgroups = detect(Path::new("/sys/fs/cgroup"), Path::new("/proc/self/cgroup"));
        let message = match &cgroups {
            Cgroups::Enforced { agents } => agents.display().to_string(),
            Cgroups::NotEnforced { reason } => reason.clone(),
        };
        assert!(!message.is_empty(), "{cgroups:?}");
        eprintln!("this host: {cgroups:?}");
    }
}
