//! The `docker` fleet provider client against the real Docker Engine: node containers
//! running the test's own `hive` binary in worker mode, on a private network each test
//! creates. Opt-in (`HIVE_DOCKER_TESTS=1`), since it needs an engine and writes to its
//! image store; without it each test prints a note and passes. With it, any Docker
//! failure fails the test.
//!
//! Each test uses its own fleet label (so parallel tests, and parallel test processes,
//! never see each other's containers) and removes its containers and network on the way
//! out, also when it fails: [`Cleanup`] does it with the docker CLI from `Drop`.
//! The node image is built once per `hive` binary ([`node_image`]) and shared.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hive::fleet::providers::docker::{
    container_name, DockerError, DockerNodes, NodeRequest, Observed, LABEL_COMMAND, LABEL_FLEET,
    LABEL_LOGICAL_ID, LABEL_NODE, LABEL_RUN_ID,
};

use crate::harness::hive_bin;

/// Where [`node_image`] puts the `hive` binary.
pub const NODE_HIVE: &str = "/usr/local/bin/hive";
/// A bound on each test, image build included.
const TEST_TIMEOUT: Duration = Duration::from_secs(240);
/// How long a node may take to start (or to exit, where that is expected).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The daemon the workers are told to join: a valid endpoint id (the ed25519 base
/// point) at an address where nothing answers (TEST-NET-1, the discard port). These
/// tests are about the containers, so no daemon welcomes the workers and none prints
/// its ready line; `fleet_docker_daemon.rs` runs them against a real daemon.
const NO_DAEMON: &str = "5866666666666666666666666666666666666666666666666666666666666666@192.0.2.1:9";
/// What a worker logs (stderr) once its endpoint is up, before it reaches any daemon.
const WORKER_STARTED: &str = "fleet worker endpoint started";

/// Whether the Docker tests run; prints why not when they do not.
pub fn docker_tests_enabled(test: &str) -> bool {
    let on = std::env::var_os("HIVE_DOCKER_TESTS").is_some_and(|v| v == "1");
    if !on {
        eprintln!("fleet_docker: HIVE_DOCKER_TESTS=1 is not set, so {test} does not run against Docker");
    }
    on
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn docker_cli(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running docker {args:?} (is the docker CLI installed?): {e}"))
}

/// The node image for the test's `hive` binary, built unless it exists:
/// `hive-node:test-agents-<sha256 of the binary, 16 hex>`, the root filesystem of
/// [`assemble_rootfs`] loaded by [`imported_image`]. The tag names the binary's content,
/// so parallel test processes share one image. Blocking; panics on any failure.
pub fn node_image() -> String {
    let binary = std::fs::read(hive_bin()).expect("reading the hive binary");
    let tag = format!("hive-node:test-agents-{}", content_hash(&binary));
    imported_image(&tag, "hive fleet node image for tests", |rootfs| {
        assemble_rootfs(Path::new(hive_bin()), rootfs)
    })
}

/// The first 16 hex digits of the SHA-256 of `bytes`: an image tag that names what the
/// image holds.
pub(crate) fn content_hash(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The image `tag`, built unless it exists: `fill` assembles its root filesystem in an
/// empty directory, which `docker import` loads from a tar on stdin, with
/// `PATH=/usr/local/bin:/usr/bin:/bin`. A [`BuildLock`] named after the tag keeps
/// parallel test processes from building it twice at once. Blocking; panics on any
/// failure.
pub(crate) fn imported_image(tag: &str, message: &str, fill: impl FnOnce(&Path)) -> String {
    let exists = || docker_cli(&["image", "inspect", "--format", "{{.Id}}", tag]).status.success();
    if exists() {
        return tag.to_string();
    }
    let lock = format!("{}.lock", tag.replace([':', '/'], "-"));
    let Some(_lock) = BuildLock::acquire(&lock, exists) else {
        return tag.to_string(); // another process built it meanwhile
    };
    let temp = tempfile::tempdir().expect("tempdir");
    let rootfs = temp.path().join("rootfs");
    fill(&rootfs);
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .expect("running tar");
    let import = Command::new("docker")
        .args(["import", "--message", message, "--change", "ENV PATH=/usr/local/bin:/usr/bin:/bin", "-", tag])
        .stdin(tar.stdout.take().expect("tar stdout"))
        .output()
        .expect("running docker import");
    let tar_status = tar.wait().expect("waiting for tar");
    assert!(tar_status.success(), "tar of the rootfs of {tag} failed: {tar_status}");
    assert!(import.status.success(), "docker import {tag}: {}", text(&import.stderr));
    eprintln!("docker: built {tag}");
    tag.to_string()
}

/// A lock directory in the temp dir (creating a directory is atomic), removed on drop,
/// also when the build panics. One left by a killed process is taken over once it is
/// older than [`BuildLock::STALE`].
struct BuildLock(std::path::PathBuf);

impl BuildLock {
    const STALE: Duration = Duration::from_secs(300);

    /// Waits for the lock `name`; `None` as soon as `done` says there is nothing to build.
    fn acquire(name: &str, done: impl Fn() -> bool) -> Option<BuildLock> {
        let path = std::env::temp_dir().join(name);
        loop {
            if done() {
                return None;
            }
            match std::fs::create_dir(&path) {
                Ok(()) => return Some(BuildLock(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let age = std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok());
                    if age.is_some_and(|age| age > Self::STALE) {
                        // (A plain file of that name is stale too: older versions locked a file.)
                        let _ = std::fs::remove_dir(&path).or_else(|_| std::fs::remove_file(&path));
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => panic!("creating the lock {}: {e}", path.display()),
            }
        }
    }
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Assembles in `out` the root filesystem of a node: `bin` at [`NODE_HIVE`], a `/tmp`,
/// and what a node needs to run the agents placed on it — git (the worker builds a
/// generation from the commit the daemon ships), a POSIX `sh`, `sleep` and `rm` (the test
/// agents' `run.sh`) — each with every shared library `ldd` resolves, at the same paths
/// (the dynamic loader among them). git's builtins are hard links to its binary, as git
/// installs them, so they cost nothing in the image; its other helpers are left out.
pub fn assemble_rootfs(bin: &Path, out: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let inside = |p: &Path| out.join(p.strip_prefix("/").unwrap_or(p));
    install(bin, &inside(Path::new(NODE_HIVE)), out);
    std::fs::create_dir_all(out.join("tmp")).expect("creating /tmp");
    std::fs::set_permissions(out.join("tmp"), std::fs::Permissions::from_mode(0o1777)).expect("chmod /tmp");
    for tool in ["sh", "sleep", "rm"] {
        let host = which(tool);
        install(&std::fs::canonicalize(&host).expect("resolving a tool"), &inside(&host), out);
        // `/bin/sh` too, whatever the host's PATH found first.
        if tool == "sh" {
            install(&std::fs::canonicalize(&host).unwrap(), &inside(Path::new("/bin/sh")), out);
        }
    }
    let git = std::fs::canonicalize(which("git")).expect("resolving git");
    let in_git = inside(&which("git"));
    install(&git, &in_git, out);
    let exec_path = Command::new("git").arg("--exec-path").output().expect("git --exec-path");
    let exec_path = std::path::PathBuf::from(text(&exec_path.stdout).trim());
    std::fs::create_dir_all(inside(&exec_path)).expect("creating git's exec path");
    let git_inode = std::fs::metadata(&git).expect("git's metadata").ino();
    for entry in std::fs::read_dir(&exec_path).expect("reading git's exec path").flatten() {
        let is_builtin = entry.metadata().is_ok_and(|m| m.is_file() && m.ino() == git_inode);
        let target = inside(&entry.path());
        if is_builtin && !target.exists() {
            std::fs::hard_link(&in_git, &target).expect("linking a git builtin");
        }
    }
}

/// The path `tool` has on this host's PATH; panics naming it when it has none.
fn which(tool: &str) -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("the node image needs {tool} on this host's PATH"))
}

/// Copies the executable `from` to `to` (inside `root`), with the shared libraries
/// `ldd` resolves for it at their own paths under `root`. ldd fails for a static binary,
/// which needs nothing.
pub(crate) fn install(from: &Path, to: &Path, root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to.parent().unwrap()).expect("creating the rootfs");
    if !to.exists() {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    // `name => /path (addr)` for a library, `/path/ld-linux… (addr)` for the loader.
    let ldd = Command::new("ldd").arg(from).output().expect("running ldd (Debian: libc-bin)");
    for line in text(&ldd.stdout).lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let lib = match words.as_slice() {
            [_, "=>", path, ..] | [path, ..] if path.starts_with('/') => Path::new(*path),
            _ => continue,
        };
        let copy = root.join(lib.strip_prefix("/").unwrap_or(lib));
        if copy.exists() {
            continue;
        }
        std::fs::create_dir_all(copy.parent().unwrap()).expect("creating a library directory");
        std::fs::copy(lib, &copy).unwrap_or_else(|e| panic!("copying {}: {e}", lib.display()));
    }
}

/// Removes the test's containers (by fleet label) and network, whatever happened.
struct Cleanup {
    fleets: Vec<String>,
    network: Option<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for fleet in &self.fleets {
            let filter = format!("label={LABEL_FLEET}={fleet}");
            let ids = docker_cli(&["ps", "-aq", "--filter", &filter]);
            for id in text(&ids.stdout).split_whitespace() {
                let _ = docker_cli(&["rm", "-f", "-v", id]);
            }
        }
        if let Some(network) = &self.network {
            let _ = docker_cli(&["network", "rm", network]);
        }
    }
}

/// A fleet label no other test (or test process) uses; unique in its first 12
/// characters, which is the part a container name holds.
fn unique_fleet() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let seed = format!("{nanos}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
    let digest = ring::digest::digest(&ring::digest::SHA256, seed.as_bytes());
    digest.as_ref()[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// A node running `hive fleet-worker` as a container runs it: `--supervise none` (until
/// SIGTERM), since a container has no daemon-held stdin pipe.
fn worker_request(fleet: &str, node: &str, logical_id: u64, image: &str, network: &str) -> NodeRequest {
    NodeRequest {
        fleet: fleet.into(),
        run_id: format!("run-{fleet}"),
        node: node.into(),
        logical_id,
        command: format!("cmd-{fleet}"),
        image: image.into(),
        cmd: [NODE_HIVE, "fleet-worker", "--node", node, "--logical-id", &logical_id.to_string()]
            .into_iter()
            .chain(["--control", NO_DAEMON, "--supervise", "none"])
            .map(String::from)
            .collect(),
        env: vec![("HIVE_TEST".into(), "1".into())],
        network: Some(network.into()),
        gpus: None,
        keep_stdin_open: false,
    }
}

/// Runs `body` under [`TEST_TIMEOUT`].
async fn bounded(test: &str, body: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(TEST_TIMEOUT, body).await.is_err() {
        panic!("{test} did not finish in {TEST_TIMEOUT:?}");
    }
}

async fn connect() -> DockerNodes {
    let nodes = DockerNodes::connect(None).await.unwrap_or_else(|e| panic!("HIVE_DOCKER_TESTS=1: {e}"));
    nodes.ping().await.expect("ping");
    nodes
}

async fn image() -> String {
    tokio::task::spawn_blocking(node_image).await.expect("building the node image")
}

/// Polls the logs of `id` until they contain `text`; returns them.
async fn wait_for_log(nodes: &DockerNodes, id: &str, text: &str) -> String {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let logs = nodes.logs(id, None).await.expect("logs");
        if logs.contains(text) || Instant::now() > deadline {
            return logs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `id` until `done` holds for it (or the ready timeout passes); returns the last
/// observation.
async fn wait_for(nodes: &DockerNodes, id: &str, done: impl Fn(&Observed) -> bool) -> Observed {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let seen = nodes.inspect(id).await.expect("inspect").expect("the container exists");
        if done(&seen) || Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ids(list: &[Observed]) -> Vec<String> {
    let mut ids: Vec<String> = list.iter().map(|o| o.id.clone()).collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn a_node_container_runs_labelled_on_its_network_and_is_adopted_then_destroyed() {
    let test = "a_node_container_runs_labelled_on_its_network_and_is_adopted_then_destroyed";
    if !docker_tests_enabled(test) {
        return;
    }
    let fleet = unique_fleet();
    let network = format!("hive-test-{fleet}");
    let _cleanup = Cleanup { fleets: vec![fleet.clone()], network: Some(network.clone()) };
    bounded(test, async {
        let nodes = connect().await;
        let image = image().await;
        let net = nodes.ensure_network(&network).await.expect("ensure_network");
        assert_eq!(net.name, network);
        let gateway = net.gateway.expect("a bridge network has a gateway");
        assert_eq!(nodes.ensure_network(&network).await.expect("ensure_network again"), net, "idempotent");

        // 1. It runs, labelled, with an address on the network; the worker started.
        let req = worker_request(&fleet, "node-1", 1, &image, &network);
        let id = nodes.create_node(&req).await.expect("create_node");
        let logs = wait_for_log(&nodes, &id, WORKER_STARTED).await;
        assert!(logs.contains(WORKER_STARTED) && logs.contains("\"node-1\""), "the worker's logs:\n{logs}");
        let seen = wait_for(&nodes, &id, |o| o.running && o.ip.is_some()).await;
        assert!(seen.running, "{seen:?}\nlogs:\n{logs}");
        assert_eq!(seen.status, "running");
        assert_eq!(seen.name, container_name(&fleet, "node-1"));
        let expected: HashMap<String, String> = [
            (LABEL_FLEET, fleet.clone()),
            (LABEL_RUN_ID, req.run_id.clone()),
            (LABEL_NODE, "node-1".into()),
            (LABEL_LOGICAL_ID, "1".into()),
            (LABEL_COMMAND, req.command.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, v) in &expected {
            assert_eq!(seen.labels.get(k), Some(v), "label {k}: {:?}", seen.labels);
        }
        assert_eq!(
            (seen.node(), seen.logical_id(), seen.command()),
            (Some("node-1"), Some(1), Some(&*req.command))
        );
        let ip = seen.ip.expect("an address on the network");
        assert_ne!(ip, gateway);
        assert_eq!(ip.is_ipv4(), gateway.is_ipv4(), "node {ip} and gateway {gateway} on one network");

        // 2. The same create again adopts the container instead of making a second one.
        let again = nodes.create_node(&req).await.expect("create_node again");
        assert_eq!(again, id, "the repeated create adopts the existing container");
        let listed = nodes.list_managed(&fleet).await.expect("list_managed");
        assert_eq!(ids(&listed), vec![id.clone()], "{listed:?}");
        assert_eq!(listed[0].name, seen.name);
        assert!(listed[0].running);
        assert_eq!(listed[0].ip, Some(ip));
        assert_eq!(listed[0].labels, seen.labels);

        // 4. Destroy removes it; destroying it again is fine; it is gone.
        nodes.destroy(&id).await.expect("destroy");
        nodes.destroy(&id).await.expect("destroying a destroyed container is Ok");
        assert_eq!(nodes.inspect(&id).await.expect("inspect"), None);
        assert!(nodes.list_managed(&fleet).await.expect("list_managed").is_empty());

        nodes.remove_network(&network).await.expect("remove_network");
        assert_eq!(nodes.network(&network).await.expect("network"), None);
        nodes.remove_network(&network).await.expect("removing a removed network is Ok");
    })
    .await;
}

#[tokio::test]
async fn list_managed_sees_only_its_fleet_and_a_foreign_name_is_not_adopted() {
    let test = "list_managed_sees_only_its_fleet_and_a_foreign_name_is_not_adopted";
    if !docker_tests_enabled(test) {
        return;
    }
    let (mine, other) = (unique_fleet(), unique_fleet());
    let network = format!("hive-test-{mine}");
    let _cleanup = Cleanup { fleets: vec![mine.clone(), other.clone()], network: Some(network.clone()) };
    bounded(test, async {
        let nodes = connect().await;
        let image = image().await;
        nodes.ensure_network(&network).await.expect("ensure_network");

        let a1 = nodes.create_node(&worker_request(&mine, "node-1", 1, &image, &network)).await.expect("a1");
        let a2 = nodes.create_node(&worker_request(&mine, "node-2", 2, &image, &network)).await.expect("a2");
        let b1 = nodes.create_node(&worker_request(&other, "node-1", 1, &image, &network)).await.expect("b1");
        // Stopped containers are listed too (recovery must see them).
        nodes
            .engine()
            .stop_container(&a2, None::<bollard::query_parameters::StopContainerOptions>)
            .await
            .expect("stop");

        let listed = nodes.list_managed(&mine).await.expect("list mine");
        let mut want = vec![a1.clone(), a2.clone()];
        want.sort();
        assert_eq!(ids(&listed), want, "{listed:?}");
        let stopped = listed.iter().find(|o| o.id == a2).unwrap();
        assert!(!stopped.running && stopped.status == "exited", "{stopped:?}");
        assert_eq!(ids(&nodes.list_managed(&other).await.expect("list other")), vec![b1.clone()]);

        // The same name for another command is somebody else's node: an error, not an adoption.
        let mut foreign = worker_request(&mine, "node-1", 7, &image, &network);
        foreign.command = "cmd-someone-else".into();
        let err = nodes.create_node(&foreign).await.expect_err("a foreign container is not adopted");
        assert!(matches!(err, DockerError::NameTaken { .. }), "{err}");
        let message = err.to_string();
        assert!(message.starts_with("creating container for node-1: a container named"), "{message}");
        assert!(
            message.contains("cmd-someone-else") && message.contains(&format!("cmd-{mine}")),
            "{message}"
        );
        assert_eq!(ids(&nodes.list_managed(&mine).await.expect("list mine")), want, "nothing new");

        // A worker takes a few seconds to stop; stop them together.
        for done in futures_util::future::join_all([&a1, &a2, &b1].map(|id| nodes.destroy(id))).await {
            done.expect("destroy");
        }
        assert!(nodes.list_managed(&mine).await.expect("list").is_empty());
        assert!(nodes.list_managed(&other).await.expect("list").is_empty());
        nodes.remove_network(&network).await.expect("remove_network");
    })
    .await;
}

#[tokio::test]
async fn a_missing_image_is_a_clear_error_and_leaves_nothing_behind() {
    let test = "a_missing_image_is_a_clear_error_and_leaves_nothing_behind";
    if !docker_tests_enabled(test) {
        return;
    }
    let fleet = unique_fleet();
    let _cleanup = Cleanup { fleets: vec![fleet.clone()], network: None };
    bounded(test, async {
        let nodes = connect().await;
        let image = format!("hive-node:missing-{fleet}");
        let mut req = worker_request(&fleet, "node-3", 3, &image, "unused");
        req.network = None;
        let err = nodes.create_node(&req).await.expect_err("no such image");
        assert!(matches!(err, DockerError::ImageNotFound { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("creating container for node-3: image \"{image}\" not found (pull or build it first)")
        );
        assert!(nodes.list_managed(&fleet).await.expect("list_managed").is_empty());
        assert_eq!(nodes.inspect(&container_name(&fleet, "node-3")).await.expect("inspect"), None);
    })
    .await;
}

/// Why containers run the worker with `--supervise none`: Docker gives a container no
/// stdin unless asked, so a stdin-supervised worker ends at once; `keep_stdin_open`
/// (an open, never-attached stdin) is what would keep one running.
#[tokio::test]
async fn a_stdin_supervised_worker_needs_an_open_stdin() {
    let test = "a_stdin_supervised_worker_needs_an_open_stdin";
    if !docker_tests_enabled(test) {
        return;
    }
    let fleet = unique_fleet();
    let network = format!("hive-test-{fleet}");
    let _cleanup = Cleanup { fleets: vec![fleet.clone()], network: Some(network.clone()) };
    bounded(test, async {
        let nodes = connect().await;
        let image = image().await;
        nodes.ensure_network(&network).await.expect("ensure_network");
        let stdin_supervised = |node: &str, logical_id, keep_stdin_open| {
            let mut req = worker_request(&fleet, node, logical_id, &image, &network);
            req.cmd.truncate(req.cmd.len() - 2); // drop `--supervise none`: stdin is the default
            req.keep_stdin_open = keep_stdin_open;
            req
        };

        let closed = nodes.create_node(&stdin_supervised("node-1", 1, false)).await.expect("create_node");
        let seen = wait_for(&nodes, &closed, |o| !o.running && o.status == "exited").await;
        let logs = nodes.logs(&closed, None).await.expect("logs");
        assert_eq!((seen.running, seen.status.as_str()), (false, "exited"), "logs:\n{logs}");
        assert!(logs.contains("stdin closed"), "it ended at stdin EOF:\n{logs}");
        assert_eq!(seen.ip, None, "an exited container has no address");

        let open = nodes.create_node(&stdin_supervised("node-2", 2, true)).await.expect("create_node");
        let logs = wait_for_log(&nodes, &open, WORKER_STARTED).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let seen = nodes.inspect(&open).await.expect("inspect").expect("exists");
        assert!(seen.running && !logs.contains("stdin closed"), "{seen:?}\nlogs:\n{logs}");

        for id in [closed, open] {
            nodes.destroy(&id).await.expect("destroy");
        }
        nodes.remove_network(&network).await.expect("remove_network");
    })
    .await;
}

#[test]
fn test_fleet_labels_differ_in_what_a_container_name_keeps() {
    let a = unique_fleet();
    let b = unique_fleet();
    assert_eq!(a.len(), 12);
    assert_ne!(container_name(&a, "node-1"), container_name(&b, "node-1"));
}
