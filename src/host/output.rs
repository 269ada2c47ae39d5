//! The process's own output: the daemon's log on stderr and its banner on stdout. A write
//! that fails — the disk under a redirected log is full, the pipe was closed — is counted
//! and dropped. It never panics the request or the thread that logged, as `println!`,
//! `eprintln!` and tracing-subscriber's report of its own write errors (an `eprintln!`)
//! do; so the store's commit and checkpoint threads, which log, stop only for what they
//! themselves fail to write.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing_subscriber::fmt::MakeWriter;

/// Writes to stdout and stderr that failed, since the process started.
static FAILED: AtomicU64 = AtomicU64::new(0);

/// How many writes of the process's own output failed and were dropped.
pub fn failed_writes() -> u64 {
    FAILED.load(Ordering::Relaxed)
}

/// A writer whose failures are counted and dropped: every write reports success.
pub struct Lossy<W>(pub W);

impl<W: Write> Write for Lossy<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.0.write(buf) {
            Ok(n) => Ok(n),
            // `write_all` retries it.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            Err(_) => {
                FAILED.fetch_add(1, Ordering::Relaxed);
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.0.flush().is_err() {
            FAILED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// The log's writer: stderr, lossy. Give it to the tracing subscriber together with
/// `log_internal_errors(false)`, or a failed write is reported with an `eprintln!`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Lossy<io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        Lossy(io::stderr())
    }
}

/// Prints one line of the daemon's banner on stdout; a failure is counted and dropped.
pub fn say(line: std::fmt::Arguments<'_>) {
    let mut out = Lossy(io::stdout().lock());
    let _ = out.write_fmt(line).and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer on a full disk.
    struct Full;

    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from_raw_os_error(28)) // ENOSPC
        }

        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    #[test]
    fn a_failed_write_is_counted_and_reported_as_done() {
        let before = failed_writes();
        let mut out = Lossy(Full);
        assert!(writeln!(out, "a line on a full disk").is_ok());
        assert!(out.flush().is_ok());
        assert!(failed_writes() >= before + 2);
    }

    #[test]
    fn a_log_line_on_a_full_disk_panics_nothing() {
        #[derive(Clone, Copy)]
        struct FullDisk;
        impl<'a> MakeWriter<'a> for FullDisk {
            type Writer = Lossy<Full>;
            fn make_writer(&'a self) -> Self::Writer {
                Lossy(Full)
            }
        }
        let subscriber = crate::cli::serve::log_builder("info", FullDisk).finish();
        // Before, tracing-subscriber reported the failed write with `eprintln!`, which
        // panicked here: "failed printing to stderr".
        tracing::subscriber::with_default(subscriber, || tracing::warn!("the store could not append"));
    }
}
