//! Tests of the process runtime with real processes and real git, all under a temp
//! dir and bounded in time. The config repository holds a tiny `run.sh` whose commits
//! `v1` and `v2` write their version to `$OUT` in a loop and clear `$HIVE_FENCE` on
//! SIGUSR1, as an agent harness does. Limits are not enforced unless a test points the
//! runtime at a fake cgroupfs: the real `/sys/fs/cgroup` is left alone.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hive_api::agent::{Agent, Power, ProcessRuntime as ProcessSettings};
use tempfile::TempDir;
use tokio::sync::broadcast;

use super::limits::tests::FakeCgroupfs;
use super::supervisor::CGROUP_JOIN_FAILED;
use super::testing::{config_repo, git};
use super::{ProcessConfig, ProcessRuntime};
use crate::runtime::{Change, Drain, Error, Exit, Fallback, Kick, Limits, Runtime, RuntimeEvent};

const RUN_SH: &str = r#"#!/bin/sh
if [ -n "$NO_TRAP" ]; then :; elif [ -n "$IGNORE_FENCE" ]; then trap '' USR1; else trap 'rm -f "$HIVE_FENCE"' USR1; fi
if [ -n "$FAIL_ONCE" ] && [ ! -e "$FAIL_ONCE" ]; then : > "$FAIL_ONCE"; echo "first start fails" >&2; exit 3; fi
if [ -n "$FAIL_ALWAYS" ]; then echo "always fails" >&2; exit 4; fi
echo "started VERSION"
while true; do
  echo VERSION > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
  if [ -n "$POLL_FENCE" ] && [ -e "$HIVE_FENCE" ]; then rm -f "$HIVE_FENCE"; fi
  sleep 0.05
done
"#;

/// Runs `body` with a deadline, so a hung process fails the test instead of CI.
async fn bounded<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(Duration::from_secs(60), body).await.expect("test took longer than 60 s");
}

/// Polls `check` every 20 ms until it holds, for at most 10 s.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The test world: a temp dir with the config repository (tags v1, v2), the runtime
/// root, and the marker file the agent writes.
struct World {
    tmp: TempDir,
    repo: PathBuf,
    runtime: ProcessRuntime,
}

impl World {
    fn new() -> World {
        World::with(|_| {})
    }

    fn with(tune: impl FnOnce(&mut ProcessConfig)) -> World {
        let tmp = tempfile::tempdir().unwrap();
        let repo = config_repo(tmp.path(), RUN_SH);
        let mut config = ProcessConfig::new(tmp.path().join("agents"));
        config.start_grace = Duration::from_millis(800);
        config.graceful_stop = Duration::from_secs(5);
        config.kill_wait = Duration::from_secs(5);
        config.cgroup_root = tmp.path().join("no-cgroup");
        tune(&mut config);
        let runtime = ProcessRuntime::new(config);
        World { tmp, repo, runtime }
    }

    fn marker(&self) -> PathBuf {
        self.tmp.path().join("marker")
    }

    fn sha(&self, rev: &str) -> String {
        git(&self.repo, &["rev-parse", &format!("{rev}^{{commit}}")])
    }

    /// Agent `alpha` at `rev`, built by copying `run.sh` (so the build visibly ran in
    /// the generation) and run as `sh built.sh`.
    fn agent(&self, rev: &str, env: &[(&str, &str)]) -> Agent {
        let mut agent = Agent::default();
        agent.metadata.name = "alpha".into();
        agent.spec.config.repo = self.repo.display().to_string();
        agent.spec.config.rev = Some(rev.into());
        let mut settings = ProcessSettings {
            build: ["sh", "-c", "echo building; cp run.sh built.sh"].map(String::from).to_vec(),
            command: ["sh", "built.sh"].map(String::from).to_vec(),
            ..Default::default()
        };
        settings.env.insert("OUT".into(), self.marker().display().to_string());
        for (key, value) in env {
            settings.env.insert((*key).into(), (*value).into());
        }
        agent.spec.runtime.process = Some(settings);
        agent
    }

    /// Waits until the agent writes `version` to the marker file.
    async fn serving(&self, version: &str) {
        let marker = self.marker();
        eventually(&format!("the agent to serve {version}"), || {
            std::fs::read_to_string(&marker).map(|s| s.trim() == version).unwrap_or(false)
        })
        .await;
    }

    fn generation_dirs(&self) -> Vec<String> {
        let dir = self.runtime.agent_dir("alpha").join("generations");
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }
}

/// A build log that keeps its lines.
fn build_log() -> (Arc<Mutex<Vec<String>>>, impl Fn(&str) + Send + Sync) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    (lines, move |line: &str| sink.lock().unwrap().push(line.to_string()))
}

/// The next exit of `alpha` published on `events`, within 5 s.
async fn next_exit(events: &mut broadcast::Receiver<RuntimeEvent>) -> Exit {
    let wait = async {
        loop {
            let event = events.recv().await.unwrap();
            if let (Change::Exited(exit), "alpha") = (event.change, event.agent.as_str()) {
                return exit;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), wait).await.expect("no exit event within 5 s")
}

#[tokio::test]
async fn rebuild_keeps_the_old_generation_serving_until_the_swap() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let mut events = rt.subscribe();
        let (lines, log) = build_log();
        let v1 = world.agent("v1", &[]);
        let g1 = rt.create(&v1, &log).await.unwrap();
        assert!(g1.id.starts_with("1-"), "{g1:?}");
        assert_eq!(g1.rev, world.sha("v1"));
        let rev_file = rt.agent_dir("alpha").join("generations").join(&g1.id).join(".hive-rev");
        assert_eq!(std::fs::read_to_string(rev_file).unwrap().trim(), g1.rev);
        assert!(lines.lock().unwrap().iter().any(|l| l == "building"), "build output reaches the log");
        assert!(!rt.is_running(&v1).await.unwrap());

        let started = rt.start(&v1).await.unwrap();
        assert!(started.recovered_from.is_none());
        let observed = rt.observed(&v1).unwrap();
        assert_eq!((observed.power, observed.pid), (Power::Running, Some(started.pid)));
        assert_eq!(observed.generation.as_ref(), Some(&g1));
        assert!(observed.since.is_some());
        world.serving("v1").await;

        // Prebuild v2 while v1 keeps running and serving.
        let v2 = world.agent("v2", &[]);
        let g2 = rt.prebuild(&v2, &log).await.unwrap();
        assert!(g2.id.starts_with("2-"), "{g2:?}");
        assert_eq!(g2.rev, world.sha("v2"));
        std::fs::remove_file(world.marker()).unwrap();
        world.serving("v1").await;
        let observed = rt.observed(&v2).unwrap();
        assert_eq!(observed.pid, Some(started.pid));
        assert_eq!(observed.generation.as_ref(), Some(&g1), "prebuild does not switch current");

        let refused = rt.swap(&v2, &g2).await.unwrap_err();
        assert!(matches!(refused, Error::NotStopped { pid, .. } if pid == started.pid), "{refused}");

        rt.stop_for_update(&v2).await.unwrap();
        let stopped = rt.observed(&v2).unwrap();
        assert_eq!((stopped.power, stopped.pid), (Power::Stopped, None));
        assert!(stopped.last_exit.as_ref().unwrap().requested);
        rt.stop_for_update(&v2).await.unwrap(); // a no-op when stopped

        rt.swap(&v2, &g2).await.unwrap();
        let restarted = rt.start(&v2).await.unwrap();
        assert_ne!(restarted.pid, started.pid);
        world.serving("v2").await;
        assert_eq!(rt.observed(&v2).unwrap().generation, Some(g2.clone()));

        let mut changes = Vec::new();
        while let Ok(event) = events.try_recv() {
            changes.push(match event.change {
                Change::Started { .. } => "started".to_string(),
                Change::Exited(exit) => format!("exited requested={}", exit.requested),
                Change::Swapped(g) => format!("swapped {}", &g.id[..1]),
                Change::Destroyed => "destroyed".into(),
                change @ (Change::NodeLost { .. } | Change::NodeBack { .. }) => format!("{change:?}"),
            });
        }
        assert_eq!(changes, ["swapped 1", "started", "exited requested=true", "swapped 2", "started"]);
        rt.stop(&v2).await.unwrap();
        assert!(!rt.is_running(&v2).await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn a_failed_build_leaves_the_running_generation_untouched_and_no_half_generation() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let (_, log) = build_log();
        let v1 = world.agent("v1", &[]);
        let g1 = rt.create(&v1, &log).await.unwrap();
        let pid = rt.start(&v1).await.unwrap().pid;

        let mut broken = world.agent("v2", &[]);
        broken.spec.runtime.process.as_mut().unwrap().build =
            ["sh", "-c", "echo compiling; echo broken >&2; exit 7"].map(String::from).to_vec();
        let (lines, log) = build_log();
        let error = rt.prebuild(&broken, &log).await.unwrap_err();
        match &error {
            Error::Command { agent, command, output, .. } => {
                assert_eq!(agent, "alpha");
                assert!(command.contains("exit 7"), "{command}");
                assert!(output.contains("broken"), "{output}");
            }
            other => panic!("unexpected error {other}"),
        }
        assert!(error.to_string().contains("exit status: 7"), "{error}");
        assert!(lines.lock().unwrap().iter().any(|l| l == "compiling"));
        assert_eq!(world.generation_dirs(), std::slice::from_ref(&g1.id), "no half-built generation is left");
        let observed = rt.observed(&v1).unwrap();
        assert_eq!((observed.pid, observed.generation), (Some(pid), Some(g1.clone())));

        // An unknown rev fails in git, before any generation directory exists.
        let missing = world.agent("no-such-rev", &[]);
        let error = rt.prebuild(&missing, &log).await.unwrap_err();
        assert!(matches!(&error, Error::Command { command, .. } if command.contains("rev-parse")), "{error}");
        assert_eq!(world.generation_dirs(), std::slice::from_ref(&g1.id));
        world.serving("v1").await;
        rt.stop(&v1).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_failed_create_leaves_nothing_behind() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let mut agent = world.agent("v1", &[]);
        agent.spec.runtime.process.as_mut().unwrap().build = vec!["false".into()];
        let (_, log) = build_log();
        rt.create(&agent, &log).await.unwrap_err();
        assert!(!rt.agent_dir("alpha").exists());
        let error = rt.start(&agent).await.unwrap_err();
        assert!(matches!(error, Error::NoGeneration { .. }), "{error}");
    })
    .await;
}

#[tokio::test]
async fn a_failed_start_gets_the_cold_start_fallback_and_both_errors_when_that_fails_too() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let (_, log) = build_log();
        let flag = world.tmp.path().join("failed-once");
        let once = world.agent("v1", &[("FAIL_ONCE", flag.to_str().unwrap())]);
        rt.create(&once, &log).await.unwrap();
        let started = rt.start(&once).await.unwrap();
        let first = started.recovered_from.expect("the first start failed");
        assert!(matches!(&*first, Error::StartExited { exit, .. } if exit.code == Some(3)), "{first}");
        assert!(rt.is_running(&once).await.unwrap());
        world.serving("v1").await;
        rt.stop(&once).await.unwrap();

        let always = world.agent("v1", &[("FAIL_ALWAYS", "1")]);
        let error = rt.start(&always).await.unwrap_err();
        let Error::ColdStart { first, second, .. } = &error else { panic!("unexpected error {error}") };
        assert!(matches!(&**first, Error::StartExited { exit, .. } if exit.code == Some(4)), "{first}");
        assert!(matches!(&**second, Error::StartExited { exit, .. } if exit.code == Some(4)), "{second}");
        // Both attempts failed alike: said once, with the agent's last stderr line, and
        // without the generation's directory or its log file in the state dir.
        let message = error.to_string();
        assert!(message.contains("start failed, and again after a cold start: "), "{message}");
        assert_eq!(message.matches("exited during start: exit code 4").count(), 1, "{message}");
        assert!(message.contains("; stderr: ") && message.contains("always fails"), "{message}");
        assert!(!message.contains(&world.tmp.path().display().to_string()), "{message}");
        assert!(!rt.is_running(&always).await.unwrap());
        let log_text = std::fs::read_to_string(rt.log_files("alpha").pop().unwrap()).unwrap();
        assert!(log_text.contains("always fails"), "the agent's stderr is in its log: {log_text}");
    })
    .await;
}

// Issue 26, item 6: crash-watch's retry is one launch, never the fallback's two.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_starts_at_once_launch_the_agent_once() {
    bounded(async {
        let world = World::new();
        let rt = Arc::new(world.runtime.clone());
        let (_, log) = build_log();
        let agent = world.agent("v1", &[]);
        rt.create(&agent, &log).await.unwrap();
        let mut events = rt.subscribe();
        // Crash-watch's restart and a Job's start asking together, on two threads (as a
        // fleet node's worker serving both does): one process, both told its pid.
        let starts: Vec<_> = [Fallback::Never, Fallback::ColdStart]
            .into_iter()
            .map(|fallback| {
                let (rt, agent) = (rt.clone(), agent.clone());
                tokio::spawn(async move { rt.start_with(&agent, fallback).await })
            })
            .collect();
        let mut pids = Vec::new();
        for start in starts {
            pids.push(start.await.unwrap().unwrap().pid);
        }
        assert_eq!(pids[0], pids[1], "two processes were launched");
        let mut starts = 0;
        while let Ok(event) = events.try_recv() {
            starts += usize::from(matches!(event.change, Change::Started { .. }));
        }
        assert_eq!(starts, 1);
        rt.stop(&agent).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_start_without_the_fallback_is_one_attempt() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let (_, log) = build_log();
        let flag = world.tmp.path().join("failed-once");
        let once = world.agent("v1", &[("FAIL_ONCE", flag.to_str().unwrap())]);
        rt.create(&once, &log).await.unwrap();
        // The first launch fails (and leaves the flag); no clean cold start follows it.
        let error = rt.start_with(&once, Fallback::Never).await.unwrap_err();
        assert!(matches!(&error, Error::StartExited { exit, .. } if exit.code == Some(3)), "{error}");
        assert!(flag.exists());
        assert!(!rt.is_running(&once).await.unwrap());
        // So the next attempt is the second launch, which succeeds.
        let started = rt.start_with(&once, Fallback::Never).await.unwrap();
        assert!(started.recovered_from.is_none());
        assert!(rt.is_running(&once).await.unwrap());
        rt.stop(&once).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn signal_then_drain_ends_when_the_harness_clears_the_fence_or_at_the_timeout() {
    bounded(async {
        let world = World::with(|config| config.graceful_stop = Duration::from_millis(600));
        let rt = &world.runtime;
        let (_, log) = build_log();
        let honours = world.agent("v1", &[]);
        rt.create(&honours, &log).await.unwrap();
        rt.start(&honours).await.unwrap();
        rt.signal(&honours).await.unwrap();
        assert_eq!(rt.drain(&honours).await.unwrap(), Drain::Drained);
        assert!(!rt.agent_dir("alpha").join("fence").exists());
        assert!(rt.is_running(&honours).await.unwrap(), "drain does not stop the agent");
        rt.stop(&honours).await.unwrap();

        let ignores = world.agent("v1", &[("IGNORE_FENCE", "1")]);
        rt.start(&ignores).await.unwrap();
        rt.signal(&ignores).await.unwrap();
        let begun = tokio::time::Instant::now();
        assert_eq!(rt.drain(&ignores).await.unwrap(), Drain::TimedOut);
        assert!(begun.elapsed() >= Duration::from_millis(600));
        assert!(rt.agent_dir("alpha").join("fence").exists());
        rt.stop(&ignores).await.unwrap();
        assert_eq!(rt.drain(&ignores).await.unwrap(), Drain::Drained, "nothing to drain once stopped");
    })
    .await;
}

/// Issue 14, item 6: the kick (SIGUSR1, whose default action ends a process) reaches
/// only an agent that catches or ignores it. One that handles no SIGUSR1 is not kicked
/// and keeps running through the whole drain, then the stop ends it with SIGTERM; one
/// that polls the fence file instead (or installs its handler late) drains without a
/// kick.
#[tokio::test]
async fn the_kick_never_kills_an_agent_that_does_not_handle_sigusr1() {
    bounded(async {
        let world = World::with(|config| config.graceful_stop = Duration::from_millis(600));
        let rt = &world.runtime;
        let (_, log) = build_log();
        let fence = rt.agent_dir("alpha").join("fence");
        let honours = world.agent("v1", &[]);
        rt.create(&honours, &log).await.unwrap();
        rt.start(&honours).await.unwrap();
        assert_eq!(rt.signal(&honours).await.unwrap(), Kick::Sent);
        assert_eq!(rt.drain(&honours).await.unwrap(), Drain::Drained);
        rt.stop(&honours).await.unwrap();

        let plain = world.agent("v1", &[("NO_TRAP", "1")]);
        let pid = rt.start(&plain).await.unwrap().pid;
        let kick = rt.signal(&plain).await.unwrap();
        let Kick::Withheld(why) = &kick else { panic!("kicked an agent that does not handle it: {kick:?}") };
        assert!(why.contains(&format!("pid {pid} does not handle it")), "{why}");
        assert!(fence.exists(), "the fence is set all the same");
        assert_eq!(rt.drain(&plain).await.unwrap(), Drain::TimedOut);
        let observed = rt.observed(&plain).unwrap();
        assert!(observed.running(), "alive through the drain: {:?}", observed.last_exit);
        rt.stop(&plain).await.unwrap();
        let exit = rt.observed(&plain).unwrap().last_exit.unwrap();
        assert_eq!((exit.signal, exit.requested), (Some(15), true), "ended by the stop's SIGTERM: {exit}");
        assert_eq!(rt.signal(&plain).await.unwrap(), Kick::NotRunning);

        let polls = world.agent("v1", &[("NO_TRAP", "1"), ("POLL_FENCE", "1")]);
        rt.start(&polls).await.unwrap();
        assert!(matches!(rt.signal(&polls).await.unwrap(), Kick::Withheld(_)));
        assert_eq!(rt.drain(&polls).await.unwrap(), Drain::Drained, "it found the fence itself");
        assert!(rt.is_running(&polls).await.unwrap());
        rt.stop(&polls).await.unwrap();

        let ignores = world.agent("v1", &[("IGNORE_FENCE", "1")]);
        rt.start(&ignores).await.unwrap();
        assert_eq!(rt.signal(&ignores).await.unwrap(), Kick::Sent, "an ignored signal is harmless");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(rt.is_running(&ignores).await.unwrap());
        rt.kill(&ignores).await.unwrap();
    })
    .await;
}

/// The drain timeout is a tokio timer: with the clock paused it runs out at exactly the
/// default three minutes of virtual time, in no real time, while the real agent that
/// ignores the fence keeps running.
#[tokio::test]
async fn the_default_three_minute_drain_times_out_on_the_paused_clock() {
    // No `bounded` wrapper: its timeout is a tokio timer too, and would fire first on the
    // paused clock. The drain itself ends at three virtual minutes.
    let world = World::with(|config| config.graceful_stop = Duration::from_secs(180));
    let rt = &world.runtime;
    let (_, log) = build_log();
    let ignores = world.agent("v1", &[("IGNORE_FENCE", "1")]);
    rt.create(&ignores, &log).await.unwrap();
    rt.start(&ignores).await.unwrap();
    rt.signal(&ignores).await.unwrap();
    let real = std::time::Instant::now();
    tokio::time::pause();
    let begun = tokio::time::Instant::now();
    assert_eq!(rt.drain(&ignores).await.unwrap(), Drain::TimedOut);
    let waited = begun.elapsed();
    tokio::time::resume();
    assert!(waited >= Duration::from_secs(180), "virtual wait {waited:?}");
    assert!(waited < Duration::from_secs(181), "virtual wait {waited:?}");
    assert!(real.elapsed() < Duration::from_secs(30), "the paused clock did the waiting");
    assert!(rt.is_running(&ignores).await.unwrap(), "a drain never stops the agent");
    rt.kill(&ignores).await.unwrap();
}

#[tokio::test]
async fn an_external_kill_is_published_at_once_with_its_status() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let (_, log) = build_log();
        let agent = world.agent("v1", &[]);
        rt.create(&agent, &log).await.unwrap();
        let pid = rt.start(&agent).await.unwrap().pid;
        let mut events = rt.subscribe();
        let status = StdCommand::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
        assert!(status.success());
        let exit = next_exit(&mut events).await;
        assert_eq!((exit.code, exit.signal, exit.requested), (None, Some(9), false));
        assert_eq!(exit.to_string(), "killed by signal 9");
        let observed = rt.observed(&agent).unwrap();
        assert_eq!((observed.power, observed.pid), (Power::Stopped, None));
        assert_eq!(observed.last_exit, Some(exit));
    })
    .await;
}

#[tokio::test]
async fn the_agent_log_rotates_at_its_size_bound() {
    bounded(async {
        let world = World::with(|config| {
            config.log_max_bytes = 1024;
            config.log_files = 2;
        });
        let rt = &world.runtime;
        let (_, log) = build_log();
        let mut agent = world.agent("v1", &[]);
        let script =
            "i=0; while [ $i -lt 200 ]; do echo line-$i-0123456789abcdef; i=$((i+1)); done; exec sleep 30";
        agent.spec.runtime.process.as_mut().unwrap().command =
            ["sh", "-c", script].map(String::from).to_vec();
        rt.create(&agent, &log).await.unwrap();
        rt.start(&agent).await.unwrap();
        let live = rt.agent_dir("alpha").join("logs").join("agent.log");
        eventually("the last line in the live log", || {
            std::fs::read_to_string(&live).map(|s| s.contains("line-199-")).unwrap_or(false)
        })
        .await;
        let files = rt.log_files("alpha");
        assert_eq!(files.len(), 2, "{files:?}");
        assert!(files[0].ends_with("agent.log.1"));
        for file in &files {
            let len = std::fs::metadata(file).unwrap().len();
            assert!(len <= 1024, "{} holds {len} bytes", file.display());
        }
        rt.kill(&agent).await.unwrap();
        assert!(!rt.is_running(&agent).await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn limits_permissions_and_destroy() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let (_, log) = build_log();
        let mut agent = world.agent("v1", &[]);
        agent.spec.resources.cpu_quota = Some("200%".into());
        agent.spec.resources.memory_max = Some("4G".into());
        agent.spec.permissions.tool_groups = vec!["git".into()];
        rt.create(&agent, &log).await.unwrap();
        rt.write_limits(&agent).await.unwrap();
        rt.write_permissions(&agent).await.unwrap();
        let dir = rt.agent_dir("alpha");
        let limits: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("limits.json")).unwrap()).unwrap();
        let no_cgroup = world.tmp.path().join("no-cgroup");
        let reason = format!("cgroup v2 is not mounted at {0} ({0} does not exist)", no_cgroup.display());
        assert_eq!(
            limits,
            serde_json::json!({"cpuQuota": "200%", "memoryMax": "4G", "enforced": false, "message": reason})
        );
        let permissions: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("permissions.json")).unwrap()).unwrap();
        assert_eq!(permissions, serde_json::json!({"toolGroups": ["git"], "capabilities": []}));

        rt.start(&agent).await.unwrap();
        let mut events = rt.subscribe();
        rt.destroy(&agent).await.unwrap();
        assert!(!dir.exists());
        assert!(next_exit(&mut events).await.requested);
        assert_eq!(events.recv().await.unwrap().change, Change::Destroyed);
        rt.destroy(&agent).await.unwrap(); // unknown agent: no-op
    })
    .await;
}

#[tokio::test]
async fn stop_escalates_to_sigkill_when_sigterm_is_ignored() {
    bounded(async {
        let world = World::with(|config| config.graceful_stop = Duration::from_millis(500));
        let rt = &world.runtime;
        let (_, log) = build_log();
        let mut agent = world.agent("v1", &[]);
        let script = "trap '' TERM; while true; do sleep 0.05; done";
        agent.spec.runtime.process.as_mut().unwrap().command =
            ["sh", "-c", script].map(String::from).to_vec();
        rt.create(&agent, &log).await.unwrap();
        let pid = rt.start(&agent).await.unwrap().pid;
        assert!(rt.agent_dir("alpha").join("pid").exists());
        let mut events = rt.subscribe();
        let begun = tokio::time::Instant::now();
        rt.stop(&agent).await.unwrap();
        assert!(begun.elapsed() >= Duration::from_millis(500), "SIGTERM alone did not stop it");
        let exit = next_exit(&mut events).await;
        assert_eq!((exit.signal, exit.requested), (Some(9), true));
        assert!(super::supervisor::start_ticks(pid).is_none(), "pid {pid} is gone");
        assert!(!rt.agent_dir("alpha").join("pid").exists(), "the pid file goes with the process");
    })
    .await;
}

#[tokio::test]
async fn orphans_of_an_earlier_daemon_are_killed_and_reused_pids_are_not() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let spawn_sleep = || {
            use std::os::unix::process::CommandExt;
            StdCommand::new("sleep").arg("30").process_group(0).spawn().unwrap()
        };
        let mut orphan = spawn_sleep();
        let mut stranger = spawn_sleep();
        for (name, child, skew) in [("orphan", &orphan, 0), ("stale", &stranger, 1)] {
            let dir = rt.agent_dir(name);
            std::fs::create_dir_all(&dir).unwrap();
            let ticks = super::supervisor::start_ticks(child.id()).unwrap() + skew;
            std::fs::write(dir.join("pid"), format!("{} {ticks}\n", child.id())).unwrap();
        }
        let killed = rt.kill_orphans();
        assert_eq!(killed, [("orphan".to_string(), orphan.id())]);
        let status = tokio::task::spawn_blocking(move || orphan.wait().unwrap()).await.unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9));
        assert!(stranger.try_wait().unwrap().is_none(), "a pid whose start time differs is left alone");
        assert!(!rt.agent_dir("stale").join("pid").exists());
        stranger.kill().unwrap();
        stranger.wait().unwrap();
    })
    .await;
}

#[tokio::test]
async fn the_driver_works_as_a_trait_object() {
    bounded(async {
        let world = World::new();
        let rt: Arc<dyn Runtime> = Arc::new(world.runtime.clone());
        let (_, log) = build_log();
        let agent = world.agent("v1", &[]);
        // `running_now` says what a snapshot says of the agent, in every state: unknown,
        // installed and stopped (its directory exists), running, stopped again.
        let snapshot_says = || world.runtime.snapshot().iter().any(|o| o.agent == "alpha" && o.running());
        assert!(!rt.running_now("alpha") && !snapshot_says());
        assert_eq!(rt.installed_here(), Some(Default::default()), "nothing installed yet");
        let generation = rt.create(&agent, &log).await.unwrap();
        assert!(!rt.running_now("alpha") && !snapshot_says());
        // Listed once created, as `installed` says of it; a directory without a
        // `current` link is not an installed agent.
        std::fs::create_dir_all(world.runtime.agent_dir("half")).unwrap();
        assert_eq!(rt.installed_here(), Some(["alpha".to_string()].into()));
        assert!(rt.installed("alpha") && !rt.installed("half"));
        let pid = rt.start(&agent).await.unwrap().pid;
        let observed = rt.observed(&agent).await.unwrap();
        assert!(observed.running());
        assert!(rt.running_now("alpha") && snapshot_says());
        assert!(!rt.running_now("other"));
        assert_eq!((observed.pid, observed.generation), (Some(pid), Some(generation)));
        rt.signal(&agent).await.unwrap();
        assert_eq!(rt.drain(&agent).await.unwrap(), Drain::Drained);
        rt.stop(&agent).await.unwrap();
        assert!(!rt.is_running(&agent).await.unwrap());
        assert!(!rt.running_now("alpha") && !snapshot_says());
    })
    .await;
}

#[tokio::test]
async fn old_generations_are_pruned_but_never_the_current_one() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let (_, log) = build_log();
        let v1 = world.agent("v1", &[]);
        let current = rt.create(&v1, &log).await.unwrap();
        for rev in ["v2", "v1", "v2", "v1"] {
            rt.prebuild(&world.agent(rev, &[]), &log).await.unwrap();
        }
        let ids: Vec<String> = world.generation_dirs().iter().map(|id| id[..1].to_string()).collect();
        assert_eq!(ids, ["1", "3", "4", "5"], "the 3 newest and the current one are kept");
        let snapshot = rt.snapshot();
        assert_eq!(snapshot.len(), 1);
        assert_eq!((snapshot[0].agent.as_str(), snapshot[0].power), ("alpha", Power::Stopped));
        assert_eq!(snapshot[0].generation, Some(current));
    })
    .await;
}

/// A world whose runtime enforces limits in a fake cgroupfs (plain files).
fn enforcing_world(tune: impl FnOnce(&mut ProcessConfig)) -> (World, FakeCgroupfs) {
    let fake = FakeCgroupfs::new("cpu io memory pids");
    let world = World::with(|config| {
        config.cgroup_root = fake.root();
        config.self_cgroup = fake.self_cgroup();
        tune(config);
    });
    (world, fake)
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[tokio::test]
async fn limits_take_the_hive_wide_defaults_for_what_the_spec_leaves_out() {
    let (world, fake) = enforcing_world(|config| {
        config.default_cpu_quota = "150%".into();
        config.default_memory_max = "1G".into();
    });
    let rt = &world.runtime;
    let cgroup = fake.own().join("hive-agents").join("alpha");
    let read = |file: &str| std::fs::read_to_string(cgroup.join(file)).unwrap();

    let mut agent = world.agent("v1", &[]);
    let limits = rt.write_limits(&agent).await.unwrap();
    let message = format!("cgroup v2: {} (cpu.max 150000 100000, memory.max 1073741824)", cgroup.display());
    let expected = Limits {
        cpu_quota: "150%".into(),
        memory_max: "1G".into(),
        enforced: true,
        message: message.clone(),
    };
    assert_eq!(limits, expected);
    assert_eq!((read("cpu.max"), read("memory.max")), ("150000 100000".into(), "1073741824".into()));
    assert_eq!(
        read_json(&rt.agent_dir("alpha").join("limits.json")),
        serde_json::json!({"cpuQuota": "150%", "memoryMax": "1G", "enforced": true, "message": message})
    );

    agent.spec.resources.cpu_quota = Some("300%".into());
    let limits = rt.write_limits(&agent).await.unwrap();
    assert_eq!((limits.cpu_quota.as_str(), limits.memory_max.as_str()), ("300%", "1G"));
    assert_eq!((read("cpu.max"), read("memory.max")), ("300000 100000".into(), "1073741824".into()));

    agent.spec.resources.cpu_quota = None;
    agent.spec.resources.memory_max = Some("infinity".into());
    let limits = rt.write_limits(&agent).await.unwrap();
    assert_eq!((limits.cpu_quota.as_str(), limits.memory_max.as_str()), ("150%", "infinity"));
    assert_eq!((read("cpu.max"), read("memory.max")), ("150000 100000".into(), "max".into()));

    // The hive defaults of a plain config are the seed's 200% and 4G.
    let plain = World::new();
    let limits = plain.runtime.write_limits(&plain.agent("v1", &[])).await.unwrap();
    assert_eq!(
        (limits.cpu_quota.as_str(), limits.memory_max.as_str(), limits.enforced),
        ("200%", "4G", false)
    );
    assert!(limits.message.starts_with("cgroup v2 is not mounted at "), "{}", limits.message);
}

#[tokio::test]
async fn a_malformed_limit_is_a_config_error_naming_its_field() {
    let (world, _fake) = enforcing_world(|_| {});
    let rt = &world.runtime;
    let cases: [(Option<&str>, Option<&str>, &str); 4] = [
        (Some("2 cores"), None, "spec.resources.cpuQuota"),
        (Some("0%"), None, "spec.resources.cpuQuota"),
        (None, Some("4GB"), "spec.resources.memoryMax"),
        (None, Some("0"), "spec.resources.memoryMax"),
    ];
    for (cpu, memory, field) in cases {
        let mut agent = world.agent("v1", &[]);
        agent.spec.resources.cpu_quota = cpu.map(String::from);
        agent.spec.resources.memory_max = memory.map(String::from);
        let error = rt.write_limits(&agent).await.unwrap_err();
        assert!(
            matches!(&error, Error::Config { field: f, .. } if *f == field),
            "{cpu:?} {memory:?}: {error}"
        );
        assert!(error.to_string().contains("must be a positive"), "{error}");
    }

    let bad_default = World::with(|config| config.default_memory_max = "lots".into());
    let error = bad_default.runtime.write_limits(&bad_default.agent("v1", &[])).await.unwrap_err();
    assert!(matches!(&error, Error::Config { field, .. } if *field == "agentMemoryMax"), "{error}");
}

#[tokio::test]
async fn an_enforced_agent_joins_its_cgroup_before_it_runs() {
    bounded(async {
        let (world, fake) = enforcing_world(|_| {});
        let rt = &world.runtime;
        let (_, log) = build_log();
        let agent = world.agent("v1", &[]);
        rt.create(&agent, &log).await.unwrap();
        let pid = rt.start(&agent).await.unwrap().pid;
        world.serving("v1").await;
        let procs = fake.own().join("hive-agents/alpha/cgroup.procs");
        let joined = std::fs::read_to_string(&procs).unwrap();
        assert_eq!(joined, format!("{pid}\n"), "the agent's own pid, written by itself");
        // The joining shell became the agent: same pid, the agent's command.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert_eq!(cmdline, b"sh\0built.sh\0", "{}", String::from_utf8_lossy(&cmdline));
        let limits = read_json(&rt.agent_dir("alpha").join("limits.json"));
        assert_eq!(limits["enforced"], true, "start applies the limits too: {limits}");
        rt.stop(&agent).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn an_agent_that_cannot_join_its_cgroup_never_runs() {
    bounded(async {
        let (world, fake) = enforcing_world(|_| {});
        let rt = &world.runtime;
        let (_, log) = build_log();
        let agent = world.agent("v1", &[]);
        rt.create(&agent, &log).await.unwrap();
        assert!(rt.write_limits(&agent).await.unwrap().enforced);
        // A directory in place of cgroup.procs refuses the write, for root too.
        std::fs::create_dir(fake.own().join("hive-agents/alpha/cgroup.procs")).unwrap();
        let error = rt.start(&agent).await.unwrap_err();
        let Error::ColdStart { first, second, .. } = &error else { panic!("unexpected error {error}") };
        for attempt in [first, second] {
            assert!(
                matches!(&**attempt, Error::StartExited { exit, .. } if exit.code == Some(CGROUP_JOIN_FAILED)),
                "{attempt}"
            );
        }
        assert!(!world.marker().exists(), "the agent's command never ran");
        let log_text = std::fs::read_to_string(rt.log_files("alpha").pop().unwrap()).unwrap();
        assert!(log_text.contains("cannot join the agent's cgroup"), "{log_text}");
    })
    .await;
}
