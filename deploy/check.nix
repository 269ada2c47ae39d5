# Offline check of hive.nix: not a deployment file.
#
#   nix-instantiate --eval --strict --json deploy/check.nix
#
# nixpkgs is not needed (nor fetched): a stub `lib` provides just the functions
# hive.nix uses, with nixpkgs' semantics for them, and a small evaluator stands in for
# the NixOS module system: option defaults, type checks, unknown options, mkIf/mkMerge,
# list concatenation and conflicting definitions. Each scenario below yields the
# rendered service (ExecStart, serviceConfig and the unit file text as NixOS would
# write it), the warnings, the failed assertions and the other host settings.
# `tests/it/deploy.rs` runs this and checks the result against `hive serve --help`
# and `systemd-analyze verify`.
#
# What it cannot catch: the real module system's finer points (priorities, option
# types it does not stub) and nixpkgs options that do not exist — it does not know
# which NixOS options exist beyond the ones hive.nix sets.
let
  inherit (builtins) attrNames concatStringsSep filter foldl' isAttrs isBool isList mapAttrs;

  isDerivation = x: isAttrs x && (x.type or null) == "derivation";
  drv = name: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
  };

  lib = rec {
    mkOption = attrs: attrs // { _type = "option"; };
    mkEnableOption = name: mkOption {
      type = types.bool;
      default = false;
      example = true;
      description = "Whether to enable ${name}.";
    };
    mkIf = condition: content: { _type = "if"; inherit condition content; };
    mkMerge = contents: { _type = "merge"; inherit contents; };
    optional = cond: x: if cond then [ x ] else [ ];
    optionals = cond: xs: if cond then xs else [ ];
    hasPrefix = prefix: s: builtins.substring 0 (builtins.stringLength prefix) s == prefix;
    removePrefix = prefix: s:
      if hasPrefix prefix s
      then builtins.substring (builtins.stringLength prefix) (builtins.stringLength s) s
      else s;
    # As nixpkgs: safe strings stay bare, others are single-quoted.
    escapeShellArg = arg:
      let s = toString arg; in
      if builtins.match "[[:alnum:],._+:@%/-]+" s == null
      then "'${builtins.replaceStrings [ "'" ] [ "'\\''" ] s}'"
      else s;
    escapeShellArgs = args: concatStringsSep " " (map escapeShellArg args);
    literalExpression = text: { _type = "literalExpression"; inherit text; };
    types = rec {
      mk = name: check: { inherit name check; };
      bool = mk "bool" isBool;
      str = mk "str" builtins.isString;
      path = mk "path" (x: builtins.isPath x || isDerivation x || (builtins.isString x && hasPrefix "/" x));
      package = mk "package" isDerivation;
      enum = values: mk "one of ${concatStringsSep ", " values}" (x: builtins.elem x values);
      nullOr = t: mk "null or ${t.name}" (x: x == null || t.check x);
      listOf = t: mk "list of ${t.name}" (x: isList x && builtins.all t.check x);
      ints.positive = mk "positive integer" (x: builtins.isInt x && x > 0);
      ints.unsigned = mk "unsigned integer" (x: builtins.isInt x && x >= 0);
    };
  };

  # --- the module-system stand-in -------------------------------------------------
  absent = { _type = "absent"; };
  isAbsent = v: isAttrs v && (v._type or null) == "absent";
  dropAbsent = set: removeAttrs set (filter (n: isAbsent set.${n}) (attrNames set));

  resolve = v:
    if !(isAttrs v) || isDerivation v then v
    else if (v._type or null) == "if" then (if v.condition then resolve v.content else absent)
    else if (v._type or null) == "merge" then
      foldl' (merge "") { } (filter (x: !(isAbsent x)) (map resolve v.contents))
    else dropAbsent (mapAttrs (_: resolve) v);

  merge = at: a: b: a // mapAttrs (n: bv:
    if !(a ? ${n}) then bv
    else
      let av = a.${n}; in
      if isList av && isList bv then av ++ bv
      else if isAttrs av && isAttrs bv && !(isDerivation av) && !(isDerivation bv) then merge "${at}${n}." av bv
      else if av == bv then av
      else throw "conflicting definitions of ${at}${n}") b;

  evalHive = { settings, system ? "x86_64-linux" }:
    let
      pkgs = {
        stdenv.hostPlatform = { inherit system; isx86_64 = system == "x86_64-linux"; };
        git = drv "git";
        nixos-container = drv "nixos-container";
      };
      config = {
        services.hive = cfg;
        nix.package = drv "nix";
        systemd.package = drv "systemd";
      };
      module = import ./hive.nix { inherit config lib pkgs; };
      decls = module.options.services.hive;
      unknown = filter (n: !(decls ? ${n})) (attrNames settings);
      cfg = mapAttrs (name: opt:
        let
          value =
            if settings ? ${name} then settings.${name}
            else if opt ? default then opt.default
            else throw "services.hive.${name} is used but not defined";
        in
        if opt.type.check value then value
        else throw "services.hive.${name}: not a ${opt.type.name}") decls;
      resolved =
        if unknown != [ ] then throw "unknown options: services.hive.${concatStringsSep ", " unknown}"
        else let r = resolve module.config; in if isAbsent r then { } else r;
      service = resolved.systemd.services.hive or null;
      names = map (d: d.name);
    in {
      options = mapAttrs (_: opt: {
        type = opt.type.name;
        hasDefault = opt ? default;
        default = if opt ? default then opt.default else null;
        description = opt.description or "";
      }) decls;
      enabled = service != null;
      failedAssertions = map (a: a.message) (filter (a: !a.assertion) (resolved.assertions or [ ]));
      warnings = resolved.warnings or [ ];
      extraDependencies = names (resolved.system.extraDependencies or [ ]);
      enableContainers = resolved.boot.enableContainers or false;
      experimentalFeatures = resolved.nix.settings.experimental-features or [ ];
      tmpfiles = resolved.systemd.tmpfiles.rules or [ ];
    } // (if service == null then { } else {
      execStart = service.serviceConfig.ExecStart;
      serviceConfig = service.serviceConfig;
      path = names service.path;
      unit = renderUnit service;
    });

  # The unit file as NixOS writes it: lists become repeated keys, booleans true/false.
  renderValue = v: if isBool v then (if v then "true" else "false") else toString v;
  renderKey = key: value:
    if isList value then map (x: "${key}=${renderValue x}") value
    else [ "${key}=${renderValue value}" ];
  renderUnit = s: concatStringsSep "\n" ([
    "[Unit]"
    "Description=${s.description}"
    "After=${concatStringsSep " " s.after}"
    "Wants=${concatStringsSep " " s.wants}"
    "StartLimitIntervalSec=${toString s.startLimitIntervalSec}"
    "StartLimitBurst=${toString s.startLimitBurst}"
    ""
    "[Service]"
    "Environment=\"PATH=${concatStringsSep ":" (map (p: "${p}/bin") s.path)}\""
  ] ++ builtins.concatLists (map (k: renderKey k s.serviceConfig.${k}) (attrNames s.serviceConfig)) ++ [
    ""
    "[Install]"
    "WantedBy=${concatStringsSep " " s.wantedBy}"
    ""
  ]);

  hive = drv "hive";
in {
  # What `services.hive.enable = true;` alone gives.
  default = evalHive { settings = { enable = true; package = hive; }; };

  # Nothing at all when not enabled.
  disabled = evalHive { settings = { package = hive; }; };

  # Every option away from its default.
  containers = evalHive {
    settings = {
      enable = true;
      package = hive;
      listen = "0.0.0.0:7443";
      stateDir = "/srv/hive";
      buildSlots = 4;
      buildRetries = 3;
      jobHistoryMaxAge = "24h";
      runtime = "nixos-container";
      agentCpuQuota = "400%";
      agentMemoryMax = "8G";
      provider = "docker";
      fleetListen = "0.0.0.0:7946";
      preBuildAgentTemplates = true;
      agentTemplates = [ (drv "agent-base-toplevel") (drv "manager-toplevel") ];
      tlsCert = "/run/keys/hive.crt";
      tlsKey = "/run/keys/hive.key";
      hiveFlake = "github:hive-dev/hive";
      hiveRev = "0123456789abcdef0123456789abcdef01234567";
      logFormat = "json";
      auditLogPath = "/srv/hive/audit/api.log";
      auditLogMaxSize = "1G";
      auditLogMaxBackups = 0;
      auditReads = true;
      metrics = false;
      metricsListen = "127.0.0.1:9464";
      extraArgs = [ "--log" "hive=debug" ];
    };
  };

  # No audit log at all.
  noAuditLog = evalHive { settings = { enable = true; package = hive; auditLog = false; }; };
  # A path for a log that is off: a failed assertion (the flags conflict).
  auditLogPathWithoutLog = evalHive {
    settings = { enable = true; package = hive; auditLog = false; auditLogPath = "/var/lib/hive/a.log"; };
  };

  # preBuildAgentTemplates on a non-x86_64 host with no templates: two warnings.
  aarch64 = evalHive {
    system = "aarch64-linux";
    settings = { enable = true; package = hive; preBuildAgentTemplates = true; };
  };

  # Misconfigurations the assertions catch.
  halfTls = evalHive { settings = { enable = true; package = hive; tlsCert = "/run/keys/hive.crt"; }; };
  processOutsideVarLib = evalHive { settings = { enable = true; package = hive; stateDir = "/srv/hive"; }; };
  tooManyRetries = evalHive { settings = { enable = true; package = hive; buildRetries = 21; }; };

  # The docker provider with the process runtime: the socket's group; loopback warned.
  dockerProvider = evalHive { settings = { enable = true; package = hive; provider = "docker"; fleetListen = "0.0.0.0:7946"; }; };
  dockerLoopback = evalHive { settings = { enable = true; package = hive; provider = "docker"; }; };

  # The stand-in itself rejects what the module system rejects (false = rejected).
  rejects = {
    zeroBuildSlots = (builtins.tryEval (builtins.deepSeq
      (evalHive { settings = { enable = true; package = hive; buildSlots = 0; }; }).execStart true)).success;
    unknownRuntime = (builtins.tryEval (builtins.deepSeq
      (evalHive { settings = { enable = true; package = hive; runtime = "docker"; }; }).execStart true)).success;
    unknownLogFormat = (builtins.tryEval (builtins.deepSeq
      (evalHive { settings = { enable = true; package = hive; logFormat = "xml"; }; }).execStart true)).success;
    negativeAuditBackups = (builtins.tryEval (builtins.deepSeq
      (evalHive { settings = { enable = true; package = hive; auditLogMaxBackups = -1; }; }).execStart true)).success;
    unknownProvider = (builtins.tryEval (builtins.deepSeq
      (evalHive { settings = { enable = true; package = hive; provider = "aws"; }; }).execStart true)).success;
    unknownOption = (builtins.tryEval (builtins.deepSeq
      (evalHive { settings = { enable = true; package = hive; listenAddress = "x"; }; }).execStart true)).success;
    missingPackage = (builtins.tryEval (builtins.deepSeq
      (evalHive { settings = { enable = true; }; }).execStart true)).success;
  };
}
