//! `hive version`: the client version, and the server's when one is reachable.

use super::Context;

/// Arguments of `hive version`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print only the client version; do not contact the server.
    #[arg(long)]
    pub client: bool,
}

/// Prints the versions.
pub async fn exec(args: Args, ctx: &Context) -> anyhow::Result<()> {
    println!("Client Version: {}", env!("CARGO_PKG_VERSION"));
    if args.client {
        return Ok(());
    }
    let client = ctx.client()?;
    let info = client.get("/version").await?;
    super::output::print(&format!("Server Version: {}\n", info["gitVersion"].as_str().unwrap_or("unknown")))?;
    Ok(())
}
