//! Jobs below the server: the engine that runs them (`engine.rs`: runtime, meta repo,
//! scheduler with the runtime executor), the Job intake (`intake.rs`: every stored Job
//! reaches the scheduler exactly once), the Jobs mirror (`mirror.rs`: the scheduler's
//! state written back to the store), Jobs that age out (`expiry.rs`: a terminal Job
//! deleted once its TTL or the daemon's max age passed), what a POSTed Job is
//! (`post.rs`), cancelling (`cancel.rs`), and [`JobService`] (`service.rs`; its errors in
//! `error.rs`), all the server holds of them. The daemon wires these together with
//! crash-watch and the boot reconcile; nothing here imports the daemon or the server.

pub mod cancel;
pub mod engine;
pub mod error;
pub mod expiry;
pub mod intake;
pub mod mirror;
pub mod post;
pub mod service;
pub mod usage;

pub use engine::*;
pub use post::{Posted, PostedJob};
pub use service::JobService;
