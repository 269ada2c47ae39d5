//! The Approval controller's decision, pure: from an approval's decision, phase and the
//! state of the Job carrying it out, what to do next. An approval resolves exactly once:
//! a terminal phase is never left, and only a settled Job resolves it.

use hive_api::approval::{ApprovalPhase, DecisionState};
use hive_api::job::JobPhase;

/// What the controller read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// The operator's decision (`spec.decision.state`).
    pub decision: DecisionState,
    /// `status.phase`.
    pub phase: Option<ApprovalPhase>,
    /// `status.job`: the Job carrying out the approved change, once submitted.
    pub job: Option<String>,
    /// That Job's phase; `None` when the Job does not exist.
    pub job_phase: Option<JobPhase>,
    /// The first failed node's error (`<node>: <error>`), when the Job failed.
    pub job_error: Option<String>,
}

/// The next step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do (resolved, or pending and marked so).
    Nothing,
    /// Record `Pending`.
    MarkPending,
    /// Record `Denied` (terminal).
    Deny,
    /// Submit the Job for the approved change, then record `Deploying`.
    Submit,
    /// The Job runs: look again soon.
    Wait,
    /// The Job settled: record the terminal phase, once.
    Resolve {
        /// `Deployed` or `Failed`.
        phase: ApprovalPhase,
        /// Why, for `status.message`.
        message: String,
    },
}

/// Decides the next step.
pub fn decide(f: &Facts) -> Decision {
    if f.phase.is_some_and(ApprovalPhase::is_terminal) {
        return Decision::Nothing;
    }
    match f.decision {
        DecisionState::Pending if f.phase == Some(ApprovalPhase::Pending) => Decision::Nothing,
        DecisionState::Pending => Decision::MarkPending,
        DecisionState::Denied => Decision::Deny,
        DecisionState::Approved => {
            let Some(job) = &f.job else { return Decision::Submit };
            let failed = |why: String| Decision::Resolve { phase: ApprovalPhase::Failed, message: why };
            match f.job_phase {
                None => failed(format!("Job {job} is gone before it settled")),
                Some(JobPhase::Queued | JobPhase::Running) => Decision::Wait,
                Some(JobPhase::Done) => Decision::Resolve {
                    phase: ApprovalPhase::Deployed,
                    message: format!("Job {job} is done"),
                },
                Some(JobPhase::Failed) => match &f.job_error {
                    Some(error) => failed(format!("Job {job} failed: {error}")),
                    None => failed(format!("Job {job} failed")),
                },
                Some(JobPhase::Cancelled) => failed(format!("Job {job} was cancelled before it ran")),
                Some(JobPhase::Interrupted) => {
                    failed(format!("Job {job} was interrupted by a daemon restart"))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(decision: DecisionState, phase: Option<ApprovalPhase>, job_phase: Option<JobPhase>) -> Facts {
        Facts { decision, phase, job: job_phase.map(|_| "j".to_string()), job_phase, job_error: None }
    }

    #[test]
    fn decisions() {
        use ApprovalPhase as P;
        use DecisionState as D;
        let resolve = |phase, message: &str| Decision::Resolve { phase, message: message.into() };
        let cases = [
            ("new", facts(D::Pending, None, None), Decision::MarkPending),
            ("pending", facts(D::Pending, Some(P::Pending), None), Decision::Nothing),
            ("denied", facts(D::Denied, Some(P::Pending), None), Decision::Deny),
            ("approved", facts(D::Approved, Some(P::Pending), None), Decision::Submit),
            ("deploying", facts(D::Approved, Some(P::Deploying), Some(JobPhase::Running)), Decision::Wait),
            ("queued", facts(D::Approved, Some(P::Deploying), Some(JobPhase::Queued)), Decision::Wait),
            (
                "done",
                facts(D::Approved, Some(P::Deploying), Some(JobPhase::Done)),
                resolve(P::Deployed, "Job j is done"),
            ),
            (
                "failed",
                facts(D::Approved, Some(P::Deploying), Some(JobPhase::Failed)),
                resolve(P::Failed, "Job j failed"),
            ),
            (
                "cancelled while queued",
                facts(D::Approved, Some(P::Deploying), Some(JobPhase::Cancelled)),
                resolve(P::Failed, "Job j was cancelled before it ran"),
            ),
            (
                "restart",
                facts(D::Approved, Some(P::Deploying), Some(JobPhase::Interrupted)),
                resolve(P::Failed, "Job j was interrupted by a daemon restart"),
            ),
            (
                "gone",
                Facts { job: Some("j".into()), ..facts(D::Approved, Some(P::Deploying), None) },
                resolve(P::Failed, "Job j is gone before it settled"),
            ),
            (
                "resolved once",
                facts(D::Approved, Some(P::Deployed), Some(JobPhase::Failed)),
                Decision::Nothing,
            ),
            ("failed stays", facts(D::Approved, Some(P::Failed), Some(JobPhase::Done)), Decision::Nothing),
            ("denied stays", facts(D::Approved, Some(P::Denied), None), Decision::Nothing),
        ];
        for (what, f, want) in cases {
            assert_eq!(decide(&f), want, "{what}");
        }
    }
}
