//! No request body, however misshapen, panics a request or gets a 5xx: every write route
//! (create, replace, merge / JSON / apply patch, `/status`, delete options, and the
//! custom POSTs) answers a value of the wrong JSON type at any field with a 4xx `Status`
//! that names the field, and writes nothing.
//!
//! The cases are data: each route has a valid body (the checked-in example manifests for
//! the kinds) and a list of slots — every field of that body, and the metadata fields it
//! leaves out — and a case plants a value of another JSON type at one slot. One test
//! sweeps every slot of every route with fixed values; a property test plants arbitrary
//! JSON (deep nesting included) at random slots.

use std::cell::{Cell, RefCell};
use std::panic::AssertUnwindSafe;
use std::sync::{Once, OnceLock};

use axum::body::Body;
use axum::http::{header, Method, Request};
use axum::Router;
use futures_util::FutureExt;
use hive_api::KindInfo;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use tower::ServiceExt;

use super::params::FieldValidation;
use super::{app, AppState, ServerConfig};
use crate::auth::{Role, TokenStore};
use crate::store::{Mutation, Store, StoreConfig};

// ---------------------------------------------------------------------------------------
// Panics
// ---------------------------------------------------------------------------------------

thread_local! {
    /// Set while this thread serves a request of this test.
    static RECORDING: Cell<bool> = const { Cell::new(false) };
    /// The panics this thread hit while recording.
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Chains a hook that records every panic on a thread that is serving a test request,
/// so that even a panic something inside the server catches fails the test.
fn record_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if RECORDING.with(Cell::get) {
                PANICS.with(|p| p.borrow_mut().push(info.to_string()));
            }
            previous(info);
        }));
    });
}

// ---------------------------------------------------------------------------------------
// Slots and values
// ---------------------------------------------------------------------------------------

/// The JSON type of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

fn shape(value: &Value) -> Shape {
    match value {
        Value::Null => Shape::Null,
        Value::Bool(_) => Shape::Bool,
        Value::Number(_) => Shape::Number,
        Value::String(_) => Shape::String,
        Value::Array(_) => Shape::Array,
        Value::Object(_) => Shape::Object,
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

/// A place in a body where a value of the wrong type is planted.
#[derive(Clone, Debug)]
struct Slot {
    path: Vec<Seg>,
    /// The JSON type the field takes.
    expects: Shape,
    /// Whether `null` is a valid value there (an optional field).
    null_ok: bool,
}

impl Slot {
    fn new(path: &[&str], expects: Shape, null_ok: bool) -> Slot {
        let path = path
            .iter()
            .map(|s| match s.parse() {
                Ok(i) => Seg::Index(i),
                Err(_) => Seg::Key(s.to_string()),
            })
            .collect();
        Slot { path, expects, null_ok }
    }

    /// The field as the server names it: `spec.nodes[0].kind` (empty for the root).
    fn field(&self) -> String {
        render(&self.path)
    }

    /// The JSON pointer of the field.
    fn pointer(&self) -> String {
        self.path
            .iter()
            .map(|s| match s {
                Seg::Key(k) => format!("/{}", k.replace('~', "~0").replace('/', "~1")),
                Seg::Index(i) => format!("/{i}"),
            })
            .collect()
    }

    fn top(&self) -> Option<&str> {
        match self.path.first() {
            Some(Seg::Key(k)) => Some(k),
            _ => None,
        }
    }

    fn under_a_list(&self) -> bool {
        self.path.iter().any(|s| matches!(s, Seg::Index(_)))
    }

    /// `value` if it is wrong here, else a wrong value made from it.
    fn misshape(&self, value: Value) -> Value {
        let s = shape(&value);
        if s != self.expects && !(s == Shape::Null && self.null_ok) {
            value
        } else if self.expects == Shape::Array {
            json!({"not-a-list": value})
        } else {
            json!([value])
        }
    }
}

fn render(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if out.is_empty() => out.push_str(k),
            Seg::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Every field of `body` as a slot, optional (`null` allowed) unless listed in
/// `required`.
fn slots_of(body: &Value, required: &[&str]) -> Vec<Slot> {
    fn walk(value: &Value, path: &mut Vec<Seg>, required: &[&str], out: &mut Vec<Slot>) {
        if !path.is_empty() {
            let field = render(path);
            out.push(Slot {
                path: path.clone(),
                expects: shape(value),
                null_ok: !required.contains(&field.as_str()),
            });
        }
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    path.push(Seg::Key(key.clone()));
                    walk(child, path, required, out);
                    path.pop();
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    path.push(Seg::Index(i));
                    walk(child, path, required, out);
                    path.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(body, &mut Vec::new(), required, &mut out);
    out
}

/// The metadata fields every object takes, with the shapes `ObjectMeta` decodes.
fn metadata_slots() -> Vec<Slot> {
    use Shape::*;
    vec![
        Slot::new(&["metadata"], Object, false),
        Slot::new(&["metadata", "name"], String, true),
        Slot::new(&["metadata", "namespace"], String, true),
        Slot::new(&["metadata", "uid"], String, true),
        Slot::new(&["metadata", "resourceVersion"], String, true),
        Slot::new(&["metadata", "generation"], Number, true),
        Slot::new(&["metadata", "creationTimestamp"], String, true),
        Slot::new(&["metadata", "deletionTimestamp"], String, true),
        Slot::new(&["metadata", "labels"], Object, false),
        Slot::new(&["metadata", "labels", "shape"], String, false),
        Slot::new(&["metadata", "annotations"], Object, false),
        Slot::new(&["metadata", "annotations", "shape"], String, false),
        Slot::new(&["metadata", "finalizers"], Array, false),
        Slot::new(&["metadata", "finalizers", "0"], String, false),
        Slot::new(&["metadata", "ownerReferences"], Array, false),
        Slot::new(&["metadata", "ownerReferences", "0"], Object, false),
        Slot::new(&["metadata", "ownerReferences", "0", "name"], String, false),
        Slot::new(&["metadata", "managedFields"], Array, false),
        Slot::new(&["metadata", "managedFields", "0"], Object, false),
        Slot::new(&["metadata", "managedFields", "0", "manager"], String, false),
        Slot::new(&["metadata", "managedFields", "0", "operation"], String, false),
    ]
}

/// `body` with `value` at `path`, creating the maps and lists on the way.
fn plant(body: &Value, path: &[Seg], value: Value) -> Value {
    fn at(target: &mut Value, path: &[Seg], value: Value) {
        let Some((first, rest)) = path.split_first() else {
            *target = value;
            return;
        };
        let child = match first {
            Seg::Key(key) => {
                if !target.is_object() {
                    *target = json!({});
                }
                let map = target.as_object_mut().expect("made an object");
                map.entry(key.clone()).or_insert(Value::Null)
            }
            Seg::Index(i) => {
                if !target.is_array() {
                    *target = json!([]);
                }
                let items = target.as_array_mut().expect("made an array");
                while items.len() <= *i {
                    items.push(json!({}));
                }
                &mut items[*i]
            }
        };
        at(child, rest, value);
    }
    let mut body = body.clone();
    at(&mut body, path, value);
    body
}

// ---------------------------------------------------------------------------------------
// Routes
// ---------------------------------------------------------------------------------------

/// How a request carries its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// `POST` of the body (to a collection, or a custom route).
    Post,
    /// `PUT` of the body.
    Put,
    /// `PATCH`, merge patch of the body's top-level field holding the slot.
    MergePatch,
    /// `PATCH`, a JSON patch adding the value at the slot.
    JsonPatch,
    /// `PATCH`, server-side apply of the body.
    Apply,
    /// `PATCH`, strategic merge patch (refused for every hive kind).
    StrategicMergePatch,
    /// `DELETE` with the body as `DeleteOptions`.
    Delete,
}

/// A route and the valid body its cases start from.
struct Target {
    what: String,
    path: String,
    ops: Vec<Op>,
    body: Value,
    slots: Vec<Slot>,
}

/// One request, and what its answer must name.
struct Case {
    method: Method,
    path: String,
    content_type: &'static str,
    body: Vec<u8>,
    /// The field a 4xx must name, when the slot is one.
    field: Option<Slot>,
    /// Where the value was planted, for the failure message.
    planted_at: String,
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = String::from_utf8_lossy(&self.body);
        let mut end = body.len().min(400);
        while !body.is_char_boundary(end) {
            end -= 1;
        }
        let more = if end < body.len() { "…" } else { "" };
        let body = &body[..end];
        write!(
            f,
            "{} {} ({}) at {:?}: {body}{more}",
            self.method, self.path, self.content_type, self.planted_at
        )
    }
}

fn case(target: &Target, op: Op, slot: &Slot, value: Value) -> Case {
    let field = (!slot.path.is_empty()).then(|| slot.clone());
    let (method, path, content_type, body) = match op {
        Op::Post | Op::Put | Op::Delete => {
            let method = match op {
                Op::Post => Method::POST,
                Op::Put => Method::PUT,
                _ => Method::DELETE,
            };
            let planted = plant(&target.body, &slot.path, slot.misshape(value));
            (method, target.path.clone(), "application/json", planted)
        }
        Op::MergePatch | Op::StrategicMergePatch => {
            // In a merge patch `null` deletes a field; planted in a list it is a value.
            let slot = Slot { null_ok: slot.null_ok || !slot.under_a_list(), ..slot.clone() };
            let planted = plant(&target.body, &slot.path, slot.misshape(value));
            let patch = match slot.top() {
                Some(top) => json!({top: planted[top]}),
                None => planted,
            };
            let content_type = if op == Op::MergePatch {
                "application/merge-patch+json"
            } else {
                "application/strategic-merge-patch+json"
            };
            (Method::PATCH, target.path.clone(), content_type, patch)
        }
        Op::JsonPatch => {
            let patch = json!([{"op": "add", "path": slot.pointer(), "value": slot.misshape(value)}]);
            (Method::PATCH, target.path.clone(), "application/json-patch+json", patch)
        }
        Op::Apply => {
            let planted = plant(&target.body, &slot.path, slot.misshape(value));
            let path = format!("{}?fieldManager=shape-test", target.path);
            (Method::PATCH, path, "application/apply-patch+yaml", planted)
        }
    };
    // A body nested past the JSON parser's depth limit (128) is refused before any field
    // is read, so it names none; a strategic merge patch is refused by its type alone.
    let readable = depth(&body) < 128;
    let field = field.filter(|_| op != Op::StrategicMergePatch && readable);
    let body = serde_json::to_vec(&body).expect("JSON encodes");
    Case { method, path, content_type, body, field, planted_at: slot.field() }
}

/// How deeply a value nests lists and maps (a scalar is 0).
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// JSON patches whose operations are themselves misshapen.
fn malformed_json_patches() -> Vec<Value> {
    vec![
        json!({}),
        json!({"op": "add", "path": "/spec", "value": {}}),
        json!("add"),
        json!(7),
        json!(null),
        json!([null]),
        json!([[]]),
        json!([1, 2]),
        json!([{}]),
        json!([{"op": 5, "path": "/spec"}]),
        json!([{"op": "frobnicate", "path": "/spec"}]),
        json!([{"op": "add", "path": 3, "value": 1}]),
        json!([{"op": "add", "path": "spec", "value": 1}]),
        json!([{"op": "add", "path": "/spec"}]),
        json!([{"op": "replace", "path": "/metadata/nope/deeper", "value": 1}]),
        json!([{"op": "remove", "path": "/nope"}]),
        json!([{"op": "remove"}]),
        json!([{"op": "move", "path": "/spec"}]),
        json!([{"op": "move", "from": ["x"], "path": "/spec"}]),
        json!([{"op": "copy", "from": "/nope", "path": "/spec"}]),
        json!([{"op": "test", "path": "/metadata/name", "value": ["not", "the", "name"]}]),
        json!([{"op": "add", "path": "/metadata/labels/x", "value": 1}, 5]),
        json!([{"op": "replace", "path": "", "value": [null, null]}]),
        json!([{"op": "replace", "path": "", "value": "an object no more"}]),
        json!([{"op": "add", "path": "/metadata/finalizers/7", "value": "x"}]),
        json!([{"op": "add", "path": "/metadata", "value": [null, null]}]),
        json!([{"op": "replace", "path": "/spec", "value": 12}]),
        json!([{"op": "replace", "path": "/metadata", "value": []}]),
    ]
}

/// The kinds, their example manifests, and the fields their types require.
fn kinds() -> Vec<(&'static KindInfo, Vec<Value>)> {
    let docs = |text: &str| -> Vec<Value> {
        use serde::Deserialize;
        serde_yaml_ng::Deserializer::from_str(text)
            .map(|doc| Value::deserialize(doc).expect("the example manifests parse"))
            .collect()
    };
    let kind = |name: &str| hive_api::kind_by_kind(name).expect("registered kind");
    let event = json!({
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "manager-started"},
        "involvedObject": {"apiVersion": "hive.dev/v1", "kind": "Agent", "name": "manager", "uid": "u-1"},
        "reason": "Started", "message": "started", "type": "Normal", "count": 2,
        "firstTimestamp": "2024-01-01T00:00:00Z", "lastTimestamp": "2024-01-01T00:00:01Z",
        "source": {"component": "hive", "host": "h"}, "reportingComponent": "hive",
    });
    vec![
        (kind("Agent"), docs(include_str!("../../manifests/agent.yaml"))),
        (kind("Job"), docs(include_str!("../../manifests/job.yaml"))),
        (kind("Approval"), docs(include_str!("../../manifests/approval.yaml"))),
        (kind("Node"), docs(include_str!("../../docs/examples/node.yaml"))),
        (kind("FleetCommand"), docs(include_str!("../../manifests/fleet-command.yaml"))),
        (kind("Provider"), docs(include_str!("../../manifests/provider.yaml"))),
        (&hive_api::event::EVENT_KIND, vec![event]),
    ]
}

fn collection_path(kind: &KindInfo) -> String {
    if kind.api_version == "v1" {
        format!("/api/v1/{}", kind.plural)
    } else {
        format!("/apis/hive.dev/v1/{}", kind.plural)
    }
}

/// Every route that takes a body, each with its valid body and slots. The objects the
/// item routes name exist (`seed` stores them), so patches really run.
fn targets() -> Vec<Target> {
    let mut targets = Vec::new();
    for (kind, manifests) in kinds() {
        let has_status = kind.api_version != "v1";
        let top_level: &[&str] = if has_status { &["metadata", "spec", "status"] } else { &["metadata"] };
        for manifest in manifests {
            let name = manifest["metadata"]["name"].as_str().expect("named").to_string();
            let mut slots = slots_of(&manifest, top_level);
            for extra in metadata_slots() {
                if !slots.iter().any(|s| s.path == extra.path) {
                    slots.push(extra);
                }
            }
            if has_status && manifest.get("status").is_none() {
                slots.push(Slot::new(&["status"], Shape::Object, false));
            }
            let root = Slot { path: vec![], expects: Shape::Object, null_ok: false };
            let item = format!("{}/{name}", collection_path(kind));
            let mut fresh = manifest.clone();
            fresh["metadata"]["name"] = json!(format!("{name}-new"));
            targets.push(Target {
                what: format!("create {}", kind.kind),
                path: collection_path(kind),
                ops: vec![Op::Post],
                body: fresh,
                slots: [vec![root.clone()], slots.clone()].concat(),
            });
            targets.push(Target {
                what: format!("write {} {name}", kind.kind),
                path: item.clone(),
                ops: vec![Op::Put, Op::MergePatch, Op::JsonPatch, Op::Apply, Op::StrategicMergePatch],
                body: manifest.clone(),
                slots: [vec![root.clone()], slots.clone()].concat(),
            });
            if has_status {
                targets.push(Target {
                    what: format!("write {} {name}/status", kind.kind),
                    path: format!("{item}/status"),
                    ops: vec![Op::Put, Op::MergePatch, Op::JsonPatch, Op::Apply],
                    body: manifest.clone(),
                    slots: [vec![root.clone()], slots].concat(),
                });
            }
            let options =
                json!({"preconditions": {"uid": "not-the-uid", "resourceVersion": "1"}, "dryRun": ["All"]});
            targets.push(Target {
                what: format!("delete {} {name}", kind.kind),
                path: item,
                ops: vec![Op::Delete],
                slots: [vec![root], slots_of(&options, &["dryRun", "dryRun[0]"])].concat(),
                body: options,
            });
        }
    }
    let custom = |what: &str, path: &str, body: Value, required: &[&str]| {
        let root = Slot { path: vec![], expects: Shape::Object, null_ok: false };
        Target {
            what: what.into(),
            path: path.into(),
            ops: vec![Op::Post],
            slots: [vec![root], slots_of(&body, required)].concat(),
            body,
        }
    };
    targets.push(custom(
        "cancel a Job",
        "/apis/hive.dev/v1/jobs/rebuild-hello-1/cancel",
        json!({"children": false}),
        &["children"],
    ));
    targets.push(custom(
        "create a token",
        "/hive/v1/tokens",
        json!({"name": "shape-token", "role": "agent", "agent": "manager"}),
        &["name", "role"],
    ));
    targets.push(custom(
        "configure a provider",
        "/hive/v1/fleet/providers/vastai/configure",
        json!({"apiKey": "not-a-key", "baseUrl": "http://127.0.0.1:9", "image": "i", "onstart": "true", "diskGb": 64}),
        &[],
    ));
    targets
}

// ---------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------

struct Fixture {
    runtime: tokio::runtime::Runtime,
    app: Router,
    store: Store,
    tokens: TokenStore,
    admin: String,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// A server with a scheduler (so the Job routes run their own code), an admin token,
    /// and every example object stored.
    fn new() -> Fixture {
        record_panics();
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = Store::open(StoreConfig::new(dir.path().join("hive.redb"))).unwrap();
        let tokens = TokenStore::open(dir.path()).unwrap();
        let admin = tokens.create("admin", Role::Admin).unwrap();
        let engine = runtime
            .block_on(crate::jobs::Engine::start(store.clone(), dir.path(), Default::default()))
            .expect("the engine starts");
        let state = AppState::new(store.clone(), tokens.clone(), ServerConfig::default()).with_jobs(engine);
        runtime.block_on(seed(&store));
        Fixture { runtime, app: app(state), store, tokens, admin, _dir: dir }
    }

    /// Sends `case`; `Err` says what was wrong with the answer.
    fn check(&self, case: &Case) -> Result<(), String> {
        let fail = |why: String| Err(format!("{why}\n  request: {case}"));
        let request = Request::builder()
            .method(case.method.clone())
            .uri(&case.path)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.admin))
            .header(header::CONTENT_TYPE, case.content_type)
            .body(Body::from(case.body.clone()))
            .unwrap();
        let (revision, tokens) = (self.store.revision(), self.tokens.list().len());
        RECORDING.set(true);
        let answer = self.runtime.block_on(async {
            let response = AssertUnwindSafe(self.app.clone().oneshot(request)).catch_unwind().await;
            match response {
                Ok(Ok(response)) => {
                    let code = response.status();
                    let body = axum::body::to_bytes(response.into_body(), 1 << 22).await;
                    Ok((code, body.map_err(|e| e.to_string())))
                }
                Ok(Err(never)) => match never {},
                Err(panic) => Err(panic_text(&*panic)),
            }
        });
        RECORDING.set(false);
        let panics = PANICS.take();
        if !panics.is_empty() {
            return fail(format!("the request panicked: {}", panics.join("; ")));
        }
        let (code, body) = match answer {
            Ok(answer) => answer,
            Err(panic) => return fail(format!("the request panicked: {panic}")),
        };
        let body = body.map_err(|e| format!("reading the answer: {e}\n  request: {case}"))?;
        let text = String::from_utf8_lossy(&body);
        if !code.is_client_error() {
            return fail(format!("answered {code}, not a 4xx: {text}"));
        }
        if self.store.revision() != revision || self.tokens.list().len() != tokens {
            return fail(format!("answered {code} but wrote: {text}"));
        }
        let status: Value = match serde_json::from_slice(&body) {
            Ok(status) => status,
            Err(_) => return fail(format!("answered {code} with a body that is not JSON: {text}")),
        };
        if status["kind"] != "Status" {
            return fail(format!("answered {code} without a Status: {text}"));
        }
        if let Some(slot) = &case.field {
            if !names(&status, slot) {
                return fail(format!("answered {code} without naming {}: {text}", slot.field()));
            }
        }
        Ok(())
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Whether a `Status` names the slot's field, or a field it lies under (`spec` for
/// `spec.nodes[0]`): in its message, as `field: …`, `field.…`, `field[…` or a
/// `/field` pointer, or as a cause's field.
fn names(status: &Value, slot: &Slot) -> bool {
    let message = status["message"].as_str().unwrap_or("");
    let causes: Vec<&str> = status["details"]["causes"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["field"].as_str()).collect())
        .unwrap_or_default();
    (1..=slot.path.len()).any(|n| {
        let prefix = Slot { path: slot.path[..n].to_vec(), ..slot.clone() };
        let (field, pointer) = (prefix.field(), prefix.pointer());
        [":", ".", "["].iter().any(|end| message.contains(&format!("{field}{end}")))
            || message.contains(&pointer)
            || causes.iter().any(|c| c.starts_with(&field))
    })
}

/// Stores every example object, admitted as a create would.
async fn seed(store: &Store) {
    for (kind, manifests) in kinds() {
        for manifest in manifests {
            let (mut object, _) =
                super::resources::admit(kind, manifest, FieldValidation::Strict).expect("examples are valid");
            object["status"] = json!({});
            store.commit(Mutation::Create { kind: kind.plural, object }, false).await.expect("seeded");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------

/// The wrong values planted at every slot: one of each JSON type (the slot keeps those
/// that are wrong for it), and the body of issue 11.
fn fixed_values() -> Vec<Value> {
    vec![
        json!([null, null]),
        json!(null),
        json!(true),
        json!(-1.5),
        json!("a string"),
        json!({"name": {"deeper": [1]}}),
    ]
}

#[test]
fn every_field_of_every_write_answers_a_misshapen_value_with_a_4xx_naming_it() {
    let fixture = Fixture::new();
    let mut failures = Vec::new();
    let mut sent = 0;
    for target in targets() {
        for &op in &target.ops {
            for slot in &target.slots {
                let mut seen = Vec::new();
                for value in fixed_values() {
                    let case = case(&target, op, slot, value);
                    if seen.contains(&case.body) {
                        continue;
                    }
                    sent += 1;
                    if let Err(why) = fixture.check(&case) {
                        failures.push(format!("{}: {why}", target.what));
                    }
                    seen.push(case.body);
                }
            }
            if op == Op::JsonPatch {
                for patch in malformed_json_patches() {
                    let case = Case {
                        method: Method::PATCH,
                        path: target.path.clone(),
                        content_type: "application/json-patch+json",
                        body: serde_json::to_vec(&patch).unwrap(),
                        field: None,
                        planted_at: "the patch".into(),
                    };
                    sent += 1;
                    if let Err(why) = fixture.check(&case) {
                        failures.push(format!("{}: malformed JSON patch: {why}", target.what));
                    }
                }
            }
        }
    }
    let shown: Vec<&String> = failures.iter().take(40).collect();
    assert!(
        failures.is_empty(),
        "{} of {sent} requests were answered wrongly; the first {}:\n{}",
        failures.len(),
        shown.len(),
        shown.iter().map(|f| f.as_str()).collect::<Vec<_>>().join("\n")
    );
}

/// Arbitrary JSON: scalars, strings with any characters, lists and maps nested a few
/// levels, and lists nested past the parsers' depth limit.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter("JSON numbers are finite", |f| f.is_finite()).prop_map(Value::from),
        "[a-z0-9.:/-]{0,12}".prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    let nested = leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-zA-Z]{1,8}", inner), 0..4)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    });
    prop_oneof![
        8 => nested,
        1 => (1usize..200).prop_map(|depth| (0..depth).fold(json!(null), |v, _| json!([v]))),
        1 => (1usize..200).prop_map(|depth| (0..depth).fold(json!({}), |v, _| json!({"metadata": v}))),
    ]
}

struct Shared {
    fixture: Fixture,
    targets: Vec<Target>,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared { fixture: Fixture::new(), targets: targets() })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_json_at_any_field_of_any_write_is_a_4xx_status(
        target in any::<prop::sample::Index>(),
        op in any::<prop::sample::Index>(),
        slot in any::<prop::sample::Index>(),
        value in any_json(),
    ) {
        let shared = shared();
        let target = target.get(&shared.targets);
        let op = *op.get(&target.ops);
        let slot = slot.get(&target.slots);
        let case = case(target, op, slot, value);
        if let Err(why) = shared.fixture.check(&case) {
            prop_assert!(false, "{}: {}", target.what, why);
        }
    }
}

#[test]
fn a_put_whose_metadata_is_an_array_is_a_400_naming_metadata() {
    let fixture = Fixture::new();
    let request = Request::put("/apis/hive.dev/v1/agents/x")
        .header(header::AUTHORIZATION, format!("Bearer {}", fixture.admin))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"metadata": [null, null], "spec": {}}"#))
        .unwrap();
    let response =
        fixture.runtime.block_on(AssertUnwindSafe(fixture.app.clone().oneshot(request)).catch_unwind());
    let response = response.expect("no panic").unwrap();
    assert_eq!(response.status(), 400);
    let body = fixture.runtime.block_on(axum::body::to_bytes(response.into_body(), 1 << 20)).unwrap();
    let status: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status["kind"].as_str(), status["reason"].as_str()), (Some("Status"), Some("BadRequest")));
    assert!(status["message"].as_str().unwrap().contains("metadata"), "{status}");
}

#[test]
fn a_patch_that_renames_its_object_is_a_400_naming_both_names() {
    let fixture = Fixture::new();
    for (content_type, patch) in [
        ("application/merge-patch+json", json!({"metadata": {"name": "researcher"}})),
        (
            "application/json-patch+json",
            json!([{"op": "replace", "path": "/metadata/name", "value": "nobody"}]),
        ),
    ] {
        let request = Request::patch("/apis/hive.dev/v1/agents/manager")
            .header(header::AUTHORIZATION, format!("Bearer {}", fixture.admin))
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(patch.to_string()))
            .unwrap();
        let revision = fixture.store.revision();
        let response = fixture.runtime.block_on(fixture.app.clone().oneshot(request)).unwrap();
        assert_eq!(response.status(), 400, "{patch}");
        let body = fixture.runtime.block_on(axum::body::to_bytes(response.into_body(), 1 << 20)).unwrap();
        let status: Value = serde_json::from_slice(&body).unwrap();
        let message = status["message"].as_str().unwrap();
        assert!(message.contains("does not match the name on the URL (manager)"), "{message}");
        assert_eq!(fixture.store.revision(), revision);
    }
}
