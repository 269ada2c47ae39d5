//! `hive delete`: delete objects named on the command line, selected by label, or read
//! from manifests; then (by default) wait until they are really gone, since finalizers
//! can keep an object around after the `DELETE`.

use std::time::Duration;

use anyhow::{bail, Result};
use futures_util::future::join_all;
use hive_api::KindInfo;
use serde_json::{json, Value};

use super::apply::DryRun;
use super::client::{self, Client, Query};
use super::manifest::{self, Checks};
use super::wait::{self, WaitFor};
use super::{duration, kind, output, Context, Reported};

/// Delete objects by kind and name, by label, or from manifests.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive delete agent a1 a2
  hive delete agent/a1 job/rebuild-a1-7
  hive delete -f agent.yaml
  hive delete agents -l tier=test
  hive delete agent a1 --wait=false       # do not wait for finalizers")]
pub struct Args {
    /// `KIND NAME...` or `KIND/NAME...` (or just `KIND` with `-l`/`--all`).
    #[arg(value_name = "KIND [NAME]")]
    pub resources: Vec<String>,

    /// Delete the objects a manifest file, directory or `-` (stdin) describes. Repeatable.
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-", conflicts_with_all = ["selector", "all"])]
    pub filenames: Vec<String>,

    /// Delete every object of the kind whose labels match.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,

    /// Delete every object of the kind.
    #[arg(long)]
    pub all: bool,

    /// Wait until the objects are gone (`--wait=false` returns once the server has
    /// accepted the deletion).
    #[arg(long, value_name = "BOOL", default_value_t = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub wait: bool,

    /// Give up waiting after this long (e.g. 30s, 5m); default: wait as long as it takes.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    pub timeout: Option<Duration>,

    /// Treat objects that do not exist as deleted.
    #[arg(long)]
    pub ignore_not_found: bool,

    /// `server`: the server checks the deletion but performs nothing; `client`: only
    /// print what would be deleted.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = DryRun::None)]
    pub dry_run: DryRun,
}

/// Runs `hive delete`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let kinds = kind::all();
    let mut failed = false;
    let from_files = !args.filenames.is_empty();
    if from_files && !args.resources.is_empty() {
        bail!("give either -f FILE or KIND NAME..., not both");
    }
    let client = ctx.client()?;
    let objects: Vec<(KindInfo, String)> = if from_files {
        let sources = manifest::read_sources(&args.filenames)?;
        let (manifests, invalid) = manifest::load(&kinds, &sources, Checks::Identity);
        if !invalid.is_empty() {
            for problem in &invalid {
                output::eprint_line(&format!("error: {problem}"));
            }
            output::eprint_line("error: nothing was deleted");
            return Err(Reported.into());
        }
        manifests.into_iter().map(|m| (m.kind, m.name)).collect()
    } else {
        if args.resources.is_empty() {
            bail!("you must specify what to delete: KIND NAME..., KIND/NAME..., KIND -l SELECTOR, KIND --all or -f FILE");
        }
        let mut objects = Vec::new();
        for target in kind::parse_targets(&kinds, &args.resources, "delete")? {
            if !target.names.is_empty() {
                if args.selector.is_some() || args.all {
                    bail!("name cannot be provided when a selector or --all is specified");
                }
                objects.extend(target.names.iter().map(|n| (target.kind, n.clone())));
                continue;
            }
            if args.selector.is_none() && !args.all {
                bail!(
                    "resource(s) were provided, but no name was specified: use {}/NAME, -l SELECTOR or --all",
                    target.kind.singular
                );
            }
            let query = Query::default().push_opt("labelSelector", args.selector.as_deref());
            let list = client.get(&format!("{}{query}", kind::collection_path(&target.kind))).await?;
            for item in list.get("items").and_then(Value::as_array).into_iter().flatten() {
                if let Some(name) = item.pointer("/metadata/name").and_then(Value::as_str) {
                    objects.push((target.kind, name.to_string()));
                }
            }
        }
        if objects.is_empty() {
            output::eprint_line("No resources found");
            return Ok(());
        }
        objects
    };

    let suffix = match args.dry_run {
        DryRun::None => "",
        DryRun::Server => " (server dry run)",
        DryRun::Client => " (dry run)",
    };
    let mut deleted = Vec::new();
    for (kind, name) in objects {
        if args.dry_run == DryRun::Client {
            output::print(&deleted_line(&kind, &name, suffix))?;
            continue;
        }
        match delete_one(&client, &kind, &name, args.dry_run == DryRun::Server).await {
            Ok(()) => {
                output::print(&deleted_line(&kind, &name, suffix))?;
                deleted.push((kind, name));
            }
            Err(err) => match client::api_error(&err) {
                Some(api) if api.code() == 404 && args.ignore_not_found => {}
                Some(api) => {
                    output::eprint_line(&api.render().to_string());
                    failed = true;
                }
                None => return Err(err),
            },
        }
    }

    if args.wait && args.dry_run == DryRun::None && !deleted.is_empty() {
        let waits = deleted
            .iter()
            .map(|(kind, name)| wait::wait_one(&client, kind, name, &WaitFor::Delete, args.timeout));
        for ((kind, name), result) in deleted.iter().zip(join_all(waits).await) {
            match result {
                Ok(true) => {}
                Ok(false) => {
                    output::eprint_line(&format!(
                        "error: timed out waiting for the condition on {}/{name}",
                        kind.plural
                    ));
                    failed = true;
                }
                Err(err) => {
                    if let Some(text) = super::render_error(&err) {
                        output::eprint_line(&text.to_string());
                    }
                    failed = true;
                }
            }
        }
    }
    if failed {
        Err(Reported.into())
    } else {
        Ok(())
    }
}

/// `agent.hive.dev "a1" deleted`, as kubectl prints it.
pub fn deleted_line(kind: &KindInfo, name: &str, suffix: &str) -> String {
    format!("{} {name:?} deleted{suffix}\n", kind::qualified(kind))
}

async fn delete_one(client: &Client, kind: &KindInfo, name: &str, dry_run: bool) -> Result<()> {
    let query = Query::default().push_opt("dryRun", dry_run.then_some("All"));
    let body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"});
    client.delete(&format!("{}{query}", kind::object_path(kind, name)), &body).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::kind::fixtures;

    #[test]
    fn deleted_lines_match_kubectl() {
        assert_eq!(deleted_line(&fixtures::agent(), "a1", ""), "agent.hive.dev \"a1\" deleted\n");
        assert_eq!(
            deleted_line(&fixtures::agent(), "a1", " (server dry run)"),
            "agent.hive.dev \"a1\" deleted (server dry run)\n"
        );
    }
}
