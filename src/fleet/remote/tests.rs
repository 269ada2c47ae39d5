//! The agent runtime protocol between real iroh endpoints on 127.0.0.1: a worker's
//! service over a real process runtime, answered only to its daemon, and a daemon's
//! `RemoteRuntime` facing a worker that answers garbage or nothing useful.

use std::sync::Arc;
use std::time::Duration;

use hive_api::agent::Agent;
use iroh::endpoint::Connection;
use iroh::protocol::{AcceptError, ProtocolHandler, Router};
use iroh::{Endpoint, EndpointAddr, SecretKey};
use tokio::sync::broadcast;

use super::{RemoteRuntime, RuntimeService, RUNTIME_ALPN};
use crate::fleet::net::endpoint::{self, NetConfig};
use crate::runtime::process::{ProcessConfig, ProcessRuntime};
use crate::runtime::{Error, Runtime};

const WITHIN: Duration = Duration::from_secs(20);

async fn bind(alpns: Vec<Vec<u8>>) -> Endpoint {
    endpoint::bind(SecretKey::generate(), &NetConfig::loopback(), alpns).await.unwrap()
}

fn addr_of(endpoint: &Endpoint) -> EndpointAddr {
    endpoint.bound_sockets().into_iter().fold(EndpointAddr::new(endpoint.id()), |a, s| a.with_ip_addr(s))
}

fn agent(name: &str) -> Agent {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
        "spec": {"config": {"repo": "/nonexistent", "rev": "v1"}, "placement": {"node": "node-1"},
                 "runtime": {"type": "process", "process": {"command": ["sh", "run.sh"]}}}
    }))
    .unwrap()
}

fn remote(daemon: &Endpoint, worker: EndpointAddr, ship: &std::path::Path) -> RemoteRuntime {
    let (events, _) = broadcast::channel(16);
    RemoteRuntime::new("node-1", daemon.clone(), Arc::new(move || Ok(worker.clone())), ship.into(), events)
}

/// A worker that answers every stream on the runtime ALPN with bytes that are no frame.
#[derive(Debug, Clone)]
struct Garbage;

impl ProtocolHandler for Garbage {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        while let Ok((mut send, _recv)) = conn.accept_bi().await {
            let _ = send.write_all(&[0xff, 0xff, 0xff, 0xff, b'{', b'x']).await;
            let _ = send.finish();
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_worker_answering_garbage_is_a_clear_error_and_nothing_hangs() {
    let tmp = tempfile::tempdir().unwrap();
    let worker = bind(vec![RUNTIME_ALPN.to_vec()]).await;
    let router = Router::builder(worker.clone()).accept(RUNTIME_ALPN, Garbage).spawn();
    let daemon = bind(vec![]).await;
    let rt = remote(&daemon, addr_of(&worker), tmp.path());
    let a = agent("alpha");
    let err = tokio::time::timeout(WITHIN, rt.stop(&a)).await.expect("the call ended").unwrap_err();
    assert!(matches!(&err, Error::Remote { node, .. } if node == "node-1"), "{err}");
    assert!(err.to_string().contains("exceeds the limit"), "{err}");
    let err =
        tokio::time::timeout(WITHIN, rt.logs("alpha", Default::default())).await.expect("ended").unwrap_err();
    assert!(matches!(err, Error::Remote { .. }), "{err}");
    // Its view never listed: the Agent controller is told to wait, not that nothing runs.
    assert!(rt.answerable(&a).is_err());
    router.shutdown().await.unwrap();
}

/// A worker that takes every call and never answers.
#[derive(Debug, Clone)]
struct Silent;

impl ProtocolHandler for Silent {
    async fn accept(&self, conn: Connection) -> Result<(), AcceptError> {
        let mut held = Vec::new();
        while let Ok(stream) = conn.accept_bi().await {
            held.push(stream);
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_worker_that_never_answers_is_an_error_within_the_calls_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let worker = bind(vec![RUNTIME_ALPN.to_vec()]).await;
    let router = Router::builder(worker.clone()).accept(RUNTIME_ALPN, Silent).spawn();
    let daemon = bind(vec![]).await;
    let rt = remote(&daemon, addr_of(&worker), tmp.path()).with_quick_bound(Duration::from_millis(300));
    let mut a = agent("alpha");
    let err = tokio::time::timeout(WITHIN, rt.signal(&a)).await.expect("the call is bounded").unwrap_err();
    assert!(err.to_string().contains("did not answer within"), "{err}");
    // A stop gets twice the agent's graceful-stop time on top.
    a.spec.runtime.graceful_stop_seconds = Some(1);
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(WITHIN, rt.stop(&a)).await.expect("the stop is bounded").unwrap_err();
    assert!(err.to_string().contains("did not answer within"), "{err}");
    assert!(started.elapsed() >= Duration::from_secs(2), "a stop waits out its graceful time");
    router.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_worker_that_is_not_there_is_an_error_within_the_dial_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let gone = bind(vec![RUNTIME_ALPN.to_vec()]).await;
    let addr = addr_of(&gone);
    gone.close().await;
    let daemon = bind(vec![]).await;
    let rt = remote(&daemon, addr, tmp.path());
    let err = tokio::time::timeout(Duration::from_secs(30), rt.kill(&agent("alpha")))
        .await
        .expect("the dial is bounded")
        .unwrap_err();
    assert!(matches!(err, Error::Remote { .. }), "{err}");
}

#[tokio::test]
async fn the_worker_answers_its_daemon_only() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = bind(vec![]).await;
    let stranger = bind(vec![]).await;
    let worker = bind(vec![RUNTIME_ALPN.to_vec()]).await;
    let agents = tmp.path().join("agents");
    let runtime = Arc::new(ProcessRuntime::new(ProcessConfig::new(agents.clone())));
    let service = RuntimeService::new("node-1", daemon.id(), runtime, agents, tmp.path().join("incoming"));
    let router = Router::builder(worker.clone()).accept(RUNTIME_ALPN, service).spawn();
    let a = agent("alpha");

    // Its daemon is answered: the agent is not installed there, so observing it says so.
    let ours = remote(&daemon, addr_of(&worker), &tmp.path().join("ship-a"));
    let observed = tokio::time::timeout(WITHIN, ours.observed(&a)).await.expect("answered").unwrap();
    assert!(!observed.running() && observed.generation.is_none(), "{observed:?}");
    tokio::time::timeout(WITHIN, async {
        while ours.answerable(&a).is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the daemon's view lists the worker's agents");

    // Another endpoint is turned away before any call runs.
    let theirs = remote(&stranger, addr_of(&worker), &tmp.path().join("ship-b"));
    let err = tokio::time::timeout(WITHIN, theirs.observed(&a)).await.expect("ended").unwrap_err();
    assert!(matches!(err, Error::Remote { .. }), "{err}");
    router.shutdown().await.unwrap();
}
