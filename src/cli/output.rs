//! Printing: the `-o` formats, server-side `Table`s aligned as kubectl aligns them
//! (upper-case headers, 3-space gaps), YAML/JSON/name output, kubectl's ages, and a
//! tab-stop aligner for `describe`. Everything here is JSON in, `String` out.

use std::io::Write as _;

use chrono::{DateTime, Utc};
use hive_api::{KindInfo, ListMeta};
use serde::Deserialize;
use serde_json::{json, Value};

use super::jsonpath::Template;
use super::kind;

/// An `-o` value.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// The server's table (the default).
    Table,
    /// The table with its priority-1 columns.
    Wide,
    /// YAML.
    Yaml,
    /// JSON.
    Json,
    /// `agent.hive.dev/a1` per object.
    Name,
    /// `jsonpath=TEMPLATE`.
    JsonPath(Template),
    /// `custom-columns=HEADER:PATH,…`.
    CustomColumns(Vec<super::columns::Column>),
}

impl Format {
    /// Parses `-o`; a clap `value_parser`.
    pub fn parse(text: &str) -> Result<Format, String> {
        if let Some(template) = text.strip_prefix("jsonpath=") {
            return Template::parse(template).map(Format::JsonPath).map_err(|e| e.to_string());
        }
        if let Some(spec) = text.strip_prefix("custom-columns=") {
            return super::columns::parse(spec).map(Format::CustomColumns);
        }
        match text {
            "table" | "" => Ok(Format::Table),
            "wide" => Ok(Format::Wide),
            "yaml" => Ok(Format::Yaml),
            "json" => Ok(Format::Json),
            "name" => Ok(Format::Name),
            other => Err(format!(
                "unable to match a printer suitable for the output format {other:?}, allowed formats are: \
                 table, wide, yaml, json, name, jsonpath=TEMPLATE, custom-columns=HEADER:PATH,..."
            )),
        }
    }

    /// True for the human-readable table formats.
    pub fn is_table(&self) -> bool {
        matches!(self, Format::Table | Format::Wide)
    }
}

/// Writes to stdout and flushes (watch output must appear at once). A closed pipe comes
/// back as an `io::Error` that `main` treats as a quiet exit.
///
/// Every human-readable line the CLI prints passes here or through [`eprint_line`], and
/// both escape control characters ([`super::terminal::escape_controls`]): what a
/// server's object holds must not drive the operator's terminal. `-o json` and `-o yaml`
/// pass unchanged, since their encoders already escape every control character inside a
/// string; `hive logs` writes an agent's bytes raw, as `kubectl logs` does, and does not
/// come here.
pub fn print(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(super::terminal::escape_controls(text).as_bytes())?;
    out.flush()
}

/// Writes a [`super::progress::Screen`] update as it is: its cursor moves are the one
/// place the CLI drives the terminal, and it escaped the lines between them itself.
pub fn print_screen(update: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(update.as_bytes())?;
    out.flush()
}

pub use super::terminal::eprint_line;

pub use hive_api::age::{age, human_duration};

/// A `meta.k8s.io/v1` `Table`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Table {
    /// The columns, in order.
    #[serde(default)]
    pub column_definitions: Vec<ColumnDefinition>,
    /// The rows.
    #[serde(default)]
    pub rows: Vec<TableRow>,
    /// `resourceVersion` (where a watch resumes) and `continue`.
    #[serde(default)]
    pub metadata: ListMeta,
}

/// One column of a `Table`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ColumnDefinition {
    /// Header text.
    pub name: String,
    /// OpenAPI type of the cells.
    #[serde(default, rename = "type")]
    pub type_: String,
    /// `name` marks the column holding the object name.
    #[serde(default)]
    pub format: String,
    /// What the column shows.
    #[serde(default)]
    pub description: String,
    /// 0 = always shown, higher = only with `-o wide`.
    #[serde(default)]
    pub priority: i32,
}

/// One row of a `Table`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TableRow {
    /// One cell per column.
    #[serde(default)]
    pub cells: Vec<Value>,
    /// The row's object (at least its metadata), for labels.
    #[serde(default)]
    pub object: Option<Value>,
}

impl Table {
    /// Reads a server answer as a table: a `Table` as is; a plain list or object (from
    /// a server that did not negotiate tables) as kubectl's `NAME AGE` fallback.
    pub fn from_response(body: Value, now: DateTime<Utc>) -> Table {
        match body.get("kind").and_then(Value::as_str) {
            Some("Table") => serde_json::from_value(body).unwrap_or_default(),
            Some(k) if k.ends_with("List") && body.get("items").is_some_and(Value::is_array) => {
                let metadata =
                    body.get("metadata").and_then(|m| ListMeta::deserialize(m).ok()).unwrap_or_default();
                let items = body.get("items").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
                Table { metadata, ..Table::from_objects(items, now) }
            }
            _ => Table::from_objects(std::slice::from_ref(&body), now),
        }
    }

    /// The `NAME AGE` table of plain objects.
    pub fn from_objects(items: &[Value], now: DateTime<Utc>) -> Table {
        let column = |name: &str, format: &str| ColumnDefinition {
            name: name.into(),
            type_: "string".into(),
            format: format.into(),
            description: String::new(),
            priority: 0,
        };
        Table {
            column_definitions: vec![column("Name", "name"), column("Age", "")],
            rows: items
                .iter()
                .map(|item| TableRow {
                    cells: vec![
                        item.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
                        Value::String(age(
                            item.pointer("/metadata/creationTimestamp").and_then(Value::as_str),
                            now,
                        )),
                    ],
                    object: Some(item.clone()),
                })
                .collect(),
            metadata: ListMeta::default(),
        }
    }

    /// The object name of each row (from the row's object, else the name column).
    pub fn row_names(&self) -> Vec<String> {
        let name_col = self.name_column();
        self.rows
            .iter()
            .map(|row| {
                row.object
                    .as_ref()
                    .and_then(|o| o.pointer("/metadata/name"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| row.cells.get(name_col).map(cell_text).unwrap_or_default())
            })
            .collect()
    }

    fn name_column(&self) -> usize {
        self.column_definitions
            .iter()
            .position(|c| c.format == "name")
            .or_else(|| self.column_definitions.iter().position(|c| c.name.eq_ignore_ascii_case("name")))
            .unwrap_or(0)
    }
}

/// How to print a table.
#[derive(Debug, Clone, Default)]
pub struct TableOptions {
    /// Include priority > 0 columns (`-o wide`).
    pub wide: bool,
    /// Append a `LABELS` column.
    pub show_labels: bool,
    /// Omit the header line.
    pub no_headers: bool,
    /// Prefix names with `agent.hive.dev/` (when several kinds are printed).
    pub kind_prefix: Option<KindInfo>,
}

/// Table lines as cells: the header (unless suppressed), then one line per row.
pub fn table_cells(table: &Table, opts: &TableOptions) -> Vec<Vec<String>> {
    let columns: Vec<usize> = table
        .column_definitions
        .iter()
        .enumerate()
        .filter(|(_, c)| c.priority == 0 || opts.wide)
        .map(|(i, _)| i)
        .collect();
    let name_col = table.name_column();
    let mut lines = Vec::new();
    if !opts.no_headers {
        let mut header: Vec<String> =
            columns.iter().map(|&i| table.column_definitions[i].name.to_uppercase()).collect();
        if opts.show_labels {
            header.push("LABELS".into());
        }
        lines.push(header);
    }
    for row in &table.rows {
        let mut line: Vec<String> = columns
            .iter()
            .map(|&i| {
                let text = row.cells.get(i).map(cell_text).unwrap_or_default();
                match &opts.kind_prefix {
                    Some(kind) if i == name_col => kind::object_ref(kind, &text),
                    _ => text,
                }
            })
            .collect();
        if opts.show_labels {
            line.push(labels_text(row.object.as_ref().and_then(|o| o.pointer("/metadata/labels"))));
        }
        lines.push(line);
    }
    lines
}

/// Renders a table (kubectl `get` output).
pub fn render_table(table: &Table, opts: &TableOptions) -> String {
    align(&table_cells(table, opts), &mut Vec::new())
}

/// A cell as kubectl prints it: `<none>` for null, strings raw, the rest as JSON; tabs
/// and newlines flattened so they cannot break the alignment, and every other control
/// character escaped here, before the widths are measured, so a row stays aligned.
pub fn cell_text(value: &Value) -> String {
    let text = match value {
        Value::Null => "<none>".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    super::terminal::escape_controls(&text.replace(['\t', '\n', '\r'], " ")).into_owned()
}

/// `app=x,tier=gold` (sorted), or `<none>`.
pub fn labels_text(labels: Option<&Value>) -> String {
    let Some(Value::Object(map)) = labels else { return "<none>".into() };
    if map.is_empty() {
        return "<none>".into();
    }
    let mut pairs: Vec<String> =
        map.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect();
    pairs.sort();
    pairs.join(",")
}

/// The minimum width of a column, gap included (kubectl's tabwriter `minwidth`).
const MIN_WIDTH: usize = 6;
/// The gap between columns.
const PADDING: usize = 3;

/// Aligns lines of cells into columns as kubectl's printer does: every column but the
/// last is padded to its widest cell plus 3 spaces (at least 6). `widths` carries the
/// column widths across calls, so rows printed later by `get -w` stay aligned with the
/// rows above them (kubectl's `RememberWidths`).
pub fn align(lines: &[Vec<String>], widths: &mut Vec<usize>) -> String {
    for line in lines {
        for (c, cell) in line.iter().enumerate().take(line.len().saturating_sub(1)) {
            if widths.len() <= c {
                widths.push(MIN_WIDTH);
            }
            widths[c] = widths[c].max(width_of(cell) + PADDING);
        }
    }
    let mut out = String::new();
    for line in lines {
        for (c, cell) in line.iter().enumerate() {
            out.push_str(cell);
            if c + 1 < line.len() {
                out.push_str(&" ".repeat(widths[c] - width_of(cell)));
            }
        }
        out.push('\n');
    }
    out
}

/// Cuts the last cell of each line (with `…`) so that, aligned by [`align`] with
/// `widths`, no line is wider than `max`. `widths` grows as `align` would grow it, so
/// the rows a watch prints later are cut against the columns already on screen. The
/// last cell keeps at least 10 characters: a narrow terminal wraps rather than losing
/// the whole message.
pub fn fit_last_column(lines: &mut [Vec<String>], widths: &mut Vec<usize>, max: usize) {
    for line in lines.iter() {
        for (c, cell) in line.iter().enumerate().take(line.len().saturating_sub(1)) {
            if widths.len() <= c {
                widths.push(MIN_WIDTH);
            }
            widths[c] = widths[c].max(width_of(cell) + PADDING);
        }
    }
    for line in lines.iter_mut() {
        let used: usize = widths.iter().take(line.len().saturating_sub(1)).sum();
        if let Some(last) = line.last_mut() {
            *last = super::terminal::ellipsize(last, max.saturating_sub(used).max(10));
        }
    }
}

fn width_of(text: &str) -> usize {
    text.chars().count()
}

/// Go's `text/tabwriter` (as kubectl `describe` uses it): `\t` ends a cell, and each
/// column of a run of consecutive lines that have a cell there is padded to the widest
/// such cell plus `padding` (at least `minwidth`). The text after a line's last tab is
/// not aligned.
pub fn tabwrite(text: &str, minwidth: usize, padding: usize) -> String {
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    let mut widths: Vec<Vec<usize>> = lines.iter().map(|l| vec![0; l.len() - 1]).collect();
    tab_block(&lines, &mut widths, 0, 0, lines.len(), minwidth, padding);
    let mut out = String::new();
    for (line, line_widths) in lines.iter().zip(&widths) {
        for (c, cell) in line.iter().enumerate() {
            out.push_str(cell);
            if let Some(w) = line_widths.get(c) {
                out.push_str(&" ".repeat(w.saturating_sub(width_of(cell))));
            }
        }
        out.push('\n');
    }
    out
}

fn tab_block(
    lines: &[Vec<&str>],
    widths: &mut [Vec<usize>],
    column: usize,
    start: usize,
    end: usize,
    minwidth: usize,
    padding: usize,
) {
    let has_cell = |line: &Vec<&str>| column + 1 < line.len();
    let mut this = start;
    while this < end {
        if !has_cell(&lines[this]) {
            this += 1;
            continue;
        }
        let block_start = this;
        let mut width = minwidth;
        while this < end && has_cell(&lines[this]) {
            width = width.max(width_of(lines[this][column]) + padding);
            this += 1;
        }
        for line_widths in &mut widths[block_start..this] {
            line_widths[column] = width;
        }
        tab_block(lines, widths, column + 1, block_start, this, minwidth, padding);
    }
}

/// The `kind: List` kubectl wraps several objects in for `-o yaml|json`.
pub fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}})
}

/// Drops `metadata.managedFields`, as kubectl does unless `--show-managed-fields`.
pub fn hide_managed_fields(object: &mut Value) {
    if let Some(Value::Object(meta)) = object.get_mut("metadata") {
        meta.remove("managedFields");
    }
}

/// YAML text of a value.
pub fn yaml(value: &Value) -> anyhow::Result<String> {
    Ok(serde_yaml_ng::to_string(value)?)
}

/// Pretty JSON text of a value, newline-terminated. serde_json escapes the C0 controls
/// in strings but writes DEL and the C1 controls (U+009B is a one-character CSI) as
/// they are; they can only stand inside strings, so each becomes its `\u00XX` escape:
/// the same JSON value, and nothing for [`print`] to change.
pub fn json(value: &Value) -> anyhow::Result<String> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    if !text.chars().any(left_raw_by_json) {
        return Ok(text);
    }
    Ok(text.chars().fold(String::with_capacity(text.len() + 16), |mut out, c| {
        if left_raw_by_json(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
        out
    }))
}

/// DEL and the C1 controls: what serde_json leaves raw in a string.
fn left_raw_by_json(c: char) -> bool {
    c.is_control() && u32::from(c) >= 0x7f
}

/// `agent.hive.dev/a1` lines.
pub fn names(kind: &KindInfo, objects: &[Value]) -> String {
    objects
        .iter()
        .filter_map(|o| o.pointer("/metadata/name").and_then(Value::as_str))
        .map(|name| kind::object_ref(kind, name) + "\n")
        .collect()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::cli::kind::fixtures;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 15, 0, 0).unwrap()
    }

    fn agent_table() -> Table {
        serde_json::from_value(json!({
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "101"},
            "columnDefinitions": [
                {"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0},
                {"name": "Wanted", "type": "string", "format": "", "description": "spec.wanted", "priority": 0},
                {"name": "Ready", "type": "string", "format": "", "description": "Ready", "priority": 0},
                {"name": "Age", "type": "string", "format": "", "description": "age", "priority": 0},
                {"name": "Active Job", "type": "string", "format": "", "description": "status.activeJob", "priority": 1}
            ],
            "rows": [
                {"cells": ["a1", "Up", "True", "5m", "rebuild-a1-7"],
                 "object": {"kind": "PartialObjectMetadata", "metadata": {"name": "a1", "labels": {"tier": "gold", "app": "x"}}}},
                {"cells": ["a-much-longer-name", "Offline", "", "3d4h", null],
                 "object": {"kind": "PartialObjectMetadata", "metadata": {"name": "a-much-longer-name"}}}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn table_default() {
        insta::assert_snapshot!(render_table(&agent_table(), &TableOptions::default()));
    }

    #[test]
    fn table_wide_with_labels() {
        let opts = TableOptions { wide: true, show_labels: true, ..Default::default() };
        insta::assert_snapshot!(render_table(&agent_table(), &opts));
    }

    #[test]
    fn table_with_kind_prefix_and_no_headers() {
        let opts =
            TableOptions { no_headers: true, kind_prefix: Some(fixtures::agent()), ..Default::default() };
        assert_eq!(
            render_table(&agent_table(), &opts),
            "agent.hive.dev/a1                   Up        True   5m\n\
             agent.hive.dev/a-much-longer-name   Offline          3d4h\n"
        );
    }

    #[test]
    fn alignment_pads_to_widest_cell_plus_three_and_at_least_six() {
        let lines = vec![
            vec!["NAME".to_string(), "X".to_string(), "AGE".to_string()],
            vec!["a1".to_string(), "1".to_string(), "5m".to_string()],
        ];
        assert_eq!(align(&lines, &mut Vec::new()), "NAME   X     AGE\na1     1     5m\n");
    }

    #[test]
    fn remembered_widths_only_grow() {
        let mut widths = Vec::new();
        let first = align(&[vec!["NAME".into(), "AGE".into()], vec!["a1".into(), "1s".into()]], &mut widths);
        let later = align(&[vec!["b".into(), "2s".into()]], &mut widths);
        let longer = align(&[vec!["a-longer-one".into(), "3s".into()]], &mut widths);
        assert_eq!(first, "NAME   AGE\na1     1s\n");
        assert_eq!(later, "b      2s\n");
        assert_eq!(longer, "a-longer-one   3s\n");
    }

    #[test]
    fn plain_lists_fall_back_to_name_and_age() {
        let list = json!({"kind": "AgentList", "metadata": {"resourceVersion": "7"}, "items": [
            {"metadata": {"name": "a1", "creationTimestamp": "2026-11-29T14:55:00Z"}},
            {"metadata": {"name": "a2", "creationTimestamp": "2026-11-20T15:00:00Z", "labels": {"app": "y"}}}
        ]});
        let table = Table::from_response(list, now());
        assert_eq!(table.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(table.row_names(), ["a1", "a2"]);
        let opts = TableOptions { show_labels: true, ..Default::default() };
        assert_eq!(
            render_table(&table, &opts),
            "NAME   AGE   LABELS\na1     5m    <none>\na2     9d    app=y\n"
        );
    }

    #[test]
    fn formats_parse() {
        assert_eq!(Format::parse("yaml").unwrap(), Format::Yaml);
        assert!(matches!(Format::parse("jsonpath={.a}").unwrap(), Format::JsonPath(_)));
        let err = Format::parse("xml").unwrap_err();
        assert!(err.starts_with("unable to match a printer suitable for the output format \"xml\""), "{err}");
        assert!(Format::parse("jsonpath={..a}").is_err());
    }

    #[test]
    fn name_output() {
        let objects = vec![json!({"metadata": {"name": "a1"}}), json!({"metadata": {"name": "a2"}})];
        assert_eq!(names(&fixtures::agent(), &objects), "agent.hive.dev/a1\nagent.hive.dev/a2\n");
    }

    #[test]
    fn list_yaml_is_kubectl_shaped() {
        let mut item = json!({"apiVersion": "hive.dev/v1", "kind": "Agent",
            "metadata": {"name": "a1", "managedFields": [{"manager": "hive"}]}, "spec": {"wanted": "Up"}});
        hide_managed_fields(&mut item);
        insta::assert_snapshot!(yaml(&list(vec![item])).unwrap());
    }

    #[test]
    fn tabwriter_aligns_runs_of_lines() {
        let text = "Name:\ta1\nLabels:\tapp=x\nSpec:\n  Wanted:\tUp\n  Config Revision:\tmain\nEnd:\tx\n";
        assert_eq!(
            tabwrite(text, 0, 2),
            "Name:    a1\nLabels:  app=x\nSpec:\n  Wanted:           Up\n  Config Revision:  main\nEnd:                x\n"
        );
    }
}
