//! `hive apply`: server-side apply of manifests. Every document is checked locally
//! first, so a bad document means nothing is applied (unless `--continue-on-error`);
//! each object then gets one `PATCH` with `application/apply-patch+yaml`, and one
//! kubectl-style line: `agent.hive.dev/a1 created|configured|unchanged`. A refusal by
//! the server does not stop the rest: as kubectl, every valid object is applied, each
//! refusal is named (document, kind/name, the server's message), and the command exits 1.

use anyhow::Result;
use serde_json::Value;

use super::client::{self, ApiError, Client, Query, APPLY_PATCH};
use super::manifest::{self, Checks, Manifest};
use super::{kind, output, Context, Reported};

/// Arguments of `hive apply` (its help text is on [`super::Command::Apply`]).
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  hive apply -f agent.yaml
  hive apply -f manifests/                   # every manifest in the directory tree
  cat agents.yaml | hive apply -f -
  hive apply -f manifests/ --dry-run=server  # what would change, without changing it
  hive get agents -o yaml | hive apply -f -  # round trip")]
pub struct Args {
    /// A manifest file, a directory of manifests, or `-` for stdin. Repeatable.
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-", required = true)]
    pub filenames: Vec<String>,

    /// `server`: the server checks and computes every change but persists nothing;
    /// `client`: only the local checks, and a lookup of what exists.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = DryRun::None)]
    pub dry_run: DryRun,

    /// Take ownership of fields that another field manager owns, instead of failing
    /// with a conflict.
    #[arg(long)]
    pub force_conflicts: bool,

    /// The field manager recorded as owning the applied fields.
    #[arg(long, value_name = "NAME", default_value = "hive")]
    pub field_manager: String,

    /// Apply the valid documents even if some fail the local checks; exit 1 at the end
    /// if anything failed. (An object the server refuses never stops the others.)
    #[arg(long)]
    pub continue_on_error: bool,
}

/// `--dry-run` modes.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DryRun {
    /// Apply for real.
    None,
    /// Server-side dry run (`dryRun=All`).
    Server,
    /// Local checks only.
    Client,
}

/// What applying one object did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It did not exist.
    Created,
    /// It existed and changed.
    Configured,
    /// It existed and nothing changed.
    Unchanged,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
        }
    }
}

/// Runs `hive apply`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let kinds = kind::all();
    let sources = manifest::read_sources(&args.filenames)?;
    let (manifests, invalid) = manifest::load(&kinds, &sources, Checks::Shape);
    if manifests.is_empty() && invalid.is_empty() {
        anyhow::bail!("no objects passed to apply");
    }
    for problem in &invalid {
        output::eprint_line(&format!("error: {problem}"));
    }
    if !invalid.is_empty() && !args.continue_on_error {
        let what = if invalid.len() == 1 {
            "1 invalid document".to_string()
        } else {
            format!("{} invalid documents", invalid.len())
        };
        output::eprint_line(&format!(
            "error: {what}; nothing was applied (--continue-on-error applies the valid ones)"
        ));
        return Err(Reported.into());
    }
    let client = ctx.client()?;
    let mut failed = !invalid.is_empty();
    for manifest in &manifests {
        let reference = kind::object_ref(&manifest.kind, &manifest.name);
        match apply_one(&client, manifest, &args).await {
            Ok(outcome) => {
                let suffix = match args.dry_run {
                    DryRun::None => "",
                    DryRun::Server => " (server dry run)",
                    DryRun::Client => " (dry run)",
                };
                output::print(&format!("{reference} {}{suffix}\n", outcome.as_str()))?;
            }
            Err(err) => {
                let Some(api) = client::api_error(&err) else { return Err(err) };
                output::eprint_line(&render_refusal(api, manifest));
                failed = true;
            }
        }
    }
    if failed {
        Err(Reported.into())
    } else {
        Ok(())
    }
}

async fn apply_one(client: &Client, manifest: &Manifest, args: &Args) -> Result<Outcome> {
    let path = kind::object_path(&manifest.kind, &manifest.name);
    let before = client.get_opt(&path).await?;
    if args.dry_run == DryRun::Client {
        return Ok(if before.is_some() { Outcome::Configured } else { Outcome::Created });
    }
    let server_dry_run = args.dry_run == DryRun::Server;
    let query = Query::default()
        .push("fieldManager", &args.field_manager)
        .push("fieldValidation", "Strict")
        .push_opt("force", args.force_conflicts.then_some("true"))
        .push_opt("dryRun", server_dry_run.then_some("All"));
    let response = client.patch(&format!("{path}{query}"), APPLY_PATCH, &manifest.object).await?;
    Ok(outcome(before.as_ref(), &response.body, response.code, server_dry_run))
}

/// Created when there was nothing before (or the server says 201); otherwise
/// unchanged when the `resourceVersion` did not move, or when it moved but the object
/// is the same apart from `resourceVersion`, `managedFields` and `status` — a
/// controller may write status between the read and the apply (a Job's intake and
/// mirror do, as it runs), which moves the version but is not this apply's change. A
/// dry run never moves it, so there the objects are always compared.
pub fn outcome(before: Option<&Value>, after: &Value, code: u16, dry_run: bool) -> Outcome {
    let Some(before) = before else { return Outcome::Created };
    if code == 201 {
        return Outcome::Created;
    }
    let rv = |o: &Value| o.pointer("/metadata/resourceVersion").cloned();
    let moved = dry_run || rv(before) != rv(after) || rv(after).is_none();
    let changed = moved && comparable(before) != comparable(after);
    if changed {
        Outcome::Configured
    } else {
        Outcome::Unchanged
    }
}

fn comparable(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(Value::Object(meta)) = object.get_mut("metadata") {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    if let Some(fields) = object.as_object_mut() {
        fields.remove("status");
    }
    object
}

/// The message for an object the server refused: kubectl's, with the document named;
/// field-manager conflicts explain `--force-conflicts`.
pub fn render_refusal(api: &ApiError, manifest: &Manifest) -> String {
    let status = &api.status;
    let causes = status.details.as_ref().map(|d| d.causes.as_slice()).unwrap_or_default();
    let conflicts: Vec<_> = causes.iter().filter(|c| c.reason == "FieldManagerConflict").collect();
    if status.code == 409 && !conflicts.is_empty() {
        let summary = if status.message.starts_with("Apply failed") {
            status.message.clone()
        } else {
            let noun = if conflicts.len() == 1 { "conflict" } else { "conflicts" };
            let list: Vec<String> = conflicts.iter().map(|c| format!("{}: {}", c.message, c.field)).collect();
            format!("Apply failed with {} {noun}: {}", conflicts.len(), list.join(", "))
        };
        return format!(
            "error: {summary} ({} from {})\n\
             Another field manager owns these fields. Re-run with --force-conflicts to take them \
             over, or remove them from the manifest to leave them to their current manager.",
            kind::object_ref(&manifest.kind, &manifest.name),
            manifest.location
        );
    }
    let operation = format!(
        "error when applying {} from {}",
        kind::object_ref(&manifest.kind, &manifest.name),
        manifest.location
    );
    let mut api = api.clone();
    if status.code == 422 || status.reason == "Invalid" {
        // kubectl's `The Agent "a1" is invalid: …` lines name no document: the operation
        // leads them, so each refusal in a long file can be found.
        return format!("{operation}: {}", api.render());
    }
    api.operation = Some(operation);
    api.render()
}

#[cfg(test)]
mod tests {
    use hive_api::meta::{StatusCause, StatusDetails};
    use hive_api::Status;
    use serde_json::json;

    use super::*;
    use crate::cli::kind::fixtures;
    use crate::cli::manifest::Location;

    fn object(rv: &str, wanted: &str) -> Value {
        json!({"metadata": {"name": "a1", "resourceVersion": rv, "managedFields": [{"time": rv}]}, "spec": {"wanted": wanted}})
    }

    #[test]
    fn outcomes() {
        let before = object("5", "Up");
        assert_eq!(outcome(None, &object("6", "Up"), 201, false), Outcome::Created);
        assert_eq!(outcome(Some(&before), &object("5", "Up"), 200, false), Outcome::Unchanged);
        assert_eq!(outcome(Some(&before), &object("6", "Offline"), 200, false), Outcome::Configured);
        assert_eq!(outcome(Some(&before), &object("6", "Up"), 201, false), Outcome::Created);
        // A dry run never moves the resourceVersion: the content decides.
        assert_eq!(outcome(Some(&before), &object("5", "Up"), 200, true), Outcome::Unchanged);
        assert_eq!(outcome(Some(&before), &object("5", "Offline"), 200, true), Outcome::Configured);
        // A controller wrote status between the read and the apply: not this apply's.
        let mut progressed = object("9", "Up");
        progressed["status"] = json!({"phase": "Running"});
        assert_eq!(outcome(Some(&before), &progressed, 200, false), Outcome::Unchanged);
    }

    fn manifest() -> Manifest {
        Manifest {
            location: Location { source: "m.yaml".into(), document: 2, item: None, line: Some(7) },
            kind: fixtures::agent(),
            name: "a1".into(),
            object: json!({}),
        }
    }

    #[test]
    fn refusals_name_the_document() {
        let api = ApiError::new(Status::failure(400, "BadRequest", "unknown field \"spec.bogus\""));
        assert_eq!(
            render_refusal(&api, &manifest()),
            "Error from server (BadRequest): error when applying agent.hive.dev/a1 from m.yaml: document 2 (line 7): \
             unknown field \"spec.bogus\""
        );
    }

    #[test]
    fn conflicts_explain_force() {
        let mut status = Status::failure(409, "Conflict", "");
        status.details = Some(StatusDetails {
            causes: vec![StatusCause {
                reason: "FieldManagerConflict".into(),
                message: "conflict with \"hive-controller\"".into(),
                field: ".spec.wanted".into(),
            }],
            ..Default::default()
        });
        insta::assert_snapshot!(render_refusal(&ApiError::new(status), &manifest()));
    }
}
