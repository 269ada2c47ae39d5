//! The daemon's durable identity: the 32-byte iroh secret key in
//! `<state-dir>/identity.key`. Created once (random, written atomically with mode 0600),
//! then loaded on every start, so the daemon's endpoint id stays the same across
//! restarts. A file that is not exactly 32 bytes is a hard startup error; only
//! `hive serve --reset-state` clears it. The key itself is never logged: only
//! [`Identity::fingerprint`] is.

use std::io;
use std::path::{Path, PathBuf};

use ring::rand::{SecureRandom, SystemRandom};

use crate::auth::secret_file::{write_atomic, SECRET_MODE};

/// The key file inside the state directory.
pub const IDENTITY_FILE: &str = "identity.key";

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

    /// Loads the key from `state_dir`, creating it when the file does not exist.
    /// Returns the identity and whether it was created now.
    pub fn load_or_create(state_dir: &Path) -> Result<(Identity, bool), Error> {
        let path = Self::path(state_dir);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let secret: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| Error::Corrupt {
                    path: path.clone(),
                    reason: format!("it holds {} bytes, not the {KEY_LEN} of a secret key", bytes.len()),
                })?;
                Ok((Identity { secret }, false))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut secret = [0u8; KEY_LEN];
                SystemRandom::new().fill(&mut secret).map_err(|_| Error::Io {
                    path: path.clone(),
                    source: io::Error::other("the system random generator failed"),
                })?;
                write_atomic(&path, &secret, SECRET_MODE).map_err(|source| Error::Io { path, source })?;
                Ok((Identity { secret }, true))
            }
            Err(source) => Err(Error::Io { path, source }),
        }
    }

    /// Deletes the key file in `state_dir` (for `--reset-state`); a missing file is fine.
    pub fn reset(state_dir: &Path) -> Result<(), Error> {
        let path = Self::path(state_dir);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::Io { path, source: e }),
            _ => Ok(()),
        }
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
}
