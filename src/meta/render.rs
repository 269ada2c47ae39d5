//! Rendering the meta flake's `flake.nix` from the lock: one input per agent plus the
//! hive base flake, one `nixosConfigurations.<name>` per agent. A pure function of the
//! lock, sorted, so re-rendering an unchanged agent set is byte-identical.

use std::fmt::Write;

use super::lock::{agent_input, Lock, HIVE};

/// `flake.nix` for the inputs `lock` pins.
pub(super) fn flake_nix(lock: &Lock) -> String {
    let mut out = String::new();
    out.push_str("# Rendered by hive from the agent set; hive rewrites it on every change.\n");
    out.push_str("{\n");
    out.push_str("  description = \"hive meta flake: one nixosConfiguration per agent\";\n\n");
    out.push_str("  inputs = {\n");
    if let Some(hive) = lock.hive() {
        let _ = writeln!(out, "    {HIVE}.url = {};", string(&hive.source.flake_url()));
    }
    for (name, node) in lock.agents() {
        let _ =
            writeln!(out, "    {}.url = {};", string(&agent_input(name)), string(&node.source.flake_url()));
    }
    out.push_str("  };\n\n");
    out.push_str("  outputs = { self, hive, ... }@inputs: {\n");
    out.push_str("    nixosConfigurations = {\n");
    for (name, _) in lock.agents() {
        let _ = writeln!(
            out,
            "      {} = hive.lib.agentSystem {{ name = {}; config = inputs.{}; }};",
            string(name),
            string(name),
            string(&agent_input(name)),
        );
    }
    out.push_str("    };\n");
    out.push_str("  };\n");
    out.push_str("}\n");
    out
}

/// `s` as a nix string literal. Names and URLs are validated before they get here, but
/// escaping keeps a stray `"`, `\` or `${` from ever becoming nix syntax.
fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '$' if chars.peek() == Some(&'{') => out.push_str("\\$"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::super::lock::{Lock, Node, Source};
    use super::*;

    #[test]
    fn renders_sorted_inputs_and_configurations() {
        let mut lock =
            Lock::new(Node { source: Source::parse("github:hive-dev/hive").unwrap(), rev: "h".into() });
        for (name, url) in [("zeta", "/srv/zeta"), ("alpha", "https://example.com/a.git")] {
            let node = Node { source: Source::parse(url).unwrap(), rev: "r".into() };
            lock.inputs.insert(agent_input(name), node);
        }
        let expected = r#"# Rendered by hive from the agent set; hive rewrites it on every change.
{
  description = "hive meta flake: one nixosConfiguration per agent";

  inputs = {
    hive.url = "github:hive-dev/hive";
    "agent-alpha".url = "git+https://example.com/a.git";
    "agent-zeta".url = "git+file:/srv/zeta";
  };

  outputs = { self, hive, ... }@inputs: {
    nixosConfigurations = {
      "alpha" = hive.lib.agentSystem { name = "alpha"; config = inputs."agent-alpha"; };
      "zeta" = hive.lib.agentSystem { name = "zeta"; config = inputs."agent-zeta"; };
    };
  };
}
"#;
        assert_eq!(flake_nix(&lock), expected);
    }

    #[test]
    fn escapes_nix_string_syntax() {
        assert_eq!(string(r#"a"b\c${d}$e"#), r#""a\"b\\c\${d}$e""#);
    }
}
