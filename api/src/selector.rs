//! Label and field selectors: the `labelSelector` and `fieldSelector` query parameters of
//! list and watch requests (`kubectl get -l tier=gold`, `kubectl wait agent/a1`), parsed
//! into requirements that are matched against one object at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

/// Why a selector could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The `labelSelector` text is malformed; `reason` names the offending term and its
    /// position (characters from the start, counting from 0).
    #[error("invalid label selector {selector:?}: {reason}")]
    Label {
        /// The selector text as sent.
        selector: String,
        /// What is wrong and where.
        reason: String,
    },
    /// The `fieldSelector` text is malformed.
    #[error("invalid field selector {selector:?}: {reason}")]
    Field {
        /// The selector text as sent.
        selector: String,
        /// What is wrong and where.
        reason: String,
    },
    /// The field selector names a field that cannot be selected on; the wording is the
    /// apiserver's, so clients that recognise it keep working.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

// ---------------------------------------------------------------------------------------
// Label selectors
// ---------------------------------------------------------------------------------------

/// What a [`Requirement`] demands of the value of its label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operator {
    /// `key=value` or `key==value`: the label is present with exactly this value.
    Equals(String),
    /// `key!=value`: the label is absent or has another value.
    NotEquals(String),
    /// `key in (a,b)`: the label is present with one of these values (never empty).
    In(BTreeSet<String>),
    /// `key notin (a,b)`: the label is absent or has none of these values (never empty).
    NotIn(BTreeSet<String>),
    /// `key`: the label is present, with any value.
    Exists,
    /// `!key`: the label is absent.
    DoesNotExist,
}

/// An object's labels as a selector reads them: a value found by its key. A map is
/// one; so is any form that finds a key without building a map (the store keeps each
/// object's labels packed beside its JSON).
pub trait Labels {
    /// The value of the label `key`, or `None` when the object has no such label.
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// One comma-separated term of a label selector: a label key and what its value must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    op: Operator,
}

impl Requirement {
    /// Builds a requirement, checking that `key` is a qualified label key (an optional
    /// DNS subdomain prefix and `/`, then a name of at most 63 characters), that every
    /// value is a valid label value, and that `in`/`notin` have at least one value.
    pub fn new(key: impl Into<String>, op: Operator) -> Result<Requirement, SelectorError> {
        let key = key.into();
        let req = Requirement { key, op };
        req.check().map_err(|reason| SelectorError::Label { selector: req.to_string(), reason })?;
        Ok(req)
    }

    /// The label key, e.g. `hive.dev/tier`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// What the label's value must be.
    pub fn operator(&self) -> &Operator {
        &self.op
    }

    /// Whether the labels satisfy this requirement.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        let value = labels.label(&self.key);
        match &self.op {
            Operator::Equals(v) => value == Some(v.as_str()),
            Operator::NotEquals(v) => value != Some(v.as_str()),
            Operator::In(vs) => value.is_some_and(|v| vs.contains(v)),
            Operator::NotIn(vs) => value.is_none_or(|v| !vs.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }

    fn check(&self) -> Result<(), String> {
        check_key(&self.key)?;
        match &self.op {
            Operator::Equals(v) | Operator::NotEquals(v) => check_value(&self.key, v),
            Operator::In(vs) | Operator::NotIn(vs) => {
                if vs.is_empty() {
                    return Err(format!("the values of {:?} must not be empty", self.key));
                }
                vs.iter().try_for_each(|v| {
                    if v.is_empty() {
                        Err(format!("empty value in the values of {:?}", self.key))
                    } else {
                        check_value(&self.key, v)
                    }
                })
            }
            Operator::Exists | Operator::DoesNotExist => Ok(()),
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |f: &mut fmt::Formatter<'_>, word: &str, vs: &BTreeSet<String>| {
            let joined: Vec<&str> = vs.iter().map(String::as_str).collect();
            write!(f, "{} {word} ({})", self.key, joined.join(","))
        };
        match &self.op {
            Operator::Equals(v) => write!(f, "{}={v}", self.key),
            Operator::NotEquals(v) => write!(f, "{}!={v}", self.key),
            Operator::In(vs) => set(f, "in", vs),
            Operator::NotIn(vs) => set(f, "notin", vs),
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
        }
    }
}

/// A parsed `labelSelector`: every requirement must hold (they are ANDed). The empty
/// selector matches every object.
///
/// Requirements are kept sorted by key (stably, as the apiserver does), so `Display`
/// prints one canonical text: `==` becomes `=`, set values are sorted and deduplicated,
/// and whitespace is normalised (`env in (dev,prod),!legacy,tier=gold`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// A selector made of these requirements.
    pub fn new(mut requirements: Vec<Requirement>) -> LabelSelector {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector { requirements }
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// True for the empty selector, which matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object with these labels is selected.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<LabelSelector, SelectorError> {
        let fail = |reason: String| SelectorError::Label { selector: text.to_string(), reason };
        let tokens = lex(text);
        let requirements =
            Parser { tokens: &tokens, next: 0, end: text.chars().count() }.parse().map_err(fail)?;
        Ok(LabelSelector::new(requirements))
    }
}

/// A lexical token of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    /// A key or a value: a run of characters that are neither whitespace nor one of
    /// `!=,()<>`. `in` and `notin` are idents too; the parser tells them apart by place.
    Ident(String),
    Not,
    Equals,
    DoubleEquals,
    NotEquals,
    Open,
    Close,
    Comma,
    /// `<` or `>`: numeric comparisons, which hive does not support.
    Compare(char),
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "{s:?}"),
            Tok::Not => f.write_str("'!'"),
            Tok::Equals => f.write_str("'='"),
            Tok::DoubleEquals => f.write_str("'=='"),
            Tok::NotEquals => f.write_str("'!='"),
            Tok::Open => f.write_str("'('"),
            Tok::Close => f.write_str("')'"),
            Tok::Comma => f.write_str("','"),
            Tok::Compare(c) => write!(f, "'{c}'"),
        }
    }
}

/// Splits the selector into tokens, each with its position in characters.
fn lex(text: &str) -> Vec<(Tok, usize)> {
    const SPECIAL: &[char] = &['!', '=', ',', '(', ')', '<', '>'];
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let (tok, len) = match c {
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '!' if next == Some('=') => (Tok::NotEquals, 2),
            '!' => (Tok::Not, 1),
            '=' if next == Some('=') => (Tok::DoubleEquals, 2),
            '=' => (Tok::Equals, 1),
            ',' => (Tok::Comma, 1),
            '(' => (Tok::Open, 1),
            ')' => (Tok::Close, 1),
            '<' | '>' => (Tok::Compare(c), 1),
            _ => {
                let len =
                    chars[i..].iter().take_while(|c| !c.is_whitespace() && !SPECIAL.contains(c)).count();
                (Tok::Ident(chars[i..i + len].iter().collect()), len)
            }
        };
        tokens.push((tok, i));
        i += len;
    }
    tokens
}

struct Parser<'a> {
    tokens: &'a [(Tok, usize)],
    next: usize,
    /// Position of the end of the text, for errors at the end.
    end: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.next).map(|(t, _)| t)
    }

    fn pos(&self) -> usize {
        self.tokens.get(self.next).map_or(self.end, |(_, p)| *p)
    }

    fn bump(&mut self) -> Option<Tok> {
        let tok = self.tokens.get(self.next).map(|(t, _)| t.clone());
        self.next += 1;
        tok
    }

    fn unexpected(&self, expected: &str) -> String {
        match self.peek() {
            Some(Tok::Compare(c)) => {
                format!(
                    "operator '{c}' at position {} is not supported (use =, ==, !=, in, notin)",
                    self.pos()
                )
            }
            Some(tok) => format!("unexpected {tok} at position {}, expected {expected}", self.pos()),
            None => format!("unexpected end of selector, expected {expected}"),
        }
    }

    fn parse(mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        if self.peek().is_none() {
            return Ok(requirements);
        }
        loop {
            requirements.push(self.requirement()?);
            match self.peek() {
                None => return Ok(requirements),
                Some(Tok::Comma) => {
                    self.bump();
                }
                Some(_) => return Err(self.unexpected("',' or the end of the selector")),
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let start = self.pos();
        if self.peek() == Some(&Tok::Not) {
            self.bump();
            let key = self.key()?;
            return finish(key, Operator::DoesNotExist, start);
        }
        let key = self.key()?;
        let op = match self.peek() {
            None | Some(Tok::Comma) => Operator::Exists,
            Some(Tok::Equals | Tok::DoubleEquals) => {
                self.bump();
                Operator::Equals(self.value())
            }
            Some(Tok::NotEquals) => {
                self.bump();
                Operator::NotEquals(self.value())
            }
            Some(Tok::Ident(word)) if word == "in" || word == "notin" => {
                let notin = word == "notin";
                self.bump();
                let values = self.values(&key)?;
                if notin {
                    Operator::NotIn(values)
                } else {
                    Operator::In(values)
                }
            }
            Some(_) => return Err(self.unexpected("an operator (=, ==, !=, in, notin), ',' or the end")),
        };
        finish(key, op, start)
    }

    fn key(&mut self) -> Result<String, String> {
        match self.peek() {
            Some(Tok::Ident(word)) if word != "in" && word != "notin" => {
                let key = word.clone();
                self.bump();
                Ok(key)
            }
            _ => Err(self.unexpected("a label key")),
        }
    }

    /// The value after `=`, `==` or `!=`; absent (`tier=`) means the empty value.
    fn value(&mut self) -> String {
        match self.peek() {
            Some(Tok::Ident(word)) => {
                let value = word.clone();
                self.bump();
                value
            }
            _ => String::new(),
        }
    }

    /// `(a, b, c)` after `in` or `notin`.
    fn values(&mut self, key: &str) -> Result<BTreeSet<String>, String> {
        if self.peek() != Some(&Tok::Open) {
            return Err(self.unexpected(&format!("'(' after the operator of {key:?}")));
        }
        self.bump();
        let mut values = BTreeSet::new();
        loop {
            match self.bump() {
                Some(Tok::Ident(v)) => {
                    values.insert(v);
                }
                Some(Tok::Close) if values.is_empty() => {
                    return Err(format!("the values of {key:?} must not be empty"));
                }
                None => return Err("missing ')'".to_string()),
                Some(_) => {
                    self.next -= 1;
                    return Err(self.unexpected(&format!("a value of {key:?}")));
                }
            }
            match self.bump() {
                Some(Tok::Comma) => {}
                Some(Tok::Close) => return Ok(values),
                None => return Err("missing ')'".to_string()),
                Some(_) => {
                    self.next -= 1;
                    return Err(self.unexpected("',' or ')'"));
                }
            }
        }
    }
}

/// Validates a parsed requirement, naming its position in the error.
fn finish(key: String, op: Operator, start: usize) -> Result<Requirement, String> {
    let req = Requirement { key, op };
    req.check().map_err(|reason| format!("{reason} (in {:?} at position {start})", req.to_string()))?;
    Ok(req)
}

/// A label name: 1–63 characters, alphanumerics, `-`, `_` and `.`, starting and ending
/// with an alphanumeric.
fn is_label_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A DNS-1123 subdomain: at most 253 characters, dot-separated lowercase labels.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        return Err(format!(
            "invalid label key {key:?}: the prefix must be a DNS subdomain (lowercase alphanumerics, '-' and '.')"
        ));
    }
    if !is_label_name(name) {
        return Err(format!("invalid label key {key:?}: the name must be {LABEL_NAME_RULE}"));
    }
    Ok(())
}

fn check_value(key: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!("invalid value {value:?} for label {key:?}: must be empty or {LABEL_NAME_RULE}"))
    }
}

const LABEL_NAME_RULE: &str = "1-63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric";

// ---------------------------------------------------------------------------------------
// Field selectors
// ---------------------------------------------------------------------------------------

/// A field that can be selected on. Every hive kind is cluster-scoped, so an object's
/// namespace is always the empty string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Field {
    /// `metadata.name`.
    Name,
    /// `metadata.namespace` (always `""` for hive objects).
    Namespace,
    /// Another dotted path a kind allows, e.g. `involvedObject.name` for events.
    Path(String),
}

/// The fields every kind can be selected on.
pub const OBJECT_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

impl Field {
    /// The field's path as written in a selector, e.g. `metadata.name`.
    pub fn as_str(&self) -> &str {
        match self {
            Field::Name => "metadata.name",
            Field::Namespace => "metadata.namespace",
            Field::Path(path) => path,
        }
    }

    /// The field's value in `object` as a selector compares it: strings as they are,
    /// other scalars in their JSON text, absent fields as `""`.
    pub fn value_in<'a>(&self, object: &'a serde_json::Value) -> std::borrow::Cow<'a, str> {
        let mut at = object;
        for key in self.as_str().split('.') {
            match at.get(key) {
                Some(next) => at = next,
                None => return std::borrow::Cow::Borrowed(""),
            }
        }
        match at {
            serde_json::Value::String(s) => std::borrow::Cow::Borrowed(s),
            serde_json::Value::Null => std::borrow::Cow::Borrowed(""),
            other => std::borrow::Cow::Owned(other.to_string()),
        }
    }
}

/// How a field selector term compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldOp {
    /// `=` or `==`.
    Equals,
    /// `!=`.
    NotEquals,
}

/// One term of a field selector, e.g. `metadata.name=a1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The field compared.
    pub field: Field,
    /// How it is compared.
    pub op: FieldOp,
    /// The value compared with (unescaped).
    pub value: String,
}

impl FieldRequirement {
    fn matches(&self, name: &str) -> bool {
        let actual = match self.field {
            Field::Name => name,
            Field::Namespace | Field::Path(_) => "",
        };
        (actual == self.value) == (self.op == FieldOp::Equals)
    }

    fn matches_object(&self, object: &serde_json::Value) -> bool {
        (self.field.value_in(object) == self.value.as_str()) == (self.op == FieldOp::Equals)
    }
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            FieldOp::Equals => "=",
            FieldOp::NotEquals => "!=",
        };
        f.write_str(self.field.as_str())?;
        f.write_str(op)?;
        for c in self.value.chars() {
            if matches!(c, '\\' | ',' | '=') {
                f.write_str("\\")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

/// A parsed `fieldSelector`: comma-separated `field=value`, `field==value` or
/// `field!=value` terms, all of which must hold. Values escape `\`, `,` and `=` with a
/// backslash, as the apiserver's do; empty terms are skipped, as upstream does, and
/// whitespace around fields and values is ignored (names never contain any).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// A selector made of these terms.
    pub fn new(requirements: Vec<FieldRequirement>) -> FieldSelector {
        FieldSelector { requirements }
    }

    /// The terms, in the order given.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// True for the empty selector, which matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether the object with this name is selected (for selectors on
    /// `metadata.name` / `metadata.namespace` only; other paths read as `""`).
    pub fn matches(&self, name: &str) -> bool {
        self.requirements.iter().all(|r| r.matches(name))
    }

    /// Whether `object` is selected, reading every term's field from it.
    pub fn matches_object(&self, object: &serde_json::Value) -> bool {
        self.requirements.iter().all(|r| r.matches_object(object))
    }

    /// Parses a selector whose fields must be among `allowed` (dotted paths); any
    /// other field is [`SelectorError::UnsupportedField`]. `FromStr` allows
    /// [`OBJECT_FIELDS`].
    pub fn parse_with(text: &str, allowed: &[&str]) -> Result<FieldSelector, SelectorError> {
        let fail = |reason: String| SelectorError::Field { selector: text.to_string(), reason };
        let mut requirements = Vec::new();
        for term in split_unescaped(text, ',') {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let (field, op, raw) = split_term(term)
                .ok_or_else(|| fail(format!("term {term:?} has no operator (=, == or !=)")))?;
            let field = match field.trim() {
                other if !allowed.contains(&other) => {
                    return Err(SelectorError::UnsupportedField(other.to_string()))
                }
                "metadata.name" => Field::Name,
                "metadata.namespace" => Field::Namespace,
                other => Field::Path(other.to_string()),
            };
            let value = unescape(raw.trim()).map_err(|reason| fail(format!("{reason} in term {term:?}")))?;
            requirements.push(FieldRequirement { field, op, value });
        }
        Ok(FieldSelector { requirements })
    }

    /// The one name this selector can match, when it has a `metadata.name=` term, so a
    /// list can be served by a point read (kubectl's `wait` and `delete` send exactly
    /// this). The other terms still have to be checked with [`FieldSelector::matches`].
    pub fn exact_name(&self) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == Field::Name && r.op == FieldOp::Equals)
            .map(|r| r.value.as_str())
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl FromStr for FieldSelector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<FieldSelector, SelectorError> {
        FieldSelector::parse_with(text, OBJECT_FIELDS)
    }
}

/// Splits at every `sep` not preceded by an escaping backslash.
fn split_unescaped(text: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(&text[start..i]);
            start = i + 1;
        }
    }
    parts.push(&text[start..]);
    parts
}

/// Splits `field<op>value` at the first unescaped operator.
fn split_term(term: &str) -> Option<(&str, FieldOp, &str)> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        let (field, rest) = term.split_at(i);
        if c == '\\' {
            escaped = true;
        } else if let Some(value) = rest.strip_prefix("!=") {
            return Some((field, FieldOp::NotEquals, value));
        } else if let Some(value) = rest.strip_prefix("==").or_else(|| rest.strip_prefix('=')) {
            return Some((field, FieldOp::Equals, value));
        }
    }
    None
}

fn unescape(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => return Err(format!("invalid escape sequence '\\{e}'")),
                None => return Err("dangling '\\' at the end of the value".to_string()),
            },
            '=' => return Err("unescaped '=' in the value".to_string()),
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
