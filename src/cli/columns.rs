//! kubectl's `-o custom-columns=HEADER:PATH,…` and `--sort-by=PATH` for `hive get`: a
//! column is a header and a JSONPath evaluated against each object (several matches
//! joined by `,`, none shown as `<none>`); sorting orders objects by one JSONPath's value
//! (numbers as numbers, everything else as text; objects without it first).

use std::cmp::Ordering;

use serde_json::Value;

use super::jsonpath::{self, Path, Template};

/// One custom column.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// The header, as given.
    pub header: String,
    /// What it shows.
    pub path: Path,
}

/// Parses `NAME:.metadata.name,WANTED:{.spec.wanted}`.
pub fn parse(spec: &str) -> Result<Vec<Column>, String> {
    if spec.trim().is_empty() {
        return Err("custom-columns format specified but no custom columns given".into());
    }
    spec.split(',')
        .map(|part| {
            let Some((header, path)) = part.split_once(':') else {
                return Err(format!(
                    "unexpected custom-columns spec: {part:?}, expected <header>:<json-path-expr>"
                ));
            };
            if header.is_empty() {
                return Err(format!("custom column {part:?} has no header"));
            }
            Ok(Column { header: header.to_string(), path: single_path(path)? })
        })
        .collect()
}

/// A path given as `.a.b` or `{.a.b}`, exactly one expression.
pub fn single_path(text: &str) -> Result<Path, String> {
    let template = Template::parse(text.trim()).map_err(|e| e.to_string())?;
    template
        .single_path()
        .cloned()
        .ok_or_else(|| format!("{text:?}: expected one JSONPath expression such as .metadata.name"))
}

/// The header line and one line of cells per object, for [`super::output::align`].
pub fn cells(columns: &[Column], objects: &[Value], headers: bool) -> Vec<Vec<String>> {
    let mut lines = Vec::new();
    if headers {
        lines.push(columns.iter().map(|c| c.header.clone()).collect());
    }
    for object in objects {
        lines.push(
            columns
                .iter()
                .map(|c| {
                    let values = c.path.eval(object);
                    if values.is_empty() || values.iter().all(|v| v.is_null()) {
                        "<none>".to_string()
                    } else {
                        values.into_iter().map(jsonpath::scalar_text).collect::<Vec<_>>().join(",")
                    }
                })
                .collect(),
        );
    }
    lines
}

/// Orders `items` by the value `path` yields for each (`key` reads the object out of an
/// item): numbers numerically, the rest by their text, items without a value first.
/// Stable, so equal keys keep the server's order (by name).
pub fn sort_by<T: Clone>(items: &mut [T], path: &Path, key: impl Fn(&T) -> Option<&Value>) {
    let sort_key =
        |item: &T| -> Option<Value> { key(item).and_then(|o| path.eval(o).first().map(|v| (*v).clone())) };
    let mut keyed: Vec<(Option<Value>, usize)> = items.iter().map(sort_key).zip(0..).collect();
    keyed.sort_by(|(a, ai), (b, bi)| compare(a.as_ref(), b.as_ref()).then(ai.cmp(bi)));
    let sorted: Vec<T> = keyed.into_iter().map(|(_, i)| items[i].clone()).collect();
    items.clone_from_slice(&sorted);
}

fn compare(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(Value::Number(x)), Some(Value::Number(y))) => {
            x.as_f64().unwrap_or(0.0).partial_cmp(&y.as_f64().unwrap_or(0.0)).unwrap_or(Ordering::Equal)
        }
        (Some(x), Some(y)) => jsonpath::scalar_text(x).cmp(&jsonpath::scalar_text(y)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cli::output::align;

    #[test]
    fn columns_parse_and_render() {
        let columns = parse("NAME:.metadata.name,WANTED:{.spec.wanted},TAGS:.spec.tags[*]").unwrap();
        let objects = vec![
            json!({"metadata": {"name": "a1"}, "spec": {"wanted": "Up", "tags": ["x", "y"]}}),
            json!({"metadata": {"name": "a-long-name"}, "spec": {}}),
        ];
        assert_eq!(
            align(&cells(&columns, &objects, true), &mut Vec::new()),
            "NAME          WANTED   TAGS\na1            Up       x,y\na-long-name   <none>   <none>\n"
        );
        assert!(parse("NAME").unwrap_err().contains("<header>:<json-path-expr>"));
        assert!(parse("").is_err());
        assert!(parse("X:{.a}{.b}").is_err());
    }

    #[test]
    fn sorting_by_numbers_text_and_missing() {
        let mut items =
            vec![json!({"n": 10, "t": "b"}), json!({"n": 9, "t": "c"}), json!({}), json!({"n": 9, "t": "a"})];
        sort_by(&mut items, &single_path(".n").unwrap(), |v| Some(v));
        assert_eq!(
            items,
            vec![json!({}), json!({"n": 9, "t": "c"}), json!({"n": 9, "t": "a"}), json!({"n": 10, "t": "b"})]
        );
        sort_by(&mut items, &single_path("{.t}").unwrap(), |v| Some(v));
        assert_eq!(items[0], json!({}));
        assert_eq!(items[1]["t"], "a");
        assert_eq!(items[3]["t"], "c");
    }
}
