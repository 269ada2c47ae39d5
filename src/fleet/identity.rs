//! The daemon's durable identity: the 32-byte iroh secret key in
//! `<state-dir>/identity.key`. Created once (random, written atomically with mode 0600),
//! then loaded on every start, so the daemon's endpoint id stays the same across
//! restarts. A file that is not exactly 32 bytes is a hard startup error; only
//! `hive serve --reset-state` clears it. The key itself is never logged: only
//! [`Identity::fingerprint`] is.
//!
//! The fingerprint is also the fleet label every container and instance of this daemon
//! carries. A reset makes a new identity, so `--reset-state` first retires the old
//! fingerprint into `<state-dir>/fleet-retired-labels` (one a line): recovery still lists
//! what those labels name and reports it as orphans, rather than losing sight of
//! resources that may still cost money.

use std::io;
use std::path::{Path, PathBuf};

use ring::rand::{SecureRandom, SystemRandom};

use crate::auth::secret_file::{write_atomic, SECRET_MODE};

/// The key file inside the state directory.
pub const IDENTITY_FILE: &str = "identity.key";

/// The fleet labels of identities `--reset-state` retired, one a line.
pub const RETIRED_FILE: &str = "fleet-retired-labels";

/// Length of the secret key in bytes.
pub const KEY_LEN: usize = 32;

/// Why the identity could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file exists but does not hold a key.
    #[error(
        "corrupt identity {}: {reason}. The state was not changed. Restore the file, or start with \
         --reset-state to clear it (the daemon then gets a new identity).", path.display()
    )]
    Corrupt {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading or writing the file failed.
    #[error("identity {}: {source}", path.display())]
    Io {
        /// The key file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

/// The daemon's secret key. `Debug` shows only the fingerprint.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    secret: [u8; KEY_LEN],
    /// The fleet labels of the identities this state directory had before a reset.
    retired: Vec<String>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("fingerprint", &self.fingerprint()).finish()
    }
}

impl Identity {
    /// The path of the key file in `state_dir`.
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(IDENTITY_FILE)
    }

    /// The secret key's bytes, for replicas that share one identity (the store on etcd
    /// keeps it for them, beside the CA). Never log them.
    pub fn secret(&self) -> &[u8; KEY_LEN] {
        &self.secret
    }

    /// Makes `secret` the key in `state_dir` (the identity every replica shares), if it
    /// is not already; says whether it replaced another key. A key of the wrong length
    /// is refused and nothing is written.
    pub fn adopt(state_dir: &Path, secret: &[u8]) -> Result<bool, Error> {
        let path = Self::path(state_dir);
        if secret.len() != KEY_LEN {
            return Err(Error::Corrupt {
                path,
                reason: format!(
                    "the shared identity holds {} bytes, not the {KEY_LEN} of a secret key",
                    secret.len()
                ),
            });
        }
        let held = match std::fs::read(&path) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(source) => return Err(Error::Io { path, source }),
        };
        if held.as_deref() == Some(secret) {
            return Ok(false);
        }
        write_atomic(&path, secret, SECRET_MODE).map_err(|source| Error::Io { path, source })?;
        Ok(held.is_some())
    }

    /// Loads the key from `state_dir`, creating it when the file does not exist.
    /// Returns the identity and whether it was created now.
    pub fn load_or_create(state_dir: &Path) -> Result<(Identity, bool), Error> {
        let retired = retired(state_dir)?;
        let path = Self::path(state_dir);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let secret: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| Error::Corrupt {
                    path: path.clone(),
                    reason: format!("it holds {} bytes, not the {KEY_LEN} of a secret key", bytes.len()),
                })?;
                Ok((Identity { secret, retired }, false))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut secret = [0u8; KEY_LEN];
                SystemRandom::new().fill(&mut secret).map_err(|_| Error::Io {
                    path: path.clone(),
                    source: io::Error::other("the system random generator failed"),
                })?;
                write_atomic(&path, &secret, SECRET_MODE).map_err(|source| Error::Io { path, source })?;
                Ok((Identity { secret, retired }, true))
            }
            Err(source) => Err(Error::Io { path, source }),
        }
    }

    /// Deletes the key file in `state_dir` (for `--reset-state`); a missing file is fine.
    /// The fingerprint of a key that loads is retired first (see the module docs); a
    /// corrupt key has none to retire, which is logged. Lines of the retired list that
    /// are not labels are dropped (the list's corruption is cleared like the key's).
    pub fn reset(state_dir: &Path) -> Result<(), Error> {
        let path = Self::path(state_dir);
        let old = match std::fs::read(&path) {
            Ok(bytes) => match <[u8; KEY_LEN]>::try_from(bytes.as_slice()) {
                Ok(secret) => Some(Identity { secret, retired: Vec::new() }.fingerprint()),
                Err(_) => {
                    tracing::warn!(
                        path = %path.display(),
                        "the identity being reset is corrupt: resources labelled with it are not listed as orphans"
                    );
                    None
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(source) => return Err(Error::Io { path, source }),
        };
        retire(state_dir, old)?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::Io { path, source: e }),
            _ => Ok(()),
        }
    }

    /// The fleet labels of identities this state directory had before `--reset-state`
    /// (oldest first).
    pub fn retired_labels(&self) -> &[String] {
        &self.retired
    }

    /// The secret key bytes (for the iroh endpoint). Never log them.
    pub fn secret_bytes(&self) -> &[u8; KEY_LEN] {
        &self.secret
    }

    /// A public fingerprint safe to log: the first 8 hex digits of SHA-256 of the key.
    pub fn fingerprint(&self) -> String {
        let digest = ring::digest::digest(&ring::digest::SHA256, &self.secret);
        digest.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Whether `label` looks like a fingerprint (8 lowercase hex digits).
fn is_label(label: &str) -> bool {
    label.len() == 8 && label.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The text of the retired labels' file in `state_dir` (empty when it does not exist).
fn retired_text(state_dir: &Path) -> Result<String, Error> {
    let path = state_dir.join(RETIRED_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(source) => Err(Error::Io { path, source }),
    }
}

/// The retired labels in `state_dir`; a line that is not a label is `Corrupt`.
fn retired(state_dir: &Path) -> Result<Vec<String>, Error> {
    let text = retired_text(state_dir)?;
    let labels: Vec<String> = text.lines().map(str::to_string).collect();
    if let Some(bad) = labels.iter().find(|l| !is_label(l)) {
        return Err(Error::Corrupt {
            path: state_dir.join(RETIRED_FILE),
            reason: format!("{bad:?} is not a fleet label (8 hex digits)"),
        });
    }
    Ok(labels)
}

/// Rewrites the retired labels in `state_dir` durably: the labels among its lines, and
/// `label` when given and not among them.
fn retire(state_dir: &Path, label: Option<String>) -> Result<(), Error> {
    let text = retired_text(state_dir)?;
    let mut labels: Vec<String> = text.lines().filter(|l| is_label(l)).map(str::to_string).collect();
    let unchanged = labels.len() == text.lines().count();
    match label {
        Some(label) if !labels.contains(&label) => labels.push(label),
        _ if unchanged => return Ok(()),
        _ => {}
    }
    let path = state_dir.join(RETIRED_FILE);
    let text: String = labels.iter().map(|l| format!("{l}\n")).collect();
    write_atomic(&path, text.as_bytes(), SECRET_MODE).map_err(|source| Error::Io { path, source })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn created_once_then_reloaded_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let (first, created) = Identity::load_or_create(dir.path()).unwrap();
        assert!(created);
        let (again, created) = Identity::load_or_create(dir.path()).unwrap();
        assert!(!created);
        assert_eq!(first, again);
        assert_eq!(first.fingerprint().len(), 8);
        assert!(!format!("{first:?}").contains(&format!("{:?}", first.secret_bytes())));
    }

    #[test]
    fn the_key_file_is_private() {
        let dir = tempfile::tempdir().unwrap();
        Identity::load_or_create(dir.path()).unwrap();
        let meta = std::fs::metadata(Identity::path(dir.path())).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), KEY_LEN as u64);
    }

    #[test]
    fn a_truncated_key_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        Identity::load_or_create(dir.path()).unwrap();
        let path = Identity::path(dir.path());
        std::fs::write(&path, [7u8; 10]).unwrap();
        let err = Identity::load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("--reset-state"), "{err}");
        // The file is left as it was.
        assert_eq!(std::fs::read(&path).unwrap(), [7u8; 10]);
        Identity::reset(dir.path()).unwrap();
        Identity::reset(dir.path()).unwrap();
        assert!(Identity::load_or_create(dir.path()).unwrap().1);
    }

    #[test]
    fn a_reset_retires_the_old_label_and_a_corrupt_list_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = Identity::load_or_create(dir.path()).unwrap();
        assert!(first.retired_labels().is_empty());
        Identity::reset(dir.path()).unwrap();
        let (second, created) = Identity::load_or_create(dir.path()).unwrap();
        assert!(created);
        assert_ne!(first.fingerprint(), second.fingerprint());
        assert_eq!(second.retired_labels(), [first.fingerprint()]);
        Identity::reset(dir.path()).unwrap();
        let (third, _) = Identity::load_or_create(dir.path()).unwrap();
        assert_eq!(third.retired_labels(), [first.fingerprint(), second.fingerprint()]);
        // A corrupt key has no label to retire; the reset goes on.
        std::fs::write(Identity::path(dir.path()), [1u8; 3]).unwrap();
        Identity::reset(dir.path()).unwrap();
        assert_eq!(Identity::load_or_create(dir.path()).unwrap().0.retired_labels().len(), 2);
        std::fs::write(dir.path().join(RETIRED_FILE), format!("{}\nnot a label\n", first.fingerprint()))
            .unwrap();
        let err = Identity::load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains(RETIRED_FILE) && err.contains("not a fleet label"), "{err}");
        // --reset-state clears the corruption and keeps the labels.
        Identity::reset(dir.path()).unwrap();
        let (fourth, _) = Identity::load_or_create(dir.path()).unwrap();
        assert_eq!(fourth.retired_labels()[0], first.fingerprint());
    }
}
