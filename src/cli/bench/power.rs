//! The power-op phase: end-to-end latency of `stop` (graceful: fence, drain, stop) and
//! `start` Jobs against a real agent process — submit over HTTPS, the submit layer, the
//! scheduler, the process runtime, until the Job reads Done.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use hive_api::job::JobPhase;
use hive_api::Job;
use serde_json::{json, Value};

use super::api::{snippet, Api};
use super::report::Row;

/// How long one power Job may take before the phase fails.
const JOB_LIMIT: Duration = Duration::from_secs(60);

/// The power phase's agent: it honours the fence and prints nothing.
const QUIET_AGENT: &str =
    "trap 'rm -f \"$HIVE_FENCE\"' USR1\ntrap 'exit 0' TERM\nwhile true; do sleep 0.05; done\n";

/// A config repository `dir/name` whose one commit on `main` holds `run.sh`, the agent.
pub(super) fn config_repo(dir: &Path, name: &str, run_sh: &str) -> Result<std::path::PathBuf> {
    let repo = dir.join(name);
    std::fs::create_dir_all(&repo)?;
    std::fs::write(repo.join("run.sh"), run_sh)?;
    for args in
        [&["init", "--quiet", "-b", "main"][..], &["add", "run.sh"], &["commit", "--quiet", "-m", "agent"]]
    {
        let out = std::process::Command::new("git")
            .args([
                "-c",
                "user.name=hive-bench",
                "-c",
                "user.email=bench@hive.invalid",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .current_dir(&repo)
            .output()
            .context("running git (the power and placement phases need it)")?;
        ensure!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(repo)
}

/// Submits a template Job for `agent` and waits until it is terminal; its latency.
pub(super) async fn run_job(api: &Api, template: &str, agent: &str) -> Result<Duration> {
    let body = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {},
                      "spec": {"template": template, "agents": [agent], "source": "Cli"}});
    let started = Instant::now();
    let resp = api
        .request(reqwest::Method::POST, "/apis/hive.dev/v1/jobs")
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await?;
    let code = resp.status().as_u16();
    let created: Value = serde_json::from_slice(&resp.bytes().await?).context("the Job is not JSON")?;
    ensure!(code == 201, "POST {template} Job: HTTP {code}: {created}");
    let created: Job = crate::cli::client::decode(&created, "Job")?;
    let name = created.metadata.name;
    ensure!(!name.is_empty(), "the Job has no name");
    loop {
        let job: Value = serde_json::from_slice(&api.get(&format!("/apis/hive.dev/v1/jobs/{name}")).await?)?;
        let job: Job = crate::cli::client::decode(&job, "Job")?;
        match job.status.phase {
            Some(JobPhase::Done) => return Ok(started.elapsed()),
            Some(phase @ (JobPhase::Failed | JobPhase::Cancelled | JobPhase::Interrupted)) => {
                bail!(
                    "{template} Job {name} ended {}: {}",
                    phase.as_str(),
                    serde_json::to_value(&job.status)?
                )
            }
            _ if started.elapsed() > JOB_LIMIT => {
                bail!("{template} Job {name} took longer than {JOB_LIMIT:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}

/// Spawns one agent, then times `cycles` graceful stops and starts.
pub async fn phase(api: &Api, work: &Path, cycles: usize) -> Result<Vec<Row>> {
    let repo = config_repo(work, "power-agent", QUIET_AGENT)?;
    let agent = json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "power-bench"},
                       "spec": {"wanted": "Up", "config": {"repo": repo.display().to_string()},
                                "runtime": {"type": "process", "gracefulStopSeconds": 10,
                                            "process": {"command": ["sh", "run.sh"]}}}});
    let (code, body) = api.create(agent.to_string().into_bytes()).await?;
    ensure!(code == 201, "creating the power agent: HTTP {code}: {}", snippet(&body));
    let spawn = run_job(api, "Spawn", "power-bench").await?;
    let (mut stops, mut starts) = (Vec::with_capacity(cycles), Vec::with_capacity(cycles));
    for _ in 0..cycles {
        stops.push(run_job(api, "Stop", "power-bench").await?);
        starts.push(run_job(api, "Start", "power-bench").await?);
    }
    run_job(api, "Kill", "power-bench").await?;
    let (mut stops_sorted, mut starts_sorted) = (stops.clone(), starts.clone());
    stops_sorted.sort();
    starts_sorted.sort();
    Ok(vec![
        Row::new("power op: spawn (clone, check out, start), real process", "1 Job", Some(&[spawn][..]), ""),
        Row::new(
            "power op: stop (fence, drain, SIGTERM), real process",
            format!("{cycles} Jobs, submit → Done"),
            Some(stops_sorted.as_slice()),
            "",
        ),
        Row::new(
            "power op: start (incl. 1 s start grace), real process",
            format!("{cycles} Jobs, submit → Done"),
            Some(starts_sorted.as_slice()),
            "",
        ),
    ])
}
