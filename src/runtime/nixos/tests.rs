//! Tests of the `nixos-container` runtime against recording stand-ins of `nix`,
//! `nixos-container` and `systemctl`: `#!/bin/sh` scripts in a temp `bin/` (put on the
//! driver's PATH through [`NixosConfig::path`]) that append their argv to a record file,
//! refuse (exit 64) any argument list outside the contract, keep each unit's state in a
//! file so start / stop / is-active behave, and fail a given call when a knob file says
//! so (`state/fail-<call>` holds how many of the next such calls fail).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hive_api::agent::{Agent, NixosContainerRuntime, Power, RuntimeType};
use tempfile::TempDir;
use tokio::sync::broadcast;

use super::{container_name, NixosConfig, NixosRuntime, KICK_SCRIPT};
use crate::runtime::{Change, Drain, Error, Exit, Fallback, Generation, Kick, Limits, Runtime, RuntimeEvent};

/// What every stand-in starts with: the world's paths and the shared shell functions.
const PRELUDE: &str = r#"#!/bin/sh
STATE='@TMP@/state'
CONF='@TMP@/conf'
ROOTS='@TMP@/roots'
PROFILES='@TMP@/profiles'
META='@TMP@/meta'
SYSTEMD='@TMP@/systemd'
prog=$(basename "$0")
# The kick script (many lines) is recorded by name, and only when it is the driver's.
kick=$(cat "$STATE/kick-script")
{ printf '%s' "$prog"; for a in "$@"; do [ "$a" = "$kick" ] && a='<KICK_SCRIPT>'; printf '\037%s' "$a"; done
  printf '\n'; } >> "$STATE/record"
refuse() { echo "$prog stand-in: unexpected arguments: $*" >&2; exit 64; }
# True (consuming one) when state/fail-$1 asks this call to fail.
fail_now() {
  f="$STATE/fail-$1"
  [ -f "$f" ] || return 1
  n=$(cat "$f")
  [ "$n" -gt 0 ] 2>/dev/null || return 1
  echo $((n - 1)) > "$f"
}
container_ok() { case "$1" in h-?*) [ ${#1} -le 11 ] ;; *) return 1 ;; esac; }
state() { cat "$STATE/unit-$1" 2>/dev/null || echo inactive; }
next_build() {
  n=$(cat "$STATE/builds" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$STATE/builds"; echo $n
}
"#;

const NIX: &str = r#"
[ "$#" -eq 4 ] && [ "$1" = build ] && [ "$3" = --no-link ] && [ "$4" = --print-out-paths ] || refuse "$@"
case "$2" in "$META#nixosConfigurations."?*".config.system.build.toplevel") ;; *) refuse "$@" ;; esac
name=${2#"$META#nixosConfigurations."}
name=${name%.config.system.build.toplevel}
echo "evaluating derivation '$2'" >&2
if fail_now build; then echo "error: attribute 'nixosConfigurations.$name' is broken" >&2; exit 1; fi
echo "building '/nix/store/d-nixos-system-h-$name.drv'..." >&2
printf '/nix/store/%032d-nixos-system-h-%s\n' "$(next_build)" "$name"
"#;

const NIXOS_CONTAINER: &str = r#"
install_profile() {
  n=$(next_build)
  mkdir -p "$PROFILES/$1"
  ln -sfn "$(printf '/nix/store/%032d-nixos-system-%s' "$n" "$1")" "$PROFILES/$1/system-$n-link"
  ln -sfn "system-$n-link" "$PROFILES/$1/system"
}
flake_ok() { container_ok "$1" && [ "$2" = "$META#${1#h-}" ]; }
case "$1" in
create)
  [ "$#" -eq 4 ] && [ "$3" = --flake ] && flake_ok "$2" "$4" || refuse "$@"
  [ -e "$CONF/$2.conf" ] && { echo "nixos-container: container '$2' already exists" >&2; exit 1; }
  echo "building the system configuration..." >&2
  if fail_now create; then echo "error: builder for '/nix/store/d-nixos-system-$2.drv' failed" >&2; exit 1; fi
  mkdir -p "$CONF" "$ROOTS/$2"
  printf 'PRIVATE_NETWORK=1\nHOST_ADDRESS=10.233.0.1\nEXTRA_NSPAWN_FLAGS=""\nAUTO_START=0\n' > "$CONF/$2.conf"
  install_profile "$2"
  echo "host IP is 10.233.0.1, local IP is 10.233.0.2" ;;
update)
  [ "$#" -eq 4 ] && [ "$3" = --flake ] && flake_ok "$2" "$4" || refuse "$@"
  [ -e "$CONF/$2.conf" ] || { echo "nixos-container: container '$2' does not exist" >&2; exit 1; }
  [ "$(state "$2")" = active ] && { echo "stand-in: update of a running container reloads it" >&2; exit 65; }
  if fail_now update; then echo "error: update failed" >&2; exit 1; fi
  install_profile "$2" ;;
destroy)
  [ "$#" -eq 2 ] && container_ok "$2" || refuse "$@"
  [ -e "$CONF/$2.conf" ] || { echo "nixos-container: container '$2' does not exist" >&2; exit 1; }
  rm -rf "$CONF/$2.conf" "$ROOTS/$2" "$PROFILES/$2" ;;
run)
  # Only the kick, exactly the driver's script; run here "inside the container", where
  # `systemctl show` answers the pid in state/harness-pid (a real test process).
  [ "$#" -eq 8 ] && container_ok "$2" && [ "$3" = -- ] && [ "$4" = sh ] && [ "$5" = -c ] \
    && [ "$6" = "$kick" ] && [ "$7" = hive-kick ] && [ "$8" = hive-harness.service ] || refuse "$@"
  [ "$(state "$2")" = active ] || { echo "nixos-container: container '$2' is not running" >&2; exit 1; }
  if fail_now run; then echo "unable to get container's main PID" >&2; exit 1; fi
  shift 3; exec "$@" ;;
*) refuse "$@" ;;
esac
"#;

/// `nix-env --profile <profiles>/<c>/system --set <toplevel>`: the next profile
/// generation, pointing at the store path given (a stopped, created container only).
const NIX_ENV: &str = r#"
[ "$#" -eq 4 ] && [ "$1" = --profile ] && [ "$3" = --set ] || refuse "$@"
case "$2" in "$PROFILES/"h-?*"/system") ;; *) refuse "$@" ;; esac
case "$4" in /nix/store/?*) ;; *) refuse "$@" ;; esac
c=${2#"$PROFILES/"}; c=${c%/system}
container_ok "$c" || refuse "$@"
[ -e "$CONF/$c.conf" ] || { echo "stand-in: container '$c' does not exist" >&2; exit 1; }
[ "$(state "$c")" = active ] && { echo "stand-in: profile switch of a running container" >&2; exit 65; }
if fail_now update; then echo "error: cannot set profile" >&2; exit 1; fi
n=$(ls "$PROFILES/$c" | grep -c '^system-[0-9]*-link$'); n=$((n + 1))
ln -sfn "$4" "$PROFILES/$c/system-$n-link"
ln -sfn "system-$n-link" "$PROFILES/$c/system"
"#;

const SYSTEMCTL: &str = r#"
[ "$TZ" = UTC ] && [ "$LC_ALL" = C ] || { echo "stand-in: systemctl needs TZ=UTC LC_ALL=C" >&2; exit 64; }
unit() {
  case "$1" in container@*) c=${1#container@}; container_ok "$c" || refuse "$@" ;; *) refuse "$@" ;; esac
}
if [ "$#" -eq 1 ] && [ "$1" = daemon-reload ]; then exit 0; fi
if [ "$#" -eq 4 ] && [ "$1 $2 $3 $4" = "show --property=MainPID --value hive-harness.service" ]; then
  cat "$STATE/harness-pid" 2>/dev/null || echo 0; exit 0
fi
if [ "$#" -eq 3 ] && [ "$1" = is-active ] && [ "$2" = --quiet ]; then
  unit "$3"; [ "$(state "$c")" = active ] && exit 0; exit 3
fi
if [ "$#" -eq 2 ] && [ "$1" = start ]; then
  unit "$2"
  if fail_now start; then
    echo failed > "$STATE/unit-$c"
    echo "Job for container@$c.service failed because the control process exited with error code." >&2
    exit 1
  fi
  echo active > "$STATE/unit-$c"; exit 0
fi
if [ "$#" -eq 2 ] && [ "$1" = stop ]; then
  unit "$2"
  if fail_now stop; then echo "Failed to stop container@$c.service: Access denied" >&2; exit 1; fi
  echo inactive > "$STATE/unit-$c"; exit 0
fi
if [ "$#" -eq 3 ] && [ "$1" = kill ] && [ "$2" = --signal=KILL ]; then
  unit "$3"; [ "$(state "$c")" = active ] && echo failed > "$STATE/unit-$c"; exit 0
fi
if [ "$#" -eq 4 ] && [ "$1" = show ] && [ "$2" = --property=MainPID ] && [ "$3" = --value ]; then
  unit "$4"; if [ "$(state "$c")" = active ]; then echo 4242; else echo 0; fi; exit 0
fi
if [ "$#" -eq 3 ] && [ "$1" = show ] && [ "$2" = --property=CPUQuotaPerSecUSec,MemoryMax ]; then
  # What systemd makes of the drop-in, in its own units; state/limits-ignored plays a host
  # whose unit does not take it.
  unit "$3"; d="$SYSTEMD/container@$c.service.d/hive-limits.conf"
  if [ -f "$STATE/limits-ignored" ] || [ ! -f "$d" ]; then
    echo "CPUQuotaPerSecUSec=infinity"; echo "MemoryMax=infinity"; exit 0
  fi
  pct=$(sed -n 's/^CPUQuota=\([0-9]*\)%$/\1/p' "$d"); us=$((pct * 10000))
  if [ $((us % 1000000)) -eq 0 ]; then echo "CPUQuotaPerSecUSec=$((us / 1000000))s"
  elif [ "$us" -ge 1000000 ]; then printf 'CPUQuotaPerSecUSec=%d.%06ds\n' $((us / 1000000)) $((us % 1000000))
  else echo "CPUQuotaPerSecUSec=$((us / 1000))ms"; fi
  m=$(sed -n 's/^MemoryMax=//p' "$d")
  case "$m" in *K) b=$(( ${m%K} * 1024 )) ;; *M) b=$(( ${m%M} * 1048576 )) ;; *G) b=$(( ${m%G} * 1073741824 )) ;;
    *T) b=$(( ${m%T} * 1099511627776 )) ;; *) b=$m ;; esac
  echo "MemoryMax=$b"; exit 0
fi
if [ "$#" -eq 3 ] && [ "$1" = show ] && [ "$2" = --property=ActiveState,MainPID,ActiveEnterTimestamp ]; then
  unit "$3"; s=$(state "$c")
  echo "ActiveState=$s"
  if [ "$s" = active ]; then
    echo "MainPID=4242"; echo "ActiveEnterTimestamp=Sun 2026-11-29 17:55:28 UTC"
  else
    echo "MainPID=0"; echo "ActiveEnterTimestamp="
  fi
  exit 0
fi
refuse "$@"
"#;

/// Runs `body` with a deadline, so a hung command fails the test instead of CI.
async fn bounded<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(Duration::from_secs(60), body).await.expect("test took longer than 60 s");
}

/// The test world: the stand-ins, their state, and a runtime whose directories are all
/// under one temp dir.
struct World {
    tmp: TempDir,
    runtime: NixosRuntime,
}

impl World {
    fn new() -> World {
        World::with(|_| {})
    }

    fn with(tune: impl FnOnce(&mut NixosConfig)) -> World {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_str().unwrap().to_string();
        assert!(!root.contains(['\'', ' ']), "the temp dir must be a plain path: {root}");
        let bin = tmp.path().join("bin");
        for dir in ["bin", "state", "meta", "systemd", "conf", "roots", "profiles"] {
            std::fs::create_dir(tmp.path().join(dir)).unwrap();
        }
        std::fs::write(tmp.path().join("state/kick-script"), KICK_SCRIPT).unwrap();
        for (name, body) in [
            ("nix", NIX),
            ("nix-env", NIX_ENV),
            ("nixos-container", NIXOS_CONTAINER),
            ("systemctl", SYSTEMCTL),
        ] {
            let path = bin.join(name);
            std::fs::write(&path, PRELUDE.replace("@TMP@", &root) + body).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let mut config = NixosConfig::new(tmp.path().join("meta"));
        config.systemd_dir = tmp.path().join("systemd");
        config.containers_conf_dir = tmp.path().join("conf");
        config.containers_root = tmp.path().join("roots");
        config.profiles_dir = tmp.path().join("profiles");
        let path = crate::host::env::var_os("PATH").unwrap_or_default();
        config.path =
            Some(std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&path))).unwrap());
        config.graceful_stop = Duration::from_secs(5);
        // The rescan's own `systemctl show` calls would interleave with the recorded
        // sequences; the tests that need it ask for a short interval.
        config.rescan_interval = Duration::from_secs(3600);
        tune(&mut config);
        World { runtime: NixosRuntime::new(config), tmp }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// Agent `name` of the nixosContainer runtime, at the locked meta rev `cafe…`.
    fn agent(&self, name: &str) -> Agent {
        let mut agent = Agent::default();
        agent.metadata.name = name.into();
        agent.spec.config.repo = "https://example.com/agents.git".into();
        agent.spec.config.rev = Some("cafe0000cafe0000cafe0000cafe0000cafe0000".into());
        agent.spec.runtime.type_ = RuntimeType::NixosContainer;
        agent
    }

    fn fence_of(&self, container: &str) -> PathBuf {
        self.path("roots").join(container).join("var/lib/hive/fence")
    }

    fn set_unit(&self, container: &str, state: &str) {
        std::fs::write(self.path("state").join(format!("unit-{container}")), format!("{state}\n")).unwrap();
    }

    fn unit(&self, container: &str) -> String {
        let file = self.path("state").join(format!("unit-{container}"));
        std::fs::read_to_string(file).map(|s| s.trim().to_string()).unwrap_or_else(|_| "inactive".into())
    }

    /// Makes the next `count` calls `call` (`build`, `create`, `update`, `start`, `stop`) fail.
    fn fail(&self, call: &str, count: u32) {
        std::fs::write(self.path("state").join(format!("fail-{call}")), format!("{count}\n")).unwrap();
    }

    /// The command lines recorded since the last take, the temp dir shown as `<tmp>`.
    fn take(&self) -> Vec<String> {
        let record = self.path("state").join("record");
        let text = std::fs::read_to_string(&record).unwrap_or_default();
        std::fs::write(&record, "").unwrap();
        let root = self.tmp.path().to_str().unwrap();
        text.lines()
            .map(|line| {
                let args: Vec<String> = line.split('\x1f').map(|a| a.replace(root, "<tmp>")).collect();
                assert!(args.iter().all(|a| !a.contains(' ')), "an argument with a space: {args:?}");
                args.join(" ")
            })
            .collect()
    }

    /// Creates `agent`'s container through the runtime and forgets the commands.
    async fn created(&self, agent: &Agent) -> Generation {
        let generation = self.runtime.create(agent, &|_: &str| {}).await.unwrap();
        self.take();
        generation
    }
}

/// A build log that keeps its lines.
fn build_log() -> (Arc<Mutex<Vec<String>>>, impl Fn(&str) + Send + Sync) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    (lines, move |line: &str| sink.lock().unwrap().push(line.to_string()))
}

/// Every change published so far, as short words.
fn changes(events: &mut broadcast::Receiver<RuntimeEvent>) -> Vec<String> {
    let mut changes = Vec::new();
    while let Ok(event) = events.try_recv() {
        changes.push(match event.change {
            Change::Started { pid } => format!("{} started {pid}", event.agent),
            Change::Exited(exit) => format!("{} exited requested={}", event.agent, exit.requested),
            Change::Swapped(g) => format!("{} swapped {}", event.agent, g.id),
            Change::Destroyed => format!("{} destroyed", event.agent),
            change @ (Change::NodeLost { .. } | Change::NodeBack { .. }) => {
                format!("{} {change:?}", event.agent)
            }
        });
    }
    changes
}

/// The next exit of `agent` published on `events`, within 5 s.
async fn next_exit(events: &mut broadcast::Receiver<RuntimeEvent>, agent: &str) -> Exit {
    let wait = async {
        loop {
            let event = events.recv().await.unwrap();
            if let (Change::Exited(exit), true) = (event.change, event.agent == agent) {
                return exit;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), wait).await.expect("no exit event within 5 s")
}

fn store_path(n: u32, container: &str) -> String {
    format!("/nix/store/{n:032}-nixos-system-{container}")
}

const MAIN_PID: &str = "systemctl show --property=MainPID --value container@h-alpha";

const SHOW: &str = "systemctl show --property=ActiveState,MainPID,ActiveEnterTimestamp container@h-alpha";

const ATTR: &str = "<tmp>/meta#nixosConfigurations.alpha.config.system.build.toplevel";

#[tokio::test]
async fn rebuild_runs_prebuild_stop_for_update_swap_and_start_as_the_contract_says() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let agent = world.agent("alpha");
        world.created(&agent).await;
        rt.start(&agent).await.unwrap();
        world.take();
        let mut events = rt.subscribe();

        let (lines, log) = build_log();
        let generation = rt.prebuild(&agent, &log).await.unwrap();
        assert_eq!(generation.id, store_path(2, "h-alpha"));
        assert_eq!(generation.rev, "cafe0000cafe0000cafe0000cafe0000cafe0000");
        let logged = lines.lock().unwrap().clone();
        let root = world.tmp.path().to_str().unwrap();
        let logged: Vec<String> = logged.iter().map(|l| l.replace(root, "<tmp>")).collect();
        assert_eq!(
            logged,
            [
                format!("$ nix build {ATTR} --no-link --print-out-paths"),
                format!("evaluating derivation '{ATTR}'"),
                "building '/nix/store/d-nixos-system-h-alpha.drv'...".into(),
                store_path(2, "h-alpha"),
                format!("built {}", store_path(2, "h-alpha")),
            ]
        );
        assert_eq!(world.unit("h-alpha"), "active", "prebuild never touches the running container");

        rt.stop_for_update(&agent).await.unwrap();
        rt.stop_for_update(&agent).await.unwrap(); // a no-op when stopped
        rt.swap(&agent, &generation).await.unwrap();
        let started = rt.start(&agent).await.unwrap();
        assert_eq!(started.pid, 4242);
        assert!(started.recovered_from.is_none());
        assert_eq!(
            world.take(),
            [
                format!("nix build {ATTR} --no-link --print-out-paths"),
                "systemctl is-active --quiet container@h-alpha".into(),
                "systemctl stop container@h-alpha".into(),
                "systemctl is-active --quiet container@h-alpha".into(),
                "systemctl is-active --quiet container@h-alpha".into(),
                format!("nix-env --profile <tmp>/profiles/h-alpha/system --set {}", store_path(2, "h-alpha")),
                "systemctl is-active --quiet container@h-alpha".into(),
                "systemctl start container@h-alpha".into(),
                "systemctl show --property=MainPID --value container@h-alpha".into(),
            ]
        );
        assert_eq!(
            changes(&mut events),
            [
                "alpha exited requested=true".to_string(),
                format!("alpha swapped {}", store_path(2, "h-alpha")),
                "alpha started 4242".into(),
            ]
        );
        let observed = rt.observed(&agent).await.unwrap();
        assert_eq!((observed.power, observed.pid), (Power::Running, Some(4242)));
        assert_eq!(observed.generation, Some(generation));
        assert_eq!(observed.since.unwrap().to_rfc3339(), "2026-11-29T17:55:28+00:00");
        assert!(observed.last_exit.unwrap().requested);
        assert_eq!(
            world.take(),
            ["systemctl show --property=ActiveState,MainPID,ActiveEnterTimestamp container@h-alpha"]
        );
    })
    .await;
}

#[tokio::test]
async fn prebuild_builds_the_full_attr_path_never_the_bare_flake_ref() {
    bounded(async {
        let world = World::new();
        for name in ["alpha", "b", "abcdefghi", "a-1"] {
            let generation = world.runtime.prebuild(&world.agent(name), &|_: &str| {}).await.unwrap();
            assert!(generation.id.ends_with(&format!("-nixos-system-h-{name}")), "{generation:?}");
            let recorded = world.take();
            let attr = format!("<tmp>/meta#nixosConfigurations.{name}.config.system.build.toplevel");
            assert_eq!(recorded, [format!("nix build {attr} --no-link --print-out-paths")], "{name}");
            assert!(!recorded[0].contains(&format!("<tmp>/meta#{name} ")), "the bare ref: {recorded:?}");
        }
        let mut unlocked = world.agent("alpha");
        unlocked.spec.config.rev = None;
        assert_eq!(world.runtime.prebuild(&unlocked, &|_: &str| {}).await.unwrap().rev, "");
    })
    .await;
}

#[tokio::test]
async fn a_failed_prebuild_is_a_command_error_with_its_output_and_runs_nothing_else() {
    bounded(async {
        let world = World::new();
        let agent = world.agent("alpha");
        world.created(&agent).await;
        world.runtime.start(&agent).await.unwrap();
        world.take();
        world.fail("build", 1);
        let (lines, log) = build_log();
        let error = world.runtime.prebuild(&agent, &log).await.unwrap_err();
        match &error {
            Error::Command { agent, command, status, output, .. } => {
                assert_eq!(agent, "alpha");
                assert!(command.starts_with("nix build ") && command.contains("#nixosConfigurations.alpha."));
                assert_eq!(status, "exit status: 1");
                assert!(
                    output.ends_with("error: attribute 'nixosConfigurations.alpha' is broken"),
                    "{output}"
                );
            }
            other => panic!("unexpected error {other}"),
        }
        assert!(lines.lock().unwrap().iter().any(|l| l.contains("is broken")), "the failure reaches the log");
        assert_eq!(world.take().len(), 1, "nothing runs after a failed build");
        assert_eq!(world.unit("h-alpha"), "active");
    })
    .await;
}

/// What the executor's ApprovalDeploy does on the runtime when the new config does not
/// come up: note the previous generation, build, stop, swap, start (failing), stop, swap
/// back to the previous generation, start. Returns the previous generation's id.
async fn deploy_that_fails_to_start(world: &World, rt: &NixosRuntime, agent: &Agent) -> String {
    let previous = rt.observed(agent).await.unwrap().generation.expect("a previous generation is known");
    let generation = rt.prebuild(agent, &|_: &str| {}).await.unwrap();
    assert_ne!(generation.id, previous.id);
    rt.stop_for_update(agent).await.unwrap();
    rt.swap(agent, &generation).await.unwrap();
    assert_eq!(world.runtime.installed_toplevel("h-alpha"), Some(generation.id.clone()));
    world.fail("start", 2);
    rt.start(agent).await.unwrap_err();
    rt.stop(agent).await.unwrap();
    world.take();
    rt.swap(agent, &previous).await.unwrap();
    rt.start(agent).await.unwrap();
    previous.id
}

#[tokio::test]
async fn the_swap_back_after_a_failed_deploy_installs_the_previous_system_path() {
    bounded(async {
        let world = World::new();
        let agent = world.agent("alpha");
        world.created(&agent).await;
        world.runtime.start(&agent).await.unwrap();
        let previous = deploy_that_fails_to_start(&world, &world.runtime, &agent).await;
        assert_eq!(previous, store_path(1, "h-alpha"));
        let swap_back = world.take().into_iter().find(|l| !l.starts_with("systemctl")).unwrap();
        assert_eq!(swap_back, format!("nix-env --profile <tmp>/profiles/h-alpha/system --set {previous}"));
        assert_eq!(world.runtime.installed_toplevel("h-alpha"), Some(previous), "the old system runs again");
        assert_eq!(world.unit("h-alpha"), "active");
    })
    .await;
}

#[tokio::test]
async fn after_a_daemon_restart_the_previous_generation_is_read_from_the_profile() {
    bounded(async {
        let world = World::new();
        let agent = world.agent("alpha");
        world.created(&agent).await;
        world.runtime.start(&agent).await.unwrap();
        // A new daemon: a fresh runtime over the same host, knowing nothing in memory.
        let fresh = NixosRuntime::new(world.runtime.config().clone());
        let observed = fresh.observed(&agent).await.unwrap();
        assert_eq!(observed.generation.map(|g| g.id), Some(store_path(1, "h-alpha")));
        let previous = deploy_that_fails_to_start(&world, &fresh, &agent).await;
        assert_eq!(previous, store_path(1, "h-alpha"));
        assert_eq!(world.runtime.installed_toplevel("h-alpha"), Some(previous));
    })
    .await;
}

#[tokio::test]
async fn swap_refuses_while_the_container_runs() {
    bounded(async {
        let world = World::new();
        let agent = world.agent("alpha");
        world.created(&agent).await;
        world.set_unit("h-alpha", "active");
        let generation = Generation { id: store_path(9, "h-alpha"), rev: String::new() };
        let error = world.runtime.swap(&agent, &generation).await.unwrap_err();
        assert!(matches!(&error, Error::NotStopped { agent, pid: 4242 } if agent == "alpha"), "{error}");
        assert_eq!(
            world.take(),
            [
                "systemctl is-active --quiet container@h-alpha",
                "systemctl show --property=MainPID --value container@h-alpha",
            ]
        );
        assert_eq!(
            world.runtime.observed(&agent).await.unwrap().generation.map(|g| g.id),
            Some(store_path(1, "h-alpha"))
        );
    })
    .await;
}

#[tokio::test]
async fn first_spawn_creates_writes_the_dropin_and_the_flags_line_then_starts() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let mut events = rt.subscribe();
        let mut agent = world.agent("alpha");
        agent.spec.resources.cpu_quota = Some("150%".into());
        agent.spec.resources.memory_max = Some("2G".into());
        agent.spec.runtime.nixos_container = Some(NixosContainerRuntime {
            nspawn_flags: vec!["--bind=/srv/alpha:/srv".into(), "--setenv=GREETING=$HOME".into()],
        });

        let (lines, log) = build_log();
        let generation = rt.create(&agent, &log).await.unwrap();
        assert_eq!(generation.id, store_path(1, "h-alpha"), "named by the new profile's toplevel");
        assert_eq!(generation.rev, "cafe0000cafe0000cafe0000cafe0000cafe0000");
        assert!(lines.lock().unwrap().iter().any(|l| l == "building the system configuration..."));

        let limits = rt.write_limits(&agent).await.unwrap();
        let dropin = world.path("systemd/container@h-alpha.service.d/hive-limits.conf");
        assert_eq!(
            limits,
            Limits {
                cpu_quota: "150%".into(),
                memory_max: "2G".into(),
                enforced: true,
                message: format!("systemd drop-in {}", dropin.display()),
            }
        );
        assert_eq!(std::fs::read_to_string(&dropin).unwrap(), "[Service]\nCPUQuota=150%\nMemoryMax=2G\n");
        assert_eq!(
            std::fs::read_to_string(world.path("conf/h-alpha.conf")).unwrap(),
            "PRIVATE_NETWORK=1\nHOST_ADDRESS=10.233.0.1\n\
             EXTRA_NSPAWN_FLAGS=\"--bind=/srv/alpha:/srv --setenv=GREETING=\\$HOME\"\nAUTO_START=0\n"
        );
        let started = rt.start(&agent).await.unwrap();
        assert_eq!((started.pid, started.recovered_from.is_none()), (4242, true));
        assert_eq!(
            world.take(),
            [
                "nixos-container create h-alpha --flake <tmp>/meta#alpha",
                "systemctl daemon-reload",
                "systemctl show --property=CPUQuotaPerSecUSec,MemoryMax container@h-alpha",
                "systemctl is-active --quiet container@h-alpha",
                "systemctl start container@h-alpha",
                "systemctl show --property=MainPID --value container@h-alpha",
            ]
        );
        assert_eq!(
            changes(&mut events),
            [format!("alpha swapped {}", store_path(1, "h-alpha")), "alpha started 4242".into()]
        );

        // Without settings: the hive-wide defaults, and the flags line emptied.
        let plain = world.agent("alpha");
        let limits = rt.write_limits(&plain).await.unwrap();
        assert_eq!((limits.cpu_quota.as_str(), limits.memory_max.as_str()), ("200%", "4G"));
        assert_eq!(std::fs::read_to_string(&dropin).unwrap(), "[Service]\nCPUQuota=200%\nMemoryMax=4G\n");
        assert_eq!(
            std::fs::read_to_string(world.path("conf/h-alpha.conf")).unwrap(),
            "PRIVATE_NETWORK=1\nHOST_ADDRESS=10.233.0.1\nEXTRA_NSPAWN_FLAGS=\"\"\nAUTO_START=0\n"
        );
        assert_eq!(
            world.take(),
            [
                "systemctl daemon-reload",
                "systemctl show --property=CPUQuotaPerSecUSec,MemoryMax container@h-alpha"
            ]
        );
        // A unit that did not take the drop-in: written, but not reported enforced.
        std::fs::write(world.path("state/limits-ignored"), "").unwrap();
        let limits = rt.write_limits(&plain).await.unwrap();
        assert!(!limits.enforced, "{limits:?}");
        assert!(limits.message.contains("CPUQuotaPerSecUSec=infinity"), "{}", limits.message);
        std::fs::remove_file(world.path("state/limits-ignored")).unwrap();
        world.take();
        for dir in [dropin.parent().unwrap().to_path_buf(), world.path("conf")] {
            let names: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert!(names.iter().all(|n| !n.starts_with('.')), "no temp file is left: {names:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_failed_create_leaves_nothing_and_start_then_needs_a_create() {
    bounded(async {
        let world = World::new();
        let agent = world.agent("alpha");
        world.fail("create", 1);
        let error = world.runtime.create(&agent, &|_: &str| {}).await.unwrap_err();
        let create = format!("nixos-container create h-alpha --flake {}#alpha", world.path("meta").display());
        match &error {
            Error::Command { command, output, .. } => {
                assert_eq!(*command, create);
                assert!(output.contains("failed"), "{output}");
            }
            other => panic!("unexpected error {other}"),
        }
        assert!(!world.path("conf/h-alpha.conf").exists());
        assert!(!world.path("systemd/container@h-alpha.service.d").exists());
        let error = world.runtime.start(&agent).await.unwrap_err();
        assert!(matches!(error, Error::NoGeneration { .. }), "{error}");
        let error = world.runtime.write_limits(&agent).await.unwrap_err();
        assert!(matches!(error, Error::NoGeneration { .. }), "{error}");
        assert!(!world.path("systemd/container@h-alpha.service.d").exists());
        assert_eq!(
            world.take(),
            [
                "nixos-container create h-alpha --flake <tmp>/meta#alpha",
                "systemctl is-active --quiet container@h-alpha",
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn the_cold_start_fallback_stops_kills_and_starts_again_and_keeps_both_errors() {
    bounded(async {
        // (failing starts, expected outcome)
        for failing in [1, 2] {
            let world = World::new();
            let agent = world.agent("alpha");
            world.created(&agent).await;
            world.fail("start", failing);
            let result = world.runtime.start(&agent).await;
            assert_eq!(
                world.take(),
                [
                    "systemctl is-active --quiet container@h-alpha",
                    "systemctl start container@h-alpha",
                    "systemctl stop container@h-alpha",
                    "systemctl kill --signal=KILL container@h-alpha",
                    "systemctl start container@h-alpha",
                ]
                .into_iter()
                .chain((failing == 1).then_some(MAIN_PID))
                .collect::<Vec<_>>(),
                "{failing} failing starts"
            );
            let is_failed_start = |e: &Error| match e {
                Error::Command { command, output, .. } => {
                    command == "systemctl start container@h-alpha"
                        && output.contains("Job for container@h-alpha")
                }
                _ => false,
            };
            match (failing, result) {
                (1, Ok(started)) => {
                    assert_eq!(started.pid, 4242);
                    let first = started.recovered_from.expect("the first error is kept");
                    assert!(is_failed_start(&first), "{first}");
                    assert_eq!(world.unit("h-alpha"), "active");
                }
                (2, Err(Error::ColdStart { agent, first, second })) => {
                    assert_eq!(agent, "alpha");
                    assert!(is_failed_start(&first), "{first}");
                    assert!(is_failed_start(&second), "{second}");
                    assert!(!world.runtime.is_running(&world.agent("alpha")).await.unwrap());
                }
                (_, other) => panic!("{failing} failing starts: {other:?}"),
            }
        }
    })
    .await;
}

// Issue 26, item 6: crash-watch's retry is one `systemctl start`, never the fallback's
// stop, kill and second start.
#[tokio::test]
async fn a_start_without_the_fallback_runs_one_systemctl_start() {
    bounded(async {
        let world = World::new();
        let agent = world.agent("alpha");
        world.created(&agent).await;
        world.fail("start", 1);
        let error = world.runtime.start_with(&agent, Fallback::Never).await.unwrap_err();
        assert!(
            matches!(&error, Error::Command { command, .. } if command == "systemctl start container@h-alpha"),
            "{error}"
        );
        assert_eq!(
            world.take(),
            ["systemctl is-active --quiet container@h-alpha", "systemctl start container@h-alpha"]
        );
        assert!(!world.runtime.is_running(&agent).await.unwrap());
    })
    .await;
}

/// A unit state before, an operation, its commands, the unit state after, and the exit
/// published (with its signal) if any.
type StopCase = (&'static str, &'static str, &'static [&'static str], &'static str, Option<Option<i32>>);

#[tokio::test]
async fn stop_and_kill_are_no_ops_when_stopped_and_exact_when_running() {
    bounded(async {
        let cases: &[StopCase] = &[
            ("inactive", "stop", &["systemctl is-active --quiet container@h-alpha"], "inactive", None),
            ("failed", "kill", &["systemctl is-active --quiet container@h-alpha"], "failed", None),
            (
                "active",
                "stop",
                &["systemctl is-active --quiet container@h-alpha", "systemctl stop container@h-alpha"],
                "inactive",
                Some(None),
            ),
            (
                "active",
                "kill",
                &[
                    "systemctl is-active --quiet container@h-alpha",
                    "systemctl kill --signal=KILL container@h-alpha",
                    "systemctl stop container@h-alpha",
                ],
                "inactive",
                Some(Some(9)),
            ),
        ];
        for (before, op, commands, after, exit) in cases {
            let world = World::new();
            let rt = &world.runtime;
            let agent = world.agent("alpha");
            world.set_unit("h-alpha", before);
            let mut events = rt.subscribe();
            match *op {
                "stop" => rt.stop(&agent).await.unwrap(),
                _ => rt.kill(&agent).await.unwrap(),
            }
            assert_eq!(world.take(), *commands, "{op} when {before}");
            assert_eq!(world.unit("h-alpha"), *after, "{op} when {before}");
            let published: Vec<Exit> = std::iter::from_fn(|| events.try_recv().ok())
                .filter_map(|e| match e.change {
                    Change::Exited(exit) => Some(exit),
                    _ => None,
                })
                .collect();
            match exit {
                None => assert!(published.is_empty(), "{op} when {before}: {published:?}"),
                Some(signal) => {
                    assert_eq!(published.len(), 1, "{op} when {before}");
                    assert!(published[0].requested);
                    assert_eq!(published[0].signal, *signal);
                }
            }
        }
        // A failed stop is the command's error, with systemctl's message.
        let world = World::new();
        world.set_unit("h-alpha", "active");
        world.fail("stop", 1);
        let error = world.runtime.stop(&world.agent("alpha")).await.unwrap_err();
        assert!(error.to_string().contains("Access denied"), "{error}");
        assert!(error.to_string().contains("`systemctl stop container@h-alpha` in / failed"), "{error}");
    })
    .await;
}

#[tokio::test]
async fn signal_sets_the_fence_and_kicks_the_harness_and_drain_waits_for_it() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let agent = world.agent("alpha");
        world.created(&agent).await;
        rt.start(&agent).await.unwrap();
        world.take();
        let fence = world.path("roots/h-alpha/var/lib/hive/fence");
        assert_eq!(rt.fence_path("h-alpha"), fence);

        // The harness clears the fence after its checkpoint turn: Drained. (Its unit has
        // no main process in the stand-in, so nothing is kicked; the fence is enough.)
        let kick = rt.signal(&agent).await.unwrap();
        assert_eq!(kick, Kick::Withheld("hive-harness.service has no main process".into()));
        assert!(fence.exists(), "the fence is set");
        assert_eq!(
            world.take(),
            [
                "systemctl is-active --quiet container@h-alpha",
                "nixos-container run h-alpha -- sh -c <KICK_SCRIPT> hive-kick hive-harness.service",
                "systemctl show --property=MainPID --value hive-harness.service",
            ]
        );
        let harness = {
            let fence = fence.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                std::fs::remove_file(fence).unwrap();
            })
        };
        let began = std::time::Instant::now();
        assert_eq!(rt.drain(&agent).await.unwrap(), Drain::Drained);
        assert!(began.elapsed() < Duration::from_secs(3), "{:?}", began.elapsed());
        harness.await.unwrap();

        // The harness never clears it: TimedOut after gracefulStopSeconds, fence kept.
        let mut patient = agent.clone();
        patient.spec.runtime.graceful_stop_seconds = Some(1);
        rt.signal(&patient).await.unwrap();
        let began = std::time::Instant::now();
        assert_eq!(rt.drain(&patient).await.unwrap(), Drain::TimedOut);
        let waited = began.elapsed();
        assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(4), "{waited:?}");
        assert!(fence.exists());

        // Stopped: the fence is set but nobody is kicked, and drain ends at once.
        rt.stop(&agent).await.unwrap();
        world.take();
        assert_eq!(rt.signal(&agent).await.unwrap(), Kick::NotRunning);
        assert_eq!(rt.drain(&agent).await.unwrap(), Drain::Drained);
        assert_eq!(
            world.take(),
            [
                "systemctl is-active --quiet container@h-alpha",
                "systemctl is-active --quiet container@h-alpha"
            ]
        );
        // A start clears the stale fence.
        rt.start(&agent).await.unwrap();
        assert!(!fence.exists());
    })
    .await;
}

/// A real process standing in for the harness's main process, running `script` (which
/// must touch `$READY` once its traps are set), its pid where the stand-in's `systemctl
/// show` answers it.
fn harness(world: &World, script: &str) -> std::process::Child {
    let ready = world.path("state/harness-ready");
    let _ = std::fs::remove_file(&ready);
    let child = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("READY", &ready)
        .env("KICKED", world.path("state/kicked"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ready.exists() {
        assert!(std::time::Instant::now() < deadline, "the harness stand-in never got ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(world.path("state/harness-pid"), format!("{}\n", child.id())).unwrap();
    child
}

/// The kick cannot kill: the script run in the container sends SIGUSR1 to the harness's
/// main process only when that process catches or ignores it (real processes here, so
/// the masks are the kernel's), and a kick that fails is withheld, not an error.
#[tokio::test]
async fn the_kick_reaches_only_a_harness_that_handles_sigusr1() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let agent = world.agent("alpha");
        world.created(&agent).await;
        rt.start(&agent).await.unwrap();
        let kicked = world.path("state/kicked");

        // A harness that traps SIGUSR1 is kicked: its handler runs.
        let mut handles = harness(
            &world,
            r#"trap ': > "$KICKED"' USR1; : > "$READY"; while [ ! -e "$KICKED" ]; do sleep 0.05; done"#,
        );
        world.take();
        assert_eq!(rt.signal(&agent).await.unwrap(), Kick::Sent);
        assert!(handles.wait().unwrap().success(), "the handler ran and ended its loop");
        assert!(kicked.exists());
        assert_eq!(
            world.take(),
            [
                "systemctl is-active --quiet container@h-alpha",
                "nixos-container run h-alpha -- sh -c <KICK_SCRIPT> hive-kick hive-harness.service",
                "systemctl show --property=MainPID --value hive-harness.service",
            ]
        );

        // One that ignores it is kicked harmlessly; one that does neither is not kicked
        // at all, and lives on (SIGUSR1 would have ended it).
        for (script, expected) in [
            (r#"trap '' USR1; : > "$READY"; while :; do sleep 0.05; done"#, None),
            (r#": > "$READY"; while :; do sleep 0.05; done"#, Some("does not handle it")),
        ] {
            let mut process = harness(&world, script);
            let kick = rt.signal(&agent).await.unwrap();
            match expected {
                None => assert_eq!(kick, Kick::Sent, "{script}"),
                Some(why) => {
                    let Kick::Withheld(message) = &kick else { panic!("{script}: {kick:?}") };
                    assert!(message.contains(why), "{message}");
                    assert!(message.contains(&process.id().to_string()), "{message}");
                }
            }
            std::thread::sleep(Duration::from_millis(200));
            assert!(process.try_wait().unwrap().is_none(), "{script}: still running after {kick:?}");
            process.kill().unwrap();
            process.wait().unwrap();
        }

        // The kick fails (say, the container's systemd does not answer): the fence is
        // set and the kick withheld with the command's error, so the stop goes on.
        std::fs::remove_file(world.fence_of("h-alpha")).unwrap();
        world.fail("run", 1);
        let kick = rt.signal(&agent).await.unwrap();
        let Kick::Withheld(message) = &kick else { panic!("{kick:?}") };
        assert!(message.starts_with("the kick failed: ") && message.contains("main PID"), "{message}");
        assert!(world.fence_of("h-alpha").exists());
    })
    .await;
}

#[tokio::test]
async fn agent_names_whose_container_name_would_pass_11_characters_are_refused() {
    bounded(async {
        let cases: &[(&str, Option<&str>)] = &[
            ("a", Some("h-a")),
            ("abcdefghi", Some("h-abcdefghi")),
            ("abcdefghij", None),
            ("a-very-long-agent-name", None),
            ("Alpha", None),
            ("", None),
            ("../etc", None),
        ];
        for (name, expected) in cases {
            match (container_name(name), expected) {
                (Ok(got), Some(want)) => assert_eq!(got, *want),
                (Err(Error::Config { field, agent, .. }), None) => {
                    assert_eq!((field, agent.as_str()), ("metadata.name", *name))
                }
                (got, want) => panic!("{name:?}: got {got:?}, want {want:?}"),
            }
        }

        // Every primitive refuses before running anything.
        let world = World::new();
        let rt: &dyn Runtime = &world.runtime;
        let agent = world.agent("abcdefghij");
        let generation = Generation { id: store_path(1, "h-abcdefghij"), rev: String::new() };
        let log = |_: &str| {};
        let results: Vec<Error> = vec![
            rt.prebuild(&agent, &log).await.unwrap_err(),
            rt.stop_for_update(&agent).await.unwrap_err(),
            rt.swap(&agent, &generation).await.unwrap_err(),
            rt.create(&agent, &log).await.unwrap_err(),
            rt.start(&agent).await.unwrap_err(),
            rt.stop(&agent).await.unwrap_err(),
            rt.kill(&agent).await.unwrap_err(),
            rt.signal(&agent).await.unwrap_err(),
            rt.drain(&agent).await.unwrap_err(),
            rt.write_limits(&agent).await.unwrap_err(),
            rt.write_permissions(&agent).await.unwrap_err(),
            rt.is_running(&agent).await.unwrap_err(),
            rt.observed(&agent).await.unwrap_err(),
            rt.destroy(&agent).await.unwrap_err(),
        ];
        for error in results {
            assert!(matches!(&error, Error::Config { field: "metadata.name", .. }), "{error}");
            assert!(error.to_string().contains("\"h-abcdefghij\" (12 characters)"), "{error}");
        }
        assert!(world.take().is_empty());
    })
    .await;
}

#[tokio::test]
async fn invalid_limits_and_flags_are_refused_naming_the_field_and_nothing_is_written() {
    bounded(async {
        // (cpuQuota, memoryMax, nspawn flag, field)
        let cases: &[(Option<&str>, Option<&str>, &str, &str)] = &[
            (Some("2"), None, "--x", "spec.resources.cpuQuota"),
            (Some("0%"), None, "--x", "spec.resources.cpuQuota"),
            (Some("abc%"), Some("4G"), "--x", "spec.resources.cpuQuota"),
            (None, Some("4GB"), "--x", "spec.resources.memoryMax"),
            (None, Some("0"), "--x", "spec.resources.memoryMax"),
            (Some("100%"), Some("-1G"), "--x", "spec.resources.memoryMax"),
            (None, None, "--bind=/a b:/b", "spec.runtime.nixosContainer.nspawnFlags"),
        ];
        let world = World::new();
        let agent = world.agent("alpha");
        world.created(&agent).await;
        let conf_before = std::fs::read_to_string(world.path("conf/h-alpha.conf")).unwrap();
        for (cpu, memory, flag, want) in cases {
            let mut agent = agent.clone();
            agent.spec.resources.cpu_quota = cpu.map(String::from);
            agent.spec.resources.memory_max = memory.map(String::from);
            agent.spec.runtime.nixos_container =
                Some(NixosContainerRuntime { nspawn_flags: vec![flag.to_string()] });
            match world.runtime.write_limits(&agent).await {
                Err(Error::Config { field, agent, .. }) => {
                    assert_eq!((field, agent.as_str()), (*want, "alpha"))
                }
                other => panic!("{cpu:?} {memory:?} {flag:?}: {other:?}"),
            }
        }
        assert!(!world.path("systemd/container@h-alpha.service.d").exists());
        assert_eq!(std::fs::read_to_string(world.path("conf/h-alpha.conf")).unwrap(), conf_before);
        assert!(world.take().is_empty(), "no daemon-reload");

        // An invalid hive-wide default names the hive option.
        let world = World::with(|config| config.default_memory_max = "lots".into());
        let agent = world.agent("alpha");
        world.created(&agent).await;
        let error = world.runtime.write_limits(&agent).await.unwrap_err();
        assert!(matches!(error, Error::Config { field: "agentMemoryMax", .. }), "{error}");
    })
    .await;
}

#[tokio::test]
async fn a_crash_is_published_by_the_rescan_and_a_requested_stop_is_not() {
    bounded(async {
        let world = World::with(|config| config.rescan_interval = Duration::from_millis(50));
        let rt = &world.runtime;
        let agent = world.agent("alpha");
        world.created(&agent).await;
        let mut events = rt.subscribe();
        rt.start(&agent).await.unwrap();

        world.set_unit("h-alpha", "failed");
        let exit = next_exit(&mut events, "alpha").await;
        assert!(!exit.requested, "{exit:?}");
        let observed = rt.observed(&agent).await.unwrap();
        assert_eq!((observed.power, observed.pid), (Power::Stopped, None));
        assert_eq!(observed.last_exit, Some(exit.clone()));
        assert_eq!(observed.since, Some(exit.at));

        // A requested stop is published once, as requested, and never as a crash.
        rt.start(&agent).await.unwrap();
        rt.stop(&agent).await.unwrap();
        assert!(next_exit(&mut events, "alpha").await.requested);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let later: Vec<String> = changes(&mut events).into_iter().filter(|c| c.contains("exited")).collect();
        assert!(later.is_empty(), "{later:?}");

        // A container an earlier daemon started is adopted when it is seen running.
        let other = world.agent("beta");
        world.set_unit("h-beta", "active");
        assert!(rt.is_running(&other).await.unwrap());
        world.set_unit("h-beta", "inactive");
        assert!(!next_exit(&mut events, "beta").await.requested);
    })
    .await;
}

#[tokio::test]
async fn permissions_are_written_where_the_harness_reads_them() {
    bounded(async {
        let world = World::new();
        let mut agent = world.agent("alpha");
        agent.spec.permissions.tool_groups = vec!["git".into(), "web".into()];
        agent.spec.permissions.capabilities = vec!["spawn".into()];
        world.runtime.write_permissions(&agent).await.unwrap();
        let dir = world.path("roots/h-alpha/etc/hive");
        let read = |file: &str| -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap()
        };
        assert_eq!(read("tool-groups.json"), serde_json::json!(["git", "web"]));
        assert_eq!(read("capabilities.json"), serde_json::json!(["spawn"]));
        world.runtime.write_permissions(&world.agent("alpha")).await.unwrap();
        assert_eq!(read("tool-groups.json"), serde_json::json!([]));
        assert!(world.take().is_empty(), "files only");
    })
    .await;
}

#[tokio::test]
async fn destroy_stops_destroys_and_removes_the_dropin_and_is_a_no_op_for_an_unknown_agent() {
    bounded(async {
        let world = World::new();
        let rt = &world.runtime;
        let agent = world.agent("alpha");
        world.created(&agent).await;
        rt.write_limits(&agent).await.unwrap();
        rt.start(&agent).await.unwrap();
        world.take();
        let mut events = rt.subscribe();
        rt.destroy(&agent).await.unwrap();
        assert_eq!(
            world.take(),
            [
                "systemctl is-active --quiet container@h-alpha",
                "systemctl stop container@h-alpha",
                "nixos-container destroy h-alpha",
            ]
        );
        assert!(!world.path("systemd/container@h-alpha.service.d").exists());
        assert!(!world.path("conf/h-alpha.conf").exists());
        assert_eq!(changes(&mut events), ["alpha exited requested=true", "alpha destroyed"]);
        let observed = rt.observed(&agent).await.unwrap();
        assert_eq!((observed.power, observed.generation, observed.last_exit), (Power::Stopped, None, None));
        world.take();

        rt.destroy(&world.agent("ghost")).await.unwrap();
        assert_eq!(world.take(), ["systemctl is-active --quiet container@h-ghost"]);
    })
    .await;
}

#[tokio::test]
async fn a_command_that_cannot_be_launched_is_a_spawn_error() {
    bounded(async {
        let world = World::with(|config| config.path = Some(Path::new("/nonexistent").into()));
        let agent = world.agent("alpha");
        let error = world.runtime.is_running(&agent).await.unwrap_err();
        assert!(matches!(&error, Error::Spawn { command, .. } if command == SHOW), "{error}");
    })
    .await;
}

/// `hive logs --previous --since … --timestamps` on a container agent names the journal
/// command that reads the same; the log route passes it on in its 400.
#[test]
fn the_log_options_map_onto_a_journalctl_command() {
    use crate::runtime::LogOptions;
    let since = chrono::DateTime::parse_from_rfc3339("2026-12-01T17:00:00Z").unwrap().to_utc();
    let cases = [
        (LogOptions::default(), "journalctl -M hive-a -o cat"),
        (
            LogOptions { follow: true, tail: Some(5), ..LogOptions::default() },
            "journalctl -M hive-a -n 5 -o cat -f",
        ),
        (
            LogOptions { previous: true, follow: true, timestamps: true, since: Some(since), tail: None },
            "journalctl -M hive-a -b -1 --since='2026-12-01 17:00:00 UTC' -o short-iso-precise",
        ),
    ];
    for (options, want) in cases {
        assert_eq!(super::journal_command("hive-a", &options).join(" "), want, "{options:?}");
    }
}
