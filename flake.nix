# The hive base flake: what every agent's NixOS container is built from. The meta flake
# hive renders (`<state-dir>/meta/flake.nix`) has this repository as its `hive` input
# (`hive serve --hive-flake`, default: the checkout the binary was built from, locked at
# the commit it was built from, `--hive-rev`) and builds each agent as
#
#   nixosConfigurations.<name> = hive.lib.agentSystem { name = "<name>"; config = inputs."agent-<name>"; };
#
# `deploy/check-flake.nix` evaluates that offline (nixpkgs stubbed), from
# `tests/it/deploy.rs`.
{
  description = "hive: the base of every agent's NixOS container (lib.agentSystem) and the hive NixOS module";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.11";

  outputs = { self, nixpkgs, ... }: {
    lib.agentSystem = import ./deploy/agent-system.nix { inherit nixpkgs; hive = self; };

    nixosModules = {
      # The daemon: services.hive (deploy/hive.nix).
      hive = import ./deploy/hive.nix;
      # One agent's container (lib.agentSystem adds it).
      agent = import ./deploy/agent.nix;
    };
  };
}
