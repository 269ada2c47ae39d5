//! The one reader of the process's resource limits: the open-file limit the listeners
//! size their connection cap from. `clippy.toml` forbids every other read.

/// The soft limit on open file descriptors (`RLIMIT_NOFILE`), or `None` when it is
/// unlimited.
#[allow(clippy::disallowed_methods)] // the one read of the resource limits
pub fn open_files() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}
