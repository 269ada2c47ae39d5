//! deploy/ha-docker.sh, run as deploy/ha.md's "Example: Docker" runs it: three etcd
//! members and three replicas of the image deploy/Containerfile builds, on a private
//! network, reached through the published ports. Opt-in (`HIVE_DOCKER_TESTS=1`), like
//! the other Docker tests.
//!
//! Everything the script creates is named after a prefix no other run uses, and
//! [`Cleanup`] removes it (and the hive image, built under a tag of this run) from `Drop`,
//! also when the test fails. The etcd image, FROM scratch with this host's
//! `/usr/bin/etcd`, is tagged by the binary's content and kept, as the fleet tests keep
//! their node image.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fleet_docker::{content_hash, docker_tests_enabled, imported_image, install};
use crate::ha::{offline, set_wanted};
use crate::harness::{hive_bin, Api};

/// A bound on the whole test, image builds included.
const TEST_TIMEOUT: Duration = Duration::from_secs(240);
/// How long the survivors may take to agree on a new leader after the kill, and it to
/// start leading (about 3 s on a 2-core machine).
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a Job of one SetWanted node may take to be Done, or a restarted replica to
/// follow.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Where Debian's etcd (3.4, linking only libc) is.
const ETCD: &str = "/usr/bin/etcd";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn docker(args: &[&str]) -> Output {
    run(Command::new("docker").args(args))
}

fn deploy(file: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(file)
}

/// The etcd image: `hive-test-etcd:<content hash of /usr/bin/etcd>`, FROM scratch, with
/// etcd at /usr/bin/etcd on its PATH (as `gcr.io/etcd-development/etcd` has it at
/// /usr/local/bin/etcd), so the script runs it by name.
fn etcd_image() -> String {
    let binary = std::fs::read(ETCD).unwrap_or_else(|e| panic!("{ETCD} (Debian: etcd-server): {e}"));
    let tag = format!("hive-test-etcd:{}", content_hash(&binary));
    imported_image(&tag, "etcd for the hive tests", |rootfs| {
        install(Path::new(ETCD), &rootfs.join("usr/bin/etcd"), rootfs)
    })
}

/// Builds the hive image as deploy/ha.md says (deploy/rootfs.sh, then `docker build -f
/// deploy/Containerfile`) under `tag`.
fn build_hive_image(tag: &str) {
    let temp = tempfile::tempdir().expect("tempdir");
    let rootfs = temp.path().join("rootfs");
    let out = run(Command::new("sh").arg(deploy("rootfs.sh")).arg(hive_bin()).arg(&rootfs));
    assert!(out.status.success(), "deploy/rootfs.sh: {}", text(&out.stderr));
    let out = run(Command::new("docker")
        .args(["build", "-q", "-f"])
        .arg(deploy("Containerfile"))
        .args(["-t", tag])
        .arg(&rootfs));
    assert!(out.status.success(), "docker build: {}", text(&out.stderr));
}

/// One run of the example: its prefix, its images and its ports.
#[derive(Clone)]
struct Example {
    name: String,
    hive_image: String,
    etcd_image: String,
    port_base: u16,
}

impl Example {
    fn replica(&self, n: usize) -> String {
        format!("{}-{n}", self.name)
    }

    /// Everything the script names after the prefix: the six containers, whose volumes
    /// bear their names.
    fn containers(&self) -> Vec<String> {
        (1..=3).flat_map(|n| [format!("{}-etcd-{n}", self.name), self.replica(n)]).collect()
    }

    /// Runs `deploy/ha-docker.sh VERB` with this run's settings.
    fn script(&self, verb: &str) -> Output {
        run(Command::new("sh")
            .arg(deploy("ha-docker.sh"))
            .arg(verb)
            .env("NAME", &self.name)
            .env("HIVE_IMAGE", &self.hive_image)
            .env("ETCD_IMAGE", &self.etcd_image)
            .env("PORT_BASE", self.port_base.to_string()))
    }

    /// Copies the admin kubeconfig out of `container` to `to` (`docker cp`, as
    /// deploy/ha.md says), once the replica has written it. A replica may exit at start
    /// and be restarted by its restart policy, writing it only then: replicas that start
    /// in the same second mint admin tokens of the same name (`admin-<time>-<pid>`, and
    /// the pid is the same in every container), and all but the first exit.
    async fn copy_kubeconfig(&self, container: &str, to: &Path) {
        let from = format!("{container}:/var/lib/hive/kubeconfig.yaml");
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let out = docker(&["cp", &from, to.to_str().unwrap()]);
            if out.status.success() {
                return;
            }
            assert!(Instant::now() < deadline, "docker cp {from}: {}", text(&out.stderr));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Removes what the run created whatever happened: the containers (with their
/// anonymous volumes), their named volumes, the network and the hive image.
struct Cleanup(Example);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let example = &self.0;
        for container in example.containers() {
            let _ = docker(&["rm", "-f", "-v", &container]);
        }
        for volume in example.containers() {
            let _ = docker(&["volume", "rm", &volume]);
        }
        let _ = docker(&["network", "rm", &example.name]);
        let _ = docker(&["rmi", "-f", &example.hive_image]);
    }
}

/// The first of three consecutive TCP ports free on 127.0.0.1.
fn three_free_ports() -> u16 {
    use std::net::TcpListener;
    for _ in 0..100 {
        let first = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().unwrap().port();
        let Some(last) = first.checked_add(2) else { continue };
        let free = (first..=last).all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok());
        if free {
            return first;
        }
    }
    panic!("no three consecutive free ports on 127.0.0.1");
}

/// Who a replica says leads, from the leader line of its `/readyz?verbose`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Says {
    /// `this replica (NAME) leads`.
    Me(String),
    /// `NAME (URL) leads`.
    Other(String),
    /// `no replica leads right now`, or it does not answer.
    Nobody,
}

async fn says(api: &Api) -> Says {
    let probe = api.http.get(format!("{}/readyz?verbose", api.base)).timeout(Duration::from_secs(5));
    let Ok(reply) = probe.send().await else {
        return Says::Nobody;
    };
    let body = reply.text().await.unwrap_or_default();
    let Some(line) = body.lines().find_map(|l| l.strip_prefix("[+]leader ok: ")) else {
        return Says::Nobody;
    };
    if let Some(rest) = line.strip_prefix("this replica (") {
        return Says::Me(rest.trim_end_matches(") leads").to_string());
    }
    match line.split_once(" (") {
        Some((name, _)) if line.ends_with(" leads") => Says::Other(name.to_string()),
        _ => Says::Nobody,
    }
}

/// Waits until the replicas `apis` agree: one says it leads, every other says that one
/// leads. Returns its index in `apis`.
async fn agreed_leader(apis: &[&Api], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let mut all = Vec::new();
        for api in apis {
            all.push(says(api).await);
        }
        let leaders: Vec<(usize, &String)> = all
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Says::Me(name) => Some((i, name)),
                _ => None,
            })
            .collect();
        assert!(leaders.len() <= 1, "two replicas say they lead: {all:?}");
        if let [(i, name)] = leaders[..] {
            let others_agree = all.iter().enumerate().all(|(j, s)| j == i || *s == Says::Other(name.clone()));
            if others_agree {
                return i;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the replicas did not agree on a leader within {within:?}: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the log of `container` holds `line`.
async fn wait_for_log(container: &str, line: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let out = docker(&["logs", container]);
        let logs = format!("{}{}", text(&out.stdout), text(&out.stderr));
        if logs.lines().any(|l| l.starts_with(line)) {
            return;
        }
        assert!(Instant::now() < deadline, "{container} did not log {line:?} within {within:?}:\n{logs}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates the Offline agent `name` through `api`.
async fn create_agent(api: &Api, name: &str) -> Value {
    let created = api.post("/apis/hive.dev/v1/agents", &offline(name)).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    created.body
}

/// Reads agent `name` through `api`: a quorum read, so it sees every acknowledged write.
async fn read_agent(api: &Api, name: &str) -> Value {
    let read = api.get(&format!("/apis/hive.dev/v1/agents/{name}")).await;
    assert_eq!(read.code, 200, "agent {name} through {}: {:?}", api.base, read.body);
    read.body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_etcd_members_and_three_replicas_in_docker_survive_a_killed_leader() {
    let test = "three_etcd_members_and_three_replicas_in_docker_survive_a_killed_leader";
    if !docker_tests_enabled(test) {
        return;
    }
    let started = Instant::now();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let run_id = format!("{}-{:04x}", std::process::id(), nanos & 0xffff);
    let mut example = Example {
        name: format!("hive-ha-test-{run_id}"),
        hive_image: format!("hive-ha-test:{run_id}"),
        etcd_image: String::new(),
        port_base: 0,
    };
    let _cleanup = Cleanup(example.clone());

    let body = async {
        let hive_image = example.hive_image.clone();
        example.etcd_image = tokio::task::spawn_blocking(move || {
            build_hive_image(&hive_image);
            etcd_image()
        })
        .await
        .expect("building the images");
        example.port_base = three_free_ports();
        eprintln!("ha_docker: images ready after {:?}", started.elapsed());

        // 1. `up`: it returns once a replica leads, and names it.
        let up = tokio::task::spawn_blocking({
            let example = example.clone();
            move || example.script("up")
        })
        .await
        .unwrap();
        let printed = text(&up.stdout);
        assert!(up.status.success(), "ha-docker.sh up:\n{printed}{}", text(&up.stderr));
        eprintln!("ha_docker: up after {:?}:\n{printed}", started.elapsed());

        // Each replica wrote its own admin kubeconfig; all name one CA, and each token
        // counts on every replica (one token store in etcd).
        let temp = tempfile::tempdir().expect("tempdir");
        let mut kubeconfigs = Vec::new();
        for n in 1..=3 {
            let path = temp.path().join(format!("kubeconfig-{n}.yaml"));
            example.copy_kubeconfig(&example.replica(n), &path).await;
            let resolved = hive::auth::kubeconfig::load(&path).and_then(|k| k.current()).expect("kubeconfig");
            kubeconfigs.push((path, resolved.token.expect("a token"), resolved.ca_pem.expect("a CA")));
        }
        let ca = kubeconfigs[0].2.clone();
        assert!(kubeconfigs.iter().all(|k| k.2 == ca), "every replica serves under one CA");
        let url = |i: usize| format!("https://127.0.0.1:{}", example.port_base + i as u16);
        for (_, token, _) in &kubeconfigs {
            for i in 0..3 {
                let api = Api::trusting(&ca, &url(i), Some(token));
                let listed = api.get("/apis/hive.dev/v1/agents").await;
                assert_eq!(
                    listed.code,
                    200,
                    "a replica's token through replica {}: {:?}",
                    i + 1,
                    listed.body
                );
            }
        }
        let apis: Vec<Api> = (0..3).map(|i| Api::trusting(&ca, &url(i), Some(&kubeconfigs[0].1))).collect();
        let all: Vec<&Api> = apis.iter().collect();

        // 2. Exactly one replica leads, and the others say it does.
        let leader = agreed_leader(&all, SETTLE_TIMEOUT).await;
        let Says::Me(leader_name) = says(&apis[leader]).await else { panic!("replica {} leads", leader + 1) };
        assert!(leader_name.starts_with(&format!("{}/", example.replica(leader + 1))), "{leader_name}");
        assert!(printed.contains(&format!("{} leads", example.replica(leader + 1))), "up names the leader");
        let status = example.script("status");
        assert!(status.status.success(), "ha-docker.sh status: {}", text(&status.stderr));
        let status = text(&status.stdout);
        assert_eq!(status.matches(&format!("this replica ({leader_name}) leads")).count(), 1, "{status}");
        assert_eq!(status.matches(&format!("{leader_name} (https://")).count(), 2, "{status}");

        // 3. An object created through a follower is read through the other two.
        let follower = (leader + 1) % 3;
        let before = create_agent(&apis[follower], "before-failover").await;
        for api in &apis {
            let read = read_agent(api, "before-failover").await;
            assert_eq!(read["metadata"]["uid"], before["metadata"]["uid"]);
        }

        // The clients deploy/ha.md shows: kubectl with any replica's kubeconfig against
        // another replica's port, and the hive CLI with its server moved to one.
        let cache = temp.path().join("kube-cache");
        let kubectl = run(Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfigs[2].0)
            .arg("--cache-dir")
            .arg(&cache)
            .args(["--server", &url(follower), "get", "agents", "-o", "name"]));
        assert_eq!(
            text(&kubectl.stdout).trim(),
            "agent.hive.dev/before-failover",
            "{}",
            text(&kubectl.stderr)
        );
        let moved = temp.path().join("kubeconfig-moved.yaml");
        let original = std::fs::read_to_string(&kubeconfigs[1].0).unwrap();
        assert!(original.contains("server: https://127.0.0.1:7443\n"), "{original}");
        std::fs::write(&moved, original.replace("https://127.0.0.1:7443\n", &format!("{}\n", url(leader))))
            .unwrap();
        let listed = run(Command::new(hive_bin())
            .arg("--kubeconfig")
            .arg(&moved)
            .args(["get", "agents", "-o", "name"]));
        assert!(
            text(&listed.stdout).contains("before-failover"),
            "{}{}",
            text(&listed.stdout),
            text(&listed.stderr)
        );

        // 4. The leader's container is killed. `docker kill` is a manual stop, which
        //    the restart policy does not undo (it restarts a replica that exits by
        //    itself, as a leader that cannot renew does): so the survivors must elect
        //    one of themselves, and the killed one stays down until it is started.
        let killed = example.replica(leader + 1);
        let out = docker(&["kill", &killed]);
        assert!(out.status.success(), "docker kill {killed}: {}", text(&out.stderr));
        let kill = Instant::now();
        let survivors: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
        let pair: Vec<&Api> = survivors.iter().map(|i| &apis[*i]).collect();
        let new_leader = survivors[agreed_leader(&pair, FAILOVER_TIMEOUT).await];
        let agreed = kill.elapsed();
        // /readyz names a replica as soon as it is elected; it takes Jobs once it has
        // started what the leader runs, when it prints `hive: leading` (until then a Job
        // gets a 503 with Retry-After).
        wait_for_log(&example.replica(new_leader + 1), "hive: leading", FAILOVER_TIMEOUT).await;
        eprintln!(
            "ha_docker: replica {} elected {agreed:?} after the kill, leading {:?} after it",
            new_leader + 1,
            kill.elapsed()
        );
        let running = docker(&["inspect", "-f", "{{.State.Running}}", &killed]);
        assert_eq!(text(&running.stdout).trim(), "false", "{killed} stays down");

        // 5. What was written is still there; a write through a survivor is read
        //    through the other; a Job posted through the follower runs on the new leader.
        let other = survivors.iter().copied().find(|i| *i != new_leader).unwrap();
        for i in &survivors {
            read_agent(&apis[*i], "before-failover").await;
        }
        let after = create_agent(&apis[other], "after-failover").await;
        let read = read_agent(&apis[new_leader], "after-failover").await;
        assert_eq!(read["metadata"]["uid"], after["metadata"]["uid"]);
        let posted =
            apis[other].post("/apis/hive.dev/v1/jobs", &set_wanted("after-failover", "after-failover")).await;
        assert_eq!(posted.code, 201, "a Job through the follower: {:?}", posted.body);
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let job = apis[new_leader].get("/apis/hive.dev/v1/jobs/after-failover").await;
            let phase = job.body["status"]["phase"].as_str().unwrap_or_default().to_string();
            assert!(!matches!(phase.as_str(), "Failed" | "Cancelled" | "Interrupted"), "{:?}", job.body);
            if phase == "Done" {
                break;
            }
            assert!(Instant::now() < deadline, "Job after-failover is not Done: {:?}", job.body);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // 6. Started again, the killed replica follows the new leader and serves both objects.
        let out = docker(&["start", &killed]);
        assert!(out.status.success(), "docker start {killed}: {}", text(&out.stderr));
        assert_eq!(agreed_leader(&all, SETTLE_TIMEOUT).await, new_leader, "the new leader keeps leading");
        for name in ["before-failover", "after-failover"] {
            read_agent(&apis[leader], name).await;
        }

        // 7. `down` leaves nothing of the run: no container, no volume (named or
        //    anonymous), no network.
        let mut volumes = Vec::new();
        for container in example.containers() {
            let out = docker(&["inspect", "-f", "{{range .Mounts}}{{.Name}} {{end}}", &container]);
            assert!(out.status.success(), "docker inspect {container}: {}", text(&out.stderr));
            volumes.extend(text(&out.stdout).split_whitespace().map(str::to_string));
        }
        assert_eq!(volumes.len(), 6, "one volume a container: {volumes:?}");
        let down = example.script("down");
        assert!(down.status.success(), "ha-docker.sh down: {}{}", text(&down.stdout), text(&down.stderr));
        let left = |args: &[&str]| {
            text(&docker(args).stdout).split_whitespace().map(str::to_string).collect::<Vec<_>>()
        };
        assert_eq!(left(&["ps", "-aq", "--filter", &format!("name={}", example.name)]), Vec::<String>::new());
        assert_eq!(
            left(&["volume", "ls", "-q", "--filter", &format!("name={}", example.name)]),
            Vec::<String>::new()
        );
        assert_eq!(
            left(&["network", "ls", "-q", "--filter", &format!("name={}", example.name)]),
            Vec::<String>::new()
        );
        for volume in &volumes {
            assert!(!docker(&["volume", "inspect", volume]).status.success(), "volume {volume} is left");
        }
        let again = example.script("down");
        assert!(again.status.success(), "down is idempotent: {}", text(&again.stderr));
    };
    if tokio::time::timeout(TEST_TIMEOUT, body).await.is_err() {
        panic!("{test} did not finish in {TEST_TIMEOUT:?}");
    }
    eprintln!("ha_docker: {test} took {:?}", started.elapsed());
}
