//! Fleet providers: what actually creates and destroys a node. `process` (local worker
//! processes) is wired into the fleet; `vastai` is the Vast.ai REST client, tested
//! against a stand-in and not wired yet; `docker` comes later.

pub mod process;
pub mod vastai;
