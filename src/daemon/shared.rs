//! What replicas on one store on etcd share besides the objects: the token file (a token
//! made or revoked through any replica counts on every one), the dashboard's sessions (a
//! browser signed in on one replica is signed in on every one), the TLS CA (every
//! replica's serving certificate is issued by it, so one kubeconfig trusts them all and
//! replicas trust each other when a request is forwarded to the leader) and the fleet
//! identity (workers rejoin whichever replica leads; containers carry its label, so a
//! new leader adopts what the old one started). All are shared
//! documents (`store::etcd::docs`); the first replica to start seeds them from its state
//! directory, so a single daemon moved onto etcd keeps its tokens and its CA.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::auth::sessions::{Pending, Sessions, SharedSessions};
use crate::auth::{SharedTokens, Swapped, TokenStore};
use crate::store::etcd::client::{Client, ClientError, Op};
use crate::store::etcd::docs::{Doc, Moved};
use crate::store::etcd::Backend;

/// The token store every replica shares, seeded from `state_dir`'s own when etcd holds
/// none yet, and following every other replica's changes.
pub async fn tokens(backend: &Backend, state_dir: &Path) -> anyhow::Result<TokenStore> {
    let doc = backend.doc("tokens").await.context("reading the shared token file")?;
    if doc.current().is_none() {
        let local = TokenStore::open(state_dir)?;
        if !local.is_empty() {
            match doc.swap(None, local.to_bytes()).await.context("seeding the shared token file")? {
                Ok(_) => tracing::info!("the shared token file was seeded from this replica's tokens.json"),
                Err(Moved(_)) => tracing::info!("another replica seeded the shared token file first"),
            }
        }
    }
    let name = format!(
        "the shared token file (etcd key {})",
        String::from_utf8_lossy(&backend.internal_key("tokens"))
    );
    let current = doc.current().map(|v| (v.value, v.revision));
    let shared = Arc::new(EtcdTokens { doc: doc.clone(), runtime: tokio::runtime::Handle::current() });
    let store = TokenStore::open_shared(&name, shared, current)?;
    let follower = store.clone();
    let mut changes = doc.changes();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let latest = changes.borrow_and_update().clone();
            if let Some(version) = latest {
                follower.follow(&version.value, version.revision);
            }
        }
    });
    Ok(store)
}

/// The shared token file on etcd, written from the blocking threads the token store's
/// callers run it on.
struct EtcdTokens {
    doc: Doc,
    runtime: tokio::runtime::Handle,
}

impl SharedTokens for EtcdTokens {
    fn swap(&self, revision: u64, file: Vec<u8>) -> std::io::Result<Swapped> {
        let expected = (revision > 0).then_some(revision);
        match self.runtime.block_on(self.doc.swap(expected, file)) {
            Ok(Ok(written)) => Ok(Ok(written.revision)),
            Ok(Err(Moved(now))) => Ok(Err(now.map(|v| (v.value, v.revision)))),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }
}

/// The dashboard's sessions every replica shares: one key `<prefix>_sessions/<SHA-256 of
/// the session id, hex>` each, on a lease of the session's TTL, so etcd drops it when it
/// expires. Each replica caches the sessions it signed in or read, and drops one from its
/// cache when the feed hears its key deleted (signed out anywhere, or expired).
pub fn sessions(backend: &crate::store::etcd::Backend) -> Sessions {
    let prefix = backend.internal_key("sessions/");
    let sessions = Sessions::shared(Arc::new(EtcdSessions { etcd: backend.client().clone(), prefix }));
    let hearing = sessions.clone();
    backend.follow_internal(
        "sessions/",
        Box::new(move |key, value| {
            if let (None, Ok(key)) = (value, std::str::from_utf8(key)) {
                hearing.ended_elsewhere(key);
            }
        }),
    );
    sessions
}

/// The shared sessions on etcd (see [`sessions`]).
struct EtcdSessions {
    etcd: Arc<Client>,
    /// `<prefix>_sessions/`.
    prefix: Vec<u8>,
}

impl EtcdSessions {
    fn key(&self, key: &str) -> Vec<u8> {
        [self.prefix.as_slice(), key.as_bytes()].concat()
    }
}

fn io_error(e: ClientError) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl SharedSessions for EtcdSessions {
    fn put(&self, key: String, record: Vec<u8>, ttl: Duration) -> Pending<'_, ()> {
        Box::pin(async move {
            let (lease, _) = self.etcd.grant(ttl.as_secs()).await.map_err(io_error)?;
            let put = [Op::Put { key: self.key(&key), value: record, lease }];
            self.etcd.txn(&[], &put, &[]).await.map_err(io_error).map(drop)
        })
    }

    fn get(&self, key: String) -> Pending<'_, Option<Vec<u8>>> {
        // etcd's range is linearizable unless asked otherwise: a quorum read.
        Box::pin(async move {
            let page = self.etcd.range(&self.key(&key), &[], 1, 0).await.map_err(io_error)?;
            Ok(page.kvs.into_iter().next().map(|kv| kv.value))
        })
    }

    fn delete(&self, key: String) -> Pending<'_, ()> {
        Box::pin(async move {
            let delete = [Op::Delete { key: self.key(&key) }];
            self.etcd.txn(&[], &delete, &[]).await.map_err(io_error).map(drop)
        })
    }
}

/// The shared CA as etcd keeps it.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SharedCa {
    cert_pem: String,
    key_pem: String,
}

/// Makes `state_dir`'s CA the one every replica shares: the first replica offers its own;
/// every later one takes what is there (and issues its serving certificate from it).
pub async fn ca(backend: &Backend, state_dir: &Path) -> anyhow::Result<()> {
    let doc = backend.doc("ca").await.context("reading the shared TLS CA")?;
    let shared = match doc.current() {
        Some(version) => version,
        None => {
            let (cert_pem, key_pem) = crate::server::tls::ca_pems(state_dir)?;
            let offer = serde_json::to_vec(&SharedCa { cert_pem, key_pem }).expect("a CA serializes");
            match doc.swap(None, offer).await.context("storing the shared TLS CA")? {
                Ok(written) => {
                    tracing::info!("this replica's TLS CA is now the one every replica shares");
                    written
                }
                Err(Moved(Some(theirs))) => theirs,
                Err(Moved(None)) => {
                    anyhow::bail!("the shared TLS CA was deleted while this replica stored it")
                }
            }
        }
    };
    let ca: SharedCa = serde_json::from_slice(&shared.value).with_context(|| {
        format!(
            "the shared TLS CA (etcd key {}) is not what hive stores",
            String::from_utf8_lossy(&backend.internal_key("ca"))
        )
    })?;
    if crate::server::tls::adopt_ca(state_dir, &ca.cert_pem, &ca.key_pem)? {
        tracing::warn!(
            "this replica's own TLS CA was replaced by the one its replicas share; kubeconfigs that trusted the old one must be fetched again"
        );
    }
    Ok(())
}

/// Makes `state_dir`'s fleet identity key the one every replica shares, as [`ca`] does
/// for the CA.
pub async fn fleet_identity(backend: &Backend, state_dir: &Path) -> anyhow::Result<()> {
    use crate::fleet::identity::Identity;
    let doc = backend.doc("fleet-identity").await.context("reading the shared fleet identity")?;
    let shared = match doc.current() {
        Some(version) => version.value,
        None => {
            let (identity, _) = Identity::load_or_create(state_dir)?;
            match doc
                .swap(None, identity.secret().to_vec())
                .await
                .context("storing the shared fleet identity")?
            {
                Ok(written) => {
                    tracing::info!(fingerprint = %identity.fingerprint(), "this replica's fleet identity is now the one every replica shares");
                    written.value
                }
                Err(Moved(Some(theirs))) => theirs.value,
                Err(Moved(None)) => {
                    anyhow::bail!("the shared fleet identity was deleted while this replica stored it")
                }
            }
        }
    };
    if Identity::adopt(state_dir, &shared)? {
        tracing::warn!("this replica's own fleet identity was replaced by the one its replicas share");
    }
    Ok(())
}
