//! What WriteDropin writes: the limits drop-in of the container's unit
//! (`container@<c>.service.d/hive-limits.conf`, systemd `CPUQuota=` / `MemoryMax=`) and
//! the `EXTRA_NSPAWN_FLAGS` line of the container's `<c>.conf`, both validated before
//! anything is written.
//!
//! `<c>.conf` is read twice: by systemd as the unit's `EnvironmentFile=`, and by the
//! unit's start script, which expands `$EXTRA_NSPAWN_FLAGS` unquoted into the
//! `systemd-nspawn` command line. So the line is written as `EXTRA_NSPAWN_FLAGS="…"`
//! with `\`, `"`, `$` and `` ` `` backslash-escaped (the same rule in systemd's
//! environment files and POSIX double quotes), and a flag the start script would split or
//! glob (whitespace, control characters, `*`, `?`, `[`) is refused: no quoting survives
//! that expansion.

use hive_api::agent::Agent;
use hive_api::validation::{self, Errors};

use super::NixosConfig;
use crate::runtime::{Error, Result};

/// The drop-in's file name inside `container@<c>.service.d/`.
pub const DROPIN_FILE: &str = "hive-limits.conf";

/// The variable of `<c>.conf` that holds the extra `systemd-nspawn` flags.
pub const FLAGS_VARIABLE: &str = "EXTRA_NSPAWN_FLAGS";

/// The agent's effective limits (`spec.resources`, else the hive-wide defaults) as
/// `(cpu_quota, memory_max)`, checked against the forms systemd takes.
pub fn limits(agent: &Agent, config: &NixosConfig) -> Result<(String, String)> {
    let resources = &agent.spec.resources;
    let (cpu, cpu_field) = match &resources.cpu_quota {
        Some(cpu) => (cpu.as_str(), "spec.resources.cpuQuota"),
        None => (config.default_cpu_quota.as_str(), "agentCpuQuota"),
    };
    let (memory, memory_field) = match &resources.memory_max {
        Some(memory) => (memory.as_str(), "spec.resources.memoryMax"),
        None => (config.default_memory_max.as_str(), "agentMemoryMax"),
    };
    check(agent, cpu_field, |errors| validation::percent(errors, cpu_field, cpu))?;
    check(agent, memory_field, |errors| validation::byte_size(errors, memory_field, memory))?;
    Ok((cpu.to_string(), memory.to_string()))
}

/// Runs one of the API's validators and turns its finding into [`Error::Config`].
fn check(agent: &Agent, field: &'static str, validate: impl FnOnce(&mut Errors)) -> Result<()> {
    let mut errors = Errors::default();
    validate(&mut errors);
    match errors.0.into_iter().next() {
        None => Ok(()),
        Some(error) => {
            Err(Error::Config { agent: agent.metadata.name.clone(), field, message: error.message })
        }
    }
}

/// The drop-in's contents.
pub fn dropin(cpu_quota: &str, memory_max: &str) -> String {
    format!("[Service]\nCPUQuota={cpu_quota}\nMemoryMax={memory_max}\n")
}

/// The properties `systemctl show` is asked for after the drop-in is written, to see
/// that the unit took it.
pub const SHOW_LIMITS: &str = "--property=CPUQuotaPerSecUSec,MemoryMax";

/// Compares what `systemctl show` answered for [`SHOW_LIMITS`] with what the drop-in
/// asks for; `Err` says what differs (the drop-in is then not in effect: not enforced).
pub fn verify(shown: &str, cpu_quota: &str, memory_max: &str) -> std::result::Result<(), String> {
    let value = |key: &str| {
        shown.lines().find_map(|l| l.strip_prefix(key).and_then(|l| l.strip_prefix('='))).map(str::trim)
    };
    let cpu_want = cpu_quota.strip_suffix('%').and_then(|n| n.parse::<u64>().ok()).map(|pct| pct * 10_000);
    let cpu_shown = value("CPUQuotaPerSecUSec");
    let memory_want = byte_size(memory_max);
    let memory_shown = value("MemoryMax");
    let cpu_ok = cpu_want.is_some() && cpu_shown.and_then(timespan_us) == cpu_want;
    let memory_ok = memory_want.is_some() && memory_shown.and_then(byte_size) == memory_want;
    if cpu_ok && memory_ok {
        return Ok(());
    }
    Err(format!(
        "systemd reports CPUQuotaPerSecUSec={} MemoryMax={} for the unit, not the drop-in's \
         CPUQuota={cpu_quota} MemoryMax={memory_max}",
        cpu_shown.unwrap_or("(none)"),
        memory_shown.unwrap_or("(none)")
    ))
}

/// A systemd time span as `systemctl show` prints it (`500ms`, `1s`, `1.500000s`,
/// `2min 30s`), in microseconds; `None` for `infinity` or anything else.
fn timespan_us(text: &str) -> Option<u64> {
    let mut total = 0f64;
    for part in text.split_whitespace() {
        let split = part.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, unit) = part.split_at(split);
        let number: f64 = number.parse().ok()?;
        let scale = match unit {
            "us" | "µs" => 1.0,
            "ms" => 1e3,
            "s" => 1e6,
            "min" => 60e6,
            "h" => 3600e6,
            _ => return None,
        };
        total += number * scale;
    }
    (total > 0.0).then_some(total.round() as u64)
}

/// A byte size in systemd's 1024-based form (`2G`, `512M`, `1073741824`); `None` for
/// `infinity`.
fn byte_size(text: &str) -> Option<u64> {
    let (digits, shift) = match text.as_bytes().last()? {
        b'K' => (&text[..text.len() - 1], 10),
        b'M' => (&text[..text.len() - 1], 20),
        b'G' => (&text[..text.len() - 1], 30),
        b'T' => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// The `EXTRA_NSPAWN_FLAGS="…"` line for the agent's
/// `spec.runtime.nixosContainer.nspawnFlags` (empty when it sets none).
pub fn flags_line(agent: &Agent) -> Result<String> {
    let flags = agent.spec.runtime.nixos_container.as_ref().map(|s| s.nspawn_flags.as_slice()).unwrap_or(&[]);
    let mut value = String::new();
    for flag in flags {
        let split = |c: char| c.is_whitespace() || c.is_control() || matches!(c, '*' | '?' | '[');
        if flag.is_empty() || flag.contains(split) {
            return Err(Error::Config {
                agent: agent.metadata.name.clone(),
                field: "spec.runtime.nixosContainer.nspawnFlags",
                message: format!(
                    "{flag:?}: the container's start script splits and globs these flags, so a flag \
                     must be non-empty without whitespace, control characters, '*', '?' or '['"
                ),
            });
        }
        if !value.is_empty() {
            value.push(' ');
        }
        for c in flag.chars() {
            if matches!(c, '\\' | '"' | '$' | '`') {
                value.push('\\');
            }
            value.push(c);
        }
    }
    Ok(format!("{FLAGS_VARIABLE}=\"{value}\""))
}

/// `conf` with its `EXTRA_NSPAWN_FLAGS=` line replaced by `line` (appended when there is
/// none; a repeated one is dropped), every other line kept as it was.
pub fn replace_flags_line(conf: &str, line: &str) -> String {
    let prefix = format!("{FLAGS_VARIABLE}=");
    let mut out = String::with_capacity(conf.len() + line.len() + 1);
    let mut replaced = false;
    for existing in conf.lines() {
        if existing.trim_start().starts_with(&prefix) {
            if !replaced {
                out.push_str(line);
                out.push('\n');
                replaced = true;
            }
            continue;
        }
        out.push_str(existing);
        out.push('\n');
    }
    if !replaced {
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use hive_api::agent::NixosContainerRuntime;

    use super::*;

    fn agent(flags: &[&str]) -> Agent {
        let mut agent = Agent::default();
        agent.metadata.name = "alpha".into();
        agent.spec.runtime.nixos_container =
            Some(NixosContainerRuntime { nspawn_flags: flags.iter().map(|f| f.to_string()).collect() });
        agent
    }

    #[test]
    fn flags_are_escaped_for_the_environment_file_and_refused_when_the_start_script_would_split_them() {
        let cases: &[(&[&str], Result<&str, ()>)] = &[
            (&[], Ok(r#"EXTRA_NSPAWN_FLAGS="""#)),
            (
                &["--bind=/srv/a:/a", "--private-users=pick"],
                Ok(r#"EXTRA_NSPAWN_FLAGS="--bind=/srv/a:/a --private-users=pick""#),
            ),
            (&[r#"--setenv=A="$x`\"#], Ok(r#"EXTRA_NSPAWN_FLAGS="--setenv=A=\"\$x\`\\""#)),
            (&["--setenv=Q='a'"], Ok(r#"EXTRA_NSPAWN_FLAGS="--setenv=Q='a'""#)),
            (&["--bind=/a b:/c"], Err(())),
            (&["--bind=/a\n"], Err(())),
            (&["--bind=/srv/*"], Err(())),
            (&["--x=?"], Err(())),
            (&["--x=[a]"], Err(())),
            (&[""], Err(())),
        ];
        for (flags, expected) in cases {
            match (flags_line(&agent(flags)), expected) {
                (Ok(line), Ok(want)) => assert_eq!(line, *want, "{flags:?}"),
                (Err(Error::Config { field, .. }), Err(())) => {
                    assert_eq!(field, "spec.runtime.nixosContainer.nspawnFlags")
                }
                (got, want) => panic!("{flags:?}: got {got:?}, want {want:?}"),
            }
        }
        let none = Agent::default();
        assert_eq!(flags_line(&none).unwrap(), r#"EXTRA_NSPAWN_FLAGS="""#);
    }

    #[test]
    fn the_flags_line_is_replaced_keeping_every_other_line() {
        let line = r#"EXTRA_NSPAWN_FLAGS="--x""#;
        let cases: &[(&str, &str)] = &[
            ("", "EXTRA_NSPAWN_FLAGS=\"--x\"\n"),
            (
                "PRIVATE_NETWORK=1\nHOST_BRIDGE=br0\n",
                "PRIVATE_NETWORK=1\nHOST_BRIDGE=br0\nEXTRA_NSPAWN_FLAGS=\"--x\"\n",
            ),
            (
                "PRIVATE_NETWORK=1\nEXTRA_NSPAWN_FLAGS=\"--old\"\nAUTO_START=0\n",
                "PRIVATE_NETWORK=1\nEXTRA_NSPAWN_FLAGS=\"--x\"\nAUTO_START=0\n",
            ),
            (
                "A=1\nEXTRA_NSPAWN_FLAGS=a\nEXTRA_NSPAWN_FLAGS=b\nB=2",
                "A=1\nEXTRA_NSPAWN_FLAGS=\"--x\"\nB=2\n",
            ),
            ("# EXTRA_NSPAWN_FLAGS=kept\n", "# EXTRA_NSPAWN_FLAGS=kept\nEXTRA_NSPAWN_FLAGS=\"--x\"\n"),
        ];
        for (conf, want) in cases {
            assert_eq!(replace_flags_line(conf, line), *want, "{conf:?}");
        }
    }

    #[test]
    fn limits_default_to_the_hive_wide_values_and_name_the_invalid_field() {
        let config = NixosConfig::new("/meta");
        let mut agent = agent(&[]);
        assert_eq!(limits(&agent, &config).unwrap(), ("200%".to_string(), "4G".to_string()));
        agent.spec.resources.cpu_quota = Some("150%".into());
        agent.spec.resources.memory_max = Some("512M".into());
        assert_eq!(limits(&agent, &config).unwrap(), ("150%".to_string(), "512M".to_string()));
        assert_eq!(dropin("150%", "512M"), "[Service]\nCPUQuota=150%\nMemoryMax=512M\n");
        for (shown, cpu, memory, ok) in [
            ("CPUQuotaPerSecUSec=1.500000s\nMemoryMax=536870912\n", "150%", "512M", true),
            ("CPUQuotaPerSecUSec=500ms\nMemoryMax=4294967296\n", "50%", "4G", true),
            ("CPUQuotaPerSecUSec=2s\nMemoryMax=2147483648\n", "200%", "2G", true),
            ("CPUQuotaPerSecUSec=infinity\nMemoryMax=infinity\n", "200%", "2G", false),
            ("CPUQuotaPerSecUSec=1s\nMemoryMax=2147483648\n", "200%", "2G", false),
            ("", "200%", "2G", false),
        ] {
            assert_eq!(verify(shown, cpu, memory).is_ok(), ok, "{shown:?} against {cpu} {memory}");
        }
    }
}
