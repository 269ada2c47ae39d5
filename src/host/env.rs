//! The one reader of environment variables. Flags that have an environment form declare
//! it with clap's `env = …`; everything else the daemon, the CLI and the fleet worker read
//! from the environment goes through here, so the set of variables hive looks at is
//! greppable in one place.

use std::ffi::OsString;

/// The variable `name` as UTF-8, if it is set and valid.
#[allow(clippy::disallowed_methods)] // the one read of the environment
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The variable `name` as the OS gives it, if it is set.
#[allow(clippy::disallowed_methods)] // the one read of the environment
pub fn var_os(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}
