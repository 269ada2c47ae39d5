//! Durability: many concurrent writers, `kill -9` mid-load, restart — every
//! acknowledged write is there and revisions never go backwards.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::{agent, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_kill_9() {
    let mut d = Daemon::start();
    let api = d.client();
    let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut writers = Vec::new();
    for w in 0..16 {
        let api = api.clone();
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            // Bounded: stops by itself at the deadline, or when the daemon is gone.
            while Instant::now() < deadline + Duration::from_secs(2) && i < 10_000 {
                let name = format!("w{w}-{i}");
                let req = api.http.post(format!("{}/apis/hive.dev/v1/agents", api.base)).json(&agent(&name));
                let Ok(resp) = req.bearer_auth(api_token(&api)).send().await else { break };
                if resp.status().as_u16() != 201 {
                    break;
                }
                let Ok(body) = resp.json::<serde_json::Value>().await else { break };
                let rv = body["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
                acked.lock().unwrap().push((name, rv));
                i += 1;
            }
        }));
    }
    tokio::time::sleep_until(deadline.into()).await;
    d.kill9();
    for w in writers {
        let _ = w.await;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 50, "the load produced too few writes: {}", acked.len());
    let max_rv = acked.iter().map(|(_, rv)| *rv).max().unwrap();

    d.restart();
    let api = d.client();
    let list = api.get("/apis/hive.dev/v1/agents").await;
    let list_rv: u64 = list.body["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    assert!(list_rv >= max_rv, "revision went backwards: {list_rv} < {max_rv}");
    let present: std::collections::HashSet<&str> = list.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    let lost: Vec<&String> = acked.iter().map(|(n, _)| n).filter(|n| !present.contains(n.as_str())).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    let next = api.post("/apis/hive.dev/v1/agents", &agent("after-restart")).await;
    let next_rv: u64 = next.body["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    assert!(next_rv > list_rv, "a new write must get a newer revision");
}

fn api_token(api: &crate::harness::Api) -> String {
    api.token().to_string()
}

#[test]
fn corrupt_database_is_a_hard_error_until_reset() {
    let mut d = Daemon::start();
    d.kill9();
    let db = d.dir.join("hive.redb");
    std::fs::write(&db, b"this is not a redb database at all, not even close").unwrap();
    let err = Daemon::spawn(&d.dir, &[]).err().expect("a corrupt database must stop the start");
    assert!(err.contains("hive.redb"), "the error names the file:\n{err}");
    assert_eq!(
        std::fs::read(&db).unwrap(),
        b"this is not a redb database at all, not even close",
        "state unchanged"
    );
    let fresh = Daemon::spawn(&d.dir, &["--reset-state"]).expect("--reset-state clears it");
    drop(fresh);
}

// Regression (issue 14, item 8): `--reset-state` deleted hive.redb before it found
// tokens.json corrupt and refused to start — the reset destroyed state and still failed.
#[test]
fn reset_state_with_corrupt_tokens_refuses_before_deleting_anything() {
    let mut d = Daemon::start();
    d.kill9();
    let db = d.dir.join("hive.redb");
    let db_before = std::fs::read(&db).unwrap();
    std::fs::write(d.dir.join("tokens.json"), b"{ not json").unwrap();
    let err = Daemon::spawn(&d.dir, &["--reset-state"]).err().expect("corrupt tokens must stop the start");
    assert!(err.contains("tokens.json"), "the error names the file:\n{err}");
    // Compared as a whole, not printed: a failure would dump megabytes.
    assert!(std::fs::read(&db).unwrap() == db_before, "the database was changed by a refused start");
}
