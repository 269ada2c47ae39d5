//! `hive token`: create, list and revoke API bearer tokens (admin only). A token's secret is
//! shown once, at creation, on stdout alone so it can be captured by a script.

use anyhow::Result;
use chrono::{DateTime, Utc};
use clap::Subcommand;
use hive_api::Role;
use serde_json::{json, Value};

use super::{output, Context};

/// Where the server keeps tokens.
const TOKENS_PATH: &str = "/hive/v1/tokens";

/// Create, list and revoke API tokens (admin only).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: TokenCommand,
}

/// `hive token` subcommands.
#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a token and print it (only this once) on stdout.
    #[command(after_help = "Example:
  TOKEN=$(hive token create --name ci --role operator)
  TOKEN=$(hive token create ci --role operator)      # the name may also come first
  TOKEN=$(hive token create --name alpha --role agent --agent alpha)")]
    Create(CreateArgs),
    /// List tokens: name, role and age (never the secret).
    List(ListArgs),
    /// Revoke a token: it stops working at once, for every request after this one.
    #[command(after_help = "Example:
  hive token revoke ci")]
    Revoke(RevokeArgs),
}

/// Arguments of `hive token revoke`.
#[derive(clap::Args, Debug)]
pub struct RevokeArgs {
    /// Name of the token to revoke (as `hive token list` shows it).
    #[arg(value_name = "NAME")]
    pub name: String,
}

/// Arguments of `hive token create`.
#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// Name of the token (who or what uses it), e.g. `ci`.
    #[arg(
        long = "name",
        value_name = "NAME",
        required_unless_present = "name_arg",
        conflicts_with = "name_arg"
    )]
    pub name: Option<String>,

    /// The name, given as kubectl's `create` verbs take it (`hive token create ci …`).
    #[arg(value_name = "NAME", hide = true)]
    pub name_arg: Option<String>,

    /// What the token may do: viewer (read), agent (read, and request approvals for
    /// its own agent), operator (read and write), admin (everything, including tokens).
    #[arg(long, value_parser = role_values())]
    pub role: Role,

    /// The agent an `agent`-role token is bound to (required with `--role agent`).
    #[arg(long, value_name = "AGENT", required_if_eq("role", "agent"))]
    pub agent: Option<String>,
}

/// Arguments of `hive token list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Output format.
    #[arg(short, long, value_enum, value_name = "FORMAT", default_value_t = ListFormat::Table)]
    pub output: ListFormat,
}

/// `--role`: the role names of [`Role`], each with its one-line help (what clap's
/// `ValueEnum` derive would show, which the foreign type cannot derive here).
fn role_values() -> impl clap::builder::TypedValueParser<Value = Role> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let help = |role: Role| match role {
        Role::Viewer => "Read-only access",
        Role::Agent => "An agent's own token: read, and request approvals for itself",
        Role::Operator => "Read and write access to resources",
        Role::Admin => "Full access, including token management",
    };
    PossibleValuesParser::new(Role::ALL.map(|role| PossibleValue::new(role.as_str()).help(help(role))))
        .map(|name| name.parse::<Role>().expect("every possible value is a role name"))
}

/// `token list` formats.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListFormat {
    /// NAME ROLE AGE.
    Table,
    /// The server's JSON.
    Json,
    /// The server's answer as YAML.
    Yaml,
}

/// Runs `hive token`.
pub async fn exec(args: Args, ctx: &Context) -> Result<()> {
    let client = ctx.client()?;
    match args.command {
        TokenCommand::Create(create) => {
            let name = create.name.or(create.name_arg).unwrap_or_default();
            let mut body = json!({"name": name, "role": create.role.as_str()});
            if let Some(agent) = &create.agent {
                body["agent"] = json!(agent);
            }
            let created = client.post(TOKENS_PATH, &body).await?;
            let token = created
                .get("token")
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow::anyhow!("the server's answer holds no token"))?;
            output::print(&format!("{token}\n"))?;
            output::eprint_line(&format!(
                "token {:?} (role {}) created; store it now, it will not be shown again",
                name,
                create.role.as_str()
            ));
        }
        TokenCommand::List(list) => {
            let body = client.get(TOKENS_PATH).await?;
            let text = match list.output {
                ListFormat::Table => render_list(&body, crate::host::now()),
                ListFormat::Json => output::json(&body)?,
                ListFormat::Yaml => output::yaml(&body)?,
            };
            if text.is_empty() {
                output::eprint_line("No tokens found");
            }
            output::print(&text)?;
        }
        TokenCommand::Revoke(revoke) => {
            let path = format!("{TOKENS_PATH}/{}", super::client::encode(&revoke.name));
            client.delete(&path, &json!({})).await?;
            output::print(&format!("token {:?} revoked\n", revoke.name))?;
        }
    }
    Ok(())
}

/// The `NAME ROLE AGE` table of a token list (empty when there are none).
pub fn render_list(body: &Value, now: DateTime<Utc>) -> String {
    let items = body.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
    if items.is_empty() {
        return String::new();
    }
    let text =
        |item: &Value, key: &str| item.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut lines = vec![vec!["NAME".to_string(), "ROLE".into(), "AGE".into()]];
    for item in &items {
        let created = item.get("createdAt").and_then(Value::as_str);
        lines.push(vec![text(item, "name"), text(item, "role"), output::age(created, now)]);
    }
    output::align(&lines, &mut Vec::new())
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn role_flag_takes_the_role_names() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            create: CreateArgs,
        }
        for role in Role::ALL {
            let cli = Cli::try_parse_from(["create", "--name", "n", "--role", role.as_str(), "--agent", "a"])
                .unwrap();
            assert_eq!(cli.create.role, role);
        }
        let err = Cli::try_parse_from(["create", "--name", "n", "--role", "root"]).err().unwrap();
        assert!(err.to_string().contains("[possible values: viewer, agent, operator, admin]"), "{err}");
        let err = Cli::try_parse_from(["create", "--name", "n", "--role", "agent"]).err().unwrap();
        assert!(err.to_string().contains("--agent <AGENT>"), "an agent token names its agent: {err}");
    }

    #[test]
    fn token_table() {
        let now = Utc.with_ymd_and_hms(2026, 11, 29, 15, 0, 0).unwrap();
        let body = json!({"items": [
            {"name": "admin", "role": "admin", "createdAt": "2026-11-01T10:00:00Z"},
            {"name": "ci-pipeline", "role": "operator", "createdAt": "2026-11-29T14:58:00Z"}
        ]});
        assert_eq!(
            render_list(&body, now),
            "NAME          ROLE       AGE\nadmin         admin      28d\nci-pipeline   operator   2m\n"
        );
        assert_eq!(render_list(&json!({"items": []}), now), "");
    }
}
