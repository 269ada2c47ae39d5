# `hive.lib.agentSystem { name, config, system ? "x86_64-linux", modules ? [ ] }`: the
# NixOS system of agent `name`'s container, as the meta flake calls it. `config` is the
# agent's config input (its repository at the locked commit): a flake whose
# `nixosModules.default` (or `nixosModules.agent`) shapes the container, or a plain
# source tree with an `agent.nix` module, or neither (then the harness runs its
# `run.sh`). `deploy/agent.nix` is always included: a container (`boot.isContainer`)
# whose `hive-harness.service` runs the agent and honours the graceful-stop fence.
{ nixpkgs, hive }:
{ name, config, system ? "x86_64-linux", modules ? [ ] }:
let
  fromFlake = config.nixosModules.default or config.nixosModules.agent or null;
  fromSource = "${config}/agent.nix";
  agentModules =
    if fromFlake != null then [ fromFlake ]
    else if builtins.pathExists fromSource then [ (import fromSource) ]
    else [ ];
in
nixpkgs.lib.nixosSystem {
  inherit system;
  specialArgs = {
    hiveAgent = { inherit name; source = config; };
  };
  modules = [ hive.nixosModules.agent ] ++ agentModules ++ modules;
}
