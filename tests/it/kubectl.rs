//! Stock kubectl (v1.32 on this machine and CI's) against the real daemon, with the
//! kubeconfig `hive serve` writes and nothing else.

use crate::harness::{fails, ok, Daemon};

const AGENT_YAML: &str = r#"apiVersion: hive.dev/v1
kind: Agent
metadata:
  name: k1
  labels:
    app: demo
spec:
  wanted: Up
  config:
    repo: https://git.example.invalid/agents/k1.git
    rev: main
  runtime:
    type: process
    process:
      command: ["./run.sh"]
"#;

#[test]
fn api_resources_lists_every_kind() {
    let d = Daemon::start();
    let out = ok(d.kubectl(&["api-resources", "--api-group=hive.dev"]));
    for line in ["agents", "ag", "jobs", "approvals", "nodes", "fleetcommands", "providers"] {
        assert!(out.contains(line), "{line} missing:\n{out}");
    }
    assert!(out.contains("false"), "cluster-scoped kinds show NAMESPACED false:\n{out}");
}

#[test]
fn apply_create_update_unchanged_get_and_delete() {
    let d = Daemon::start();
    let file = d.dir.join("agent.yaml");
    std::fs::write(&file, AGENT_YAML).unwrap();
    let f = file.to_str().unwrap();
    assert_eq!(ok(d.kubectl(&["apply", "-f", f])).trim(), "agent.hive.dev/k1 created");
    assert_eq!(ok(d.kubectl(&["apply", "-f", f])).trim(), "agent.hive.dev/k1 unchanged");
    std::fs::write(&file, AGENT_YAML.replace("wanted: Up", "wanted: Offline")).unwrap();
    assert_eq!(ok(d.kubectl(&["apply", "-f", f])).trim(), "agent.hive.dev/k1 configured");

    let table = ok(d.kubectl(&["get", "agents"]));
    let header = table.lines().next().unwrap();
    assert!(header.starts_with("NAME"), "{table}");
    assert!(header.contains("AGE"), "{table}");
    assert!(table.contains("k1"), "{table}");
    assert!(table.contains("Offline"), "{table}");

    let wide = ok(d.kubectl(&["get", "agents", "-o", "wide"]));
    assert!(wide.lines().next().unwrap().len() > header.len(), "wide adds columns:\n{wide}");

    let yaml = ok(d.kubectl(&["get", "agent", "k1", "-o", "yaml"]));
    assert!(yaml.contains("kind: Agent"), "{yaml}");
    assert!(yaml.contains("wanted: Offline"), "{yaml}");

    let labelled = ok(d.kubectl(&["get", "ag", "-l", "app=demo", "--show-labels"]));
    assert!(labelled.contains("app=demo"), "labels come from rows[].object:\n{labelled}");
    let none = d.kubectl(&["get", "ag", "-l", "app=other"]);
    assert!(String::from_utf8_lossy(&none.stderr).contains("No resources found"));

    let all = ok(d.kubectl(&["get", "hive"]));
    assert!(all.contains("agent.hive.dev/k1"), "{all}");

    assert_eq!(ok(d.kubectl(&["delete", "agent", "k1"])).trim(), "agent.hive.dev \"k1\" deleted");
    let err = fails(d.kubectl(&["get", "agent", "k1"]));
    assert!(err.contains("Error from server (NotFound): agents.hive.dev \"k1\" not found"), "{err}");
}

#[test]
fn server_side_apply_and_conflicts() {
    let d = Daemon::start();
    let file = d.dir.join("agent.yaml");
    std::fs::write(&file, AGENT_YAML).unwrap();
    let f = file.to_str().unwrap();
    let out = ok(d.kubectl(&["apply", "--server-side", "-f", f]));
    assert_eq!(out.trim(), "agent.hive.dev/k1 serverside-applied");
    std::fs::write(&file, AGENT_YAML.replace("app: demo", "app: other")).unwrap();
    let err = fails(d.kubectl(&["apply", "--server-side", "--field-manager=intruder", "-f", f]));
    assert!(err.contains("conflict"), "{err}");
    ok(d.kubectl(&["apply", "--server-side", "--field-manager=intruder", "--force-conflicts", "-f", f]));
    let labels = ok(d.kubectl(&["get", "agent", "k1", "-o", "jsonpath={.metadata.labels.app}"]));
    assert_eq!(labels, "other");
}

#[test]
fn patch_replace_stale_and_strict_validation() {
    let d = Daemon::start();
    ok(d.kubectl_stdin(&["apply", "-f", "-"], Some(AGENT_YAML)));
    ok(d.kubectl(&["patch", "agent", "k1", "--type", "merge", "-p", r#"{"spec":{"wanted":"Offline"}}"#]));
    assert_eq!(ok(d.kubectl(&["get", "agent", "k1", "-o", "jsonpath={.spec.wanted}"])), "Offline");
    ok(d.kubectl(&[
        "patch",
        "agent",
        "k1",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/wanted","value":"Up"}]"#,
    ]));
    assert_eq!(ok(d.kubectl(&["get", "agent", "k1", "-o", "jsonpath={.spec.wanted}"])), "Up");
    let err = fails(d.kubectl(&["patch", "agent", "k1", "-p", r#"{"spec":{"wanted":"Up"}}"#]));
    assert!(err.contains("strategic"), "{err}");

    // replace with a stale resourceVersion
    let current = ok(d.kubectl(&["get", "agent", "k1", "-o", "yaml"]));
    ok(d.kubectl(&["label", "agent", "k1", "tier=gold"]));
    let stale = d.dir.join("stale.yaml");
    std::fs::write(&stale, current).unwrap();
    let err = fails(d.kubectl(&["replace", "-f", stale.to_str().unwrap()]));
    assert!(err.contains("Conflict") && err.contains("the object has been modified"), "{err}");

    // an unknown field under Strict (kubectl's default --validate=strict)
    let bogus = AGENT_YAML.replace("  wanted: Up", "  wanted: Up\n  bogus: 1");
    let err = fails(d.kubectl_stdin(&["apply", "-f", "-"], Some(&bogus)));
    assert!(err.contains("unknown field \"spec.bogus\""), "{err}");
}

#[test]
fn wait_and_explain() {
    let d = Daemon::start();
    ok(d.kubectl_stdin(&["apply", "-f", "-"], Some(AGENT_YAML)));
    // Mark Ready through the status subresource, as a controller would.
    ok(d.kubectl(&[
        "patch", "agent", "k1", "--subresource=status", "--type", "merge", "-p",
        r#"{"status":{"observedGeneration":1,"conditions":[{"type":"Ready","status":"True","reason":"Running","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
    ]));
    let out = ok(d.kubectl(&["wait", "--for=condition=Ready", "agent/k1", "--timeout=20s"]));
    assert_eq!(out.trim(), "agent.hive.dev/k1 condition met");
    let out = ok(d.kubectl(&["wait", "--for=jsonpath={.spec.wanted}=Up", "agent/k1", "--timeout=20s"]));
    assert!(out.contains("condition met"), "{out}");
    let explain = ok(d.kubectl(&["explain", "agent.spec"]));
    assert!(explain.contains("wanted"), "{explain}");
    let explain = ok(d.kubectl(&["explain", "agents"]));
    assert!(explain.contains("KIND:") && explain.contains("Agent"), "{explain}");
}

#[test]
fn get_watch_streams_table_rows() {
    let d = Daemon::start();
    ok(d.kubectl_stdin(&["apply", "-f", "-"], Some(AGENT_YAML)));
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&d.kubeconfig)
        .arg("--cache-dir")
        .arg(d.dir.join("kube-cache"))
        .args(["get", "agents", "-w", "--request-timeout=0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    ok(d.kubectl(&["label", "agent", "k1", "tier=gold"]));
    std::thread::sleep(std::time::Duration::from_secs(2));
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 3, "header, initial row and the update:\n{text}");
    assert!(lines[0].starts_with("NAME"), "{text}");
    assert_eq!(lines.iter().filter(|l| l.starts_with("NAME")).count(), 1, "one header only:\n{text}");
    assert!(lines[1..].iter().all(|l| l.starts_with("k1")), "{text}");
}

#[test]
fn describe_diff_dry_run_and_chunked_lists() {
    let d = Daemon::start();
    ok(d.kubectl_stdin(&["apply", "-f", "-"], Some(AGENT_YAML)));
    let described = ok(d.kubectl(&["describe", "agent", "k1"]));
    assert!(described.contains("Name:") && described.contains("k1"), "{described}");
    assert!(described.contains("Wanted:"), "the generic describer prints the spec:\n{described}");

    let file = d.dir.join("agent.yaml");
    std::fs::write(&file, AGENT_YAML).unwrap();
    let f = file.to_str().unwrap();
    let same = d.kubectl(&["diff", "-f", f]);
    assert_eq!(same.status.code(), Some(0), "no difference: {}", String::from_utf8_lossy(&same.stderr));
    std::fs::write(&file, AGENT_YAML.replace("wanted: Up", "wanted: Offline")).unwrap();
    let differs = d.kubectl(&["diff", "-f", f]);
    assert_eq!(differs.status.code(), Some(1), "{}", String::from_utf8_lossy(&differs.stderr));
    assert!(String::from_utf8_lossy(&differs.stdout).contains("wanted: Offline"));

    let dry = ok(d.kubectl(&["apply", "--dry-run=server", "-f", f]));
    assert_eq!(dry.trim(), "agent.hive.dev/k1 configured (server dry run)");
    assert_eq!(
        ok(d.kubectl(&["get", "agent", "k1", "-o", "jsonpath={.spec.wanted}"])),
        "Up",
        "dry run changed nothing"
    );

    for i in 0..5 {
        ok(d.kubectl_stdin(
            &["apply", "-f", "-"],
            Some(&AGENT_YAML.replace("name: k1", &format!("name: chunk{i}"))),
        ));
    }
    let chunked = ok(d.kubectl(&["get", "agents", "--chunk-size=2", "-o", "name"]));
    assert_eq!(chunked.lines().count(), 6, "{chunked}");
}

#[tokio::test]
async fn describe_lists_the_objects_events() {
    let d = Daemon::start();
    ok(d.kubectl_stdin(&["apply", "-f", "-"], Some(AGENT_YAML)));
    let api = d.client();
    let agent = api.get("/apis/hive.dev/v1/agents/k1").await.body;
    for (name, about, reason) in [("k1-started", "k1", "Started"), ("other-started", "other", "Started")] {
        let uid = if about == "k1" { agent["metadata"]["uid"].clone() } else { serde_json::json!("x") };
        let event = serde_json::json!({
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
            "involvedObject": {"apiVersion": "hive.dev/v1", "kind": "Agent", "name": about, "uid": uid},
            "reason": reason, "message": format!("{about} started generation 1"), "type": "Normal", "count": 3,
            "firstTimestamp": "2026-11-29T10:00:00Z", "lastTimestamp": "2026-11-29T10:05:00Z",
            "source": {"component": "hive-test"}
        });
        let created = api.post("/api/v1/events", &event).await;
        assert_eq!(created.code, 201, "{:?}", created.body);
    }
    let selected =
        api.get("/api/v1/events?fieldSelector=involvedObject.name%3Dk1%2CinvolvedObject.kind%3DAgent").await;
    assert_eq!(selected.body["items"].as_array().unwrap().len(), 1, "{:?}", selected.body);
    let described = ok(d.kubectl(&["describe", "agent", "k1"]));
    assert!(described.contains("Events:"), "{described}");
    assert!(described.contains("k1 started generation 1"), "{described}");
    assert!(!described.contains("other started"), "only k1's events:\n{described}");
    let listed = ok(d.kubectl(&["get", "events"]));
    assert!(listed.contains("Started"), "{listed}");
    let hive_described = ok(d.hive(&["describe", "agent", "k1"]));
    assert!(hive_described.contains("k1 started generation 1"), "{hive_described}");
    let events = ok(d.hive(&["events", "agent/k1"]));
    assert!(events.contains("Started") && events.contains("agent/k1"), "{events}");
    assert!(!events.contains("other"), "{events}");
    let all = ok(d.hive(&["get", "events", "-o", "name"]));
    assert_eq!(all.lines().count(), 2, "{all}");
}

/// Polls `lines` (what a running kubectl printed so far) until one satisfies `want`.
fn wait_for_line(lines: &std::sync::Mutex<Vec<String>>, what: &str, want: impl Fn(&[String]) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        if want(&lines.lock().unwrap()) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}:\n{:?}",
            lines.lock().unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `kubectl get agents -l team=a -w` shows an agent relabelled out of the selection as
/// deleted and one relabelled back as added, as with kube-apiserver.
#[test]
fn kubectl_watch_with_a_label_selector_shows_an_agent_leaving_and_rejoining() {
    use std::io::BufRead;
    let d = Daemon::start();
    ok(d.kubectl_stdin(&["apply", "-f", "-"], Some(&AGENT_YAML.replace("app: demo", "team: a"))));
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&d.kubeconfig)
        .arg("--cache-dir")
        .arg(d.dir.join("kube-cache"))
        .args(["get", "agents", "-l", "team=a", "-w", "--output-watch-events", "--request-timeout=0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let stdout = child.stdout.take().unwrap();
    let reader = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        })
    };
    let count = |lines: &[String], event: &str| {
        lines.iter().filter(|l| l.split_whitespace().take(2).eq([event, "k1"])).count()
    };
    wait_for_line(&lines, "the initial ADDED row", |l| count(l, "ADDED") == 1);
    ok(d.kubectl(&["label", "agent", "k1", "team=b", "--overwrite"]));
    wait_for_line(&lines, "a DELETED row once k1 left team a", |l| count(l, "DELETED") == 1);
    ok(d.kubectl(&["label", "agent", "k1", "team=a", "--overwrite"]));
    wait_for_line(&lines, "an ADDED row once k1 is back in team a", |l| count(l, "ADDED") == 2);
    let _ = child.kill();
    let _ = child.wait();
    reader.join().unwrap();
    let lines = lines.lock().unwrap();
    assert!(lines[0].starts_with("EVENT"), "{lines:?}");
    let deleted = lines.iter().position(|l| l.starts_with("DELETED")).unwrap();
    let added_again = lines.iter().rposition(|l| l.starts_with("ADDED")).unwrap();
    assert!(deleted < added_again, "{lines:?}");
}

/// kubectl uses aggregated discovery: `api-resources` works from `/api` and `/apis` alone,
/// with no per-group legacy request (`/apis/hive.dev/v1`, `/api/v1`) in its log.
#[test]
fn api_resources_comes_from_aggregated_discovery_alone() {
    let d = Daemon::start();
    let out = d.kubectl(&["api-resources", "-v=6"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = ok(out);
    for line in ["agents", "ag", "jobs", "approvals", "nodes", "fleetcommands", "providers", "events"] {
        assert!(stdout.contains(line), "{line} missing:\n{stdout}");
    }
    assert!(stderr.contains("/apis?timeout="), "kubectl logs its discovery requests at -v=6:\n{stderr}");
    for legacy in ["/apis/hive.dev/v1?timeout=", "/api/v1?timeout="] {
        assert!(!stderr.contains(legacy), "kubectl fell back to legacy discovery ({legacy}):\n{stderr}");
    }
}

/// `kubectl apply` of a manifest with a misspelt kind fails with kubectl's usual "no
/// matches for kind", not "failed to download openapi"; good manifests and `explain` still
/// work.
#[test]
fn apply_of_a_misspelt_kind_says_no_matches_for_kind() {
    let d = Daemon::start();
    let err = fails(
        d.kubectl_stdin(&["apply", "-f", "-"], Some(&AGENT_YAML.replace("kind: Agent", "kind: Agnet"))),
    );
    assert!(err.contains(r#"no matches for kind "Agnet" in version "hive.dev/v1""#), "{err}");
    assert!(!err.contains("openapi"), "{err}");
    assert_eq!(
        ok(d.kubectl_stdin(&["apply", "-f", "-"], Some(AGENT_YAML))).trim(),
        "agent.hive.dev/k1 created"
    );
    let changed = AGENT_YAML.replace("wanted: Up", "wanted: Offline");
    assert_eq!(
        ok(d.kubectl_stdin(&["apply", "-f", "-"], Some(&changed))).trim(),
        "agent.hive.dev/k1 configured"
    );
    let explain = ok(d.kubectl(&["explain", "agent.spec"]));
    assert!(explain.contains("wanted"), "{explain}");
}

// Issue 31, item 1: `metadata.generateName` was refused (`metadata.name: Required
// value`); kube-apiserver completes the prefix with 5 random characters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_name_makes_a_new_name_per_create_for_kubectl_and_jobs() {
    let d = Daemon::start();
    let generated = AGENT_YAML.replace("  name: k1\n", "  generateName: web-\n");
    let mut names = Vec::new();
    for _ in 0..3 {
        let out = ok(d.kubectl_stdin(&["create", "-f", "-", "-o", "name"], Some(&generated)));
        let name = out.trim().strip_prefix("agent.hive.dev/").unwrap_or_else(|| panic!("{out}")).to_string();
        assert!(name.starts_with("web-") && name.len() == 9, "{name}");
        names.push(name);
    }
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 3, "three creates, three names: {names:?}");
    let api = d.client();
    for name in &names {
        let agent = api.get(&format!("/apis/hive.dev/v1/agents/{name}")).await.body;
        assert_eq!(agent["metadata"]["generateName"], "web-", "{agent}");
    }
    // A name given with it wins.
    let both = AGENT_YAML.replace("  name: k1\n", "  name: fixed\n  generateName: web-\n");
    assert_eq!(
        ok(d.kubectl_stdin(&["create", "-f", "-", "-o", "name"], Some(&both))).trim(),
        "agent.hive.dev/fixed"
    );
    // A prefix no name can start with is refused naming the field; nothing is stored.
    let bad = AGENT_YAML.replace("  name: k1\n", "  generateName: Web_\n");
    let err = fails(d.kubectl_stdin(&["create", "-f", "-"], Some(&bad)));
    assert!(err.contains("metadata.generateName"), "{err}");
    let count = api.get("/apis/hive.dev/v1/agents").await.body["items"].as_array().unwrap().len();
    assert_eq!(count, 4, "only the four good creates stored");

    // A Job: a template Job and a custom DAG each take the prefix.
    let template = serde_json::json!({"apiVersion": "hive.dev/v1", "kind": "Job",
        "metadata": {"generateName": "nightly-"}, "spec": {"template": "Reconcile", "agents": ["fixed"]}});
    let reply = api.post("/apis/hive.dev/v1/jobs", &template).await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    assert!(reply.body["metadata"]["name"].as_str().unwrap().starts_with("nightly-"), "{:?}", reply.body);
    let custom = serde_json::json!({"apiVersion": "hive.dev/v1", "kind": "Job",
        "metadata": {"generateName": "by-hand-"},
        "spec": {"template": "Reconcile", "nodes": [{"id": "r", "kind": "Reconcile", "agent": "fixed"}]}});
    let reply = api.post("/apis/hive.dev/v1/jobs", &custom).await;
    assert_eq!(reply.code, 201, "{:?}", reply.body);
    assert!(reply.body["metadata"]["name"].as_str().unwrap().starts_with("by-hand-"), "{:?}", reply.body);
}

#[test]
fn server_side_apply_after_client_side_apply_migrates_silently_and_partial_appliers_own_one_field() {
    let d = Daemon::start();
    let file = d.dir.join("agent.yaml");
    std::fs::write(&file, AGENT_YAML).unwrap();
    let f = file.to_str().unwrap();
    ok(d.kubectl(&["apply", "-f", f]));
    // kubectl's switch to server-side apply migrates the client-side manager's fields
    // with a JSON patch of managedFields: no warning, and the fields are the apply's.
    let out = d.kubectl(&["apply", "--server-side", "-f", f]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(ok(out).trim(), "agent.hive.dev/k1 serverside-applied");
    assert!(!stderr.contains("failed to migrate"), "{stderr}");
    assert!(stderr.trim().is_empty(), "nothing on stderr: {stderr}");
    let managed = ok(d.kubectl(&["get", "agent", "k1", "--show-managed-fields", "-o", "json"]));
    let managed: serde_json::Value = serde_json::from_str(&managed).unwrap();
    let managers: Vec<&str> = managed["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert_eq!(
        managers,
        ["kubectl"],
        "the client-side manager's fields migrated to kubectl's apply: {managed}"
    );
    // Migrated, the next server-side apply changes nothing and warns of nothing.
    let out = d.kubectl(&["apply", "--server-side", "-f", f]);
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let after: serde_json::Value =
        serde_json::from_str(&ok(d.kubectl(&["get", "agent", "k1", "--show-managed-fields", "-o", "json"])))
            .unwrap();
    assert_eq!(after["metadata"]["resourceVersion"], managed["metadata"]["resourceVersion"], "{after}");

    // A field manager that applies only a label: judged on the merged object, so the
    // spec another manager owns is not "required" of it.
    let label = "apiVersion: hive.dev/v1\nkind: Agent\nmetadata:\n  name: k1\n  labels:\n    tier: gold\n";
    let out =
        d.kubectl_stdin(&["apply", "--server-side", "--field-manager=labeller", "-f", "-"], Some(label));
    assert_eq!(ok(out).trim(), "agent.hive.dev/k1 serverside-applied");
    let labels = ok(d.kubectl(&["get", "agent", "k1", "-o", "jsonpath={.metadata.labels}"]));
    assert!(labels.contains("\"tier\":\"gold\"") && labels.contains("\"app\":\"demo\""), "{labels}");
    let rev = ok(d.kubectl(&["get", "agent", "k1", "-o", "jsonpath={.spec.config.rev}"]));
    assert_eq!(rev, "main", "the spec is the first manager's, untouched");
    // A partial apply of a name that does not exist is still refused for what is
    // missing, and creates nothing.
    let missing = label.replace("name: k1", "name: nobody");
    let err = fails(
        d.kubectl_stdin(&["apply", "--server-side", "--field-manager=labeller", "-f", "-"], Some(&missing)),
    );
    assert!(err.contains("spec.config.repo"), "{err}");
    fails(d.kubectl(&["get", "agent", "nobody"]));
}
