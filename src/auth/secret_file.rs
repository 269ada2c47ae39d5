//! Crash-safe writes of state files that may hold secrets (token hashes, private keys,
//! kubeconfigs): the file appears whole with its final mode, or not at all.

use std::io;
use std::path::Path;

/// Mode for files that hold secrets: owner read/write only.
pub(crate) const SECRET_MODE: u32 = 0o600;
/// Mode for public material such as certificates.
pub(crate) const PUBLIC_MODE: u32 = 0o644;

/// Writes `bytes` to `path` atomically and durably with `mode` already set (so the
/// content is never readable under a wider mode): see [`crate::durable::write_atomic`].
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    crate::durable::write_atomic(path, bytes, mode)
}

/// Creates `dir` (and missing parents) with mode 0700 when it does not exist yet. An
/// existing directory keeps its mode: the operator may have chosen it.
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    // Durably: the state dir a first start creates must not vanish at a power cut.
    crate::durable::create_dir_all_with(dir, 0o700)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_with_mode_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        write_atomic(&path, b"one", SECRET_MODE).unwrap();
        write_atomic(&path, b"two", SECRET_MODE).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // No temporary files are left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_private_dir_hive_creates_is_synced_into_its_parent() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("srv/hive/state");
        crate::durable::synced::take();
        create_private_dir(&state).unwrap();
        let synced = crate::durable::synced::take();
        for parent in [dir.path().to_path_buf(), dir.path().join("srv"), dir.path().join("srv/hive")] {
            assert!(synced.contains(&parent), "{} not synced: {synced:?}", parent.display());
        }
        assert_eq!(fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);
    }
}
