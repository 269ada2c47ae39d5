//! Settings of the `nixos-container` runtime: where the meta flake, the unit drop-ins,
//! the container configurations and root filesystems live, the hive-wide limits, and its
//! timeouts.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// Settings of the `nixos-container` runtime.
#[derive(Clone, Debug)]
pub struct NixosConfig {
    /// Root of the meta flake (`<state-dir>/meta`), owned by the meta module; the driver
    /// only names it in flake references (`<meta_dir>#…`).
    pub meta_dir: PathBuf,
    /// Where unit drop-ins go (`container@<c>.service.d/`). Default `/etc/systemd/system`.
    pub systemd_dir: PathBuf,
    /// Where `nixos-container` keeps `<c>.conf` (with its `EXTRA_NSPAWN_FLAGS` line).
    /// Default `/etc/nixos-containers`.
    pub containers_conf_dir: PathBuf,
    /// The containers' root filesystems (`<c>/`), where the fence and the permission files
    /// are written. Default `/var/lib/nixos-containers`.
    pub containers_root: PathBuf,
    /// The per-container profiles (`<c>/system`), read after a create to name its first
    /// generation by its toplevel store path. Default `/nix/var/nix/profiles/per-container`.
    pub profiles_dir: PathBuf,
    /// The `PATH` of every command the driver runs; `None` inherits the daemon's. Tests
    /// put recording stand-ins first here without touching the test process's `PATH`.
    pub path: Option<OsString>,
    /// CPU quota when an agent sets no `spec.resources.cpuQuota` (the hive-wide
    /// `agentCpuQuota`). Default `200%`.
    pub default_cpu_quota: String,
    /// Memory cap when an agent sets no `spec.resources.memoryMax` (the hive-wide
    /// `agentMemoryMax`). Default `4G`.
    pub default_memory_max: String,
    /// How long drain waits for the fence when the agent sets no
    /// `spec.runtime.gracefulStopSeconds`. Default 3 min.
    pub graceful_stop: Duration,
    /// How often the rescan asks systemd about the containers this driver runs, to
    /// publish the ones that went down unrequested. Default 2 s.
    pub rescan_interval: Duration,
    /// The fence file inside a container, relative to its root filesystem. Default
    /// `var/lib/hive/fence` (on the container's disk: `/run` is a tmpfs inside).
    pub fence_path: PathBuf,
    /// The in-container unit of the agent's harness, which the fence kick signals.
    /// Default `hive-harness.service`.
    pub harness_unit: String,
}

impl NixosConfig {
    /// The defaults of a NixOS host, with the meta flake at `meta_dir`.
    pub fn new(meta_dir: impl Into<PathBuf>) -> NixosConfig {
        NixosConfig {
            meta_dir: meta_dir.into(),
            systemd_dir: "/etc/systemd/system".into(),
            containers_conf_dir: "/etc/nixos-containers".into(),
            containers_root: "/var/lib/nixos-containers".into(),
            profiles_dir: "/nix/var/nix/profiles/per-container".into(),
            path: None,
            default_cpu_quota: "200%".into(),
            default_memory_max: "4G".into(),
            graceful_stop: Duration::from_secs(180),
            rescan_interval: Duration::from_secs(2),
            fence_path: "var/lib/hive/fence".into(),
            harness_unit: "hive-harness.service".into(),
        }
    }
}
