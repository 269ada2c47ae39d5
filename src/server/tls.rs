//! TLS: the private CA, the serving certificate, and the rustls config.
//!
//! hive serves HTTPS by default because kubectl sends bearer tokens only over TLS. As k3s
//! does, the first start creates a private CA and a serving certificate under
//! `<state-dir>/pki/`; the CA goes into the generated kubeconfig, so clients verify the
//! server without any setup. Later starts reuse the CA and re-issue only the serving
//! certificate, and only when it no longer fits (new host name, expiry near). Operators
//! with their own PKI pass `--tls-cert/--tls-key` instead ([`load_custom`]).
//!
//! Architecture Invariant: private keys never reach a log line or `Debug` output, and are
//! written with mode 0600 only.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use chrono::{Datelike, NaiveDate};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use ring::rand::{SecureRandom, SystemRandom};
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

use crate::auth::secret_file::{create_private_dir, write_atomic, PUBLIC_MODE, SECRET_MODE};

/// The CA lives ten years: re-issuing it would invalidate every kubeconfig handed out.
const CA_VALIDITY_DAYS: u64 = 3650;
/// The serving certificate lives about a year; it is re-issued at start as it nears expiry.
const SERVER_VALIDITY_DAYS: u64 = 365;
/// A serving certificate that expires within this window is re-issued at start.
const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// The CA's subject. Fixed, because re-issuing a serving certificate rebuilds the issuer
/// from this name and `ca.key` (rcgen cannot parse `ca.crt` without extra dependencies);
/// the result chains to `ca.crt` because name and key are what chaining checks.
const CA_COMMON_NAME: &str = "hive-ca";
const SERVER_COMMON_NAME: &str = "hive";
/// The protocols we serve, advertised via ALPN in our order of preference (rustls picks
/// the first one the client offers too): HTTP/2, so that one client's many watches share
/// one connection, and HTTP/1.1.
const ALPN_H2: &[u8] = b"h2";
const ALPN_HTTP11: &[u8] = b"http/1.1";

/// A serving certificate chain and its key, plus the CA that clients should trust.
pub struct TlsMaterial {
    /// PEM of the CA certificate a kubeconfig should carry; `None` when the operator's
    /// certificate should be checked against the client's system roots.
    ca_pem: Option<String>,
    /// PEM of the serving certificate chain, leaf first.
    cert_pem: String,
    /// PEM of the serving key. Secret.
    key_pem: String,
    /// Where the certificate and key were read from or written to, for error messages.
    cert_path: PathBuf,
    key_path: PathBuf,
}

impl TlsMaterial {
    /// PEM of the CA certificate clients should trust (for the kubeconfig's
    /// `certificate-authority-data`), if there is one.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// PEM of the serving certificate chain, leaf first.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The file the serving certificate came from.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("has_ca", &self.ca_pem.is_some())
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

/// The files under `<state-dir>/pki/`.
struct PkiPaths {
    ca_cert: PathBuf,
    ca_key: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

impl PkiPaths {
    fn new(state_dir: &Path) -> PkiPaths {
        let pki = state_dir.join("pki");
        PkiPaths {
            ca_cert: pki.join("ca.crt"),
            ca_key: pki.join("ca.key"),
            server_cert: pki.join("server.crt"),
            server_key: pki.join("server.key"),
        }
    }
}

/// The private CA: its key signs serving certificates; its certificate is what clients trust.
struct Ca {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    key: KeyPair,
}

/// Makes sure `<state_dir>/pki/` holds a CA and a serving certificate valid for every name in
/// `hosts` (the listen host, `localhost`, `127.0.0.1`, …), creating or re-issuing what is
/// missing or stale, and returns them.
///
/// IP addresses become IP SANs, anything else DNS SANs. Unspecified addresses (`0.0.0.0`,
/// `::`) are skipped: no client connects to them by that name. A missing, unreadable or
/// mismatched CA key is a hard error, since silently minting a new CA would break every
/// kubeconfig that trusts the old one; the serving certificate is derived material and is
/// simply re-issued when it does not fit.
pub fn ensure(state_dir: &Path, hosts: &[String]) -> Result<TlsMaterial> {
    let hosts = normalize_hosts(hosts)?;
    let paths = PkiPaths::new(state_dir);
    let pki_dir = paths.ca_cert.parent().expect("pki paths have a parent");
    create_private_dir(pki_dir).with_context(|| format!("creating TLS directory {}", pki_dir.display()))?;

    let ca = ensure_ca(&paths)?;
    let provider = ring_provider();

    match check_server_cert(&paths, &ca, &hosts, &provider) {
        Ok(material) => return Ok(material),
        Err(Stale::Missing) => tracing::info!(hosts = ?hosts, "issuing TLS serving certificate"),
        Err(Stale::Unfit(why)) => {
            tracing::info!(cert = %paths.server_cert.display(), reason = %why, hosts = ?hosts, "re-issuing TLS serving certificate")
        }
    }
    let (cert_pem, key_pem) = issue_server_cert(&ca, &hosts, SERVER_VALIDITY_DAYS)?;
    // A certificate that does not verify against ca.crt means ca.crt and ca.key do not
    // belong together (or ca.crt was replaced by another CA): say so rather than loop.
    verify_for_hosts(&ca.cert_der, &first_cert(&cert_pem)?, &hosts, &provider, UnixTime::now()).map_err(
        |why| {
            anyhow!(
                "TLS CA {} does not match {} (a freshly issued certificate fails to verify: {why}); \
                 restore the original pair, or remove the whole {} directory to create a new CA \
                 (every kubeconfig must then be re-issued)",
                paths.ca_cert.display(),
                paths.ca_key.display(),
                pki_dir.display()
            )
        },
    )?;
    // Key first: a crash between the two writes leaves a new key with the old certificate,
    // which the next start detects (the pair does not match) and re-issues.
    write_atomic(&paths.server_key, key_pem.as_bytes(), SECRET_MODE)
        .with_context(|| format!("writing TLS key {}", paths.server_key.display()))?;
    write_atomic(&paths.server_cert, cert_pem.as_bytes(), PUBLIC_MODE)
        .with_context(|| format!("writing TLS certificate {}", paths.server_cert.display()))?;
    Ok(TlsMaterial {
        ca_pem: Some(ca.cert_pem),
        cert_pem,
        key_pem,
        cert_path: paths.server_cert,
        key_path: paths.server_key,
    })
}

/// Loads an operator-provided certificate chain (leaf first) and key, for `--tls-cert` and
/// `--tls-key`. The last certificate of the chain becomes the CA data for kubeconfigs: the
/// issuing CA when the file carries the chain, the certificate itself when it is a single
/// self-signed one. Fails, naming the file, when either does not parse or they do not match.
pub fn load_custom(cert: &Path, key: &Path) -> Result<TlsMaterial> {
    let cert_pem = read_to_string(cert, "TLS certificate")?;
    let key_pem = read_to_string(key, "TLS key")?;
    let chain = parse_chain(&cert_pem).with_context(|| format!("TLS certificate {}", cert.display()))?;
    let ca_pem = chain.last().map(|der| to_pem(der));
    let material =
        TlsMaterial { ca_pem, cert_pem, key_pem, cert_path: cert.to_owned(), key_path: key.to_owned() };
    // Fail at start, naming the files, rather than at the first handshake.
    server_config(&material)?;
    Ok(material)
}

/// The rustls server configuration for `material`: TLS 1.2/1.3 with the ring provider
/// (named explicitly, so no process-wide default provider is needed), no client
/// certificates (clients authenticate with bearer tokens), ALPN `h2` and `http/1.1`.
pub fn server_config(material: &TlsMaterial) -> Result<Arc<rustls::ServerConfig>> {
    let chain = parse_chain(&material.cert_pem)
        .with_context(|| format!("TLS certificate {}", material.cert_path.display()))?;
    let key =
        parse_key(&material.key_pem).with_context(|| format!("TLS key {}", material.key_path.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(ring_provider())
        .with_safe_default_protocol_versions()
        .context("the ring crypto provider supports no safe TLS version")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .with_context(|| {
            format!(
                "TLS key {} does not fit certificate {}",
                material.key_path.display(),
                material.cert_path.display()
            )
        })?;
    config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP11.to_vec()];
    Ok(Arc::new(config))
}

/// `config` offering ALPN `http/1.1` only (for connections refused over the cap).
pub fn http1_only(config: &rustls::ServerConfig) -> Arc<rustls::ServerConfig> {
    let mut config = config.clone();
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    Arc::new(config)
}

fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Trims, unbrackets (`[::1]`), validates and dedups host names, keeping their order.
fn normalize_hosts(hosts: &[String]) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for raw in hosts {
        let host = raw.trim();
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if host.is_empty() {
            continue;
        }
        let host = match host.parse::<IpAddr>() {
            Ok(ip) if ip.is_unspecified() => continue,
            Ok(ip) => ip.to_string(),
            Err(_) => {
                let host = host.to_ascii_lowercase();
                ServerName::try_from(host.as_str())
                    .map_err(|_| anyhow!("TLS host {raw:?} is neither an IP address nor a DNS name"))?;
                host
            }
        };
        if !out.contains(&host) {
            out.push(host);
        }
    }
    if out.is_empty() {
        bail!("no host name to put in the TLS certificate (given {hosts:?})");
    }
    Ok(out)
}

/// The CA under `<state_dir>/pki/` (created on first start): its certificate and key,
/// PEM, for replicas that share one CA (the store on etcd keeps it for them).
pub fn ca_pems(state_dir: &Path) -> Result<(String, String)> {
    let paths = PkiPaths::new(state_dir);
    let pki_dir = paths.ca_cert.parent().expect("pki paths have a parent");
    create_private_dir(pki_dir).with_context(|| format!("creating TLS directory {}", pki_dir.display()))?;
    let ca = ensure_ca(&paths)?;
    Ok((ca.cert_pem, ca.key.serialize_pem()))
}

/// Makes the CA under `<state_dir>/pki/` the one given (shared by every replica), if it
/// is not already: writes it and drops the serving certificate issued by another, which
/// [`ensure`] then issues again. Says whether it replaced a CA that was there.
pub fn adopt_ca(state_dir: &Path, cert_pem: &str, key_pem: &str) -> Result<bool> {
    let paths = PkiPaths::new(state_dir);
    let pki_dir = paths.ca_cert.parent().expect("pki paths have a parent");
    create_private_dir(pki_dir).with_context(|| format!("creating TLS directory {}", pki_dir.display()))?;
    let held = |path: &Path| std::fs::read_to_string(path).ok();
    if held(&paths.ca_cert).as_deref() == Some(cert_pem) && held(&paths.ca_key).as_deref() == Some(key_pem) {
        return Ok(false);
    }
    // Check the pair before anything is written: a broken shared CA must not replace a
    // working local one.
    let cert_der = first_cert(cert_pem).context("the shared TLS CA certificate")?;
    let key_der = parse_key(key_pem).context("the shared TLS CA key")?;
    CertifiedKey::from_der(vec![cert_der], key_der, &ring_provider())
        .map_err(|e| anyhow!("the shared TLS CA's key does not match its certificate: {e}"))?;
    let replaced = exists(&paths.ca_cert)?;
    for stale in [&paths.server_cert, &paths.server_key] {
        match std::fs::remove_file(stale) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", stale.display())),
        }
    }
    write_atomic(&paths.ca_key, key_pem.as_bytes(), SECRET_MODE)
        .with_context(|| format!("writing TLS CA key {}", paths.ca_key.display()))?;
    write_atomic(&paths.ca_cert, cert_pem.as_bytes(), PUBLIC_MODE)
        .with_context(|| format!("writing TLS CA certificate {}", paths.ca_cert.display()))?;
    Ok(replaced)
}

/// Loads the CA, or creates it on first start.
fn ensure_ca(paths: &PkiPaths) -> Result<Ca> {
    let key_exists = exists(&paths.ca_key)?;
    let cert_exists = exists(&paths.ca_cert)?;
    if !key_exists {
        if cert_exists {
            bail!(
                "TLS CA key {} is missing but {} exists; restore the key, or remove both to create a new CA \
                 (every kubeconfig must then be re-issued)",
                paths.ca_key.display(),
                paths.ca_cert.display()
            );
        }
        let key = KeyPair::generate().context("generating the TLS CA key")?;
        write_atomic(&paths.ca_key, key.serialize_pem().as_bytes(), SECRET_MODE)
            .with_context(|| format!("writing TLS CA key {}", paths.ca_key.display()))?;
        return write_ca_cert(paths, key);
    }
    let key_pem = read_to_string(&paths.ca_key, "TLS CA key")?;
    let key = KeyPair::from_pem(&key_pem)
        .map_err(|e| anyhow!("TLS CA key {}: not a usable private key: {e}", paths.ca_key.display()))?;
    if !cert_exists {
        // A crash between writing ca.key and ca.crt on first start. The CA is its name and
        // key, so a new self-signed certificate for them is the same CA.
        tracing::warn!(cert = %paths.ca_cert.display(), "TLS CA certificate missing; re-creating it from the CA key");
        return write_ca_cert(paths, key);
    }
    let cert_pem = read_to_string(&paths.ca_cert, "TLS CA certificate")?;
    let cert_der =
        first_cert(&cert_pem).with_context(|| format!("TLS CA certificate {}", paths.ca_cert.display()))?;
    let key_der = parse_key(&key_pem).with_context(|| format!("TLS CA key {}", paths.ca_key.display()))?;
    CertifiedKey::from_der(vec![cert_der.clone()], key_der, &ring_provider()).map_err(|e| {
        anyhow!(
            "TLS CA key {} does not match certificate {}: {e}",
            paths.ca_key.display(),
            paths.ca_cert.display()
        )
    })?;
    Ok(Ca { cert_pem, cert_der, key })
}

fn write_ca_cert(paths: &PkiPaths, key: KeyPair) -> Result<Ca> {
    let cert =
        ca_params(CA_VALIDITY_DAYS)?.self_signed(&key).context("self-signing the TLS CA certificate")?;
    let cert_pem = cert.pem();
    write_atomic(&paths.ca_cert, cert_pem.as_bytes(), PUBLIC_MODE)
        .with_context(|| format!("writing TLS CA certificate {}", paths.ca_cert.display()))?;
    Ok(Ca { cert_pem, cert_der: cert.der().clone(), key })
}

fn ca_params(validity_days: u64) -> Result<CertificateParams> {
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(CA_COMMON_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.serial_number = Some(random_serial()?);
    set_validity(&mut params, validity_days);
    Ok(params)
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// Validity from yesterday (tolerating clients whose clock is a little behind) for `days`.
fn set_validity(params: &mut CertificateParams, days: u64) {
    let today = crate::host::now().date_naive();
    let at = |date: NaiveDate| rcgen::date_time_ymd(date.year(), date.month() as u8, date.day() as u8);
    params.not_before = at(today - chrono::Days::new(1));
    params.not_after = at(today + chrono::Days::new(days));
}

/// A random positive 16-byte serial, so re-issued certificates never share a serial.
fn random_serial() -> Result<SerialNumber> {
    let mut bytes = [0u8; 16];
    SystemRandom::new().fill(&mut bytes).map_err(|_| anyhow!("the system random number generator failed"))?;
    bytes[0] &= 0x7f;
    Ok(SerialNumber::from_slice(&bytes))
}

/// Issues a serving certificate for `hosts`, signed by the CA, with a fresh key.
/// Returns (certificate PEM, key PEM).
fn issue_server_cert(ca: &Ca, hosts: &[String], validity_days: u64) -> Result<(String, String)> {
    let mut params = CertificateParams::new(hosts.to_vec()).context("building TLS certificate names")?;
    params.distinguished_name = distinguished_name(SERVER_COMMON_NAME);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial()?);
    set_validity(&mut params, validity_days);

    let issuer = ca_params(CA_VALIDITY_DAYS)?.self_signed(&ca.key).context("loading the TLS CA")?;
    let key = KeyPair::generate().context("generating the TLS serving key")?;
    let cert = params.signed_by(&key, &issuer, &ca.key).context("signing the TLS serving certificate")?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Why the stored serving certificate cannot be reused.
enum Stale {
    /// Certificate or key file is absent.
    Missing,
    /// It exists but does not fit; the text says why.
    Unfit(String),
}

/// Reuses the stored serving certificate when it parses, matches its key, chains to the CA
/// and is valid for every host both now and `RENEW_BEFORE` from now.
fn check_server_cert(
    paths: &PkiPaths,
    ca: &Ca,
    hosts: &[String],
    provider: &Arc<CryptoProvider>,
) -> Result<TlsMaterial, Stale> {
    let read = |path: &Path| match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Stale::Missing),
        Err(e) => Err(Stale::Unfit(format!("cannot read {}: {e}", path.display()))),
    };
    let cert_pem = read(&paths.server_cert)?;
    let key_pem = read(&paths.server_key)?;
    let unfit = |what: &Path, e: anyhow::Error| Stale::Unfit(format!("{}: {e:#}", what.display()));
    let chain = parse_chain(&cert_pem).map_err(|e| unfit(&paths.server_cert, e))?;
    let key = parse_key(&key_pem).map_err(|e| unfit(&paths.server_key, e))?;
    CertifiedKey::from_der(chain.clone(), key, provider)
        .map_err(|e| Stale::Unfit(format!("key does not match certificate: {e}")))?;
    let now = UnixTime::now();
    let soon = UnixTime::since_unix_epoch(Duration::from_secs(now.as_secs()) + RENEW_BEFORE);
    for at in [now, soon] {
        verify_for_hosts(&ca.cert_der, &chain[0], hosts, provider, at).map_err(Stale::Unfit)?;
    }
    Ok(TlsMaterial {
        ca_pem: Some(ca.cert_pem.clone()),
        cert_pem,
        key_pem,
        cert_path: paths.server_cert.clone(),
        key_path: paths.server_key.clone(),
    })
}

/// Verifies `leaf` as a client would: chains to `ca`, is a server certificate, is valid at
/// `at`, and names every host.
fn verify_for_hosts(
    ca: &CertificateDer<'static>,
    leaf: &CertificateDer<'static>,
    hosts: &[String],
    provider: &Arc<CryptoProvider>,
    at: UnixTime,
) -> Result<(), String> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).map_err(|e| format!("CA certificate unusable: {e}"))?;
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("CA certificate unusable: {e}"))?;
    for host in hosts {
        let name = ServerName::try_from(host.as_str()).map_err(|e| format!("host {host:?}: {e}"))?;
        verifier.verify_server_cert(leaf, &[], &name, &[], at).map_err(|e| format!("host {host:?}: {e}"))?;
    }
    Ok(())
}

fn parse_chain(pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    let chain = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("not valid PEM: {e}"))?;
    if chain.is_empty() {
        bail!("no CERTIFICATE block found");
    }
    Ok(chain)
}

fn first_cert(pem: &str) -> Result<CertificateDer<'static>> {
    Ok(parse_chain(pem)?.swap_remove(0))
}

fn parse_key(pem: &str) -> Result<PrivateKeyDer<'static>> {
    // The error text of the PEM parser never includes key material.
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| anyhow!("no usable PRIVATE KEY block: {e}"))
}

fn to_pem(der: &CertificateDer<'_>) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

fn read_to_string(path: &Path, what: &str) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {what} {}", path.display()))
}

fn exists(path: &Path) -> Result<bool> {
    path.try_exists().with_context(|| format!("checking {}", path.display()))
}

#[cfg(test)]
mod tests;
