//! `hive events [KIND/NAME] [-w]`: the Events about one object, or all of them, as a
//! table; `-w` follows new ones. Sugar for `hive get events` with the `involvedObject`
//! field selector `kubectl describe` uses.

use anyhow::Result;

use super::{get, kind, Context};

/// Arguments of `hive events`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive events                 # every recorded event
  hive events agent/manager   # what happened to one agent
  hive events agent/manager -w")]
pub struct Args {
    /// The object whose events to show, as `KIND/NAME` (e.g. `agent/manager`).
    #[arg(value_name = "KIND/NAME")]
    pub object: Option<String>,

    /// Keep printing events as they are recorded.
    #[arg(short, long)]
    pub watch: bool,

    /// Output format: table (default), wide, yaml, json, name.
    #[arg(short, long, value_name = "FORMAT", value_parser = super::output::Format::parse)]
    pub output: Option<super::output::Format>,
}

/// The field selector for `object` (`KIND/NAME`).
pub fn selector(object: &str) -> Result<String> {
    let Some((kind_name, name)) = object.split_once('/') else {
        anyhow::bail!("expected KIND/NAME, e.g. agent/manager; got {object:?}");
    };
    let kind = kind::resolve(&kind::all(), kind_name)?;
    Ok(format!("involvedObject.kind={},involvedObject.name={name}", kind.kind))
}

/// Runs `hive events`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let field_selector = args.object.as_deref().map(selector).transpose()?;
    let get_args = get::Args {
        resources: vec!["events".into()],
        output: args.output,
        selector: None,
        field_selector,
        watch: args.watch,
        show_labels: false,
        no_headers: false,
        ignore_not_found: false,
        show_managed_fields: false,
        chunk_size: 500,
    };
    get::exec(get_args, ctx).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_name_kind_and_object() {
        assert_eq!(selector("ag/manager").unwrap(), "involvedObject.kind=Agent,involvedObject.name=manager");
        assert!(selector("manager").unwrap_err().to_string().contains("KIND/NAME"));
        assert!(selector("gadget/x").is_err());
    }
}
