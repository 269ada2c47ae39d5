//! What hive reads from the host it runs on besides files and sockets: the wall clock
//! (`clock`) and the environment (`env`). Each is read in exactly one place, here;
//! `clippy.toml` forbids every other read, so a test can substitute either.

pub mod clock;
pub mod env;

pub use clock::{now, Clock};
