//! Unit tests of the Docker client's pure parts: labels, names, GPU requests, addresses
//! and error mapping. The engine itself is exercised by `tests/it/fleet_docker.rs`.

use std::collections::HashMap;

use bollard::models::{EndpointSettings, RestartPolicyNameEnum};

use super::*;

fn request() -> NodeRequest {
    NodeRequest {
        fleet: "a1b2c3d4".into(),
        run_id: "run-7".into(),
        node: "node-3".into(),
        logical_id: 3,
        command: "cmd-1".into(),
        image: "hive-node:test".into(),
        cmd: vec!["/usr/local/bin/hive".into(), "fleet-worker".into(), "--node".into(), "node-3".into()],
        env: vec![("A".into(), "1".into())],
        network: Some("hive-net".into()),
        gpus: None,
        keep_stdin_open: false,
    }
}

#[test]
fn every_container_carries_the_five_labels() {
    let labels = node_labels(&request());
    let mut got: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("dev.hive.command", "cmd-1"),
            ("dev.hive.fleet", "a1b2c3d4"),
            ("dev.hive.logical-id", "3"),
            ("dev.hive.node", "node-3"),
            ("dev.hive.run-id", "run-7"),
        ]
    );
}

#[test]
fn container_names_are_deterministic_and_valid() {
    let cases = [
        ("a1b2c3d4", "node-3", "hive-a1b2c3d4-node-3"),
        // The fleet part is cut to FLEET_SHORT characters.
        ("0123456789abcdef", "node-1", "hive-0123456789ab-node-1"),
        // Characters a container name cannot hold become `-`.
        ("fleet/x y", "node:1", "hive-fleet-x-y-node-1"),
    ];
    for (fleet, node, want) in cases {
        assert_eq!(container_name(fleet, node), want, "{fleet} {node}");
    }
}

#[test]
fn only_the_same_fleet_node_and_command_is_adopted() {
    let req = request();
    let mut labels = node_labels(&req);
    assert_eq!(foreign(&labels, &req), None);
    // Another run of the same daemon still adopts: the run id is not part of identity.
    labels.insert(LABEL_RUN_ID.into(), "run-8".into());
    assert_eq!(foreign(&labels, &req), None);

    let mut other_command = labels.clone();
    other_command.insert(LABEL_COMMAND.into(), "cmd-2".into());
    let why = foreign(&other_command, &req).expect("another command is not adopted");
    assert!(why.contains("\"cmd-2\"") && why.contains("\"cmd-1\""), "{why}");

    let mut other_fleet = labels.clone();
    other_fleet.insert(LABEL_FLEET.into(), "ffffffff".into());
    assert!(foreign(&other_fleet, &req).is_some());

    let why = foreign(&HashMap::new(), &req).expect("an unlabelled container is not adopted");
    assert!(why.contains("not managed by hive"), "{why}");
}

#[test]
fn gpus_become_device_requests() {
    let all = gpu_request("all").unwrap();
    assert_eq!((all.count, all.device_ids.clone()), (Some(-1), None));
    assert_eq!(all.capabilities, Some(vec![vec!["gpu".to_string()]]));
    assert_eq!(gpu_request("2").unwrap().count, Some(2));
    assert_eq!(gpu_request("\"device=0, 2\"").unwrap().device_ids, Some(vec!["0".into(), "2".into()]));
    for bad in ["", "0", "-1", "many", "device="] {
        assert!(gpu_request(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_create_body_is_what_a_node_needs() {
    let mut req = request();
    let body = create_body(&req).unwrap();
    assert_eq!(body.image.as_deref(), Some("hive-node:test"));
    assert_eq!(body.entrypoint, Some(vec![req.cmd[0].clone()]), "the image's entrypoint is replaced");
    assert_eq!(body.cmd.as_ref().unwrap()[0], "fleet-worker");
    assert_eq!(body.env, Some(vec!["A=1".to_string()]));
    assert_eq!(body.labels, Some(node_labels(&req)));
    assert_eq!((body.tty, body.open_stdin, body.attach_stdin), (Some(false), Some(false), Some(false)));
    let host = body.host_config.unwrap();
    assert_eq!(host.init, Some(true));
    assert_eq!(host.restart_policy.unwrap().name, Some(RestartPolicyNameEnum::NO));
    assert_eq!(host.network_mode.as_deref(), Some("hive-net"));
    assert_eq!(host.device_requests, None);
    let endpoints = body.networking_config.unwrap().endpoints_config.unwrap();
    assert!(endpoints.contains_key("hive-net"));

    req.keep_stdin_open = true;
    req.gpus = Some("all".into());
    req.network = None;
    let body = create_body(&req).unwrap();
    assert_eq!((body.open_stdin, body.stdin_once), (Some(true), Some(false)));
    assert_eq!(body.host_config.unwrap().device_requests.unwrap().len(), 1);
    assert!(body.networking_config.is_none());

    req.gpus = Some("lots".into());
    let err = create_body(&req).unwrap_err().to_string();
    assert!(err.starts_with("creating container for node-3: gpus \"lots\""), "{err}");
}

#[test]
fn the_node_ip_is_the_one_on_its_network() {
    let endpoint = |ip: &str| EndpointSettings { ip_address: Some(ip.into()), ..Default::default() };
    let two =
        HashMap::from([("a".to_string(), endpoint("10.0.0.2")), ("b".to_string(), endpoint("10.1.0.2"))]);
    assert_eq!(node_ip(Some("b"), Some(&two)), Some("10.1.0.2".parse().unwrap()));
    assert_eq!(node_ip(Some("default"), Some(&two)), None, "ambiguous without the node's network");
    let one = HashMap::from([("bridge".to_string(), endpoint("172.17.0.5"))]);
    assert_eq!(node_ip(Some("default"), Some(&one)), Some("172.17.0.5".parse().unwrap()));
    let unassigned = HashMap::from([("a".to_string(), endpoint(""))]);
    assert_eq!(node_ip(Some("a"), Some(&unassigned)), None);
    assert_eq!(node_ip(Some("a"), None), None);
}

#[test]
fn engine_addresses() {
    let ok = |host: Option<&str>, env: Option<&str>| engine_endpoint(host, env).unwrap();
    assert_eq!(ok(None, None), Endpoint::Unix("/var/run/docker.sock".into()));
    assert_eq!(
        ok(None, Some("unix:///run/user/1/docker.sock")),
        Endpoint::Unix("/run/user/1/docker.sock".into())
    );
    assert_eq!(ok(Some("unix:///x.sock"), Some("tcp://h:2375")), Endpoint::Unix("/x.sock".into()));
    assert_eq!(ok(Some("/x.sock"), None), Endpoint::Unix("/x.sock".into()));
    assert_eq!(ok(Some(""), None), Endpoint::Unix("/var/run/docker.sock".into()));
    assert_eq!(ok(Some("tcp://h:2375"), None), Endpoint::Http("tcp://h:2375".into()));
    assert_eq!(ok(None, None).to_string(), DEFAULT_HOST);
    for bad in ["ssh://h", "unix://relative", "h:2375"] {
        let err = engine_endpoint(Some(bad), None).unwrap_err();
        assert!(matches!(err, DockerError::Address { .. }), "{bad}: {err}");
    }
}

#[test]
fn engine_errors_name_the_operation() {
    let server = |status_code, message: &str| bollard::errors::Error::DockerResponseServerError {
        status_code,
        message: message.into(),
    };
    let err = engine("starting container 0123456789ab for node-3".into())(server(500, "exec failed\n"));
    assert_eq!(err.status(), Some(500));
    assert_eq!(err.to_string(), "starting container 0123456789ab for node-3: exec failed (HTTP 500)");
    assert_eq!(status_of(&server(409, "conflict")), Some(409));
    assert_eq!(status_of(&bollard::errors::Error::RequestTimeoutError), None);
    let err =
        engine("pinging the Docker Engine at unix:///x".into())(bollard::errors::Error::RequestTimeoutError);
    assert!(matches!(err, DockerError::Transport { .. }));
    assert_eq!(err.to_string(), "pinging the Docker Engine at unix:///x: Timeout error");

    let missing = DockerError::ImageNotFound { node: "node-3".into(), image: "hive-node:test".into() };
    assert_eq!(
        missing.to_string(),
        "creating container for node-3: image \"hive-node:test\" not found (pull or build it first)"
    );
    assert_eq!(short("0123456789abcdef"), "0123456789ab");
    assert_eq!(short("abc"), "abc");
}

#[tokio::test]
async fn connecting_fails_clearly_without_an_engine() {
    let err = DockerNodes::connect(Some("tcp://127.0.0.1:1")).await.unwrap_err();
    assert!(matches!(err, DockerError::Address { .. }), "{err:?}");
    assert!(err.to_string().contains("only unix://"), "{err}");

    let err = DockerNodes::connect(Some("unix:///nonexistent/docker.sock")).await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("connecting to the Docker Engine at unix:///nonexistent/docker.sock: "),
        "{message}"
    );

    let err = DockerNodes::connect(Some("ssh://somewhere")).await.unwrap_err();
    assert!(matches!(err, DockerError::Address { .. }), "{err:?}");
}

#[tokio::test]
async fn an_engine_that_refuses_the_connection_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("docker.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let host = format!("unix://{}", socket.display());
    let err = DockerNodes::connect(Some(&host)).await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("negotiating the API version with the Docker Engine at {host}: ")),
        "{message}"
    );
    assert!(message.contains("Connection refused"), "the cause is in the text: {message}");
}
