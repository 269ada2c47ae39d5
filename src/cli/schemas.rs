//! `hive schemas`: prints the JSON Schema of every kind, or writes them to a
//! directory (the checked-in `schemas/` is `hive schemas --out schemas`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context as _;

use super::Context;

/// Arguments of `hive schemas`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write one `<kind>.json` file per kind into this directory instead of printing.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Every schema file's name and exact contents (pretty JSON, trailing newline).
pub fn render() -> Vec<(String, String)> {
    crate::server::openapi::schemas()
        .into_iter()
        .map(|(name, schema)| {
            let mut text = serde_json::to_string_pretty(&schema).expect("serializes");
            text.push('\n');
            (name, text)
        })
        .collect()
}

/// Prints or writes the schemas.
pub async fn exec(args: Args, _ctx: &Context) -> anyhow::Result<()> {
    let files = render();
    match args.out {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, text) in files {
                let path = dir.join(&name);
                std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
        None => {
            let mut out = std::io::stdout().lock();
            for (name, text) in files {
                writeln!(out, "# {name}")?;
                out.write_all(text.as_bytes())?;
            }
        }
    }
    Ok(())
}
