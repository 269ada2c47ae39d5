//! The `hive` binary: the daemon and the command line in one executable.

use std::process::ExitCode;

/// mimalloc instead of glibc malloc: the request path allocates and frees many small
/// `serde_json::Value` nodes, and glibc's `malloc`/`free` took about a quarter of the
/// workers' CPU (docs/benchmarks.md). Only the binary chooses an allocator; the
/// library and its tests keep the system one.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(hive::cli::main())
}
