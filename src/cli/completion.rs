//! `hive completion bash|zsh|fish`: the shell's completion script for every verb and
//! flag, generated from the same clap definition the parser uses (so it cannot drift).

use anyhow::Result;
use clap::CommandFactory as _;

use super::{output, Cli, Context};

/// Arguments of `hive completion`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  source <(hive completion bash)                       # this bash session
  hive completion zsh > \"${fpath[1]}/_hive\"            # zsh, from the next shell on
  hive completion fish > ~/.config/fish/completions/hive.fish")]
pub struct Args {
    /// The shell to print the script for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The shells a script is printed for.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shell {
    /// GNU bash.
    Bash,
    /// Z shell.
    Zsh,
    /// fish.
    Fish,
}

/// The completion script for `shell`.
pub fn script(shell: Shell) -> String {
    let mut command = Cli::command();
    let mut out = Vec::new();
    match shell {
        Shell::Bash => clap_complete::generate(clap_complete::Shell::Bash, &mut command, "hive", &mut out),
        Shell::Zsh => clap_complete::generate(clap_complete::Shell::Zsh, &mut command, "hive", &mut out),
        Shell::Fish => clap_complete::generate(clap_complete::Shell::Fish, &mut command, "hive", &mut out),
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Runs `hive completion`.
pub async fn exec(args: Args, _ctx: &Context) -> Result<()> {
    Ok(output::print(&script(args.shell))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_gets_the_verbs_and_their_flags() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let text = script(shell);
            for word in ["events", "token", "revoke", "sort-by", "types", "completion"] {
                assert!(text.contains(word), "{shell:?} script lacks {word}");
            }
        }
    }
}
