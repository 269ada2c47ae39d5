//! The container view and crash-watch: every runtime event becomes observed state in
//! the Agent's `status` (power, applied rev) and an Event, and an agent that exits on
//! its own while `wanted: Up` is a crash — condition `Crashed`, `status.restarts`, a
//! Warning event, and a restart after an exponential backoff, so a crash loop is
//! visible and never spins.
//!
//! What counts as a crash: an exit nobody asked for while wanted Up and no DAG holds the
//! agent's lease, or a start (a DAG's, or crash-watch's own) that dies within the start
//! grace. While a DAG holds the lease its state changes are expected — the coordinator
//! document's crash-watch suppression — and a due restart waits for the lease to go.
//!
//! The backoff (1 s, 2 s, 4 s … 5 min) runs from the last start, on the tokio clock.
//! Crash-watch restarts the agent itself through the runtime, without a Job: the
//! document keeps crash-watch beside the queue (suppressed while a DAG runs), not in it,
//! so a crash loop leaves no Job per try and cannot push the operator's Jobs out of the
//! history; each try is visible as Events, `status.restarts` and the `Crashed`
//! condition instead. The Agent controller reports a crash-looping agent not Ready.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use hive_api::agent::{Agent, AgentStatus, LastExit, Power, Wanted, CONDITION_CRASHED};
use hive_api::meta::{find_condition, set_condition, Condition, ConditionStatus, Time};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

use crate::client::events::{EventType, Recorder};
use crate::client::{self, Api};
use crate::runtime::{Change, Exit, Fallback, Runtime, RuntimeEvent};
use crate::scheduler::LeasedAgents;
use crate::store::Store;

/// How crash-watch's own restart of an agent went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Restarted {
    /// It started and outlived the start grace.
    Up,
    /// The start failed (it died within the start grace, or could not start at all).
    Failed(String),
    /// Nothing to do: it runs already, is no longer wanted Up, or is gone.
    NotNeeded,
}

/// Brings a crashed agent back (the daemon starts it through its runtime).
pub type Restart = Arc<dyn Fn(String) -> BoxFuture<'static, Restarted> + Send + Sync>;

/// How restarts after crashes back off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first crash.
    pub initial: Duration,
    /// The longest delay (the cap).
    pub max: Duration,
    /// An agent that stays up this long is forgiven its earlier crashes.
    pub reset_after: Duration,
    /// A start whose process dies sooner than this failed: a crash, even inside a DAG.
    pub start_grace: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
            start_grace: Duration::from_secs(1),
        }
    }
}

impl Backoff {
    /// The delay before restart number `crashes` (1-based): doubling, capped.
    pub fn delay(&self, crashes: u32) -> Duration {
        let factor = 2u32.saturating_pow(crashes.saturating_sub(1).min(30));
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// `150ms`, `4s`, `5m0s`: a backoff as a person reads it.
fn human(delay: Duration) -> String {
    match delay.as_millis() {
        ms if ms < 1000 => format!("{ms}ms"),
        _ if delay.as_secs() < 60 => format!("{}s", delay.as_secs()),
        _ => format!("{}m{}s", delay.as_secs() / 60, delay.as_secs() % 60),
    }
}

/// Per-agent crash history (in memory; `status.restarts` is the durable count).
#[derive(Default)]
struct History {
    /// Crashes in a row (the backoff's exponent).
    crashes: u32,
    /// The last start, by anyone.
    last_start: Option<Instant>,
    /// Since when it runs, while it runs.
    running_since: Option<Instant>,
    /// The token of the restart that is due next; bumped to supersede it.
    token: u64,
    /// A restart is scheduled and has not run yet.
    pending: bool,
    /// Crash-watch's own start is under way.
    restarting: bool,
}

/// What crash-watch's own timers and restarts report back to its loop.
#[derive(Debug)]
enum Tick {
    /// The restart with this token is due.
    Due { agent: String, token: u64 },
    /// Crash-watch's own restart finished.
    Done { agent: String, outcome: Restarted },
    /// A start made by someone else is `start_grace` old.
    Survived { agent: String, since: Instant },
}

/// Writes observed state and watches for crashes until the event stream closes.
pub struct CrashWatch {
    agents: Api<Agent>,
    recorder: Recorder,
    leases: watch::Receiver<LeasedAgents>,
    restart: Restart,
    backoff: Backoff,
    history: HashMap<String, History>,
    ticks: mpsc::UnboundedSender<Tick>,
    inbox: mpsc::UnboundedReceiver<Tick>,
}

/// Runs the daemon's crash-watch over `runtime`'s events, restarting crashed agents
/// through the runtime itself, suppressed for the agents in `leases`.
pub fn spawn(store: Store, runtime: Arc<dyn Runtime>, leases: watch::Receiver<LeasedAgents>) {
    let (agents, starter) = (Api::<Agent>::new(&store), runtime.clone());
    let restart: Restart = Arc::new(move |agent: String| {
        let (agents, runtime) = (agents.clone(), starter.clone());
        Box::pin(async move {
            let Ok(Some(stored)) = agents.get(&agent) else { return Restarted::NotNeeded };
            let wanted_up = stored.spec.wanted == Wanted::Up && stored.metadata.deletion_timestamp.is_none();
            if !wanted_up || runtime.running_now(&agent) || !runtime.installed(&agent) {
                return Restarted::NotNeeded;
            }
            // One launch per try: the cold-start fallback is for a start after an
            // update (Reconcile's); a crash-watch retry backs off and tries again itself.
            match runtime.start_with(&stored, Fallback::Never).await {
                Ok(_) => Restarted::Up,
                Err(err) => Restarted::Failed(err.to_string()),
            }
        })
    });
    let watch = CrashWatch::new(store, leases, restart, Backoff::default());
    tokio::spawn(watch.run(runtime.subscribe()));
}

impl CrashWatch {
    /// A crash-watch writing to `store`, suppressed for the agents in `leases`.
    pub fn new(
        store: Store,
        leases: watch::Receiver<LeasedAgents>,
        restart: Restart,
        backoff: Backoff,
    ) -> CrashWatch {
        let recorder = Recorder::new(store.clone(), "hive-crashwatch");
        let (ticks, inbox) = mpsc::unbounded_channel();
        CrashWatch {
            agents: Api::new(&store),
            recorder,
            leases,
            restart,
            backoff,
            history: HashMap::new(),
            ticks,
            inbox,
        }
    }

    /// Consumes runtime events (and its own timers) until the runtime goes away.
    pub async fn run(mut self, mut events: broadcast::Receiver<RuntimeEvent>) {
        loop {
            // Runtime events first: a restart's outcome is handled after the events
            // its start already published.
            let result = tokio::select! {
                biased;
                event = events.recv() => match event {
                    Ok(event) => self.handle(event).await,
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        // The status catches up with the next event of each agent; the
                        // level-triggered controller reconciles whatever was missed.
                        tracing::warn!(missed, "crash-watch fell behind the runtime's events");
                        Ok(())
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                Some(tick) = self.inbox.recv() => self.tick(tick).await,
            };
            match result {
                Ok(()) => {}
                Err(err) if err.is_shut_down() => {
                    tracing::debug!(error = %err, "crash-watch: the daemon is stopping")
                }
                Err(err) => tracing::warn!(error = %err, "crash-watch could not record an agent change"),
            }
        }
    }

    fn is_leased(&self, agent: &str) -> bool {
        self.leases.borrow().contains(agent)
    }

    /// Records one runtime event.
    pub async fn handle(&mut self, event: RuntimeEvent) -> client::Result<()> {
        let agent = match self.agents.get(&event.agent) {
            Ok(Some(agent)) => agent,
            Ok(None) => return Ok(()),
            Err(err) => {
                tracing::warn!(agent = event.agent, error = %err, "stored agent does not decode");
                return Ok(());
            }
        };
        let now = Time(event.at);
        match event.change {
            Change::Started { pid } => {
                let at = Instant::now();
                let history = self.history.entry(event.agent.clone()).or_default();
                history.last_start = Some(at);
                history.running_since = Some(at);
                if !history.restarting {
                    // Someone else's start: the crash is over once it outlives the grace.
                    let (ticks, agent, grace) =
                        (self.ticks.clone(), event.agent.clone(), self.backoff.start_grace);
                    tokio::spawn(async move {
                        tokio::time::sleep(grace).await;
                        let _ = ticks.send(Tick::Survived { agent, since: at });
                    });
                }
                self.write_status(&event.agent, |status| status.power = Some(Power::Running)).await?;
                self.event(&agent, EventType::Normal, "Started", &format!("started with pid {pid}")).await;
            }
            Change::Swapped(generation) => {
                self.write_status(&event.agent, |status| status.applied_rev = Some(generation.rev.clone()))
                    .await?;
                let message = format!("now on generation {} (rev {})", generation.id, generation.rev);
                self.event(&agent, EventType::Normal, "Rebuilt", &message).await;
            }
            Change::Exited(exit) => self.exited(&agent, &exit, now).await?,
            Change::Destroyed => {
                self.history.remove(&event.agent);
            }
            Change::NodeLost { .. } => {
                // Nothing restarts an agent whose node is lost: a restart scheduled before
                // is called off (its token no longer matches).
                if let Some(history) = self.history.get_mut(&event.agent) {
                    history.token += 1;
                    history.pending = false;
                    history.running_since = None;
                }
            }
            Change::NodeBack { .. } => {}
        }
        Ok(())
    }

    async fn exited(&mut self, agent: &Agent, exit: &Exit, now: Time) -> client::Result<()> {
        let name = agent.metadata.name.clone();
        let leased = self.is_leased(&name);
        let grace = self.backoff.start_grace;
        let history = self.history.entry(name.clone()).or_default();
        let uptime = history.running_since.take().map(|since| since.elapsed());
        let early = uptime.is_some_and(|up| up < grace);
        let own_accord = !exit.requested && agent.spec.wanted == Wanted::Up;
        // A restart already scheduled or under way answers this exit too: a start's
        // cold-start retry, or an exit its own start published late, is one crash.
        let answered = history.pending || history.restarting;
        // An exit nobody asked for is the agent's last exit, crash or not.
        let last_exit = (!exit.requested).then(|| LastExit {
            exit_code: exit.code,
            signal: exit.signal,
            finished_at: Time(exit.at),
            stderr: exit.stderr.clone(),
        });
        if !own_accord || (leased && !early) || answered {
            self.write_status(&name, |status| {
                status.power = Some(Power::Stopped);
                if let Some(last) = &last_exit {
                    status.last_exit = Some(last.clone());
                }
            })
            .await?;
            if !answered {
                self.event(agent, EventType::Normal, "Stopped", &format!("stopped ({exit})")).await;
            }
            return Ok(());
        }
        let what = if early {
            format!("died within its start grace ({exit})")
        } else {
            format!("exited on its own ({exit})")
        };
        self.crashed(agent, &what, uptime, last_exit.as_ref(), now).await
    }

    /// Counts a crash, reports it (with the exit that was the crash, when one was), and
    /// schedules the restart.
    async fn crashed(
        &mut self,
        agent: &Agent,
        what: &str,
        uptime: Option<Duration>,
        last_exit: Option<&LastExit>,
        now: Time,
    ) -> client::Result<()> {
        let name = agent.metadata.name.clone();
        let backoff = self.backoff;
        let history = self.history.entry(name.clone()).or_default();
        if uptime.is_some_and(|up| up >= backoff.reset_after) {
            history.crashes = 0;
        }
        history.crashes += 1;
        let crashes = history.crashes;
        let delay = backoff.delay(crashes);
        // From the last start: a command that dies at once is not started again sooner.
        let due =
            history.last_start.map_or(Instant::now() + delay, |start| start + delay).max(Instant::now());
        history.token += 1;
        history.pending = true;
        let (ticks, agent_name, token) = (self.ticks.clone(), name.clone(), history.token);
        tokio::spawn(async move {
            tokio::time::sleep_until(due).await;
            let _ = ticks.send(Tick::Due { agent: agent_name, token });
        });
        let wait = due.saturating_duration_since(Instant::now());
        let message = format!("{what}; crash {crashes} in a row, restarting in {}", human(wait));
        // Stopped and Crashed in one write: the Agent controller, woken by it, must never
        // see the agent stopped without the crash and start it itself.
        let generation = agent.metadata.generation;
        self.write_status(&name, |status| {
            status.power = Some(Power::Stopped);
            if let Some(last) = last_exit {
                status.last_exit = Some(last.clone());
            }
            let condition = Condition {
                type_: CONDITION_CRASHED.into(),
                status: ConditionStatus::True,
                reason: "CrashLoopBackOff".into(),
                message: message.clone(),
                observed_generation: generation,
                ..Default::default()
            };
            set_condition(&mut status.conditions, condition, now);
        })
        .await?;
        self.event(agent, EventType::Warning, "Crashed", what).await;
        self.event(agent, EventType::Warning, "BackOff", &format!("restarting in {}", human(wait))).await;
        Ok(())
    }

    async fn tick(&mut self, tick: Tick) -> client::Result<()> {
        let now = Time(crate::host::now());
        match tick {
            Tick::Due { agent, token } => {
                let Some(history) = self.history.get_mut(&agent) else { return Ok(()) };
                if history.token != token || !history.pending {
                    return Ok(()); // superseded
                }
                if self.leases.borrow().contains(&agent) {
                    // A DAG works on it: restart once its lease is gone, if still needed.
                    let (mut leases, ticks) = (self.leases.clone(), self.ticks.clone());
                    tokio::spawn(async move {
                        while leases.borrow_and_update().contains(&agent) {
                            if leases.changed().await.is_err() {
                                return;
                            }
                        }
                        let _ = ticks.send(Tick::Due { agent, token });
                    });
                    return Ok(());
                }
                let history = self.history.get_mut(&agent).expect("read above");
                history.pending = false;
                let Some(stored) = self.agents.get(&agent).ok().flatten() else { return Ok(()) };
                if stored.spec.wanted != Wanted::Up {
                    history.crashes = 0;
                    let generation = stored.metadata.generation;
                    return self
                        .set_crashed(
                            &agent,
                            generation,
                            ConditionStatus::False,
                            "Stopped",
                            "stopped, as wanted",
                            now,
                        )
                        .await;
                }
                history.restarting = true;
                history.last_start = Some(Instant::now());
                self.write_status(&agent, |status| status.restarts = status.restarts.saturating_add(1))
                    .await?;
                let (restart, ticks) = (self.restart.clone(), self.ticks.clone());
                tokio::spawn(async move {
                    let outcome = restart(agent.clone()).await;
                    let _ = ticks.send(Tick::Done { agent, outcome });
                });
            }
            Tick::Done { agent, outcome } => {
                let Some(history) = self.history.get_mut(&agent) else { return Ok(()) };
                history.restarting = false;
                let Some(stored) = self.agents.get(&agent).ok().flatten() else { return Ok(()) };
                let generation = stored.metadata.generation;
                match outcome {
                    Restarted::Up | Restarted::NotNeeded => {
                        let message = "running again after a crash restart";
                        self.set_crashed(&agent, generation, ConditionStatus::False, "Running", message, now)
                            .await?;
                    }
                    Restarted::Failed(err) => {
                        let what = format!("its restart failed: {err}");
                        self.crashed(&stored, &what, None, None, now).await?;
                    }
                }
            }
            Tick::Survived { agent, since } => {
                let Some(history) = self.history.get_mut(&agent) else { return Ok(()) };
                if history.running_since != Some(since) || history.restarting {
                    return Ok(());
                }
                // Someone else's start (a power verb, a Job) brought it back: the
                // restart still pending is moot.
                history.pending = false;
                history.token += 1;
                let generation = self.agents.get(&agent).ok().flatten().and_then(|a| a.metadata.generation);
                self.set_crashed(&agent, generation, ConditionStatus::False, "Running", "running again", now)
                    .await?;
            }
        }
        Ok(())
    }

    /// Sets `Crashed`; a False is written only over a True (an agent that never
    /// crashed has no such condition).
    async fn set_crashed(
        &self,
        agent: &str,
        generation: Option<i64>,
        state: ConditionStatus,
        reason: &str,
        message: &str,
        now: Time,
    ) -> client::Result<()> {
        self.write_status(agent, |status| {
            let crashed = find_condition(&status.conditions, CONDITION_CRASHED)
                .is_some_and(|c| c.status == ConditionStatus::True);
            if state == ConditionStatus::True || crashed {
                let condition = Condition {
                    type_: CONDITION_CRASHED.into(),
                    status: state,
                    reason: reason.into(),
                    message: message.into(),
                    observed_generation: generation,
                    ..Default::default()
                };
                set_condition(&mut status.conditions, condition, now);
            }
        })
        .await
    }

    async fn event(&self, agent: &Agent, type_: EventType, reason: &str, message: &str) {
        if let Err(err) = self.recorder.record(agent, type_, reason, message).await {
            if err.is_shut_down() {
                tracing::debug!(error = %err, reason, "event not recorded: the daemon is stopping");
                return;
            }
            tracing::warn!(error = %err, reason, "event not recorded");
        }
    }

    /// Applies `change` to the agent's status through the status subresource,
    /// re-reading on a concurrent write; an agent deleted meanwhile is no error.
    async fn write_status(&self, agent: &str, change: impl FnMut(&mut AgentStatus)) -> client::Result<()> {
        match self.agents.patch_status(agent, change).await {
            Ok(_) => Ok(()),
            Err(err) if err.is_not_found() => Ok(()),
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use serde_json::{json, Value};

    use super::*;
    use crate::store::{Mutation, StoreConfig};

    fn leases(names: &[&str]) -> (watch::Sender<LeasedAgents>, watch::Receiver<LeasedAgents>) {
        watch::channel(Arc::new(names.iter().map(|n| n.to_string()).collect::<HashSet<String>>()))
    }

    fn agent(name: &str, wanted: &str) -> Value {
        json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
               "spec": {"wanted": wanted, "config": {"repo": "r"}, "runtime": {"type": "process", "process": {"command": ["x"]}}}})
    }

    fn exit(requested: bool) -> Change {
        Change::Exited(Exit {
            code: Some(1),
            signal: None,
            at: crate::host::now(),
            requested,
            stderr: vec!["panic: config.toml: no such file".into()],
        })
    }

    fn event(agent: &str, change: Change) -> RuntimeEvent {
        RuntimeEvent { agent: agent.into(), change, at: crate::host::now() }
    }

    async fn store_with(agents: &[(&str, &str)]) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        for (name, wanted) in agents {
            store
                .commit(Mutation::Create { kind: "agents", object: agent(name, wanted) }, false)
                .await
                .unwrap();
        }
        (dir, store)
    }

    fn crashed(store: &Store, name: &str) -> Option<(String, String)> {
        let status = store.get("agents", name).unwrap().value()["status"].clone();
        let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
        conditions
            .iter()
            .find(|c| c["type"] == "Crashed")
            .map(|c| (c["status"].as_str().unwrap().to_string(), c["message"].as_str().unwrap().to_string()))
    }

    fn no_restart() -> Restart {
        Arc::new(|_| Box::pin(async { Restarted::NotNeeded }))
    }

    #[tokio::test]
    async fn a_start_event_on_an_agent_without_conditions_keeps_it_decodable() {
        let (_dir, store) = store_with(&[("plain", "Up")]).await;
        let (_tx, rx) = leases(&[]);
        let mut watch = CrashWatch::new(store.clone(), rx, no_restart(), Backoff::default());
        watch.handle(event("plain", Change::Started { pid: 7 })).await.unwrap();
        let stored = store.get("agents", "plain").unwrap().value();
        assert!(stored["status"].get("conditions").is_none(), "{}", stored["status"]);
        let decoded: Result<Agent, _> = serde_json::from_value(stored);
        assert!(decoded.is_ok(), "{decoded:?}");
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff::default();
        let delays: Vec<u64> = (1..=11).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    }

    /// Lets the loop's store writes (on the store's own thread) finish without
    /// letting paused time move: the test task stays runnable, so the clock stays.
    async fn settle(mut done: impl FnMut() -> bool) {
        for _ in 0..2000 {
            if done() {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
            tokio::task::yield_now().await;
        }
        panic!("the crash-watch loop did not settle");
    }

    /// A restart that reports each try on a channel (no timer of its own, so paused time
    /// moves only to crash-watch's own deadlines) and answers `outcome`.
    fn recording(outcome: Restarted) -> (Restart, mpsc::UnboundedReceiver<Instant>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let restart: Restart = Arc::new(move |_| {
            let (tx, outcome) = (tx.clone(), outcome.clone());
            Box::pin(async move {
                let _ = tx.send(Instant::now());
                outcome
            })
        });
        (restart, rx)
    }

    /// The next try. No timer of the test's own: while the loop waits for the store's
    /// thread, paused time jumps to the next pending deadline, which must be
    /// crash-watch's.
    async fn next_try(tries: &mut mpsc::UnboundedReceiver<Instant>) -> Instant {
        tries.recv().await.expect("the restart is kept")
    }

    /// A command that dies at once: every restart fails within its grace. The restarts
    /// come 1 s, 2 s, 4 s … after the previous start, capped at 5 minutes, each counted
    /// in `status.restarts`, and none of them is a Job.
    #[tokio::test(start_paused = true)]
    async fn a_crash_loop_restarts_on_the_backoff_from_the_last_start_without_jobs() {
        let (_dir, store) = store_with(&[("loop", "Up")]).await;
        let (_tx, rx) = leases(&[]);
        let (restart, mut tries) = recording(Restarted::Failed("exited during start: exit code 1".into()));
        let watch = CrashWatch::new(store.clone(), rx, restart, Backoff::default());
        let (events, subscribed) = broadcast::channel(16);
        let loop_ = tokio::spawn(watch.run(subscribed));
        let start = Instant::now();
        events.send(event("loop", Change::Started { pid: 1 })).unwrap();
        events.send(event("loop", exit(false))).unwrap();
        let mut offsets = Vec::new();
        for _ in 0..10 {
            offsets.push((next_try(&mut tries).await - start).as_secs());
        }
        assert_eq!(offsets, [1, 3, 7, 15, 31, 63, 127, 255, 511, 811]);
        settle(|| crashed(&store, "loop").is_some_and(|(_, m)| m.contains("crash 11 in a row"))).await;
        let status = store.get("agents", "loop").unwrap().value()["status"].clone();
        assert_eq!(status["restarts"], 10, "{status}");
        let (state, message) = crashed(&store, "loop").unwrap();
        assert_eq!(state, "True");
        assert!(message.contains("crash 11 in a row, restarting in 5m0s"), "{message}");
        assert!(store.list("jobs").1.is_empty(), "crash restarts are no Jobs");
        loop_.abort();
    }

    #[tokio::test]
    async fn expected_exits_are_not_crashes_but_a_start_that_dies_in_its_grace_is() {
        let agents = [("up", "Up"), ("off", "Offline"), ("busy", "Up"), ("dies", "Up"), ("retried", "Up")];
        let (_dir, store) = store_with(&agents).await;
        let (_tx, rx) = leases(&["busy", "dies", "retried"]);
        let grace = Backoff { start_grace: Duration::from_millis(300), ..Backoff::default() };
        let mut watch = CrashWatch::new(store.clone(), rx, no_restart(), grace);
        for (name, _) in agents {
            watch.handle(event(name, Change::Started { pid: 42 })).await.unwrap();
        }
        assert_eq!(store.get("agents", "up").unwrap().value()["status"]["power"], "Running");
        tokio::time::sleep(Duration::from_millis(400)).await;
        // A requested stop, an Offline agent, and a leased agent past its start grace.
        watch.handle(event("up", exit(true))).await.unwrap();
        watch.handle(event("off", exit(false))).await.unwrap();
        watch.handle(event("busy", exit(false))).await.unwrap();
        for name in ["up", "off", "busy"] {
            assert_eq!(store.get("agents", name).unwrap().value()["status"]["power"], "Stopped", "{name}");
            assert_eq!(crashed(&store, name), None, "{name}");
        }
        // A DAG's start that dies within the grace is a crash, and its cold-start retry
        // dying too is the same crash.
        watch.handle(event("retried", Change::Started { pid: 43 })).await.unwrap();
        watch.handle(event("retried", exit(false))).await.unwrap();
        watch.handle(event("retried", Change::Started { pid: 44 })).await.unwrap();
        watch.handle(event("retried", exit(false))).await.unwrap();
        let (state, message) = crashed(&store, "retried").unwrap();
        assert_eq!(state, "True");
        assert!(
            message.contains("died within its start grace") && message.contains("crash 1 in a row"),
            "{message}"
        );
        // An unleased exit of its own accord is a crash.
        watch.handle(event("up", Change::Started { pid: 45 })).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        watch.handle(event("up", exit(false))).await.unwrap();
        let (state, message) = crashed(&store, "up").unwrap();
        assert_eq!(state, "True");
        assert!(message.contains("exited on its own"), "{message}");
        let (_, events) = store.list("events");
        let reasons: Vec<String> =
            events.iter().map(|e| e.value()["reason"].as_str().unwrap().to_string()).collect();
        assert!(
            reasons.iter().any(|r| r == "Crashed") && reasons.iter().any(|r| r == "BackOff"),
            "{reasons:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_restart_that_stays_up_ends_the_crash_and_a_due_restart_waits_for_the_lease() {
        let (_dir, store) = store_with(&[("a", "Up")]).await;
        let (leased, rx) = leases(&["a"]);
        let (restart, mut tries) = recording(Restarted::Up);
        let watch = CrashWatch::new(store.clone(), rx, restart, Backoff::default());
        let (events, subscribed) = broadcast::channel(16);
        let loop_ = tokio::spawn(watch.run(subscribed));
        let start = Instant::now();
        // A DAG's start dies at once: a crash, but its restart waits for the lease.
        events.send(event("a", Change::Started { pid: 1 })).unwrap();
        events.send(event("a", exit(false))).unwrap();
        settle(|| crashed(&store, "a").is_some_and(|(s, _)| s == "True")).await;
        // Well past the 1 s backoff.
        tokio::time::sleep(Duration::from_secs(5)).await;
        settle(|| true).await;
        assert!(tries.try_recv().is_err(), "no restart while a DAG holds the lease");
        leased.send(Arc::new(HashSet::new())).unwrap();
        let at = next_try(&mut tries).await;
        assert!((at - start).as_secs() >= 5, "restarted only once the lease went");
        settle(|| crashed(&store, "a").is_some_and(|(s, _)| s == "False")).await;
        assert_eq!(store.get("agents", "a").unwrap().value()["status"]["restarts"], 1);
        loop_.abort();
    }
}
