//! Durable writes in the state dir: what hive relies on after a restart is on disk before
//! hive acts on it, and survives a power cut, not only `kill -9`. A file written then
//! renamed into place is fsynced before the rename and its directory after it; a new
//! directory is fsynced into its parent. The store's own files (`src/store`) keep their
//! own fsyncs; everything else that writes state goes through here.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to `path` atomically and durably: a temporary file in the same
/// directory is created with `mode` already set (so the content is never readable under
/// a wider mode), written, fsynced, renamed over `path`, and the directory is fsynced so
/// the rename survives a power cut. Missing parent directories are created (durably).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = parent(path);
    create_dir_all(dir)?;
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
        rename(&tmp, path)
    })();
    if result.is_err() {
        // Best effort: a leftover temporary file would only waste space, but it may hold
        // a secret, so try not to leave it behind.
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Renames `from` to `to` (in the same directory, or another on the same file system)
/// and fsyncs the directories involved, so the rename survives a power cut. The caller
/// has fsynced `from`'s contents when they are new.
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    fs::rename(from, to)?;
    let (old, new) = (parent(from), parent(to));
    sync_dir(new)?;
    if old != new {
        sync_dir(old)?;
    }
    Ok(())
}

/// Removes `path` (a missing one is fine) and fsyncs its directory.
pub fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => sync_dir(parent(path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates `dir` and its missing parents, fsyncing each new one into its parent.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    create_dir_all_with(dir, 0o755)
}

/// [`create_dir_all`] with `mode` for the directories it creates (an existing one keeps
/// its own).
pub fn create_dir_all_with(dir: &Path, mode: u32) -> io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    create_dir_all_with(parent(dir), mode)?;
    match fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => sync_dir(parent(dir)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// fsyncs a directory: the names in it (a rename, a new or removed file) survive a cut.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()?;
    #[cfg(test)]
    synced::record(dir);
    Ok(())
}

/// fsyncs a file someone else wrote (a git command): its contents survive a cut.
pub fn sync_file(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()?;
    #[cfg(test)]
    synced::record(path);
    Ok(())
}

/// What [`sync_dir`] and [`sync_file`] synced, for tests that check a writer synced
/// everything it changed (each test binary's tests run in processes of their own).
#[cfg(test)]
pub(crate) mod synced {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    static SYNCED: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

    pub(super) fn record(path: &Path) {
        SYNCED.lock().unwrap().insert(path.to_path_buf());
    }

    /// Every path synced since the last call, and forgets them.
    pub(crate) fn take() -> BTreeSet<PathBuf> {
        std::mem::take(&mut *SYNCED.lock().unwrap())
    }
}

/// The directory `path` is in (`.` for a bare name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_with_mode_replaces_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/dirs/secret");
        write_atomic(&path, b"one", 0o600).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
        remove_file(&path).unwrap();
        remove_file(&path).unwrap();
        assert_eq!(fs::read_dir(path.parent().unwrap()).unwrap().count(), 0);
    }
}
