//! The Agent controller's decision: from what is wanted and what is observed, the one
//! thing to do next. Pure and level-triggered — the daemon gathers the facts, applies
//! the decision, and calls again on every change, so running it twice is harmless.
//!
//! One intent change produces exactly one Job: a spawn or rebuild is submitted once per
//! config fingerprint (recorded in `status.configFingerprint` with the submit), and a
//! power convergence is not retried for the same generation after it failed.

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
    /// The agent crashed and crash-watch is backing off before restarting it.
    pub crashed: bool,
}

/// A Job the controller submits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submit {
    /// First spawn: create, write limits, reconcile.
    Spawn,
    /// Build the changed config and swap to it.
    Rebuild,
    /// Converge observed power to wanted.
    Reconcile,
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
    let built = f.submitted_fingerprint.as_deref() == Some(f.fingerprint.as_str());
    if !f.installed {
        return if built {
            Decision::Blocked("the spawn for this config failed; change the spec to try again".into())
        } else {
            Decision::Submit(Submit::Spawn)
        };
    }
    if !built {
        return Decision::Submit(Submit::Rebuild);
    }
    if f.crashed && f.wanted_up && !f.running {
        // Crash-watch restarts it after its backoff; a reconcile now would defeat it.
        return Decision::Wait;
    }
    if f.wanted_up != f.running {
        if f.failed_reconcile_generation == Some(f.generation) {
            let want = if f.wanted_up { "start" } else { "stop" };
            return Decision::Blocked(format!(
                "the last attempt to {want} it failed for generation {}; change the spec or run a power verb",
                f.generation
            ));
        }
        return Decision::Submit(Submit::Reconcile);
    }
    Decision::Converged
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
            ("config change rebuilds", Facts { fingerprint: "f2".into(), ..facts() }, Decision::Submit(Submit::Rebuild)),
            ("wanted up, stopped", Facts { running: false, ..facts() }, Decision::Submit(Submit::Reconcile)),
            ("wanted offline, running", Facts { wanted_up: false, ..facts() }, Decision::Submit(Submit::Reconcile)),
            ("offline and stopped", Facts { wanted_up: false, running: false, ..facts() }, Decision::Converged),
            ("failed start not repeated", Facts { running: false, failed_reconcile_generation: Some(3), ..facts() },
                Decision::Blocked("the last attempt to start it failed for generation 3; change the spec or run a power verb".into())),
            ("a new generation retries", Facts { running: false, failed_reconcile_generation: Some(2), ..facts() }, Decision::Submit(Submit::Reconcile)),
            ("a crash backs off", Facts { running: false, crashed: true, ..facts() }, Decision::Wait),
            ("delete waits for Jobs", Facts { deleting: true, in_flight: true, ..facts() }, Decision::Wait),
            ("delete destroys", Facts { deleting: true, ..facts() }, Decision::Destroy),
        ];
        for (what, f, want) in cases {
            assert_eq!(decide(&f), want, "{what}");
        }
    }
}
