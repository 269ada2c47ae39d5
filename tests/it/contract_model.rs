//! A model-based test of the contract: a seeded random walk of ordinary operator steps
//! against the real daemon and a real process agent — patches of `wanted`, power verbs
//! with and without `--no-wait` (and storms of them with a patch while one waits),
//! approvals approved under one reused name, `kill -9` of the
//! agent, new commits on its branch, daemon restarts with and without a new base — in
//! bursts, checked at every quiescent point against what the operator may expect:
//!
//! - the agent's observed power is its last-written `wanted`;
//! - the commit it runs is the one its meta lock pins, and that moves only by an approved
//!   deploy (this walk never rebuilds), whatever starts, restarts and base changes came
//!   between;
//! - an approval is Deployed only when its deploy ran: the agent runs its commit;
//! - the spec is only ever what a client wrote;
//! - at most five terminal Jobs are stored per template.
//!
//! The default run is short (`HIVE_CONTRACT_STEPS`, default 24, makes it longer); the seed
//! is printed, and `HIVE_CONTRACT_SEED=N` replays one walk.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::agents::{config_repo, git, wait_power};
use crate::approvals::wait_phase;
use crate::harness::{Api, Daemon};

/// A small deterministic generator (xorshift64*), so a printed seed replays a walk.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Patch(&'static str),
    Power(&'static str, bool),
    Approve(usize),
    KillAgent,
    PushCommit,
    Restart {
        new_base: bool,
    },
    /// Two power verbs with `--no-wait` (the second queues behind the first, which holds
    /// the agent's lease through its drain), then a patch of `wanted`: an edit while a
    /// Job waits.
    Storm(&'static str, &'static str, &'static str),
}

impl Step {
    fn pick(rng: &mut Rng) -> Step {
        let wanted = |rng: &mut Rng| if rng.below(2) == 0 { "Up" } else { "Offline" };
        let verb = |rng: &mut Rng| ["start", "stop", "restart"][rng.below(3) as usize];
        match rng.below(22) {
            0..=3 => Step::Patch(wanted(rng)),
            20 | 21 => Step::Storm(verb(rng), verb(rng), wanted(rng)),
            4..=10 => {
                let verb = ["start", "stop", "restart"][rng.below(3) as usize];
                Step::Power(verb, rng.below(3) != 0)
            }
            11..=14 => Step::Approve(rng.below(2) as usize),
            15 => Step::KillAgent,
            16 => Step::PushCommit,
            _ => Step::Restart { new_base: rng.below(2) == 0 },
        }
    }
}

/// What the operator wrote, and so what must hold once the daemon is quiet.
struct Model {
    wanted: &'static str,
    /// The commit the agent must run.
    commit: String,
    base: u32,
    spec: Value,
}

/// An agent that ignores the fence, so a stop's drain holds its lease a while and
/// steps issued without waiting queue behind each other.
const DEAF_SH: &str = "trap '' USR1\ntrap 'exit 0' TERM\necho VERSION\nwhile true; do sleep 0.1; done\n";

fn sha(repo: &Path, rev: &str) -> String {
    let out = std::process::Command::new("git").args(["rev-parse", rev]).current_dir(repo).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn serve_args(base: u32) -> Vec<String> {
    vec!["--agent-controller=true".into(), "--hive-rev".into(), format!("base-{base}")]
}

fn start_daemon(base: u32) -> Daemon {
    let args = serve_args(base);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::start_with(&args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_operator_walks_keep_the_contract() {
    let seed = std::env::var("HIVE_CONTRACT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    let steps: usize = std::env::var("HIVE_CONTRACT_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(24);
    walk(seed, steps).await;
}

// Regression: start, push, a graceful restart on a new base, then `hive stop --no-wait`
// at once. The restart stopped the agent without crash-watch seeing the exit, the stop
// converged before the sweep's rebuild could start it, and `status.power` stayed
// `Running` from before the restart (failed 3 runs in 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_right_after_a_restart_on_a_new_base_is_recorded_stopped() {
    walk(1796524781917452463, 4).await;
}

/// One walk of `steps` steps drawn from `seed`, checked as it goes.
async fn walk(seed: u64, steps: usize) {
    eprintln!("contract walk: HIVE_CONTRACT_SEED={seed} HIVE_CONTRACT_STEPS={steps}");
    let mut rng = Rng(seed);

    let mut d = start_daemon(1);
    let repo = config_repo(&d.dir);
    for version in ["v1", "v2"] {
        git(&repo, &["checkout", "--quiet", version]);
        std::fs::write(repo.join("run.sh"), DEAF_SH.replace("VERSION", version)).unwrap();
        git(&repo, &["commit", "--quiet", "-am", &format!("{version}, deaf")]);
        git(&repo, &["tag", "-f", version]);
    }
    git(&repo, &["checkout", "--quiet", "-B", "main", "v2"]);
    let commits = [sha(&repo, "v1"), sha(&repo, "v2")];
    let api = d.client();
    let mut agent = crate::agents::agent("alpha", &repo, "Up");
    agent["spec"]["config"]["rev"] = json!("main");
    agent["spec"]["runtime"]["gracefulStopSeconds"] = json!(2);
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    wait_power(&api, "alpha", "Running").await;
    let spec = api.get("/apis/hive.dev/v1/agents/alpha").await.body["spec"].clone();
    let mut model = Model { wanted: "Up", commit: commits[1].clone(), base: 1, spec };
    let mut pushed = 0;

    let mut walked = Vec::new();
    let mut done = 0;
    while done < steps {
        // A burst of up to three steps with no wait between them, then a quiet check.
        let burst = 1 + rng.below(3) as usize;
        for _ in 0..burst.min(steps - done) {
            let step = Step::pick(&mut rng);
            walked.push(step);
            done += 1;
            let api = d.client();
            match step {
                Step::Patch(wanted) => {
                    let patch = format!(r#"{{"spec":{{"wanted":"{wanted}"}}}}"#);
                    let out = d.kubectl(&["patch", "agent", "alpha", "--type", "merge", "-p", &patch]);
                    assert!(out.status.success(), "{walked:?}: {}", String::from_utf8_lossy(&out.stderr));
                    model.wanted = wanted;
                    model.spec["wanted"] = json!(wanted);
                }
                Step::Power(verb, no_wait) => {
                    let mut args = vec![verb, "alpha"];
                    if no_wait {
                        args.push("--no-wait");
                    }
                    let out = d.hive(&args);
                    assert!(
                        out.status.success() || !no_wait,
                        "{walked:?}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    model.wanted = if verb == "stop" { "Offline" } else { "Up" };
                    model.spec["wanted"] = json!(model.wanted);
                }
                Step::Approve(which) => {
                    quiesce(&d, &api, &walked).await;
                    let _ = api.delete("/apis/hive.dev/v1/approvals/apr").await;
                    gone(&api, "/apis/hive.dev/v1/approvals/apr").await;
                    let approval = json!({"apiVersion": "hive.dev/v1", "kind": "Approval", "metadata": {"name": "apr"},
                        "spec": {"kind": "ApplyCommit", "target": "alpha", "payload": {"commit": commits[which]}}});
                    assert_eq!(api.post("/apis/hive.dev/v1/approvals", &approval).await.code, 201);
                    wait_phase(&api, "apr", &["Pending"]).await;
                    let out = d.hive(&["approve", "apr", "--no-wait"]);
                    assert!(out.status.success(), "{walked:?}: {}", String::from_utf8_lossy(&out.stderr));
                    let resolved = wait_phase(&api, "apr", &["Deployed", "Failed"]).await;
                    if resolved["status"]["phase"] == "Deployed" {
                        model.commit = commits[which].clone();
                    }
                }
                Step::Storm(first, second, wanted) => {
                    for verb in [first, second] {
                        let out = d.hive(&[verb, "alpha", "--no-wait"]);
                        assert!(out.status.success(), "{walked:?}: {}", String::from_utf8_lossy(&out.stderr));
                    }
                    let patch = format!(r#"{{"spec":{{"wanted":"{wanted}"}}}}"#);
                    let out = d.kubectl(&["patch", "agent", "alpha", "--type", "merge", "-p", &patch]);
                    assert!(out.status.success(), "{walked:?}: {}", String::from_utf8_lossy(&out.stderr));
                    model.wanted = wanted;
                    model.spec["wanted"] = json!(wanted);
                }
                Step::KillAgent => {
                    for pid in agent_pids(&d.dir.join("agents/alpha")) {
                        let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
                    }
                }
                Step::PushCommit => {
                    pushed += 1;
                    std::fs::write(
                        repo.join("run.sh"),
                        DEAF_SH.replace("VERSION", &format!("unreviewed-{pushed}")),
                    )
                    .unwrap();
                    git(&repo, &["commit", "--quiet", "-am", "not reviewed"]);
                }
                Step::Restart { new_base } => {
                    quiesce(&d, &api, &walked).await;
                    if new_base {
                        model.base += 1;
                    }
                    let args = serve_args(model.base);
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    d.restart_with(&args);
                }
            }
        }
        check(&d, &model, &walked).await;
    }
    eprintln!("contract walk of {} steps held: {walked:?}", walked.len());
}

async fn gone(api: &Api, path: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while api.get(path).await.code != 404 {
        assert!(tokio::time::Instant::now() < deadline, "{path} was never deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The processes whose working directory is under `dir` (the agent's tree).
fn agent_pids(dir: &Path) -> Vec<u32> {
    let Ok(dir) = dir.canonicalize() else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd: PathBuf| cwd.starts_with(&dir))
        })
        .collect()
}

/// Waits until no Job is queued or running and no approval is on its way.
async fn quiesce(d: &Daemon, api: &Api, walked: &[Step]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let mut quiet_rounds = 0;
    while quiet_rounds < 4 {
        let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
        let busy = jobs["items"].as_array().is_none_or(|items| {
            items.iter().any(|j| {
                let phase = j["status"]["phase"].as_str().unwrap_or("Queued");
                matches!(phase, "Queued" | "Running")
                    || (phase == "Failed" && !j["status"]["finishedAt"].is_string())
            })
        });
        let approval = api.get("/apis/hive.dev/v1/approvals/apr").await.body;
        let deploying = approval["status"]["phase"] == "Deploying";
        quiet_rounds = if busy || deploying { 0 } else { quiet_rounds + 1 };
        assert!(
            tokio::time::Instant::now() < deadline,
            "never quiet after {walked:?}: {jobs}\n{}",
            d.log().lines().rev().take(40).collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The commit the meta lock pins for `agent`.
fn locked_commit(state: &Path, agent: &str) -> Option<String> {
    let lock: Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("meta/flake.lock")).ok()?).ok()?;
    let nodes = lock["nodes"].as_object()?;
    let key = nodes.get("root")?["inputs"][format!("agent-{agent}")].as_str()?.to_string();
    nodes.get(&key)?["locked"]["rev"].as_str().map(str::to_string)
}

async fn check(d: &Daemon, model: &Model, walked: &[Step]) {
    let api = d.client();
    quiesce(d, &api, walked).await;
    let power = if model.wanted == "Up" { "Running" } else { "Stopped" };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let alpha = loop {
        let alpha = api.get("/apis/hive.dev/v1/agents/alpha").await.body;
        if alpha["status"]["power"] == power || tokio::time::Instant::now() > deadline {
            break alpha;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let context = || format!("after {walked:?}:\n{alpha:#}");
    assert_eq!(alpha["spec"], model.spec, "the spec is not what the clients wrote, {}", context());
    assert_eq!(alpha["status"]["power"], power, "power is not the last-written wanted, {}", context());
    assert_eq!(
        alpha["status"]["appliedRev"].as_str(),
        Some(model.commit.as_str()),
        "the agent does not run the commit it should, {}",
        context()
    );
    assert_eq!(locked_commit(&d.dir, "alpha").as_deref(), Some(model.commit.as_str()), "{}", context());
    let jobs = api.get("/apis/hive.dev/v1/jobs").await.body;
    let mut terminal: std::collections::BTreeMap<String, usize> = Default::default();
    for job in jobs["items"].as_array().unwrap() {
        if job["status"]["finishedAt"].is_string() {
            *terminal.entry(job["spec"]["template"].as_str().unwrap_or("").to_string()).or_default() += 1;
        }
    }
    assert!(
        terminal.values().all(|&n| n <= 5),
        "more than 5 terminal Jobs of a template: {terminal:?}, after {walked:?}"
    );
}
