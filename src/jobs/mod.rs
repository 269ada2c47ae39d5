//! Jobs below the server: the engine that runs them (`engine.rs`: runtime, meta repo,
//! scheduler with the runtime executor), the Job intake (`intake.rs`: every stored Job
//! reaches the scheduler exactly once), the Jobs mirror (`mirror.rs`: the scheduler's
//! state written back to the store). The daemon wires these together with crash-watch
//! and the boot reconcile; nothing here imports the daemon or the server.

pub mod engine;
pub mod intake;
pub mod mirror;

pub use engine::*;
