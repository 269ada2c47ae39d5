//! What hive reads from the host it runs on besides files and sockets: the wall clock
//! (`clock`), the environment (`env`) and the process's resource limits (`limits`). Each
//! is read in exactly one place, here; `clippy.toml` forbids every other read, so a test
//! can substitute any of them. And where the process's own output goes (`output`: the
//! log and the banner, whose failed writes are dropped, never a panic).

pub mod clock;
pub mod env;
pub mod limits;
pub mod output;

pub use clock::{now, Clock};
