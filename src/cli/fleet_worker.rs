//! `hive fleet-worker --node NAME` (hidden): the worker of one `process` fleet node. The
//! daemon starts it with its stdin a pipe the daemon holds; the worker prints
//! `ready NAME` and then blocks reading stdin until EOF, so it ends when the daemon
//! closes the pipe (a Kill, a shutdown) or dies.

use std::io::{Read, Write};

use super::Context;

/// Arguments of `hive fleet-worker`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The node this worker runs.
    #[arg(long, value_name = "NAME")]
    pub node: String,
}

/// Runs the worker until its stdin reaches EOF.
pub async fn exec(args: Args, _ctx: &Context) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", crate::fleet::providers::process::ready_line(&args.node))?;
        out.flush()?;
        drop(out);
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 256];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    })
    .await?
}
