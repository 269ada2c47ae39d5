//! Reading and writing kubeconfig files (the CLI and kubectl share one).
//!
//! `hive serve` writes `<state-dir>/kubeconfig.yaml` on first start (cluster, user and
//! context all named `hive`), so `kubectl --kubeconfig` and `hive` work at once. The model
//! here covers the part of kubectl's format hive uses, with kubectl's exact keys; anything
//! else in a file (preferences, extensions, exec plugins) is tolerated and ignored.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _, Result};
use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize};

use crate::auth::secret_file::{write_atomic, SECRET_MODE};

/// The name of the cluster, user and context `write` creates.
pub const NAME: &str = "hive";
/// The kubeconfig file name inside a state directory.
pub const FILE_NAME: &str = "kubeconfig.yaml";
/// The state directory when neither `--state-dir` nor `$HIVE_STATE_DIR` says otherwise.
const DEFAULT_STATE_DIR: &str = ".hive";

/// A kubeconfig file (`apiVersion: v1`, `kind: Config`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Kubeconfig {
    /// Always `v1`. (kubectl spells this one key in camelCase.)
    #[serde(default, rename = "apiVersion", deserialize_with = "null_as_default")]
    pub api_version: String,
    /// Always `Config`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub kind: String,
    /// Named API servers.
    #[serde(default, deserialize_with = "null_as_default")]
    pub clusters: Vec<NamedCluster>,
    /// Named credentials.
    #[serde(default, deserialize_with = "null_as_default")]
    pub users: Vec<NamedUser>,
    /// Named (cluster, user) pairs.
    #[serde(default, deserialize_with = "null_as_default")]
    pub contexts: Vec<NamedContext>,
    /// The context used when none is chosen.
    #[serde(default, deserialize_with = "null_as_default")]
    pub current_context: String,
    /// The file this was loaded from: relative paths resolve against its directory, and
    /// errors name it.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// An entry of `clusters`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NamedCluster {
    /// The name contexts refer to.
    pub name: String,
    /// How to reach and verify the server.
    #[serde(default, deserialize_with = "null_as_default")]
    pub cluster: Cluster,
}

/// How to reach and verify an API server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Cluster {
    /// The server URL, e.g. `https://127.0.0.1:6443`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub server: String,
    /// Base64 of the PEM CA bundle to trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_data: Option<String>,
    /// Path of a PEM CA bundle, relative to the kubeconfig's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority: Option<PathBuf>,
    /// Skip server certificate verification (testing only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_tls_verify: Option<bool>,
}

/// An entry of `users`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NamedUser {
    /// The name contexts refer to.
    pub name: String,
    /// The credentials.
    #[serde(default, deserialize_with = "null_as_default")]
    pub user: User,
}

/// Credentials. Only bearer tokens are supported; kubectl's other fields are ignored.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct User {
    /// The bearer token. Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// A file holding the bearer token (kubectl spells this key in camelCase), relative to
    /// the kubeconfig's directory.
    #[serde(default, rename = "tokenFile", skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
}

impl fmt::Debug for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .finish()
    }
}

/// An entry of `contexts`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NamedContext {
    /// The name `current-context` refers to.
    pub name: String,
    /// The pair it names.
    #[serde(default, deserialize_with = "null_as_default")]
    pub context: Context,
}

/// A (cluster, user) pair with an optional namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Context {
    /// A `clusters` entry's name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub cluster: String,
    /// A `users` entry's name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub user: String,
    /// kubectl's default namespace; hive's kinds are cluster-scoped and ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// What a client needs to talk to the current context's server.
#[derive(Clone, PartialEq)]
pub struct Resolved {
    /// The server URL.
    pub server: String,
    /// PEM bytes of the CA to trust, if the kubeconfig names one.
    pub ca_pem: Option<Vec<u8>>,
    /// The bearer token, if any. Secret.
    pub token: Option<String>,
    /// Whether to skip server certificate verification.
    pub insecure: bool,
}

impl fmt::Debug for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolved")
            .field("server", &self.server)
            .field("ca_pem", &self.ca_pem.as_ref().map(|pem| format!("<{} bytes>", pem.len())))
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("insecure", &self.insecure)
            .finish()
    }
}

impl Kubeconfig {
    /// A kubeconfig with one cluster, user and context, all named `hive`.
    pub fn single(server_url: &str, ca_pem: Option<&str>, token: &str) -> Kubeconfig {
        Kubeconfig {
            api_version: "v1".into(),
            kind: "Config".into(),
            clusters: vec![NamedCluster {
                name: NAME.into(),
                cluster: Cluster {
                    server: server_url.into(),
                    certificate_authority_data: ca_pem
                        .map(|pem| base64::engine::general_purpose::STANDARD.encode(pem)),
                    ..Cluster::default()
                },
            }],
            users: vec![NamedUser {
                name: NAME.into(),
                user: User { token: Some(token.into()), token_file: None },
            }],
            contexts: vec![NamedContext {
                name: NAME.into(),
                context: Context { cluster: NAME.into(), user: NAME.into(), namespace: None },
            }],
            current_context: NAME.into(),
            source: None,
        }
    }
}

/// Writes a kubeconfig for `server_url` with cluster, user and context named `hive` (and
/// current), trusting `ca_pem` when given. Mode 0600 (it holds the token), atomic.
pub fn write(path: &Path, server_url: &str, ca_pem: Option<&str>, token: &str) -> Result<()> {
    let yaml = serde_yaml_ng::to_string(&Kubeconfig::single(server_url, ca_pem, token))
        .context("serializing kubeconfig")?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::auth::secret_file::create_private_dir(dir)
            .with_context(|| format!("creating directory {} for kubeconfig", dir.display()))?;
    }
    write_atomic(path, yaml.as_bytes(), SECRET_MODE)
        .with_context(|| format!("writing kubeconfig {}", path.display()))
}

/// Reads and parses a kubeconfig file.
pub fn load(path: &Path) -> Result<Kubeconfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let mut config: Kubeconfig = serde_yaml_ng::from_str(&text)
        .with_context(|| format!("kubeconfig {} is not a valid kubeconfig", path.display()))?;
    config.source = Some(path.to_owned());
    Ok(config)
}

impl Kubeconfig {
    /// Resolves the current context to a server, CA and token. Relative
    /// `certificate-authority` and `tokenFile` paths are read relative to the kubeconfig's
    /// directory, as kubectl does.
    pub fn current(&self) -> Result<Resolved> {
        let file = self.source.as_deref().unwrap_or(Path::new("(in memory)")).display();
        let config = self;
        let name = &config.current_context;
        if name.is_empty() {
            bail!("kubeconfig {file}: current-context is not set");
        }
        let context = &config
            .contexts
            .iter()
            .find(|c| &c.name == name)
            .ok_or_else(|| anyhow!("kubeconfig {file}: current-context {name:?} names no context"))?
            .context;
        let cluster = &config
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .ok_or_else(|| {
                anyhow!(
                    "kubeconfig {file}: context {name:?} names cluster {:?}, which does not exist",
                    context.cluster
                )
            })?
            .cluster;
        if cluster.server.is_empty() {
            bail!("kubeconfig {file}: cluster {:?} has no server", context.cluster);
        }
        // kubectl allows a context without a user (anonymous access).
        let user = if context.user.is_empty() {
            None
        } else {
            Some(
                &config
                    .users
                    .iter()
                    .find(|u| u.name == context.user)
                    .ok_or_else(|| {
                        anyhow!(
                            "kubeconfig {file}: context {name:?} names user {:?}, which does not exist",
                            context.user
                        )
                    })?
                    .user,
            )
        };

        let ca_pem = match (&cluster.certificate_authority_data, &cluster.certificate_authority) {
            (Some(data), _) if !data.trim().is_empty() => {
                let data: String = data.split_whitespace().collect();
                Some(base64::engine::general_purpose::STANDARD.decode(data).map_err(|e| {
                    anyhow!(
                        "kubeconfig {file}: certificate-authority-data of cluster {:?} is not base64: {e}",
                        context.cluster
                    )
                })?)
            }
            (_, Some(ca_path)) if !ca_path.as_os_str().is_empty() => {
                let ca_path = self.relative(ca_path);
                Some(std::fs::read(&ca_path).with_context(|| {
                    format!(
                        "kubeconfig {file}: reading certificate-authority {} of cluster {:?}",
                        ca_path.display(),
                        context.cluster
                    )
                })?)
            }
            _ => None,
        };
        let token = match user {
            Some(User { token: Some(token), .. }) if !token.is_empty() => Some(token.clone()),
            Some(User { token_file: Some(token_path), .. }) if !token_path.as_os_str().is_empty() => {
                let token_path = self.relative(token_path);
                let text = std::fs::read_to_string(&token_path).with_context(|| {
                    format!(
                        "kubeconfig {file}: reading tokenFile {} of user {:?}",
                        token_path.display(),
                        context.user
                    )
                })?;
                Some(text.trim().to_owned())
            }
            _ => None,
        };
        Ok(Resolved {
            server: cluster.server.clone(),
            ca_pem,
            token,
            insecure: cluster.insecure_skip_tls_verify.unwrap_or(false),
        })
    }

    fn relative(&self, path: &Path) -> PathBuf {
        match self.source.as_deref().and_then(Path::parent) {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_owned(),
        }
    }
}

/// The state directory: `$HIVE_STATE_DIR`, or `./.hive`.
pub fn default_state_dir() -> PathBuf {
    default_state_dir_from(&|key| crate::host::env::var_os(key))
}

/// Which kubeconfig a client uses, in this order: the `--kubeconfig` flag,
/// `$HIVE_KUBECONFIG`, the first entry of `$KUBECONFIG`, then `kubeconfig.yaml` in the
/// default state directory if it exists. `None` when none applies: the caller should ask
/// for `--kubeconfig` or for `hive serve` to be started first.
pub fn resolve_path(flag: Option<&Path>) -> Option<PathBuf> {
    resolve_path_from(flag, &|key| crate::host::env::var_os(key), &|path| path.exists())
}

fn default_state_dir_from(env: &dyn Fn(&str) -> Option<OsString>) -> PathBuf {
    env("HIVE_STATE_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| DEFAULT_STATE_DIR.into())
}

fn resolve_path_from(
    flag: Option<&Path>,
    env: &dyn Fn(&str) -> Option<OsString>,
    exists: &dyn Fn(&Path) -> bool,
) -> Option<PathBuf> {
    if let Some(flag) = flag.filter(|f| !f.as_os_str().is_empty()) {
        return Some(flag.to_owned());
    }
    if let Some(path) = env("HIVE_KUBECONFIG").filter(|v| !v.is_empty()) {
        return Some(path.into());
    }
    if let Some(list) = env("KUBECONFIG") {
        if let Some(first) = std::env::split_paths(&list).find(|p| !p.as_os_str().is_empty()) {
            return Some(first);
        }
    }
    Some(default_state_dir_from(env).join(FILE_NAME)).filter(|p| exists(p))
}

/// Accepts an explicit `null` (which kubectl writes for empty lists) as the default value.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::os::unix::fs::PermissionsExt;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn write_load_resolve_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/kubeconfig.yaml");
        write(&path, "https://127.0.0.1:6443", Some(CA), "hive_secret").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);

        let text = std::fs::read_to_string(&path).unwrap();
        for key in ["apiVersion: v1", "kind: Config", "current-context: hive", "certificate-authority-data:"]
        {
            assert!(text.contains(key), "{key} missing in:\n{text}");
        }
        let loaded = load(&path).unwrap();
        assert_eq!(loaded.source.as_deref(), Some(path.as_path()));
        let expected = Kubeconfig {
            source: Some(path.clone()),
            ..Kubeconfig::single("https://127.0.0.1:6443", Some(CA), "hive_secret")
        };
        assert_eq!(loaded, expected);
        let resolved = loaded.current().unwrap();
        assert_eq!(resolved.server, "https://127.0.0.1:6443");
        assert_eq!(resolved.ca_pem.as_deref(), Some(CA.as_bytes()));
        assert_eq!(resolved.token.as_deref(), Some("hive_secret"));
        assert!(!resolved.insecure);
        let debug = format!("{resolved:?} {loaded:?}");
        assert!(!debug.contains("hive_secret"), "{debug}");

        write(&path, "https://h:1", None, "t2").unwrap();
        let resolved = load(&path).unwrap().current().unwrap();
        assert_eq!(
            (resolved.server.as_str(), resolved.ca_pem, resolved.token.as_deref()),
            ("https://h:1", None, Some("t2"))
        );
    }

    /// The shape `kubectl config set-cluster/set-credentials/set-context` writes, plus keys
    /// hive does not model.
    #[test]
    fn loads_what_kubectl_writes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), CA).unwrap();
        std::fs::create_dir(dir.path().join("secrets")).unwrap();
        std::fs::write(dir.path().join("secrets/token"), "hive_fromfile\n").unwrap();
        let path = dir.path().join("config");
        std::fs::write(
            &path,
            r#"apiVersion: v1
clusters:
- cluster:
    certificate-authority: ca.pem
    server: https://hive.example:6443
    tls-server-name: hive.example
    extensions:
    - extension:
        last-update: Mon, 01 Jan 2024 00:00:00 UTC
        provider: minikube.sigs.k8s.io
      name: cluster_info
  name: prod
- cluster:
    insecure-skip-tls-verify: true
    server: https://10.0.0.1:6443
  name: lab
contexts:
- context:
    cluster: prod
    namespace: default
    user: ops
  name: prod
- context:
    cluster: lab
    user: lab-user
  name: lab
current-context: prod
kind: Config
preferences: {}
users:
- name: ops
  user:
    tokenFile: secrets/token
- name: lab-user
  user:
    token: hive_lab
    client-certificate-data: QUJD
- name: exec-user
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: aws
"#,
        )
        .unwrap();
        let mut loaded = load(&path).unwrap();
        assert_eq!((loaded.api_version.as_str(), loaded.kind.as_str()), ("v1", "Config"));
        assert_eq!(loaded.contexts[0].context.namespace.as_deref(), Some("default"));
        let prod = loaded.current().unwrap();
        assert_eq!(prod.server, "https://hive.example:6443");
        assert_eq!(prod.ca_pem.as_deref(), Some(CA.as_bytes()));
        assert_eq!(prod.token.as_deref(), Some("hive_fromfile"));
        assert!(!prod.insecure);

        loaded.current_context = "lab".into();
        let lab = loaded.current().unwrap();
        assert_eq!((lab.ca_pem, lab.token.as_deref(), lab.insecure), (None, Some("hive_lab"), true));
    }

    #[test]
    fn loads_empty_kubectl_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(
            &path,
            "apiVersion: v1\nclusters: null\ncontexts: null\ncurrent-context: \"\"\nkind: Config\npreferences: {}\nusers: null\n",
        )
        .unwrap();
        let err = load(&path).unwrap().current().unwrap_err().to_string();
        assert_eq!(err, format!("kubeconfig {}: current-context is not set", path.display()));
    }

    #[test]
    fn errors_name_the_file_and_the_missing_piece() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kc.yaml");
        let file = path.display().to_string();
        let good = Kubeconfig::single("https://h:1", Some(CA), "t");
        type Case = (Box<dyn Fn(&mut Kubeconfig)>, String);
        let cases: Vec<Case> = vec![
            (
                Box::new(|c: &mut Kubeconfig| c.contexts.clear()),
                format!("kubeconfig {file}: current-context \"hive\" names no context"),
            ),
            (
                Box::new(|c: &mut Kubeconfig| c.clusters.clear()),
                format!("kubeconfig {file}: context \"hive\" names cluster \"hive\", which does not exist"),
            ),
            (
                Box::new(|c: &mut Kubeconfig| c.users.clear()),
                format!("kubeconfig {file}: context \"hive\" names user \"hive\", which does not exist"),
            ),
            (
                Box::new(|c: &mut Kubeconfig| c.clusters[0].cluster.server.clear()),
                format!("kubeconfig {file}: cluster \"hive\" has no server"),
            ),
            (
                Box::new(|c: &mut Kubeconfig| {
                    c.clusters[0].cluster.certificate_authority_data = Some("!!".into())
                }),
                format!("kubeconfig {file}: certificate-authority-data of cluster \"hive\" is not base64"),
            ),
            (
                Box::new(|c: &mut Kubeconfig| {
                    c.clusters[0].cluster.certificate_authority_data = None;
                    c.clusters[0].cluster.certificate_authority = Some("missing.pem".into());
                }),
                format!(
                    "kubeconfig {file}: reading certificate-authority {}",
                    dir.path().join("missing.pem").display()
                ),
            ),
        ];
        for (break_it, want) in cases {
            let mut config = Kubeconfig { source: Some(path.clone()), ..good.clone() };
            break_it(&mut config);
            let err = config.current().unwrap_err().to_string();
            assert!(err.starts_with(&want), "got {err:?}, want prefix {want:?}");
        }

        let err = format!("{:#}", load(&dir.path().join("absent")).unwrap_err());
        assert!(err.contains("absent"), "{err}");
        std::fs::write(&path, "clusters: 3").unwrap();
        let err = format!("{:#}", load(&path).unwrap_err());
        assert!(err.contains(&file) && err.contains("not a valid kubeconfig"), "{err}");
    }

    #[test]
    fn resolve_path_order() {
        type Case<'a> = (Option<&'a str>, &'a [(&'a str, &'a str)], &'a [&'a str], Option<&'a str>);
        // (flag, env, existing files, want)
        let cases: &[Case] = &[
            (Some("/flag.yaml"), &[("HIVE_KUBECONFIG", "/h"), ("KUBECONFIG", "/k")], &[], Some("/flag.yaml")),
            (None, &[("HIVE_KUBECONFIG", "/h"), ("KUBECONFIG", "/k")], &[], Some("/h")),
            (None, &[("HIVE_KUBECONFIG", ""), ("KUBECONFIG", "/k1:/k2")], &[], Some("/k1")),
            (None, &[("KUBECONFIG", ":/k2")], &[], Some("/k2")),
            (
                None,
                &[("KUBECONFIG", ""), ("HIVE_STATE_DIR", "/state")],
                &["/state/kubeconfig.yaml"],
                Some("/state/kubeconfig.yaml"),
            ),
            (None, &[("HIVE_STATE_DIR", "/state")], &[], None),
            (None, &[], &[".hive/kubeconfig.yaml"], Some(".hive/kubeconfig.yaml")),
            (None, &[], &[], None),
        ];
        for &(flag, env, existing, want) in cases {
            let env: HashMap<&str, &str> = env.iter().copied().collect();
            let lookup = |key: &str| env.get(key).map(OsString::from);
            let exists = |p: &Path| existing.iter().any(|e| Path::new(e) == p);
            let got = resolve_path_from(flag.map(Path::new), &lookup, &exists);
            assert_eq!(got, want.map(PathBuf::from), "{flag:?} {env:?}");
        }
        assert_eq!(default_state_dir_from(&|_| None), PathBuf::from(".hive"));
        assert_eq!(default_state_dir_from(&|_| Some("/s".into())), PathBuf::from("/s"));
    }
}
