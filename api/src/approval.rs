//! The `Approval` kind: a change that waits for an operator's decision (a config commit
//! to apply, a config PR to merge, an agent to spawn, meta inputs to bump), and the
//! rule that a decision is made once.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::agent::AgentSpec;
use crate::meta::Time;
use crate::resource::{Column, Resource};
use crate::validation::{self, Errors, Reason};

crate::resource! {
    /// An approval: a change an agent (or an operator) requested that only runs once an
    /// operator approves it. Approving sets `spec.decision`; the Approval controller then
    /// submits the Job that carries it out and resolves the approval exactly once.
    Approval, ApprovalList, ApprovalSpec, ApprovalStatus, plural = "approvals", singular = "approval", short = ["apr"]
}

/// What is requested, and the operator's decision on it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalSpec {
    /// What kind of change is requested.
    pub kind: ApprovalKind,
    /// The agent the change applies to (for `Spawn`, the agent to create). Not used by
    /// `UpdateMetaInputs`, which changes the shared meta flake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The change itself; which fields apply depends on `kind`.
    #[serde(default)]
    pub payload: ApprovalPayload,
    /// Who asked: an agent name or a user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// One-line description for the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The operator's decision. Starts `Pending`; may change once, to `Approved` or
    /// `Denied`, and never again.
    #[serde(default)]
    pub decision: Decision,
}

/// The kinds of change that need approval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum ApprovalKind {
    /// Apply a commit of the target's config repository (an ApprovalDeploy Job).
    #[default]
    ApplyCommit,
    /// Merge a pull request against the target's config repository, then deploy it (an
    /// ApprovalDeploy Job).
    MergeConfigPr,
    /// Create the target agent (a Spawn Job, with wanted Up at approval).
    Spawn,
    /// Bump inputs of the meta flake (a MetaUpdate Job).
    UpdateMetaInputs,
}

impl ApprovalKind {
    /// The serialized name, e.g. `ApplyCommit`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalKind::ApplyCommit => "ApplyCommit",
            ApprovalKind::MergeConfigPr => "MergeConfigPr",
            ApprovalKind::Spawn => "Spawn",
            ApprovalKind::UpdateMetaInputs => "UpdateMetaInputs",
        }
    }
}

/// The change an approval carries. Exactly the fields of its kind are set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalPayload {
    /// `ApplyCommit`: the commit to apply. `MergeConfigPr`: optionally, the head commit
    /// the operator reviewed; the merge fails if the PR has moved on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// `MergeConfigPr`: the pull request, as a URL or a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<String>,
    /// `Spawn`: the spec of the agent to create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSpec>,
    /// `UpdateMetaInputs`: the meta flake inputs to bump.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
}

/// An operator's decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// `Pending`, `Approved` or `Denied`.
    #[serde(default)]
    pub state: DecisionState,
    /// Why, in the operator's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Where a decision stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum DecisionState {
    /// Not decided yet.
    #[default]
    Pending,
    /// Approved: the change is carried out.
    Approved,
    /// Denied: nothing happens.
    Denied,
}

impl DecisionState {
    /// The serialized name, e.g. `Approved`.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionState::Pending => "Pending",
            DecisionState::Approved => "Approved",
            DecisionState::Denied => "Denied",
        }
    }
}

/// What is observed of an approval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalStatus {
    /// Where the approval is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ApprovalPhase>,
    /// Name of the Job carrying out the approved change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The user who decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// When the decision was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<Time>,
    /// Human-readable outcome, e.g. why the deploy failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The `metadata.generation` the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Where an approval is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum ApprovalPhase {
    /// Waiting for a decision.
    Pending,
    /// Approved; the Job is about to be submitted.
    Approved,
    /// Denied; terminal.
    Denied,
    /// The Job carrying out the change runs.
    Deploying,
    /// The change is in effect; terminal.
    Deployed,
    /// The Job failed or was cancelled; terminal.
    Failed,
}

impl ApprovalPhase {
    /// The serialized name, e.g. `Deploying`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalPhase::Pending => "Pending",
            ApprovalPhase::Approved => "Approved",
            ApprovalPhase::Denied => "Denied",
            ApprovalPhase::Deploying => "Deploying",
            ApprovalPhase::Deployed => "Deployed",
            ApprovalPhase::Failed => "Failed",
        }
    }

    /// True once the approval is resolved for good.
    pub fn is_terminal(self) -> bool {
        matches!(self, ApprovalPhase::Denied | ApprovalPhase::Deployed | ApprovalPhase::Failed)
    }
}

impl Resource for Approval {
    fn validate_update(&self, old: &Self, errors: &mut Errors) {
        Approval::validate_update(self, old, errors)
    }

    fn validate(&self, errors: &mut Errors) {
        let spec = &self.spec;
        let kind = spec.kind;
        match (&spec.target, kind) {
            (Some(target), ApprovalKind::UpdateMetaInputs) => errors.push(
                "spec.target",
                Reason::Forbidden,
                format!("{target:?}: UpdateMetaInputs changes the meta flake, not one agent"),
            ),
            (Some(target), _) => validation::name(errors, "spec.target", target),
            (None, ApprovalKind::UpdateMetaInputs) => {}
            (None, _) => errors.push(
                "spec.target",
                Reason::Required,
                format!("a {} approval names its agent", kind.as_str()),
            ),
        }

        if let Some(summary) = &spec.summary {
            validation::text(errors, "spec.summary", summary);
        }
        if let Some(reason) = &spec.decision.reason {
            validation::text(errors, "spec.decision.reason", reason);
        }
        let payload = &spec.payload;
        let wants = |field: &str| match field {
            "commit" => matches!(kind, ApprovalKind::ApplyCommit | ApprovalKind::MergeConfigPr),
            "pullRequest" => kind == ApprovalKind::MergeConfigPr,
            "agent" => kind == ApprovalKind::Spawn,
            _ => kind == ApprovalKind::UpdateMetaInputs,
        };
        let present = [
            ("commit", payload.commit.is_some()),
            ("pullRequest", payload.pull_request.is_some()),
            ("agent", payload.agent.is_some()),
            ("inputs", !payload.inputs.is_empty()),
        ];
        for (field, set) in present {
            if set && !wants(field) {
                errors.push(
                    format!("spec.payload.{field}"),
                    Reason::Forbidden,
                    format!("not used by a {} approval", kind.as_str()),
                );
            }
        }
        match kind {
            ApprovalKind::ApplyCommit => match &payload.commit {
                Some(commit) => validation::argument(errors, "spec.payload.commit", commit),
                None => {
                    errors.push("spec.payload.commit", Reason::Required, "the commit to apply is required")
                }
            },
            ApprovalKind::MergeConfigPr => {
                match &payload.pull_request {
                    Some(pr) => validation::argument(errors, "spec.payload.pullRequest", pr),
                    None => errors.push(
                        "spec.payload.pullRequest",
                        Reason::Required,
                        "the pull request is required",
                    ),
                }
                if let Some(commit) = &payload.commit {
                    validation::argument(errors, "spec.payload.commit", commit);
                }
            }
            ApprovalKind::Spawn => {
                if payload.agent.is_none() {
                    errors.push(
                        "spec.payload.agent",
                        Reason::Required,
                        "the spec of the agent to create is required",
                    );
                }
            }
            ApprovalKind::UpdateMetaInputs => {
                if payload.inputs.is_empty() {
                    errors.push("spec.payload.inputs", Reason::Required, "at least one input is required");
                }
                validation::tokens(errors, "spec.payload.inputs", &payload.inputs);
            }
        }
        if let Some(agent) = &payload.agent {
            validate_spawned_agent(errors, spec.target.as_deref().unwrap_or_default(), agent);
        }
        if let Some(job) = &self.status.job {
            validation::name(errors, "status.job", job);
        }
    }

    fn columns() -> Vec<Column> {
        vec![
            Column::new("Kind", "What is requested, spec.kind."),
            Column::new("Target", "The agent concerned, spec.target."),
            Column::new("Phase", "Where the approval stands, status.phase."),
            Column::wide("Decided By", "Who decided, status.decidedBy."),
        ]
    }

    fn cells(&self) -> Vec<Value> {
        // Before the controller first reports, the decision is the best phase there is.
        let phase = self.status.phase.map_or(self.spec.decision.state.as_str(), ApprovalPhase::as_str);
        vec![
            self.spec.kind.as_str().into(),
            self.spec.target.clone().unwrap_or_default().into(),
            phase.into(),
            self.status.decided_by.clone().unwrap_or_default().into(),
        ]
    }
}

/// Validates the agent spec a Spawn approval carries by validating the Agent it would
/// create, re-rooting the paths under `spec.payload.agent`.
fn validate_spawned_agent(errors: &mut Errors, target: &str, spec: &AgentSpec) {
    let agent = crate::agent::Agent::new(target, spec.clone());
    let mut inner = Errors::default();
    agent.validate(&mut inner);
    for e in inner.0 {
        let field = match e.field.strip_prefix("spec") {
            Some(rest) => format!("spec.payload.agent{rest}"),
            None => continue,
        };
        errors.push(field, e.reason, e.message);
    }
}

impl Approval {
    /// Checks an update against the stored object: the request (kind, target, payload)
    /// is fixed once created, and the decision changes at most once, from `Pending` to
    /// `Approved` or `Denied`, so an approval resolves exactly once.
    pub fn validate_update(&self, old: &Approval, errors: &mut Errors) {
        let (new, old) = (&self.spec, &old.spec);
        if new.kind != old.kind {
            errors.push("spec.kind", Reason::Forbidden, "is immutable");
        }
        if new.target != old.target {
            errors.push("spec.target", Reason::Forbidden, "is immutable");
        }
        if new.payload != old.payload {
            errors.push("spec.payload", Reason::Forbidden, "is immutable");
        }
        let (from, to) = (old.decision.state, new.decision.state);
        if from != DecisionState::Pending && new.decision != old.decision {
            errors.push(
                "spec.decision",
                Reason::Forbidden,
                format!("the approval was already {}; a decision is made once", from.as_str()),
            );
        } else if from == DecisionState::Pending
            && to == DecisionState::Pending
            && new.decision.reason.is_some()
        {
            errors.push("spec.decision.reason", Reason::Forbidden, "may only be given with a decision");
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resource::{decode, validate};
    use crate::testing::{error_fields, merge};

    fn valid() -> Value {
        json!({
            "apiVersion": "hive.dev/v1",
            "kind": "Approval",
            "metadata": {"name": "alpha-apply-1"},
            "spec": {
                "kind": "ApplyCommit",
                "target": "alpha",
                "payload": {"commit": "0123456789abcdef0123456789abcdef01234567"},
                "requestedBy": "alpha",
                "summary": "enable the git tool group",
                "decision": {"state": "Pending"}
            }
        })
    }

    fn check(patch: Value) -> Vec<String> {
        let mut value = valid();
        merge(&mut value, patch);
        error_fields::<Approval>(&value)
    }

    #[test]
    fn valid_approval_round_trips() {
        let (approval, unknown) = decode::<Approval>(&valid()).unwrap();
        assert!(unknown.is_empty());
        assert_eq!(validate(&approval), vec![]);
        let mut want = valid();
        want["status"] = json!({});
        assert_eq!(serde_json::to_value(&approval).unwrap(), want);
    }

    #[test]
    fn payload_matches_kind() {
        let spawn_agent =
            json!({"config": {"repo": "/srv/agents/gamma"}, "runtime": {"process": {"command": ["run"]}}});
        let cases: Vec<(Value, &[&str])> = vec![
            (json!({}), &[]),
            (json!({"spec": {"target": null}}), &["spec.target"]),
            (json!({"spec": {"target": "Alpha"}}), &["spec.target"]),
            (json!({"spec": {"payload": {"commit": null}}}), &["spec.payload.commit"]),
            (json!({"spec": {"payload": {"commit": "-x"}}}), &["spec.payload.commit"]),
            (json!({"spec": {"payload": {"inputs": ["x"]}}}), &["spec.payload.inputs"]),
            (json!({"spec": {"kind": "MergeConfigPr"}}), &["spec.payload.pullRequest"]),
            (json!({"spec": {"kind": "MergeConfigPr", "payload": {"pullRequest": "42"}}}), &[]),
            (json!({"spec": {"kind": "Spawn", "payload": {"commit": null}}}), &["spec.payload.agent"]),
            (json!({"spec": {"kind": "Spawn", "payload": {"commit": null, "agent": spawn_agent}}}), &[]),
            (
                json!({"spec": {"kind": "Spawn", "payload": {"commit": null,
                    "agent": {"config": {"repo": "/a"}, "runtime": {"process": {"command": ["run"]}},
                        "resources": {"memoryMax": "lots"}}}}}),
                &["spec.payload.agent.resources.memoryMax"],
            ),
            (
                json!({"spec": {"kind": "UpdateMetaInputs", "target": null, "payload": {"commit": null}}}),
                &["spec.payload.inputs"],
            ),
            (
                json!({"spec": {"kind": "UpdateMetaInputs", "target": null,
                    "payload": {"commit": null, "inputs": ["hyperhive"]}}}),
                &[],
            ),
            (
                json!({"spec": {"kind": "UpdateMetaInputs", "payload": {"commit": null, "inputs": ["a"]}}}),
                &["spec.target"],
            ),
            (json!({"status": {"job": "Bad_Job"}}), &["status.job"]),
        ];
        for (patch, want) in cases {
            assert_eq!(check(patch.clone()), want, "patch {patch}");
        }
    }

    #[test]
    fn a_decision_is_made_once() {
        let decided = |state: &str| {
            let mut value = valid();
            value["spec"]["decision"] = json!({"state": state, "reason": "ok"});
            decode::<Approval>(&value).unwrap().0
        };
        let pending = decode::<Approval>(&valid()).unwrap().0;
        let fields = |new: &Approval, old: &Approval| {
            let mut errors = Errors::default();
            new.validate_update(old, &mut errors);
            errors.0.into_iter().map(|e| e.field).collect::<Vec<_>>()
        };
        assert!(fields(&decided("Approved"), &pending).is_empty());
        assert!(fields(&decided("Denied"), &pending).is_empty());
        assert!(fields(&decided("Approved"), &decided("Approved")).is_empty());
        assert_eq!(fields(&decided("Denied"), &decided("Approved")), ["spec.decision"]);
        assert_eq!(fields(&pending, &decided("Denied")), ["spec.decision"]);
        assert_eq!(fields(&decided("Pending"), &pending), ["spec.decision.reason"]);
        let mut retargeted = pending.clone();
        retargeted.spec.target = Some("beta".into());
        assert_eq!(fields(&retargeted, &pending), ["spec.target"]);
    }

    #[test]
    fn unknown_fields_are_reported() {
        let mut value = valid();
        value["spec"]["bogus"] = json!(1);
        value["spec"]["decision"]["by"] = json!("me");
        let (_, mut unknown) = decode::<Approval>(&value).unwrap();
        unknown.sort();
        assert_eq!(unknown, ["spec.bogus", "spec.decision.by"]);
    }

    #[test]
    fn cells_match_columns() {
        let (mut approval, _) = decode::<Approval>(&valid()).unwrap();
        assert_eq!(approval.cells(), vec![json!("ApplyCommit"), json!("alpha"), json!("Pending"), json!("")]);
        approval.status.phase = Some(ApprovalPhase::Deploying);
        approval.status.decided_by = Some("admin".into());
        assert_eq!(Approval::columns().len(), approval.cells().len());
        assert_eq!(
            approval.cells(),
            vec![json!("ApplyCommit"), json!("alpha"), json!("Deploying"), json!("admin")]
        );
    }
}
