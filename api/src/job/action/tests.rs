use serde_json::{json, Value};

use super::*;

fn map(params: Value) -> Map<String, Value> {
    match params {
        Value::Object(map) => map,
        other => panic!("params must be an object: {other}"),
    }
}

/// `field: message` of each problem, or the action.
fn parse(kind: JobNodeKind, params: Value) -> Result<NodeAction, Vec<String>> {
    NodeAction::parse(kind, &map(params)).map_err(|e| e.errors.iter().map(ToString::to_string).collect())
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_kind_parses_its_params_and_defaults() {
    use JobNodeKind::*;
    let meta_lock = |inputs: &[&str], agents: Option<&[&str]>, non_fatal| NodeAction::MetaLock {
        inputs: strings(inputs),
        agents: agents.map(strings),
        non_fatal,
    };
    let cases: Vec<(JobNodeKind, Value, NodeAction)> = vec![
        (SetWanted, json!({"wanted": "Up"}), NodeAction::SetWanted { wanted: Wanted::Up }),
        (SetWanted, json!({"wanted": "Offline"}), NodeAction::SetWanted { wanted: Wanted::Offline }),
        (Reconcile, json!({}), NodeAction::Reconcile { kill: false }),
        (Reconcile, json!({"kill": true}), NodeAction::Reconcile { kill: true }),
        (StopForUpdate, json!({}), NodeAction::StopForUpdate),
        (Signal, json!({}), NodeAction::Signal),
        (Drain, json!({}), NodeAction::Drain),
        (WriteDropin, json!({}), NodeAction::WriteDropin),
        (WritePermFile, json!({}), NodeAction::WritePermFile),
        (Prebuild, json!({}), NodeAction::Prebuild { relock: true }),
        (Prebuild, json!({"relock": false}), NodeAction::Prebuild { relock: false }),
        (Swap, json!({}), NodeAction::Swap),
        (Create, json!({}), NodeAction::Create { relock: true }),
        (Create, json!({"relock": false}), NodeAction::Create { relock: false }),
        (Vacate, json!({}), NodeAction::Vacate { from: None }),
        (Vacate, json!({"from": "node-1"}), NodeAction::Vacate { from: Some("node-1".into()) }),
        (MetaLock, json!({"inputs": ["hive"]}), meta_lock(&["hive"], None, false)),
        (
            MetaLock,
            json!({"inputs": ["hive", "alpha"], "agents": ["p", "c"], "nonFatal": true}),
            meta_lock(&["hive", "alpha"], Some(&["p", "c"]), true),
        ),
        (MetaLock, json!({"inputs": ["hive"], "agents": []}), meta_lock(&["hive"], Some(&[]), false)),
        (
            ApprovalDeploy,
            json!({"approval": "apr-1"}),
            NodeAction::ApprovalDeploy { approval: "apr-1".into() },
        ),
    ];
    for (kind, params, want) in cases {
        assert_eq!(parse(kind, params.clone()), Ok(want.clone()), "{kind:?} {params}");
        assert_eq!(want.kind(), kind);
    }
}

#[test]
fn bad_params_are_refused_naming_the_field() {
    use JobNodeKind::*;
    let cases: Vec<(JobNodeKind, Value, &[&str])> = vec![
        (
            Prebuild,
            json!({"relok": false}),
            &["params.relok: Unsupported value: \"relok\" (Prebuild takes: relock)"],
        ),
        (Prebuild, json!({"relock": "yes"}), &["params.relock: Invalid value: \"yes\": must be true or false"]),
        (Reconcile, json!({"kill": 1}), &["params.kill: Invalid value: 1: must be true or false"]),
        (Swap, json!({"rev": "abc"}), &["params.rev: Unsupported value: \"rev\" (Swap takes no params)"]),
        (
            Signal,
            json!({"a": 1, "b": 2}),
            &[
                "params.a: Unsupported value: \"a\" (Signal takes no params)",
                "params.b: Unsupported value: \"b\" (Signal takes no params)",
            ],
        ),
        (
            SetWanted,
            json!({}),
            &["params.wanted: Required value: a SetWanted node names the intent it writes: Up or Offline"],
        ),
        (
            SetWanted,
            json!({"wanted": "Sideways"}),
            &["params.wanted: Unsupported value: \"Sideways\": supported values: \"Offline\", \"Up\""],
        ),
        (SetWanted, json!({"wanted": null}), &["params.wanted: Invalid value: null: must be a string"]),
        (
            SetWanted,
            json!({"wanted": "Up", "kill": true}),
            &["params.kill: Unsupported value: \"kill\" (SetWanted takes: wanted)"],
        ),
        (
            MetaLock,
            json!({}),
            &["params.inputs: Required value: a MetaLock node names the meta inputs it bumps (\"hive\" or agents' names)"],
        ),
        (MetaLock, json!({"inputs": []}), &["params.inputs: Required value: must name at least one input"]),
        (MetaLock, json!({"inputs": "hive"}), &["params.inputs: Invalid value: \"hive\": must be a list of strings"]),
        (
            MetaLock,
            json!({"inputs": ["hive", 7, "hive"]}),
            &["params.inputs[1]: Invalid value: 7: must be a string"],
        ),
        (MetaLock, json!({"inputs": ["hive", "hive"]}), &["params.inputs[1]: Duplicate value: \"hive\""]),
        (
            MetaLock,
            json!({"inputs": ["hive"], "agents": ["ok", "Not_ok"], "nonFatal": "no", "relock": true}),
            &[
                "params.relock: Unsupported value: \"relock\" (MetaLock takes: inputs, agents, nonFatal)",
                "params.agents[1]: Invalid value: \"Not_ok\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name', or '123-abc')",
                "params.nonFatal: Invalid value: \"no\": must be true or false",
            ],
        ),
        (
            ApprovalDeploy,
            json!({}),
            &["params.approval: Required value: an ApprovalDeploy node names the Approval it deploys"],
        ),
        (ApprovalDeploy, json!({"approval": ["a"]}), &["params.approval: Invalid value: [\"a\"]: must be a string"]),
        (ApprovalDeploy, json!({"approval": ""}), &["params.approval: Required value: name is required"]),
        (Vacate, json!({"from": 3}), &["params.from: Invalid value: 3: must be a string"]),
        (
            Vacate,
            json!({"from": "Node_1"}),
            &["params.from: Invalid value: \"Node_1\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name', or '123-abc')"],
        ),
        (Create, json!({"relock": "no"}), &["params.relock: Invalid value: \"no\": must be true or false"]),
    ];
    for (kind, params, want) in cases {
        assert_eq!(parse(kind, params.clone()), Err(strings(want)), "{kind:?} {params}");
    }
}

#[test]
fn long_keys_and_values_are_cut_in_messages() {
    let key = "k".repeat(10_000);
    let errors = parse(JobNodeKind::Swap, json!({ key.clone(): "v".repeat(10_000) })).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].len() < 300, "{}", errors[0]);
    assert!(errors[0].starts_with(&format!("params.{}…: ", "k".repeat(MAX_QUOTED))), "{}", errors[0]);
    let errors = parse(JobNodeKind::Prebuild, json!({"relock": "é".repeat(5_000)})).unwrap_err();
    assert!(errors[0].len() < 300, "{}", errors[0]);
}

#[test]
fn params_write_back_what_parse_reads() {
    let actions = [
        NodeAction::SetWanted { wanted: Wanted::Offline },
        NodeAction::SetWanted { wanted: Wanted::Up },
        NodeAction::Reconcile { kill: false },
        NodeAction::Reconcile { kill: true },
        NodeAction::StopForUpdate,
        NodeAction::Signal,
        NodeAction::Drain,
        NodeAction::WriteDropin,
        NodeAction::WritePermFile,
        NodeAction::Prebuild { relock: true },
        NodeAction::Prebuild { relock: false },
        NodeAction::Swap,
        NodeAction::Create { relock: true },
        NodeAction::Create { relock: false },
        NodeAction::Vacate { from: None },
        NodeAction::Vacate { from: Some("node-2".into()) },
        NodeAction::MetaLock { inputs: strings(&["hive"]), agents: None, non_fatal: false },
        NodeAction::MetaLock { inputs: strings(&["a"]), agents: Some(strings(&["a"])), non_fatal: true },
        NodeAction::ApprovalDeploy { approval: "apr-1".into() },
    ];
    for action in actions {
        assert_eq!(NodeAction::parse(action.kind(), &action.params()), Ok(action.clone()));
        // The serde form is the wire form, read through the same parse.
        let wire = serde_json::to_value(&action).unwrap();
        assert_eq!(wire["kind"], action.kind().as_str());
        assert_eq!(serde_json::from_value::<NodeAction>(wire).unwrap(), action);
    }
}

#[test]
fn the_wire_form_is_what_hive_always_wrote() {
    let wire = |action: NodeAction| serde_json::to_value(action).unwrap();
    assert_eq!(wire(NodeAction::Prebuild { relock: true }), json!({"kind": "Prebuild"}));
    assert_eq!(
        wire(NodeAction::Prebuild { relock: false }),
        json!({"kind": "Prebuild", "params": {"relock": false}})
    );
    assert_eq!(
        wire(NodeAction::Reconcile { kill: true }),
        json!({"kind": "Reconcile", "params": {"kill": true}})
    );
    assert_eq!(
        wire(NodeAction::SetWanted { wanted: Wanted::Up }),
        json!({"kind": "SetWanted", "params": {"wanted": "Up"}})
    );
    assert_eq!(
        wire(NodeAction::MetaLock { inputs: strings(&["hive"]), agents: Some(vec![]), non_fatal: true }),
        json!({"kind": "MetaLock", "params": {"inputs": ["hive"], "agents": [], "nonFatal": true}})
    );
    let refused = serde_json::from_value::<NodeAction>(json!({"kind": "Prebuild", "params": {"relok": 1}}));
    assert!(refused.unwrap_err().to_string().contains("params.relok"));
    let refused = serde_json::from_value::<NodeAction>(json!({"kind": "Swap", "extra": 1}));
    assert!(refused.is_err());
}

#[test]
fn problems_are_placed_under_their_node() {
    let err = NodeAction::parse(JobNodeKind::Prebuild, &map(json!({"relok": true}))).unwrap_err();
    let placed = err.at("spec.nodes[3]");
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].field, "spec.nodes[3].params.relok");
    assert_eq!(placed[0].reason, Reason::NotSupported);
    assert_eq!(err.to_string(), "params.relok: Unsupported value: \"relok\" (Prebuild takes: relock)");
}
