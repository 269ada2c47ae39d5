//! Fleet providers: what actually creates and destroys a node. Only `process` (local
//! worker processes) exists so far; `docker` and `vastai` come later.

pub mod process;
