//! The Agent controller's decision: from what is wanted and what is observed, the one
//! thing to do next. Pure and level-triggered — the daemon gathers the facts, applies
//! the decision, and calls again on every change, so running it twice is harmless.
//!
//! One intent change produces exactly one Job: a spawn or rebuild is submitted once per
//! config fingerprint (recorded in `status.configFingerprint` with the submit), and a
//! power convergence is not retried for the same generation after it failed.
//!
//! A power convergence is the same shape the power verbs submit: an edit of
//! `spec.wanted` to `Offline` (say, `kubectl patch`) is a `Stop` (graceful Signal →
//! Drain when the agent has a harness), to `Up` a `Start` (with its stale-rev upgrade).
//! A spawn never changes `spec.wanted`: an agent created `Offline` is built and left
//! stopped.

use hive_api::job::{JobNodeKind, JobSpec, JobTemplate, NodeAction};

/// What a reconcile of one agent acts on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The controller's finalizer is on the object.
    pub has_finalizer: bool,
    /// The runtime has a current generation installed.
    pub installed: bool,
    /// The agent runs.
    pub running: bool,
    /// A Job that touches the agent is queued or running.
    pub in_flight: bool,
    /// `spec.wanted` is `Up`.
    pub wanted_up: bool,
    /// Fingerprint of the spec's config and runtime settings.
    pub fingerprint: String,
    /// `status.configFingerprint`: what the last spawn or rebuild was submitted for.
    pub submitted_fingerprint: Option<String>,
    /// `metadata.generation`.
    pub generation: i64,
    /// The power convergence last submitted by the controller, if it failed: for which
    /// generation.
    pub failed_reconcile_generation: Option<i64>,
    /// The agent is crash-looping (condition `Crashed` True): crash-watch owns its
    /// restarts, with backoff.
    pub crashed: bool,
    /// The newest finished Job on the agent failed at starting it: crash-watch counts a
    /// start that dies within its grace as a crash and restarts it after its backoff,
    /// so the controller must not start it again meanwhile (its `Crashed` condition may
    /// be written a moment after the Job's failure).
    pub start_failed: bool,
    /// The agent's installation is on another host than `spec.placement` names now
    /// (`status.node` differs, and it was built there): a move is due.
    pub moved: bool,
    /// Why the newest finished build of the agent (a spawn's Create, a rebuild's
    /// Prebuild) failed, when it did: its Job and the node's error.
    pub build_failure: Option<String>,
}

/// A Job the controller submits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submit {
    /// First spawn: create, write limits, reconcile.
    Spawn,
    /// Build the changed config and swap to it.
    Rebuild,
    /// Wanted Up but stopped: the `Start` shape (a stale agent rebuilds first).
    Start,
    /// Wanted Offline but running: the `Stop` shape (graceful when it has a harness).
    Stop,
    /// Placed elsewhere than it is installed: the `Move` shape (leave the old host,
    /// create on the new one, converge power there).
    Move,
}

impl Submit {
    /// The Job template this submit uses.
    pub fn template(self) -> JobTemplate {
        match self {
            Submit::Spawn => JobTemplate::Spawn,
            Submit::Rebuild => JobTemplate::Rebuild,
            Submit::Start => JobTemplate::Start,
            Submit::Stop => JobTemplate::Stop,
            Submit::Move => JobTemplate::Move,
        }
    }

    /// Whether this converges power (rather than building).
    pub fn is_power(self) -> bool {
        matches!(self, Submit::Start | Submit::Stop)
    }

    /// Whether this builds the spec's config, so its fingerprint counts as submitted. A
    /// move rebuilds what the meta lock pins on the new host: a config change made with
    /// it is a rebuild of its own afterwards.
    pub fn builds_config(self) -> bool {
        matches!(self, Submit::Spawn | Submit::Rebuild)
    }
}

/// The one next step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Put the finalizer on the object, so a delete waits for the cleanup.
    AddFinalizer,
    /// Stop the agent, remove its generations, then remove the finalizer.
    Destroy,
    /// A Job is working on the agent: look again when it settles.
    Wait,
    /// Submit this Job.
    Submit(Submit),
    /// Nothing to do: observed matches wanted.
    Converged,
    /// Not converged, but retrying would repeat a Job that already failed for this
    /// generation; the message says why.
    Blocked(String),
    /// Wanted Up but crash-looping: crash-watch restarts it after its backoff, so the
    /// controller submits nothing and reports it not Ready.
    CrashLoop,
}

/// Decides the next step for one agent.
pub fn decide(f: &Facts) -> Decision {
    if f.deleting {
        return if f.in_flight { Decision::Wait } else { Decision::Destroy };
    }
    if !f.has_finalizer {
        return Decision::AddFinalizer;
    }
    if f.in_flight {
        return Decision::Wait;
    }
    if f.moved {
        return Decision::Submit(Submit::Move);
    }
    let built = f.submitted_fingerprint.as_deref() == Some(f.fingerprint.as_str());
    if !f.installed {
        return if built {
            Decision::Blocked(match &f.build_failure {
                Some(why) => {
                    format!("the spawn for this config failed ({why}); change the spec to try again")
                }
                None => "the spawn for this config failed; change the spec to try again".into(),
            })
        } else {
            Decision::Submit(Submit::Spawn)
        };
    }
    if !built {
        return Decision::Submit(Submit::Rebuild);
    }
    if f.wanted_up && (f.crashed || (f.start_failed && !f.running)) {
        // Crash-watch restarts it after its backoff; a start now would defeat it.
        return Decision::CrashLoop;
    }
    if f.wanted_up != f.running {
        if f.failed_reconcile_generation == Some(f.generation) {
            let want = if f.wanted_up { "start" } else { "stop" };
            return Decision::Blocked(format!(
                "the last attempt to {want} it failed for generation {}; change the spec or run a power verb",
                f.generation
            ));
        }
        return Decision::Submit(if f.wanted_up { Submit::Start } else { Submit::Stop });
    }
    Decision::Converged
}

/// Which agents a Job holds up while it is unfinished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Touches {
    /// These agents (named by its nodes, `spec.agents`, or a MetaLock's fan-out list).
    Agents(Vec<String>),
    /// Every agent: a boot sweep, or a MetaLock whose fan-out is computed only after its
    /// bump lands, may rebuild any of them.
    All,
}

impl Touches {
    /// Whether `agent` is among them.
    pub fn contains(&self, agent: &str) -> bool {
        match self {
            Touches::All => true,
            Touches::Agents(agents) => agents.iter().any(|a| a == agent),
        }
    }
}

/// The agents an unfinished Job stands for. A BootSweep or MetaUpdate names no agent on
/// its MetaLock node, yet it is about to rebuild agents: starting one of them meanwhile
/// would start it on the old config, so they count as in flight too.
pub fn touches(job: &JobSpec) -> Touches {
    if job.template == JobTemplate::BootSweep {
        return Touches::All;
    }
    let mut agents: Vec<String> = job.agents.clone();
    for node in &job.nodes {
        if let Some(agent) = &node.agent {
            agents.push(agent.clone());
        }
        if node.kind == JobNodeKind::MetaLock {
            match node.action() {
                Ok(NodeAction::MetaLock { agents: Some(listed), .. }) => agents.extend(listed),
                // Every installed agent whose input changed (or a node that will fail,
                // its params unreadable): all of them, to be safe.
                _ => return Touches::All,
            }
        }
    }
    agents.sort();
    agents.dedup();
    Touches::Agents(agents)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            has_finalizer: true,
            installed: true,
            running: true,
            wanted_up: true,
            fingerprint: "f1".into(),
            submitted_fingerprint: Some("f1".into()),
            generation: 3,
            ..Facts::default()
        }
    }

    #[test]
    fn decisions() {
        let cases: Vec<(&str, Facts, Decision)> = vec![
            ("converged", facts(), Decision::Converged),
            ("finalizer first", Facts { has_finalizer: false, ..facts() }, Decision::AddFinalizer),
            ("a Job is working", Facts { in_flight: true, installed: false, ..facts() }, Decision::Wait),
            ("new agent spawns", Facts { installed: false, submitted_fingerprint: None, ..facts() }, Decision::Submit(Submit::Spawn)),
            ("failed spawn is not repeated", Facts { installed: false, ..facts() }, Decision::Blocked("the spawn for this config failed; change the spec to try again".into())),
            ("a failed spawn says why", Facts { installed: false, build_failure: Some("Job s-1 failed to build it: exit 1".into()), ..facts() },
                Decision::Blocked("the spawn for this config failed (Job s-1 failed to build it: exit 1); change the spec to try again".into())),
            ("config change rebuilds", Facts { fingerprint: "f2".into(), ..facts() }, Decision::Submit(Submit::Rebuild)),
            ("wanted up, stopped", Facts { running: false, ..facts() }, Decision::Submit(Submit::Start)),
            ("wanted offline, running", Facts { wanted_up: false, ..facts() }, Decision::Submit(Submit::Stop)),
            ("offline and stopped", Facts { wanted_up: false, running: false, ..facts() }, Decision::Converged),
            ("failed start not repeated", Facts { running: false, failed_reconcile_generation: Some(3), ..facts() },
                Decision::Blocked("the last attempt to start it failed for generation 3; change the spec or run a power verb".into())),
            ("a new generation retries", Facts { running: false, failed_reconcile_generation: Some(2), ..facts() }, Decision::Submit(Submit::Start)),
            ("a crash backs off", Facts { running: false, crashed: true, ..facts() }, Decision::CrashLoop),
            ("a crash loop is not ready while briefly up", Facts { crashed: true, ..facts() }, Decision::CrashLoop),
            ("a failed start is crash-watch's to retry", Facts { running: false, start_failed: true, ..facts() }, Decision::CrashLoop),
            ("a failed start, since restarted", Facts { start_failed: true, ..facts() }, Decision::Converged),
            ("a crashed agent wanted offline stops", Facts { crashed: true, wanted_up: false, ..facts() }, Decision::Submit(Submit::Stop)),
            ("created offline: spawned, not started", Facts { wanted_up: false, running: false, installed: false, submitted_fingerprint: None, ..facts() }, Decision::Submit(Submit::Spawn)),
            ("a placement change moves it", Facts { moved: true, installed: false, running: false, ..facts() }, Decision::Submit(Submit::Move)),
            ("a move with a config change moves first", Facts { moved: true, fingerprint: "f2".into(), ..facts() }, Decision::Submit(Submit::Move)),
            ("a move waits for Jobs", Facts { moved: true, in_flight: true, ..facts() }, Decision::Wait),
            ("a crash-looping agent moves", Facts { moved: true, crashed: true, ..facts() }, Decision::Submit(Submit::Move)),
            ("a deleted agent is not moved", Facts { moved: true, deleting: true, ..facts() }, Decision::Destroy),
            ("delete waits for Jobs", Facts { deleting: true, in_flight: true, ..facts() }, Decision::Wait),
            ("delete destroys", Facts { deleting: true, ..facts() }, Decision::Destroy),
        ];
        for (what, f, want) in cases {
            assert_eq!(decide(&f), want, "{what}");
        }
    }

    #[test]
    fn meta_jobs_hold_up_the_agents_they_will_rebuild() {
        use hive_api::job::JobNode;
        let lock = |agents: Option<Vec<&str>>| {
            let agents = agents.map(|a| a.into_iter().map(str::to_string).collect());
            let action = NodeAction::MetaLock { inputs: vec!["hive".into()], agents, non_fatal: false };
            JobNode::from_action("meta-lock", None, &action)
        };
        let spec = |template, nodes: Vec<JobNode>, agents: Vec<&str>| JobSpec {
            template,
            nodes,
            agents: agents.into_iter().map(str::to_string).collect(),
            ..Default::default()
        };
        // The boot sweep's MetaLock names no agent, and its fan-out list holds only the
        // wanted-up stale ones: it still holds up every agent while it runs.
        let sweep = spec(JobTemplate::BootSweep, vec![lock(Some(vec!["a"]))], vec!["a"]);
        assert_eq!(touches(&sweep), Touches::All);
        assert!(touches(&sweep).contains("b"));
        let update_all = spec(JobTemplate::MetaUpdate, vec![lock(None)], vec![]);
        assert_eq!(touches(&update_all), Touches::All);
        let update_some = spec(JobTemplate::MetaUpdate, vec![lock(Some(vec!["b", "a"]))], vec![]);
        assert_eq!(touches(&update_some), Touches::Agents(vec!["a".into(), "b".into()]));
        let stop = spec(
            JobTemplate::Stop,
            vec![JobNode::new("c/set-wanted".to_string(), JobNodeKind::SetWanted, Some("c"))],
            vec!["c"],
        );
        assert_eq!(touches(&stop), Touches::Agents(vec!["c".into()]));
        assert!(!touches(&stop).contains("a"));
    }
}
