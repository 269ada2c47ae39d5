//! hive: a declarative control plane. This crate is the daemon and the CLI in one
//! binary; see ARCHITECTURE.md for the map.

pub mod auth;
pub mod cli;
pub mod client;
pub mod daemon;
pub mod dashboard;
pub mod durable;
pub mod executor;
pub mod fleet;
pub mod host;
pub mod jobs;
pub mod meta;
pub mod metrics;
pub mod runtime;
pub mod scheduler;
pub mod server;
pub mod store;
pub mod submit;
