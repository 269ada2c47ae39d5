//! `hive serve --store etcd://…` with several replicas on one etcd cluster (Debian's
//! etcd, three members on 127.0.0.1): one leads and serves, the others stand by and one
//! of them takes over when the leader dies, with every acknowledged write.

use std::time::Instant;

use hive::store::etcd::cluster::LocalCluster;

use crate::harness::{agent, Daemon};

/// The epoch a daemon's banner says it leads under.
fn epoch(daemon: &Daemon) -> u64 {
    let lines = daemon.stdout_lines();
    let line = lines.iter().find_map(|l| l.strip_prefix("hive: leading (epoch ")).expect("a leading line");
    line.trim_end_matches(')').parse().expect("an epoch")
}

/// A second replica on `store`, started on a thread (it serves only once it leads), once
/// its log says it stands by; its state directory lives as long as the first value.
async fn standby(store: &str) -> (tempfile::TempDir, std::thread::JoinHandle<Result<Daemon, String>>) {
    let dir = tempfile::tempdir().unwrap();
    let (path, flags) = (dir.path().to_path_buf(), store.to_owned());
    let standby = std::thread::spawn(move || Daemon::spawn(&path, &["--store", &flags]));
    let log = dir.path().join("daemon.log");
    crate::harness::eventually("the standby to stand by", || {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        std::future::ready(log.contains("standing by").then_some(()))
    })
    .await;
    (dir, standby)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_when_the_leader_is_killed_with_every_acknowledged_write() {
    let cluster = LocalCluster::start(3).unwrap();
    let store = cluster.url();
    let mut leader = Daemon::start_with(&["--store", &store]);
    let first_epoch = epoch(&leader);

    let (_standby_dir, standby) = standby(&store).await;

    let api = leader.client();
    for i in 0..16 {
        let created = api.post("/apis/hive.dev/v1/agents", &agent(&format!("a{i}"))).await;
        assert_eq!(created.code, 201, "{:?}", created.body);
    }
    leader.kill9();
    let killed = Instant::now();
    let new_leader = tokio::task::spawn_blocking(move || standby.join().unwrap()).await.unwrap().unwrap();
    eprintln!("the standby served {:?} after the leader was killed", killed.elapsed());
    assert!(epoch(&new_leader) > first_epoch);

    let listed = new_leader.client().get("/apis/hive.dev/v1/agents").await;
    assert_eq!(listed.code, 200);
    let mut names: Vec<String> = listed.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["metadata"]["name"].as_str().unwrap().into())
        .collect();
    names.sort();
    let mut wanted: Vec<String> = (0..16).map(|i| format!("a{i}")).collect();
    wanted.sort();
    assert_eq!(names, wanted, "every acknowledged write is there after the failover");
    // And the new leader takes writes.
    let created = new_leader.client().post("/apis/hive.dev/v1/agents", &agent("after")).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
}

/// Sends `signal` (`-STOP`, `-CONT`) to `pid`.
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_is_replaced_and_exits_when_it_resumes() {
    let cluster = LocalCluster::start(1).unwrap();
    let store = cluster.url();
    let mut paused = Daemon::start_with(&["--store", &store]);
    let first_epoch = epoch(&paused);
    let (_standby_dir, standby) = standby(&store).await;

    signal(paused.pid(), "-STOP");
    let new_leader = tokio::task::spawn_blocking(move || standby.join().unwrap()).await.unwrap().unwrap();
    assert!(epoch(&new_leader) > first_epoch);
    let created = new_leader.client().post("/apis/hive.dev/v1/agents", &agent("while-paused")).await;
    assert_eq!(created.code, 201, "{:?}", created.body);

    // Resumed, the old leader finds its leadership gone and exits (75: run me again).
    signal(paused.pid(), "-CONT");
    let status = tokio::task::spawn_blocking(move || paused.wait_exit(std::time::Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the deposed leader exits");
    assert_eq!(status.code(), Some(75), "{status:?}");
    let listed = new_leader.client().get("/apis/hive.dev/v1/agents/while-paused").await;
    assert_eq!(listed.code, 200, "the new leader's write stands");
}
