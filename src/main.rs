//! The `hive` binary: the daemon and the command line in one executable.

use std::process::ExitCode;

/// mimalloc instead of glibc malloc: the request path allocates and frees many small
/// `serde_json::Value` nodes, and glibc's `malloc`/`free` took about a quarter of the
/// workers' CPU (docs/benchmarks.md). Only the binary chooses an allocator; the
/// library and its tests keep the system one.
///
/// Built with `no_thp`: mimalloc does not `madvise` its heap into transparent huge pages.
/// Where THP is `madvise` (Debian's default) a first touch of heap then faults in one
/// 4 KiB page, not a 2 MiB page zeroed on the spot: on a VM whose host had taken back
/// the guest's free memory, that zeroing held the commit thread 85 ms, and a daemon's
/// first burst of writes after a quiet minute had a p99 several times its usual
/// (docs/benchmarks.md, issue 34). Unlike turning THP off for the process (`prctl`),
/// this is not inherited by the agents the daemon starts, and a host set to `always`
/// still gets what it asked for.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = hive::cli::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = cli.worker_threads() {
        builder.worker_threads(workers);
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(hive::cli::run(cli))
}
