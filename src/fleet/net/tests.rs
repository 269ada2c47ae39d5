//! End-to-end tests of the fleet network layer: a daemon [`FleetNet`] and in-process
//! [`Worker`]s, all on 127.0.0.1 with relays, discovery and port mapping off.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::*;

const SECRET: [u8; 32] = [7; 32];
const WITHIN: Duration = Duration::from_secs(8);

/// What the member sink does with a Hello.
enum Mode {
    Admit,
    Refuse,
    /// Admit once the gate opens.
    Gated(Mutex<Option<oneshot::Receiver<()>>>),
}

/// A member sink recording every Hello it is handed.
struct Sink {
    mode: Mode,
    seen: mpsc::UnboundedSender<Hello>,
}

impl Sink {
    fn new(mode: Mode) -> (Arc<Sink>, mpsc::UnboundedReceiver<Hello>) {
        let (seen, rx) = mpsc::unbounded_channel();
        (Arc::new(Sink { mode, seen }), rx)
    }
}

impl Members for Sink {
    fn admit(&self, hello: Hello) -> AdmitFuture {
        let _ = self.seen.send(hello);
        let gate = match &self.mode {
            Mode::Gated(gate) => gate.lock().unwrap().take(),
            _ => None,
        };
        let refuse = matches!(self.mode, Mode::Refuse);
        Box::pin(async move {
            if let Some(gate) = gate {
                let _ = gate.await;
            }
            if refuse {
                Err("not today".to_string())
            } else {
                Ok(())
            }
        })
    }
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WITHIN, future).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}

fn loopback(port: u16) -> NetConfig {
    NetConfig::direct(SocketAddr::from(([127, 0, 0, 1], port)))
}

fn fast() -> Backoff {
    Backoff { min: Duration::from_millis(50), max: Duration::from_millis(300) }
}

async fn daemon(port: u16, generation: u64, members: Arc<dyn Members>) -> Arc<FleetNet> {
    let net =
        FleetNet::start_with_backoff(SECRET, loopback(port), generation, members, fast()).await.unwrap();
    assert!(net.bound_addrs().iter().all(|a| a.ip().is_loopback()), "{:?}", net.bound_addrs());
    net
}

async fn worker(net: &FleetNet, node: &str) -> Worker {
    let target: ControlTarget = net.control_target(None).parse().unwrap();
    let mut config = WorkerConfig::new(node, 3, target);
    config.net = NetConfig::loopback();
    config.telemetry_interval = Duration::from_millis(100);
    config.heartbeat_interval = Duration::from_millis(200);
    config.backoff = fast();
    let worker = Worker::start(config).await.unwrap();
    assert!(worker.bound_sockets().iter().all(|a| a.ip().is_loopback()), "{:?}", worker.bound_sockets());
    assert!(worker.advertised().iter().all(|a| a.ip().is_loopback()), "{:?}", worker.advertised());
    worker
}

async fn bound_to(worker: &Worker, generation: u64) {
    let mut status = worker.status();
    within("the worker binds", status.wait_for(|s| s.bound_generation == Some(generation))).await.unwrap();
}

/// A UDP port free right now on 127.0.0.1.
fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts a daemon on a port that a previous one just released (retrying briefly).
async fn restart(port: u16, generation: u64, members: Arc<dyn Members>) -> Arc<FleetNet> {
    for _ in 0..40 {
        match FleetNet::start_with_backoff(SECRET, loopback(port), generation, members.clone(), fast()).await
        {
            Ok(net) => return net,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("port {port} never became free");
}

#[tokio::test]
async fn welcome_is_sent_only_after_the_sink_persisted_the_hello() {
    let (gate_tx, gate) = oneshot::channel();
    let (sink, mut seen) = Sink::new(Mode::Gated(Mutex::new(Some(gate))));
    let net = daemon(0, 41, sink).await;
    let mut events = net.member_events();
    let worker = worker(&net, "n1").await;

    let hello = within("the sink sees the hello", seen.recv()).await.unwrap();
    assert_eq!(hello.kind, HelloKind::Join);
    assert_eq!((hello.node.as_str(), hello.logical_id), ("n1", 3));
    assert_eq!(hello.endpoint_id, worker.endpoint_id().to_string());
    assert_eq!(hello.addresses, worker.advertised());
    assert_eq!(hello.bound_generation, None);
    assert!(hello.facts.cpus >= 1 && hello.facts.memory_total_bytes > 0, "{:?}", hello.facts);

    // The sink has not returned: the worker is not bound, however long it waits.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(worker.status().borrow().bound_generation, None);
    assert!(events.try_recv().is_err());

    gate_tx.send(()).unwrap();
    bound_to(&worker, 41).await;
    let joined = within("joined", events.recv()).await.unwrap();
    assert_eq!(joined, MemberEvent::Joined { node: "n1".into(), kind: HelloKind::Join });

    worker.shutdown().await;
    let lost = within("lost", events.recv()).await.unwrap();
    assert_eq!(lost, MemberEvent::Lost { node: "n1".into() });
    net.shutdown().await;
}

#[tokio::test]
async fn run_reports_ready_after_the_welcome_and_ends_on_shutdown() {
    let (sink, _seen) = Sink::new(Mode::Admit);
    let net = daemon(0, 1, sink).await;
    let target: ControlTarget = net.control_target(None).parse().unwrap();
    let mut config = WorkerConfig::new("n2", 9, target);
    config.net = NetConfig::loopback();
    let (ready_tx, ready) = oneshot::channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(worker::run(
        config,
        move || ready_tx.send(()).map_err(|()| anyhow::anyhow!("nobody listens")),
        async move {
            let _ = stopped.await;
        },
    ));
    within("ready", ready).await.unwrap();
    stop.send(()).unwrap();
    within("run ends", run).await.unwrap().unwrap();
    net.shutdown().await;
}

#[tokio::test]
async fn the_daemon_follows_telemetry_until_it_forgets_the_node() {
    let (sink, _seen) = Sink::new(Mode::Admit);
    let net = daemon(0, 1, sink).await;
    let worker = worker(&net, "n1").await;
    bound_to(&worker, 1).await;
    let hub = net.hub().clone();
    let mut live = hub.subscribe("n1");

    let id = worker.endpoint_id().to_string();
    within("descriptors", net.follow_telemetry("n1", &id, worker.advertised().to_vec(), WITHIN))
        .await
        .unwrap();
    let snapshot = hub.snapshot("n1").unwrap();
    let channels: Vec<&str> = snapshot.descriptors.iter().map(|d| d.channel.as_str()).collect();
    for channel in [sampler::CPU_PERCENT, sampler::MEMORY_USED, sampler::MEMORY_TOTAL] {
        assert!(channels.contains(&channel), "{channels:?}");
    }

    // Live frames of one channel arrive with advancing timestamps.
    let mut stamps = Vec::new();
    while stamps.len() < 3 {
        let frame = within("a live frame", live.recv()).await.unwrap();
        if frame.channel == sampler::MEMORY_TOTAL {
            assert!(frame.value > 0.0);
            stamps.push(frame.at);
        }
    }
    assert!(stamps.windows(2).all(|w| w[0] < w[1]), "{stamps:?}");
    let summary = hub.summary("n1").unwrap();
    assert!(summary.updated_at.is_some());
    assert!(summary.memory_total_bytes.unwrap() > 0);
    assert!(summary.cpu_percent.is_some());
    assert!(hub.snapshot("n1").unwrap().recent.len() >= 3);

    assert!(net.forget("n1"));
    assert!(!net.forget("n1"));
    assert!(hub.snapshot("n1").is_none());
    // The live feed ends and nothing is pulled any more.
    loop {
        match within("the feed closes", live.recv()).await {
            Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            _ => continue,
        }
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(hub.summary("n1").is_none());
    assert!(hub.nodes_known().is_empty());

    worker.shutdown().await;
    net.shutdown().await;
}

#[tokio::test]
async fn telemetry_of_an_unknown_worker_times_out_and_a_bad_id_is_refused() {
    let (sink, _seen) = Sink::new(Mode::Admit);
    let net = daemon(0, 1, sink).await;
    let err = net.follow_telemetry("n1", "nope", vec![], WITHIN).await.unwrap_err();
    assert!(err.contains("invalid worker endpoint id"), "{err}");
    let nobody = iroh::SecretKey::from_bytes(&[9; 32]).public().to_string();
    let closed = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let err =
        net.follow_telemetry("n1", &nobody, vec![closed], Duration::from_millis(300)).await.unwrap_err();
    assert!(err.contains("no telemetry descriptors within"), "{err}");
    assert!(net.forget("n1"));
    // Closing waits (up to ~3 s) for the abandoned dial to time out: iroh's documented
    // best-effort close.
    net.shutdown().await;
}

#[tokio::test]
async fn a_surviving_worker_rejoins_a_restarted_daemon_and_rebinds_after_the_welcome() {
    let port = free_port();
    let (sink, mut seen) = Sink::new(Mode::Admit);
    let first = daemon(port, 1, sink).await;
    let id = first.endpoint_id();
    let worker = worker(&first, "n1").await;
    bound_to(&worker, 1).await;
    assert_eq!(within("join", seen.recv()).await.unwrap().kind, HelloKind::Join);
    first.shutdown().await;
    drop(first);

    let (sink, mut seen) = Sink::new(Mode::Admit);
    let second = restart(port, 2, sink).await;
    assert_eq!(second.endpoint_id(), id);
    let mut events = second.member_events();
    let hello = within("rejoin", seen.recv()).await.unwrap();
    assert_eq!(hello.kind, HelloKind::Rejoin);
    assert_eq!(hello.bound_generation, Some(1));
    assert_eq!(hello.endpoint_id, worker.endpoint_id().to_string());
    assert!(hello.facts.memory_total_bytes > 0);
    bound_to(&worker, 2).await;
    let joined = within("joined", events.recv()).await.unwrap();
    assert_eq!(joined, MemberEvent::Joined { node: "n1".into(), kind: HelloKind::Rejoin });

    worker.shutdown().await;
    second.shutdown().await;
}

#[tokio::test]
async fn a_refused_rejoin_is_retried_and_never_rebinds() {
    let port = free_port();
    let (sink, _seen) = Sink::new(Mode::Admit);
    let first = daemon(port, 1, sink).await;
    let worker = worker(&first, "n1").await;
    bound_to(&worker, 1).await;
    first.shutdown().await;
    drop(first);

    let (sink, mut seen) = Sink::new(Mode::Refuse);
    let second = restart(port, 2, sink).await;
    for _ in 0..3 {
        let hello = within("a rejoin attempt", seen.recv()).await.unwrap();
        assert_eq!((hello.kind, hello.bound_generation), (HelloKind::Rejoin, Some(1)));
    }
    let mut status = worker.status();
    let status = within("refusals", status.wait_for(|s| s.refusals >= 2)).await.unwrap().clone();
    assert_eq!(status.bound_generation, Some(1));
    assert!(!status.connected);

    worker.shutdown().await;
    second.shutdown().await;
}

#[tokio::test]
async fn a_tracked_endpoint_closes_every_connection_with_a_remote_at_once() {
    let (sink, _seen) = Sink::new(Mode::Admit);
    let net = daemon(0, 1, sink).await;
    let (client, tracked) =
        endpoint::bind_tracked(iroh::SecretKey::generate(), &NetConfig::loopback(), vec![]).await.unwrap();
    let target: ControlTarget = net.control_target(None).parse().unwrap();
    let first = within("dial", client.connect(target.endpoint_addr(), CONTROL_ALPN)).await.unwrap();
    let second = within("dial", client.connect(target.endpoint_addr(), CONTROL_ALPN)).await.unwrap();
    assert_eq!(tracked.live(net.endpoint_id()), 2);
    assert_eq!(tracked.live(client.id()), 0, "none with another remote");

    assert_eq!(tracked.close_all(net.endpoint_id(), "redialling"), 2);
    for conn in [&first, &second] {
        within("closed", conn.closed()).await;
        assert!(conn.close_reason().is_some());
    }
    assert_eq!(tracked.live(net.endpoint_id()), 0);
    assert_eq!(tracked.close_all(net.endpoint_id(), "again"), 0);
    net.shutdown().await;
}

#[tokio::test]
async fn resolve_names_the_current_binding_only() {
    let (sink, _seen) = Sink::new(Mode::Admit);
    let net = daemon(0, 17, sink).await;
    let client = endpoint::bind(iroh::SecretKey::generate(), &NetConfig::loopback(), vec![]).await.unwrap();
    let target: ControlTarget = net.control_target(None).parse().unwrap();
    let conn = within("dial", client.connect(target.endpoint_addr(), CONTROL_ALPN)).await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut ask = async |request: ControlRequest| -> ControlReply {
        wire::write_message(&mut send, &request).await.unwrap();
        within("reply", wire::read_message(&mut recv)).await.unwrap()
    };
    let ControlReply::Binding(binding) = ask(ControlRequest::Resolve { name: CONTROL_NAME.into() }).await
    else {
        panic!("no binding")
    };
    assert_eq!(binding.generation, 17);
    assert_eq!(binding.endpoint_id, net.endpoint_id().to_string());
    assert_eq!(binding.addresses, net.bound_addrs());
    let other = ask(ControlRequest::Resolve { name: "other".into() }).await;
    assert_eq!(other, ControlReply::NotFound { name: "other".into() });
    assert_eq!(ask(ControlRequest::Heartbeat).await, ControlReply::Ack);
    // A hello claiming another endpoint id is refused before the sink sees it.
    let facts = sampler::runtime_facts(crate::host::now()).await;
    let forged = Hello {
        kind: HelloKind::Join,
        node: "n1".into(),
        logical_id: 1,
        endpoint_id: net.endpoint_id().to_string(),
        addresses: vec![],
        facts,
        bound_generation: None,
        join_token: None,
    };
    let ControlReply::Refused { reason } = ask(ControlRequest::Hello(forged)).await else {
        panic!("not refused")
    };
    assert!(reason.contains("came from"), "{reason}");
    client.close().await;
    net.shutdown().await;
}

/// The real `hive fleet-worker` process: ready line after the welcome, exit on stdin
/// EOF. Needs the binary: `cargo build --bin hive && cargo nextest run --lib
/// fleet::net --run-ignored all` (or set `HIVE_BIN`).
#[tokio::test]
#[ignore = "needs the hive binary built"]
async fn the_worker_process_prints_ready_after_the_welcome_and_exits_on_stdin_eof() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let exe = crate::host::env::var_os("HIVE_BIN").map(std::path::PathBuf::from).unwrap_or_else(|| {
        // target/debug/deps/hive-<hash> → target/debug/hive
        std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("hive")
    });
    let (sink, mut seen) = Sink::new(Mode::Admit);
    let net = daemon(0, 5, sink).await;
    let mut child = tokio::process::Command::new(exe)
        .args(["fleet-worker", "--node", "n1", "--logical-id", "4", "--bind", "127.0.0.1:0"])
        .args(["--control", &net.control_target(None), "--telemetry-interval-ms", "100"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = within("the ready line", lines.next_line()).await.unwrap().unwrap();
    assert_eq!(line, crate::fleet::providers::process::ready_line("n1"));
    let hello = seen.recv().await.unwrap();
    assert_eq!((hello.node.as_str(), hello.logical_id, hello.kind), ("n1", 4, HelloKind::Join));
    assert!(hello.addresses.iter().all(|a| a.ip().is_loopback()), "{:?}", hello.addresses);
    net.follow_telemetry("n1", &hello.endpoint_id, hello.addresses.clone(), WITHIN).await.unwrap();

    drop(child.stdin.take());
    let status = within("the worker exits", child.wait()).await.unwrap();
    assert!(status.success(), "{status}");
    net.shutdown().await;
}

/// A telemetry server that answers each pull with descriptors and one sample, then
/// ends the stream: the daemon's follower must redial it.
#[derive(Debug, Clone)]
struct OneShotTelemetry {
    pulls: Arc<std::sync::atomic::AtomicUsize>,
}

impl iroh::protocol::ProtocolHandler for OneShotTelemetry {
    async fn accept(&self, conn: iroh::endpoint::Connection) -> Result<(), iroh::protocol::AcceptError> {
        self.pulls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (mut send, mut recv) = conn.accept_bi().await?;
        let _: telemetry::TelemetryRequest = wire::read_message(&mut recv).await.unwrap();
        let descriptors = vec![ChannelDescriptor::new(sampler::CPU_PERCENT, "percent", "cpu")];
        wire::write_message(&mut send, &TelemetryMessage::Descriptors(descriptors)).await.unwrap();
        let frame = Frame { channel: sampler::CPU_PERCENT.into(), at: crate::host::now(), value: 12.5 };
        wire::write_message(&mut send, &TelemetryMessage::Frames(vec![frame])).await.unwrap();
        send.finish()?;
        let _ = tokio::time::timeout(Duration::from_secs(1), conn.closed()).await;
        Ok(())
    }
}

#[tokio::test]
async fn a_dropped_telemetry_stream_is_redialled_until_forgotten() {
    use std::sync::atomic::Ordering;

    let (sink, _seen) = Sink::new(Mode::Admit);
    let net = daemon(0, 1, sink).await;
    let pulls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ep = endpoint::bind(iroh::SecretKey::generate(), &NetConfig::loopback(), vec![]).await.unwrap();
    let router = iroh::protocol::Router::builder(ep)
        .accept(TELEMETRY_ALPN, OneShotTelemetry { pulls: pulls.clone() })
        .spawn();
    let (id, addrs) = (router.endpoint().id().to_string(), router.endpoint().bound_sockets());
    within("descriptors", net.follow_telemetry("n1", &id, addrs, WITHIN)).await.unwrap();
    within("redials", async {
        while pulls.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(net.hub().summary("n1").unwrap().cpu_percent, Some(12.5));

    assert!(net.forget("n1"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let settled = pulls.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(pulls.load(Ordering::SeqCst), settled, "pulls continued after forget");
    router.shutdown().await.unwrap();
    net.shutdown().await;
}

/// A daemon stand-in on the control ALPN that welcomes every Hello with generation
/// `generation` and the raw `addresses` (as a daemon moving elsewhere would), then acks
/// heartbeats. Written as JSON, so it speaks exactly the wire form.
#[derive(Debug, Clone)]
struct MovingDaemon {
    id: String,
    generation: u64,
    addresses: Vec<SocketAddr>,
}

impl iroh::protocol::ProtocolHandler for MovingDaemon {
    async fn accept(&self, conn: iroh::endpoint::Connection) -> Result<(), iroh::protocol::AcceptError> {
        let (mut send, mut recv) = conn.accept_bi().await?;
        let id = &self.id;
        while let Ok(request) = wire::read_message::<_, serde_json::Value>(&mut recv).await {
            let reply = match request["type"].as_str() {
                Some("Hello") => serde_json::json!({"type": "Welcome", "generation": self.generation,
                    "daemon_endpoint_id": id, "addresses": self.addresses}),
                _ => serde_json::json!({"type": "Ack"}),
            };
            if wire::write_message(&mut send, &reply).await.is_err() {
                break;
            }
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_worker_redials_the_daemon_where_its_welcome_said_not_where_it_started() {
    let (old_port, new_port) = (free_port(), free_port());
    assert_ne!(old_port, new_port);
    let new_address = SocketAddr::from(([127, 0, 0, 1], new_port));
    // The daemon the worker was started with welcomes it and names its new address.
    let ep = endpoint::bind(iroh::SecretKey::from_bytes(&SECRET), &loopback(old_port), vec![]).await.unwrap();
    let id = ep.id().to_string();
    let old = iroh::protocol::Router::builder(ep)
        .accept(CONTROL_ALPN, MovingDaemon { id, generation: 1, addresses: vec![new_address] })
        .spawn();
    let target: ControlTarget = format!("{}@127.0.0.1:{old_port}", old.endpoint().id()).parse().unwrap();
    let mut config = WorkerConfig::new("n1", 3, target);
    config.net = NetConfig::loopback();
    config.heartbeat_interval = Duration::from_millis(200);
    config.backoff = fast();
    let worker = Worker::start(config).await.unwrap();
    bound_to(&worker, 1).await;
    old.shutdown().await.unwrap();

    // The daemon comes back (same identity, next generation) at the address it named;
    // nothing listens where the worker started any more.
    let (sink, mut seen) = Sink::new(Mode::Admit);
    let moved = daemon(new_port, 2, sink).await;
    let hello = within("the rejoin at the new address", seen.recv()).await.unwrap();
    assert_eq!((hello.kind, hello.bound_generation), (HelloKind::Rejoin, Some(1)));
    bound_to(&worker, 2).await;

    worker.shutdown().await;
    moved.shutdown().await;
}

#[tokio::test]
async fn the_welcome_names_the_daemons_control_address_and_generation() {
    let (sink, _seen) = Sink::new(Mode::Admit);
    let net = daemon(0, 23, sink).await;
    let client = endpoint::bind(iroh::SecretKey::generate(), &NetConfig::loopback(), vec![]).await.unwrap();
    let target: ControlTarget = net.control_target(None).parse().unwrap();
    let conn = within("dial", client.connect(target.endpoint_addr(), CONTROL_ALPN)).await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let hello = Hello {
        kind: HelloKind::Join,
        node: "n1".into(),
        logical_id: 1,
        endpoint_id: client.id().to_string(),
        addresses: vec![],
        facts: sampler::runtime_facts(crate::host::now()).await,
        bound_generation: None,
        join_token: None,
    };
    wire::write_message(&mut send, &ControlRequest::Hello(hello)).await.unwrap();
    let welcome: serde_json::Value = within("welcome", wire::read_message(&mut recv)).await.unwrap();
    assert_eq!(welcome["type"], "Welcome", "{welcome}");
    assert_eq!(welcome["generation"], 23, "{welcome}");
    assert_eq!(welcome["daemon_endpoint_id"], net.endpoint_id().to_string(), "{welcome}");
    assert_eq!(welcome["addresses"], serde_json::json!(net.bound_addrs()), "{welcome}");
    client.close().await;
    net.shutdown().await;
}

#[test]
fn a_welcome_rebinds_the_target_to_the_addresses_it_names() {
    let id = iroh::SecretKey::from_bytes(&SECRET).public();
    let started: ControlTarget = format!("{id}@10.0.0.5:7000").parse().unwrap();
    let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
    // The named address first, what was dialled after it; an unspecified IP is the one
    // the worker reaches the daemon at; port 0 is no address.
    let rebound = worker::rebind(
        &started,
        &id.to_string(),
        &[addr("0.0.0.0:7100"), addr("192.0.2.9:7200"), addr("192.0.2.9:0")],
    );
    assert_eq!(rebound.endpoint_id, id);
    assert_eq!(rebound.addresses, [addr("10.0.0.5:7100"), addr("192.0.2.9:7200"), addr("10.0.0.5:7000")]);
    // An older daemon's Welcome names nothing, and an id that does not parse is ignored.
    assert_eq!(worker::rebind(&started, &id.to_string(), &[]), started);
    assert_eq!(worker::rebind(&started, "nope", &[addr("192.0.2.9:7200")]), started);
}
