//! The `nixos-container` runtime: an agent is a NixOS container `h-<agent>` built from the
//! meta flake (`<meta_dir>#<agent>`, owned by the meta module) and run by systemd as
//! `container@h-<agent>.service`. Every primitive is one or a few host commands, the
//! coordinator document's container lifecycle exactly:
//!
//! - prebuild: `nix build <meta>#nixosConfigurations.<agent>.config.system.build.toplevel
//!   --no-link --print-out-paths` (the bare `<meta>#<agent>` would make nix look in
//!   `packages`); the printed store path is the generation's id.
//! - stop-for-update, stop: `systemctl is-active --quiet container@<c>`, then `systemctl
//!   stop container@<c>` when active (the unit's own stop timeout bounds it).
//! - swap: `is-active` (refused while running), then `nix-env --profile
//!   <profiles>/<c>/system --set <toplevel>`: boot-style, the container's profile set to
//!   exactly the generation given (what `nixos-container update` does after its build),
//!   with no in-container switch. Not `nixos-container update <c> --flake <meta>#<agent>`:
//!   that re-evaluates the meta flake as it is now, so a swap back after a failed deploy
//!   would re-apply the staged new lock, and a Swap would deploy whatever another DAG
//!   locked since its Prebuild. Only a generation that is no store path (none this driver
//!   makes) still goes through `nixos-container update`.
//! - create: `nixos-container create <c> --flake <meta>#<agent>`, atomic (a failed build
//!   leaves no container).
//! - write limits: the drop-in `container@<c>.service.d/hive-limits.conf` and the
//!   `EXTRA_NSPAWN_FLAGS` line of `<c>.conf` (see [`dropin`]), then `systemctl
//!   daemon-reload`.
//! - start: `is-active`, `systemctl start`; when that fails, the cold-start fallback
//!   `systemctl stop`, `systemctl kill --signal=KILL`, `systemctl start`; then `systemctl
//!   show --property=MainPID --value` for the pid.
//! - kill: `is-active`, `systemctl kill --signal=KILL`, then `systemctl stop`.
//! - signal: the fence file, then, when running, `nixos-container run <c> -- sh -c
//!   <KICK_SCRIPT> hive-kick hive-harness.service` ([`KICK_SCRIPT`]: SIGUSR1 to the
//!   harness unit's main process, only when it catches or ignores it).
//! - is-running, observed, rescan: `systemctl show
//!   --property=ActiveState,MainPID,ActiveEnterTimestamp container@<c>`; the observed
//!   generation is the last one this driver installed, else (a daemon that restarted)
//!   the toplevel the container's profile points at: durable, so a rollback finds the
//!   previous generation after a restart too.
//! - destroy: stop, `nixos-container destroy <c>` (when `<c>.conf` exists), the drop-in
//!   directory removed.
//!
//! Container names are limited to 11 characters by `nixos-container` (the host-side
//! interface names `ve-<c>` / `vb-<c>` derive from them), so an agent name of more than 9 characters is an
//! [`Error::Config`] on `metadata.name`, never a truncated (and possibly colliding) name.
//!
//! Kill is followed by a `systemctl stop`: `container@.service` has `Restart=on-failure`,
//! and a SIGKILLed `systemd-nspawn` is a failure systemd would restart; the stop cancels
//! that restart and leaves the unit inactive.
//!
//! The graceful fence is the file `<containers_root>/<c>/var/lib/hive/fence`
//! ([`NixosConfig::fence_path`]), which the harness inside deletes after its
//! stop-checkpoint turn. The kick is NOT `systemctl kill --signal=SIGUSR1
//! container@<c>`: that signals every process of the nspawn unit (`systemd-nspawn`, the
//! container's systemd and every service inside, most of which SIGUSR1 ends). Nor is it
//! `systemctl kill --kill-whom=main --signal=SIGUSR1 hive-harness.service` inside,
//! which ends a harness that does not handle SIGUSR1 before its stop ever sends
//! SIGTERM. It is [`KICK_SCRIPT`], run in the container by `nixos-container run <c> --
//! sh -c <script> hive-kick hive-harness.service`: it asks systemd for the harness
//! unit's main pid, reads that process's `SigCgt` / `SigIgn` masks from
//! `/proc/<pid>/status`, and sends SIGUSR1 to that process only when it catches or
//! ignores it — what the process driver does with a pidfd (see
//! [`crate::runtime::process::kick`]). A shell holds no pidfd, so between its read of
//! `/proc` and its `kill` the harness could exit and its pid be taken; that needs the
//! pid counter to wrap within a few microseconds. A harness that is not kicked (it
//! handles no SIGUSR1, or installs its handler later) finds the fence file itself, or
//! is stopped when the drain runs out. A kick that fails (the container's systemd does
//! not answer) is withheld, not a failed Signal node: the fence is set, and a failed
//! Signal would cancel the stop that follows it. The fence lives on the container's disk, not
//! under `/run`: a booted container has a tmpfs on `/run` (mounted by `systemd-nspawn`)
//! that would hide a host-side `<root>/run/…` from the harness. The harness inside sees
//! it at `/var/lib/hive/fence`.
//!
//! Events: Started, Exited (`requested: true`) and Swapped / Destroyed are published
//! for what the driver does. Crashes are found by the rescan, a task spawned lazily by
//! the first operation that sees a container running (a start, or an is-running /
//! observed that adopts a container an earlier daemon started); every
//! [`NixosConfig::rescan_interval`] it asks systemd about each container it believes
//! running and publishes `Exited { requested: false }` for one that went down without
//! a request. It holds only a weak reference and ends with the runtime.
//! [`NixosRuntime::rescan`] runs one round by hand.

mod command;
mod config;
pub mod dropin;
mod unit;
mod watch;

#[cfg(test)]
mod tests;

pub use self::config::NixosConfig;
pub use self::unit::UnitState;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use hive_api::agent::Agent;
use hive_api::validation;
use tokio::sync::broadcast;

use self::command::CommandLine;
use self::watch::Slot;
use crate::runtime::{
    BuildLog, Change, Drain, Error, Exit, Fallback, Generation, Kick, Limits, LogOptions, LogStream,
    Observed, Result, Runtime, RuntimeEvent, Started,
};

/// The longest container name `nixos-container` accepts.
pub const MAX_CONTAINER_NAME: usize = 11;

/// What every container name starts with.
pub const CONTAINER_PREFIX: &str = "h-";

/// How often [`Runtime::drain`] looks at the fence file.
pub const DRAIN_POLL: Duration = Duration::from_millis(100);

/// How often a drain asks systemd whether the container still runs (a container that
/// went down has no harness left to clear the fence).
pub const DRAIN_RECHECK: Duration = Duration::from_secs(1);

/// The signal that kicks the harness after the fence is set.
pub const FENCE_SIGNAL: &str = "SIGUSR1";

/// The kick, run inside the container as `sh -c KICK_SCRIPT hive-kick <harness unit>`:
/// SIGUSR1 (signal 10, bit 9 of the masks) to the unit's main process only when that
/// process catches or ignores it. It prints one line: `kicked`, or `withheld: <why>`.
/// Only the masks' last four hex digits are used, so no shell's 64-bit arithmetic is
/// needed. POSIX sh and systemctl only: nothing else need be in the container.
pub const KICK_SCRIPT: &str = r#"pid=$(systemctl show --property=MainPID --value "$1") || exit
case $pid in ''|0|*[!0-9]*) echo "withheld: $1 has no main process"; exit 0 ;; esac
cgt= ign=
if [ -r "/proc/$pid/status" ]; then
  while read -r key value; do
    case $key in SigCgt:) cgt=$value ;; SigIgn:) ign=$value ;; esac
  done < "/proc/$pid/status"
fi
case $cgt in ????*) ;; *) cgt=none ;; esac
case $ign in ????*) ;; *) ign=none ;; esac
case $cgt$ign in *[!0-9a-fA-F]*) echo "withheld: cannot read the signal masks of pid $pid"; exit 0 ;; esac
if [ $(( (0x${cgt#"${cgt%????}"} | 0x${ign#"${ign%????}"}) >> 9 & 1 )) -ne 1 ]; then
  echo "withheld: pid $pid does not handle it, and its default action would end the agent"
  exit 0
fi
if kill -s USR1 "$pid"; then echo kicked; else echo "withheld: pid $pid is gone"; fi"#;

/// The container name of agent `agent`: `h-<agent>`, or why it cannot have one.
pub fn container_name(agent: &str) -> Result<String> {
    let config_error =
        |message: String| Error::Config { agent: agent.into(), field: "metadata.name", message };
    validation::dns1123_label(agent).map_err(|why| config_error(format!("{agent:?}: {why}")))?;
    let name = format!("{CONTAINER_PREFIX}{agent}");
    if name.len() > MAX_CONTAINER_NAME {
        return Err(config_error(format!(
            "{agent:?} is too long for the nixosContainer runtime: its container would be {name:?} ({} \
             characters) and nixos-container allows at most {MAX_CONTAINER_NAME}, so agent names are at \
             most {} characters",
            name.len(),
            MAX_CONTAINER_NAME - CONTAINER_PREFIX.len(),
        )));
    }
    Ok(name)
}

/// The `nixos-container` runtime. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct NixosRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    config: NixosConfig,
    slots: Mutex<HashMap<String, Slot>>,
    events: broadcast::Sender<RuntimeEvent>,
    /// Whether the rescan task has been spawned.
    rescan: AtomicBool,
}

/// An agent and its container, checked.
struct Container {
    agent: String,
    name: String,
    unit: String,
}

impl Container {
    fn new(agent: &str) -> Result<Container> {
        let name = container_name(agent)?;
        Ok(Container { agent: agent.into(), unit: format!("container@{name}"), name })
    }
}

impl NixosRuntime {
    /// A runtime with these settings. Nothing runs until an operation is called.
    pub fn new(config: NixosConfig) -> NixosRuntime {
        let (events, _) = broadcast::channel(1024);
        NixosRuntime {
            inner: Arc::new(Inner {
                config,
                slots: Mutex::new(HashMap::new()),
                events,
                rescan: AtomicBool::new(false),
            }),
        }
    }

    /// The runtime's settings.
    pub fn config(&self) -> &NixosConfig {
        &self.inner.config
    }

    /// The limits drop-in of container `container`.
    pub fn dropin_path(&self, container: &str) -> PathBuf {
        self.dropin_dir(container).join(dropin::DROPIN_FILE)
    }

    fn dropin_dir(&self, container: &str) -> PathBuf {
        self.inner.config.systemd_dir.join(format!("container@{container}.service.d"))
    }

    /// `<containers_conf_dir>/<container>.conf`.
    pub fn conf_path(&self, container: &str) -> PathBuf {
        self.inner.config.containers_conf_dir.join(format!("{container}.conf"))
    }

    /// The fence file of container `container`, as the host sees it.
    pub fn fence_path(&self, container: &str) -> PathBuf {
        self.inner.config.containers_root.join(container).join(&self.inner.config.fence_path)
    }

    /// Where the harness of container `container` reads its permissions.
    pub fn permissions_dir(&self, container: &str) -> PathBuf {
        self.inner.config.containers_root.join(container).join("etc/hive")
    }

    fn container(&self, agent: &Agent) -> Result<Container> {
        Container::new(&agent.metadata.name)
    }

    fn graceful(&self, agent: &Agent) -> Duration {
        match agent.spec.runtime.graceful_stop_seconds {
            Some(seconds) => Duration::from_secs(seconds.into()),
            None => self.inner.config.graceful_stop,
        }
    }

    fn path(&self) -> Option<&OsStr> {
        self.inner.config.path.as_deref()
    }

    fn flake(&self, c: &Container) -> std::ffi::OsString {
        let mut flake = self.inner.config.meta_dir.clone().into_os_string();
        flake.push(format!("#{}", c.agent));
        flake
    }

    async fn systemctl(&self, c: &Container, verb: &[&str]) -> Result<String> {
        let line = verb.iter().fold(CommandLine::new("systemctl"), |line, arg| line.arg(*arg)).arg(&c.unit);
        command::run(&c.agent, &line, self.path()).await
    }

    /// `systemctl is-active --quiet container@<c>`: exit 0 is active, any other exit is
    /// not (3 inactive, 4 no such unit); only a failure to launch it is an error.
    async fn is_active(&self, c: &Container) -> Result<bool> {
        let line = CommandLine::new("systemctl").arg("is-active").arg("--quiet").arg(&c.unit);
        Ok(command::output(&c.agent, &line, self.path()).await?.status.success())
    }

    async fn main_pid(&self, c: &Container) -> Result<u32> {
        let out = self.systemctl(c, &["show", "--property=MainPID", "--value"]).await?;
        Ok(out.trim().parse().unwrap_or(0))
    }

    async fn unit_state(&self, c: &Container) -> Result<UnitState> {
        let out = self.systemctl(c, &["show", "--property=ActiveState,MainPID,ActiveEnterTimestamp"]).await?;
        Ok(UnitState::parse(&out))
    }

    /// `<profiles_dir>/<c>/system`: the container's system profile.
    fn profile(&self, container: &str) -> PathBuf {
        self.inner.config.profiles_dir.join(container).join("system")
    }

    /// The toplevel store path `<profiles_dir>/<c>/system` leads to, once installed.
    fn installed_toplevel(&self, container: &str) -> Option<String> {
        let mut path = self.profile(container);
        let mut followed = false;
        // `system` → `system-<n>-link` → `/nix/store/…`; a bound guards against loops.
        for _ in 0..16 {
            let Ok(target) = fs::read_link(&path) else { break };
            path = match path.parent() {
                Some(parent) => parent.join(target),
                None => target,
            };
            followed = true;
        }
        followed.then(|| path.to_string_lossy().into_owned())
    }

    fn publish(&self, agent: &str, change: Change) {
        self.inner.publish(agent, change, crate::host::now());
    }

    /// See [`Runtime::prebuild`].
    pub async fn prebuild(&self, agent: &Agent, log: &dyn BuildLog) -> Result<Generation> {
        let c = self.container(agent)?;
        let mut attr = self.inner.config.meta_dir.clone().into_os_string();
        attr.push(format!("#nixosConfigurations.{}.config.system.build.toplevel", c.agent));
        let line = CommandLine::new("nix").arg("build").arg(attr).arg("--no-link").arg("--print-out-paths");
        let printed = command::run_logged(&c.agent, &line, self.path(), log).await?;
        let Some(id) = printed.iter().rev().map(|l| l.trim()).find(|l| !l.is_empty()) else {
            return Err(command::failed(
                &c.agent,
                &line,
                "exit status: 0".into(),
                "printed no store path".into(),
            ));
        };
        log.line(&format!("built {id}"));
        Ok(Generation { id: id.to_string(), rev: agent.spec.config.rev.clone().unwrap_or_default() })
    }

    /// See [`Runtime::stop_for_update`] and [`Runtime::stop`]: systemd's own stop
    /// timeout of the container's unit bounds it.
    pub async fn stop(&self, agent: &Agent) -> Result<()> {
        let c = self.container(agent)?;
        if !self.is_active(&c).await? {
            return Ok(());
        }
        let busy = self.inner.begin(&c);
        self.systemctl(&c, &["stop"]).await?;
        let exit =
            Exit { code: None, signal: None, at: crate::host::now(), requested: true, stderr: Vec::new() };
        busy.stopped(&exit);
        drop(busy);
        tracing::info!(agent = %c.agent, container = %c.name, "container stopped");
        self.inner.publish(&c.agent, Change::Exited(exit.clone()), exit.at);
        Ok(())
    }

    /// See [`Runtime::kill`].
    pub async fn kill(&self, agent: &Agent) -> Result<()> {
        let c = self.container(agent)?;
        if !self.is_active(&c).await? {
            return Ok(());
        }
        let busy = self.inner.begin(&c);
        self.systemctl(&c, &["kill", "--signal=KILL"]).await?;
        // Cancels the restart `Restart=on-failure` schedules for a killed nspawn.
        self.systemctl(&c, &["stop"]).await?;
        let exit =
            Exit { code: None, signal: Some(9), at: crate::host::now(), requested: true, stderr: Vec::new() };
        busy.stopped(&exit);
        drop(busy);
        tracing::info!(agent = %c.agent, container = %c.name, "container killed");
        self.inner.publish(&c.agent, Change::Exited(exit.clone()), exit.at);
        Ok(())
    }

    /// See [`Runtime::swap`].
    pub async fn swap(&self, agent: &Agent, generation: &Generation) -> Result<()> {
        let c = self.container(agent)?;
        if self.is_active(&c).await? {
            let pid = self.main_pid(&c).await?;
            return Err(Error::NotStopped { agent: c.agent, pid });
        }
        let line = if generation.id.starts_with("/nix/store/") {
            CommandLine::new("nix-env")
                .arg("--profile")
                .arg(self.profile(&c.name))
                .arg("--set")
                .arg(&generation.id)
        } else {
            CommandLine::new("nixos-container").arg("update").arg(&c.name).arg("--flake").arg(self.flake(&c))
        };
        command::run(&c.agent, &line, self.path()).await?;
        self.inner.slots().entry(c.agent.clone()).or_default().generation = Some(generation.clone());
        self.publish(&c.agent, Change::Swapped(generation.clone()));
        Ok(())
    }

    /// See [`Runtime::create`]. The generation is named by the toplevel the new
    /// container's profile points at (the flake reference when it cannot be read).
    pub async fn create(&self, agent: &Agent, log: &dyn BuildLog) -> Result<Generation> {
        let c = self.container(agent)?;
        let flake = self.flake(&c);
        let line = CommandLine::new("nixos-container").arg("create").arg(&c.name).arg("--flake").arg(&flake);
        command::run_logged(&c.agent, &line, self.path(), log).await?;
        let id = self.installed_toplevel(&c.name).unwrap_or_else(|| {
            tracing::warn!(agent = %c.agent, container = %c.name, "cannot read the new container's profile");
            flake.to_string_lossy().into_owned()
        });
        let generation = Generation { id, rev: agent.spec.config.rev.clone().unwrap_or_default() };
        self.inner.slots().entry(c.agent.clone()).or_default().generation = Some(generation.clone());
        self.publish(&c.agent, Change::Swapped(generation.clone()));
        Ok(generation)
    }

    /// See [`Runtime::start`]: with the cold-start fallback.
    pub async fn start(&self, agent: &Agent) -> Result<Started> {
        self.start_with(agent, Fallback::ColdStart).await
    }

    /// See [`Runtime::start_with`].
    pub async fn start_with(&self, agent: &Agent, fallback: Fallback) -> Result<Started> {
        let c = self.container(agent)?;
        if self.is_active(&c).await? {
            let pid = self.main_pid(&c).await?;
            self.adopt(&c);
            return Ok(Started { pid, recovered_from: None });
        }
        let conf = self.conf_path(&c.name);
        if !conf.exists() {
            // Not created (or destroyed): no start can help, so no fallback either.
            return Err(Error::NoGeneration { agent: c.agent, path: conf });
        }
        self.clear_fence(&c)?;
        let busy = self.inner.begin(&c);
        // Not running now: whatever ended an earlier run, this start supersedes it.
        busy.not_running();
        let recovered_from = match self.systemctl(&c, &["start"]).await {
            Ok(_) => None,
            Err(error @ Error::Spawn { .. }) => return Err(error),
            Err(error) if fallback == Fallback::Never => return Err(error),
            Err(first) => {
                tracing::warn!(agent = %c.agent, error = %first, "start failed; cold-start fallback");
                if let Err(second) = self.cold_start(&c).await {
                    return Err(Error::ColdStart {
                        agent: c.agent,
                        first: Box::new(first),
                        second: Box::new(second),
                    });
                }
                Some(Box::new(first))
            }
        };
        let at = crate::host::now();
        busy.running(at);
        drop(busy);
        self.ensure_rescan();
        let pid = self.main_pid(&c).await?;
        tracing::info!(agent = %c.agent, container = %c.name, pid, "container started");
        self.inner.publish(&c.agent, Change::Started { pid }, at);
        Ok(Started { pid, recovered_from })
    }

    /// The cold-start fallback: stop (graceful), kill (whatever lingers), start clean.
    async fn cold_start(&self, c: &Container) -> Result<()> {
        self.systemctl(c, &["stop"]).await?;
        if let Err(error) = self.systemctl(c, &["kill", "--signal=KILL"]).await {
            // A stopped unit may have nothing left to kill, which systemd reports.
            tracing::info!(agent = %c.agent, %error, "nothing killed after the stop");
        }
        self.systemctl(c, &["start"]).await?;
        Ok(())
    }

    /// Removes a fence an earlier stop left: a fresh start is unfenced.
    fn clear_fence(&self, c: &Container) -> Result<()> {
        let fence = self.fence_path(&c.name);
        match fs::remove_file(&fence) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => {
                Err(Error::Io { agent: c.agent.clone(), action: "cannot remove", path: fence, source })
            }
        }
    }

    /// See [`Runtime::signal`]: the fence first, so a harness that is not kicked still
    /// finds it; then [`KICK_SCRIPT`] in the container.
    pub async fn signal(&self, agent: &Agent) -> Result<Kick> {
        let c = self.container(agent)?;
        let fence = self.fence_path(&c.name);
        write_atomically(&c.agent, &fence, b"")?;
        if !self.is_active(&c).await? {
            return Ok(Kick::NotRunning);
        }
        let line = CommandLine::new("nixos-container")
            .arg("run")
            .arg(&c.name)
            .arg("--")
            .arg("sh")
            .arg("-c")
            .arg(KICK_SCRIPT)
            .arg("hive-kick")
            .arg(&self.inner.config.harness_unit);
        let kick = match command::run(&c.agent, &line, self.path()).await {
            Ok(out) => match out.trim() {
                "kicked" => Kick::Sent,
                answer => Kick::Withheld(match answer.strip_prefix("withheld: ") {
                    Some(why) => why.to_string(),
                    None => format!("the kick answered {answer:?}"),
                }),
            },
            Err(error) => Kick::Withheld(format!("the kick failed: {error}")),
        };
        if let Kick::Withheld(why) = &kick {
            tracing::info!(agent = %c.agent, container = %c.name, %why, "fence set; SIGUSR1 withheld");
        }
        Ok(kick)
    }

    /// See [`Runtime::drain`].
    pub async fn drain(&self, agent: &Agent) -> Result<Drain> {
        let c = self.container(agent)?;
        let fence = self.fence_path(&c.name);
        if !fence.exists() || !self.is_active(&c).await? {
            return Ok(Drain::Drained);
        }
        let started = tokio::time::Instant::now();
        let deadline = started + self.graceful(agent);
        let mut recheck = started + DRAIN_RECHECK;
        loop {
            if !fence.exists() {
                return Ok(Drain::Drained);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                tracing::info!(agent = %c.agent, "drain timed out with the fence still set");
                return Ok(Drain::TimedOut);
            }
            if now >= recheck {
                if !self.is_active(&c).await? {
                    return Ok(Drain::Drained);
                }
                recheck = tokio::time::Instant::now() + DRAIN_RECHECK;
            }
            tokio::time::sleep(DRAIN_POLL.min(deadline - now)).await;
        }
    }

    /// See [`Runtime::write_limits`]: validates the limits and the nspawn flags, writes
    /// the drop-in and the flags line, then reloads systemd.
    pub async fn write_limits(&self, agent: &Agent) -> Result<Limits> {
        let c = self.container(agent)?;
        let (cpu_quota, memory_max) = dropin::limits(agent, &self.inner.config)?;
        let flags = dropin::flags_line(agent)?;
        let conf = self.conf_path(&c.name);
        let text = match fs::read_to_string(&conf) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Writing it would make a container record `nixos-container` never created.
                return Err(Error::NoGeneration { agent: c.agent, path: conf });
            }
            Err(source) => {
                return Err(Error::Io { agent: c.agent, action: "cannot read", path: conf, source })
            }
        };
        let dropin_path = self.dropin_path(&c.name);
        write_atomically(&c.agent, &dropin_path, dropin::dropin(&cpu_quota, &memory_max).as_bytes())?;
        write_atomically(&c.agent, &conf, dropin::replace_flags_line(&text, &flags).as_bytes())?;
        let reload = CommandLine::new("systemctl").arg("daemon-reload");
        command::run(&c.agent, &reload, self.path()).await?;
        // Enforced only when systemd says the unit took the drop-in.
        let shown = self.systemctl(&c, &["show", dropin::SHOW_LIMITS]).await;
        let verified = shown
            .map_err(|e| e.to_string())
            .and_then(|shown| dropin::verify(&shown, &cpu_quota, &memory_max));
        let (enforced, message) = match verified {
            Ok(()) => (true, format!("systemd drop-in {}", dropin_path.display())),
            Err(why) => (false, format!("systemd drop-in {} written, but {why}", dropin_path.display())),
        };
        Ok(Limits { cpu_quota, memory_max, enforced, message })
    }

    /// See [`Runtime::write_permissions`]: `tool-groups.json` and `capabilities.json`
    /// (JSON arrays of strings) in the container's `/etc/hive`.
    pub async fn write_permissions(&self, agent: &Agent) -> Result<()> {
        let c = self.container(agent)?;
        let dir = self.permissions_dir(&c.name);
        let permissions = &agent.spec.permissions;
        for (file, values) in
            [("tool-groups.json", &permissions.tool_groups), ("capabilities.json", &permissions.capabilities)]
        {
            let text = serde_json::to_string_pretty(values).expect("strings serialize") + "\n";
            write_atomically(&c.agent, &dir.join(file), text.as_bytes())?;
        }
        Ok(())
    }

    /// See [`Runtime::is_running`].
    pub async fn is_running(&self, agent: &Agent) -> Result<bool> {
        let c = self.container(agent)?;
        let epoch = self.inner.epoch(&c.agent);
        let state = self.unit_state(&c).await?;
        self.noticed(&c, epoch, &state);
        Ok(state.running())
    }

    /// See [`Runtime::observed`].
    pub async fn observed(&self, agent: &Agent) -> Result<Observed> {
        let c = self.container(agent)?;
        let epoch = self.inner.epoch(&c.agent);
        let state = self.unit_state(&c).await?;
        self.noticed(&c, epoch, &state);
        let installed = || {
            // The rev is not on disk here; the executor knows it from the applied marker.
            self.installed_toplevel(&c.name).map(|id| Generation { id, rev: String::new() })
        };
        let slots = self.inner.slots();
        let slot = slots.get(&c.agent);
        let since = slot.and_then(|s| s.since);
        let generation = slot.and_then(|s| s.generation.clone());
        Ok(Observed {
            agent: c.agent.clone(),
            power: state.power(),
            pid: state.pid(),
            generation: generation.or_else(installed),
            since: if state.running() { state.active_enter.or(since) } else { since },
            last_exit: slot.and_then(|s| s.last_exit.clone()),
        })
    }

    /// See [`Runtime::destroy`].
    pub async fn destroy(&self, agent: &Agent) -> Result<()> {
        let c = self.container(agent)?;
        self.stop(agent).await?;
        if self.conf_path(&c.name).exists() {
            let line = CommandLine::new("nixos-container").arg("destroy").arg(&c.name);
            command::run(&c.agent, &line, self.path()).await?;
        }
        let dir = self.dropin_dir(&c.name);
        match fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::Io { agent: c.agent, action: "cannot remove", path: dir, source })
            }
        }
        self.inner.slots().remove(&c.agent);
        self.publish(&c.agent, Change::Destroyed);
        Ok(())
    }
}

/// Writes `contents` to `path` atomically and durably (a synced temp file beside it,
/// then a rename and a sync of the directory), creating its directory.
fn write_atomically(agent: &str, path: &Path, contents: &[u8]) -> Result<()> {
    let io =
        |action, path: &Path, source| Error::Io { agent: agent.into(), action, path: path.into(), source };
    crate::durable::write_atomic(path, contents, 0o644).map_err(|e| io("cannot write", path, e))
}

impl Runtime for NixosRuntime {
    fn prebuild<'a>(&'a self, agent: &'a Agent, log: &'a dyn BuildLog) -> BoxFuture<'a, Result<Generation>> {
        Box::pin(NixosRuntime::prebuild(self, agent, log))
    }

    fn stop_for_update<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(NixosRuntime::stop(self, agent))
    }

    fn swap<'a>(&'a self, agent: &'a Agent, generation: &'a Generation) -> BoxFuture<'a, Result<()>> {
        Box::pin(NixosRuntime::swap(self, agent, generation))
    }

    fn create<'a>(&'a self, agent: &'a Agent, log: &'a dyn BuildLog) -> BoxFuture<'a, Result<Generation>> {
        Box::pin(NixosRuntime::create(self, agent, log))
    }

    fn start_with<'a>(&'a self, agent: &'a Agent, fallback: Fallback) -> BoxFuture<'a, Result<Started>> {
        Box::pin(NixosRuntime::start_with(self, agent, fallback))
    }

    fn stop<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(NixosRuntime::stop(self, agent))
    }

    fn kill<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(NixosRuntime::kill(self, agent))
    }

    fn signal<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Kick>> {
        Box::pin(NixosRuntime::signal(self, agent))
    }

    fn drain<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Drain>> {
        Box::pin(NixosRuntime::drain(self, agent))
    }

    fn write_limits<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Limits>> {
        Box::pin(NixosRuntime::write_limits(self, agent))
    }

    fn write_permissions<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(NixosRuntime::write_permissions(self, agent))
    }

    fn is_running<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<bool>> {
        Box::pin(NixosRuntime::is_running(self, agent))
    }

    fn observed<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Observed>> {
        Box::pin(NixosRuntime::observed(self, agent))
    }

    fn destroy<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(NixosRuntime::destroy(self, agent))
    }

    fn installed(&self, agent: &str) -> bool {
        container_name(agent).map(|c| self.conf_path(&c).exists()).unwrap_or(false)
    }

    fn running_now(&self, agent: &str) -> bool {
        self.inner.slots().get(agent).is_some_and(|s| s.watched)
    }

    fn logs<'a>(&'a self, agent: &'a str, options: LogOptions) -> BoxFuture<'a, Result<LogStream>> {
        Box::pin(async move {
            let c = Container::new(agent)?;
            let command = journal_command(&c.name, &options).join(" ");
            Err(Error::LogsElsewhere {
                agent: c.agent,
                hint: format!(
                    "runs in a NixOS container: its output is in the container's journal ({command})"
                ),
            })
        })
    }

    fn attach<'a>(&'a self, agents: &'a (dyn Fn() -> Vec<Agent> + Send + Sync)) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            for agent in &agents() {
                if let Err(err) = NixosRuntime::is_running(self, agent).await {
                    tracing::warn!(agent = agent.metadata.name, error = %err, "container state unknown");
                }
            }
            self.ensure_rescan();
        })
    }

    fn agents_outlive_daemon(&self) -> bool {
        true
    }

    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.inner.events.subscribe()
    }
}

/// The `journalctl` command that reads what `options` ask of container `name`'s journal:
/// the container's boots are its runs, so the previous run is boot `-1`; timestamps are
/// journald's `short-iso-precise` (microseconds); since, tail and follow map one to one.
/// The daemon reads no journal itself, so the log route answers with this command.
pub fn journal_command(name: &str, options: &LogOptions) -> Vec<String> {
    let mut command: Vec<String> = vec!["journalctl".into(), "-M".into(), name.into()];
    if options.previous {
        command.extend(["-b".into(), "-1".into()]);
    }
    if let Some(since) = options.since {
        command.push(format!("--since='{}'", since.format("%Y-%m-%d %H:%M:%S UTC")));
    }
    if let Some(n) = options.tail {
        command.push(format!("-n {n}"));
    }
    command.extend(["-o".into(), if options.timestamps { "short-iso-precise" } else { "cat" }.into()]);
    if options.follow && !options.previous {
        command.push("-f".into());
    }
    command
}
