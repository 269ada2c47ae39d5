//! hive-controllers: the controller runtime, written once for every kind, in the
//! kube-runtime mould.
//!
//! ```text
//! Client ─list/watch─▶ watcher ─Event─▶ reflector (Store) ─names─▶ WorkQueue ─▶ reconcile(Target, ctx) -> Action
//! ```
//!
//! - [`client`]: the narrow read API the runtime needs; the daemon implements it.
//! - [`watcher`](mod@watcher): list, then watch; resume from the last revision; relist on 410.
//! - [`reflector`](mod@reflector): the in-memory cache of a kind, read through [`Store`].
//! - [`queue`]: names to reconcile: dedup, one run per name at a time, delays, backoff.
//! - [`controller`]: wires it all together and runs `reconcile` on worker tasks.
//!
//! **Architecture Invariant:** nothing here does IO. The runtime reaches the API only
//! through [`Client`], and reconcilers write through whatever their context carries.

#![warn(missing_docs)]

pub mod agent;
pub mod approval;
pub mod backoff;
pub mod client;
pub mod controller;
pub mod queue;
pub mod reflector;
pub mod watcher;

#[cfg(test)]
mod testing;

pub use backoff::Backoff;
pub use client::{Client, ClientError, ObjectList, WatchEvent};
pub use controller::{Action, Config, Controller, Observer, Target};
pub use queue::{Claim, WorkQueue};
pub use reflector::{reflector, Store, Writer};
pub use watcher::{watcher, Event};
