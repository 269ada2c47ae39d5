//! Pure validation: every problem is reported with the path of its field, so a
//! client can fix a manifest in one round trip.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::meta::{Condition, ObjectMeta};

/// Why a field is invalid; the names are the Kubernetes `StatusCause` reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The value is malformed or out of range.
    Invalid,
    /// A required value is missing.
    Required,
    /// The value is not one of the supported values.
    NotSupported,
    /// The value repeats one already given.
    Duplicate,
    /// The value is longer than allowed.
    TooLong,
    /// The list has more items than allowed.
    TooMany,
    /// The field may not be changed after creation.
    Forbidden,
}

impl Reason {
    /// The Kubernetes cause reason string, e.g. `FieldValueInvalid`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Invalid => "FieldValueInvalid",
            Reason::Required => "FieldValueRequired",
            Reason::NotSupported => "FieldValueNotSupported",
            Reason::Duplicate => "FieldValueDuplicate",
            Reason::TooLong => "FieldValueTooLong",
            Reason::TooMany => "FieldValueTooMany",
            Reason::Forbidden => "FieldValueForbidden",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Reason::Invalid => "Invalid value",
            Reason::Required => "Required value",
            Reason::NotSupported => "Unsupported value",
            Reason::Duplicate => "Duplicate value",
            Reason::TooLong => "Too long",
            Reason::TooMany => "Too many",
            Reason::Forbidden => "Forbidden",
        }
    }
}

/// One invalid field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    /// Dotted path of the field, e.g. `spec.resources.memoryMax` or `spec.nodes[2].deps`.
    pub field: String,
    /// Why it is invalid.
    pub reason: Reason,
    /// What is wrong, in words, including the offending value where useful.
    pub message: String,
}

impl ValidationError {
    /// Builds an error for `field`.
    pub fn new(field: impl Into<String>, reason: Reason, message: impl Into<String>) -> Self {
        ValidationError { field: field.into(), reason, message: message.into() }
    }

    /// The message as Kubernetes renders a cause: `Invalid value: "x": must be …`.
    pub fn cause_message(&self) -> String {
        format!("{}: {}", self.reason.prefix(), self.message)
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.cause_message())
    }
}

/// At most this many problems are listed in one refusal (its causes, its message, its
/// warnings); the rest are counted in one more. A client fixes the first and sends again,
/// and no request, however many fields it gets wrong, makes an answer grow with it.
pub const MAX_CAUSES: usize = 50;

/// The first [`MAX_CAUSES`] of `errors`, then one error at the first field left out
/// that counts the rest: `Too many: 4950 more problems not listed …`. A list of up to
/// `MAX_CAUSES + 1` is kept whole (one cause is no longer than the one counting it), so
/// bounding a bounded list changes nothing.
pub fn bounded(mut errors: Vec<ValidationError>) -> Vec<ValidationError> {
    if errors.len() <= MAX_CAUSES + 1 {
        return errors;
    }
    let more = errors.len() - MAX_CAUSES;
    let first_left_out = std::mem::take(&mut errors[MAX_CAUSES].field);
    errors.truncate(MAX_CAUSES);
    errors.push(ValidationError::new(first_left_out, Reason::TooMany, not_listed(more, "problems")));
    errors
}

/// `4950 more problems not listed …`: the words of the entry that counts what a bounded
/// list leaves out.
pub fn not_listed(more: usize, what: &str) -> String {
    format!("{more} more {what} not listed, the first at this field (at most {MAX_CAUSES} are listed)")
}

/// `field: message` of each error, in brackets when there are several, bounded as
/// [`bounded`] bounds them: the message of a refusal.
pub fn summary(errors: &[ValidationError]) -> String {
    match errors {
        [one] => one.to_string(),
        many if many.len() <= MAX_CAUSES + 1 => {
            format!("[{}]", many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
        }
        many => {
            let mut listed: Vec<String> = many[..MAX_CAUSES].iter().map(ToString::to_string).collect();
            let more = not_listed(many.len() - MAX_CAUSES, "problems");
            listed.push(
                ValidationError::new(many[MAX_CAUSES].field.clone(), Reason::TooMany, more).to_string(),
            );
            format!("[{}]", listed.join(", "))
        }
    }
}

/// Collects validation errors under a growing field path.
#[derive(Debug, Default)]
pub struct Errors(pub Vec<ValidationError>);

impl Errors {
    /// Records one problem.
    pub fn push(&mut self, field: impl Into<String>, reason: Reason, message: impl Into<String>) {
        self.0.push(ValidationError::new(field, reason, message));
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Maximum length of a DNS-1123 label.
pub const MAX_NAME_LEN: usize = 63;

/// Checks a DNS-1123 label; returns the reason text when it is not one.
pub fn dns1123_label(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > MAX_NAME_LEN {
        return Err(format!("must be no more than {MAX_NAME_LEN} characters"));
    }
    let ok_chars = value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let bytes = value.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !ok_chars || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return Err("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', \
             and must start and end with an alphanumeric character (e.g. 'my-name', or '123-abc')"
            .into());
    }
    Ok(())
}

/// Maximum length of a DNS-1123 subdomain.
pub const MAX_SUBDOMAIN_LEN: usize = 253;

/// Checks a DNS-1123 subdomain (dot-separated labels, at most 253 characters in all);
/// returns the reason text when it is not one.
pub fn dns1123_subdomain(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > MAX_SUBDOMAIN_LEN {
        return Err(format!("must be no more than {MAX_SUBDOMAIN_LEN} characters"));
    }
    if value.split('.').any(|label| dns1123_label(label).is_err()) {
        return Err(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' \
             or '.', and must start and end with an alphanumeric character (e.g. 'example.com')"
                .into(),
        );
    }
    Ok(())
}

/// Which names a kind's objects take: `metadata.name` checked as a DNS-1123 label (hive's
/// kinds) or subdomain (core Events, named `OBJECT.HEX` by client-go's recorders).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// A DNS-1123 label.
    Label,
    /// A DNS-1123 subdomain.
    Subdomain,
}

/// Validates a name field, recording an error at `field` when it is not a DNS-1123 label.
pub fn name(errors: &mut Errors, field: &str, value: &str) {
    name_by(errors, field, value, NameRule::Label);
}

/// Validates a name field by `rule`.
pub fn name_by(errors: &mut Errors, field: &str, value: &str, rule: NameRule) {
    let checked = match rule {
        NameRule::Label => dns1123_label(value),
        NameRule::Subdomain => dns1123_subdomain(value),
    };
    if let Err(why) = checked {
        let reason = if value.is_empty() { Reason::Required } else { Reason::Invalid };
        let msg = if value.is_empty() { "name is required".to_string() } else { format!("{value:?}: {why}") };
        errors.push(field, reason, msg);
    }
}

fn qualified_name(value: &str) -> Result<(), String> {
    let (prefix, name) = match value.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, value),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() || prefix.len() > 253 {
            return Err("prefix part must be a DNS subdomain of at most 253 characters".into());
        }
        for label in prefix.split('.') {
            dns1123_label(label)
                .map_err(|_| format!("prefix part {prefix:?} must be a lowercase DNS subdomain"))?;
        }
    }
    label_value(name, false)
}

fn label_value(value: &str, allow_empty: bool) -> Result<(), String> {
    if value.is_empty() {
        return if allow_empty { Ok(()) } else { Err("name part must be non-empty".into()) };
    }
    if value.len() > 63 {
        return Err("must be no more than 63 characters".into());
    }
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    let bytes = value.as_bytes();
    let ok = bytes.iter().all(|&b| alnum(b) || b == b'-' || b == b'_' || b == b'.')
        && alnum(bytes[0])
        && alnum(bytes[bytes.len() - 1]);
    if !ok {
        return Err("must consist of alphanumeric characters, '-', '_' or '.', and must start and end \
                    with an alphanumeric character"
            .into());
    }
    Ok(())
}

/// The most bytes a free-text field a client writes may hold (an Approval's `summary`
/// and decision `reason`, a Job's `reason`): enough for a paragraph, not a payload.
pub const MAX_TEXT_BYTES: usize = 4096;

/// The most bytes an object's JSON may take, as etcd's default request limit
/// (`--max-request-bytes`, 1.5 MiB): what kube-apiserver could not store either.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// Checks a free-text field against [`MAX_TEXT_BYTES`].
pub fn text(errors: &mut Errors, field: &str, value: &str) {
    if value.len() > MAX_TEXT_BYTES {
        errors.push(
            field,
            Reason::TooLong,
            format!("{} bytes, must be at most {MAX_TEXT_BYTES}", value.len()),
        );
    }
}

/// Validates label keys and values.
pub fn labels(errors: &mut Errors, field: &str, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        if let Err(why) = qualified_name(k) {
            errors.push(field, Reason::Invalid, format!("{k:?}: label key {why}"));
        }
        if let Err(why) = label_value(v, true) {
            errors.push(format!("{field}.{k}"), Reason::Invalid, format!("{v:?}: label value {why}"));
        }
    }
}

/// Validates the metadata every object carries, its name by `rule`.
pub fn object_meta(errors: &mut Errors, meta: &ObjectMeta, rule: NameRule) {
    name_by(errors, "metadata.name", &meta.name, rule);
    // Only a kind that keeps a namespace (core Events) still has one here.
    if let Some(namespace) = meta.namespace.as_deref().filter(|n| !n.is_empty()) {
        name(errors, "metadata.namespace", namespace);
    }
    labels(errors, "metadata.labels", &meta.labels);
    for k in meta.annotations.keys() {
        if let Err(why) = qualified_name(k) {
            errors.push("metadata.annotations", Reason::Invalid, format!("{k:?}: annotation key {why}"));
        }
    }
    let total: usize = meta.annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > 256 * 1024 {
        errors.push(
            "metadata.annotations",
            Reason::TooLong,
            format!("annotations total {total} bytes, must be at most 262144"),
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, f) in meta.finalizers.iter().enumerate() {
        if let Err(why) = qualified_name(f) {
            errors.push(format!("metadata.finalizers[{i}]"), Reason::Invalid, format!("{f:?}: {why}"));
        }
        if !seen.insert(f) {
            errors.push(format!("metadata.finalizers[{i}]"), Reason::Duplicate, format!("{f:?}"));
        }
    }
}

/// Validates a systemd-style percentage such as `200%`.
pub fn percent(errors: &mut Errors, field: &str, value: &str) {
    let ok = value
        .strip_suffix('%')
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| n > 0);
    if !ok {
        errors.push(
            field,
            Reason::Invalid,
            format!("{value:?}: must be a positive percentage such as \"200%\""),
        );
    }
}

/// Validates a systemd-style byte size such as `4G`, `512M`, `1073741824` or
/// `infinity` (1024-based suffixes; the total must fit in 64 bits).
pub fn byte_size(errors: &mut Errors, field: &str, value: &str) {
    let digits = value.trim_end_matches(['K', 'M', 'G', 'T']);
    let suffix_len = value.len() - digits.len();
    let shift = match value.as_bytes().last() {
        Some(b'K') => 10,
        Some(b'M') => 20,
        Some(b'G') => 30,
        Some(b'T') => 40,
        _ => 0,
    };
    let ok = value == "infinity"
        || (suffix_len <= 1
            && !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && digits.parse::<u64>().is_ok_and(|n| n > 0 && n.checked_mul(1 << shift).is_some()));
    if !ok {
        errors.push(field, Reason::Invalid, format!("{value:?}: must be a positive byte count with an optional K, M, G or T suffix, such as \"4G\""));
    }
}

/// Validates the conditions of a status: each has a type, and no type repeats (the list
/// is keyed by `type`).
pub fn conditions(errors: &mut Errors, field: &str, conditions: &[Condition]) {
    let mut seen = BTreeSet::new();
    for (i, c) in conditions.iter().enumerate() {
        let at = format!("{field}[{i}].type");
        if c.type_.is_empty() {
            errors.push(at, Reason::Required, "condition type is required");
        } else if !seen.insert(c.type_.as_str()) {
            errors.push(at, Reason::Duplicate, format!("{:?}", c.type_));
        }
    }
}

/// Validates a list of plain tokens (tool groups, capabilities, flake inputs): each is
/// non-empty, has no whitespace, and appears once.
pub fn tokens(errors: &mut Errors, field: &str, values: &[String]) {
    let mut seen = BTreeSet::new();
    for (i, v) in values.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if v.is_empty() {
            errors.push(at, Reason::Required, "must not be empty");
        } else if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
            errors.push(at, Reason::Invalid, format!("{v:?}: must not contain whitespace"));
        } else if !seen.insert(v.as_str()) {
            errors.push(at, Reason::Duplicate, format!("{v:?}"));
        }
    }
}

/// Validates a value that ends up as a command-line argument (a git repository, a
/// revision, an image): no whitespace or control characters, and no leading '-', so it
/// can never be read as an option. An empty value is reported as required.
pub fn argument(errors: &mut Errors, field: &str, value: &str) {
    if value.is_empty() {
        errors.push(field, Reason::Required, "must not be empty");
    } else if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        errors.push(field, Reason::Invalid, format!("{value:?}: must not contain whitespace"));
    } else if value.starts_with('-') {
        errors.push(field, Reason::Invalid, format!("{value:?}: must not start with '-'"));
    }
}

/// Checks an environment variable name: a letter or '_' followed by letters, digits or '_'.
pub fn is_env_name(value: &str) -> bool {
    let mut chars = value.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Validates an environment map: every key is an environment variable name.
pub fn env(errors: &mut Errors, field: &str, env: &BTreeMap<String, String>) {
    for k in env.keys() {
        if !is_env_name(k) {
            errors.push(
                format!("{field}.{k}"),
                Reason::Invalid,
                format!("{k:?}: must be an environment variable name (letters, digits and '_', not starting with a digit)"),
            );
        }
    }
}

/// Reports every top-level field of `new` that differs from `old` (both serialized as
/// JSON objects) as forbidden, at `{field}.{key}`: for specs written once.
pub fn immutable<T: serde::Serialize>(errors: &mut Errors, field: &str, new: &T, old: &T) {
    let as_map = |v: &T| match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let (new, old) = (as_map(new), as_map(old));
    let keys: BTreeSet<&String> = new.keys().chain(old.keys()).collect();
    for key in keys {
        if new.get(key) != old.get(key) {
            errors.push(format!("{field}.{key}"), Reason::Forbidden, "is immutable");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        for ok in ["a", "a1", "my-agent", "0abc", &"x".repeat(63)] {
            assert!(dns1123_label(ok).is_ok(), "{ok}");
        }
        for bad in ["", "A", "-a", "a-", "a_b", "a.b", &"x".repeat(64)] {
            assert!(dns1123_label(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_keys_and_values() {
        let mut e = Errors::default();
        let ls: BTreeMap<String, String> = [
            ("app".to_string(), "x".to_string()),
            ("hive.dev/tier".to_string(), "".to_string()),
            ("Bad Key".to_string(), "v".to_string()),
            ("ok".to_string(), "-bad".to_string()),
        ]
        .into();
        labels(&mut e, "metadata.labels", &ls);
        let fields: Vec<_> = e.0.iter().map(|x| x.field.as_str()).collect();
        assert_eq!(fields, ["metadata.labels", "metadata.labels.ok"]);
    }

    #[test]
    fn a_refusal_lists_at_most_max_causes_and_counts_the_rest() {
        let errors = |n: usize| -> Vec<ValidationError> {
            (0..n)
                .map(|i| ValidationError::new(format!("spec.nodes[{i}].id"), Reason::Invalid, "bad"))
                .collect()
        };
        assert_eq!(bounded(errors(MAX_CAUSES + 1)), errors(MAX_CAUSES + 1), "a full list is kept whole");
        let capped = bounded(errors(5000));
        assert_eq!(capped.len(), MAX_CAUSES + 1);
        assert_eq!(capped[..MAX_CAUSES], errors(MAX_CAUSES)[..]);
        let last = &capped[MAX_CAUSES];
        assert_eq!((last.field.as_str(), last.reason), ("spec.nodes[50].id", Reason::TooMany));
        assert_eq!(
            last.cause_message(),
            "Too many: 4950 more problems not listed, the first at this field (at most 50 are listed)"
        );

        assert_eq!(summary(&errors(1)), "spec.nodes[0].id: Invalid value: bad");
        assert_eq!(
            summary(&errors(2)),
            "[spec.nodes[0].id: Invalid value: bad, spec.nodes[1].id: Invalid value: bad]"
        );
        let long = summary(&errors(5000));
        assert_eq!(long.matches("Invalid value: bad").count(), MAX_CAUSES);
        assert!(
            long.ends_with(", spec.nodes[50].id: Too many: 4950 more problems not listed, the first at this field (at most 50 are listed)]"),
            "{long}"
        );
        // Bounding first changes nothing in the summary.
        assert_eq!(summary(&bounded(errors(5000))), long);
    }

    #[test]
    fn sizes_and_percents() {
        let mut e = Errors::default();
        percent(&mut e, "a", "200%");
        byte_size(&mut e, "b", "4G");
        byte_size(&mut e, "c", "1024");
        byte_size(&mut e, "d", "infinity");
        assert!(e.is_empty());
        percent(&mut e, "a", "2");
        percent(&mut e, "a", "+200%");
        byte_size(&mut e, "b", "4GB");
        byte_size(&mut e, "c", "");
        byte_size(&mut e, "c", "+4G");
        byte_size(&mut e, "c", "16777216T");
        assert_eq!(e.0.len(), 6);
    }
}
