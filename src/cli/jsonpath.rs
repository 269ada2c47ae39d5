//! The subset of kubectl's JSONPath that `wait --for=jsonpath=…` and `get -o jsonpath=…`
//! need: fields (`{.a.b}`, `{.a['b.c']}`), indexes (`{.a[0]}`, `{.a[-1]}`), wildcards
//! (`{.items[*].metadata.name}`) and filters
//! (`{.status.conditions[?(@.type=="Ready")].status}`), plus literal text around the
//! expressions. Anything else is rejected with a message that says what is unsupported.

use std::fmt;

use serde_json::Value;

/// A template that failed to parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The template as given.
    pub template: String,
    /// Character offset of the problem.
    pub offset: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid JSONPath {:?}: {} (at offset {})", self.template, self.message, self.offset)
    }
}

impl std::error::Error for ParseError {}

/// One step of a path.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// `.name` or `['name']`.
    Field(String),
    /// `[N]`; negative counts from the end.
    Index(i64),
    /// `[*]` or `.*`: every element or value.
    Wildcard,
    /// `[?(@.path)]` or `[?(@.path == literal)]`.
    Filter { path: Vec<Step>, op: Option<(Op, Value)> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
}

/// A path expression such as `.status.phase`.
#[derive(Debug, Clone, PartialEq)]
pub struct Path(Vec<Step>);

/// One piece of a template.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Path(Path),
    /// `{range PATH}…{end}`: the body once per value the path reaches, with paths in
    /// the body relative to that value.
    Range(Path, Vec<Piece>),
}

/// A parsed template: text with `{…}` expressions.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    source: String,
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses a template; a bare path without braces (`.status.phase`) is accepted too.
    pub fn parse(template: &str) -> Result<Template, ParseError> {
        let source = template.to_string();
        let trimmed = template.trim();
        if !trimmed.contains('{') && (trimmed.starts_with('.') || trimmed.starts_with('$')) {
            let path = Parser::new(template, trimmed, 0).path_to_end()?;
            return Ok(Template { source, pieces: vec![Piece::Path(path)] });
        }
        let mut pieces = Vec::new();
        // The pieces outside each open `{range}`, innermost last, with its path.
        let mut ranges: Vec<(Vec<Piece>, Path)> = Vec::new();
        let mut text = String::new();
        let mut rest = template;
        let mut offset = 0;
        while let Some(open) = rest.find('{') {
            text.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            let close = find_close(after).ok_or_else(|| ParseError {
                template: source.clone(),
                offset: offset + open,
                message: "unclosed '{'".into(),
            })?;
            let inner = after[..close].trim();
            let inner_offset = offset + open + 1;
            if let Some(literal) = string_literal(inner) {
                text.push_str(&literal);
            } else {
                let word = inner.split_whitespace().next().unwrap_or("");
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                let error =
                    |message: String| ParseError { template: source.clone(), offset: inner_offset, message };
                match word {
                    "range" => {
                        let expr = inner["range".len()..].trim_start();
                        let at = inner_offset + (inner.len() - expr.len());
                        let path = Parser::new(template, expr, at).path_to_end()?;
                        ranges.push((std::mem::take(&mut pieces), path));
                    }
                    "end" => {
                        let (outer, path) =
                            ranges.pop().ok_or_else(|| error("{end} without a {range} before it".into()))?;
                        let body = std::mem::replace(&mut pieces, outer);
                        pieces.push(Piece::Range(path, body));
                    }
                    "else" | "if" => {
                        return Err(error(format!(
                            "{{{word}}} is not supported; use a filter such as {{.items[?(@.spec.wanted==\"Up\")].metadata.name}}"
                        )))
                    }
                    _ => pieces.push(Piece::Path(Parser::new(template, inner, inner_offset).path_to_end()?)),
                }
            }
            offset += open + 1 + close + 1;
            rest = &after[close + 1..];
        }
        if rest.contains('}') {
            return Err(ParseError {
                template: source.clone(),
                offset: offset + rest.find('}').unwrap_or(0),
                message: "unmatched '}'".into(),
            });
        }
        text.push_str(rest);
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        if !ranges.is_empty() {
            return Err(ParseError {
                template: source.clone(),
                offset: template.len(),
                message: "{range} without its {end}".into(),
            });
        }
        Ok(Template { source, pieces })
    }

    /// The template as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The path, when the template is exactly one expression and no text.
    pub fn single_path(&self) -> Option<&Path> {
        match self.pieces.as_slice() {
            [Piece::Path(path)] => Some(path),
            _ => None,
        }
    }

    /// The values of the template's expressions, one list per expression.
    pub fn eval<'v>(&self, root: &'v Value) -> Vec<Vec<&'v Value>> {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Path(path) => Some(path.eval(root)),
                Piece::Text(_) | Piece::Range(..) => None,
            })
            .collect()
    }

    /// Renders the template against `root` as kubectl does: strings raw, other values
    /// as compact JSON, several matches joined by a space.
    pub fn render(&self, root: &Value) -> String {
        let mut out = String::new();
        render_pieces(&self.pieces, root, &mut out);
        out
    }
}

fn render_pieces(pieces: &[Piece], root: &Value, out: &mut String) {
    for piece in pieces {
        match piece {
            Piece::Text(text) => out.push_str(text),
            Piece::Path(path) => {
                let values: Vec<String> = path.eval(root).into_iter().map(scalar_text).collect();
                out.push_str(&values.join(" "));
            }
            Piece::Range(path, body) => {
                for value in path.eval(root) {
                    render_pieces(body, value, out);
                }
            }
        }
    }
}

/// A value as JSONPath output shows it: strings without quotes, the rest as JSON.
pub fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Splits `{.a.b}=rest` after the brace closing the leading expression:
/// `({.a.b}, "=rest")`. `None` when the text does not start with a braced expression.
pub fn split_expression(text: &str) -> Option<(&str, &str)> {
    let inner = text.strip_prefix('{')?;
    let close = find_close(inner)?;
    Some((&text[..close + 2], &text[close + 2..]))
}

/// The index of the `}` closing an expression, skipping quoted strings.
fn find_close(s: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                '}' => return Some(i),
                _ => {}
            },
        }
    }
    None
}

/// `{"\n"}` style literal expressions.
fn string_literal(inner: &str) -> Option<String> {
    let quote = inner.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    if inner.len() < 2 || !inner.ends_with(quote) {
        return None;
    }
    let body = &inner[1..inner.len() - 1];
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
}

impl Path {
    /// Every value the path reaches from `root` (missing fields reach nothing).
    pub fn eval<'v>(&self, root: &'v Value) -> Vec<&'v Value> {
        eval_steps(&self.0, vec![root])
    }
}

fn eval_steps<'v>(steps: &[Step], mut current: Vec<&'v Value>) -> Vec<&'v Value> {
    for step in steps {
        let mut next = Vec::new();
        for value in current {
            match step {
                Step::Field(name) => next.extend(value.get(name.as_str())),
                Step::Index(i) => {
                    if let Value::Array(items) = value {
                        let len = items.len() as i64;
                        let idx = if *i < 0 { len + i } else { *i };
                        if (0..len).contains(&idx) {
                            next.push(&items[idx as usize]);
                        }
                    }
                }
                Step::Wildcard => match value {
                    Value::Array(items) => next.extend(items.iter()),
                    Value::Object(map) => next.extend(map.values()),
                    _ => {}
                },
                Step::Filter { path, op } => {
                    if let Value::Array(items) = value {
                        next.extend(items.iter().filter(|item| filter_matches(item, path, op.as_ref())));
                    }
                }
            }
        }
        current = next;
    }
    current
}

fn filter_matches(item: &Value, path: &[Step], op: Option<&(Op, Value)>) -> bool {
    let found = eval_steps(path, vec![item]);
    match op {
        None => found.iter().any(|v| !v.is_null() && **v != Value::Bool(false)),
        Some((op, literal)) => {
            let equal = found.iter().any(|v| values_equal(v, literal));
            match op {
                Op::Eq => equal,
                Op::Ne => !found.is_empty() && !equal,
            }
        }
    }
}

fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// A recursive-descent parser over one expression (the text inside `{…}`).
struct Parser<'a> {
    template: &'a str,
    text: &'a str,
    pos: usize,
    base: usize,
}

impl<'a> Parser<'a> {
    fn new(template: &'a str, text: &'a str, base: usize) -> Parser<'a> {
        Parser { template, text, pos: 0, base }
    }

    fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            template: self.template.to_string(),
            offset: self.base + self.pos,
            message: message.into(),
        }
    }

    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn eat(&mut self, s: &str) -> bool {
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn path_to_end(mut self) -> Result<Path, ParseError> {
        self.skip_spaces();
        self.eat("$");
        let steps = self.steps(&[])?;
        self.skip_spaces();
        if self.pos < self.text.len() {
            return Err(self.error(format!("unexpected {:?}", self.rest())));
        }
        Ok(Path(steps))
    }

    /// Steps until the end of the text or one of `stop` (used inside filters).
    fn steps(&mut self, stop: &[&str]) -> Result<Vec<Step>, ParseError> {
        let mut steps = Vec::new();
        loop {
            let rest = self.rest().trim_start();
            if rest.is_empty() || stop.iter().any(|s| rest.starts_with(s)) {
                return Ok(steps);
            }
            if self.rest().starts_with("..") {
                return Err(self.error("recursive descent (..) is not supported"));
            }
            if self.eat(".") {
                if self.eat("*") {
                    steps.push(Step::Wildcard);
                    continue;
                }
                if self.rest().is_empty() || self.peek() == Some('[') {
                    // `{.}` is the root itself; `.[0]` is `[0]`.
                    continue;
                }
                steps.push(Step::Field(self.identifier()?));
            } else if self.eat("[") {
                steps.push(self.bracket()?);
            } else {
                return Err(self.error(format!("expected '.' or '[' before {:?}", self.rest())));
            }
        }
    }

    fn identifier(&mut self) -> Result<String, ParseError> {
        let mut name = String::new();
        let mut chars = self.rest().char_indices();
        let mut consumed = 0;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((j, escaped)) => {
                        name.push(escaped);
                        consumed = j + escaped.len_utf8();
                    }
                    None => return Err(self.error("dangling '\\'")),
                },
                c if c.is_alphanumeric() || matches!(c, '_' | '-' | '/') => {
                    name.push(c);
                    consumed = i + c.len_utf8();
                }
                _ => break,
            }
        }
        if name.is_empty() {
            return Err(self.error(format!("expected a field name before {:?}", self.rest())));
        }
        self.pos += consumed;
        Ok(name)
    }

    fn bracket(&mut self) -> Result<Step, ParseError> {
        self.skip_spaces();
        let step = if self.eat("*") {
            Step::Wildcard
        } else if self.eat("?(") {
            self.filter()?
        } else if matches!(self.peek(), Some('\'' | '"')) {
            Step::Field(self.quoted()?)
        } else {
            let len =
                self.rest().find(|c: char| !(c.is_ascii_digit() || c == '-')).unwrap_or(self.rest().len());
            let number = &self.rest()[..len];
            let after = self.rest()[len..].trim_start();
            if after.starts_with(':') {
                return Err(self.error("slices ([a:b]) are not supported; use an index or [*]"));
            }
            if after.starts_with(',') {
                return Err(self.error("unions ([a,b]) are not supported"));
            }
            let index: i64 = number.parse().map_err(|_| {
                self.error(format!(
                    "expected an index, '*', a quoted name or ?(…) inside [ ], found {:?}",
                    self.rest()
                ))
            })?;
            self.pos += len;
            Step::Index(index)
        };
        self.skip_spaces();
        if !self.eat("]") {
            return Err(self.error(format!("expected ']' before {:?}", self.rest())));
        }
        Ok(step)
    }

    fn quoted(&mut self) -> Result<String, ParseError> {
        let quote = self.peek().expect("caller checked");
        self.pos += 1;
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((i, c)) = chars.next() {
            if c == '\\' {
                if let Some((_, escaped)) = chars.next() {
                    out.push(escaped);
                }
            } else if c == quote {
                self.pos += i + 1;
                return Ok(out);
            } else {
                out.push(c);
            }
        }
        Err(self.error("unterminated string"))
    }

    fn filter(&mut self) -> Result<Step, ParseError> {
        self.skip_spaces();
        if !self.eat("@") {
            return Err(self.error("a filter must start with '@', e.g. [?(@.type==\"Ready\")]"));
        }
        let path = self.steps(&["==", "!=", "<", ">", "&&", "||", ")"])?;
        self.skip_spaces();
        let op = if self.eat("==") {
            Some(Op::Eq)
        } else if self.eat("!=") {
            Some(Op::Ne)
        } else if self.rest().starts_with(')') {
            None
        } else {
            return Err(self.error(format!(
                "only == and != are supported in filters, found {:?}",
                self.rest().chars().take(2).collect::<String>()
            )));
        };
        let op = match op {
            Some(op) => {
                self.skip_spaces();
                Some((op, self.literal()?))
            }
            None => None,
        };
        self.skip_spaces();
        if !self.eat(")") {
            return Err(self.error(format!("expected ')' to close the filter before {:?}", self.rest())));
        }
        Ok(Step::Filter { path, op })
    }

    fn literal(&mut self) -> Result<Value, ParseError> {
        if matches!(self.peek(), Some('\'' | '"')) {
            return Ok(Value::String(self.quoted()?));
        }
        let len = self.rest().find(|c: char| c == ')' || c.is_whitespace()).unwrap_or(self.rest().len());
        let word = &self.rest()[..len];
        let value = match word {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "null" => Value::Null,
            _ => match serde_json::from_str::<serde_json::Number>(word) {
                Ok(n) => Value::Number(n),
                Err(_) => {
                    return Err(self.error(format!(
                        "expected a quoted string, number, true, false or null, found {word:?}"
                    )))
                }
            },
        };
        self.pos += len;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object() -> Value {
        json!({
            "metadata": {"name": "a1", "labels": {"app.kubernetes.io/name": "x", "tier": "gold"}},
            "spec": {"wanted": "Up", "ports": [80, 443], "replicas": 3},
            "status": {
                "phase": "Running",
                "ready": true,
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "Crashed", "status": "False", "count": 2}
                ]
            },
            "items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]
        })
    }

    fn render(template: &str) -> String {
        Template::parse(template).unwrap().render(&object())
    }

    #[test]
    fn evaluates_the_supported_subset() {
        let cases = [
            ("{.status.phase}", "Running"),
            ("{.spec.ports[0]}", "80"),
            ("{.spec.ports[-1]}", "443"),
            ("{.spec.ports[*]}", "80 443"),
            ("{.status.conditions[?(@.type==\"Ready\")].status}", "True"),
            ("{.status.conditions[?(@.type == 'Crashed')].status}", "False"),
            ("{.status.conditions[?(@.count==2)].type}", "Crashed"),
            ("{.status.conditions[?(@.type!=\"Ready\")].type}", "Crashed"),
            ("{.status.conditions[?(@.count)].type}", "Crashed"),
            ("{.items[*].metadata.name}", "a b"),
            ("{.metadata.labels['app.kubernetes.io/name']}", "x"),
            ("{.metadata.labels.app\\.kubernetes\\.io/name}", "x"),
            ("{.status.ready}", "true"),
            ("{.spec.missing}", ""),
            ("{$.metadata.name}", "a1"),
            (".metadata.name", "a1"),
            ("name={.metadata.name}{\"\\n\"}", "name=a1\n"),
            ("{.status.conditions[0]}", "{\"type\":\"Ready\",\"status\":\"True\"}"),
            ("{.metadata.labels.*}", "x gold"),
            ("{range .items[*]}{.metadata.name}{\"\\n\"}{end}", "a\nb\n"),
            ("{range .items[*]}[{.metadata.name}]{end} done", "[a][b] done"),
            ("{range .spec.ports[*]}{range .missing[*]}x{end}{end}", ""),
        ];
        for (template, expected) in cases {
            assert_eq!(render(template), expected, "{template}");
        }
    }

    #[test]
    fn unsupported_syntax_says_what() {
        let cases = [
            ("{..name}", "recursive descent (..) is not supported"),
            ("{.spec.ports[0:1]}", "slices ([a:b]) are not supported; use an index or [*]"),
            ("{.spec.ports[0,1]}", "unions ([a,b]) are not supported"),
            ("{range .items[*]}{.metadata.name}", "{range} without its {end}"),
            ("{.metadata.name}{end}", "{end} without a {range} before it"),
            ("{if .x}", "{if} is not supported"),
            ("{.status.conditions[?(@.count>1)]}", "only == and != are supported in filters"),
            ("{.status.phase", "unclosed '{'"),
            ("{.a[x]}", "expected an index, '*', a quoted name or ?(…) inside [ ]"),
            ("{.status.conditions[?(.type==\"x\")]}", "a filter must start with '@'"),
            ("{status}", "expected '.' or '[' before \"status\""),
        ];
        for (template, expected) in cases {
            let err = Template::parse(template).unwrap_err();
            assert!(err.message.contains(expected), "{template}: {err}");
        }
        assert_eq!(
            Template::parse("{..name}").unwrap_err().to_string(),
            "invalid JSONPath \"{..name}\": recursive descent (..) is not supported (at offset 1)"
        );
    }

    #[test]
    fn splits_a_leading_expression() {
        assert_eq!(split_expression("{.status.phase}=Running"), Some(("{.status.phase}", "=Running")));
        assert_eq!(split_expression("{.c[?(@.type==\"}\")].s}=x"), Some(("{.c[?(@.type==\"}\")].s}", "=x")));
        assert_eq!(split_expression(".status.phase=Running"), None);
        assert_eq!(split_expression("{.open"), None);
    }

    #[test]
    fn eval_reports_matches_per_expression() {
        let t = Template::parse("{.status.conditions[?(@.type==\"Ready\")].status}").unwrap();
        let obj = object();
        let found = t.eval(&obj);
        assert_eq!(found, vec![vec![&json!("True")]]);
    }
}
