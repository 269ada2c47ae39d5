//! `hive openapi`: prints the generated OpenAPI document (the checked-in
//! `openapi/hive.dev_v1.json` is this output).

use std::io::Write;

use super::Context;

/// Arguments of `hive openapi`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// The document exactly as checked in: pretty JSON with a trailing newline.
pub fn render() -> String {
    let mut text = serde_json::to_string_pretty(&crate::server::openapi::document()).expect("serializes");
    text.push('\n');
    text
}

/// Prints the document to stdout.
pub async fn exec(_args: Args, _ctx: &Context) -> anyhow::Result<()> {
    std::io::stdout().write_all(render().as_bytes())?;
    Ok(())
}
