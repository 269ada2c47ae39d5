# Offline check of the hive base flake as the meta flake consumes it: not a deployment file.
#
#   nix-instantiate --eval --strict --json deploy/check-flake.nix \
#     --arg meta <state-dir>/meta/flake.nix --arg agents '[ "alpha" ]'
#
# Imports the rendered meta flake and this repository's `flake.nix` and calls their
# `outputs` by hand, as nix would after fetching the locked inputs: `hive` is this
# repository, each `agent-<name>` a config source (one with a flake module, one with an
# `agent.nix`, one with neither), and nixpkgs a stub whose `lib.nixosSystem` runs the
# modules it is given through a small stand-in of the module system (attribute sets
# merged, lib.mkDefault / lib.mkForce honoured) and yields a nixosSystem-shaped value:
# `config.system.build.toplevel` a derivation-shaped set, `config` the merged settings.
# `tests/it/deploy.rs` checks the result.
{ meta ? null, agents ? [ "alpha" ] }:
let
  inherit (builtins) attrNames foldl' isAttrs mapAttrs;

  drv = name: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
  };

  lib = {
    mkDefault = content: { _type = "override"; priority = 1000; inherit content; };
    mkForce = content: { _type = "override"; priority = 50; inherit content; };
    mkIf = condition: content: { _type = "if"; inherit condition content; };
  };

  # Definitions merged as the module system would for the cases used here: attribute
  # sets recursively, lists concatenated, the lower priority number winning, equal
  # values allowed, anything else a conflict.
  prio = v: if isAttrs v && (v._type or null) == "override" then v.priority else 100;
  strip = v: if isAttrs v && (v._type or null) == "override" then v.content else v;
  merge = at: a: b: a // mapAttrs (n: bv:
    if !(a ? ${n}) then bv
    else
      let av = a.${n}; in
      if prio av != prio bv then (if prio av < prio bv then av else bv)
      else if builtins.isList (strip av) && builtins.isList (strip bv) then strip av ++ strip bv
      else if isAttrs av && isAttrs bv && !(av ? _type) && !(bv ? _type) && (av.type or null) != "derivation"
      then merge "${at}${n}." av bv
      else if strip av == strip bv then av
      else throw "conflicting definitions of ${at}${n}") b;
  resolve = v:
    if isAttrs v && (v._type or null) == "override" then resolve v.content
    else if isAttrs v && (v._type or null) == "if" then (if v.condition then resolve v.content else null)
    else if isAttrs v && (v.type or null) != "derivation" then mapAttrs (_: resolve) v
    else v;

  pkgs = { bash = drv "bash"; coreutils = drv "coreutils"; };

  nixpkgs = {
    lib.nixosSystem = { system, modules, specialArgs ? { } }:
      let
        call = m: if builtins.isFunction m then m ({ inherit lib pkgs; config = evaluated; } // specialArgs) else m;
        definitions = map (m: let r = call m; in r.config or (removeAttrs r [ "imports" "options" ])) modules;
        evaluated = resolve (foldl' (merge "") { } definitions);
      in {
        _type = "nixosSystem";
        inherit system;
        config = evaluated // {
          system = (evaluated.system or { }) // {
            build.toplevel = drv "nixos-system-${evaluated.networking.hostName}";
          };
        };
      };
  };

  hive = import ../flake.nix;
  hiveOutputs = hive.outputs { self = hiveOutputs; inherit nixpkgs; };

  # Config sources: a flake with a module, a tree with agent.nix, and a bare one.
  sources = {
    flake = {
      outPath = "/srv/agents/flake";
      nixosModules.default = { lib, ... }: {
        systemd.services.hive-harness.serviceConfig.ExecStart = lib.mkForce "/run/current-system/sw/bin/agent";
      };
    };
    bare = { outPath = "/srv/agents/bare"; };
  };
  source = i: if i == 0 then sources.flake else sources.bare;

  metaFlake = if meta == null then null else import meta;
  agentInputs = builtins.listToAttrs (builtins.genList (i: {
    name = "agent-${builtins.elemAt agents i}";
    value = source i;
  }) (builtins.length agents));
  metaOutputs = metaFlake.outputs ({ self = metaOutputs; hive = hiveOutputs; } // agentInputs);

  view = name: system: {
    type = system._type;
    system = system.system;
    hostName = system.config.networking.hostName;
    isContainer = system.config.boot.isContainer;
    toplevel = system.config.system.build.toplevel.type;
    harness = system.config.systemd.services.hive-harness.serviceConfig.ExecStart;
    fence = system.config.systemd.services.hive-harness.environment.HIVE_FENCE;
    tmpfiles = system.config.systemd.tmpfiles.rules;
  };
in {
  hiveInputs = attrNames (hive.inputs or { });
  hasAgentSystem = hiveOutputs ? lib.agentSystem;
  direct = view "direct" (hiveOutputs.lib.agentSystem { name = "solo"; config = sources.bare; });
  metaHiveUrl = if metaFlake == null then null else metaFlake.inputs.hive.url;
  meta = if metaFlake == null then { } else mapAttrs view metaOutputs.nixosConfigurations;
}
