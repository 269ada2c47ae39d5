//! Tests of the PKI life cycle and of a real handshake against the server config.

use super::*;
use std::os::unix::fs::PermissionsExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn hosts(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn ensure_creates_then_reuses() {
    let dir = tempfile::tempdir().unwrap();
    let paths = PkiPaths::new(dir.path());
    let first = ensure(dir.path(), &hosts(&["localhost", "127.0.0.1"])).unwrap();
    let files = [&paths.ca_cert, &paths.ca_key, &paths.server_cert, &paths.server_key];
    let before: Vec<_> = files.iter().map(|p| read(p)).collect();

    let second = ensure(dir.path(), &hosts(&["127.0.0.1", "localhost", "LOCALHOST"])).unwrap();
    let after: Vec<_> = files.iter().map(|p| read(p)).collect();
    assert_eq!(before, after, "second start reuses CA and serving certificate byte for byte");
    assert_eq!(first.ca_pem(), second.ca_pem());
    assert_eq!(first.cert_pem(), second.cert_pem());
    assert_eq!(first.ca_pem().unwrap().as_bytes(), read(&paths.ca_cert));

    for key in [&paths.ca_key, &paths.server_key] {
        assert_eq!(std::fs::metadata(key).unwrap().permissions().mode() & 0o777, 0o600, "{key:?}");
    }
    let pki_mode = std::fs::metadata(paths.ca_cert.parent().unwrap()).unwrap().permissions().mode();
    assert_eq!(pki_mode & 0o777, 0o700);
}

#[test]
fn reissues_for_new_host_with_same_ca() {
    let dir = tempfile::tempdir().unwrap();
    let paths = PkiPaths::new(dir.path());
    let first = ensure(dir.path(), &hosts(&["localhost"])).unwrap();
    let ca_key = read(&paths.ca_key);
    let second = ensure(dir.path(), &hosts(&["localhost", "hive.example.com", "10.1.2.3"])).unwrap();
    assert_eq!(first.ca_pem(), second.ca_pem());
    assert_eq!(ca_key, read(&paths.ca_key));
    assert_ne!(first.cert_pem(), second.cert_pem());
    let ca = first_cert(second.ca_pem().unwrap()).unwrap();
    let leaf = first_cert(second.cert_pem()).unwrap();
    let all = hosts(&["localhost", "hive.example.com", "10.1.2.3"]);
    verify_for_hosts(&ca, &leaf, &all, &ring_provider(), UnixTime::now()).unwrap();
    // A subset of the names already covered does not re-issue.
    let third = ensure(dir.path(), &hosts(&["10.1.2.3"])).unwrap();
    assert_eq!(second.cert_pem(), third.cert_pem());
}

#[test]
fn reissues_when_expiry_is_near() {
    let dir = tempfile::tempdir().unwrap();
    let paths = PkiPaths::new(dir.path());
    let names = hosts(&["localhost"]);
    ensure(dir.path(), &names).unwrap();
    let ca = ensure_ca(&paths).unwrap();
    let (short_cert, short_key) = issue_server_cert(&ca, &names, 10).unwrap();
    std::fs::write(&paths.server_cert, &short_cert).unwrap();
    std::fs::write(&paths.server_key, &short_key).unwrap();
    let renewed = ensure(dir.path(), &names).unwrap();
    assert_ne!(renewed.cert_pem(), short_cert);
    assert_eq!(renewed.ca_pem(), Some(ca.cert_pem.as_str()));
}

#[test]
fn reissues_when_key_does_not_match() {
    let dir = tempfile::tempdir().unwrap();
    let paths = PkiPaths::new(dir.path());
    let first = ensure(dir.path(), &hosts(&["localhost"])).unwrap();
    std::fs::write(&paths.server_key, KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let second = ensure(dir.path(), &hosts(&["localhost"])).unwrap();
    assert_ne!(first.cert_pem(), second.cert_pem());
    server_config(&second).unwrap();
}

#[test]
fn ca_problems_are_hard_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let paths = PkiPaths::new(dir.path());
    ensure(dir.path(), &hosts(&["localhost"])).unwrap();

    std::fs::write(&paths.ca_key, "garbage").unwrap();
    let err = format!("{:#}", ensure(dir.path(), &hosts(&["localhost"])).unwrap_err());
    assert!(err.contains(&paths.ca_key.display().to_string()), "{err}");

    std::fs::remove_file(&paths.ca_key).unwrap();
    let err = format!("{:#}", ensure(dir.path(), &hosts(&["localhost"])).unwrap_err());
    assert!(err.contains("ca.key is missing"), "{err}");

    // Another key next to the old certificate: mismatch, not a silent new CA.
    std::fs::write(&paths.ca_key, KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let err = format!("{:#}", ensure(dir.path(), &hosts(&["localhost"])).unwrap_err());
    assert!(err.contains("does not match"), "{err}");
}

#[test]
fn ca_certificate_is_recreated_from_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let paths = PkiPaths::new(dir.path());
    let first = ensure(dir.path(), &hosts(&["localhost"])).unwrap();
    std::fs::remove_file(&paths.ca_cert).unwrap();
    let second = ensure(dir.path(), &hosts(&["localhost"])).unwrap();
    // The old serving certificate still chains to the re-created CA certificate.
    assert_eq!(first.cert_pem(), second.cert_pem());
}

#[test]
fn rejects_bad_hosts_and_skips_unspecified() {
    assert_eq!(
        normalize_hosts(&hosts(&["0.0.0.0", "[::1]", " Localhost ", "localhost", "::"])).unwrap(),
        hosts(&["::1", "localhost"])
    );
    assert!(normalize_hosts(&hosts(&["bad host"])).is_err());
    assert!(normalize_hosts(&hosts(&["0.0.0.0"])).is_err());
}

#[test]
fn load_custom_reads_chain_and_names_files() {
    let dir = tempfile::tempdir().unwrap();
    let own = ensure(&dir.path().join("own"), &hosts(&["localhost"])).unwrap();
    let chain = format!("{}{}", own.cert_pem(), own.ca_pem().unwrap());
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, &chain).unwrap();
    std::fs::copy(dir.path().join("own/pki/server.key"), &key).unwrap();
    let loaded = load_custom(&cert, &key).unwrap();
    assert_eq!(
        first_cert(loaded.ca_pem().unwrap()).unwrap(),
        first_cert(own.ca_pem().unwrap()).unwrap(),
        "CA data is the chain's last certificate"
    );

    std::fs::write(&key, KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let err = format!("{:#}", load_custom(&cert, &key).unwrap_err());
    assert!(err.contains("tls.key") && err.contains("does not fit"), "{err}");
    std::fs::write(&cert, "not pem").unwrap();
    let err = format!("{:#}", load_custom(&cert, &key).unwrap_err());
    assert!(err.contains("tls.crt"), "{err}");
    let err = format!("{:#}", load_custom(&dir.path().join("absent.crt"), &key).unwrap_err());
    assert!(err.contains("absent.crt"), "{err}");
}

#[test]
fn debug_hides_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let material = ensure(dir.path(), &hosts(&["localhost"])).unwrap();
    let debug = format!("{material:?}");
    assert!(!debug.contains("PRIVATE KEY") && !debug.contains(&material.key_pem), "{debug}");
}

/// A client that trusts only ca.crt completes a handshake for each name, negotiating
/// h2 when it offers it (else http/1.1), and exchanges bytes.
#[tokio::test]
async fn client_trusting_ca_completes_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let material = ensure(dir.path(), &hosts(&["localhost", "127.0.0.1"])).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config(&material).unwrap());

    let mut roots = RootCertStore::empty();
    roots.add(first_cert(&std::fs::read_to_string(dir.path().join("pki/ca.crt")).unwrap()).unwrap()).unwrap();
    let mut client = rustls::ClientConfig::builder_with_provider(ring_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        for _ in 0..3 {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            let mut buf = [0u8; 4];
            tls.read_exact(&mut buf).await.unwrap();
            tls.write_all(&buf).await.unwrap();
            tls.shutdown().await.unwrap();
        }
    });
    for name in ["localhost", "127.0.0.1"] {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let server_name = ServerName::try_from(name.to_owned()).unwrap();
        let mut tls = connector.connect(server_name, tcp).await.unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "{name}");
        tls.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
    }
    // A client that offers only http/1.1 gets it.
    let mut http1_client = (**connector.config()).clone();
    http1_client.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(http1_client))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    tls.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    tls.read_exact(&mut buf).await.unwrap();
    server.await.unwrap();

    // A name outside the certificate is refused by the client.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config(&material).unwrap());
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        assert!(acceptor.accept(tcp).await.is_err());
    });
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let wrong = ServerName::try_from("other.example").unwrap();
    assert!(connector.connect(wrong, tcp).await.is_err());
    server.await.unwrap();
}
