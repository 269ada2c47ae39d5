//! `hive get`: list objects as the server's table (kubectl-aligned), or print them as
//! YAML, JSON, names or a JSONPath template; `-w` keeps printing changes.

use anyhow::{bail, Result};
use hive_api::KindInfo;
use serde_json::{Map, Value};

use super::client::{self, Client, Query, JSON, TABLE_ACCEPT};
use super::columns;
use super::jsonpath::Path;
use super::kind::{self, Target};
use super::output::{self, ColumnDefinition, Format, Table, TableOptions};
use super::{Context, Reported};

/// Arguments of `hive get` (its help text is on [`super::Command::Get`]).
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive get agents                      # table of every agent
  hive get ag a1 -o yaml               # one agent as YAML
  hive get agent/a1 job/j1             # objects of different kinds
  hive get agents -l tier=gold -o wide # filtered, with the extra columns
  hive get all                         # a table per kind
  hive get agents -w                   # keep printing changes
  hive get agents --sort-by=.metadata.creationTimestamp
  hive get agents -o custom-columns=NAME:.metadata.name,WANTED:.spec.wanted
  hive get agents -o jsonpath='{range .items[*]}{.metadata.name}{\"\\n\"}{end}'
  hive get agent a1 -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}'")]
pub struct Args {
    /// `KIND [NAME...]`, `KIND,KIND... [NAME...]` or `KIND/NAME...`.
    #[arg(value_name = "KIND [NAME]", required = true)]
    pub resources: Vec<String>,

    /// Output format: table (default), wide (extra columns), yaml, json, name,
    /// jsonpath=TEMPLATE (`{range .items[*]}…{end}` too), or
    /// custom-columns=HEADER:PATH,… (e.g. `NAME:.metadata.name,WANTED:.spec.wanted`).
    #[arg(short, long, value_name = "FORMAT", value_parser = Format::parse)]
    pub output: Option<Format>,

    /// Only objects whose labels match, e.g. `app=web,tier!=db` or `env in (a,b)`.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,

    /// Only objects whose fields match, e.g. `metadata.name=a1`.
    #[arg(long, value_name = "SELECTOR")]
    pub field_selector: Option<String>,

    /// After listing, watch for changes and print each changed object as it happens
    /// (in a table, only when a column other than AGE changed). Ends when the server
    /// closes the stream.
    #[arg(short, long)]
    pub watch: bool,

    /// Add a LABELS column to tables.
    #[arg(long)]
    pub show_labels: bool,

    /// Do not print the table header.
    #[arg(long)]
    pub no_headers: bool,

    /// Do not fail when a named object does not exist.
    #[arg(long)]
    pub ignore_not_found: bool,

    /// Keep `metadata.managedFields` in yaml and json output.
    #[arg(long)]
    pub show_managed_fields: bool,

    /// List in pages of this many objects (0: all at once).
    #[arg(long, value_name = "N", default_value_t = 500)]
    pub chunk_size: u32,

    /// Sort the list by the value of this JSONPath, e.g. `.metadata.creationTimestamp`
    /// (numbers numerically, the rest as text; objects without it first). Not applied
    /// to the changes `-w` prints.
    #[arg(long, value_name = "PATH", value_parser = columns::single_path)]
    pub sort_by: Option<Path>,
}

/// Runs `hive get`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let kinds = kind::all();
    let targets = kind::parse_targets(&kinds, &args.resources, "get")?;
    let format = args.output.clone().unwrap_or(Format::Table);
    if args.watch {
        let [target] = targets.as_slice() else {
            bail!("you may only specify a single resource type with --watch");
        };
        if target.names.len() > 1 {
            bail!(
                "watch is only supported on individual resources and resource collections, but {} \
                 resources were found",
                target.names.len()
            );
        }
        let client = ctx.client()?;
        return watch(&client, target, &args, &format).await;
    }
    let client = ctx.client()?;
    let mut failures = Vec::new();
    if format.is_table() {
        let several = targets.len() > 1;
        let mut blocks = Vec::new();
        for target in &targets {
            let mut table = fetch_table(&client, target, &args, &mut failures).await?;
            if let Some(path) = &args.sort_by {
                columns::sort_by(&mut table.rows, path, |row| row.object.as_ref());
            }
            if table.rows.is_empty() {
                continue;
            }
            let opts = TableOptions {
                wide: format == Format::Wide,
                show_labels: args.show_labels,
                no_headers: args.no_headers,
                kind_prefix: several.then_some(target.kind),
            };
            blocks.push(output::render_table(&table, &opts));
        }
        output::print(&blocks.join("\n"))?;
        if blocks.is_empty() && failures.is_empty() && targets.iter().all(|t| t.names.is_empty()) {
            super::output::eprint_line("No resources found");
        }
    } else {
        let mut found: Vec<(KindInfo, Value)> = Vec::new();
        for target in &targets {
            for object in fetch_objects(&client, target, &args, &mut failures).await? {
                found.push((target.kind, object));
            }
        }
        if let Some(path) = &args.sort_by {
            columns::sort_by(&mut found, path, |(_, object)| Some(object));
        }
        if let (Format::CustomColumns(columns), true) = (&format, args.no_headers) {
            let objects: Vec<Value> = found.into_iter().map(|(_, o)| o).collect();
            output::print(&output::align(&columns::cells(columns, &objects, false), &mut Vec::new()))?;
            found = Vec::new();
        }
        let single = targets.len() == 1 && targets[0].names.len() == 1;
        output::print(&render_objects(&format, found, single, targets.iter().any(|t| !t.names.is_empty()))?)?;
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

/// The output for `-o yaml|json|name|jsonpath`: one named object as itself, anything
/// else wrapped in a `kind: List` (nothing at all when only named objects were asked
/// for and none exists).
pub fn render_objects(
    format: &Format,
    found: Vec<(KindInfo, Value)>,
    single: bool,
    named: bool,
) -> Result<String> {
    if found.is_empty() && named {
        return Ok(String::new());
    }
    if let Format::Name = format {
        return Ok(found.iter().map(|(k, o)| output::names(k, std::slice::from_ref(o))).collect());
    }
    if let Format::CustomColumns(columns) = format {
        if found.is_empty() {
            return Ok(String::new());
        }
        let objects: Vec<Value> = found.into_iter().map(|(_, o)| o).collect();
        return Ok(output::align(&columns::cells(columns, &objects, true), &mut Vec::new()));
    }
    let root = if single && found.len() == 1 {
        found.into_iter().next().map(|(_, o)| o).unwrap_or(Value::Null)
    } else {
        output::list(found.into_iter().map(|(_, o)| o).collect())
    };
    match format {
        Format::Yaml => output::yaml(&root),
        Format::Json => output::json(&root),
        Format::JsonPath(template) => Ok(template.render(&root)),
        Format::Table | Format::Wide | Format::Name | Format::CustomColumns(_) => {
            unreachable!("handled above or by the caller")
        }
    }
}

fn list_query(args: &Args, name: Option<&str>) -> Query {
    let mut fields: Vec<String> = args.field_selector.iter().cloned().collect();
    if let Some(name) = name {
        fields.push(format!("metadata.name={name}"));
    }
    Query::default()
        .push_opt("labelSelector", args.selector.as_deref())
        .push_opt("fieldSelector", (!fields.is_empty()).then(|| fields.join(",")))
        // Table rows carry only metadata unless asked; sorting may need any field.
        .push_opt("includeObject", args.sort_by.is_some().then_some("Object"))
}

/// Every page of a list, following `continue` tokens (`table`: as server-side Tables).
pub async fn list_pages(client: &Client, kind: &KindInfo, args: &Args, table: bool) -> Result<Vec<Value>> {
    let mut pages = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let query = list_query(args, None)
            .push_opt("limit", (args.chunk_size > 0).then(|| args.chunk_size.to_string()))
            .push_opt("continue", token.as_deref());
        let path = format!("{}{query}", kind::collection_path(kind));
        let page = if table { client.get_table(&path).await? } else { client.get(&path).await? };
        token = page
            .pointer("/metadata/continue")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        pages.push(page);
        if token.is_none() {
            return Ok(pages);
        }
    }
}

/// The table of one target: its list (all pages) or its named objects.
async fn fetch_table(
    client: &Client,
    target: &Target,
    args: &Args,
    failures: &mut Vec<String>,
) -> Result<Table> {
    let now = crate::host::now();
    let mut table: Option<Table> = None;
    let mut add = |next: Table| match &mut table {
        Some(t) => t.rows.extend(next.rows),
        None => table = Some(next),
    };
    if target.names.is_empty() {
        for page in list_pages(client, &target.kind, args, true).await? {
            add(Table::from_response(page, now));
        }
    } else {
        for name in &target.names {
            let query =
                Query::default().push_opt("includeObject", args.sort_by.is_some().then_some("Object"));
            match client.get_table(&format!("{}{query}", kind::object_path(&target.kind, name))).await {
                Ok(body) => add(Table::from_response(body, now)),
                Err(e) => record_failure(e, args.ignore_not_found, failures)?,
            }
        }
    }
    Ok(table.unwrap_or_default())
}

/// The objects of one target, for the non-table formats.
async fn fetch_objects(
    client: &Client,
    target: &Target,
    args: &Args,
    failures: &mut Vec<String>,
) -> Result<Vec<Value>> {
    let mut objects = Vec::new();
    if target.names.is_empty() {
        for page in list_pages(client, &target.kind, args, false).await? {
            if let Some(Value::Array(items)) = page.get("items") {
                objects.extend(items.iter().cloned());
            }
        }
    } else {
        for name in &target.names {
            match client.get(&kind::object_path(&target.kind, name)).await {
                Ok(object) => objects.push(object),
                Err(e) => record_failure(e, args.ignore_not_found, failures)?,
            }
        }
    }
    Ok(objects.into_iter().map(|o| prepare(&target.kind, o, args.show_managed_fields)).collect())
}

/// A not-found (or other server refusal) of one named object is reported and the
/// others still printed, as kubectl does; a transport failure ends the command.
fn record_failure(err: anyhow::Error, ignore_not_found: bool, failures: &mut Vec<String>) -> Result<()> {
    match client::api_error(&err) {
        Some(api) if api.code() == 404 && ignore_not_found => Ok(()),
        Some(api) => {
            failures.push(api.render());
            Ok(())
        }
        None => Err(err),
    }
}

/// An object as printed: `apiVersion` and `kind` first (list items may lack them) and
/// managed fields hidden unless asked for.
pub fn prepare(kind: &KindInfo, object: Value, show_managed_fields: bool) -> Value {
    let Value::Object(map) = object else { return object };
    let mut out = Map::new();
    out.insert(
        "apiVersion".into(),
        map.get("apiVersion").cloned().unwrap_or_else(|| hive_api::meta::API_VERSION.into()),
    );
    out.insert("kind".into(), map.get("kind").cloned().unwrap_or_else(|| kind.kind.into()));
    for (k, v) in map {
        if k != "apiVersion" && k != "kind" {
            out.insert(k, v);
        }
    }
    let mut object = Value::Object(out);
    if !show_managed_fields {
        output::hide_managed_fields(&mut object);
    }
    object
}

/// `get -w`: the current state, then every change until the server ends the stream.
async fn watch(client: &Client, target: &Target, args: &Args, format: &Format) -> Result<()> {
    let name = target.names.first().map(String::as_str);
    let path = kind::collection_path(&target.kind);
    let table_mode = format.is_table();
    let opts = TableOptions {
        wide: *format == Format::Wide,
        show_labels: args.show_labels,
        no_headers: args.no_headers,
        kind_prefix: None,
    };
    let mut printer = WatchPrinter {
        format: format.clone(),
        opts,
        widths: Vec::new(),
        header_done: false,
        printed: 0,
        columns: Vec::new(),
        shown: std::collections::HashMap::new(),
    };

    let list_path = format!("{path}{}", list_query(args, name));
    let first = if table_mode { client.get_table(&list_path).await? } else { client.get(&list_path).await? };
    let resource_version =
        first.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string();
    let initial = printer.render(&target.kind, first, args.show_managed_fields)?;
    if printer.printed == 0 {
        super::output::eprint_line("No resources found");
    }
    output::print(&initial)?;

    let query = list_query(args, name)
        .push_opt("resourceVersion", Some(resource_version))
        .push("allowWatchBookmarks", "true")
        .push("watch", "true");
    let accept = if table_mode { TABLE_ACCEPT } else { JSON };
    let mut stream = client.watch(&format!("{path}{query}"), accept).await?;
    while let Some(event) = stream.next().await? {
        match event.type_.as_str() {
            "BOOKMARK" => continue,
            "ERROR" => return Err(client::event_error(&event).into()),
            "MODIFIED" if table_mode => output::print(&printer.render_changed(event.object)?)?,
            _ => output::print(&printer.render(&target.kind, event.object, args.show_managed_fields)?)?,
        }
    }
    Ok(())
}

/// Prints what a watch delivers: table rows aligned with the rows before them (the
/// header once, with the first row), or objects in the chosen format.
struct WatchPrinter {
    format: Format,
    opts: TableOptions,
    widths: Vec<usize>,
    header_done: bool,
    printed: usize,
    /// The last column definitions seen: like the Kubernetes API server, ours may send
    /// them with the list and the first event only.
    columns: Vec<ColumnDefinition>,
    /// The cells last printed for each object, by name (AGE aside): a MODIFIED event
    /// that changes nothing the user sees (a Node's telemetry summary, every 2 s)
    /// prints nothing.
    shown: std::collections::HashMap<String, Vec<String>>,
}

impl WatchPrinter {
    /// A MODIFIED event's rows, leaving out those whose visible cells are what was last
    /// printed for that object.
    fn render_changed(&mut self, body: Value) -> Result<String> {
        let mut table = self.table(body);
        let seen = self.seen(&table);
        let rows = std::mem::take(&mut table.rows);
        table.rows = rows
            .into_iter()
            .zip(&seen)
            .filter(|(_, (name, cells))| self.shown.get(name) != Some(cells))
            .map(|(row, _)| row)
            .collect();
        Ok(self.render_table(table))
    }

    /// Each row's object name and what it shows, AGE left out: an age that ticked is
    /// no news, and would reprint every young object on every write.
    fn seen(&self, table: &Table) -> Vec<(String, Vec<String>)> {
        let visible: Vec<bool> = table
            .column_definitions
            .iter()
            .filter(|c| c.priority == 0 || self.opts.wide)
            .map(|c| !c.name.eq_ignore_ascii_case("age"))
            .collect();
        let cells = output::table_cells(table, &TableOptions { no_headers: true, ..self.opts.clone() });
        table
            .row_names()
            .into_iter()
            .zip(cells)
            .map(|(name, cells)| {
                let shown = cells.into_iter().enumerate().filter(|(i, _)| visible.get(*i) != Some(&false));
                (name, shown.map(|(_, c)| c).collect())
            })
            .collect()
    }

    /// A watch's Table, with the column definitions remembered from earlier answers.
    fn table(&mut self, body: Value) -> Table {
        let mut table = Table::from_response(body, crate::host::now());
        if table.column_definitions.is_empty() {
            table.column_definitions = self.columns.clone();
        } else {
            self.columns = table.column_definitions.clone();
        }
        table
    }

    /// Table rows aligned with those printed before (the header once), remembering what
    /// each object's row showed.
    fn render_table(&mut self, table: Table) -> String {
        if table.rows.is_empty() {
            return String::new();
        }
        for (name, cells) in self.seen(&table) {
            self.shown.insert(name, cells);
        }
        self.printed += table.rows.len();
        let opts = TableOptions { no_headers: self.opts.no_headers || self.header_done, ..self.opts.clone() };
        self.header_done = true;
        output::align(&output::table_cells(&table, &opts), &mut self.widths)
    }

    fn render(&mut self, kind: &KindInfo, body: Value, show_managed_fields: bool) -> Result<String> {
        if self.format.is_table() {
            let table = self.table(body);
            return Ok(self.render_table(table));
        }
        let objects: Vec<Value> = match body.get("items") {
            Some(Value::Array(items))
                if body.get("kind").and_then(Value::as_str).is_some_and(|k| k.ends_with("List")) =>
            {
                items.clone()
            }
            _ => vec![body],
        };
        let mut out = String::new();
        for object in objects {
            let object = prepare(kind, object, show_managed_fields);
            let text = match &self.format {
                Format::Yaml if self.printed > 0 => format!("---\n{}", output::yaml(&object)?),
                Format::Yaml => output::yaml(&object)?,
                Format::Json => output::json(&object)?,
                Format::Name => output::names(kind, std::slice::from_ref(&object)),
                Format::JsonPath(template) => template.render(&object),
                Format::CustomColumns(columns) => {
                    let headers = !self.opts.no_headers && !self.header_done;
                    self.header_done = true;
                    output::align(
                        &columns::cells(columns, std::slice::from_ref(&object), headers),
                        &mut self.widths,
                    )
                }
                Format::Table | Format::Wide => unreachable!("tables handled above"),
            };
            self.printed += 1;
            out.push_str(&text);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cli::kind::fixtures;

    fn agent(name: &str) -> Value {
        json!({"metadata": {"name": name, "managedFields": [{"manager": "hive"}]}, "spec": {"wanted": "Up"}})
    }

    #[test]
    fn objects_get_type_meta_first_and_lose_managed_fields() {
        let out = prepare(&fixtures::agent(), agent("a1"), false);
        assert_eq!(
            serde_json::to_string(&out).unwrap(),
            r#"{"apiVersion":"hive.dev/v1","kind":"Agent","metadata":{"name":"a1"},"spec":{"wanted":"Up"}}"#
        );
        let kept = prepare(&fixtures::agent(), agent("a1"), true);
        assert!(kept.pointer("/metadata/managedFields").is_some());
    }

    #[test]
    fn one_named_object_prints_as_itself() {
        let a1 = prepare(&fixtures::agent(), agent("a1"), false);
        let out = render_objects(&Format::Yaml, vec![(fixtures::agent(), a1)], true, true).unwrap();
        insta::assert_snapshot!(out);
    }

    #[test]
    fn lists_print_as_kind_list() {
        let found: Vec<(KindInfo, Value)> = ["a1", "a2"]
            .iter()
            .map(|n| (fixtures::agent(), prepare(&fixtures::agent(), agent(n), false)))
            .collect();
        let out = render_objects(&Format::Json, found.clone(), false, false).unwrap();
        insta::assert_snapshot!(out);
        let names = render_objects(&Format::Name, found.clone(), false, false).unwrap();
        assert_eq!(names, "agent.hive.dev/a1\nagent.hive.dev/a2\n");
        let path = render_objects(
            &Format::parse("jsonpath={.items[*].metadata.name}").unwrap(),
            found,
            false,
            false,
        );
        assert_eq!(path.unwrap(), "a1 a2");
    }

    #[test]
    fn empty_lists_still_print_but_missing_named_objects_do_not() {
        let out = render_objects(&Format::Yaml, vec![], false, false).unwrap();
        assert_eq!(out, "apiVersion: v1\nkind: List\nitems: []\nmetadata:\n  resourceVersion: ''\n");
        assert_eq!(render_objects(&Format::Yaml, vec![], true, true).unwrap(), "");
    }

    #[test]
    fn watch_rows_stay_aligned_and_print_one_header() {
        let mut printer = WatchPrinter {
            format: Format::Table,
            opts: TableOptions::default(),
            widths: Vec::new(),
            header_done: false,
            printed: 0,
            columns: Vec::new(),
            shown: std::collections::HashMap::new(),
        };
        // Column definitions come with the list only; events carry rows alone.
        let table = |name: &str, wanted: &str| json!({"kind": "Table", "rows": [{"cells": [name, wanted, "1s"], "object": {"metadata": {"name": name}}}]});
        let kind = fixtures::agent();
        let empty = json!({"kind": "Table", "columnDefinitions": [
                {"name": "Name", "format": "name", "priority": 0},
                {"name": "Wanted", "priority": 0},
                {"name": "Age", "priority": 0}], "rows": []});
        let mut out = printer.render(&kind, empty, false).unwrap();
        out += &printer.render(&kind, table("a1", "Up"), false).unwrap();
        out += &printer.render(&kind, table("a1", "Offline"), false).unwrap();
        out += &printer.render(&kind, table("a-longer-name", "Up"), false).unwrap();
        assert_eq!(
            out,
            "NAME   WANTED   AGE\na1     Up       1s\na1     Offline   1s\na-longer-name   Up        1s\n"
        );
        // A MODIFIED event that changes nothing but the age prints nothing; one that
        // changes a column prints its row.
        let aged = json!({"kind": "Table", "rows": [{"cells": ["a1", "Offline", "9s"], "object": {"metadata": {"name": "a1"}}}]});
        assert_eq!(printer.render_changed(aged).unwrap(), "");
        assert_eq!(printer.render_changed(table("a1", "Up")).unwrap(), "a1              Up        1s\n");
    }

    #[test]
    fn name_and_field_selectors_combine() {
        let args = Args {
            resources: vec![],
            output: None,
            selector: Some("app=x".into()),
            field_selector: Some("status.phase=Running".into()),
            watch: false,
            show_labels: false,
            no_headers: false,
            ignore_not_found: false,
            show_managed_fields: false,
            chunk_size: 500,
            sort_by: None,
        };
        assert_eq!(
            list_query(&args, Some("a1")).to_string(),
            "?labelSelector=app%3Dx&fieldSelector=status.phase%3DRunning%2Cmetadata.name%3Da1"
        );
    }
}
