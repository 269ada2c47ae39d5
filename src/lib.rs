//! hive: a declarative control plane. This crate is the daemon and the CLI in one
//! binary; see ARCHITECTURE.md for the map.

pub mod age;
pub mod agent_controller;
pub mod applied;
pub mod approval_controller;
pub mod auth;
pub mod cli;
pub mod client;
pub mod crashwatch;
pub mod daemon;
pub mod dashboard;
pub mod events;
pub mod executor;
pub mod fleet;
pub mod jobs_mirror;
pub mod kubeconfig;
pub mod meta;
pub mod resolve;
pub mod runtime;
pub mod scheduler;
pub mod server;
pub mod store;
pub mod submit;
pub mod update;
