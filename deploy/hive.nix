# NixOS module for the hive daemon (`hive serve`).
#
#   imports = [ ./deploy/hive.nix ];
#   services.hive = {
#     enable = true;
#     package = hive;              # a derivation providing bin/hive, built from this repository
#     listen = "0.0.0.0:7443";     # open the port in networking.firewall yourself
#     buildSlots = 4;
#   };
#
# Every option maps to one `hive serve` flag; `deploy/README.md` has the table and
# `tests/it/deploy.rs` checks that each flag rendered here is one `hive serve --help`
# lists (it evaluates this file offline through `deploy/check.nix`).
#
# Only these `lib` functions are used, so the offline check's stub stays small:
# mkOption, mkEnableOption, mkIf, mkMerge, optional, optionals, hasPrefix,
# removePrefix, escapeShellArgs, literalExpression and types.{bool, str, path,
# package, enum, nullOr, listOf, ints.positive, ints.unsigned}.
{ config, lib, pkgs, ... }:
let
  cfg = config.services.hive;
  containers = cfg.runtime == "nixos-container";

  # systemd expands `%` specifiers in ExecStart, so a literal `%` (as in "200%") is
  # written `%%`. Applied to each escaped argument, never to the `%d` we add ourselves.
  escapeSystemd = s: builtins.replaceStrings [ "%" ] [ "%%" ] s;

  args =
    [ "serve"
      "--listen" cfg.listen
      "--state-dir" cfg.stateDir
      "--build-slots" (toString cfg.buildSlots)
      "--build-retries" (toString cfg.buildRetries)
      "--runtime" cfg.runtime
      "--agent-cpu-quota" cfg.agentCpuQuota
      "--agent-memory-max" cfg.agentMemoryMax
      "--provider" cfg.provider
      "--fleet-listen" cfg.fleetListen
      "--log-format" cfg.logFormat
      "--audit-log-max-size" cfg.auditLogMaxSize
      "--audit-log-max-backups" (toString cfg.auditLogMaxBackups)
    ]
    ++ lib.optional cfg.preBuildAgentTemplates "--prebuild-agent-templates"
    ++ lib.optionals (cfg.jobHistoryMaxAge != null) [ "--job-history-max-age" cfg.jobHistoryMaxAge ]
    ++ lib.optionals (cfg.hiveFlake != null) [ "--hive-flake" cfg.hiveFlake ]
    ++ lib.optionals (cfg.hiveRev != null) [ "--hive-rev" cfg.hiveRev ]
    ++ lib.optional (!cfg.auditLog) "--no-audit-log"
    ++ lib.optionals (cfg.auditLogPath != null) [ "--audit-log" cfg.auditLogPath ]
    ++ lib.optional cfg.auditReads "--audit-reads"
    ++ lib.optionals (!cfg.metrics) [ "--metrics" "false" ]
    ++ lib.optionals (cfg.metricsListen != null) [ "--metrics-listen" cfg.metricsListen ]
    ++ cfg.extraArgs;

  # The certificate and key reach the daemon through systemd credentials
  # (LoadCredential=): systemd copies them, readable only by the service, to
  # $CREDENTIALS_DIRECTORY (`%d`), so a root-owned 0600 key works with DynamicUser too.
  tls = cfg.tlsCert != null && cfg.tlsKey != null;
  tlsArgs = lib.optionals tls [ "--tls-cert" "%d/tls.crt" "--tls-key" "%d/tls.key" ];

  execStart =
    escapeSystemd (lib.escapeShellArgs ([ "${cfg.package}/bin/hive" ] ++ args))
    + (if tls then " " + builtins.concatStringsSep " " tlsArgs else "");

  stateDirectory =
    if lib.hasPrefix "/var/lib/" cfg.stateDir then lib.removePrefix "/var/lib/" cfg.stateDir else null;

  x86_64 = pkgs.stdenv.hostPlatform.isx86_64;
in {
  options.services.hive = {
    enable = lib.mkEnableOption "the hive control plane daemon (`hive serve`)";

    package = lib.mkOption {
      type = lib.types.package;
      description = ''
        The package providing `bin/hive`, built from this repository (for example with
        `rustPlatform.buildRustPackage`). nixpkgs has no hive package, so there is no default.
      '';
    };

    listen = lib.mkOption {
      type = lib.types.str;
      default = "127.0.0.1:7443";
      example = "0.0.0.0:7443";
      description = ''
        Address the HTTPS API listens on (`--listen`). The generated kubeconfig records
        it. Serving other hosts needs the port opened in `networking.firewall`; a port
        below 1024 needs `CAP_NET_BIND_SERVICE`, which this module does not grant. The
        generated certificate names only `localhost`, `127.0.0.1` and a specific listen
        IP: clients that reach the host by another name need `tlsCert`/`tlsKey`.
      '';
    };

    stateDir = lib.mkOption {
      type = lib.types.str;
      default = "/var/lib/hive";
      description = ''
        Directory holding the database (`hive.redb`), TLS material (`pki/`), hashed
        tokens and the generated kubeconfig with the first admin token (`--state-dir`).
        With `runtime = "process"` it must lie under `/var/lib` (systemd's
        `StateDirectory=` creates it for the dynamic user; it then physically lives in
        `/var/lib/private`, reached through a symlink). Back it up as a whole.
      '';
    };

    buildSlots = lib.mkOption {
      type = lib.types.ints.positive;
      default = 1;
      description = ''
        How many heavy Job nodes (prebuilds, profile swaps, first-spawn creates) run at
        once (`--build-slots`). The default serializes all heavy work; raise it on hosts
        with the cores and RAM to build several agents at once. Per-agent correctness
        does not depend on the count: each agent's operations serialize on its lifecycle
        lease regardless.
      '';
    };

    buildRetries = lib.mkOption {
      type = lib.types.ints.unsigned;
      default = 0;
      description = ''
        How many times the Jobs hive builds from its templates (start, restart, rebuild,
        spawn …) retry a failed build, their Prebuild and Create nodes (`--build-retries`,
        0 to 20), with a backoff of 10 s doubling up to 5 min. A Job written with its own
        `spec.retry` keeps it. Retries hide a flaky fetch; a build that fails for good
        fails that many times slower.
      '';
    };

    jobHistoryMaxAge = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = null;
      example = "24h";
      description = ''
        How long a finished Job (Done, Failed, Cancelled, Interrupted) without a
        `spec.ttlSecondsAfterFinished` of its own is kept after it finished
        (`--job-history-max-age`; `1s` up to `8760h`, a year), then deleted. `null`: no
        bound by age. Either way at most the 5 most recent finished Jobs of each template
        are kept. A deleted Job is history gone: its outcome and node logs with it.
      '';
    };

    runtime = lib.mkOption {
      type = lib.types.enum [ "process" "nixos-container" ];
      default = "process";
      description = ''
        How agents run (`--runtime`). `process`: supervised local processes under the
        daemon's own service, which then runs as a dynamic, sandboxed user.
        `nixos-container`: one NixOS container (`nixos-container`, systemd-nspawn) per
        agent; the daemon then runs as root, because it creates containers, writes
        their systemd drop-ins and starts and stops `container@` units, and this module
        enables `boot.enableContainers` and the flakes feature of Nix.
      '';
    };

    provider = lib.mkOption {
      type = lib.types.enum [ "process" "docker" "vastai" ];
      default = "process";
      description = ''
        The fleet provider of commands that name none (`--provider`). `process`: local
        worker processes, which end with the daemon. `docker`: node containers on the
        host's Docker Engine (the daemon needs access to its socket, and `fleetListen`
        must be reachable from the containers). `vastai`: leased Vast.ai instances; it
        starts Unconfigured and takes its key at runtime (`hive fleet configure vastai`).
      '';
    };

    fleetListen = lib.mkOption {
      type = lib.types.str;
      default = "127.0.0.1:7946";
      example = "0.0.0.0:7946";
      description = ''
        UDP address of the fleet's iroh endpoint (`--fleet-listen`): workers join it and
        the daemon pulls their telemetry through it. Keep the port fixed, so containers
        and instances that outlive a restart find the daemon again; nodes on other hosts
        or in containers need a non-loopback address and the port opened in
        `networking.firewall.allowedUDPPorts`.
      '';
    };

    agentCpuQuota = lib.mkOption {
      type = lib.types.str;
      default = "200%";
      description = ''
        CPU cap per agent, as a percentage of one core ("200%" = 2 cores)
        (`--agent-cpu-quota`). Raise if agents hit CPU limits during builds or heavy tool
        use. An agent's `spec.resources.cpuQuota` overrides it. It maps to systemd
        `CPUQuota=`: with `runtime = "nixos-container"` the daemon writes it to a
        `container@<name>.service.d` drop-in on each spawn and rebuild, so a change takes
        effect on the agent's next lifecycle operation without a host rebuild. With
        `runtime = "process"` the agent's `LimitsEnforced` condition says whether the host
        enforces it. For a cap over all agents together set
        `systemd.slices.machine.sliceConfig.CPUQuota` (containers live in
        `machine.slice`) or `systemd.services.hive.serviceConfig.CPUQuota` (processes live
        in this service's cgroup).
      '';
    };

    agentMemoryMax = lib.mkOption {
      type = lib.types.str;
      default = "4G";
      description = ''
        Memory cap per agent (`--agent-memory-max`), systemd `MemoryMax=` syntax. Raise
        for agents that run large Nix builds or hold big in-memory data. An agent's
        `spec.resources.memoryMax` overrides it; applied like `agentCpuQuota`.
      '';
    };

    preBuildAgentTemplates = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = ''
        Pre-fetch the agent template system closures listed in `agentTemplates` into
        `/nix/store` as part of the host's NixOS build, instead of leaving that work to
        the first start of each agent, and tell the daemon so
        (`--prebuild-agent-templates`). The trade-off:

        - On (recommended for x86_64 hosts that care about first-spawn latency): the
          first start of a new agent completes in seconds because nothing is left to
          fetch. Cost: the templates' full closures (nixpkgs runtime, the agent's tools,
          the harness) are added to the host system closure (low single-digit GB).
        - Off (default): the host closure stays lean; the first spawn does all the eval
          and fetch work at runtime (can take several minutes on a fresh store).

        Note: the template toplevels are pinned to x86_64-linux. Enabling this on an
        aarch64 host forces a cross-compilation or remote-builder build, which is almost
        never desired (the module warns). Leave it off on non-x86 hosts.
      '';
    };

    agentTemplates = lib.mkOption {
      type = lib.types.listOf lib.types.package;
      default = [ ];
      example = lib.literalExpression
        "[ agentFlake.nixosConfigurations.agent-base.config.system.build.toplevel ]";
      description = ''
        Template system toplevels that `preBuildAgentTemplates` adds to
        `system.extraDependencies`. That is all it does: building the host system builds
        or substitutes them, and they stay in the store (and out of garbage collection)
        for as long as the host generation does. It saves work at an agent's first start
        only when the agent's own configuration evaluates to one of these store paths
        or shares most of their closure (same nixpkgs, same template); the daemon still
        evaluates every agent itself. Ignored while `preBuildAgentTemplates` is off.
      '';
    };

    tlsCert = lib.mkOption {
      type = lib.types.nullOr lib.types.path;
      default = null;
      example = "/var/lib/acme/hive.example.org/fullchain.pem";
      description = ''
        Serve this certificate (PEM chain) instead of the one hive generates from its
        private CA (`--tls-cert`). Needs `tlsKey`. Give a string, not a Nix path
        literal, or the file is copied into the world-readable store. Read at start:
        restart the service after renewing.
      '';
    };

    tlsKey = lib.mkOption {
      type = lib.types.nullOr lib.types.path;
      default = null;
      example = "/var/lib/acme/hive.example.org/key.pem";
      description = ''
        Key of `tlsCert` (`--tls-key`), as a string (see `tlsCert`). It may be readable by
        root only: systemd hands it to the service as a credential.
      '';
    };

    hiveFlake = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = null;
      example = "github:hive-dev/hive";
      description = ''
        The hive base flake the meta flake builds every agent container from
        (`--hive-flake`): this repository, whose `flake.nix` provides
        `lib.agentSystem`. `null` keeps the binary's default, the repository checkout it
        was built from (or `github:hive-dev/hive` when the build had none).
      '';
    };

    hiveRev = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = null;
      example = "0123456789abcdef0123456789abcdef01234567";
      description = ''
        The commit of `hiveFlake` the meta lock pins (`--hive-rev`). `null` keeps the
        binary's default, the git commit it was built from; a package built without git
        metadata has none, so set this (for example to the hive flake's `self.rev`).
      '';
    };

    logFormat = lib.mkOption {
      type = lib.types.enum [ "text" "json" ];
      default = "text";
      description = ''
        The format of the daemon's log lines on stderr, which systemd sends to the
        journal (`--log-format`). `text`: for people, coloured only on a terminal (never
        in the journal). `json`: one JSON object a line carrying the request's span and
        its `request_id` (the `X-Request-Id` / `Audit-Id` a client saw), for a log
        collector.
      '';
    };

    auditLog = lib.mkOption {
      type = lib.types.bool;
      default = true;
      description = ''
        Write the API audit log: every mutation (and with `auditReads` every read) as one
        JSON line saying who (token name and role), what (verb, resource, name,
        subresource), the response code, the resulting resourceVersion and the source
        address; never a body or a token. `false` passes `--no-audit-log`. Read it with
        `hive audit --api` on this host.
      '';
    };

    auditLogPath = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = null;
      example = "/var/lib/hive/audit/api.log";
      description = ''
        Where the audit log is written (`--audit-log`), with its rotated backups beside
        it (`PATH.1` … `PATH.N`). `null` keeps the daemon's default, `audit.log` in
        `stateDir`. Under `runtime = "process"` the service's sandbox can write only its
        state directory: keep the path under `stateDir`, or add its directory to
        `systemd.services.hive.serviceConfig.ReadWritePaths`. Needs `auditLog`.
      '';
    };

    auditLogMaxSize = lib.mkOption {
      type = lib.types.str;
      default = "100M";
      example = "1G";
      description = ''
        Rotate the audit log before it would grow past this size (`--audit-log-max-size`;
        a number with an optional `K`, `M` or `G`). With `auditLogMaxBackups` it bounds
        the disk the log takes: about size × (backups + 1).
      '';
    };

    auditLogMaxBackups = lib.mkOption {
      type = lib.types.ints.unsigned;
      default = 5;
      description = ''
        Rotated audit logs kept, newest first (`--audit-log-max-backups`); `0` keeps none,
        so each rotation starts the file afresh and drops what it held.
      '';
    };

    auditReads = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = ''
        Also record reads (get, list, watch) in the audit log (`--audit-reads`). Reads
        are most of an API's traffic: expect the log to grow and rotate many times faster.
      '';
    };

    metrics = lib.mkOption {
      type = lib.types.bool;
      default = true;
      description = ''
        Count and time every API request for `/metrics` (`--metrics`; `false` passes
        `--metrics false`). Off, `/metrics` still answers with the levels read at scrape
        time (objects, revision, queues, fleet nodes); only the per-request families stay
        empty. Turn it off only to measure what recording costs.
      '';
    };

    metricsListen = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = null;
      example = "127.0.0.1:9464";
      description = ''
        Also serve `/metrics` on this address, over plain HTTP and without
        authentication (`--metrics-listen`), for a Prometheus that holds no token.
        `null`: `/metrics` only on the API, with a viewer token. Anyone who reaches the
        address reads the metrics: keep it on loopback or a monitoring network.
      '';
    };

    extraArgs = lib.mkOption {
      type = lib.types.listOf lib.types.str;
      default = [ ];
      example = [ "--retention-age" "2h" "--log" "hive=debug" ];
      description = "Further arguments for `hive serve`, appended after the ones above.";
    };
  };

  config = lib.mkIf cfg.enable (lib.mkMerge [
    {
      assertions = [
        {
          assertion = (cfg.tlsCert == null) == (cfg.tlsKey == null);
          message = "services.hive: set both tlsCert and tlsKey, or neither.";
        }
        {
          assertion = containers || stateDirectory != null;
          message = ''services.hive: with runtime = "process" the daemon runs as a dynamic user, so stateDir must lie under /var/lib (got ${cfg.stateDir}).'';
        }
        {
          assertion = cfg.buildRetries <= 20;
          message = "services.hive.buildRetries: at most 20 (got ${toString cfg.buildRetries}).";
        }
        {
          assertion = cfg.auditLog || cfg.auditLogPath == null;
          message = "services.hive: auditLogPath is set but auditLog is false; set one or the other.";
        }
      ];

      warnings =
        lib.optional (cfg.preBuildAgentTemplates && !x86_64)
          "services.hive.preBuildAgentTemplates: the agent template toplevels are pinned to x86_64-linux; on ${pkgs.stdenv.hostPlatform.system} this forces a cross-compilation or remote-builder build. Leave it off on non-x86 hosts."
        ++ lib.optional (cfg.preBuildAgentTemplates && cfg.agentTemplates == [ ])
          "services.hive.preBuildAgentTemplates is on but services.hive.agentTemplates is empty: nothing is pre-fetched."
        ++ lib.optional (cfg.provider == "docker" && lib.hasPrefix "127." cfg.fleetListen)
          "services.hive.provider is docker but fleetListen (${cfg.fleetListen}) is a loopback address, which containers cannot reach: listen on 0.0.0.0 (or the Docker bridge's address) and open the UDP port to the bridge.";

      system.extraDependencies = lib.optionals cfg.preBuildAgentTemplates cfg.agentTemplates;

      systemd.services.hive = {
        description = "hive control plane";
        wantedBy = [ "multi-user.target" ];
        after = [ "network-online.target" ];
        wants = [ "network-online.target" ];
        # Agents' configuration lives in git (the process runtime checks out each
        # generation with `git`). Add what your agents' build and run commands need here
        # too (`systemd.services.hive.path`).
        path = [ pkgs.git ];
        # A hard startup error (an unreadable database, a taken port) is not retried
        # forever: 5 failed starts within 5 minutes leave the unit failed.
        startLimitIntervalSec = 300;
        startLimitBurst = 5;
        serviceConfig = {
          Type = "exec";
          ExecStart = execStart;
          Restart = "on-failure";
          RestartSec = "5s";
          # On SIGTERM the daemon stops its agents itself, gracefully: it fences and
          # SIGTERMs each agent's process group, waits up to the agent's graceful-stop
          # time (180 s by default), then SIGKILLs it, and drains pending commits.
          # KillMode=mixed sends systemd's SIGTERM to the daemon only, so the agents are
          # not signalled behind its back (with the default control-group mode they
          # would get SIGTERM at the same moment, outside the daemon's ordering); the
          # final SIGKILL still reaches every process left in the cgroup, so nothing
          # outlives the unit. `process` would leak agents on a crash; `none` too.
          KillMode = "mixed";
          # One hung agent takes 180 s + 10 s to stop; the margin covers the drain.
          # The daemon stops agents one after another, so if several hang, systemd's
          # SIGKILL ends the rest.
          TimeoutStopSec = "210s";
          UMask = "0077";
          LoadCredential = lib.optionals tls [ "tls.crt:${cfg.tlsCert}" "tls.key:${cfg.tlsKey}" ];
        };
      };
    }

    (lib.mkIf (stateDirectory != null) {
      systemd.services.hive.serviceConfig = {
        StateDirectory = stateDirectory;
        StateDirectoryMode = "0700";
      };
    })

    (lib.mkIf (containers && stateDirectory == null) {
      systemd.tmpfiles.rules = [ "d ${cfg.stateDir} 0700 root root -" ];
    })

    (lib.mkIf (!containers) {
      # The process runtime: a dynamic user in a sandbox. The agents are its child
      # processes and inherit it, so the hardening below is what agents can bear;
      # deliberately not set: MemoryDenyWriteExecute (breaks JIT runtimes such as
      # node), SystemCallFilter and RestrictNamespaces (agents run arbitrary tools and
      # may sandbox themselves), ProtectControlGroups (makes /sys/fs/cgroup read-only,
      # defeating Delegate=).
      systemd.services.hive.serviceConfig = {
        DynamicUser = true;
        # The daemon may place each agent in a child cgroup of its own to apply
        # cpu.max / memory.max; delegation hands it that subtree.
        Delegate = true;
        ProtectSystem = "strict";
        ProtectHome = true;
        PrivateTmp = true;
        PrivateDevices = true;
        NoNewPrivileges = true;
        CapabilityBoundingSet = "";
        ProtectKernelTunables = true;
        ProtectKernelModules = true;
        ProtectKernelLogs = true;
        ProtectClock = true;
        ProtectHostname = true;
        LockPersonality = true;
        RestrictRealtime = true;
        RestrictSUIDSGID = true;
        RestrictAddressFamilies = [ "AF_UNIX" "AF_INET" "AF_INET6" "AF_NETLINK" ];
      };
    })

    (lib.mkIf (!containers && cfg.provider == "docker") {
      # The docker provider talks to the engine's socket, which the docker group may use
      # (enable virtualisation.docker yourself). Membership of that group is as good as
      # root on the host: choose the docker provider knowingly.
      systemd.services.hive.serviceConfig.SupplementaryGroups = [ "docker" ];
    })

    (lib.mkIf containers {
      # The nixos-container runtime: the daemon runs as root (it runs nixos-container,
      # writes container@<name>.service.d drop-ins and drives systemctl), unsandboxed
      # apart from NoNewPrivileges, because containers need the host's /etc, /nix and
      # /var/lib/nixos-containers writable. The containers are their own units
      # (container@<name>.service in machine.slice), not part of this service.
      boot.enableContainers = true;
      # Agent systems are built from a flake (`nixos-container create --flake`,
      # `nix build <flake>#nixosConfigurations.<name>.config.system.build.toplevel`).
      nix.settings.experimental-features = [ "nix-command" "flakes" ];
      systemd.services.hive = {
        path = [ config.nix.package pkgs.nixos-container config.systemd.package ];
        after = [ "nix-daemon.socket" ];
        wants = [ "nix-daemon.socket" ];
        serviceConfig = {
          User = "root";
          NoNewPrivileges = true;
        };
      };
    })
  ]);
}
