//! `hive events [--for KIND/NAME] [--types T,…] [-w]`: the Events about one object, or
//! all of them, oldest first (`lastTimestamp`, else `eventTime`, `firstTimestamp`,
//! `creationTimestamp`, to the microsecond where hive recorded `series.lastObservedTime`
//! or `eventTime`; then resourceVersion, then name), as `kubectl events` prints them: `LAST SEEN`, `TYPE`,
//! `REASON`, `OBJECT`, `MESSAGE`. On a terminal (or with `COLUMNS` exported) the MESSAGE
//! is cut with `…` so each line fits the width; `-o wide`, a pipe and a file get the full
//! text. `-w` follows new ones.

use std::cmp::Ordering;

use anyhow::Result;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;

use super::client::{self, Query, JSON};
use super::output::{self, Format};
use super::{get, kind, terminal, Context};

/// The part of a list page `events` reads besides its items.
#[derive(Deserialize)]
struct ListHead {
    #[serde(default)]
    metadata: hive_api::meta::ListMeta,
}

/// Arguments of `hive events`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive events                          # every recorded event, oldest first
  hive events --for agent/manager      # what happened to one agent
  hive events agent/manager -w         # the same, following new ones
  hive events --types Warning          # only warnings
  hive events -o wide                  # with SOURCE and COUNT, messages never cut

MESSAGE is cut with … to the terminal's width (or $COLUMNS when exported); -o wide,
a pipe or a file get the full text.")]
pub struct Args {
    /// The object whose events to show, as `KIND/NAME` (e.g. `agent/manager`); the same
    /// as `--for`.
    #[arg(value_name = "KIND/NAME", conflicts_with = "for_object")]
    pub object: Option<String>,

    /// Only the events about this object, as `KIND/NAME` (e.g. `agent/manager`).
    #[arg(long = "for", value_name = "KIND/NAME")]
    pub for_object: Option<String>,

    /// Only events of these types (`Normal`, `Warning`; comma-separated).
    #[arg(long, value_name = "TYPES", value_delimiter = ',', value_parser = parse_type)]
    pub types: Vec<String>,

    /// Keep printing events as they are recorded.
    #[arg(short, long)]
    pub watch: bool,

    /// Output format: table (default), wide, yaml, json, name, jsonpath=TEMPLATE,
    /// custom-columns=HEADER:PATH,….
    #[arg(short, long, value_name = "FORMAT", value_parser = super::output::Format::parse)]
    pub output: Option<super::output::Format>,
}

/// Parses one `--types` value the way kubectl does (any case), as the canonical name.
fn parse_type(text: &str) -> Result<String, String> {
    ["Normal", "Warning"]
        .into_iter()
        .find(|t| t.eq_ignore_ascii_case(text.trim()))
        .map(str::to_string)
        .ok_or_else(|| format!("{text:?}: valid --types are Normal or Warning"))
}

/// The field selector for `object` (`KIND/NAME`).
pub fn selector(object: &str) -> Result<String> {
    let Some((kind_name, name)) = object.split_once('/') else {
        anyhow::bail!("expected KIND/NAME, e.g. agent/manager; got {object:?}");
    };
    let kind = kind::resolve(&kind::all(), kind_name)?;
    Ok(format!("involvedObject.kind={},involvedObject.name={name}", kind.kind))
}

/// The whole field selector: the object's, and the type when only one is asked for
/// (both types is every event).
fn field_selector(args: &Args) -> Result<Option<String>> {
    let mut parts = Vec::new();
    if let Some(object) = args.object.as_deref().or(args.for_object.as_deref()) {
        parts.push(selector(object)?);
    }
    let mut types = args.types.clone();
    types.sort();
    types.dedup();
    if let [only] = types.as_slice() {
        parts.push(format!("type={only}"));
    }
    Ok((!parts.is_empty()).then(|| parts.join(",")))
}

/// Runs `hive events`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let field_selector = field_selector(&args)?;
    let format = args.output.clone().unwrap_or(Format::Table);
    let get_args = get::Args {
        resources: vec!["events".into()],
        output: args.output.clone(),
        selector: None,
        field_selector,
        watch: args.watch,
        show_labels: false,
        no_headers: false,
        ignore_not_found: false,
        show_managed_fields: false,
        chunk_size: 500,
        sort_by: None,
    };
    if args.watch && !format.is_table() {
        return get::exec(get_args, ctx).await;
    }
    let client = ctx.client()?;
    let kind = &hive_api::event::EVENT_KIND;
    let pages = get::list_pages(&client, kind, &get_args, false).await?;
    let resource_version = pages
        .last()
        .and_then(|p| ListHead::deserialize(p).ok())
        .and_then(|list| list.metadata.resource_version);
    let mut events: Vec<Value> = pages
        .into_iter()
        .flat_map(|p| match p.get("items") {
            Some(Value::Array(items)) => items.clone(),
            _ => Vec::new(),
        })
        .collect();
    sort(&mut events);
    if !format.is_table() {
        let found = events.into_iter().map(|e| (*kind, get::prepare(kind, e, false))).collect();
        return Ok(output::print(&get::render_objects(&format, found, false, false)?)?);
    }
    let mut printer = Printer {
        wide: format == Format::Wide,
        width: terminal::width(),
        widths: Vec::new(),
        header_done: false,
    };
    if events.is_empty() && !args.watch {
        super::output::eprint_line("No events found.");
        return Ok(());
    }
    output::print(&printer.rows(&events, crate::host::now()))?;
    if !args.watch {
        return Ok(());
    }
    let query = Query::default()
        .push_opt("fieldSelector", get_args.field_selector.as_deref())
        .push_opt("resourceVersion", resource_version)
        .push("allowWatchBookmarks", "true")
        .push("watch", "true");
    let mut stream = client.watch(&format!("{}{query}", kind::collection_path(kind)), JSON).await?;
    while let Some(event) = stream.next().await? {
        match event.type_.as_str() {
            "ADDED" | "MODIFIED" => {
                output::print(&printer.rows(std::slice::from_ref(&event.object), crate::host::now()))?
            }
            "ERROR" => return Err(client::event_error(&event).into()),
            _ => {}
        }
    }
    Ok(())
}

/// When an event last happened: `lastTimestamp`, else `series.lastObservedTime`,
/// `eventTime`, `firstTimestamp`, `metadata.creationTimestamp`.
fn seen(event: &Value) -> Option<DateTime<Utc>> {
    [
        "/lastTimestamp",
        "/series/lastObservedTime",
        "/eventTime",
        "/firstTimestamp",
        "/metadata/creationTimestamp",
    ]
    .iter()
    .filter_map(|p| event.pointer(p).and_then(Value::as_str))
    .find_map(|t| DateTime::parse_from_rfc3339(t).ok())
    .map(|t| t.with_timezone(&Utc))
}

/// The microsecond time hive records beside the whole-second ones: a repeat's
/// `series.lastObservedTime`, else `eventTime`.
fn micro(event: &Value) -> Option<DateTime<Utc>> {
    ["/series/lastObservedTime", "/eventTime"]
        .iter()
        .filter_map(|p| event.pointer(p).and_then(Value::as_str))
        .find_map(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// The order events are shown in, a total one: when they last happened — hive's
/// microsecond time (see `micro`), else the whole second (see `seen`) counted as the end
/// of that second, since it may have been any moment in it — then `resourceVersion` (the
/// order they were written), then name; events with no time at all first.
pub fn order(a: &Value, b: &Value) -> Ordering {
    let at = |e: &Value| {
        micro(e)
            .map(|t| t.timestamp_micros())
            .or_else(|| seen(e).map(|t| t.timestamp() * 1_000_000 + 999_999))
    };
    use hive_api::meta::{name_of, resource_version_of};
    at(a)
        .cmp(&at(b))
        .then_with(|| resource_version_of(a).cmp(&resource_version_of(b)))
        .then_with(|| name_of(a).cmp(name_of(b)))
}

/// Sorts events oldest first, by [`order`].
pub fn sort(events: &mut [Value]) {
    events.sort_by(order);
}

/// Prints event rows: the header once, columns aligned with the rows before them, and
/// the MESSAGE (the last column) cut to `width` unless `wide`.
struct Printer {
    wide: bool,
    width: Option<usize>,
    widths: Vec<usize>,
    header_done: bool,
}

impl Printer {
    fn rows(&mut self, events: &[Value], now: DateTime<Utc>) -> String {
        let mut lines = Vec::new();
        if !self.header_done {
            self.header_done = true;
            lines.push(header(self.wide));
        }
        lines.extend(events.iter().map(|e| cells(e, self.wide, now)));
        if !self.wide {
            if let Some(width) = self.width {
                output::fit_last_column(&mut lines, &mut self.widths, width);
            }
        }
        output::align(&lines, &mut self.widths)
    }
}

fn header(wide: bool) -> Vec<String> {
    let mut names = vec!["LAST SEEN", "TYPE", "REASON", "OBJECT"];
    if wide {
        names.extend(["SOURCE", "COUNT", "FIRST SEEN"]);
    }
    names.push("MESSAGE");
    names.into_iter().map(str::to_string).collect()
}

/// One event's cells; LAST SEEN reads `5m (x3 over 10m)` for a folded repeat.
fn cells(event: &Value, wide: bool, now: DateTime<Utc>) -> Vec<String> {
    let text = |p: &str| event.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    let age_of = |t: Option<DateTime<Utc>>| {
        t.map_or("<unknown>".into(), |t| output::human_duration((now - t).num_seconds()))
    };
    let count = event.get("count").and_then(Value::as_i64).unwrap_or(1);
    let first = event
        .get("firstTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc));
    let mut last_seen = age_of(seen(event));
    if count > 1 {
        if let Some(first) = first {
            last_seen = format!("{last_seen} (x{count} over {})", age_of(Some(first)));
        }
    }
    let object = format!("{}/{}", text("/involvedObject/kind").to_lowercase(), text("/involvedObject/name"));
    let mut out = vec![last_seen, text("/type"), text("/reason"), object];
    if wide {
        let source = Some(text("/source/component"))
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| text("/reportingComponent"));
        out.extend([source, count.to_string(), age_of(first.or(seen(event)))]);
    }
    out.push(output::cell_text(&Value::String(text("/message"))));
    out
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde_json::json;

    use super::*;

    #[test]
    fn selectors_name_kind_and_object() {
        assert_eq!(selector("ag/manager").unwrap(), "involvedObject.kind=Agent,involvedObject.name=manager");
        assert!(selector("manager").unwrap_err().to_string().contains("KIND/NAME"));
        assert!(selector("gadget/x").is_err());
    }

    #[test]
    fn types_parse_in_any_case_and_refuse_others() {
        assert_eq!(parse_type("warning").unwrap(), "Warning");
        assert_eq!(parse_type("Normal").unwrap(), "Normal");
        assert!(parse_type("Loud").unwrap_err().contains("valid --types are Normal or Warning"));
    }

    fn event(name: &str, last: Option<&str>, message: &str) -> Value {
        let mut e = json!({"metadata": {"name": name, "creationTimestamp": "2026-11-29T14:00:00Z"},
            "involvedObject": {"kind": "Agent", "name": "hello"}, "reason": "Started", "type": "Normal",
            "message": message, "count": 1, "source": {"component": "hive-agent-controller"}});
        if let Some(last) = last {
            e["lastTimestamp"] = json!(last);
            e["firstTimestamp"] = json!(last);
        }
        e
    }

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 15, 0, 0).unwrap()
    }

    #[test]
    fn sorted_by_time_then_name() {
        let mut events = vec![
            event("a", Some("2026-11-29T14:59:00Z"), "late"),
            event("z", Some("2026-11-29T14:10:00Z"), "early"),
            event("b", Some("2026-11-29T14:59:00Z"), "late too"),
            json!({"metadata": {"name": "e"}, "eventTime": "2026-11-29T14:30:00Z"}),
        ];
        sort(&mut events);
        let names: Vec<&str> = events.iter().map(|e| e["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["z", "e", "a", "b"]);
    }

    /// Within one second the microsecond times decide (a repeat's last one over its
    /// first), then the order of writes: `Spawned` came out after `Started` when only
    /// whole seconds and names were compared.
    #[test]
    fn within_one_second_microseconds_then_writes_decide() {
        let at = |name: &str, rv: &str, micro: Option<&str>, series: Option<&str>| {
            let mut e = event(name, Some("2026-11-29T14:59:00Z"), name);
            e["metadata"]["resourceVersion"] = json!(rv);
            if let Some(micro) = micro {
                e["eventTime"] = json!(micro);
            }
            if let Some(last) = series {
                e["series"] = json!({"count": 2, "lastObservedTime": last});
            }
            e
        };
        let mut events = vec![
            at("a-started", "12", Some("2026-11-29T14:59:00.700000Z"), None),
            at("z-spawned", "11", Some("2026-11-29T14:59:00.200000Z"), None),
            at("m-backoff", "9", Some("2026-11-29T14:59:00.100000Z"), Some("2026-11-29T14:59:00.900000Z")),
            at("c-second", "20", None, None),
            at("b-first", "19", None, None),
        ];
        sort(&mut events);
        let names: Vec<&str> = events.iter().map(|e| e["metadata"]["name"].as_str().unwrap()).collect();
        // Whole seconds only (another client's): the end of that second, then write order.
        assert_eq!(names, ["z-spawned", "a-started", "m-backoff", "b-first", "c-second"]);
    }

    #[test]
    fn messages_are_cut_to_the_width_unless_wide() {
        let long = "x".repeat(300);
        let events = vec![event("a", Some("2026-11-29T14:59:00Z"), &long), event("b", None, "short")];
        let mut printer = Printer { wide: false, width: Some(80), widths: Vec::new(), header_done: false };
        let text = printer.rows(&events, now());
        for line in text.lines() {
            assert!(terminal::text_width(line) <= 80, "{line:?} is wider than 80");
        }
        assert!(text.contains('…'), "{text}");
        assert!(text.lines().nth(2).unwrap().ends_with("short"), "{text}");
        let mut wide = Printer { wide: true, width: Some(80), widths: Vec::new(), header_done: false };
        let text = wide.rows(&events, now());
        assert!(text.contains(&long) && text.contains("hive-agent-controller"), "{text}");
        let mut piped = Printer { wide: false, width: None, widths: Vec::new(), header_done: false };
        assert!(piped.rows(&events, now()).contains(&long));
    }

    #[test]
    fn repeats_show_count_and_span() {
        let mut e = event("a", Some("2026-11-29T14:59:00Z"), "crashed");
        e["count"] = json!(3);
        e["firstTimestamp"] = json!("2026-11-29T14:50:00Z");
        assert_eq!(cells(&e, false, now())[0], "60s (x3 over 10m)");
    }
}
