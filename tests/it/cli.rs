//! The hive CLI against the real daemon: output snapshots (ages, uids and timestamps
//! normalized) and exit codes.

use crate::harness::{fails, ok, Daemon};

/// Replaces what changes from run to run: ages (`3s`, `2m`), uids, timestamps and short
/// commit ids. An age keeps the width of its column (token plus padding), so alignment
/// stays checked whether the age reads `1s` or `12s`.
fn normalize(text: &str) -> String {
    text.lines()
        .map(|line| {
            let mut out = String::new();
            let mut rest = line;
            while !rest.is_empty() {
                let ws = rest.len() - rest.trim_start().len();
                out.push_str(&rest[..ws]);
                rest = &rest[ws..];
                let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                let token = &rest[..end];
                rest = &rest[end..];
                let replaced = normalize_token(token);
                if replaced == "<age>" {
                    let pad = rest.len() - rest.trim_start().len();
                    rest = &rest[pad..];
                    out.push_str("<age>");
                    if !rest.is_empty() {
                        out.push_str(&" ".repeat((token.len() + pad).saturating_sub(5).max(1)));
                    }
                } else {
                    out.push_str(&replaced);
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn normalize_token(token: &str) -> String {
    let is_age = token.len() >= 2
        && token.ends_with(['s', 'm', 'h', 'd'])
        && token[..token.len() - 1].chars().all(|c| c.is_ascii_digit());
    let is_uid = token.len() == 36 && token.chars().filter(|c| *c == '-').count() == 4;
    let is_time = token.len() == 20 && token.ends_with('Z') && token.as_bytes().get(10) == Some(&b'T');
    // A fleet worker's iroh endpoint id, kept at its width so columns stay aligned.
    let is_endpoint = token.len() == 64 && token.chars().all(|c| c.is_ascii_hexdigit());
    if is_endpoint {
        return format!("{:<64}", "<endpoint>");
    }
    // The same in its short form (`ae58ff8833…`), as the default table shows it.
    let short = token.strip_suffix('…').filter(|h| h.len() == 10 && h.chars().all(|c| c.is_ascii_hexdigit()));
    if short.is_some() {
        return format!("{:<11}", "<endpoint>");
    }
    // A short commit id, e.g. the hello agent's applied rev (this repository's HEAD).
    let is_commit =
        token.len() == 12 && token.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
    if is_commit {
        // Same width, so the columns stay aligned.
        "<commit-sha>".into()
    } else if is_age {
        "<age>".into()
    } else if is_uid {
        "<uid>".into()
    } else if is_time {
        "<time>".into()
    } else {
        token.to_string()
    }
}

fn manifests() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/manifests").to_string()
}

#[test]
fn apply_get_describe_snapshots() {
    let d = Daemon::start();
    let applied = ok(d.hive(&["apply", "-f", &manifests()]));
    insta::assert_snapshot!("apply_manifests", applied);
    // The example Job runs (a rebuild of the hello agent): the views below are of the
    // settled state, after it.
    ok(d.hive(&["wait", "job/rebuild-hello-1", "--for=jsonpath={.status.phase}=Done", "--timeout", "90s"]));
    let again = ok(d.hive(&["apply", "-f", &format!("{}/agent.yaml", manifests())]));
    insta::assert_snapshot!("apply_unchanged", again);
    insta::assert_snapshot!("get_agents", normalize(&ok(d.hive(&["get", "agents"]))));
    insta::assert_snapshot!("get_agents_wide", normalize(&ok(d.hive(&["get", "agents", "-o", "wide"]))));
    // The fleet reacts to what was applied: each Provider is checked (its state is
    // written), and the FleetCommand written by apply runs: its nodes end Running. Wait
    // for both, so the snapshot is the settled view.
    let settled = |kind: &str, field: &str, done: &[&str]| {
        let out = ok(d.hive(&["get", kind, "-o", "json"]));
        let list: serde_json::Value = serde_json::from_str(&out).unwrap();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["status"][field].as_str().is_some_and(|v| done.is_empty() || done.contains(&v)))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while !(settled("providers", "state", &[])
        && settled("fleetcommands", "phase", &["Succeeded", "Failed"])
        && settled("nodes", "phase", &["Running"]))
    {
        assert!(std::time::Instant::now() < deadline, "the fleet did not settle");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Whether the docker Provider is Ready depends on this machine's Docker Engine (and
    // with it the width of the STATE column): the provider table is compared with its
    // columns collapsed and that one state masked.
    let hive = normalize(&ok(d.hive(&["get", "hive"])))
        .lines()
        .map(|l| {
            if !(l.starts_with("provider.hive.dev/") || (l.starts_with("NAME") && l.contains(" TYPE "))) {
                return l.to_string();
            }
            let mut cells: Vec<&str> = l.split_whitespace().collect();
            if l.starts_with("provider.hive.dev/docker") {
                cells[2] = "<state>";
            }
            cells.join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n");
    insta::assert_snapshot!("get_hive", hive);
    insta::assert_snapshot!(
        "get_names",
        ok(d.hive(&["get", "agents", "-o", "name", "-l", "hive.dev/role=manager"]))
    );
    // The fleet's own start-up writes interleave with the apply: the version is masked.
    let describe =
        normalize(&ok(d.hive(&["describe", "agent", "manager"])))
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("Resource Version:") {
                    "  Resource Version:    <rv>"
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
    insta::assert_snapshot!("describe_agent", describe);
}

#[test]
fn errors_print_the_server_status_and_exit_non_zero() {
    let d = Daemon::start();
    let err = fails(d.hive(&["get", "agent", "nope"]));
    assert_eq!(err.trim(), "Error from server (NotFound): agents.hive.dev \"nope\" not found");
    let bad = "apiVersion: hive.dev/v1\nkind: Agent\nmetadata:\n  name: ok-one\nspec:\n  config: {repo: r}\n---\napiVersion: hive.dev/v1\nkind: Agent\nmetadata:\n  name: Bad\n";
    let err = fails(d.hive_stdin(&["apply", "-f", "-"], Some(bad)));
    assert!(err.contains("document 2"), "names the document: {err}");
    assert!(err.contains("nothing was applied"), "{err}");
    let listed = ok(d.hive(&["get", "agents", "-o", "name"]));
    assert_eq!(listed.trim(), "", "an invalid document stops the whole apply");
    let err = fails(d.hive(&["get", "gadgets"]));
    assert!(err.contains("gadgets"), "{err}");
}

/// Issue 28 item 8: of [valid, refused, valid] `hive apply` stopped at the refusal, so the
/// third document was neither applied nor named. kubectl applies it: every valid document
/// is applied, each refusal names its document, kind/name and the server's message, and
/// the command exits 1.
#[test]
fn apply_applies_every_valid_document_and_names_each_refusal() {
    let d = Daemon::start();
    let repo = crate::agents::config_repo(&d.dir);
    let agent = |name: &str| serde_yaml_ng::to_string(&crate::agents::agent(name, &repo, "Offline")).unwrap();
    // Well formed, so the local checks pass; the server refuses a config change for an
    // agent that does not exist.
    let refused = |name: &str| {
        format!(
            "apiVersion: hive.dev/v1\nkind: Approval\nmetadata:\n  name: {name}\nspec:\n  kind: ApplyCommit\n  \
             target: ghost\n  payload: {{commit: abc123}}\n"
        )
    };
    let docs = [agent("first"), refused("refused"), agent("third"), refused("also-refused")].join("---\n");
    let out = d.hive_stdin(&["apply", "-f", "-"], Some(&docs));
    assert_eq!(out.status.code(), Some(1), "a refusal exits 1");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("agent.hive.dev/first created"), "{stdout}{stderr}");
    assert!(
        stdout.contains("agent.hive.dev/third created"),
        "the document after a refusal is applied: {stdout}"
    );
    for (name, document) in [("refused", "document 2"), ("also-refused", "document 4")] {
        let line = stderr
            .lines()
            .find(|l| l.contains(&format!("approval.hive.dev/{name} ")))
            .unwrap_or_else(|| panic!("the refusal of {name} is named:\n{stderr}"));
        assert!(line.contains(document) && line.contains("ghost"), "the server's message: {line}");
    }
    let listed = ok(d.hive(&["get", "agents", "-o", "name"]));
    assert_eq!(listed.lines().collect::<Vec<_>>(), ["agent.hive.dev/first", "agent.hive.dev/third"]);
}

#[test]
fn wait_delete_and_watch() {
    let d = Daemon::start();
    ok(d.hive(&["apply", "-f", &format!("{}/agent.yaml", manifests())]));
    let met = ok(d.hive(&["wait", "agent/manager", "--for=jsonpath={.spec.wanted}=Up", "--timeout", "10s"]));
    assert_eq!(met.trim(), "agent.hive.dev/manager condition met");
    let err = fails(d.hive(&["wait", "agent/manager", "--for=condition=Ready", "--timeout", "1s"]));
    assert!(err.contains("timed out waiting for the condition on agents/manager"), "{err}");
    let deleted = ok(d.hive(&["delete", "agent", "researcher"]));
    assert_eq!(deleted.trim(), "agent.hive.dev \"researcher\" deleted");
    let gone = ok(d.hive(&["wait", "agent/researcher", "--for=delete", "--timeout", "5s"]));
    assert!(gone.contains("condition met") || gone.contains("deleted"), "{gone}");
}
