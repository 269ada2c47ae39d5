//! The meta repo (the deploy audit trail) of replicas on etcd: every commit is recorded
//! in etcd before it is acknowledged, and a new leader brings its own repo to that
//! record before it touches it, so a failover neither forks the trail nor loses any of
//! it, whichever replica leads and whichever one a client asks.

use hive::store::etcd::cluster::LocalCluster;
use serde_json::{json, Value};

use crate::agents::config_repo;
use crate::ha::{following, leading};
use crate::harness::{eventually, Daemon};

/// Starts a replica on `store` that runs the Agent controller (it builds and locks the
/// agents created through the API).
fn replica(store: &str) -> Daemon {
    Daemon::start_with(&["--store", store, "--agent-controller=true"])
}

/// The deploy audit trail read through `daemon` (forwarded to the leader when it does
/// not lead), oldest first, as (commit, op, agents); `None` while no replica leads.
async fn trail(daemon: &Daemon) -> Option<Vec<(String, String, Vec<String>)>> {
    let answer = daemon.client().get("/hive/v1/audit?limit=1000").await;
    if answer.code != 200 {
        return None;
    }
    let mut entries: Vec<(String, String, Vec<String>)> = answer.body["items"]
        .as_array()?
        .iter()
        .map(|e| {
            let agents = e["agents"].as_array().into_iter().flatten().filter_map(Value::as_str);
            (
                e["commit"].as_str().unwrap_or_default().to_string(),
                e["op"].as_str().unwrap_or_default().to_string(),
                agents.map(str::to_string).collect(),
            )
        })
        .collect();
    entries.reverse();
    Some(entries)
}

/// Creates agent `name` (Offline: built, locked in the meta flake, left stopped) through
/// `daemon`, and waits until the trail read through it has the commit that added it;
/// returns the trail.
async fn add_agent(
    daemon: &Daemon,
    repo: &std::path::Path,
    name: &str,
) -> Vec<(String, String, Vec<String>)> {
    let agent = json!({"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
        "spec": {"wanted": "Offline", "config": {"repo": repo.display().to_string(), "rev": "v1"},
                 "runtime": {"type": "process", "gracefulStopSeconds": 5, "process": {"command": ["sh", "run.sh"]}}}});
    let created = daemon.client().post("/apis/hive.dev/v1/agents", &agent).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    eventually(&format!("the commit adding {name} in the audit trail"), || async {
        let trail = trail(daemon).await?;
        trail.iter().any(|(_, op, agents)| op == "sync" && agents.iter().any(|a| a == name)).then_some(trail)
    })
    .await
}

/// Asserts that `later` is `earlier` followed by more commits: no commit lost or
/// rewritten (same shas, same order).
fn extends(earlier: &[(String, String, Vec<String>)], later: &[(String, String, Vec<String>)]) {
    assert!(
        later.len() > earlier.len() && later[..earlier.len()] == *earlier,
        "the trail forked or lost commits:\nbefore: {earlier:#?}\nafter: {later:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deploy_audit_trail_survives_failovers_without_forking() {
    let cluster = LocalCluster::start(1).unwrap();
    let store = cluster.url();
    let repos = tempfile::tempdir().unwrap();
    let repo = config_repo(repos.path());
    let mut first = replica(&store);
    leading(&first).await;
    let mut second = replica(&store);
    following(&second).await;

    // The first leader's init and the commit adding `a`, read through the follower.
    let before = add_agent(&second, &repo, "a").await;
    assert_eq!(before.first().map(|(_, op, _)| op.as_str()), Some("init"), "{before:#?}");

    // The leader dies; the other replica leads, on a meta repo that had no history.
    first.kill9();
    leading(&second).await;
    let after = add_agent(&second, &repo, "b").await;
    extends(&before, &after);

    // The first host comes back as a follower, with its older history; the second dies
    // and the first leads again: its repo is brought to what the second recorded.
    first.restart();
    following(&first).await;
    second.kill9();
    leading(&first).await;
    let last = add_agent(&first, &repo, "c").await;
    extends(&after, &last);
    second.restart();
    following(&second).await;
    let through_follower = eventually("the trail through the follower", || trail(&second)).await;
    assert_eq!(through_follower, last, "every replica reads one trail");
}
