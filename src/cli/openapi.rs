//! `hive openapi`: prints the generated OpenAPI document (the checked-in
//! `openapi/hive.dev_v1.json` is this output).

use std::io::Write;

use super::Context;

use crate::server::openapi::events::Group;

/// Arguments of `hive openapi`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Which group's document: `hive.dev/v1` (hive's kinds), `v1` (core Events) or
    /// `events.k8s.io/v1`.
    #[arg(long, default_value = "hive.dev/v1", value_parser = ["hive.dev/v1", "v1", "events.k8s.io/v1"])]
    group_version: String,
}

/// The document exactly as checked in: pretty JSON with a trailing newline.
pub fn render() -> String {
    pretty(&crate::server::openapi::document())
}

/// The documents of the groups that serve Events, as checked in: (file name, text).
pub fn render_events() -> Vec<(&'static str, String)> {
    Group::ALL.iter().map(|g| (g.file(), pretty(&crate::server::openapi::events::document(*g)))).collect()
}

fn pretty(doc: &serde_json::Value) -> String {
    let mut text = serde_json::to_string_pretty(doc).expect("serializes");
    text.push('\n');
    text
}

/// Prints the document to stdout.
pub async fn exec(args: Args, _ctx: &Context) -> anyhow::Result<()> {
    let text = match args.group_version.as_str() {
        "v1" => pretty(&crate::server::openapi::events::document(Group::Core)),
        "events.k8s.io/v1" => pretty(&crate::server::openapi::events::document(Group::EventsV1)),
        _ => render(),
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}
