//! `hive wait`: list + watch (by `metadata.name` field selector) until each object meets
//! a condition, matches a JSONPath value, exists, or is gone. Conditions computed from an
//! older generation than the object's (`observedGeneration` < `metadata.generation`)
//! do not count, as in kubectl. Unlike kubectl, a wait on an object that reached a failed
//! terminal phase (a Job `Failed`) ends at once instead of running out its timeout.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Result};
use futures_util::future::join_all;
use hive_api::KindInfo;
use serde_json::Value;
use tokio::time::Instant;

use super::client::{self, Client, Query, JSON};
use super::jsonpath::{self, Path, Template};
use super::kind::{self, Target};
use super::{duration, output, Context};

/// Wait for objects to reach a condition.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive wait agent/a1 --for=condition=Ready
  hive wait agents a1 a2 --for=condition=Crashed=False --timeout=2m
  hive wait job/rebuild-a1-7 --for=jsonpath='{.status.phase}'=Succeeded
  hive wait agent/a1 --for=jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}'=True
  hive wait agent/a1 --for=delete --timeout=1m
  hive wait agents -l tier=gold --for=condition=Ready")]
pub struct Args {
    /// `KIND/NAME...` or `KIND NAME...`; with `-l`/`--all`, just `KIND`.
    #[arg(value_name = "KIND/NAME", required = true)]
    pub resources: Vec<String>,

    /// What to wait for: `condition=TYPE` (status True), `condition=TYPE=STATUS`,
    /// `jsonpath='{PATH}'=VALUE`, `jsonpath='{PATH}'` (until it exists), `create` or
    /// `delete`.
    #[arg(long = "for", value_name = "CONDITION", value_parser = WaitFor::parse)]
    pub for_: WaitFor,

    /// How long to wait for each object (e.g. 30s, 5m, 1h); 0 checks once.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration::parse)]
    pub timeout: Duration,

    /// Wait for every object of the kind whose labels match.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,

    /// Wait for every object of the kind.
    #[arg(long)]
    pub all: bool,
}

/// What `--for` asks.
#[derive(Debug, Clone)]
pub enum WaitFor {
    /// Until the object is gone.
    Delete,
    /// Until the object exists.
    Create,
    /// Until `status.conditions[type=TYPE].status` is STATUS (case-insensitive) and
    /// not stale.
    Condition {
        /// The condition type, e.g. `Ready`.
        type_: String,
        /// The wanted status, e.g. `True`.
        status: String,
    },
    /// Until the path yields `value` (or, without a value, anything).
    JsonPath {
        /// The expression as given.
        source: String,
        /// The parsed path.
        path: Path,
        /// The wanted value.
        value: Option<String>,
    },
}

impl WaitFor {
    /// Parses `--for`; a clap `value_parser`.
    pub fn parse(text: &str) -> Result<WaitFor, String> {
        match text {
            "delete" => return Ok(WaitFor::Delete),
            "create" => return Ok(WaitFor::Create),
            _ => {}
        }
        if let Some(rest) = text.strip_prefix("condition=") {
            let (type_, status) = match rest.split_once('=') {
                Some((t, s)) => (t, s),
                None => (rest, "True"),
            };
            if type_.is_empty() || status.is_empty() {
                return Err(format!(
                    "invalid condition {text:?}: use condition=TYPE or condition=TYPE=STATUS"
                ));
            }
            return Ok(WaitFor::Condition { type_: type_.into(), status: status.into() });
        }
        if let Some(rest) = text.strip_prefix("jsonpath=") {
            let (expr, tail) = match jsonpath::split_expression(rest) {
                Some(split) => split,
                None if rest.starts_with('{') => {
                    return Err(format!("invalid JSONPath {rest:?}: unclosed '{{'"))
                }
                None => match rest.find('=') {
                    Some(i) => (&rest[..i], &rest[i..]),
                    None => (rest, ""),
                },
            };
            let value = match tail.strip_prefix('=') {
                Some("") => {
                    return Err(format!(
                    "jsonpath wait value cannot be empty in {text:?}; omit `=` to wait until the path exists"
                ))
                }
                Some(v) => Some(v.to_string()),
                None if tail.is_empty() => None,
                None => return Err(format!("unexpected {tail:?} after the JSONPath expression in {text:?}")),
            };
            let template = Template::parse(expr).map_err(|e| e.to_string())?;
            let path = template.single_path().cloned().ok_or_else(|| {
                format!("jsonpath wait needs exactly one expression such as {{.status.phase}}, got {expr:?}")
            })?;
            return Ok(WaitFor::JsonPath { source: expr.to_string(), path, value });
        }
        Err(format!(
            "unrecognized condition {text:?}: use condition=TYPE[=STATUS], jsonpath='{{PATH}}'[=VALUE], create or delete"
        ))
    }

    /// Whether `object` (`None`: absent) meets the wait. Errors end the wait (a path
    /// that matches several values or a whole object).
    pub fn is_met(&self, object: Option<&Value>) -> Result<bool, String> {
        let Some(object) = object else { return Ok(matches!(self, WaitFor::Delete)) };
        match self {
            WaitFor::Delete => Ok(false),
            WaitFor::Create => Ok(true),
            WaitFor::Condition { type_, status } => Ok(condition_met(object, type_, status)),
            WaitFor::JsonPath { source, path, value } => {
                let found = path.eval(object);
                let Some(first) = found.first() else { return Ok(false) };
                if found.len() > 1 {
                    return Err(format!("given jsonpath expression {source} matches more than one value"));
                }
                match value {
                    None => Ok(!first.is_null()),
                    Some(_) if first.is_object() || first.is_array() => Err(format!(
                        "jsonpath {source} leads to a nested object or list, which cannot be compared with a value"
                    )),
                    Some(wanted) => Ok(jsonpath::scalar_text(first) == *wanted),
                }
            }
        }
    }
}

/// The phases after which an object of `kind` will not change by itself any more,
/// having failed: a Job `Failed`, `Cancelled` or `Interrupted`, an Approval `Denied` or
/// `Failed`, a FleetCommand `Failed`, an Agent `CrashLoopBackOff`, `BuildFailed`,
/// `StartFailed`, `StopFailed` or `Lost` ([`hive_api::agent::AgentPhase::is_failure`]).
fn failed_phases(kind: &KindInfo) -> &'static [&'static str] {
    match kind.kind {
        "Agent" => &["CrashLoopBackOff", "BuildFailed", "StartFailed", "StopFailed", "Lost"],
        "Job" => &["Failed", "Cancelled", "Interrupted"],
        "Approval" => &["Denied", "Failed"],
        "FleetCommand" => &["Failed"],
        _ => &[],
    }
}

/// The phase of a Job, Approval or FleetCommand, decoded as its api type, and what its
/// status says went wrong (a Job's first failed node, else its message).
fn terminal_phase(kind: &KindInfo, object: &Value) -> Option<(String, Option<String>)> {
    use hive_api::approval::Approval;
    use hive_api::fleet_command::FleetCommand;
    use hive_api::job::{Job, JobNodeState};
    fn wire<T: serde::Serialize>(phase: &T) -> Option<String> {
        serde_json::to_value(phase).ok()?.as_str().map(str::to_string)
    }
    fn decode<T: serde::de::DeserializeOwned>(object: &Value) -> Option<T> {
        serde_json::from_value(object.clone()).ok()
    }
    match kind.kind {
        "Job" => {
            let status = decode::<Job>(object)?.status;
            let failed = status.nodes.iter().find(|n| n.state == JobNodeState::Failed);
            let node = failed.and_then(|n| Some(format!("node {}: {}", n.id, n.error.as_deref()?)));
            Some((wire(&status.phase?)?, node.or(status.message)))
        }
        "Approval" => {
            let status = decode::<Approval>(object)?.status;
            Some((wire(&status.phase?)?, status.message))
        }
        "FleetCommand" => {
            let status = decode::<FleetCommand>(object)?.status;
            Some((wire(&status.phase?)?, status.error))
        }
        "Agent" => agent_phase(&decode::<hive_api::Agent>(object)?),
        _ => None,
    }
}

/// An agent's phase and why, for a wait: only once the controller has seen its current
/// spec (`status.observedGeneration`), so a fix just applied is waited for, not judged
/// by the failure it fixes. The why is its last exit (how, and its last stderr line),
/// else the message of the condition that failed.
fn agent_phase(agent: &hive_api::Agent) -> Option<(String, Option<String>)> {
    use hive_api::agent::{CONDITION_BUILDING, CONDITION_CONVERGED, CONDITION_CRASHED, CONDITION_NODE_LOST};
    let status = &agent.status;
    if status.observed_generation < agent.metadata.generation {
        return None;
    }
    let phase = status.phase?;
    let condition =
        |type_: &str| status.condition(type_).map(|c| c.message.clone()).filter(|m| !m.is_empty());
    let why = match phase {
        hive_api::agent::AgentPhase::CrashLoopBackOff => match &status.last_exit {
            Some(exit) => Some(match exit.stderr.last() {
                Some(line) => format!("{}; stderr: {line}", exit.how()),
                None => exit.how(),
            }),
            None => condition(CONDITION_CRASHED),
        },
        hive_api::agent::AgentPhase::BuildFailed => condition(CONDITION_BUILDING),
        hive_api::agent::AgentPhase::Lost => condition(CONDITION_NODE_LOST),
        _ => condition(CONDITION_CONVERGED),
    };
    Some((phase.as_str().to_string(), why))
}

/// Why waiting on `object` for `for_` (a condition or a JSONPath, not yet met) is
/// hopeless: it reached a failed terminal phase. `hive wait job/x --for=condition=Complete`
/// then fails at once, naming the phase and the reason, instead of running out its
/// timeout.
pub fn terminal_failure(kind: &KindInfo, name: &str, for_: &WaitFor, object: &Value) -> Option<String> {
    if matches!(for_, WaitFor::Delete | WaitFor::Create) {
        return None;
    }
    let (phase, why) = terminal_phase(kind, object)?;
    if !failed_phases(kind).contains(&phase.as_str()) {
        return None;
    }
    let mut text =
        format!("{}/{name} reached the terminal phase {phase}, so the wait cannot be met", kind.singular);
    if let Some(why) = why.filter(|w| !w.is_empty()) {
        text.push_str(&format!(": {why}"));
    }
    Some(text)
}

/// kubectl's condition check: the first condition of that type decides; it is stale
/// (unmet) when its `observedGeneration`, else `status.observedGeneration`, is behind
/// `metadata.generation`.
pub fn condition_met(object: &Value, type_: &str, status: &str) -> bool {
    let Some(Value::Array(conditions)) = object.pointer("/status/conditions") else { return false };
    let generation = object.pointer("/metadata/generation").and_then(Value::as_i64);
    for condition in conditions {
        let Some(name) = condition.get("type").and_then(Value::as_str) else { continue };
        if !name.eq_ignore_ascii_case(type_) {
            continue;
        }
        let Some(actual) = condition.get("status").and_then(Value::as_str) else { continue };
        if let Some(generation) = generation {
            let observed = condition
                .get("observedGeneration")
                .and_then(Value::as_i64)
                .or_else(|| object.pointer("/status/observedGeneration").and_then(Value::as_i64));
            if observed.is_some_and(|o| o < generation) {
                return false;
            }
        }
        return actual.eq_ignore_ascii_case(status);
    }
    false
}

/// Runs `hive wait`: every object waited for concurrently, each with the timeout;
/// exit 1 if any is not met.
pub async fn exec(args: Args, ctx: &Context) -> ExitCode {
    match run(args, ctx).await {
        Ok(code) => code,
        Err(err) => super::exit_with(&err),
    }
}

async fn run(args: Args, ctx: &Context) -> Result<ExitCode> {
    let kinds = kind::all();
    let targets = kind::parse_targets(&kinds, &args.resources, "wait")?;
    let client = ctx.client()?;
    let mut objects: Vec<(KindInfo, String)> = Vec::new();
    for Target { kind, names } in &targets {
        if names.is_empty() {
            if args.selector.is_none() && !args.all {
                anyhow::bail!(
                    "resource name may not be empty: name the objects ({}/NAME) or use -l SELECTOR or --all",
                    kind.singular
                );
            }
            let query = Query::default().push_opt("labelSelector", args.selector.as_deref());
            let list = client.get(&format!("{}{query}", kind::collection_path(kind))).await?;
            for item in list.get("items").and_then(Value::as_array).into_iter().flatten() {
                if let Some(name) = item.pointer("/metadata/name").and_then(Value::as_str) {
                    objects.push((*kind, name.to_string()));
                }
            }
        } else {
            objects.extend(names.iter().map(|n| (*kind, n.clone())));
        }
    }
    if objects.is_empty() {
        anyhow::bail!("no matching resources found");
    }
    let timeout = args.timeout;
    let waits = objects.iter().map(|(kind, name)| {
        let client = &client;
        let for_ = &args.for_;
        async move {
            match wait_one(client, kind, name, for_, Some(timeout)).await {
                Ok(true) => {
                    output::print(&format!("{} condition met\n", kind::object_ref(kind, name)))?;
                    Ok(true)
                }
                Ok(false) => {
                    output::eprint_line(&format!(
                        "error: timed out waiting for the condition on {}/{name}",
                        kind.plural
                    ));
                    Ok(false)
                }
                Err(err) => {
                    if let Some(text) = super::render_error(&err) {
                        output::eprint_line(&text.to_string());
                    }
                    Ok::<bool, anyhow::Error>(false)
                }
            }
        }
    });
    let mut all_met = true;
    for result in join_all(waits).await {
        all_met &= result?;
    }
    Ok(if all_met { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Waits until `name` meets `for_`: `Ok(true)` when met, `Ok(false)` when `timeout`
/// passed first (`None`: wait for ever; zero: check once).
pub async fn wait_one(
    client: &Client,
    kind: &KindInfo,
    name: &str,
    for_: &WaitFor,
    timeout: Option<Duration>,
) -> Result<bool> {
    if matches!(for_, WaitFor::Condition { .. } | WaitFor::JsonPath { .. }) {
        // Like kubectl: waiting on a condition of an object that does not exist fails
        // at once with the server's NotFound.
        client.get(&kind::object_path(kind, name)).await?;
    }
    let watch = until_met(client, kind, name, for_, timeout == Some(Duration::ZERO));
    match timeout {
        None => watch.await,
        Some(limit) => match tokio::time::timeout_at(Instant::now() + limit, watch).await {
            Ok(result) => result,
            Err(_elapsed) => Ok(false),
        },
    }
}

async fn until_met(client: &Client, kind: &KindInfo, name: &str, for_: &WaitFor, once: bool) -> Result<bool> {
    let path = kind::collection_path(kind);
    let selector = format!("metadata.name={name}");
    let check = |object: Option<&Value>| match for_.is_met(object) {
        Ok(false) => match object.and_then(|o| terminal_failure(kind, name, for_, o)) {
            Some(failure) => Err(anyhow!(failure)),
            None => Ok(false),
        },
        other => other.map_err(|e| anyhow!(e)),
    };
    let is_ours = |object: &Value| object.pointer("/metadata/name").and_then(Value::as_str) == Some(name);
    loop {
        let list =
            client.get(&format!("{path}{}", Query::default().push("fieldSelector", &selector))).await?;
        let current =
            list.get("items").and_then(Value::as_array).and_then(|items| items.iter().find(|o| is_ours(o)));
        if check(current)? {
            return Ok(true);
        }
        if once {
            return Ok(false);
        }
        let mut resource_version =
            list.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_string);
        'watch: loop {
            let query = Query::default()
                .push("fieldSelector", &selector)
                .push_opt("resourceVersion", resource_version.as_deref())
                .push("allowWatchBookmarks", "true")
                .push("watch", "true");
            let mut stream = match client.watch(&format!("{path}{query}"), JSON).await {
                Ok(stream) => stream,
                Err(e) if client::api_error(&e).is_some_and(|a| a.code() == 410) => break 'watch,
                Err(e) if client::api_error(&e).is_some() => return Err(e),
                Err(_transport) => {
                    // The server may be restarting; the deadline bounds the retries.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue 'watch;
                }
            };
            loop {
                let event = match stream.next().await {
                    Ok(Some(event)) => event,
                    // Closed by the server: resume from the last revision seen.
                    Ok(None) => continue 'watch,
                    Err(_broken) => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue 'watch;
                    }
                };
                if let Some(rv) = event.object.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
                    resource_version = Some(rv.to_string());
                }
                match event.type_.as_str() {
                    "BOOKMARK" => {}
                    "ERROR" => {
                        let err = client::event_error(&event);
                        if err.code() == 410 {
                            // Too old to resume: list again.
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            break 'watch;
                        }
                        return Err(err.into());
                    }
                    "DELETED" if is_ours(&event.object) && check(None)? => return Ok(true),
                    "DELETED" => {}
                    _ if is_ours(&event.object) && check(Some(&event.object))? => return Ok(true),
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn failed_jobs_end_a_wait_for_anything_else() {
        let job = *kind::all().iter().find(|k| k.kind == "Job").unwrap();
        let failed = json!({"status": {"phase": "Failed", "nodes": [
            {"id": "a/prebuild", "state": "Failed", "error": "build exited with status 1"}]}});
        let complete = WaitFor::parse("condition=Complete").unwrap();
        assert_eq!(
            terminal_failure(&job, "j1", &complete, &failed).unwrap(),
            "job/j1 reached the terminal phase Failed, so the wait cannot be met: node a/prebuild: build exited with status 1"
        );
        let done = WaitFor::parse("jsonpath={.status.phase}=Done").unwrap();
        assert!(terminal_failure(&job, "j1", &done, &json!({"status": {"phase": "Running"}})).is_none());
        assert!(terminal_failure(&job, "j1", &WaitFor::Delete, &failed).is_none());
        let agent = *kind::all().iter().find(|k| k.kind == "Agent").unwrap();
        assert!(terminal_failure(&agent, "a", &complete, &failed).is_none(), "only kinds with failed phases");
    }

    fn agent(generation: i64, observed: i64, ready: &str) -> Value {
        json!({
            "metadata": {"name": "a1", "generation": generation},
            "status": {
                "observedGeneration": observed,
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": ready}, {"type": "Crashed", "status": "False", "observedGeneration": 1}]
            }
        })
    }

    fn met(spec: &str, object: Option<&Value>) -> Result<bool, String> {
        WaitFor::parse(spec)?.is_met(object)
    }

    #[test]
    fn conditions_respect_status_and_generation() {
        let fresh = agent(2, 2, "True");
        assert_eq!(met("condition=Ready", Some(&fresh)), Ok(true));
        assert_eq!(met("condition=ready=true", Some(&fresh)), Ok(true));
        assert_eq!(met("condition=Ready=False", Some(&fresh)), Ok(false));
        assert_eq!(met("condition=Missing", Some(&fresh)), Ok(false));
        // status.observedGeneration behind metadata.generation: stale.
        assert_eq!(met("condition=Ready", Some(&agent(3, 2, "True"))), Ok(false));
        // The condition's own observedGeneration wins over the status one.
        assert_eq!(met("condition=Crashed=False", Some(&agent(2, 2, "True"))), Ok(false));
        assert_eq!(met("condition=Crashed=False", Some(&agent(1, 1, "True"))), Ok(true));
        assert_eq!(met("condition=Ready", None), Ok(false));
    }

    #[test]
    fn jsonpath_waits() {
        let obj = agent(2, 2, "True");
        assert_eq!(met("jsonpath={.status.phase}=Running", Some(&obj)), Ok(true));
        assert_eq!(met("jsonpath={.status.phase}=Stopped", Some(&obj)), Ok(false));
        assert_eq!(met("jsonpath=.status.phase=Running", Some(&obj)), Ok(true));
        assert_eq!(
            met("jsonpath={.status.conditions[?(@.type==\"Ready\")].status}=True", Some(&obj)),
            Ok(true)
        );
        assert_eq!(met("jsonpath={.status.observedGeneration}=2", Some(&obj)), Ok(true));
        assert_eq!(met("jsonpath={.status.phase}", Some(&obj)), Ok(true));
        assert_eq!(met("jsonpath={.status.missing}", Some(&obj)), Ok(false));
        // Stale conditions still count for jsonpath, as in kubectl.
        assert_eq!(
            met(
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}=True",
                Some(&agent(3, 2, "True"))
            ),
            Ok(true)
        );
        let err = met("jsonpath={.status.conditions[*].type}=Ready", Some(&obj)).unwrap_err();
        assert!(err.contains("matches more than one value"), "{err}");
        let err = met("jsonpath={.status}=x", Some(&obj)).unwrap_err();
        assert!(err.contains("nested object"), "{err}");
    }

    #[test]
    fn delete_and_create() {
        let obj = agent(1, 1, "True");
        assert_eq!(met("delete", None), Ok(true));
        assert_eq!(met("delete", Some(&obj)), Ok(false));
        assert_eq!(met("create", Some(&obj)), Ok(true));
        assert_eq!(met("create", None), Ok(false));
    }

    #[test]
    fn bad_specs_are_explained() {
        let cases = [
            ("ready", "unrecognized condition \"ready\""),
            ("condition=", "invalid condition"),
            ("jsonpath={.status.phase}=", "jsonpath wait value cannot be empty"),
            ("jsonpath={..phase}=x", "recursive descent"),
            ("jsonpath={.a}{.b}=x", "unexpected"),
            ("jsonpath={.status.phase=x", "unclosed"),
        ];
        for (spec, expected) in cases {
            let err = WaitFor::parse(spec).unwrap_err();
            assert!(err.contains(expected), "{spec}: {err}");
        }
    }
}
