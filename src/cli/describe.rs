//! `hive describe`: kubectl's generic describer — name, labels, annotations, metadata,
//! spec and status as indented key/values, a conditions table and the object's events;
//! an agent's node beside its kind, a Node's placed agents (as `kubectl describe
//! node` lists its pods), and when a Job with a TTL expires.

use anyhow::Result;
use chrono::{DateTime, Utc};
use hive_api::{Agent, Job, KindInfo, Node, Object};
use serde_json::{Map, Value};

use super::client::{self, Client, Query};
use super::kind;
use super::output::{self, tabwrite};
use super::{Context, Reported};

/// The annotation kubectl keeps its client-side apply state in; noise in `describe`.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// Longer annotations are cut (as kubectl does).
const MAX_ANNOTATION_LEN: usize = 140;

/// Show the details of objects: metadata, spec, status, conditions and events.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive describe agent a1
  hive describe agents -l tier=gold    # every matching agent
  hive describe job/rebuild-a1-7")]
pub struct Args {
    /// `KIND [NAME...]` or `KIND/NAME...`; without names, every object of the kind.
    #[arg(value_name = "KIND [NAME]", required = true)]
    pub resources: Vec<String>,

    /// Only objects whose labels match (when no names are given).
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,

    /// Show the object's events (`--show-events=false` to skip fetching them).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub show_events: bool,
}

/// Runs `hive describe`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let kinds = kind::all();
    let targets = kind::parse_targets(&kinds, &args.resources, "describe")?;
    let client = ctx.client()?;
    let mut failures = Vec::new();
    let mut printed = 0;
    for target in &targets {
        let objects = if target.names.is_empty() {
            let query = Query::default().push_opt("labelSelector", args.selector.as_deref());
            let list = client.get(&format!("{}{query}", kind::collection_path(&target.kind))).await?;
            list.get("items").and_then(Value::as_array).cloned().unwrap_or_default()
        } else {
            let mut objects = Vec::new();
            for name in &target.names {
                match client.get(&kind::object_path(&target.kind, name)).await {
                    Ok(object) => objects.push(object),
                    Err(e) => match client::api_error(&e) {
                        Some(api) => failures.push(api.render()),
                        None => return Err(e),
                    },
                }
            }
            objects
        };
        // A Node's agents, from one list of every agent (a placement is a spec field the
        // API cannot select on), fetched once for all the Nodes described.
        let agents = match target.kind.kind == Node::KIND && !objects.is_empty() {
            true => Some(placed_agents(&client).await),
            false => None,
        };
        for object in objects {
            let events = match args.show_events {
                true => Some(events_for(&client, &target.kind, &object).await.unwrap_or_default()),
                false => None,
            };
            let related =
                Related { events: events.as_deref(), agents: agents.as_ref().map(Option::as_deref) };
            let text = render(&object, related, crate::host::now());
            output::print(&if printed > 0 { format!("\n{text}") } else { text })?;
            printed += 1;
        }
    }
    if printed == 0 && failures.is_empty() {
        super::output::eprint_line("No resources found");
    }
    for failure in &failures {
        super::output::eprint_line(&failure.to_string());
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Reported.into())
    }
}

/// The object's events (core `/api/v1/events`); `None` when the server cannot say
/// (shown as `Events: <none>`, as kubectl does). Describe never fails because of events.
async fn events_for(client: &Client, kind: &hive_api::KindInfo, object: &Value) -> Option<Vec<Value>> {
    let name = object.pointer("/metadata/name").and_then(Value::as_str)?;
    let uid = object.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
    let mut selector = format!("involvedObject.name={name},involvedObject.kind={}", kind.kind);
    if !uid.is_empty() {
        selector.push_str(&format!(",involvedObject.uid={uid}"));
    }
    let query = Query::default().push("fieldSelector", selector).push("limit", "500");
    let list = client.get(&format!("/api/v1/events{query}")).await.ok()?;
    let items = list.get("items")?.as_array()?;
    // Keep only this object's events, in case the server ignored the selector.
    Some(
        items
            .iter()
            .filter(|e| {
                e.pointer("/involvedObject/name").and_then(Value::as_str) == Some(name)
                    && e.pointer("/involvedObject/kind")
                        .and_then(Value::as_str)
                        .is_none_or(|k| k == kind.kind)
            })
            .cloned()
            .collect(),
    )
}

/// Every agent, or `None` when the server cannot say (shown as `Agents: <unknown>`).
/// Describe never fails because of a Node's agents.
async fn placed_agents(client: &Client) -> Option<Vec<Agent>> {
    let list = client.get(&kind::collection_path(&KindInfo::of::<Agent>())).await.ok()?;
    let list: hive_api::agent::AgentList = client::decode(&list, "AgentList").ok()?;
    Some(list.items)
}

/// What `describe` shows beside the object itself, each `None` when not fetched.
#[derive(Clone, Copy, Default)]
pub struct Related<'a> {
    /// The object's events; `None` when not fetched (`--show-events=false`).
    pub events: Option<&'a [Value]>,
    /// For a Node: every agent (the rendering keeps those placed on it), or `Some(None)`
    /// when the list could not be read.
    pub agents: Option<Option<&'a [Agent]>>,
}

/// Renders one object (and what is related to it, when known) as `kubectl describe` does.
pub fn render(object: &Value, related: Related<'_>, now: DateTime<Utc>) -> String {
    let mut w = Writer::default();
    let meta = object.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
    w.line(0, &format!("Name:\t{}", meta.get("name").and_then(Value::as_str).unwrap_or_default()));
    labels(&mut w, meta.get("labels"));
    annotations(&mut w, meta.get("annotations"));
    w.line(
        0,
        &format!("API Version:\t{}", object.get("apiVersion").and_then(Value::as_str).unwrap_or_default()),
    );
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
    w.line(0, &format!("Kind:\t{kind}"));
    if kind == Agent::KIND {
        // Where it runs, as `kubectl describe pod` says its node up top.
        let agent = client::decode::<Agent>(object, "Agent").ok();
        let node = agent.as_ref().and_then(|a| a.spec.node());
        w.line(0, &format!("Node:\t{}", node.unwrap_or("<none> (the daemon's host)")));
        // Where it stands and how it last ended, before anything else: the answer to
        // "why is it failing" at a glance.
        if let Some(agent) = &agent {
            w.line(0, &format!("Status:\t{}", hive_api::agent::phase(agent).as_str()));
            last_exit(&mut w, agent.status.last_exit.as_ref(), now);
        }
    }

    let mut rest = meta.clone();
    for skip in ["name", "namespace", "labels", "annotations", "managedFields"] {
        rest.remove(skip);
    }
    field(&mut w, 0, "metadata", &Value::Object(rest));

    let skip_top = ["apiVersion", "kind", "metadata", "status"];
    if let Some(map) = object.as_object() {
        let mut keys: Vec<&String> = map.keys().filter(|k| !skip_top.contains(&k.as_str())).collect();
        keys.sort();
        for key in keys {
            field(&mut w, 0, key, &map[key]);
        }
    }
    let conditions = object.pointer("/status/conditions").cloned();
    if let Some(Value::Object(status)) = object.get("status") {
        let mut status = status.clone();
        if matches!(conditions, Some(Value::Array(_))) {
            status.remove("conditions");
        }
        if kind == Agent::KIND {
            // Said up top already.
            status.remove("phase");
            status.remove("lastExit");
        }
        field(&mut w, 0, "status", &Value::Object(status));
    }
    if kind == Job::KIND {
        expires(&mut w, object, now);
    }
    if let Some(Value::Array(conditions)) = conditions {
        conditions_table(&mut w, &conditions);
    }
    if let Some(agents) = related.agents {
        let name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
        agents_table(&mut w, name, agents);
    }
    if let Some(events) = related.events {
        events_table(&mut w, events, now);
    }
    tabwrite(&w.text, 0, 2)
}

/// When the daemon deletes a Job with a TTL of its own (`spec.ttlSecondsAfterFinished`):
/// the time once it finished, and how far off; the rule until then. A Job without one
/// goes by the daemon's `--job-history-max-age`, which a client cannot see: nothing is
/// said of it.
fn expires(w: &mut Writer, object: &Value, now: DateTime<Utc>) {
    let Ok(job) = client::decode::<Job>(object, "Job") else { return };
    let Some(ttl) = job.spec.ttl_seconds_after_finished else { return };
    let Some(at) = job.expires_at(None) else {
        w.line(0, &format!("Expires:\t{ttl}s after it finishes"));
        return;
    };
    let left = (at.0 - now).num_seconds();
    let when = match left {
        0.. => format!("in {}", hive_api::age::human_duration(left)),
        _ => format!("{} ago", hive_api::age::human_duration(-left)),
    };
    let at = at.0.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    w.line(0, &format!("Expires:\t{at} ({when}, {ttl}s after it finished)"));
}

/// Lines of tab-separated cells with two-space indentation per level.
#[derive(Default)]
struct Writer {
    text: String,
}

impl Writer {
    fn line(&mut self, level: usize, text: &str) {
        self.text.push_str(&"  ".repeat(level));
        self.text.push_str(text);
        self.text.push('\n');
    }
}

fn labels(w: &mut Writer, labels: Option<&Value>) {
    let mut pairs: Vec<String> = match labels {
        Some(Value::Object(map)) => map.iter().map(|(k, v)| format!("{k}={}", scalar(v))).collect(),
        _ => Vec::new(),
    };
    pairs.sort();
    if pairs.is_empty() {
        w.line(0, "Labels:\t<none>");
    }
    for (i, pair) in pairs.iter().enumerate() {
        w.line(0, &format!("{}\t{pair}", if i == 0 { "Labels:" } else { "" }));
    }
}

fn annotations(w: &mut Writer, annotations: Option<&Value>) {
    let mut entries: Vec<(String, String)> = match annotations {
        Some(Value::Object(map)) => map
            .iter()
            .filter(|(k, _)| k.as_str() != LAST_APPLIED)
            .map(|(k, v)| (k.clone(), scalar(v).trim_end_matches('\n').to_string()))
            .collect(),
        _ => Vec::new(),
    };
    entries.sort();
    if entries.is_empty() {
        w.line(0, "Annotations:\t<none>");
    }
    for (i, (key, value)) in entries.iter().enumerate() {
        let title = if i == 0 { "Annotations:" } else { "" };
        if key.len() + value.len() + 2 > MAX_ANNOTATION_LEN || value.contains('\n') {
            w.line(0, &format!("{title}\t{key}:"));
            for part in value.split('\n') {
                w.line(0, &format!("\t  {}", shorten(part, MAX_ANNOTATION_LEN - 2)));
            }
        } else {
            w.line(0, &format!("{title}\t{key}: {value}"));
        }
    }
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        text.chars().take(max).collect::<String>() + "..."
    }
}

/// One field: scalars as `Key:\tvalue`, maps as a header with their fields one level
/// deeper (sorted, as kubectl does), lists one element per line, list elements that are
/// maps marked with `- ` so their boundaries show.
fn field(w: &mut Writer, level: usize, key: &str, value: &Value) {
    let label = smart_label(key);
    match value {
        Value::Object(map) if map.is_empty() => w.line(level, &format!("{label}:\t<none>")),
        Value::Object(map) => {
            w.line(level, &format!("{label}:"));
            fields(w, level + 1, map, "");
        }
        Value::Array(items) if items.is_empty() => w.line(level, &format!("{label}:\t<none>")),
        Value::Array(items) => {
            w.line(level, &format!("{label}:"));
            for item in items {
                match item {
                    Value::Object(map) if !map.is_empty() => fields(w, level + 1, map, "- "),
                    other => w.line(level + 1, &scalar(other)),
                }
            }
        }
        other => {
            let text = scalar(other);
            let mut lines = text.split('\n');
            w.line(level, &format!("{label}:\t{}", lines.next().unwrap_or_default()));
            for more in lines {
                w.line(level + 1, more);
            }
        }
    }
}

/// The fields of a map, sorted; the first one prefixed by `marker` (and the others
/// indented to match) when the map is a list element.
fn fields(w: &mut Writer, level: usize, map: &Map<String, Value>, marker: &str) {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    for (i, key) in keys.into_iter().enumerate() {
        let mut sub = Writer::default();
        field(&mut sub, 0, key, &map[key]);
        let prefix = "  ".repeat(level);
        let lead = if marker.is_empty() {
            String::new()
        } else if i == 0 {
            marker.to_string()
        } else {
            " ".repeat(marker.len())
        };
        for (j, line) in sub.text.lines().enumerate() {
            let pad = if j == 0 { lead.clone() } else { " ".repeat(lead.len()) };
            w.text.push_str(&format!("{prefix}{pad}{line}\n"));
        }
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::Null => "<none>".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// An agent's last exit: how and when, then its last stderr lines, one per line.
fn last_exit(w: &mut Writer, exit: Option<&hive_api::agent::LastExit>, now: DateTime<Utc>) {
    let Some(exit) = exit else {
        w.line(0, "Last Exit:\t<none>");
        return;
    };
    let at = exit.finished_at.0.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let ago = output::age(Some(&at), now);
    w.line(0, &format!("Last Exit:\t{} at {at} ({ago} ago)", exit.how()));
    if !exit.stderr.is_empty() {
        w.line(1, "Stderr:");
        for line in &exit.stderr {
            // A tab would start a new column of the aligned output.
            w.line(2, &line.replace('\t', "    "));
        }
    }
}

/// Longer condition messages are cut in the table (`-o yaml` has them whole), so one
/// long error does not make every line of `describe` as wide.
const MAX_CONDITION_MESSAGE: usize = 120;

fn conditions_table(w: &mut Writer, conditions: &[Value]) {
    if conditions.is_empty() {
        w.line(0, "Conditions:\t<none>");
        return;
    }
    w.line(0, "Conditions:");
    w.line(1, "Type\tStatus\tReason\tMessage\tLast Transition");
    w.line(1, "----\t------\t------\t-------\t---------------");
    for c in conditions {
        let get = |k: &str| c.get(k).map(scalar).unwrap_or_default().replace(['\t', '\n'], " ");
        w.line(
            1,
            &format!(
                "{}\t{}\t{}\t{}\t{}",
                get("type"),
                get("status"),
                get("reason"),
                shorten(&get("message"), MAX_CONDITION_MESSAGE),
                get("lastTransitionTime")
            ),
        );
    }
}

/// The agents placed on Node `node`, by name: wanted and observed power, and Ready.
fn agents_table(w: &mut Writer, node: &str, agents: Option<&[Agent]>) {
    let Some(agents) = agents else {
        w.line(0, "Agents:\t<unknown>");
        return;
    };
    let mut placed: Vec<&Agent> = agents.iter().filter(|a| a.spec.node() == Some(node)).collect();
    if placed.is_empty() {
        w.line(0, "Agents:\t<none>");
        return;
    }
    placed.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    w.line(0, &format!("Agents:\t({} placed)", placed.len()));
    w.line(1, "Name\tWanted\tObserved\tReady");
    w.line(1, "----\t------\t--------\t-----");
    for a in placed {
        let ready =
            a.status.condition(hive_api::agent::CONDITION_READY).map_or("<none>", |c| match c.status {
                hive_api::ConditionStatus::True => "True",
                hive_api::ConditionStatus::False => "False",
                hive_api::ConditionStatus::Unknown => "Unknown",
            });
        let power = a.status.power.map_or("<none>", |p| p.as_str());
        let name = a.metadata.name.replace(['\t', '\n'], " ");
        w.line(1, &format!("{name}\t{}\t{power}\t{ready}", a.spec.wanted.as_str()));
    }
}

fn events_table(w: &mut Writer, events: &[Value], now: DateTime<Utc>) {
    if events.is_empty() {
        w.line(0, "Events:\t<none>");
        return;
    }
    let time = |e: &Value, keys: &[&str]| -> Option<String> {
        keys.iter()
            .find_map(|k| e.pointer(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string))
    };
    let last_keys = ["/lastTimestamp", "/eventTime", "/firstTimestamp", "/metadata/creationTimestamp"];
    let first_keys = ["/firstTimestamp", "/eventTime", "/lastTimestamp", "/metadata/creationTimestamp"];
    let mut sorted: Vec<&Value> = events.iter().collect();
    sorted.sort_by(|a, b| super::events::order(a, b));
    w.line(0, "Events:");
    w.line(1, "Type\tReason\tAge\tFrom\tMessage");
    w.line(1, "----\t------\t----\t----\t-------");
    for e in sorted {
        let text =
            |k: &str| e.pointer(k).and_then(Value::as_str).unwrap_or_default().replace(['\t', '\n'], " ");
        let last = output::age(time(e, &last_keys).as_deref(), now);
        let count = e.get("count").and_then(Value::as_i64).unwrap_or(1);
        let age = if count > 1 {
            format!("{last} (x{count} over {})", output::age(time(e, &first_keys).as_deref(), now))
        } else {
            last
        };
        let from = match (text("/source/component"), text("/source/host")) {
            (c, h) if !c.is_empty() && !h.is_empty() => format!("{c}, {h}"),
            (c, _) if !c.is_empty() => c,
            _ => text("/reportingComponent"),
        };
        w.line(
            1,
            &format!("{}\t{}\t{age}\t{from}\t{}", text("/type"), text("/reason"), text("/message").trim()),
        );
    }
}

/// kubectl's field labels: `creationTimestamp` → `Creation Timestamp`, `uid` → `UID`;
/// names with characters other than letters and `-` are kept as they are.
pub fn smart_label(field: &str) -> String {
    if field.is_empty() || field.chars().any(|c| !c.is_alphabetic() && c != '-') {
        return field.to_string();
    }
    const ACRONYMS: [&str; 12] =
        ["API", "CPU", "DAG", "DNS", "GPU", "GUID", "ID", "IP", "OSB", "TLS", "UID", "URL"];
    let mut words: Vec<String> = Vec::new();
    let chars: Vec<char> = field.chars().collect();
    let mut current = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let boundary = i > 0
            && c.is_uppercase()
            && (chars[i - 1].is_lowercase() || chars.get(i + 1).is_some_and(|n| n.is_lowercase()));
        if boundary && !current.is_empty() {
            words.push(std::mem::take(&mut current));
        }
        current.push(c);
    }
    words.push(current);
    words
        .into_iter()
        .map(|word| {
            let upper = word.to_uppercase();
            if ACRONYMS.contains(&upper.as_str()) {
                upper
            } else {
                let mut chars = word.chars();
                chars
                    .next()
                    .map(|f| f.to_uppercase().collect::<String>() + chars.as_str())
                    .unwrap_or_default()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde_json::json;

    use super::*;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 15, 0, 0).unwrap()
    }

    fn agent() -> Value {
        json!({
            "apiVersion": "hive.dev/v1",
            "kind": "Agent",
            "metadata": {
                "name": "a1",
                "uid": "6f1c2a3e-0000-4000-8000-000000000001",
                "resourceVersion": "107",
                "generation": 3,
                "creationTimestamp": "2026-11-29T14:39:19Z",
                "labels": {"tier": "gold", "app": "web"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"hive.dev/v1\"}\n",
                    "hive.dev/owner": "ops"
                },
                "finalizers": ["hive.dev/runtime"],
                "managedFields": [{"manager": "hive", "operation": "Apply"}]
            },
            "spec": {
                "wanted": "Up",
                "config": {"repo": "https://git.example/agents/a1.git", "rev": "main"},
                "resources": {"cpuQuota": "200%", "memoryMax": "4G"},
                "permissions": {"toolGroups": ["git", "web"], "capabilities": []},
                "nodes": [{"kind": "Prebuild", "deps": []}, {"kind": "Swap", "deps": ["prebuild"], "params": {"rev": "abc"}}]
            },
            "status": {
                "observedGeneration": 3,
                "power": "Up",
                "appliedRev": "abc1234",
                "activeJob": null,
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "Started", "message": "agent answers",
                     "lastTransitionTime": "2026-11-29T14:40:02Z"},
                    {"type": "Crashed", "status": "False", "reason": "Running", "lastTransitionTime": "2026-11-29T14:40:02Z"}
                ]
            }
        })
    }

    #[test]
    fn describe_agent_with_events() {
        let events = vec![
            json!({"type": "Normal", "reason": "Started", "message": "agent started",
                   "involvedObject": {"name": "a1", "kind": "Agent"},
                   "source": {"component": "hive-scheduler"},
                   "firstTimestamp": "2026-11-29T14:40:00Z", "lastTimestamp": "2026-11-29T14:40:00Z", "count": 1}),
            json!({"type": "Warning", "reason": "BuildSlow", "message": "prebuild took 4m\n",
                   "involvedObject": {"name": "a1", "kind": "Agent"},
                   "reportingComponent": "hive-agent-controller",
                   "firstTimestamp": "2026-11-29T14:20:00Z", "lastTimestamp": "2026-11-29T14:55:00Z", "count": 3}),
        ];
        insta::assert_snapshot!(render(&agent(), Related { events: Some(&events), agents: None }, now()));
    }

    /// Issue 32: where it stands and how it last ended come first, short, and no
    /// condition makes the page wider than its longest message's first 120 characters.
    #[test]
    fn describe_a_crash_looping_agent_says_why_first() {
        let long = format!("its restart failed: {}", "x".repeat(400));
        let crashy = json!({
            "apiVersion": "hive.dev/v1", "kind": "Agent",
            "metadata": {"name": "crashy", "generation": 1, "creationTimestamp": "2026-11-29T14:39:19Z"},
            "spec": {"wanted": "Up", "config": {"repo": "/srv/crashy.git"},
                     "runtime": {"type": "process", "process": {"command": ["./run"]}}},
            "status": {
                "phase": "CrashLoopBackOff", "power": "Stopped", "restarts": 4, "observedGeneration": 1,
                "lastExit": {"exitCode": 3, "finishedAt": "2026-11-29T14:59:48Z",
                             "stderr": ["loading config", "panic: $STATE_DIR/agents/crashy/current/config.toml: no such file"]},
                "conditions": [
                    {"type": "Crashed", "status": "True", "reason": "CrashLoopBackOff",
                     "message": "exited on its own (exit code 3); crash 5 in a row, restarting in 16s",
                     "lastTransitionTime": "2026-11-29T14:59:48Z"},
                    {"type": "Ready", "status": "False", "reason": "CrashLoopBackOff",
                     "message": long, "lastTransitionTime": "2026-11-29T14:59:48Z"}
                ]
            }
        });
        let text = render(&crashy, Related { events: Some(&[]), agents: None }, now());
        insta::assert_snapshot!(text);
        let widest = text.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(widest < 220, "{widest} columns");
    }

    #[test]
    fn describe_minimal_object() {
        let object =
            json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "j1"}, "spec": {}});
        insta::assert_snapshot!(render(&object, Related { events: Some(&[]), agents: None }, now()));
    }

    /// A Restart whose two agents failed (issue 32): describe shows the message naming
    /// both failed nodes, and each node's state and error.
    #[test]
    fn describe_a_failed_job_names_every_failed_node() {
        let node = |agent: &str, kind: &str, dep: Option<&str>| {
            let mut n = json!({"id": format!("{agent}/{kind}"), "kind": "Reconcile", "agent": agent});
            if let Some(dep) = dep {
                n["deps"] = json!([{"node": format!("{agent}/{dep}")}]);
            }
            n
        };
        let job = json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "restart-2f"},
            "spec": {"template": "Restart", "agents": ["crashy", "nolaunch"], "nodes": [
                node("crashy", "set-wanted", None), node("crashy", "reconcile", Some("set-wanted")),
                node("nolaunch", "set-wanted", None), node("nolaunch", "reconcile", Some("set-wanted"))]},
            "status": {"phase": "Failed", "finishedAt": "2026-11-29T14:59:00Z",
                "message": "2 nodes failed: crashy/reconcile: died within its start grace (exit code 3); \
                            nolaunch/reconcile: start failed: ./no-such-program: not found",
                "nodes": [
                    {"id": "crashy/set-wanted", "state": "Done"},
                    {"id": "crashy/reconcile", "state": "Failed", "error": "died within its start grace (exit code 3)"},
                    {"id": "nolaunch/set-wanted", "state": "Done"},
                    {"id": "nolaunch/reconcile", "state": "Failed", "error": "start failed: ./no-such-program: not found"}]}});
        insta::assert_snapshot!(render(&job, Related { events: Some(&[]), agents: None }, now()));
    }

    /// A Job with `spec.ttlSecondsAfterFinished` says when the daemon deletes it: the time
    /// once it finished (and how far off), the rule before.
    #[test]
    fn a_job_with_a_ttl_says_when_it_expires() {
        let job = |status: Value| {
            json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": "j1"},
                   "spec": {"template": "Reconcile", "ttlSecondsAfterFinished": 600,
                            "nodes": [{"id": "r", "kind": "Reconcile", "agent": "a"}]},
                   "status": status})
        };
        let expires = |object: &Value| {
            let text = render(object, Related::default(), now());
            text.lines().find(|l| l.starts_with("Expires:")).map(words)
        };
        let done = job(json!({"phase": "Done", "finishedAt": "2026-11-29T14:58:00Z"}));
        assert_eq!(
            expires(&done).as_deref(),
            Some("Expires: 2026-11-29T15:08:00Z (in 8m, 600s after it finished)")
        );
        let long_done = job(json!({"phase": "Failed", "finishedAt": "2026-11-29T14:40:00Z"}));
        assert_eq!(
            expires(&long_done).as_deref(),
            Some("Expires: 2026-11-29T14:50:00Z (10m ago, 600s after it finished)")
        );
        let running = job(json!({"phase": "Running"}));
        assert_eq!(expires(&running).as_deref(), Some("Expires: 600s after it finishes"));
        // Without a TTL of its own nothing is said: the daemon's max age is its own.
        let mut plain = done.clone();
        plain["spec"].as_object_mut().unwrap().remove("ttlSecondsAfterFinished");
        assert_eq!(expires(&plain), None);
    }

    /// A line with its runs of spaces made one, so a case does not depend on alignment.
    fn words(line: &str) -> String {
        line.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    fn node() -> Value {
        json!({
            "apiVersion": "hive.dev/v1", "kind": "Node", "metadata": {"name": "node-1"},
            "spec": {"provider": "process", "logicalId": 1},
            "status": {"phase": "Running"}
        })
    }

    fn placed_agent(name: &str, node: Option<&str>, power: Option<&str>, ready: Option<&str>) -> Agent {
        crate::cli::client::decode(&placed(name, node, power, ready), "Agent").unwrap()
    }

    fn placed(name: &str, node: Option<&str>, power: Option<&str>, ready: Option<&str>) -> Value {
        let mut agent =
            json!({"kind": "Agent", "metadata": {"name": name}, "spec": {"wanted": "Up"}, "status": {}});
        if let Some(node) = node {
            agent["spec"]["placement"] = json!({"node": node});
        }
        if let Some(power) = power {
            agent["status"]["power"] = json!(power);
        }
        if let Some(ready) = ready {
            agent["status"]["conditions"] = json!([{"type": "Ready", "status": ready}]);
        }
        agent
    }

    #[test]
    fn describe_node_lists_its_placed_agents() {
        let agents = vec![
            placed_agent("zeta", Some("node-1"), None, None),
            placed_agent("local", None, Some("Running"), Some("True")),
            placed_agent("alpha", Some("node-1"), Some("Running"), Some("True")),
            placed_agent("other", Some("node-2"), Some("Running"), Some("True")),
        ];
        let related = Related { events: None, agents: Some(Some(&agents)) };
        insta::assert_snapshot!(render(&node(), related, now()));
    }

    #[test]
    fn a_node_without_agents_says_so() {
        let elsewhere = [placed_agent("b", Some("node-2"), None, None)];
        let cases: [(Option<&[Agent]>, &str); 3] = [
            (Some(&[]), "Agents: <none>"),
            (Some(&elsewhere), "Agents: <none>"),
            (None, "Agents: <unknown>"),
        ];
        for (agents, line) in cases {
            let text = render(&node(), Related { events: None, agents: Some(agents) }, now());
            assert!(text.lines().any(|l| words(l) == line), "{line:?} in\n{text}");
        }
    }

    #[test]
    fn an_agent_says_which_node_runs_it() {
        let cases = [(Some("node-1"), "Node: node-1"), (None, "Node: <none> (the daemon's host)")];
        for (node, line) in cases {
            let text = render(&placed("a", node, None, None), Related::default(), now());
            assert!(text.lines().any(|l| words(l) == line), "{line:?} in\n{text}");
        }
    }

    #[test]
    fn labels_like_kubectl() {
        let cases = [
            ("creationTimestamp", "Creation Timestamp"),
            ("uid", "UID"),
            ("apiVersion", "API Version"),
            ("resourceVersion", "Resource Version"),
            ("cpuQuota", "CPU Quota"),
            ("observedGeneration", "Observed Generation"),
            ("activeJob", "Active Job"),
            ("selectedOfferIds", "Selected Offer Ids"),
            ("endpointID", "Endpoint ID"),
            ("gpu2", "gpu2"),
            ("hive.dev/owner", "hive.dev/owner"),
            ("wanted", "Wanted"),
        ];
        for (field, label) in cases {
            assert_eq!(smart_label(field), label, "{field}");
        }
    }

    #[test]
    fn long_annotations_are_cut() {
        let long = "x".repeat(200);
        let object = json!({"metadata": {"name": "a", "annotations": {"note": long}}});
        let text = render(&object, Related::default(), now());
        let expected_line = format!("{}  {}...", " ".repeat(14), "x".repeat(138));
        assert!(text.lines().any(|l| l == expected_line), "{text}");
    }
}
