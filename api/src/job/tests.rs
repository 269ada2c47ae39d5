use serde_json::json;

use super::*;
use crate::meta::Time;
use crate::resource::{decode, validate};

/// A stop of two agents, one online (graceful) and one offline: one Job, one subgraph
/// per agent.
fn valid() -> Value {
    json!({
        "apiVersion": "hive.dev/v1",
        "kind": "Job",
        "metadata": {"name": "stop-1"},
        "spec": {
            "template": "Stop",
            "reason": "operator stop",
            "source": "Cli",
            "nodes": [
                {"id": "a-wanted", "kind": "SetWanted", "agent": "alpha", "params": {"wanted": "Offline"}},
                {"id": "a-signal", "kind": "Signal", "agent": "alpha", "deps": [{"node": "a-wanted", "edge": "AfterOk"}]},
                {"id": "a-drain", "kind": "Drain", "agent": "alpha", "deps": [{"node": "a-signal", "edge": "AfterOk"}]},
                {"id": "a-reconcile", "kind": "Reconcile", "agent": "alpha", "deps": [{"node": "a-drain", "edge": "AfterOk"}]},
                {"id": "b-wanted", "kind": "SetWanted", "agent": "beta", "params": {"wanted": "Offline"}},
                {"id": "b-reconcile", "kind": "Reconcile", "agent": "beta", "deps": [{"node": "b-wanted", "edge": "AfterOk"}]}
            ]
        }
    })
}

fn job(nodes: Value) -> Value {
    json!({"metadata": {"name": "j"}, "spec": {"template": "Rebuild", "nodes": nodes}})
}

fn node(id: &str, deps: &[&str]) -> Value {
    let deps: Vec<Value> = deps.iter().map(|d| json!({"node": d})).collect();
    json!({"id": id, "kind": "Reconcile", "agent": "alpha", "deps": deps})
}

#[test]
fn valid_job_round_trips() {
    let (job, unknown) = decode::<Job>(&valid()).unwrap();
    assert!(unknown.is_empty());
    assert_eq!(validate(&job), vec![]);
    let mut want = valid();
    want["status"] = json!({});
    assert_eq!(serde_json::to_value(&job).unwrap(), want);
    assert_eq!(job.agents(), ["alpha", "beta"]);
}

#[test]
fn edge_defaults_to_after_ok() {
    let (job, _) = decode::<Job>(&job(json!([node("a", &[]), node("b", &["a"])]))).unwrap();
    assert_eq!(job.spec.nodes[1].deps, [Dep { node: "a".into(), edge: Edge::AfterOk }]);
    assert_eq!(job.spec.source, JobSource::Api);
}

#[test]
fn spec_and_status_references_are_checked() {
    let mut value = valid();
    value["spec"]["parent"] = json!("Parent");
    value["spec"]["inputs"] = json!(["hyperhive", "hyperhive"]);
    value["status"] = json!({"phase": "Running", "nodes": [{"id": "a-wanted", "state": "Done"},
        {"id": "zz"}, {"id": "a-wanted"}], "children": ["ok", "Not_ok"]});
    let fields: Vec<String> =
        validate(&decode::<Job>(&value).unwrap().0).into_iter().map(|e| e.field).collect();
    assert_eq!(
        fields,
        ["spec.parent", "spec.inputs[1]", "status.nodes[1].id", "status.nodes[2].id", "status.children[1]"]
    );
}

#[test]
fn unknown_fields_and_bad_kinds() {
    let mut value = valid();
    value["spec"]["bogus"] = json!(1);
    value["spec"]["nodes"][1]["deps"][0]["weight"] = json!(2);
    let (_, mut unknown) = decode::<Job>(&value).unwrap();
    unknown.sort();
    assert_eq!(unknown, ["spec.bogus", "spec.nodes[1].deps[0].weight"]);

    let mut value = valid();
    value["spec"]["nodes"][2]["kind"] = json!("Teleport");
    assert_eq!(decode::<Job>(&value).unwrap_err().field, "spec.nodes[2].kind");
}

#[test]
fn a_template_job_names_agents_instead_of_nodes() {
    let fields = |spec: Value| -> Vec<String> {
        let value = json!({"metadata": {"name": "j"}, "spec": spec});
        validate(&decode::<Job>(&value).unwrap().0).into_iter().map(|e| e.field).collect()
    };
    assert_eq!(fields(json!({"template": "Restart", "agents": ["alpha"]})), Vec::<String>::new());
    assert_eq!(fields(json!({"template": "Restart"})), ["spec.nodes"]);
    assert_eq!(fields(json!({"template": "MetaUpdate", "agents": ["alpha"]})), ["spec.template"]);
    assert_eq!(fields(json!({"template": "Stop", "agents": ["alpha", "Not_ok"]})), ["spec.agents[1]"]);
}

#[test]
fn the_spec_is_fixed_once_claimed() {
    let (old, _) = decode::<Job>(&valid()).unwrap();
    let mut new = old.clone();
    new.spec.reason = Some("edited".into());
    let errors = |old: &Job| {
        let mut errors = Errors::default();
        new.validate_update(old, &mut errors);
        errors.0.into_iter().map(|e| e.field).collect::<Vec<_>>()
    };
    assert_eq!(errors(&old), Vec::<String>::new(), "unclaimed: the intake may still expand it");
    let mut claimed = old.clone();
    claimed.status.claim = Some(JobClaim { run: "run-1".into(), at: Time(chrono::DateTime::UNIX_EPOCH) });
    assert_eq!(errors(&claimed), ["spec.reason"]);
}

#[test]
fn roll_up() {
    use JobNodeState::*;
    let cases: &[(&[JobNodeState], JobPhase)] = &[
        (&[Queued, Queued], JobPhase::Queued),
        (&[Running, Queued], JobPhase::Running),
        (&[Done, Queued], JobPhase::Running),
        (&[Failed, Running], JobPhase::Failed),
        (&[Failed, Queued], JobPhase::Failed),
        (&[Done, Done], JobPhase::Done),
        (&[Done, Failed, Cancelled], JobPhase::Failed),
        (&[Done, Cancelled], JobPhase::Cancelled),
        (&[Cancelled, Cancelled], JobPhase::Cancelled),
    ];
    for (states, want) in cases {
        assert_eq!(JobPhase::roll_up(states.iter().copied()), *want, "{states:?}");
    }
}

#[test]
fn cells_match_columns() {
    let (mut job, _) = decode::<Job>(&valid()).unwrap();
    job.status.phase = Some(JobPhase::Running);
    job.status.nodes = vec![
        JobNodeStatus { id: "a-wanted".into(), state: JobNodeState::Done, ..Default::default() },
        JobNodeStatus { id: "b-wanted".into(), state: JobNodeState::Done, ..Default::default() },
        JobNodeStatus { id: "a-signal".into(), state: JobNodeState::Running, ..Default::default() },
    ];
    assert_eq!(Job::columns().len(), job.cells().len());
    assert_eq!(
        job.cells(),
        vec![
            json!("Stop"),
            json!("Running"),
            json!("2/6"),
            json!(0),
            json!(0),
            json!("alpha,beta"),
            json!("Cli"),
            json!("operator stop")
        ]
    );
}

fn fields(value: &Value) -> Vec<String> {
    validate(&decode::<Job>(value).unwrap().0).into_iter().map(|e| e.field).collect()
}

#[test]
fn bad_params_are_refused_at_their_field() {
    let mut value = valid();
    value["spec"]["nodes"][0]["params"] = json!({"wanted": "Offline", "relok": true});
    value["spec"]["nodes"][1]["params"] = json!({"force": true});
    value["spec"]["nodes"][3]["params"] = json!({"kill": "yes"});
    value["spec"]["nodes"][4]["params"] = json!({});
    assert_eq!(
        fields(&value),
        [
            "spec.nodes[0].params.relok",
            "spec.nodes[1].params.force",
            "spec.nodes[3].params.kill",
            "spec.nodes[4].params.wanted"
        ]
    );
    let (job, _) = decode::<Job>(&value).unwrap();
    let errors = validate(&job);
    assert_eq!(
        errors[0].to_string(),
        "spec.nodes[0].params.relok: Unsupported value: \"relok\" (SetWanted takes: wanted)"
    );
}

/// A claimed (or settled) Job's spec is fixed: a Job stored before its params were
/// checked can still be claimed and have its progress written; its scheduler fails the
/// node that does not parse. The graph is checked whatever the status.
#[test]
fn the_params_of_a_job_no_longer_waiting_are_not_checked_again() {
    let mut value = valid();
    value["spec"]["nodes"][2]["params"] = json!({"relok": true});
    assert_eq!(fields(&value), ["spec.nodes[2].params.relok"]);
    let mut claimed = value.clone();
    claimed["status"] = json!({"claim": {"run": "run-1", "at": "2026-01-01T00:00:00Z"}, "phase": "Running"});
    assert_eq!(fields(&claimed), Vec::<String>::new());
    let mut cancelled = value.clone();
    cancelled["status"] = json!({"phase": "Cancelled"});
    assert_eq!(fields(&cancelled), Vec::<String>::new());
    claimed["spec"]["nodes"][2]["deps"] = json!([{"node": "nowhere"}]);
    assert_eq!(fields(&claimed), ["spec.nodes[2].deps[0]"]);

    let (job, _) = decode::<Job>(&value).unwrap();
    let mut graph = Errors::default();
    job.spec.validate_graph(&mut graph);
    assert!(graph.is_empty(), "{:?}", graph.0);
    let actions: Vec<bool> = job.spec.nodes.iter().map(|n| n.action().is_ok()).collect();
    assert_eq!(actions, [true, true, false, true, true, true]);
}

#[test]
fn nodes_built_from_actions_are_their_wire_form() {
    let node = JobNode::from_action("a/prebuild", Some("a"), &NodeAction::Prebuild { relock: false });
    assert_eq!(
        serde_json::to_value(&node).unwrap(),
        json!({"id": "a/prebuild", "kind": "Prebuild", "agent": "a", "params": {"relock": false}})
    );
    assert_eq!(node.action(), Ok(NodeAction::Prebuild { relock: false }));
    let node = JobNode::from_action("a/swap", Some("a"), &NodeAction::Swap);
    assert_eq!(serde_json::to_value(&node).unwrap(), json!({"id": "a/swap", "kind": "Swap", "agent": "a"}));
}

/// The OpenAPI description of `params` (what `kubectl explain` shows) names every param
/// of every kind.
#[test]
fn the_schema_of_params_names_each_kind_s_params() {
    use utoipa::PartialSchema;
    let schema = serde_json::to_value(JobNode::schema()).unwrap();
    let described = schema["properties"]["params"]["description"].as_str().unwrap().to_string();
    let kinds = [
        JobNodeKind::SetWanted,
        JobNodeKind::Reconcile,
        JobNodeKind::StopForUpdate,
        JobNodeKind::Signal,
        JobNodeKind::Drain,
        JobNodeKind::WriteDropin,
        JobNodeKind::WritePermFile,
        JobNodeKind::Prebuild,
        JobNodeKind::Swap,
        JobNodeKind::Create,
        JobNodeKind::MetaLock,
        JobNodeKind::ApprovalDeploy,
    ];
    for kind in kinds {
        assert!(described.contains(&format!("`{}`", kind.as_str())), "{kind:?}: {described}");
        for param in kind.param_names() {
            assert!(described.contains(&format!("`{param}`")), "{kind:?} {param}: {described}");
        }
    }
}

#[test]
fn priority_and_deadline_are_bounded_and_named() {
    let mut value = valid();
    value["spec"]["priority"] = json!(1001);
    value["spec"]["activeDeadlineSeconds"] = json!(0);
    let errors = validate(&decode::<Job>(&value).unwrap().0);
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["spec.priority", "spec.activeDeadlineSeconds"], "{errors:?}");
    assert!(errors[0].message.contains("between -1000 and 1000"), "{errors:?}");

    value["spec"]["priority"] = json!(-1000);
    value["spec"]["activeDeadlineSeconds"] = json!(MAX_DEADLINE_SECONDS);
    let (job, _) = decode::<Job>(&value).unwrap();
    assert_eq!(validate(&job), vec![]);
    assert_eq!(job.spec.scheduling().priority, -1000);
    // Defaults are left out of the stored form.
    let (plain, _) = decode::<Job>(&valid()).unwrap();
    assert_eq!(plain.spec.priority, 0);
    let stored = serde_json::to_value(&plain).unwrap();
    assert!(
        stored["spec"].get("priority").is_none() && stored["spec"].get("activeDeadlineSeconds").is_none()
    );
}

#[test]
fn retries_only_where_a_retry_is_safe_and_within_bounds() {
    let mut value = job(json!([
        {"id": "p", "kind": "Prebuild", "agent": "a", "retry": {"limit": 3, "backoff": {"initial": "1s", "max": "4s", "factor": 2}}},
        {"id": "s", "kind": "Swap", "agent": "a", "deps": [{"node": "p"}], "retry": {"limit": 1}},
        {"id": "c", "kind": "Create", "agent": "b", "retry": {"limit": 21, "backoff": {"initial": "soon", "max": "2h", "factor": 11}}}
    ]));
    value["spec"]["retry"] = json!({"limit": 2, "backoff": {"initial": "10s", "max": "5s"}});
    let errors = validate(&decode::<Job>(&value).unwrap().0);
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.retry.backoff.max",
            "spec.nodes[1].retry",
            "spec.nodes[2].retry.limit",
            "spec.nodes[2].retry.backoff.initial",
            "spec.nodes[2].retry.backoff.max",
            "spec.nodes[2].retry.backoff.factor",
        ],
        "{errors:?}"
    );
    assert!(errors[1].message.contains("only Prebuild, Create and MetaLock nodes retry"), "{errors:?}");
    let (job, _) = decode::<Job>(&value).unwrap();
    let policy = job.spec.nodes[0].retry_policy(None).unwrap();
    assert_eq!(policy.limit, 3);
    let waits: Vec<u64> = (1..=4).map(|a| policy.backoff(a).as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 4]);
    assert_eq!(job.spec.nodes[1].retry_policy(job.spec.retry.as_ref()), None, "a Swap never retries");
    // A node without its own takes the Job's, defaults filled in.
    let mut plain = job.spec.nodes[0].clone();
    plain.retry = None;
    let default = Retry { limit: 2, backoff: None };
    let policy = plain.retry_policy(Some(&default)).unwrap();
    assert_eq!((policy.limit, policy.initial.as_secs(), policy.max.as_secs()), (2, 10, 300));
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("1.5s"), None);
}

#[test]
fn ttl_after_finished_is_bounded_and_named() {
    for (ttl, refused) in [(json!(-1), true), (json!(MAX_TTL_SECONDS + 1), true), (json!(0), false)] {
        let mut value = valid();
        value["spec"]["ttlSecondsAfterFinished"] = ttl.clone();
        let errors = validate(&decode::<Job>(&value).unwrap().0);
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        let want: &[&str] = if refused { &["spec.ttlSecondsAfterFinished"] } else { &[] };
        assert_eq!(fields, want, "{ttl}: {errors:?}");
        if refused {
            assert!(errors[0].message.contains("between 0 and 31536000"), "{errors:?}");
        }
    }
    let (plain, _) = decode::<Job>(&valid()).unwrap();
    let stored = serde_json::to_value(&plain).unwrap();
    assert!(stored["spec"].get("ttlSecondsAfterFinished").is_none(), "absent when unset");
}

/// When a Job expires, as a table: its own TTL first, else the daemon's max age, counted
/// from `status.finishedAt`; never while it has not settled.
#[test]
fn a_job_expires_its_ttl_or_else_the_max_age_after_it_finished() {
    let finished = Time(chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().into());
    let at = |seconds: i64| Some(Time(finished.0 + chrono::Duration::seconds(seconds)));
    let hour = Some(Duration::from_secs(3600));
    let settled =
        |phase: JobPhase| JobStatus { phase: Some(phase), finished_at: Some(finished), ..Default::default() };
    let running = JobStatus { phase: Some(JobPhase::Running), ..Default::default() };
    // A Failed Job whose AfterAny Reconcile still runs has no finishedAt yet.
    let failing = JobStatus { phase: Some(JobPhase::Failed), ..Default::default() };
    // What, its TTL, its status, the daemon's max age, when it expires.
    type Case = (&'static str, Option<i64>, JobStatus, Option<Duration>, Option<Time>);
    let cases: Vec<Case> = vec![
        ("done, a TTL", Some(30), settled(JobPhase::Done), None, at(30)),
        ("failed, a TTL", Some(30), settled(JobPhase::Failed), None, at(30)),
        ("cancelled, a TTL of 0", Some(0), settled(JobPhase::Cancelled), None, at(0)),
        ("interrupted, a TTL", Some(5), settled(JobPhase::Interrupted), None, at(5)),
        ("no TTL, no max age: kept", None, settled(JobPhase::Done), None, None),
        ("no TTL: the max age", None, settled(JobPhase::Done), hour, at(3600)),
        ("a longer TTL overrides the max age", Some(7200), settled(JobPhase::Done), hour, at(7200)),
        ("a shorter TTL overrides the max age", Some(10), settled(JobPhase::Failed), hour, at(10)),
        ("running: never", Some(0), running.clone(), hour, None),
        ("failed but not settled: not yet", Some(0), failing, hour, None),
        ("waiting for an intake: never", Some(0), JobStatus::default(), hour, None),
    ];
    for (what, ttl, status, max_age, want) in cases {
        let mut job: Job = decode::<Job>(&valid()).unwrap().0;
        job.spec.ttl_seconds_after_finished = ttl;
        job.status = status;
        assert_eq!(job.expires_at(max_age), want, "{what}");
    }
    // A Job being deleted (a finalizer holds it) is not deleted again.
    let mut job: Job = decode::<Job>(&valid()).unwrap().0;
    job.status = settled(JobPhase::Done);
    job.metadata.deletion_timestamp = Some(finished);
    assert_eq!(job.expires_at(hour), None);
}
