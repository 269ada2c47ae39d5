//! Agents on fleet nodes: the agent runtime protocol (`hive/fleet-runtime/0`) between the
//! daemon and a node's worker.
//!
//! - `wire.rs`: the calls and answers, one per `Runtime` primitive, with the wire forms
//!   of the runtime's types.
//! - `serve.rs`: the worker's side: runs the node's agents with the process runtime in
//!   its state directory, answering only the daemon it joined; builds from a git bundle
//!   the daemon ships with the call.
//! - `client.rs`: the daemon's side: [`RemoteRuntime`], the `Runtime` of one node's
//!   agents, and its view of what runs there (a watch of the worker's agents).
//! - `nodes.rs`: [`FleetNodes`], where stored agents are placed and one runtime per node
//!   (`runtime::placed` routes each call through it).
//!
//! Architecture Invariant: the daemon dials, the node answers (as for telemetry); the
//! node never needs to reach the daemon's API or the agent's git remote.

pub mod client;
pub mod nodes;
pub mod serve;
pub mod wire;

#[cfg(test)]
mod tests;

pub use client::{Locate, RemoteRuntime};
pub use nodes::FleetNodes;
pub use serve::RuntimeService;
pub use wire::RUNTIME_ALPN;
