//! The auth matrix: anonymous, viewer, operator and admin against reads, spec writes,
//! provider writes and token management; tokens never leak.

use serde_json::json;

use crate::harness::{agent, Daemon};

#[tokio::test]
async fn role_matrix() {
    let d = Daemon::start();
    let admin = d.client();
    let mut tokens = std::collections::BTreeMap::new();
    for role in ["viewer", "operator", "admin"] {
        let name = format!("t-{role}");
        let reply = admin.post("/hive/v1/tokens", &json!({"name": name, "role": role})).await;
        assert_eq!(reply.code, 201, "{:?}", reply.body);
        tokens.insert(role, reply.body["token"].as_str().unwrap().to_string());
    }
    let provider = json!({"apiVersion": "hive.dev/v1", "kind": "Provider", "metadata": {"name": "local"}, "spec": {"type": "process"}});
    // (who, GET agents, POST agent, POST provider, POST token)
    let matrix = [
        (None, 401, 401, 401, 401),
        (Some("viewer"), 200, 403, 403, 403),
        (Some("operator"), 200, 201, 403, 403),
        (Some("admin"), 200, 201, 201, 201),
    ];
    for (i, (who, list, create, provider_create, token_create)) in matrix.into_iter().enumerate() {
        let api = d.client_with(who.map(|r| tokens[r].as_str()));
        let label = who.unwrap_or("anonymous");
        let got = api.get("/apis/hive.dev/v1/agents").await;
        assert_eq!(got.code, list, "{label} list");
        if list != 200 {
            assert_eq!(got.body["kind"], "Status", "{label}: errors are Status objects");
        }
        let created = api.post("/apis/hive.dev/v1/agents", &agent(&format!("m{i}"))).await;
        assert_eq!(created.code, create, "{label} create agent: {:?}", created.body);
        let mut p = provider.clone();
        p["metadata"]["name"] = json!(format!("p{i}"));
        let pc = api.post("/apis/hive.dev/v1/providers", &p).await;
        assert_eq!(pc.code, provider_create, "{label} create provider: {:?}", pc.body);
        let tc = api.post("/hive/v1/tokens", &json!({"name": format!("x{i}"), "role": "viewer"})).await;
        assert_eq!(tc.code, token_create, "{label} create token");
        if create == 403 {
            assert_eq!(created.body["reason"], "Forbidden");
            assert!(created.body["message"].as_str().unwrap().contains("cannot create resource \"agents\""));
        }
    }
    let listed = admin.get("/hive/v1/tokens").await;
    let text = listed.body.to_string();
    for token in tokens.values() {
        assert!(!text.contains(token.as_str()), "token list must not contain secrets");
    }
    let log = d.log();
    assert!(!log.contains(&d.token), "the admin token leaked into the log");
    for token in tokens.values() {
        assert!(!log.contains(token.as_str()), "a token leaked into the log");
    }
    // /version stays open to anonymous clients.
    assert_eq!(d.client_with(None).get("/version").await.code, 200);
    assert_eq!(d.client_with(Some("hive_wrong")).get("/apis").await.code, 401);
}

#[test]
fn token_create_cli_prints_a_working_token() {
    let d = Daemon::start();
    let out = d.hive(&["token", "create", "--name", "ci", "--role", "viewer"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(token.starts_with("hive_"), "{token}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let code = rt.block_on(async { d.client_with(Some(&token)).get("/apis/hive.dev/v1/agents").await.code });
    assert_eq!(code, 200);
}

#[tokio::test]
async fn bring_your_own_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let cert_path = dir.path().join("own.crt");
    let key_path = dir.path().join("own.key");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let state = dir.path().join("state");
    let d = Daemon::spawn(
        &state,
        &["--tls-cert", cert_path.to_str().unwrap(), "--tls-key", key_path.to_str().unwrap()],
    )
    .expect("starts with its own certificate");
    assert_eq!(d.ca_pem, cert.pem().into_bytes(), "the kubeconfig trusts the operator's certificate");
    assert!(!state.join("pki").exists(), "no private CA is minted when a certificate is given");
    assert_eq!(d.client().get("/apis/hive.dev/v1/agents").await.code, 200);
    let out = d.kubectl(&["get", "agents"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
