//! The container view and crash-watch: every runtime event becomes observed state in
//! the Agent's `status` (power, applied rev) and an Event, and an agent that exits on
//! its own while `wanted: Up` and no DAG holds its lease is a crash — condition
//! `Crashed`, a Warning event, and a restart after an exponential backoff, so a crash
//! loop is visible and never spins.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use hive_api::agent::{Agent, AgentStatus, Power, Wanted, CONDITION_CRASHED};
use hive_api::meta::{find_condition, set_condition, Condition, ConditionStatus, Time};
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::client::events::{EventType, Recorder};
use crate::client::{self, Api};
use crate::runtime::{Change, Exit, RuntimeEvent};
use crate::store::Store;

/// Whether a DAG holds an agent's lease: its state changes are then expected (the
/// scheduler's transient guard) and an exit is not a crash.
pub trait Leases: Send + Sync {
    /// True while a DAG holds `agent`'s lease.
    fn is_leased(&self, agent: &str) -> bool;
}

/// Brings a crashed agent back (the daemon submits a Reconcile DAG).
pub type Restart = Arc<dyn Fn(String) -> BoxFuture<'static, ()> + Send + Sync>;

/// How restarts after crashes back off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first crash.
    pub initial: Duration,
    /// The longest delay (the cap).
    pub max: Duration,
    /// An agent that stays up this long is forgiven its earlier crashes.
    pub reset_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
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

/// Restarts `agent` after `delay` (on the tokio clock, so tests can pause it).
fn schedule_restart(restart: Restart, agent: String, delay: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        restart(agent).await;
    });
}

/// `150ms`, `4s`, `5m0s`: a backoff as a person reads it.
fn human(delay: Duration) -> String {
    match delay.as_millis() {
        ms if ms < 1000 => format!("{ms}ms"),
        _ if delay.as_secs() < 60 => format!("{}s", delay.as_secs()),
        _ => format!("{}m{}s", delay.as_secs() / 60, delay.as_secs() % 60),
    }
}

/// Per-agent crash history.
#[derive(Default)]
struct History {
    crashes: u32,
    started: Option<Instant>,
}

/// Writes observed state and watches for crashes until the event stream closes.
pub struct CrashWatch {
    agents: Api<Agent>,
    recorder: Recorder,
    leases: Arc<dyn Leases>,
    restart: Restart,
    backoff: Backoff,
    history: HashMap<String, History>,
}

impl CrashWatch {
    /// A crash-watch writing to `store`.
    pub fn new(store: Store, leases: Arc<dyn Leases>, restart: Restart, backoff: Backoff) -> CrashWatch {
        let recorder = Recorder::new(store.clone(), "hive-crashwatch");
        CrashWatch { agents: Api::new(&store), recorder, leases, restart, backoff, history: HashMap::new() }
    }

    /// Consumes runtime events until the runtime goes away.
    pub async fn run(mut self, mut events: broadcast::Receiver<RuntimeEvent>) {
        loop {
            match events.recv().await {
                Ok(event) => {
                    if let Err(err) = self.handle(event).await {
                        tracing::warn!(error = %err, "crash-watch could not record an agent change");
                    }
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    // The status catches up with the next event of each agent; the
                    // level-triggered controller reconciles whatever was missed.
                    tracing::warn!(missed, "crash-watch fell behind the runtime's events");
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
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
                self.history.entry(event.agent.clone()).or_default().started = Some(Instant::now());
                let generation = agent.metadata.generation;
                self.write_status(&event.agent, |status| {
                    status.power = Some(Power::Running);
                    // Running again: the crash is over (its history stays in Events).
                    let crashed = find_condition(&status.conditions, CONDITION_CRASHED)
                        .is_some_and(|c| c.status == ConditionStatus::True);
                    if crashed {
                        let over = Condition {
                            type_: CONDITION_CRASHED.into(),
                            status: ConditionStatus::False,
                            reason: "Running".into(),
                            message: format!("running again with pid {pid}"),
                            observed_generation: generation,
                            ..Default::default()
                        };
                        set_condition(&mut status.conditions, over, now);
                    }
                })
                .await?;
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
        }
        Ok(())
    }

    async fn exited(&mut self, agent: &Agent, exit: &Exit, now: Time) -> client::Result<()> {
        let name = agent.metadata.name.clone();
        let crashed = !exit.requested && agent.spec.wanted == Wanted::Up && !self.leases.is_leased(&name);
        let history = self.history.entry(name.clone()).or_default();
        if history.started.is_some_and(|t| t.elapsed() >= self.backoff.reset_after) {
            history.crashes = 0;
        }
        history.started = None;
        if !crashed {
            self.write_status(&name, |status| status.power = Some(Power::Stopped)).await?;
            self.event(agent, EventType::Normal, "Stopped", &format!("stopped ({exit})")).await;
            return Ok(());
        }
        history.crashes += 1;
        let crashes = history.crashes;
        let delay = self.backoff.delay(crashes);
        let message =
            format!("exited on its own ({exit}); crash {crashes} in a row, restarting in {}", human(delay));
        self.write_status(&name, |status| {
            status.power = Some(Power::Stopped);
            let crashed = Condition {
                type_: CONDITION_CRASHED.into(),
                status: ConditionStatus::True,
                reason: "ExitedWhileWantedUp".into(),
                message: message.clone(),
                observed_generation: agent.metadata.generation,
                ..Default::default()
            };
            set_condition(&mut status.conditions, crashed, now);
        })
        .await?;
        self.event(agent, EventType::Warning, "Crashed", &format!("exited on its own ({exit})")).await;
        self.event(agent, EventType::Warning, "BackOff", &format!("restarting in {}", human(delay))).await;
        schedule_restart(self.restart.clone(), name, delay);
        Ok(())
    }

    async fn event(&self, agent: &Agent, type_: EventType, reason: &str, message: &str) {
        if let Err(err) = self.recorder.record(agent, type_, reason, message).await {
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
    use std::sync::Mutex;

    use serde_json::{json, Value};

    use super::*;
    use crate::store::{Mutation, StoreConfig};

    struct Leased(Mutex<Vec<String>>);

    impl Leases for Leased {
        fn is_leased(&self, agent: &str) -> bool {
            self.0.lock().unwrap().iter().any(|a| a == agent)
        }
    }

    fn agent(name: &str, wanted: &str) -> Value {
        json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
               "spec": {"wanted": wanted, "config": {"repo": "r"}, "runtime": {"type": "process", "process": {"command": ["x"]}}}})
    }

    fn exit(requested: bool) -> Change {
        Change::Exited(Exit { code: Some(1), signal: None, at: crate::host::now(), requested })
    }

    fn event(agent: &str, change: Change) -> RuntimeEvent {
        RuntimeEvent { agent: agent.into(), change, at: crate::host::now() }
    }

    #[tokio::test]
    async fn a_start_event_on_an_agent_without_conditions_keeps_it_decodable() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        store.commit(Mutation::Create { kind: "agents", object: agent("plain", "Up") }, false).await.unwrap();
        let restart: Restart = Arc::new(|_| Box::pin(async {}));
        let leases = Arc::new(Leased(Mutex::new(vec![])));
        let mut watch = CrashWatch::new(store.clone(), leases, restart, Backoff::default());
        watch.handle(event("plain", Change::Started { pid: 7 })).await.unwrap();
        let stored = (*store.get("agents", "plain").unwrap()).clone();
        assert!(stored["status"].get("conditions").is_none(), "{}", stored["status"]);
        let decoded: Result<Agent, _> = serde_json::from_value(stored);
        assert!(decoded.is_ok(), "{decoded:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn restarts_wait_exactly_their_backoff_on_the_paused_clock() {
        let backoff = Backoff::default();
        let fired: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
        let record = fired.clone();
        let restart: Restart = Arc::new(move |name| {
            let record = record.clone();
            Box::pin(async move { record.lock().unwrap().push((name, Instant::now())) })
        });
        let start = Instant::now();
        for crashes in 1..=10 {
            schedule_restart(restart.clone(), format!("a{crashes}"), backoff.delay(crashes));
        }
        tokio::time::sleep(Duration::from_secs(301)).await;
        let fired = fired.lock().unwrap().clone();
        let waited: Vec<(String, u64)> =
            fired.iter().map(|(n, at)| (n.clone(), (*at - start).as_secs())).collect();
        let want: Vec<(String, u64)> = [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("a{}", i + 1), *s))
            .collect();
        assert_eq!(waited, want);
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff::default();
        let delays: Vec<u64> = (1..=11).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    }

    #[tokio::test]
    async fn crashes_back_off_and_expected_exits_do_not_count() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        for (name, wanted) in [("up", "Up"), ("off", "Offline"), ("busy", "Up")] {
            store
                .commit(Mutation::Create { kind: "agents", object: agent(name, wanted) }, false)
                .await
                .unwrap();
        }
        let leases = Arc::new(Leased(Mutex::new(vec!["busy".into()])));
        let restarts: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
        let recorded = restarts.clone();
        let restart: Restart = Arc::new(move |name| {
            let recorded = recorded.clone();
            Box::pin(async move { recorded.lock().unwrap().push((name, Instant::now())) })
        });
        let backoff = Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(150),
            reset_after: Duration::from_secs(600),
        };
        let mut watch = CrashWatch::new(store.clone(), leases, restart, backoff);

        watch.handle(event("up", Change::Started { pid: 42 })).await.unwrap();
        assert_eq!(store.get("agents", "up").unwrap()["status"]["power"], "Running");

        // A requested stop, an Offline agent and a leased agent are not crashes.
        watch.handle(event("up", exit(true))).await.unwrap();
        watch.handle(event("off", exit(false))).await.unwrap();
        watch.handle(event("busy", exit(false))).await.unwrap();
        for name in ["up", "off", "busy"] {
            let status = &store.get("agents", name).unwrap()["status"];
            assert_eq!(status["power"], "Stopped", "{name}");
            assert!(status.get("conditions").is_none(), "{name}: {status}");
        }

        // Four crashes in a row: 50, 100, 150 (capped), 150 ms.
        let mut handled = Vec::new();
        for _ in 0..4 {
            handled.push(Instant::now());
            watch.handle(event("up", exit(false))).await.unwrap();
        }
        let status = store.get("agents", "up").unwrap()["status"].clone();
        assert_eq!(status["conditions"][0]["type"], "Crashed");
        assert_eq!(status["conditions"][0]["status"], "True");
        assert!(
            status["conditions"][0]["message"].as_str().unwrap().contains("crash 4 in a row"),
            "{status}"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while restarts.lock().unwrap().len() < 4 {
            assert!(Instant::now() < deadline, "restarts did not all happen");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut done = restarts.lock().unwrap().clone();
        done.sort_by_key(|(_, at)| *at);
        assert!(done.iter().all(|(n, _)| n == "up"));
        let delays = [50, 100, 150, 150];
        let mut sorted_handled = handled.clone();
        sorted_handled.sort();
        // Each restart comes no sooner than its crash's backoff.
        for ((handled_at, want), (_, restarted_at)) in sorted_handled.iter().zip(delays).zip(&done) {
            let waited = *restarted_at - *handled_at;
            assert!(waited >= Duration::from_millis(want), "restarted after {waited:?}, backoff {want} ms");
        }

        let (_, events) = store.list("events");
        let reasons: Vec<(&str, i64)> =
            events.iter().map(|e| (e["reason"].as_str().unwrap(), e["count"].as_i64().unwrap())).collect();
        assert!(reasons.contains(&("Crashed", 4)), "{reasons:?}");
        assert!(reasons.iter().any(|(r, _)| *r == "BackOff"), "{reasons:?}");
    }
}
