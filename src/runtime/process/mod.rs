//! The `process` runtime, the embedded default: an agent is a supervised local process
//! tree whose configuration lives in a git repository. Prebuild checks the wanted rev
//! out into a new generation and builds it while the current generation keeps serving;
//! swap flips the `current` symlink atomically; the agent runs in its own process group
//! with its output in a rotating log; its exits are published the moment they happen.
//!
//! The graceful fence: [`Runtime::signal`] creates the file `<root>/<agent>/fence`
//! (the agent finds its path in `HIVE_FENCE`) and kicks the agent's main process with
//! [`FENCE_SIGNAL`] (SIGUSR1) — only the main process, not its group, and only when it
//! catches or ignores the signal, since SIGUSR1 ends a process that does not handle it
//! (see [`kick`]). The harness runs one stop-checkpoint turn and removes the file;
//! [`Runtime::drain`] waits for that, checking the file every [`DRAIN_POLL`] (a file
//! has no cheaper portable change notification), bounded by the graceful-stop timeout.
//! An agent that handles no SIGUSR1 is not kicked: it sees the file itself, or the
//! drain runs out and the stop's SIGTERM ends it.
//!
//! Resource limits (`spec.resources`, else the hive-wide defaults of
//! [`ProcessConfig`]) are enforced with cgroup v2 when the host allows it: the agent's
//! own cgroup gets `cpu.max` and `memory.max`, and its process joins that cgroup before
//! it runs any agent code (see [`limits`] for the layout and the once-per-runtime
//! decision). When the host does not allow it, they are not enforced and
//! [`Runtime::write_limits`] says exactly why. Either way they are written to
//! `<root>/<agent>/limits.json` (`cpuQuota`, `memoryMax` as in the spec, `enforced`,
//! `message`) and permissions to `permissions.json` (`toolGroups`, `capabilities`);
//! their paths are in `HIVE_LIMITS` and `HIVE_PERMISSIONS`.

mod config;
pub mod generation;
pub mod git;
pub mod kick;
pub mod limits;
pub mod log_format;
mod log_reader;
pub mod logs;
mod orphans;
pub mod supervisor;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

pub use self::config::ProcessConfig;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use chrono::Utc;
use futures_util::future::BoxFuture;
use hive_api::agent::{Agent, Power, ProcessRuntime as ProcessSettings};
use rustix::process::Signal;
use serde_json::json;
use tokio::sync::{broadcast, watch};

use self::generation::{generation_id, AgentDir, REV_FILE};
use self::limits::Cgroups;
use self::supervisor::{signal_error, signal_group, Running, SpawnRequest};
use crate::runtime::{
    BuildLog, Change, Drain, Error, Exit, Fallback, Generation, Kick, Limits, LogOptions, LogStream,
    Observed, Result, Runtime, RuntimeEvent, Started,
};

/// The signal that kicks an agent's harness after the fence is set.
pub const FENCE_SIGNAL: &str = "SIGUSR1";

/// How often [`Runtime::drain`] looks at the fence file.
pub const DRAIN_POLL: Duration = Duration::from_millis(50);

/// The process runtime. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct ProcessRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    config: ProcessConfig,
    agents: Mutex<HashMap<String, Slot>>,
    /// Serializes prebuilds of one agent (mirror fetch and generation numbering);
    /// prebuild is lease-exempt, so two Jobs may build one agent at once.
    builds: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Serializes starts of one agent: two callers asking at once (crash-watch's restart
    /// and a Job's start, or a fleet node's worker serving both) launch it once, and the
    /// second is answered with the running pid.
    starts: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    events: broadcast::Sender<RuntimeEvent>,
    /// Per agent, ticked by its supervisor after each append to its log, so a followed
    /// log sends a line when it is written instead of at the reader's next poll.
    appended: Mutex<HashMap<String, watch::Sender<()>>>,
    /// Whether limits can be enforced, decided on first need (see [`limits::detect`]).
    cgroups: OnceLock<Cgroups>,
    /// Per agent, why its limits were last said not to be enforced: a start says it
    /// again only when the reason changed (issue 32: it was every start, a crash loop's too).
    unenforced_said: Mutex<HashMap<String, String>>,
}

/// What the runtime knows of one agent's process.
#[derive(Default)]
struct Slot {
    running: Option<Running>,
    last_exit: Option<Exit>,
    since: Option<chrono::DateTime<Utc>>,
}

impl ProcessRuntime {
    /// A runtime keeping its agents under `config.root` (created on first use).
    pub fn new(config: ProcessConfig) -> ProcessRuntime {
        let (events, _) = broadcast::channel(1024);
        ProcessRuntime {
            inner: Arc::new(Inner {
                config,
                agents: Mutex::new(HashMap::new()),
                builds: Mutex::new(HashMap::new()),
                starts: Mutex::new(HashMap::new()),
                events,
                appended: Mutex::new(HashMap::new()),
                cgroups: OnceLock::new(),
                unenforced_said: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The runtime's settings.
    pub fn config(&self) -> &ProcessConfig {
        &self.inner.config
    }

    /// The directory of agent `name`.
    pub fn agent_dir(&self, name: &str) -> PathBuf {
        self.inner.config.root.join(name)
    }

    /// The agent's log files, oldest first (what `hive logs agent/NAME` reads).
    pub fn log_files(&self, name: &str) -> Vec<PathBuf> {
        logs::log_files(&AgentDir::new(&self.inner.config.root, name).logs())
    }

    /// The agent's directories, after checking its name is a plain path component.
    fn dir(&self, agent: &Agent) -> Result<AgentDir> {
        let name = &agent.metadata.name;
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::Config {
                agent: name.clone(),
                field: "metadata.name",
                message: "must be a single path component".into(),
            });
        }
        Ok(AgentDir::new(&self.inner.config.root, name))
    }

    /// Whether this runtime enforces limits, detected once: the detection moves the
    /// daemon between cgroups, so it happens on the first write of limits or start, never
    /// at construction.
    pub fn cgroups(&self) -> &Cgroups {
        self.inner.cgroups.get_or_init(|| {
            let config = &self.inner.config;
            let cgroups = limits::detect(&config.cgroup_root, &config.self_cgroup);
            match &cgroups {
                Cgroups::Enforced { agents } => {
                    tracing::info!(cgroup = %agents.display(), "agent resource limits are enforced with cgroup v2")
                }
                Cgroups::NotEnforced { reason } => {
                    tracing::warn!(%reason, "agent resource limits are NOT enforced")
                }
            }
            cgroups
        })
    }

    fn graceful(&self, agent: &Agent) -> Duration {
        match agent.spec.runtime.graceful_stop_seconds {
            Some(seconds) => Duration::from_secs(seconds.into()),
            None => self.inner.config.graceful_stop,
        }
    }

    fn running(&self, name: &str) -> Option<Running> {
        self.inner.slots().get(name).and_then(|slot| slot.running.clone())
    }

    fn publish(&self, agent: &str, change: Change) {
        let _ = self.inner.events.send(RuntimeEvent { agent: agent.into(), change, at: crate::host::now() });
    }

    /// Prebuild under the agent's build lock; see [`Runtime::prebuild`].
    pub async fn prebuild(&self, agent: &Agent, log: &dyn BuildLog) -> Result<Generation> {
        let dir = self.dir(agent)?;
        let settings = settings(agent)?;
        let lock = {
            let mut builds = self.inner.builds.lock().unwrap_or_else(|e| e.into_inner());
            builds.entry(dir.agent.clone()).or_default().clone()
        };
        let _guard = lock.lock().await;
        let generations = dir.generations();
        fs::create_dir_all(&generations).map_err(|e| dir.io("cannot create", &generations, e))?;
        dir.remove_incomplete()?;
        git::sync_mirror(&dir.agent, &agent.spec.config.repo, &dir.mirror(), log).await?;
        let sha = git::resolve(&dir.agent, &dir.mirror(), agent.spec.config.rev.as_deref(), log).await?;
        let id = generation_id(dir.next_number(), &sha);
        let path = dir.generation(&id);
        log.line(&format!("building generation {id} of agent {:?} from {sha}", dir.agent));
        match self.build(&dir, agent, settings, &sha, &path, log).await {
            Ok(()) => {
                dir.prune(self.inner.config.keep_generations)?;
                log.line(&format!("generation {id} built"));
                Ok(Generation { id, rev: sha })
            }
            Err(error) => {
                // The half-built generation goes; the running one was never touched.
                let _ = fs::remove_dir_all(&path);
                Err(error)
            }
        }
    }

    async fn build(
        &self,
        dir: &AgentDir,
        agent: &Agent,
        settings: &ProcessSettings,
        sha: &str,
        path: &Path,
        log: &dyn BuildLog,
    ) -> Result<()> {
        git::checkout(&dir.agent, &dir.mirror(), sha, path, log).await?;
        let workdir = supervisor::workdir(path, agent.spec.config.dir.as_deref());
        if !workdir.is_dir() {
            return Err(Error::Config {
                agent: dir.agent.clone(),
                field: "spec.config.dir",
                message: format!("{} is not a directory at {sha}", workdir.display()),
            });
        }
        if !settings.build.is_empty() {
            generation::run_build(&dir.agent, &settings.build, &workdir, &settings.env, log).await?;
        }
        // The rev file marks the generation complete, so what the checkout and the build
        // wrote (git syncs none of a work tree's files) is on disk before it: one syncfs
        // of the file system that holds the generation, then the marker, durably.
        let synced = fs::File::open(path).and_then(|root| rustix::fs::syncfs(&root).map_err(Into::into));
        synced.map_err(|e| dir.io("cannot sync", path, e))?;
        let rev_file = path.join(REV_FILE);
        crate::durable::write_atomic(&rev_file, format!("{sha}\n").as_bytes(), 0o644)
            .map_err(|e| dir.io("cannot write", &rev_file, e))
    }

    /// First spawn; see [`Runtime::create`].
    pub async fn create(&self, agent: &Agent, log: &dyn BuildLog) -> Result<Generation> {
        let dir = self.dir(agent)?;
        let fresh = !dir.path.exists();
        let created = async {
            let generation = self.prebuild(agent, log).await?;
            dir.switch_current(&generation.id)?;
            Ok(generation)
        }
        .await;
        match created {
            Ok(generation) => {
                self.publish(&dir.agent, Change::Swapped(generation.clone()));
                Ok(generation)
            }
            Err(error) => {
                if fresh {
                    let _ = fs::remove_dir_all(&dir.path);
                }
                Err(error)
            }
        }
    }

    /// See [`Runtime::swap`].
    pub async fn swap(&self, agent: &Agent, generation: &Generation) -> Result<()> {
        let dir = self.dir(agent)?;
        if let Some(running) = self.running(&dir.agent) {
            return Err(Error::NotStopped { agent: dir.agent, pid: running.pid });
        }
        dir.switch_current(&generation.id)?;
        self.publish(&dir.agent, Change::Swapped(generation.clone()));
        Ok(())
    }

    /// See [`Runtime::start`]: with the cold-start fallback.
    pub async fn start(&self, agent: &Agent) -> Result<Started> {
        self.start_with(agent, Fallback::ColdStart).await
    }

    /// See [`Runtime::start_with`].
    pub async fn start_with(&self, agent: &Agent, fallback: Fallback) -> Result<Started> {
        let dir = self.dir(agent)?;
        let lock = {
            let mut starts = self.inner.starts.lock().unwrap_or_else(|e| e.into_inner());
            starts.entry(dir.agent.clone()).or_default().clone()
        };
        let _guard = lock.lock().await;
        if let Some(running) = self.running(&dir.agent) {
            return Ok(Started { pid: running.pid, recovered_from: None });
        }
        let first = match self.start_once(agent, &dir).await {
            Ok(pid) => return Ok(Started { pid, recovered_from: None }),
            // Missing settings or generation are not failed starts: retrying cannot help.
            Err(error @ (Error::Config { .. } | Error::NoGeneration { .. })) => return Err(error),
            Err(error) if fallback == Fallback::Never => return Err(error),
            Err(error) => error,
        };
        tracing::warn!(agent = %dir.agent, error = %first, "start failed; cold-start fallback");
        let second = async {
            self.stop(agent).await?;
            self.kill(agent).await?;
            self.start_once(agent, &dir).await
        }
        .await;
        match second {
            Ok(pid) => Ok(Started { pid, recovered_from: Some(Box::new(first)) }),
            Err(second) => {
                Err(Error::ColdStart { agent: dir.agent, first: Box::new(first), second: Box::new(second) })
            }
        }
    }

    /// One start attempt: spawn in the current generation, then watch it through the
    /// start grace period.
    async fn start_once(&self, agent: &Agent, dir: &AgentDir) -> Result<u32> {
        let settings = settings(agent)?;
        let link = dir.current_link();
        let Some(generation) = dir.current() else {
            return Err(Error::NoGeneration { agent: dir.agent.clone(), path: link });
        };
        let workdir = supervisor::workdir(&dir.generation(&generation.id), agent.spec.config.dir.as_deref());
        let fence = dir.fence();
        // A fresh process starts unfenced; a fence left by an earlier stop is stale.
        match fs::remove_file(&fence) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(dir.io("cannot remove", &fence, e)),
        }
        // Limits are (re)applied at every start, so an agent started without a write of
        // its limits (boot reconcile, crash restart) is capped all the same.
        let (limits, cgroup_procs) = self.apply_limits(agent, dir)?;
        if !limits.enforced {
            let mut said = self.inner.unenforced_said.lock().unwrap_or_else(|e| e.into_inner());
            if said.get(&dir.agent) != Some(&limits.message) {
                tracing::warn!(agent = %dir.agent, reason = %limits.message, "starting without enforced limits");
                said.insert(dir.agent.clone(), limits.message.clone());
            } else {
                tracing::debug!(agent = %dir.agent, "starting without enforced limits, as before");
            }
        }
        let mut env = settings.env.clone();
        env.insert("HIVE_LIMITS".into(), dir.path.join("limits.json").to_string_lossy().into_owned());
        env.insert(
            "HIVE_PERMISSIONS".into(),
            dir.path.join("permissions.json").to_string_lossy().into_owned(),
        );
        let config = &self.inner.config;
        let request = SpawnRequest {
            agent: &dir.agent,
            argv: &settings.command,
            dir: &workdir,
            env: &env,
            fence: &fence,
            logs: &dir.logs(),
            log_max_bytes: config.log_max_bytes,
            log_files: config.log_files,
            generation: Some(generation),
            cgroup_procs: cgroup_procs.as_deref(),
            appended: self.inner.appends_of(&dir.agent),
            // The agents live in `<state-dir>/agents`.
            state_dir: config.root.parent(),
        };
        let running = {
            // Held across spawn and insert, so the supervisor's exit bookkeeping
            // always finds the process it reaps in the table.
            let mut slots = self.inner.slots();
            let weak = Arc::downgrade(&self.inner);
            let name = dir.agent.clone();
            let pid_file = dir.pid_file();
            let running =
                supervisor::spawn(request, move |exit| Inner::exited(weak, &name, &pid_file, exit))?;
            // The pid file lets a later daemon find this process if this one dies
            // (see `kill_orphans`); written and removed under the table lock.
            let ticks = running.start_ticks.unwrap_or(0);
            if let Err(error) = fs::write(dir.pid_file(), format!("{} {ticks}\n", running.pid)) {
                tracing::warn!(agent = %dir.agent, %error, "cannot write the pid file");
            }
            let slot = slots.entry(dir.agent.clone()).or_default();
            slot.since = Some(running.since);
            slot.running = Some(running.clone());
            self.publish(&dir.agent, Change::Started { pid: running.pid });
            running
        };
        match running.wait_exit(config.start_grace).await {
            None => Ok(running.pid),
            Some(exit) => Err(Error::StartExited {
                agent: dir.agent.clone(),
                command: settings.command.join(" "),
                dir: workdir,
                exit: Box::new(exit),
                log: dir.logs().join(logs::LOG_FILE),
            }),
        }
    }

    /// See [`Runtime::stop`].
    pub async fn stop(&self, agent: &Agent) -> Result<()> {
        let dir = self.dir(agent)?;
        let Some(running) = self.running(&dir.agent) else { return Ok(()) };
        running.stop_requested.store(true, Ordering::SeqCst);
        signal_group(running.pid, Signal::TERM)
            .map_err(|e| signal_error(&dir.agent, "SIGTERM", running.pid, e))?;
        let graceful = self.graceful(agent);
        if running.wait_exit(graceful).await.is_some() {
            return Ok(());
        }
        tracing::warn!(agent = %dir.agent, pid = running.pid, ?graceful, "still running after SIGTERM; killing");
        self.kill_running(&dir.agent, running).await
    }

    /// See [`Runtime::kill`].
    pub async fn kill(&self, agent: &Agent) -> Result<()> {
        let dir = self.dir(agent)?;
        let Some(running) = self.running(&dir.agent) else { return Ok(()) };
        self.kill_running(&dir.agent, running).await
    }

    async fn kill_running(&self, name: &str, running: Running) -> Result<()> {
        running.stop_requested.store(true, Ordering::SeqCst);
        signal_group(running.pid, Signal::KILL).map_err(|e| signal_error(name, "SIGKILL", running.pid, e))?;
        let after = self.inner.config.kill_wait;
        match running.wait_exit(after).await {
            Some(_) => Ok(()),
            None => Err(Error::Unkillable { agent: name.into(), pid: running.pid, after }),
        }
    }

    /// See [`Runtime::signal`]: the fence first, so a harness that is not kicked (it
    /// handles no SIGUSR1, or installs its handler only later) still finds it.
    pub async fn signal(&self, agent: &Agent) -> Result<Kick> {
        let dir = self.dir(agent)?;
        fs::create_dir_all(&dir.path).map_err(|e| dir.io("cannot create", &dir.path, e))?;
        let fence = dir.fence();
        fs::write(&fence, b"").map_err(|e| dir.io("cannot write", &fence, e))?;
        let Some(running) = self.running(&dir.agent) else { return Ok(Kick::NotRunning) };
        Ok(match kick::kick(running.pid, running.start_ticks, Signal::USR1) {
            kick::Outcome::Sent(_) => Kick::Sent,
            kick::Outcome::Gone => Kick::NotRunning,
            kick::Outcome::Withheld(why) => {
                tracing::info!(agent = %dir.agent, pid = running.pid, %why, "fence set; SIGUSR1 withheld");
                Kick::Withheld(why)
            }
        })
    }

    /// See [`Runtime::drain`].
    pub async fn drain(&self, agent: &Agent) -> Result<Drain> {
        let dir = self.dir(agent)?;
        let fence = dir.fence();
        let deadline = tokio::time::Instant::now() + self.graceful(agent);
        loop {
            // A stopped agent has no harness left to clear the fence: nothing to wait for.
            if !fence.exists() || self.running(&dir.agent).is_none() {
                return Ok(Drain::Drained);
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::info!(agent = %dir.agent, "drain timed out with the fence still set");
                return Ok(Drain::TimedOut);
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// See [`Runtime::write_limits`].
    pub async fn write_limits(&self, agent: &Agent) -> Result<Limits> {
        let dir = self.dir(agent)?;
        let (limits, _) = self.apply_limits(agent, &dir)?;
        Ok(limits)
    }

    /// Resolves the agent's limits (its spec, else the hive-wide defaults), writes them
    /// to its cgroup when this runtime enforces them, and records the outcome in
    /// `limits.json`. Returns the limits and, when enforced, the `cgroup.procs` the
    /// agent's process joins. A malformed value is an [`Error::Config`] naming its field.
    fn apply_limits(&self, agent: &Agent, dir: &AgentDir) -> Result<(Limits, Option<PathBuf>)> {
        let config = &self.inner.config;
        let resources = &agent.spec.resources;
        let (cpu_quota, cpu_field) = match &resources.cpu_quota {
            Some(value) => (value, "spec.resources.cpuQuota"),
            None => (&config.default_cpu_quota, "agentCpuQuota"),
        };
        let (memory_max, memory_field) = match &resources.memory_max {
            Some(value) => (value, "spec.resources.memoryMax"),
            None => (&config.default_memory_max, "agentMemoryMax"),
        };
        let invalid = |field: &'static str| {
            move |message: String| Error::Config { agent: dir.agent.clone(), field, message }
        };
        let cpu = limits::parse_cpu_quota(cpu_quota).map_err(invalid(cpu_field))?;
        let memory = limits::parse_memory_max(memory_max).map_err(invalid(memory_field))?;
        let applied = self.cgroups().apply(&dir.agent, cpu, memory);
        let limits = Limits {
            cpu_quota: cpu_quota.clone(),
            memory_max: memory_max.clone(),
            enforced: applied.procs.is_some(),
            message: applied.message,
        };
        let value = json!({
            "cpuQuota": limits.cpu_quota,
            "memoryMax": limits.memory_max,
            "enforced": limits.enforced,
            "message": limits.message,
        });
        write_json(dir, "limits.json", &value)?;
        Ok((limits, applied.procs))
    }

    /// See [`Runtime::write_permissions`].
    pub async fn write_permissions(&self, agent: &Agent) -> Result<()> {
        let dir = self.dir(agent)?;
        let permissions = &agent.spec.permissions;
        let value = json!({
            "toolGroups": permissions.tool_groups,
            "capabilities": permissions.capabilities,
        });
        write_json(&dir, "permissions.json", &value)
    }

    /// See [`Runtime::observed`].
    pub fn observed(&self, agent: &Agent) -> Result<Observed> {
        let dir = self.dir(agent)?;
        let slots = self.inner.slots();
        Ok(self.observe(&dir.agent, slots.get(&dir.agent)))
    }

    /// The observed snapshot of every agent this runtime has a directory or a process
    /// for, sorted by name ("Container view"). It is computed from the live process
    /// table and the `current` links, so it is fresh after every lifecycle operation
    /// and every exit.
    pub fn snapshot(&self) -> Vec<Observed> {
        let dirs = fs::read_dir(&self.inner.config.root).into_iter().flatten().flatten();
        let mut names: Vec<String> = dirs.filter_map(|entry| entry.file_name().into_string().ok()).collect();
        let slots = self.inner.slots();
        names.extend(slots.keys().cloned());
        names.sort();
        names.dedup();
        names.iter().map(|name| self.observe(name, slots.get(name))).collect()
    }

    fn observe(&self, name: &str, slot: Option<&Slot>) -> Observed {
        let running = slot.and_then(|s| s.running.as_ref());
        Observed {
            agent: name.to_string(),
            power: if running.is_some() { Power::Running } else { Power::Stopped },
            pid: running.map(|r| r.pid),
            generation: AgentDir::new(&self.inner.config.root, name).current(),
            since: slot.and_then(|s| s.since),
            last_exit: slot.and_then(|s| s.last_exit.clone()),
        }
    }

    /// See [`Runtime::destroy`].
    pub async fn destroy(&self, agent: &Agent) -> Result<()> {
        let dir = self.dir(agent)?;
        self.stop(agent).await?;
        match fs::remove_dir_all(&dir.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(dir.io("cannot remove", &dir.path, e)),
        }
        if let Some(cgroups) = self.inner.cgroups.get() {
            cgroups.remove(&dir.agent);
        }
        self.inner.slots().remove(&dir.agent);
        self.inner.builds.lock().unwrap_or_else(|e| e.into_inner()).remove(&dir.agent);
        self.inner.starts.lock().unwrap_or_else(|e| e.into_inner()).remove(&dir.agent);
        self.publish(&dir.agent, Change::Destroyed);
        Ok(())
    }
}

impl Inner {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.agents.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ticker of `agent`'s log appends (the field `appended`).
    fn appends_of(&self, agent: &str) -> watch::Sender<()> {
        let mut appended = self.appended.lock().unwrap_or_else(|e| e.into_inner());
        appended.entry(agent.to_string()).or_insert_with(|| watch::channel(()).0).clone()
    }

    /// The supervisor's exit bookkeeping: the process is gone from the table and its
    /// exit published.
    fn exited(inner: Weak<Inner>, name: &str, pid_file: &Path, exit: Exit) {
        let Some(inner) = inner.upgrade() else { return };
        {
            let mut slots = inner.slots();
            let _ = fs::remove_file(pid_file);
            let slot = slots.entry(name.to_string()).or_default();
            slot.running = None;
            slot.since = Some(exit.at);
            slot.last_exit = Some(exit.clone());
        }
        tracing::info!(agent = name, %exit, requested = exit.requested, "agent exited");
        let _ =
            inner.events.send(RuntimeEvent { agent: name.into(), at: exit.at, change: Change::Exited(exit) });
    }
}

/// The agent's `spec.runtime.process`, or why it cannot run here.
fn settings(agent: &Agent) -> Result<&ProcessSettings> {
    let name = &agent.metadata.name;
    let Some(settings) = agent.spec.runtime.process.as_ref() else {
        return Err(Error::Config {
            agent: name.clone(),
            field: "spec.runtime.process",
            message: "the process runtime needs its settings".into(),
        });
    };
    if settings.command.is_empty() {
        return Err(Error::Config {
            agent: name.clone(),
            field: "spec.runtime.process.command",
            message: "a command is required".into(),
        });
    }
    Ok(settings)
}

/// Writes `value` to `<agent>/<name>` atomically (temp file, then rename).
fn write_json(dir: &AgentDir, name: &str, value: &serde_json::Value) -> Result<()> {
    let path = dir.path.join(name);
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize") + "\n";
    crate::durable::write_atomic(&path, text.as_bytes(), 0o644).map_err(|e| dir.io("cannot write", &path, e))
}

impl Runtime for ProcessRuntime {
    fn prebuild<'a>(&'a self, agent: &'a Agent, log: &'a dyn BuildLog) -> BoxFuture<'a, Result<Generation>> {
        Box::pin(ProcessRuntime::prebuild(self, agent, log))
    }

    fn stop_for_update<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(ProcessRuntime::stop(self, agent))
    }

    fn swap<'a>(&'a self, agent: &'a Agent, generation: &'a Generation) -> BoxFuture<'a, Result<()>> {
        Box::pin(ProcessRuntime::swap(self, agent, generation))
    }

    fn create<'a>(&'a self, agent: &'a Agent, log: &'a dyn BuildLog) -> BoxFuture<'a, Result<Generation>> {
        Box::pin(ProcessRuntime::create(self, agent, log))
    }

    fn start_with<'a>(&'a self, agent: &'a Agent, fallback: Fallback) -> BoxFuture<'a, Result<Started>> {
        Box::pin(ProcessRuntime::start_with(self, agent, fallback))
    }

    fn stop<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(ProcessRuntime::stop(self, agent))
    }

    fn kill<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(ProcessRuntime::kill(self, agent))
    }

    fn signal<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Kick>> {
        Box::pin(ProcessRuntime::signal(self, agent))
    }

    fn drain<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Drain>> {
        Box::pin(ProcessRuntime::drain(self, agent))
    }

    fn write_limits<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Limits>> {
        Box::pin(ProcessRuntime::write_limits(self, agent))
    }

    fn write_permissions<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(ProcessRuntime::write_permissions(self, agent))
    }

    fn is_running<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move { Ok(self.running(&self.dir(agent)?.agent).is_some()) })
    }

    fn observed<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<Observed>> {
        Box::pin(async move { ProcessRuntime::observed(self, agent) })
    }

    fn destroy<'a>(&'a self, agent: &'a Agent) -> BoxFuture<'a, Result<()>> {
        Box::pin(ProcessRuntime::destroy(self, agent))
    }

    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.inner.events.subscribe()
    }

    fn installed(&self, agent: &str) -> bool {
        self.agent_dir(agent).join("current").exists()
    }

    fn installed_here(&self) -> Option<std::collections::BTreeSet<String>> {
        // One readdir of the agents' root, and a look at `current` in each directory
        // there: as many as agents ever created here, not as many as are stored.
        let entries = match std::fs::read_dir(&self.inner.config.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(Default::default()),
            Err(e) => {
                tracing::warn!(root = %self.inner.config.root.display(), error = %e, "cannot list the agents' directories; asking agent by agent");
                return None;
            }
        };
        let names = entries
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter(|name| self.installed(name))
            .collect();
        Some(names)
    }

    fn running_now(&self, agent: &str) -> bool {
        // What `snapshot` would say of this one agent (Running exactly when its slot
        // holds a process), without reading the agents' directories: the daemon's exit
        // asks this of every stored Agent, and a snapshot each time held the exit 0.4 s
        // at 80,000 of them.
        self.inner.slots().get(agent).is_some_and(|slot| slot.running.is_some())
    }

    fn logs<'a>(&'a self, agent: &'a str, options: LogOptions) -> BoxFuture<'a, Result<LogStream>> {
        let dir = self.agent_dir(agent).join("logs");
        Box::pin(async move {
            log_reader::stream(&dir, options, self.inner.appends_of(agent).subscribe())
                .await
                .map_err(|log_format::NoPreviousRun| Error::NoPreviousRun { agent: agent.into() })
        })
    }

    fn attach<'a>(&'a self, _agents: &'a (dyn Fn() -> Vec<Agent> + Send + Sync)) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            for (agent, pid) in self.kill_orphans() {
                tracing::warn!(agent, pid, "stopped a process a previous daemon left running");
            }
        })
    }

    fn agents_outlive_daemon(&self) -> bool {
        false
    }
}
