# NixOS module for the hive daemon.
#   imports = [ ./deploy/hive.nix ];
#   services.hive = { enable = true; package = pkgs.callPackage ./package.nix {}; };
{ config, lib, pkgs, ... }:
let
  cfg = config.services.hive;
in {
  options.services.hive = {
    enable = lib.mkEnableOption "the hive control plane";
    package = lib.mkOption {
      type = lib.types.package;
      description = "The package providing bin/hive.";
    };
    listen = lib.mkOption {
      type = lib.types.str;
      default = "127.0.0.1:7443";
      description = "Address the HTTPS API listens on.";
    };
    stateDir = lib.mkOption {
      type = lib.types.str;
      default = "/var/lib/hive";
      description = "Database, TLS material, tokens and the generated kubeconfig.";
    };
    extraArgs = lib.mkOption {
      type = lib.types.listOf lib.types.str;
      default = [ ];
      description = "Extra arguments for `hive serve`.";
    };
  };

  config = lib.mkIf cfg.enable {
    systemd.services.hive = {
      description = "hive control plane";
      wantedBy = [ "multi-user.target" ];
      after = [ "network-online.target" ];
      wants = [ "network-online.target" ];
      serviceConfig = {
        ExecStart = lib.escapeShellArgs ([ "${cfg.package}/bin/hive" "serve" "--state-dir" cfg.stateDir "--listen" cfg.listen ] ++ cfg.extraArgs);
        StateDirectory = "hive";
        StateDirectoryMode = "0700";
        Restart = "on-failure";
        NoNewPrivileges = true;
      };
    };
  };
}
