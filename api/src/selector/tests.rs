//! Tests of label and field selectors: data-driven tables and round-trip properties.

use super::*;
use proptest::prelude::*;

fn labels(pairs: &str) -> BTreeMap<String, String> {
    pairs
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn label_selector_matches() {
    // (selector, labels as `k=v k=v`, expected)
    let table = [
        ("", "", true),
        ("", "app=web", true),
        ("app=web", "app=web", true),
        ("app==web", "app=web", true),
        ("app=web", "app=db", false),
        ("app=web", "", false),
        ("app!=web", "app=db", true),
        ("app!=web", "", true),
        ("app!=web", "app=web", false),
        ("tier=", "tier=", true),
        ("tier=", "tier=gold", false),
        ("tier=", "", false),
        ("env in (dev,prod)", "env=prod", true),
        ("env in (dev,prod)", "env=qa", false),
        ("env in (dev,prod)", "", false),
        ("env notin (dev,prod)", "env=qa", true),
        ("env notin (dev,prod)", "", true),
        ("env notin (dev,prod)", "env=dev", false),
        ("app", "app=", true),
        ("app", "other=x", false),
        ("!app", "other=x", true),
        ("!app", "app=web", false),
        ("app=web,tier=gold", "app=web tier=gold", true),
        ("app=web,tier=gold", "app=web tier=silver", false),
        ("  app = web ,  env  in  ( dev , prod ) , !legacy ", "app=web env=dev", true),
        ("  app = web ,  env  in  ( dev , prod ) , !legacy ", "app=web env=dev legacy=1", false),
        ("hive.dev/tier=gold", "hive.dev/tier=gold", true),
        ("hive.dev/tier", "tier=gold", false),
        ("v in (in,notin)", "v=notin", true),
        ("app=in", "app=in", true),
    ];
    for (selector, given, expected) in table {
        let parsed: LabelSelector =
            selector.parse().unwrap_or_else(|e| panic!("{selector:?} did not parse: {e}"));
        assert_eq!(parsed.matches(&labels(given)), expected, "{selector:?} on {given:?}");
    }
}

#[test]
fn label_selector_canonical_text() {
    let table = [
        ("", ""),
        ("app==web", "app=web"),
        (" tier = gold , app in ( web , db , web ) ", "app in (db,web),tier=gold"),
        ("!legacy,env notin (b,a)", "env notin (a,b),!legacy"),
        ("b,a=1,b!=2", "a=1,b,b!=2"),
        ("tier=", "tier="),
    ];
    for (selector, canonical) in table {
        let parsed: LabelSelector = selector.parse().unwrap();
        assert_eq!(parsed.to_string(), canonical, "{selector:?}");
    }
}

/// Each line is `selector => reason`: parsing must fail with
/// `invalid label selector "<selector>": <reason>`.
#[test]
fn label_selector_errors() {
    let table = r#"
        a in (b      => missing ')'
        a in (b,     => missing ')'
        a in ()      => the values of "a" must not be empty
        a in b       => unexpected "b" at position 5, expected '(' after the operator of "a"
        a in (b c)   => unexpected "c" at position 8, expected ',' or ')'
        a in (b,,c)  => unexpected ',' at position 8, expected a value of "a"
        a in (b,)    => unexpected ')' at position 8, expected a value of "a"
        a=b=c        => unexpected '=' at position 3, expected ',' or the end of the selector
        a,           => unexpected end of selector, expected a label key
        ,a           => unexpected ',' at position 0, expected a label key
        a b          => unexpected "b" at position 2, expected an operator (=, ==, !=, in, notin), ',' or the end
        !            => unexpected end of selector, expected a label key
        =x           => unexpected '=' at position 0, expected a label key
        in           => unexpected "in" at position 0, expected a label key
        a>1          => operator '>' at position 1 is not supported (use =, ==, !=, in, notin)
        x,-a=b       => invalid label key "-a": the name must be 1-63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric (in "-a=b" at position 2)
        Hive.dev/a   => invalid label key "Hive.dev/a": the prefix must be a DNS subdomain (lowercase alphanumerics, '-' and '.') (in "Hive.dev/a" at position 0)
        a=b-         => invalid value "b-" for label "a": must be empty or 1-63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric (in "a=b-" at position 0)
    "#;
    for line in table.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (selector, reason) = line.split_once(" => ").unwrap();
        let selector = selector.trim();
        let err = selector.parse::<LabelSelector>().expect_err(selector);
        assert_eq!(err.to_string(), format!("invalid label selector {selector:?}: {reason}"));
    }
    let long = format!("a={}", "x".repeat(64));
    assert!(long.parse::<LabelSelector>().is_err());
}

#[test]
fn requirement_new_validates() {
    assert!(Requirement::new("app", Operator::In(BTreeSet::new())).is_err());
    assert!(Requirement::new("a b", Operator::Exists).is_err());
    let ok = Requirement::new("hive.dev/tier", Operator::Equals("gold".into())).unwrap();
    assert_eq!(ok.key(), "hive.dev/tier");
    assert_eq!(ok.operator(), &Operator::Equals("gold".into()));
}

#[test]
fn field_selector_matches() {
    // (selector, object name, expected)
    let table = [
        ("", "a1", true),
        ("metadata.name=a1", "a1", true),
        ("metadata.name==a1", "a1", true),
        ("metadata.name=a1", "a2", false),
        ("metadata.name!=a1", "a2", true),
        ("metadata.name!=a1", "a1", false),
        ("metadata.namespace=", "a1", true),
        ("metadata.namespace==", "a1", true),
        ("metadata.namespace=default", "a1", false),
        ("metadata.namespace!=default", "a1", true),
        ("metadata.name=a1,metadata.namespace=", "a1", true),
        ("metadata.name=a1,metadata.name!=a1", "a1", false),
        (" metadata.name = a1 ,", "a1", true),
        ("metadata.name=a\\,b", "a,b", true),
    ];
    for (selector, name, expected) in table {
        let parsed: FieldSelector =
            selector.parse().unwrap_or_else(|e| panic!("{selector:?} did not parse: {e}"));
        assert_eq!(parsed.matches(name), expected, "{selector:?} on {name:?}");
    }
}

#[test]
fn field_selector_exact_name() {
    let table = [
        ("", None),
        ("metadata.name=a1", Some("a1")),
        ("metadata.namespace=,metadata.name==a2", Some("a2")),
        ("metadata.name!=a1", None),
    ];
    for (selector, name) in table {
        assert_eq!(selector.parse::<FieldSelector>().unwrap().exact_name(), name, "{selector:?}");
    }
}

/// Each line is `selector => message`.
#[test]
fn field_selector_errors() {
    let table = r#"
        spec.x=1                          => field label not supported: spec.x
        metadata.name=a,status.phase!=Up  => field label not supported: status.phase
        metadata.name                     => invalid field selector "metadata.name": term "metadata.name" has no operator (=, == or !=)
        metadata.name=a\x                 => invalid field selector "metadata.name=a\\x": invalid escape sequence '\x' in term "metadata.name=a\\x"
        metadata.name=a=b                 => invalid field selector "metadata.name=a=b": unescaped '=' in the value in term "metadata.name=a=b"
    "#;
    for line in table.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (selector, message) = line.split_once(" => ").unwrap();
        let selector = selector.trim();
        let err = selector.parse::<FieldSelector>().expect_err(selector);
        assert_eq!(err.to_string(), message, "{selector:?}");
    }
}

fn label_name() -> impl Strategy<Value = String> + Clone {
    "[a-zA-Z0-9]([-a-zA-Z0-9_.]{0,8}[a-zA-Z0-9])?"
}

fn key() -> impl Strategy<Value = String> {
    (proptest::option::of("[a-z0-9]{1,5}(\\.[a-z0-9]{1,5}){0,2}"), label_name())
        .prop_filter("in and notin are operators", |(_, name)| name != "in" && name != "notin")
        .prop_map(|(prefix, name)| match prefix {
            Some(prefix) => format!("{prefix}/{name}"),
            None => name,
        })
}

fn operator() -> impl Strategy<Value = Operator> {
    let value = prop_oneof![Just(String::new()), label_name()];
    let values = proptest::collection::btree_set(label_name(), 1..4);
    prop_oneof![
        value.clone().prop_map(Operator::Equals),
        value.prop_map(Operator::NotEquals),
        values.clone().prop_map(Operator::In),
        values.prop_map(Operator::NotIn),
        Just(Operator::Exists),
        Just(Operator::DoesNotExist),
    ]
}

fn field_requirement() -> impl Strategy<Value = FieldRequirement> {
    (
        prop_oneof![Just(Field::Name), Just(Field::Namespace)],
        prop_oneof![Just(FieldOp::Equals), Just(FieldOp::NotEquals)],
        "([a-z0-9.!=,\\\\-]{0,10}[a-z0-9.,=\\\\-])?",
    )
        .prop_map(|(field, op, value)| FieldRequirement { field, op, value })
}

proptest! {
    #[test]
    fn label_selector_display_parse_round_trips(
        reqs in proptest::collection::vec((key(), operator()), 0..5)
    ) {
        let reqs = reqs.into_iter().map(|(k, op)| Requirement::new(k, op).unwrap()).collect();
        let selector = LabelSelector::new(reqs);
        let text = selector.to_string();
        let parsed: LabelSelector = text.parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(&parsed, &selector);
        prop_assert_eq!(parsed.to_string(), text);
    }

    #[test]
    fn field_selector_display_parse_round_trips(
        reqs in proptest::collection::vec(field_requirement(), 0..4)
    ) {
        let selector = FieldSelector::new(reqs);
        let text = selector.to_string();
        let parsed: FieldSelector = text.parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(&parsed, &selector);
    }
}
