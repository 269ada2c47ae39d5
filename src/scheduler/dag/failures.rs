//! A Job's message when nodes failed: every failed node named, in the order they failed,
//! each with its error, so an 8-agent Restart whose three agents failed says all three.
//! Bounded: each error is cut, and past [`NAMED`] nodes the rest are counted.

/// Failed nodes named with their errors; past these, "and N more".
pub(crate) const NAMED: usize = 20;
/// The characters of one node's error kept in the message.
const ERROR_CHARS: usize = 200;

/// The message of a Job whose nodes `failed` (id, error), in the order they failed;
/// `None` when none did.
pub(crate) fn message(failed: &[(&str, &str)]) -> Option<String> {
    let count = failed.len();
    match failed {
        [] => None,
        [(id, error)] => Some(format!("node {id} failed: {}", cut(error))),
        _ => {
            let named: Vec<String> =
                failed.iter().take(NAMED).map(|(id, error)| format!("{id}: {}", cut(error))).collect();
            let mut text = format!("{count} nodes failed: {}", named.join("; "));
            if count > NAMED {
                text.push_str(&format!("; and {} more (status.nodes)", count - NAMED));
            }
            Some(text)
        }
    }
}

/// The first line of `error`, at most [`ERROR_CHARS`] characters, ending in `…` when cut.
fn cut(error: &str) -> String {
    let line = error.lines().next().unwrap_or_default();
    if line.chars().count() <= ERROR_CHARS && line.len() == error.trim_end().len() {
        return line.to_string();
    }
    let mut out: String = line.chars().take(ERROR_CHARS - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(failed: &[(&str, &str)], want: Option<&str>) {
        assert_eq!(message(failed).as_deref(), want, "{failed:?}");
    }

    #[test]
    fn every_failed_node_is_named() {
        check(&[], None);
        check(&[("a/swap", "boom")], Some("node a/swap failed: boom"));
        check(
            &[("crashy/reconcile", "exit code 3"), ("flaky/start", "no such program")],
            Some("2 nodes failed: crashy/reconcile: exit code 3; flaky/start: no such program"),
        );
        // A long or many-line error is cut to its first line, marked.
        let long = "x".repeat(500);
        let cut = message(&[("a/prebuild", long.as_str())]).unwrap();
        assert_eq!(cut.chars().count(), "node a/prebuild failed: ".len() + ERROR_CHARS, "{cut}");
        assert!(cut.ends_with('…'));
        check(&[("a/prebuild", "fetch failed\nhint: a rev")], Some("node a/prebuild failed: fetch failed…"));
    }

    #[test]
    fn past_the_named_ones_the_rest_are_counted() {
        let ids: Vec<String> = (0..NAMED + 3).map(|i| format!("agent-{i}/reconcile")).collect();
        let failed: Vec<(&str, &str)> = ids.iter().map(|id| (id.as_str(), "down")).collect();
        let text = message(&failed).unwrap();
        assert!(
            text.starts_with(&format!("{} nodes failed: agent-0/reconcile: down; ", NAMED + 3)),
            "{text}"
        );
        assert!(text.contains(&format!("agent-{}/reconcile", NAMED - 1)), "{text}");
        assert!(!text.contains(&format!("agent-{}/reconcile", NAMED)), "{text}");
        assert!(text.ends_with("; and 3 more (status.nodes)"), "{text}");
    }
}
