//! Admission that depends on who asks and on the daemon. Approvals record who requested
//! them and who decided them (server-set, never taken from the client), and an agent's
//! own token may only request its own config changes. Nodes are created only by the
//! fleet's Provision commands, never through the API. A Provider names only key sources
//! the operator of the host allowed (`hive serve --provider-key-dir`,
//! `--provider-key-env`, `--provider-base-url`): the store-independent validation in
//! `hive-api` cannot know those flags.

use hive_api::approval::{Approval, ApprovalKind, DecisionState};
use hive_api::provider::{Provider, VastaiProvider};
use hive_api::KindInfo;
use serde_json::{json, Map, Value};

use super::error::{ApiError, ApiResult};
use crate::auth::{Principal, Role};
use crate::fleet::providers::keys::KeySources;

pub use hive_api::names::{DECIDED_AT, DECIDED_BY};

/// How many undecided approvals one agent's token may have open at once: an agent asks
/// for a few config changes at a time; more is a runaway (each is stored and shown to
/// every operator until decided).
pub const MAX_PENDING_APPROVALS_PER_AGENT: usize = 16;

/// What admission looks up beyond the request itself.
pub struct Facts<'a> {
    agent_exists: Box<dyn Fn(&str) -> bool + 'a>,
    pending_approvals: Box<dyn Fn(&str) -> usize + 'a>,
    key_sources: &'a KeySources,
    refused: Box<dyn Fn(&'static str) + 'a>,
}

impl<'a> Facts<'a> {
    /// `agent_exists` says whether an agent of that name is stored; `key_sources` is
    /// what Providers may read on this host. No approval is pending.
    pub fn new(agent_exists: impl Fn(&str) -> bool + 'a, key_sources: &'a KeySources) -> Facts<'a> {
        Facts {
            agent_exists: Box::new(agent_exists),
            pending_approvals: Box::new(|_| 0),
            key_sources,
            refused: Box::new(|_| {}),
        }
    }

    /// `refused` counts a write refused by a limit (`object_size`, `pending_approvals`).
    pub fn with_refusals(mut self, refused: impl Fn(&'static str) + 'a) -> Facts<'a> {
        self.refused = Box::new(refused);
        self
    }

    /// `pending` counts the undecided approvals an agent requested.
    pub fn with_pending_approvals(mut self, pending: impl Fn(&str) -> usize + 'a) -> Facts<'a> {
        self.pending_approvals = Box::new(pending);
        self
    }
}

/// Checks and completes a write of `kind` by `principal`: `old` is the stored object
/// (`None` on create), `new` the admitted object about to be stored; `subresource` is
/// `Some("status")` for status writes, which only record observations.
pub fn check(
    kind: &KindInfo,
    principal: &Principal,
    old: Option<&Value>,
    new: &mut Value,
    subresource: Option<&str>,
    facts: &Facts<'_>,
) -> ApiResult<()> {
    if kind.plural == "nodes" && old.is_none() && subresource.is_none() {
        return Err(node_created_by_hand(new));
    }
    if subresource.is_some() {
        return Ok(());
    }
    let size = json_size(new);
    if size > hive_api::validation::MAX_OBJECT_BYTES {
        (facts.refused)("object_size");
        return Err(ApiError::ObjectTooLarge {
            kind: kind.kind.to_string(),
            size,
            limit: hive_api::validation::MAX_OBJECT_BYTES,
        });
    }
    match kind.plural {
        "approvals" => approval(principal, old, new, facts),
        "providers" => provider(old, new, facts.key_sources),
        _ => Ok(()),
    }
}

/// How many bytes `value` takes as compact JSON, counted without building the text.
fn json_size(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// A Provider write, admitted: see [`provider_key_sources`].
fn provider(old: Option<&Value>, new: &Value, sources: &KeySources) -> ApiResult<()> {
    fn decoded(object: &Value) -> ApiResult<Provider> {
        hive_api::resource::decode::<Provider>(object).map(|(p, _)| p).map_err(|e| {
            ApiError::BadRequest(format!(
                "{}: {}",
                if e.field.is_empty() { "provider" } else { &e.field },
                e.message
            ))
        })
    }
    let stored = old.map(decoded).transpose()?;
    provider_key_sources(stored.as_ref(), &decoded(new)?, sources)
}

/// A Provider's Vast.ai key sources must be ones the operator allowed (a 422 naming the
/// field and the flag the operator must pass), checked when a write sets or changes them:
/// a Provider stored before the flags changed can still be edited otherwise — the fleet
/// refuses to read its key, and its status says why. Every write path calls this: the
/// resource API's (POST, PUT, PATCH, apply) through [`check`], ConfigureProvider directly.
pub fn provider_key_sources(old: Option<&Provider>, new: &Provider, sources: &KeySources) -> ApiResult<()> {
    fn sources_of(settings: &VastaiProvider) -> (&Option<String>, &Option<String>, &Option<String>) {
        (&settings.api_key_file, &settings.api_key_env, &settings.base_url)
    }
    let Some(settings) = new.spec.vastai.as_ref() else { return Ok(()) };
    let unchanged = old
        .and_then(|p| p.spec.vastai.as_ref())
        .is_some_and(|before| sources_of(before) == sources_of(settings));
    let errors = if unchanged { vec![] } else { sources.admit(settings) };
    if errors.is_empty() {
        return Ok(());
    }
    Err(ApiError::Invalid { kind: "Provider".into(), name: new.metadata.name.clone(), errors })
}

/// A Node is the record a Provision FleetCommand writes, with its intent, before any
/// provider call; one written by hand would be the record of nothing (a phantom Pending
/// node no provider ever creates). Its creation is refused on every path; existing
/// records stay writable (labels, a status the fleet writes).
fn node_created_by_hand(new: &Value) -> ApiError {
    let name = hive_api::meta::name_of(new);
    ApiError::Forbidden(format!(
        "nodes.hive.dev {name:?} is forbidden: Nodes are created by Provision FleetCommands (a FleetCommand \
         with spec.provision, or `hive fleet provision`), which record each node before its provider \
         creates it; a Node is not created by hand"
    ))
}

/// An admitted approval, typed (admission runs after decoding, so it always decodes).
fn typed(object: &Value) -> ApiResult<Approval> {
    hive_api::resource::decode::<Approval>(object).map(|(approval, _)| approval).map_err(|e| {
        ApiError::BadRequest(format!(
            "{}: {}",
            if e.field.is_empty() { "approval" } else { &e.field },
            e.message
        ))
    })
}

/// The object's `field` (`spec`, `metadata`) as a map to write into. Admitted objects
/// always have both as maps; checking keeps a misshapen one a 400 instead of a panic.
fn map_of<'a>(object: &'a mut Value, field: &str) -> ApiResult<&'a mut Map<String, Value>> {
    object
        .get_mut(field)
        .and_then(Value::as_object_mut)
        .ok_or_else(|| ApiError::BadRequest(format!("{field}: must be an object")))
}

fn approval(principal: &Principal, old: Option<&Value>, new: &mut Value, facts: &Facts<'_>) -> ApiResult<()> {
    let agent_exists = &facts.agent_exists;
    let incoming = typed(new)?;
    let stored = old.map(typed).transpose()?;
    let name = incoming.metadata.name.clone();
    if principal.role == Role::Agent {
        // The middleware lets an agent token through only for creates.
        let agent = principal.agent.as_deref().unwrap_or_default();
        let forbidden = |why: String| {
            ApiError::Forbidden(format!(
                "approvals.hive.dev {name:?} is forbidden: User {:?} (role agent, bound to agent {agent:?}) {why}",
                principal.name
            ))
        };
        if old.is_some() {
            return Err(forbidden("cannot change an approval".into()));
        }
        let target = incoming.spec.target.as_deref().unwrap_or_default();
        if target != agent {
            return Err(forbidden(format!("may only request approvals for itself, not for {target:?}")));
        }
        let kind = incoming.spec.kind;
        if !matches!(kind, ApprovalKind::ApplyCommit | ApprovalKind::MergeConfigPr) {
            return Err(forbidden(format!(
                "may only request its own config changes (ApplyCommit, MergeConfigPr), not {}",
                kind.as_str()
            )));
        }
        if incoming.spec.decision.state != DecisionState::Pending {
            return Err(forbidden("cannot decide an approval".into()));
        }
        // It could never remove them (an agent token cannot change an approval), and the
        // approval could then never be deleted.
        if !incoming.metadata.finalizers.is_empty() {
            return Err(forbidden("cannot set finalizers (it could never remove them)".into()));
        }
        // A controlling owner claims the approval for that object (its controller's to
        // manage, its garbage to collect); an agent token names none.
        if let Some(i) = incoming.metadata.owner_references.iter().position(|o| o.controller == Some(true)) {
            return Err(forbidden(format!(
                "cannot set metadata.ownerReferences[{i}].controller: an agent token names no controlling owner"
            )));
        }
        let pending = (facts.pending_approvals)(agent);
        if pending >= MAX_PENDING_APPROVALS_PER_AGENT {
            (facts.refused)("pending_approvals");
            return Err(forbidden(format!(
                "exceeded quota: {pending} of its approvals are undecided, the most an agent may have \
                 open ({MAX_PENDING_APPROVALS_PER_AGENT}); an operator decides or deletes them first"
            )));
        }
        map_of(new, "spec")?.insert("requestedBy".into(), json!(agent));
    } else if old.is_none() && incoming.spec.requested_by.as_deref().is_none_or(str::is_empty) {
        map_of(new, "spec")?.insert("requestedBy".into(), json!(principal.name));
    }

    // A config change for an agent that does not exist would wait for a decision that
    // could only fail. Checked after who may ask, so the answer is no existence oracle.
    // (A Spawn names the agent it will create.)
    let changes_config =
        matches!(incoming.spec.kind, ApprovalKind::ApplyCommit | ApprovalKind::MergeConfigPr);
    if let Some(target) =
        incoming.spec.target.as_deref().filter(|t| old.is_none() && changes_config && !t.is_empty())
    {
        if !agent_exists(target) {
            return Err(ApiError::Invalid {
                kind: "Approval".into(),
                name,
                errors: vec![hive_api::validation::ValidationError::new(
                    "spec.target",
                    hive_api::validation::Reason::Invalid,
                    format!("agents.hive.dev {target:?} not found: a config change needs an existing agent"),
                )],
            });
        }
    }

    // Who decided and when are the server's record: a client cannot set or move them.
    let before = stored.as_ref().map_or(DecisionState::Pending, |o| o.spec.decision.state);
    let decided_now =
        before == DecisionState::Pending && incoming.spec.decision.state != DecisionState::Pending;
    let kept = |key: &str| stored.as_ref().and_then(|o| o.metadata.annotations.get(key).cloned());
    let (by, at) = if decided_now {
        (
            Some(principal.name.to_string()),
            Some(crate::host::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        )
    } else {
        (kept(DECIDED_BY), kept(DECIDED_AT))
    };
    let metadata = map_of(new, "metadata")?;
    let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
    if !annotations.is_object() {
        *annotations = json!({});
    }
    let annotations = annotations.as_object_mut().expect("just made an object");
    for (key, value) in [(DECIDED_BY, by), (DECIDED_AT, at)] {
        match value {
            Some(v) => {
                annotations.insert(key.into(), json!(v));
            }
            None => {
                annotations.remove(key);
            }
        }
    }
    if annotations.is_empty() {
        metadata.remove("annotations");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(role: Role, agent: Option<&str>) -> Principal {
        Principal { name: format!("{role}-token").into(), role, agent: agent.map(Into::into) }
    }

    fn approval_object(target: &str, kind: &str, state: &str) -> Value {
        json!({"metadata": {"name": "a1"}, "spec": {"kind": kind, "target": target, "decision": {"state": state}}})
    }

    fn kind() -> &'static KindInfo {
        hive_api::kind_by_plural("approvals").unwrap()
    }

    fn any_agent() -> Facts<'static> {
        Facts::new(|_| true, &crate::fleet::providers::keys::NONE)
    }

    #[test]
    fn an_agent_token_requests_only_its_own_config_changes() {
        let alpha = principal(Role::Agent, Some("alpha"));
        let mut ok = approval_object("alpha", "ApplyCommit", "Pending");
        ok["spec"]["requestedBy"] = json!("someone-else");
        check(kind(), &alpha, None, &mut ok, None, &any_agent()).unwrap();
        assert_eq!(ok["spec"]["requestedBy"], "alpha", "the server sets who asked");
        for (target, kind_, state, why) in [
            ("beta", "ApplyCommit", "Pending", "not for \"beta\""),
            ("alpha", "Spawn", "Pending", "not Spawn"),
            ("alpha", "MergeConfigPr", "Approved", "cannot decide"),
        ] {
            let mut bad = approval_object(target, kind_, state);
            let err = check(kind(), &alpha, None, &mut bad, None, &any_agent()).unwrap_err();
            assert!(matches!(&err, ApiError::Forbidden(m) if m.contains(why)), "{err:?}");
        }
        // Regression (issue 14, item 8): an agent token could add finalizers it could
        // never remove, so the approval could never be deleted.
        let mut pinned = approval_object("alpha", "ApplyCommit", "Pending");
        pinned["metadata"]["finalizers"] = json!(["example.com/keep"]);
        let err = check(kind(), &alpha, None, &mut pinned, None, &any_agent()).unwrap_err();
        assert!(matches!(&err, ApiError::Forbidden(m) if m.contains("finalizers")), "{err:?}");
        let old = approval_object("alpha", "ApplyCommit", "Pending");
        let mut change = old.clone();
        let err = check(kind(), &alpha, Some(&old), &mut change, None, &any_agent()).unwrap_err();
        assert!(matches!(err, ApiError::Forbidden(_)));
    }

    /// Issue 28 item 8: an agent token could store an approval that names another agent
    /// as its controlling owner (`controller: true`), claiming it for that agent.
    #[test]
    fn an_agent_token_cannot_name_a_controlling_owner() {
        let alpha = principal(Role::Agent, Some("alpha"));
        let owner = |name: &str, controller: bool| json!([{"apiVersion": "hive.dev/v1", "kind": "Agent", "name": name, "uid": "u", "controller": controller}]);
        let mut claimed = approval_object("alpha", "ApplyCommit", "Pending");
        claimed["metadata"]["ownerReferences"] = owner("beta", true);
        let err = check(kind(), &alpha, None, &mut claimed, None, &any_agent()).unwrap_err();
        assert!(
            matches!(&err, ApiError::Forbidden(m) if m.contains("metadata.ownerReferences[0].controller")),
            "{err:?}"
        );
        let mut plain = approval_object("alpha", "ApplyCommit", "Pending");
        plain["metadata"]["ownerReferences"] = owner("alpha", false);
        check(kind(), &alpha, None, &mut plain, None, &any_agent()).unwrap();
        let mut by_admin = approval_object("alpha", "ApplyCommit", "Pending");
        by_admin["metadata"]["ownerReferences"] = owner("beta", true);
        check(kind(), &principal(Role::Admin, None), None, &mut by_admin, None, &any_agent()).unwrap();
    }

    #[test]
    fn a_misshapen_spec_or_metadata_is_a_400_not_a_panic() {
        let op = principal(Role::Operator, None);
        for (bad, field) in [
            (json!({"metadata": {"name": "a1"}, "spec": [1]}), "spec"),
            (json!({"metadata": [null], "spec": {}}), "metadata"),
        ] {
            let mut object = bad.clone();
            let err = check(kind(), &op, None, &mut object, None, &any_agent()).unwrap_err();
            assert!(matches!(&err, ApiError::BadRequest(m) if m.starts_with(field)), "{bad}: {err:?}");
        }
    }

    #[test]
    fn the_decider_and_time_are_recorded_by_the_server_once() {
        let op = principal(Role::Operator, None);
        let mut created = approval_object("alpha", "ApplyCommit", "Pending");
        created["metadata"]["annotations"] = json!({DECIDED_BY: "forged"});
        check(kind(), &op, None, &mut created, None, &any_agent()).unwrap();
        assert_eq!(created["spec"]["requestedBy"], "operator-token");
        assert!(created["metadata"].get("annotations").is_none(), "a forged decider is dropped: {created}");

        let mut approved = created.clone();
        approved["spec"]["decision"]["state"] = json!("Approved");
        check(kind(), &op, Some(&created), &mut approved, None, &any_agent()).unwrap();
        assert_eq!(approved["metadata"]["annotations"][DECIDED_BY], "operator-token");
        assert!(approved["metadata"]["annotations"][DECIDED_AT].as_str().unwrap().ends_with('Z'));

        // A later write by someone else keeps the record as it was.
        let admin = principal(Role::Admin, None);
        let mut relabel = approved.clone();
        relabel["metadata"]["annotations"][DECIDED_BY] = json!("admin-token");
        check(kind(), &admin, Some(&approved), &mut relabel, None, &any_agent()).unwrap();
        assert_eq!(relabel["metadata"]["annotations"][DECIDED_BY], "operator-token");
    }

    #[test]
    fn a_provider_names_only_key_sources_the_operator_allowed() {
        let providers = hive_api::kind_by_plural("providers").unwrap();
        let admin = principal(Role::Admin, None);
        let vastai = |settings: Value| json!({"metadata": {"name": "v"}, "spec": {"type": "vastai", "vastai": settings}});
        let none = Facts::new(|_| true, &crate::fleet::providers::keys::NONE);
        for (settings, field) in [
            (json!({"apiKeyFile": "/etc/hostname"}), "spec.vastai.apiKeyFile"),
            (json!({"apiKeyEnv": "HOME"}), "spec.vastai.apiKeyEnv"),
        ] {
            let mut object = vastai(settings.clone());
            let err = check(providers, &admin, None, &mut object, None, &none).unwrap_err();
            let ApiError::Invalid { errors, .. } = &err else { panic!("{err:?}") };
            assert_eq!(errors.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(), [field], "{settings}");
            // A status write and an unchanged source (stored before the flags changed)
            // pass; the fleet refuses to read it.
            check(providers, &admin, None, &mut object.clone(), Some("status"), &none).unwrap();
            let mut relabelled = object.clone();
            relabelled["metadata"]["labels"] = json!({"a": "b"});
            check(providers, &admin, Some(&object), &mut relabelled, None, &none).unwrap();
        }
        // A runtime-configured key (no source named) may use any base URL.
        let mut runtime = vastai(json!({"baseUrl": "http://127.0.0.1:1/api/v0"}));
        check(providers, &admin, None, &mut runtime, None, &none).unwrap();
        let mut process = json!({"metadata": {"name": "p"}, "spec": {"type": "process"}});
        check(providers, &admin, None, &mut process, None, &none).unwrap();
    }
}
