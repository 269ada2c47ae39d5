//! `deploy/`: the systemd unit, the NixOS module and the container recipe, checked
//! against the real binary. Nothing heavy is built: the module is evaluated offline
//! through `deploy/check.nix` (a stub `lib`, no nixpkgs), the units go through a strict
//! parser and `systemd-analyze verify`, and the image's root filesystem is assembled in
//! a temp dir and, as root, run with `chroot` (with `HIVE_DOCKER_TESTS=1` the image is
//! also built and run with docker). Every flag the files pass must be one `hive serve
//! --help` lists. A check whose tool is missing says so on stderr, and the test still
//! asserts what it can without it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::hive_bin;

/// Flags the deploy files may pass before `hive serve` has them (none now: every flag
/// landed). [`deploy_flags_are_serve_flags`] tolerates exactly these (and says which
/// are still missing); [`deploy_flags_are_all_in_serve_help`] tolerates none.
const PENDING_FLAGS: &[&str] = &[];

/// What `%d` (the credentials directory) stands for once specifiers are resolved.
const CREDENTIALS: &str = "$CREDENTIALS_DIRECTORY";

/// The store path check.nix gives the hive package.
const STUB_HIVE: &str = "/nix/store/00000000000000000000000000000000-hive/bin/hive";

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(file)
}

fn read(file: &str) -> String {
    std::fs::read_to_string(deploy(file)).unwrap_or_else(|e| panic!("reading deploy/{file}: {e}"))
}

/// `name` on PATH; `None`, with a note on stderr saying what goes unchecked, if absent.
/// `package` is the Debian package providing it.
fn tool(name: &str, package: &str, unchecked: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(name)).find(|p| p.is_file()));
    if found.is_none() {
        eprintln!("deploy: `{name}` (Debian: {package}) is not on PATH, so {unchecked} is not checked here");
    }
    found
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ---- hive serve --help ---------------------------------------------------------------

fn serve_help() -> String {
    let out = run(Command::new(hive_bin()).args(["serve", "--help"]));
    assert!(out.status.success(), "hive serve --help: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Every `--flag` the help mentions.
fn help_flags(help: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for (i, _) in help.match_indices("--") {
        let name: String = help[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if !name.is_empty() {
            flags.insert(format!("--{name}"));
        }
    }
    flags
}

/// `[default: X]` of each flag, from the long help (a flag's block starts at its line).
fn help_defaults(help: &str) -> BTreeMap<String, String> {
    let mut defaults = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('-') {
            current = trimmed
                .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
                .find(|w| w.starts_with("--"))
                .map(str::to_string);
        }
        if let (Some(flag), Some(start)) = (&current, line.find("[default: ")) {
            let rest = &line[start + "[default: ".len()..];
            if let Some(end) = rest.find(']') {
                defaults.insert(flag.clone(), rest[..end].to_string());
            }
        }
    }
    defaults
}

// ---- systemd unit files --------------------------------------------------------------

#[derive(Debug)]
struct Entry {
    section: String,
    key: String,
    value: String,
    line: usize,
}

/// Directives the unit and the module may use, per section; anything else is a typo or
/// needs adding here on purpose.
const KNOWN: &[(&str, &[&str])] = &[
    ("Unit", &["Description", "Documentation", "After", "Wants", "StartLimitIntervalSec", "StartLimitBurst"]),
    (
        "Service",
        &[
            "Type",
            "ExecStart",
            "User",
            "Group",
            "Environment",
            "StateDirectory",
            "StateDirectoryMode",
            "UMask",
            "Restart",
            "RestartSec",
            "KillMode",
            "TimeoutStopSec",
            "LoadCredential",
            "DynamicUser",
            "Delegate",
            "ProtectSystem",
            "ProtectHome",
            "PrivateTmp",
            "PrivateDevices",
            "NoNewPrivileges",
            "CapabilityBoundingSet",
            "ProtectKernelTunables",
            "ProtectKernelModules",
            "ProtectKernelLogs",
            "ProtectClock",
            "ProtectHostname",
            "LockPersonality",
            "RestrictRealtime",
            "RestrictSUIDSGID",
            "RestrictAddressFamilies",
            "ReadWritePaths",
        ],
    ),
    ("Install", &["WantedBy"]),
];

/// Directives that may appear more than once.
const REPEATABLE: &[&str] = &["Environment", "LoadCredential", "RestrictAddressFamilies", "ReadWritePaths"];

/// A strict parse of a unit file: `[Section]` headers, `Key=Value` lines, `#`/`;`
/// comments and backslash continuations; known sections and keys only, in the order
/// Unit, Service, Install, no repeated single-valued key.
fn parse_unit(text: &str) -> Result<Vec<Entry>, String> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut sections: Vec<String> = Vec::new();
    let mut pending: Option<(String, usize)> = None;
    for (i, raw) in text.lines().enumerate() {
        let is_comment = |s: &str| s.starts_with('#') || s.starts_with(';');
        let (logical, start) = match pending.take() {
            Some((acc, start)) if is_comment(raw.trim_start()) => {
                pending = Some((acc, start));
                continue;
            }
            Some((acc, start)) => (format!("{acc} {}", raw.trim()), start),
            None => (raw.trim().to_string(), i + 1),
        };
        if let Some(head) = logical.strip_suffix('\\') {
            pending = Some((head.trim_end().to_string(), start));
            continue;
        }
        if logical.is_empty() || is_comment(&logical) {
            continue;
        }
        if let Some(header) = logical.strip_prefix('[') {
            let name = header.strip_suffix(']').ok_or(format!("line {start}: bad section header"))?;
            if !KNOWN.iter().any(|(s, _)| *s == name) {
                return Err(format!("line {start}: unknown section [{name}]"));
            }
            if sections.iter().any(|s| s == name) {
                return Err(format!("line {start}: section [{name}] twice"));
            }
            sections.push(name.to_string());
            continue;
        }
        let section = sections.last().ok_or(format!("line {start}: a key outside any section"))?;
        let (key, value) =
            logical.split_once('=').ok_or(format!("line {start}: not Key=Value: {logical}"))?;
        let key = key.trim();
        let known = KNOWN.iter().find(|(s, _)| s == section).map(|(_, keys)| *keys).unwrap_or(&[]);
        if !known.contains(&key) {
            return Err(format!("line {start}: unknown key {key} in [{section}]"));
        }
        if !REPEATABLE.contains(&key) && entries.iter().any(|e| e.section == *section && e.key == key) {
            return Err(format!("line {start}: {key} set twice in [{section}]"));
        }
        entries.push(Entry {
            section: section.clone(),
            key: key.into(),
            value: value.trim().into(),
            line: start,
        });
    }
    if pending.is_some() {
        return Err("the last line ends with a backslash".into());
    }
    let order: Vec<&str> =
        KNOWN.iter().map(|(s, _)| *s).filter(|s| sections.iter().any(|x| x == s)).collect();
    if sections != order {
        return Err(format!("sections out of order: {sections:?}"));
    }
    Ok(entries)
}

fn value<'a>(entries: &'a [Entry], section: &str, key: &str) -> Option<&'a str> {
    entries.iter().find(|e| e.section == section && e.key == key).map(|e| e.value.as_str())
}

/// ExecStart split as systemd does (whitespace, single and double quotes, backslash
/// escapes), with specifiers resolved: `%%` is a literal `%`, `%d` the credentials
/// directory; any other `%` is an error (an unescaped `200%` is a specifier to systemd).
fn exec_words(value: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) if c == '\\' => word.push(chars.next().ok_or("a dangling backslash")?),
            Some(_) => word.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                in_word = true;
            }
            None if c == '\\' => {
                word.push(chars.next().ok_or("a dangling backslash")?);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            None => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err(format!("unterminated quote in {value}"));
    }
    if in_word {
        words.push(word);
    }
    words.into_iter().map(|w| specifiers(&w)).collect()
}

fn specifiers(word: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = word.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('d') => out.push_str(CREDENTIALS),
            other => {
                return Err(format!(
                    "`{word}`: `%{}` is a systemd specifier; a literal % is written %%",
                    other.map(String::from).unwrap_or_default()
                ))
            }
        }
    }
    Ok(out)
}

/// `--flag value` / `--flag=value` / bare `--flag` pairs, in order.
fn flag_pairs(args: &[String]) -> Vec<(String, Option<String>)> {
    let mut pairs = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        assert!(arg.starts_with("--"), "`{arg}` is not a flag (hive serve takes no positional arguments)");
        if let Some((flag, v)) = arg.split_once('=') {
            pairs.push((flag.to_string(), Some(v.to_string())));
        } else if args.get(i + 1).is_some_and(|next| !next.starts_with("--")) {
            pairs.push((arg.clone(), Some(args[i + 1].clone())));
            i += 1;
        } else {
            pairs.push((arg.clone(), None));
        }
        i += 1;
    }
    pairs
}

fn flag<'a>(pairs: &'a [(String, Option<String>)], name: &str) -> Option<&'a str> {
    pairs.iter().find(|(f, _)| f == name).and_then(|(_, v)| v.as_deref())
}

/// The arguments after `<binary> serve` of a unit's ExecStart, and the binary.
fn serve_args(entries: &[Entry]) -> (String, Vec<String>) {
    let exec = value(entries, "Service", "ExecStart").expect("ExecStart");
    let words = exec_words(exec).unwrap_or_else(|e| panic!("ExecStart: {e}"));
    assert!(words.len() >= 2 && words[1] == "serve", "ExecStart runs `hive serve`: {words:?}");
    (words[0].clone(), words[2..].to_vec())
}

/// Seconds of a systemd time span such as `210s`, `3min` or `210`.
fn seconds(span: &str) -> u64 {
    let digits: String = span.chars().take_while(char::is_ascii_digit).collect();
    let n: u64 = digits.parse().unwrap_or_else(|_| panic!("time span {span}"));
    match &span[digits.len()..] {
        "" | "s" | "sec" => n,
        "min" | "m" => n * 60,
        unit => panic!("time span unit {unit} in {span}"),
    }
}

/// `systemd-analyze verify` of `unit` (its hive binary path swapped for the built one,
/// since verify checks that ExecStart's program exists). Fails on any complaint about
/// the file, not only on a non-zero exit: verify exits 0 for unknown keys.
fn systemd_verify(name: &str, unit: &str, hive_path: &str) {
    let Some(analyze) = tool("systemd-analyze", "systemd", &format!("`systemd-analyze verify` of {name}"))
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("hive.service");
    std::fs::write(&path, unit.replace(hive_path, hive_bin())).expect("write unit");
    let out = run(Command::new(analyze).arg("verify").arg(&path));
    let stderr = text(&out.stderr);
    let complaints: Vec<&str> = stderr.lines().filter(|l| l.contains("hive.service")).collect();
    assert!(
        out.status.success() && complaints.is_empty(),
        "systemd-analyze verify {name}: {}\n{stderr}{}",
        out.status,
        text(&out.stdout)
    );
}

#[test]
fn unit_file_is_strict_and_spells_out_the_defaults() {
    let entries = parse_unit(&read("hive.service")).unwrap_or_else(|e| panic!("deploy/hive.service: {e}"));
    let (binary, args) = serve_args(&entries);
    assert_eq!(binary, "/usr/local/bin/hive");
    let pairs = flag_pairs(&args);
    assert_eq!(flag(&pairs, "--listen"), Some("127.0.0.1:7443"));
    assert_eq!(flag(&pairs, "--state-dir"), Some("/var/lib/hive"));
    assert_eq!(flag(&pairs, "--build-slots"), Some("1"));
    assert_eq!(flag(&pairs, "--build-retries"), Some("0"));
    assert!(!pairs.iter().any(|(f, _)| f == "--job-history-max-age"), "no bound by age by default");
    assert_eq!(flag(&pairs, "--runtime"), Some("process"));
    assert_eq!(flag(&pairs, "--agent-cpu-quota"), Some("200%"), "written 200%% in the unit");
    assert_eq!(flag(&pairs, "--agent-memory-max"), Some("4G"));
    assert!(!pairs.iter().any(|(f, _)| f == "--prebuild-agent-templates"), "off by default");
    assert_eq!(flag(&pairs, "--log-format"), Some("text"));
    assert_eq!(flag(&pairs, "--audit-log-max-size"), Some("100M"));
    assert_eq!(flag(&pairs, "--audit-log-max-backups"), Some("5"));
    // The state directory systemd creates is the one the daemon uses.
    assert_eq!(value(&entries, "Service", "StateDirectory"), Some("hive"));
    // Stopping: the daemon stops its agents itself; systemd signals only the daemon
    // and leaves it one agent's graceful stop (180 s) plus the kill wait (10 s).
    assert_eq!(value(&entries, "Service", "KillMode"), Some("mixed"));
    let stop = seconds(value(&entries, "Service", "TimeoutStopSec").expect("TimeoutStopSec"));
    assert!(stop >= 190, "TimeoutStopSec {stop}s is shorter than one graceful agent stop");
    assert_eq!(value(&entries, "Service", "DynamicUser"), Some("yes"));
    assert_eq!(value(&entries, "Service", "Delegate"), Some("yes"));
    assert_eq!(value(&entries, "Service", "Restart"), Some("on-failure"));
    assert_eq!(value(&entries, "Install", "WantedBy"), Some("multi-user.target"));

    // The parser itself is strict.
    assert!(parse_unit("[Service]\nDynamicUsers=yes\n").is_err());
    assert!(parse_unit("[Service]\nType=exec\nType=simple\n").is_err());
    assert!(parse_unit("[Install]\nWantedBy=x\n[Unit]\nDescription=x\n").is_err());
    assert!(exec_words("/bin/hive serve --agent-cpu-quota 200%").is_err());
    assert_eq!(exec_words("a '%%d b' %d/x").unwrap(), ["a", "%d b", "$CREDENTIALS_DIRECTORY/x"]);
    let long = "  --runtime <R>\n      Possible values:\n      - process: x\n      - nixos-container: y\n  --log <F>\n      - no: z\n";
    assert_eq!(
        help_possible_values(long, "--runtime"),
        ["nixos-container", "process"].map(String::from).into()
    );
    let short = "  --runtime <R>  Runtime [default: process] [possible values: process, nixos-container]\n";
    assert_eq!(help_possible_values(short, "--runtime").len(), 2);
    let entry = &parse_unit("[Service]\nExecStart=/a \\\n  # note\n  --b\n").unwrap()[0];
    assert_eq!((entry.value.as_str(), entry.line), ("/a --b", 2));
}

#[test]
fn unit_file_passes_systemd_analyze_verify() {
    systemd_verify("deploy/hive.service", &read("hive.service"), "/usr/local/bin/hive");
}

// ---- the NixOS module ----------------------------------------------------------------

/// `nix-instantiate` with its state in a temp dir, so it needs no daemon, no writable
/// /nix/var and no nix.conf (no `nixbld` group warning).
fn nix_instantiate(args: &[&str]) -> Option<Output> {
    let bin = tool(
        "nix-instantiate",
        "nix-bin, .ci/run installs it",
        "the NixOS module (`nix-instantiate --parse` / `--eval`)",
    )?;
    let state = tempfile::tempdir().expect("tempdir");
    Some(run(Command::new(bin)
        .args(args)
        .current_dir(deploy(""))
        .env("NIX_STATE_DIR", state.path().join("state"))
        .env("NIX_LOG_DIR", state.path().join("log"))
        .env("NIX_CONF_DIR", state.path())
        .env_remove("NIX_PATH")
        .env_remove("NIX_REMOTE")))
}

/// The scenarios of deploy/check.nix, evaluated; `None` without nix-instantiate.
fn module_scenarios() -> Option<Value> {
    let out = nix_instantiate(&["--eval", "--strict", "--json", "--readonly-mode", "check.nix"])?;
    assert!(out.status.success(), "nix-instantiate --eval deploy/check.nix:\n{}", text(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).expect("check.nix yields JSON"))
}

/// The `hive serve` arguments a rendered scenario's ExecStart passes.
fn module_args(scenario: &Value) -> Vec<String> {
    let exec = scenario["execStart"].as_str().expect("execStart");
    let words = exec_words(exec).unwrap_or_else(|e| panic!("module ExecStart: {e}"));
    assert_eq!(words[..2], [STUB_HIVE, "serve"], "module ExecStart runs `hive serve`");
    words[2..].to_vec()
}

/// Every `"--flag"` string literal in hive.nix (needs no nix: a textual scan).
fn module_flag_literals() -> BTreeSet<String> {
    let source = read("hive.nix");
    source
        .match_indices("\"--")
        .map(|(i, _)| {
            let name: String = source[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                .collect();
            name
        })
        .collect()
}

#[test]
fn module_and_its_check_parse() {
    for file in ["hive.nix", "check.nix", "agent.nix", "agent-system.nix", "check-flake.nix", "../flake.nix"]
    {
        let Some(out) = nix_instantiate(&["--parse", file]) else { return };
        assert!(out.status.success(), "nix-instantiate --parse deploy/{file}:\n{}", text(&out.stderr));
    }
}

#[test]
fn module_renders_the_options_into_the_service() {
    let Some(all) = module_scenarios() else { return };
    let s = |name: &str| -> &Value { &all[name] };
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().expect("array").iter().map(|x| x.as_str().expect("string").to_string()).collect()
    };

    // Options: the seed's defaults, every one documented.
    let options = &s("default")["options"];
    let defaults: BTreeMap<&str, Value> = [
        ("enable", Value::Bool(false)),
        ("listen", "127.0.0.1:7443".into()),
        ("stateDir", "/var/lib/hive".into()),
        ("buildSlots", 1.into()),
        ("buildRetries", 0.into()),
        ("jobHistoryMaxAge", Value::Null),
        ("runtime", "process".into()),
        ("agentCpuQuota", "200%".into()),
        ("agentMemoryMax", "4G".into()),
        ("provider", "process".into()),
        ("fleetListen", "127.0.0.1:7946".into()),
        ("preBuildAgentTemplates", Value::Bool(false)),
        ("agentTemplates", Value::Array(vec![])),
        ("tlsCert", Value::Null),
        ("tlsKey", Value::Null),
        ("hiveFlake", Value::Null),
        ("hiveRev", Value::Null),
        ("logFormat", "text".into()),
        ("auditLog", Value::Bool(true)),
        ("auditLogPath", Value::Null),
        ("auditLogMaxSize", "100M".into()),
        ("auditLogMaxBackups", 5.into()),
        ("auditReads", Value::Bool(false)),
        ("metrics", Value::Bool(true)),
        ("metricsListen", Value::Null),
        ("extraArgs", Value::Array(vec![])),
    ]
    .into_iter()
    .collect();
    for (name, default) in &defaults {
        assert_eq!(options[name]["hasDefault"], true, "{name} has a default");
        assert_eq!(&options[name]["default"], default, "default of services.hive.{name}");
    }
    assert_eq!(options["package"]["hasDefault"], false, "nixpkgs has no hive: package is required");
    let declared: BTreeSet<&str> = options.as_object().unwrap().keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = defaults.keys().copied().chain(["package"]).collect();
    assert_eq!(declared, expected, "the options of services.hive");
    for name in &declared {
        let description = options[name]["description"].as_str().unwrap_or_default();
        assert!(description.len() > 20, "services.hive.{name} is documented");
    }
    let readme = read("README.md");
    for name in &declared {
        assert!(readme.contains(&format!("`{name}`")), "deploy/README.md's table lists services.hive.{name}");
    }
    let prebuild = options["preBuildAgentTemplates"]["description"].as_str().unwrap();
    for needle in ["trade-off", "x86_64", "aarch64", "single-digit GB", "first spawn"] {
        assert!(prebuild.contains(needle), "preBuildAgentTemplates documents {needle:?}");
    }

    // Defaults: the process runtime, a dynamic user in a sandbox, the same command line
    // as deploy/hive.service.
    let default = s("default");
    let unit = parse_unit(&read("hive.service")).unwrap();
    let (_, unit_args) = serve_args(&unit);
    assert_eq!(module_args(default), unit_args, "module and unit run the same command by default");
    let service = &default["serviceConfig"];
    assert_eq!(service["DynamicUser"], true);
    assert_eq!(service["Delegate"], true);
    assert_eq!(service["KillMode"], "mixed");
    assert_eq!(service["StateDirectory"], "hive");
    assert!(service.get("User").is_none());
    assert_eq!(strings(&default["path"]), ["git"]);
    for empty in ["warnings", "failedAssertions", "extraDependencies", "tmpfiles"] {
        assert_eq!(default[empty], Value::Array(vec![]), "{empty} by default");
    }
    assert_eq!(default["enableContainers"], false);

    assert_eq!(s("disabled")["enabled"], false, "nothing without enable = true");

    // The issue-15 options at their defaults: the formats and sizes spelled out, the
    // switches and addresses absent (the daemon's own defaults: audit log on in the
    // state directory, no reads, metrics recorded, no plain listener).
    let pairs = flag_pairs(&module_args(default));
    assert_eq!(flag(&pairs, "--log-format"), Some("text"));
    assert_eq!(flag(&pairs, "--audit-log-max-size"), Some("100M"));
    assert_eq!(flag(&pairs, "--audit-log-max-backups"), Some("5"));
    for absent in [
        "--audit-log",
        "--no-audit-log",
        "--audit-reads",
        "--metrics",
        "--metrics-listen",
        "--job-history-max-age",
    ] {
        assert!(!pairs.iter().any(|(f, _)| f == absent), "{absent} by default");
    }
    let no_audit = flag_pairs(&module_args(s("noAuditLog")));
    assert!(no_audit.contains(&("--no-audit-log".into(), None)), "{no_audit:?}");
    assert!(!no_audit.iter().any(|(f, _)| f == "--audit-log"));
    let conflict = strings(&s("auditLogPathWithoutLog")["failedAssertions"]);
    assert!(conflict.len() == 1 && conflict[0].contains("auditLogPath"), "{conflict:?}");

    // Every option away from its default.
    let containers = s("containers");
    let args = module_args(containers);
    let pairs = flag_pairs(&args);
    assert_eq!(flag(&pairs, "--listen"), Some("0.0.0.0:7443"));
    assert_eq!(flag(&pairs, "--state-dir"), Some("/srv/hive"));
    assert_eq!(flag(&pairs, "--build-slots"), Some("4"));
    assert_eq!(flag(&pairs, "--build-retries"), Some("3"));
    assert_eq!(flag(&pairs, "--job-history-max-age"), Some("24h"));
    assert_eq!(flag(&pairs, "--runtime"), Some("nixos-container"));
    assert_eq!(flag(&pairs, "--agent-cpu-quota"), Some("400%"));
    assert_eq!(flag(&pairs, "--agent-memory-max"), Some("8G"));
    assert_eq!(flag(&pairs, "--provider"), Some("docker"));
    assert_eq!(flag(&pairs, "--fleet-listen"), Some("0.0.0.0:7946"));
    assert!(pairs.contains(&("--prebuild-agent-templates".into(), None)));
    assert_eq!(flag(&pairs, "--log"), Some("hive=debug"), "extraArgs are passed, quoted");
    assert_eq!(flag(&pairs, "--hive-flake"), Some("github:hive-dev/hive"));
    assert_eq!(flag(&pairs, "--hive-rev"), Some("0123456789abcdef0123456789abcdef01234567"));
    assert_eq!(flag(&pairs, "--log-format"), Some("json"));
    assert_eq!(flag(&pairs, "--audit-log"), Some("/srv/hive/audit/api.log"));
    assert_eq!(flag(&pairs, "--audit-log-max-size"), Some("1G"));
    assert_eq!(flag(&pairs, "--audit-log-max-backups"), Some("0"));
    assert!(pairs.contains(&("--audit-reads".into(), None)));
    assert_eq!(flag(&pairs, "--metrics"), Some("false"));
    assert_eq!(flag(&pairs, "--metrics-listen"), Some("127.0.0.1:9464"));
    assert!(!pairs.iter().any(|(f, _)| f == "--no-audit-log"));
    assert_eq!(flag(&pairs, "--tls-cert"), Some("$CREDENTIALS_DIRECTORY/tls.crt"));
    assert_eq!(flag(&pairs, "--tls-key"), Some("$CREDENTIALS_DIRECTORY/tls.key"));
    let service = &containers["serviceConfig"];
    assert_eq!(
        strings(&service["LoadCredential"]),
        ["tls.crt:/run/keys/hive.crt", "tls.key:/run/keys/hive.key"]
    );
    assert_eq!(service["User"], "root", "nixos-container drives systemd and nixos-container");
    assert!(service.get("DynamicUser").is_none() && service.get("StateDirectory").is_none());
    assert_eq!(service["KillMode"], "mixed");
    assert_eq!(containers["enableContainers"], true);
    assert_eq!(strings(&containers["path"]), ["git", "nix", "nixos-container", "systemd"]);
    assert!(strings(&containers["experimentalFeatures"]).contains(&"flakes".to_string()));
    assert_eq!(strings(&containers["extraDependencies"]), ["agent-base-toplevel", "manager-toplevel"]);
    assert_eq!(strings(&containers["tmpfiles"]), ["d /srv/hive 0700 root root -"]);
    assert_eq!(containers["warnings"], Value::Array(vec![]));

    // The docker provider under the process runtime's dynamic user: the socket's group,
    // and a warning when containers could not reach the fleet endpoint.
    let docker = s("dockerProvider");
    assert_eq!(strings(&docker["serviceConfig"]["SupplementaryGroups"]), ["docker"]);
    assert_eq!(docker["warnings"], Value::Array(vec![]));
    assert_eq!(flag(&flag_pairs(&module_args(docker)), "--provider"), Some("docker"));
    let loopback = strings(&s("dockerLoopback")["warnings"]);
    assert!(loopback.len() == 1 && loopback[0].contains("fleetListen"), "{loopback:?}");
    assert!(default["serviceConfig"].get("SupplementaryGroups").is_none());

    // preBuildAgentTemplates on aarch64 without templates: warned twice.
    let warnings = strings(&s("aarch64")["warnings"]);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("x86_64") && warnings[1].contains("agentTemplates is empty"));

    // Misconfigurations fail their assertions; the stand-in rejects bad values.
    assert!(strings(&s("halfTls")["failedAssertions"])[0].contains("tlsCert and tlsKey"));
    assert!(strings(&s("processOutsideVarLib")["failedAssertions"])[0].contains("/var/lib"));
    assert!(strings(&s("tooManyRetries")["failedAssertions"])[0].contains("buildRetries"));
    for (case, accepted) in s("rejects").as_object().unwrap() {
        assert_eq!(accepted, false, "check.nix accepted the bad configuration {case}");
    }

    // The rendered units are units: strict parse, then systemd-analyze.
    for name in ["default", "containers"] {
        let unit = s(name)["unit"].as_str().unwrap();
        parse_unit(unit).unwrap_or_else(|e| panic!("module unit ({name}): {e}\n{unit}"));
        systemd_verify(&format!("the module's unit ({name})"), unit, STUB_HIVE);
    }
}

// ---- flags against `hive serve --help` ------------------------------------------------

/// Every flag the unit, the module (rendered, and as literals in its source) and the
/// Containerfile pass.
fn deploy_flags() -> BTreeSet<String> {
    let mut flags = module_flag_literals();
    let unit = parse_unit(&read("hive.service")).unwrap();
    flags.extend(flag_pairs(&serve_args(&unit).1).into_iter().map(|(f, _)| f));
    if let Some(all) = module_scenarios() {
        for scenario in all.as_object().unwrap().values() {
            if scenario.get("execStart").is_some() {
                flags.extend(flag_pairs(&module_args(scenario)).into_iter().map(|(f, _)| f));
            }
        }
    }
    flags
}

/// Today: each flag is in `hive serve --help` or still pending, and each value the unit
/// spells out is the flag's default where the help states one.
#[test]
fn deploy_flags_are_serve_flags() {
    let help = serve_help();
    let known = help_flags(&help);
    let flags = deploy_flags();
    let unknown: Vec<&String> =
        flags.iter().filter(|f| !known.contains(*f) && !PENDING_FLAGS.contains(&f.as_str())).collect();
    assert!(unknown.is_empty(), "deploy/ passes flags `hive serve` does not know: {unknown:?}");
    let missing: Vec<&&str> = PENDING_FLAGS.iter().filter(|f| !known.contains(**f)).collect();
    if !missing.is_empty() {
        eprintln!("deploy: flags still pending in `hive serve`: {missing:?}");
    }
    let defaults = help_defaults(&help);
    let unit = parse_unit(&read("hive.service")).unwrap();
    for (name, v) in flag_pairs(&serve_args(&unit).1) {
        if let (Some(v), Some(default)) = (v, defaults.get(&name)) {
            assert_eq!(&v, default, "deploy/hive.service spells out {name} at its default");
        }
    }
    // The Containerfile's environment is what `hive serve` reads.
    for (key, _) in container_env(&containerfile()) {
        assert!(help.contains(&key), "`hive serve --help` does not mention ${key}");
    }
}

/// The values `--flag` accepts, from the help's `Possible values:` list (long help) or
/// `[possible values: a, b]` (short help).
fn help_possible_values(help: &str, flag: &str) -> BTreeSet<String> {
    let mut values = BTreeSet::new();
    let mut inside = false;
    for line in help.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("--") || trimmed.starts_with("-h") {
            inside = trimmed.starts_with(&format!("{flag} ")) || trimmed == flag;
        }
        if !inside {
            continue;
        }
        if let Some(value) = trimmed.strip_prefix("- ").and_then(|v| v.split(':').next()) {
            values.insert(value.trim().to_string());
        }
        if let Some(start) = line.find("[possible values: ") {
            let rest = &line[start + "[possible values: ".len()..];
            let list = &rest[..rest.find(']').unwrap_or(rest.len())];
            values.extend(list.split(", ").map(str::to_string));
        }
    }
    values
}

/// Strict: every flag is in `hive serve --help`, and `--runtime` accepts every runtime
/// the module offers.
#[test]
fn deploy_flags_are_all_in_serve_help() {
    let help = serve_help();
    let known = help_flags(&help);
    let missing: Vec<String> = deploy_flags().into_iter().filter(|f| !known.contains(f)).collect();
    assert!(missing.is_empty(), "`hive serve --help` lacks {missing:?}");
    let runtimes = help_possible_values(&help, "--runtime");
    for runtime in ["process", "nixos-container"] {
        assert!(runtimes.contains(runtime), "`hive serve --runtime` does not accept {runtime}: {runtimes:?}");
    }
}

/// The unit's own command line (state dir and port swapped for temp ones) starts the
/// daemon, which then stops cleanly on SIGTERM, as systemd stops it.
#[test]
fn unit_command_line_starts_and_stops_the_daemon() {
    let dir = tempfile::tempdir().expect("tempdir");
    let unit = parse_unit(&read("hive.service")).unwrap();
    let mut args = vec!["serve".to_string()];
    for (name, v) in flag_pairs(&serve_args(&unit).1) {
        let v = match name.as_str() {
            "--state-dir" => Some(dir.path().display().to_string()),
            "--listen" | "--fleet-listen" => Some("127.0.0.1:0".into()),
            _ => v,
        };
        args.push(name);
        args.extend(v);
    }
    let mut child = Command::new(hive_bin())
        .args(&args)
        // The fleet endpoint's fixed default port would collide with parallel tests.
        .env("HIVE_FLEET_LISTEN", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hive serve");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("hive: serving ") {
                let _ = tx.send(());
            }
        }
    });
    let served = rx.recv_timeout(Duration::from_secs(60)).is_ok();
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    assert!(served, "hive serve {args:?} did not start:\n{stderr}");
    assert!(status.is_some_and(|s| s.success()), "no clean exit on SIGTERM ({status:?}):\n{stderr}");
}

// ---- the container image --------------------------------------------------------------

fn containerfile() -> Vec<(String, String)> {
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in read("Containerfile").lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let logical = std::mem::take(&mut pending);
        let (op, rest) = logical.split_once(char::is_whitespace).unwrap_or((&logical, ""));
        instructions.push((op.to_ascii_uppercase(), rest.trim().to_string()));
    }
    instructions
}

fn container_env(instructions: &[(String, String)]) -> Vec<(String, String)> {
    instructions
        .iter()
        .filter(|(op, _)| op == "ENV")
        .flat_map(|(_, rest)| rest.split_whitespace())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("ENV {kv}: use KEY=VALUE"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// PT_INTERP of an ELF64 little-endian executable: the loader the kernel starts.
fn elf_interpreter(path: &str) -> Option<String> {
    let mut head = Vec::new();
    std::fs::File::open(path).ok()?.take(1 << 20).read_to_end(&mut head).ok()?;
    if head.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let int = |at: usize, len: usize| -> Option<usize> {
        let bytes = head.get(at..at + len)?;
        Some(bytes.iter().rev().fold(0usize, |acc, b| (acc << 8) | usize::from(*b)))
    };
    let (phoff, phentsize, phnum) = (int(0x20, 8)?, int(0x36, 2)?, int(0x38, 2)?);
    (0..phnum).find_map(|i| {
        let ph = phoff + i * phentsize;
        if int(ph, 4)? != 3 {
            return None;
        }
        let (offset, size) = (int(ph + 8, 8)?, int(ph + 32, 8)?);
        let raw = head.get(offset..offset + size)?;
        Some(text(raw).trim_end_matches('\0').to_string())
    })
}

#[test]
fn rootfs_script_builds_what_the_containerfile_copies() {
    let script = deploy("rootfs.sh");
    let out = run(Command::new("sh").arg("-n").arg(&script));
    assert!(out.status.success(), "sh -n deploy/rootfs.sh: {}", text(&out.stderr));

    let temp = tempfile::tempdir().expect("tempdir");
    let rootfs = temp.path().join("rootfs");
    let out = run(Command::new("sh").arg(&script).arg(hive_bin()).arg(&rootfs));
    assert!(out.status.success(), "deploy/rootfs.sh: {}{}", text(&out.stdout), text(&out.stderr));
    let again = run(Command::new("sh").arg(&script).arg(hive_bin()).arg(&rootfs));
    assert!(!again.status.success(), "rootfs.sh refuses a non-empty output directory");
    let inside = |p: &str| rootfs.join(p.trim_start_matches('/'));

    // The loader the kernel will look for, and every library ldd resolves.
    let mut needed = Vec::new();
    match elf_interpreter(hive_bin()) {
        Some(interp) => needed.push(interp),
        None => eprintln!("deploy: the binary has no PT_INTERP (static?) or is not ELF64 LE"),
    }
    if tool("ldd", "libc-bin", "the image's shared libraries").is_some() {
        let ldd = run(Command::new("ldd").arg(hive_bin()));
        for line in text(&ldd.stdout).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [_, "=>", path, ..] if path.starts_with('/') => needed.push(path.to_string()),
                [path, ..] if path.starts_with('/') => needed.push(path.to_string()),
                _ => {}
            }
        }
    }
    for file in &needed {
        assert!(inside(file).is_file(), "the root filesystem lacks {file}");
    }

    // git's builtins are hard links to one binary on the host; the rootfs keeps them
    // links (copied one by one, ~140 copies of git made the image 0.5 GB larger).
    let exec_path = text(&run(Command::new("git").arg("--exec-path")).stdout).trim().to_string();
    let inodes = |dir: &Path| -> BTreeSet<u64> {
        use std::os::unix::fs::MetadataExt;
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .filter_map(|e| std::fs::metadata(e.path()).ok())
            .filter(|m| m.is_file())
            .map(|m| m.ino())
            .collect()
    };
    let (host, image) = (inodes(Path::new(&exec_path)), inodes(&inside(&exec_path)));
    assert_eq!(image.len(), host.len(), "as many distinct files in git's exec path as on the host");

    // The Containerfile: FROM scratch, no RUN (no shell), sources from rootfs.sh.
    let instructions = containerfile();
    assert_eq!(instructions[0], ("FROM".to_string(), "scratch".to_string()));
    let allowed = ["FROM", "COPY", "ENV", "VOLUME", "EXPOSE", "ENTRYPOINT", "CMD", "STOPSIGNAL", "LABEL"];
    for (op, rest) in &instructions {
        assert!(allowed.contains(&op.as_str()), "{op} {rest}: not for a FROM scratch image");
        match op.as_str() {
            "COPY" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                assert!(words.len() >= 2 && !words[0].starts_with("--"), "COPY {rest}");
                for src in &words[..words.len() - 1] {
                    let path = if *src == "." { rootfs.clone() } else { inside(src) };
                    assert!(path.exists(), "COPY source {src} is not in what rootfs.sh builds");
                }
            }
            "VOLUME" => {
                for dir in rest.split_whitespace() {
                    assert!(inside(dir).is_dir(), "VOLUME {dir} is not a directory in the rootfs");
                }
            }
            "ENTRYPOINT" => {
                let argv: Vec<String> = serde_json::from_str(rest).expect("ENTRYPOINT in exec form");
                assert_eq!(argv[1..], ["serve"]);
                let meta = std::fs::metadata(inside(&argv[0])).expect("ENTRYPOINT binary in the rootfs");
                use std::os::unix::fs::PermissionsExt;
                assert!(meta.permissions().mode() & 0o111 != 0, "{} is executable", argv[0]);
            }
            _ => {}
        }
    }
    let env: BTreeMap<String, String> = container_env(&instructions).into_iter().collect();
    let port = env["HIVE_LISTEN"].rsplit(':').next().unwrap().to_string();
    assert!(instructions.contains(&("EXPOSE".into(), port)), "EXPOSE the HIVE_LISTEN port");
    let fleet = env["HIVE_FLEET_LISTEN"].rsplit(':').next().unwrap().to_string();
    assert!(instructions.contains(&("EXPOSE".into(), format!("{fleet}/udp"))), "EXPOSE the fleet port (UDP)");
    assert!(inside(&env["HIVE_STATE_DIR"]).is_dir(), "HIVE_STATE_DIR exists in the rootfs");

    // The proof: the binary runs with nothing but the rootfs (needs root for chroot).
    if !rustix::process::geteuid().is_root() {
        eprintln!("deploy: not root, so running the binary inside the rootfs (chroot) is not checked");
        return;
    }
    let Some(chroot) = tool("chroot", "coreutils", "running the binary inside the rootfs") else { return };
    let out = run(Command::new(chroot).arg(&rootfs).args(["/usr/local/bin/hive", "serve", "--help"]));
    if out.status.code() == Some(125) {
        eprintln!("deploy: chroot itself failed, so the rootfs run is not checked: {}", text(&out.stderr));
        return;
    }
    assert!(out.status.success(), "hive inside the rootfs: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("--listen"));
}

/// Removes the test's container and image, whatever happened.
struct DockerCleanup {
    docker: PathBuf,
    image: String,
    container: Option<String>,
}

impl Drop for DockerCleanup {
    fn drop(&mut self) {
        if let Some(id) = &self.container {
            let _ = Command::new(&self.docker).args(["rm", "-f", "-v", id]).output();
        }
        let _ = Command::new(&self.docker).args(["rmi", "-f", &self.image]).output();
    }
}

/// The image itself, built and run with docker: opt-in (`HIVE_DOCKER_TESTS=1`), since it
/// needs a docker daemon and writes to its image store.
#[test]
fn image_builds_and_serves_with_docker() {
    if std::env::var_os("HIVE_DOCKER_TESTS").is_none_or(|v| v != "1") {
        eprintln!("deploy: HIVE_DOCKER_TESTS=1 is not set, so the image is not built and run with docker");
        return;
    }
    let Some(docker) = tool("docker", "docker.io", "the image under docker") else { return };
    let temp = tempfile::tempdir().expect("tempdir");
    let rootfs = temp.path().join("rootfs");
    let out = run(Command::new("sh").arg(deploy("rootfs.sh")).arg(hive_bin()).arg(&rootfs));
    assert!(out.status.success(), "deploy/rootfs.sh: {}", text(&out.stderr));
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let image = format!("hive-deploy-check:{}-{nanos}", std::process::id());
    let mut cleanup = DockerCleanup { docker: docker.clone(), image: image.clone(), container: None };

    let out = run(Command::new(&docker)
        .args(["build", "-q", "-f"])
        .arg(deploy("Containerfile"))
        .args(["-t", &image])
        .arg(&rootfs));
    assert!(out.status.success(), "docker build: {}", text(&out.stderr));
    let out = run(Command::new(&docker).args(["run", "--rm", &image, "--help"]));
    assert!(text(&out.stdout).contains("Usage: hive serve"), "flags after the image go to `hive serve`");

    // The image's defaults: serves on 7443 with its state in the volume; stops on SIGTERM.
    let out = run(Command::new(&docker).args(["run", "-d", "--init", &image]));
    assert!(out.status.success(), "docker run: {}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    cleanup.container = Some(id.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    let logs = loop {
        let logs = run(Command::new(&docker).args(["logs", &id]));
        let logs = format!("{}{}", text(&logs.stdout), text(&logs.stderr));
        if logs.contains("hive: serving") || Instant::now() > deadline {
            break logs;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(logs.contains("hive: serving https://127.0.0.1:7443"), "the container serves:\n{logs}");
    assert!(logs.contains("hive: kubeconfig /var/lib/hive/kubeconfig.yaml"), "{logs}");
    let out = run(Command::new(&docker).args(["stop", "-t", "30", &id]));
    assert!(out.status.success(), "docker stop: {}", text(&out.stderr));
    let out = run(Command::new(&docker).args(["inspect", "-f", "{{.State.ExitCode}}", &id]));
    assert_eq!(text(&out.stdout).trim(), "0", "a clean exit on SIGTERM");
}

// ---- the hive base flake the meta flake consumes -------------------------------------

fn repo_root() -> &'static str {
    env!("CARGO_MANIFEST_DIR")
}

/// The meta flake's hive node in `<state>/meta/flake.lock`.
fn locked_hive(state: &Path) -> Value {
    let lock = std::fs::read_to_string(state.join("meta/flake.lock")).expect("meta/flake.lock");
    let lock: Value = serde_json::from_str(&lock).expect("flake.lock is JSON");
    lock["nodes"]["hive"]["locked"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_hive_rev_is_the_commit_the_binary_was_built_from() {
    let d = crate::harness::Daemon::start();
    let locked = locked_hive(&d.dir);
    let rev = locked["rev"].as_str().unwrap_or_default().to_string();
    assert!(rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit()), "not a commit: {locked}");
    let out = run(Command::new("git")
        .args(["cat-file", "-e", &format!("{rev}^{{commit}}")])
        .current_dir(repo_root()));
    assert!(out.status.success(), "{rev} is no commit of {}: {}", repo_root(), text(&out.stderr));
    // And by default the flake is this repository's checkout, which has lib.agentSystem.
    assert_eq!(locked["url"], format!("file://{}", repo_root()), "{locked}");
    let flake = std::fs::read_to_string(d.dir.join("meta/flake.nix")).unwrap();
    assert!(flake.contains(&format!("hive.url = \"git+file:{}\";", repo_root())), "{flake}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_meta_flake_builds_each_agent_with_this_repositorys_agent_system() {
    assert!(help_flags(&serve_help()).contains("--hive-flake"), "hive serve --help lists --hive-flake");
    let flake_ref = format!("git+file:{}", repo_root());
    let d = crate::harness::Daemon::start_with(&["--hive-flake", &flake_ref]);
    let repo = crate::agents::config_repo(&d.dir);
    let api = d.client();
    let agent = crate::agents::agent("alpha", &repo, "Up");
    assert_eq!(api.post("/apis/hive.dev/v1/agents", &agent).await.code, 201);
    let job = serde_json::json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {},
                                 "spec": {"template": "Spawn", "agents": ["alpha"], "source": "Cli"}});
    let reply = api.post("/apis/hive.dev/v1/jobs", &job).await;
    assert_eq!(reply.code, 201, "{}", reply.body);
    let job = crate::agents::wait_terminal(&api, reply.body["metadata"]["name"].as_str().unwrap()).await;
    assert_eq!(job["status"]["phase"], "Done", "{}", job["status"]);
    let meta = d.dir.join("meta/flake.nix");
    let rendered = std::fs::read_to_string(&meta).unwrap();
    assert!(
        rendered.contains(&format!("hive.url = \"{flake_ref}\";")),
        "--hive-flake reaches flake.nix:\n{rendered}"
    );

    let Some(out) = nix_instantiate(&[
        "--eval",
        "--strict",
        "--json",
        "--readonly-mode",
        "check-flake.nix",
        "--arg",
        "meta",
        meta.to_str().unwrap(),
        "--arg",
        "agents",
        "[ \"alpha\" ]",
    ]) else {
        return;
    };
    assert!(out.status.success(), "nix-instantiate --eval deploy/check-flake.nix:\n{}", text(&out.stderr));
    let all: Value = serde_json::from_slice(&out.stdout).expect("check-flake.nix yields JSON");
    assert_eq!(all["hasAgentSystem"], true, "{all}");
    assert_eq!(all["metaHiveUrl"], flake_ref.as_str());
    let alpha = &all["meta"]["alpha"];
    assert_eq!(alpha["type"], "nixosSystem", "{all}");
    assert_eq!(alpha["toplevel"], "derivation", "config.system.build.toplevel: {alpha}");
    assert_eq!(alpha["isContainer"], true);
    assert_eq!(alpha["hostName"], "h-alpha");
    assert_eq!(alpha["fence"], "/var/lib/hive/fence", "the runtime's fence path");
    assert_eq!(
        alpha["harness"], "/run/current-system/sw/bin/agent",
        "the agent flake's module applies: {alpha}"
    );
    let bare = &all["direct"];
    assert_eq!(
        bare["harness"],
        "/nix/store/00000000000000000000000000000000-bash/bin/sh /srv/agents/bare/run.sh"
    );
}
