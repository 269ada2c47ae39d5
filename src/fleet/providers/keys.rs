//! Where a Provider may take its Vast.ai API key from on this host: only what the
//! operator allowed when starting `hive serve`, never what an API admin names.
//!
//! - `--provider-key-dir DIR`: `spec.vastai.apiKeyFile` names a file inside DIR, by its
//!   path relative to DIR (or, for manifests written before, an absolute path inside
//!   it). No `..`, and symbolic links are followed only while they stay inside DIR (a
//!   Kubernetes secret volume's `..data` links do). Without the flag no key file is read.
//! - `--provider-key-env NAME` (repeatable): `spec.vastai.apiKeyEnv` must be one of them.
//!   `--provider vastai` allows `VASTAI_API_KEY`, the built-in provider's variable.
//! - A key read from the host is sent only to the public API or to a base URL named by
//!   `--provider-base-url` (or `--vastai-base-url`): otherwise an admin could point
//!   `baseUrl` at a listener of their own and collect it. A key given at runtime
//!   (ConfigureProvider) is the admin's own and may go to any base URL.
//!
//! [`KeySources::admit`] is the admission check (a 422 naming the field and what the
//! operator must pass); [`KeySources::key`] applies the same rules again when a key is
//! read — a Provider stored before the flags changed is refused the same way — and
//! reads a file boundedly. What the API shows of a key file that cannot be used is one
//! message, whatever is wrong with it (missing, unreadable, a directory or a pipe, empty,
//! too large, more than one line): which it is goes to the daemon's log only, so the
//! answer is no oracle for what exists on the host.

use std::collections::{BTreeSet, VecDeque};
use std::ffi::OsString;
use std::io::Read as _;
use std::path::{Component, Path, PathBuf};

use hive_api::provider::VastaiProvider;
use hive_api::validation::{is_env_name, Reason, ValidationError};

use super::vastai::{ApiKey, DEFAULT_BASE_URL};

/// A key file larger than this is not a key (Vast.ai's are 64 characters).
pub const MAX_KEY_FILE: u64 = 4096;

/// How many symbolic links one key file's path may pass through (as the kernel's own
/// limit, against a loop).
const MAX_LINKS: usize = 40;

/// The environment variable of the built-in `vastai` Provider's key.
pub const BUILTIN_KEY_ENV: &str = "VASTAI_API_KEY";

/// What the operator allowed Providers to read on this host, from `hive serve`'s flags.
#[derive(Clone, Debug, Default)]
pub struct KeySources {
    /// `--provider-key-dir`, if given.
    dir: Option<KeyDir>,
    /// `--provider-key-env`.
    env: BTreeSet<String>,
    /// Base URLs besides the public API a key read from the host may be sent to
    /// (without a trailing `/`).
    base_urls: BTreeSet<String>,
}

/// Nothing allowed: what admission uses where no fleet runs.
pub static NONE: KeySources = KeySources::none();

/// The key directory as the operator named it and with its links resolved.
#[derive(Clone, Debug)]
struct KeyDir {
    given: PathBuf,
    real: PathBuf,
}

/// Why a key file is not read; the text is what the API shows.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    NoDir,
    DotDot,
    Outside,
    LinkEscapes,
    Malformed,
}

fn trimmed(url: &str) -> String {
    url.trim_end_matches('/').to_string()
}

impl KeySources {
    /// No key file, no variable, no base URL besides the public API.
    pub const fn none() -> KeySources {
        KeySources { dir: None, env: BTreeSet::new(), base_urls: BTreeSet::new() }
    }

    /// The sources `hive serve` allows: `dir` (must be an existing directory), the
    /// variables `env`, the base URLs `base_urls` (http or https); an error names the
    /// flag at fault.
    pub fn new(dir: Option<&Path>, env: &[String], base_urls: &[String]) -> Result<KeySources, String> {
        let dir = match dir {
            None => None,
            Some(given) => {
                let real = std::fs::canonicalize(given)
                    .map_err(|e| format!("--provider-key-dir {}: {e}", given.display()))?;
                if !real.is_dir() {
                    return Err(format!("--provider-key-dir {}: not a directory", given.display()));
                }
                Some(KeyDir { given: given.to_path_buf(), real })
            }
        };
        for name in env {
            if !is_env_name(name) {
                return Err(format!("--provider-key-env {name:?}: not an environment variable name"));
            }
        }
        let mut urls = BTreeSet::new();
        for url in base_urls {
            let scheme_ok = ["https://", "http://"]
                .iter()
                .any(|s| url.strip_prefix(s).is_some_and(|rest| !rest.is_empty()));
            if !scheme_ok || url.contains(|c: char| c.is_whitespace() || c.is_control()) {
                return Err(format!("--provider-base-url {url:?}: must be an http or https URL"));
            }
            urls.insert(trimmed(url));
        }
        Ok(KeySources { dir, env: env.iter().cloned().collect(), base_urls: urls })
    }

    /// Also allows the variable `name` (the built-in provider's).
    pub fn allow_env(&mut self, name: &str) {
        self.env.insert(name.to_string());
    }

    /// Whether a key read from the host may be sent to `base`.
    fn base_allowed(&self, base: &str) -> bool {
        trimmed(base) == trimmed(DEFAULT_BASE_URL) || self.base_urls.contains(&trimmed(base))
    }

    /// Whether `apiKeyEnv: name` is allowed.
    pub fn env_allowed(&self, name: &str) -> bool {
        self.env.contains(name)
    }

    /// The admission check of a Provider's Vast.ai settings: one error per field that
    /// names a source (or, with a host source, a base URL) the operator did not allow,
    /// saying what the operator must pass. Empty when everything is allowed.
    pub fn admit(&self, settings: &VastaiProvider) -> Vec<ValidationError> {
        let mut errors = Vec::new();
        let from_host = settings.api_key_file.is_some() || settings.api_key_env.is_some();
        if let Some(file) = &settings.api_key_file {
            if let Err(why) = self.resolve(file) {
                errors.push(ValidationError::new(
                    "spec.vastai.apiKeyFile",
                    Reason::Forbidden,
                    format!("{file:?}: {}", self.explain(&why)),
                ));
            }
        }
        if let Some(name) = &settings.api_key_env {
            if !self.env_allowed(name) {
                let allowed = if self.env.is_empty() {
                    "none is allowed".to_string()
                } else {
                    format!("allowed: {}", self.env.iter().cloned().collect::<Vec<_>>().join(", "))
                };
                errors.push(ValidationError::new(
                    "spec.vastai.apiKeyEnv",
                    Reason::Forbidden,
                    format!(
                        "{name:?}: not a variable this daemon lets providers read ({allowed}): the \
                         operator must start hive serve with --provider-key-env {name}"
                    ),
                ));
            }
        }
        // Where an allowed source's key may go (a refused source is the one error).
        let base = settings.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL);
        if from_host && errors.is_empty() && !self.base_allowed(base) {
            errors.push(ValidationError::new(
                "spec.vastai.baseUrl",
                Reason::Forbidden,
                format!(
                    "{base:?}: a key this daemon reads from its host (apiKeyFile, apiKeyEnv) is sent only to \
                     {DEFAULT_BASE_URL} or a base URL the operator allowed: the operator must start hive \
                     serve with --provider-base-url {base} (or give the key at runtime: hive fleet configure)"
                ),
            ));
        }
        errors
    }

    /// The key `settings` name, read now: `Ok(None)` when they name no source (the
    /// provider is `Unconfigured`); an error, for the Provider's status, when the source
    /// is not allowed or cannot be used. The error never holds the key, nor (for a file)
    /// what is wrong with it: that is logged, under `provider`.
    pub fn key(&self, provider: &str, settings: &VastaiProvider) -> Result<Option<ApiKey>, String> {
        if settings.api_key_file.is_none() && settings.api_key_env.is_none() {
            return Ok(None);
        }
        if let Some(refused) = self.admit(settings).first() {
            return Err(format!("{refused}; nothing was read"));
        }
        if let Some(file) = &settings.api_key_file {
            let path = self.resolve(file).map_err(|why| self.explain(&why))?;
            return match read_key_file(&path) {
                Ok(key) => Ok(Some(key)),
                Err(why) => {
                    tracing::warn!(provider, path = %path.display(), reason = %why, "the Vast.ai API key file is not usable");
                    // The same words whatever is wrong, and not even the name: no oracle.
                    Err("the key file named by spec.vastai.apiKeyFile is not usable; the daemon's log says why"
                        .to_string())
                }
            };
        }
        let name = settings.api_key_env.as_deref().unwrap_or_default();
        let why = match crate::host::env::var(name) {
            None => "it is not set (or not UTF-8)".to_string(),
            Some(text) => match ApiKey::new(text) {
                Ok(key) => return Ok(Some(key)),
                Err(why) => why,
            },
        };
        tracing::warn!(provider, variable = name, reason = %why, "the Vast.ai API key variable is not usable");
        Err(format!(
            "the environment variable {name} (spec.vastai.apiKeyEnv) is not usable; the daemon's log says why"
        ))
    }

    fn explain(&self, why: &Refused) -> String {
        let dir = self.dir.as_ref().map(|d| d.given.display().to_string()).unwrap_or_default();
        match why {
            Refused::NoDir => "this daemon reads no key files: the operator must start hive serve with \
                               --provider-key-dir DIR and put the file inside DIR (or give the key at \
                               runtime: hive fleet configure)"
                .into(),
            Refused::DotDot => format!(
                "must not contain '..': name a file inside the provider key directory by its path \
                 relative to it (--provider-key-dir {dir})"
            ),
            Refused::Outside => format!(
                "not inside the provider key directory: name a file by its path relative to \
                 --provider-key-dir {dir}, where the operator must put it"
            ),
            Refused::LinkEscapes => format!(
                "a symbolic link leads out of the provider key directory: the operator must put the file \
                 itself inside --provider-key-dir {dir}"
            ),
            Refused::Malformed => {
                "must be a file name or a relative path without empty or control characters".into()
            }
        }
    }

    /// The file `file` names, inside the key directory with every link resolved, or why
    /// it may not be read. Looks at nothing outside the directory.
    fn resolve(&self, file: &str) -> Result<PathBuf, Refused> {
        let dir = self.dir.as_ref().ok_or(Refused::NoDir)?;
        if file.is_empty() || file.chars().any(char::is_control) {
            return Err(Refused::Malformed);
        }
        let path = Path::new(file);
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(Refused::DotDot);
        }
        let relative = if path.is_absolute() {
            path.strip_prefix(&dir.given)
                .or_else(|_| path.strip_prefix(&dir.real))
                .map_err(|_| Refused::Outside)?
                .to_path_buf()
        } else {
            path.to_path_buf()
        };
        let parts: VecDeque<OsString> = relative
            .components()
            .filter_map(|c| match c {
                Component::Normal(part) => Some(part.to_os_string()),
                _ => None,
            })
            .collect();
        if parts.is_empty() {
            return Err(Refused::Malformed);
        }
        resolve_inside(dir, parts)
    }
}

/// Walks `parts` from the key directory (its resolved path, `root`) as the kernel would, following each
/// symbolic link met on the way, and refuses as soon as the walk would leave `root` —
/// by a link to an absolute path elsewhere or by `..` in a link — without looking at the
/// link's target outside. A part that does not exist ends the walk; the rest is joined as
/// it is (it may be created later, and is walked again when read).
fn resolve_inside(dir: &KeyDir, mut parts: VecDeque<OsString>) -> Result<PathBuf, Refused> {
    let root = dir.real.as_path();
    let mut resolved = root.to_path_buf();
    let mut links = 0;
    while let Some(part) = parts.pop_front() {
        if part == "." {
            continue;
        }
        if part == ".." {
            // Only a link's target brings `..`: it may climb back up, never above root.
            if resolved == root {
                return Err(Refused::LinkEscapes);
            }
            resolved.pop();
            continue;
        }
        let next = resolved.join(&part);
        match std::fs::symlink_metadata(&next) {
            Ok(meta) if meta.file_type().is_symlink() => {
                links += 1;
                let target = std::fs::read_link(&next).map_err(|_| Refused::LinkEscapes)?;
                if links > MAX_LINKS {
                    return Err(Refused::LinkEscapes);
                }
                let rest = if target.is_absolute() {
                    // Inside root, or refused without a look at where it points.
                    // (The directory as named is the same place as its resolved path.)
                    let inside = [root, dir.given.as_path()]
                        .into_iter()
                        .filter(|prefix| prefix.is_absolute())
                        .find_map(|prefix| target.strip_prefix(prefix).ok())
                        .ok_or(Refused::LinkEscapes)?;
                    resolved = root.to_path_buf();
                    inside.to_path_buf()
                } else {
                    target
                };
                for component in rest.components().rev() {
                    match component {
                        Component::Normal(p) => parts.push_front(p.to_os_string()),
                        Component::ParentDir => parts.push_front("..".into()),
                        Component::CurDir => {}
                        Component::RootDir | Component::Prefix(_) => return Err(Refused::LinkEscapes),
                    }
                }
            }
            Ok(_) => resolved = next,
            Err(_) => {
                // Missing (or under a file): the rest cannot be links yet.
                resolved = next;
                for rest in parts.drain(..) {
                    if rest == ".." {
                        if resolved == root {
                            return Err(Refused::LinkEscapes);
                        }
                        resolved.pop();
                    } else if rest != "." {
                        resolved.push(rest);
                    }
                }
            }
        }
    }
    Ok(resolved)
}

/// Reads the key at `path` (already resolved inside the key directory): a regular file
/// of at most [`MAX_KEY_FILE`] bytes holding one line. Opened without following a link
/// (one put there since it was resolved is refused) and without blocking (a named pipe
/// is refused, not waited on). The error says what is wrong, for the log.
fn read_key_file(path: &Path) -> Result<ApiKey, String> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(|e| match e {
        rustix::io::Errno::NOENT => "no such file".to_string(),
        rustix::io::Errno::ACCESS | rustix::io::Errno::PERM => "permission denied".to_string(),
        rustix::io::Errno::LOOP => "a symbolic link appeared since the path was checked".to_string(),
        rustix::io::Errno::NOTDIR => "no such file (a part of its path is not a directory)".to_string(),
        other => format!("cannot be opened: {other}"),
    })?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|e| format!("cannot be read: {e}"))?;
    if !meta.is_file() {
        let what = if meta.is_dir() { "a directory" } else { "a device, socket or named pipe" };
        return Err(format!("not a regular file ({what})"));
    }
    if meta.len() > MAX_KEY_FILE {
        return Err(format!("larger than {MAX_KEY_FILE} bytes ({} bytes)", meta.len()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_KEY_FILE + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot be read: {e}"))?;
    if bytes.len() as u64 > MAX_KEY_FILE {
        return Err(format!("larger than {MAX_KEY_FILE} bytes"));
    }
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())?;
    let key = text.trim();
    if key.is_empty() {
        return Err("the file is empty".into());
    }
    if key.contains(['\n', '\r']) {
        return Err("it holds more than one line".into());
    }
    ApiKey::new(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(dir: &Path) -> KeySources {
        KeySources::new(Some(dir), &["VAST_KEY".into()], &["http://127.0.0.1:9/api/v0/".into()]).unwrap()
    }

    fn settings(file: Option<&str>, env: Option<&str>, base: Option<&str>) -> VastaiProvider {
        VastaiProvider {
            api_key_file: file.map(str::to_string),
            api_key_env: env.map(str::to_string),
            base_url: base.map(str::to_string),
            ..Default::default()
        }
    }

    fn fields(errors: Vec<ValidationError>) -> Vec<String> {
        errors.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn files_inside_the_dir_and_listed_variables_only() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(dir.join("key"), "k-0123").unwrap();
        std::fs::create_dir_all(dir.join("..2026/sub")).unwrap();
        std::fs::write(dir.join("..2026/sub/key"), "k-0123").unwrap();
        std::os::unix::fs::symlink("..2026", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/sub/key", dir.join("linked")).unwrap();
        std::os::unix::fs::symlink(dir.join("key"), dir.join("absolute-inside")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.join("out-dir")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("etc")).unwrap();
        std::os::unix::fs::symlink("../../etc/passwd", dir.join("climb")).unwrap();
        std::os::unix::fs::symlink("..data/../../x", dir.join("climb-late")).unwrap();
        std::os::unix::fs::symlink("loop", dir.join("loop")).unwrap();
        std::os::unix::fs::symlink("/nonexistent/x", dir.join("dangling-out")).unwrap();
        let keys = sources(dir);
        let given = dir.display().to_string();
        let file = |f: &str| fields(keys.admit(&settings(Some(f), None, None)));
        for ok in [
            "key",
            "linked",
            "absolute-inside",
            "not-yet-written",
            "sub/dir/k",
            &format!("{given}/key"),
            "./key",
            "..data/sub/key",
        ] {
            assert_eq!(file(ok), Vec::<String>::new(), "{ok}");
        }
        for refused in [
            "/etc/hostname",
            "../x",
            "a/../../x",
            "out-dir/key",
            "etc",
            "climb",
            "climb-late",
            "loop",
            "dangling-out",
            "",
            "a\nb",
        ] {
            assert_eq!(file(refused), ["spec.vastai.apiKeyFile"], "{refused:?}");
        }
        assert_eq!(keys.resolve("linked").unwrap(), dir.canonicalize().unwrap().join("..2026/sub/key"));

        let env = |n: &str| fields(keys.admit(&settings(None, Some(n), None)));
        assert!(env("VAST_KEY").is_empty());
        assert_eq!(env("HOME"), ["spec.vastai.apiKeyEnv"]);

        // A host key goes to the public API or an allowed base URL only; a runtime key
        // (no source named) anywhere.
        let base = |b: &str| fields(keys.admit(&settings(Some("key"), None, Some(b))));
        assert!(base("https://console.vast.ai/api/v0/").is_empty());
        assert!(base("http://127.0.0.1:9/api/v0").is_empty());
        assert_eq!(base("http://127.0.0.1:9/api/v0/x"), ["spec.vastai.baseUrl"]);
        assert_eq!(base("https://console.vast.ai.example.com/api/v0"), ["spec.vastai.baseUrl"]);
        assert!(fields(keys.admit(&settings(None, None, Some("http://anywhere/api/v0")))).is_empty());

        // With nothing allowed, nothing is.
        let none = KeySources::default();
        assert_eq!(fields(none.admit(&settings(Some("key"), None, None))), ["spec.vastai.apiKeyFile"]);
        let message = none.admit(&settings(None, Some("HOME"), None)).remove(0).message;
        assert!(
            message.contains("--provider-key-env HOME") && message.contains("none is allowed"),
            "{message}"
        );
    }

    #[test]
    fn a_key_file_that_cannot_be_used_gives_one_message() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        std::fs::write(dir.join("good"), "  good-key-0123\n").unwrap();
        std::fs::write(dir.join("empty"), "\n").unwrap();
        std::fs::write(dir.join("two"), "a-0123\nb-4567\n").unwrap();
        std::fs::write(dir.join("big"), "a".repeat(MAX_KEY_FILE as usize + 1)).unwrap();
        std::fs::create_dir(dir.join("subdir")).unwrap();
        let keys = sources(dir);
        let key = keys.key("p", &settings(Some("good"), None, None)).unwrap().unwrap();
        assert_eq!(format!("{key:?}"), "ApiKey([redacted])");
        let mut messages = BTreeSet::new();
        for bad in ["missing", "empty", "two", "big", "subdir"] {
            let err = keys.key("p", &settings(Some(bad), None, None)).unwrap_err();
            messages.insert(err.replace(bad, "NAME"));
        }
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(messages.first().unwrap().contains("is not usable"));
        let reasons: Vec<String> = ["missing", "empty", "two", "big", "subdir"]
            .iter()
            .map(|f| read_key_file(&dir.join(f)).unwrap_err())
            .collect();
        assert_eq!(
            reasons,
            [
                "no such file",
                "the file is empty",
                "it holds more than one line",
                "larger than 4096 bytes (4097 bytes)",
                "not a regular file (a directory)"
            ]
        );
        // Not allowed: refused before anything is read.
        let err = keys.key("p", &settings(Some("/etc/hostname"), None, None)).unwrap_err();
        assert!(err.contains("--provider-key-dir") && err.contains("nothing was read"), "{err}");
        assert_eq!(keys.key("p", &settings(None, None, None)).unwrap().map(|_| ()), None);
    }

    #[test]
    fn flags_are_checked_at_start() {
        let temp = tempfile::tempdir().unwrap();
        let file = temp.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(KeySources::new(Some(&temp.path().join("missing")), &[], &[])
            .unwrap_err()
            .contains("--provider-key-dir"));
        assert!(KeySources::new(Some(&file), &[], &[]).unwrap_err().contains("not a directory"));
        assert!(KeySources::new(None, &["1X".into()], &[]).unwrap_err().contains("--provider-key-env"));
        assert!(KeySources::new(None, &[], &["ftp://x".into()]).unwrap_err().contains("--provider-base-url"));
    }
}
