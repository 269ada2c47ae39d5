//! Crash-safe writes of state files that may hold secrets (token hashes, private keys,
//! kubeconfigs): the file appears whole with its final mode, or not at all.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Mode for files that hold secrets: owner read/write only.
pub(crate) const SECRET_MODE: u32 = 0o600;
/// Mode for public material such as certificates.
pub(crate) const PUBLIC_MODE: u32 = 0o644;

/// Writes `bytes` to `path` atomically: a temporary file in the same directory is created
/// with `mode` already set (so the content is never readable under a wider mode), written,
/// fsynced, renamed over `path`, and the directory is fsynced so the rename survives a crash.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}.{}",
        file_name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        // Best effort: a leftover temporary file would only waste space, but it may hold
        // a secret, so try not to leave it behind.
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Creates `dir` (and missing parents) with mode 0700 when it does not exist yet. An
/// existing directory keeps its mode: the operator may have chosen it.
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
