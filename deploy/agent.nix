# One agent's NixOS container, as `lib.agentSystem` builds it: `hiveAgent.name` and
# `hiveAgent.source` (the config input at its locked commit) come from specialArgs.
# The runtime's contract with the container (src/runtime/nixos): the unit
# `hive-harness.service` runs the agent; the fence is `/var/lib/hive/fence` (on the
# container's disk, not the /run tmpfs), which the harness deletes after its
# stop-checkpoint turn; it is kicked with SIGUSR1 only when its main process catches or
# ignores it (else it must notice the file itself, or is stopped when the drain runs
# out); permissions are read from `/etc/hive`.
{ lib, pkgs, hiveAgent, ... }:
{
  boot.isContainer = true;
  networking.hostName = lib.mkDefault "h-${hiveAgent.name}";
  networking.useDHCP = false;
  system.stateVersion = lib.mkDefault "24.11";

  systemd.tmpfiles.rules = [
    "d /var/lib/hive 0755 root root -"
    "d /etc/hive 0755 root root -"
  ];

  systemd.services.hive-harness = {
    description = "hive agent ${hiveAgent.name}";
    wantedBy = [ "multi-user.target" ];
    after = [ "network.target" ];
    path = [ pkgs.bash pkgs.coreutils ];
    environment = {
      HIVE_AGENT = hiveAgent.name;
      HIVE_FENCE = "/var/lib/hive/fence";
      HIVE_PERMISSIONS = "/etc/hive";
    };
    serviceConfig = {
      ExecStart = lib.mkDefault "${pkgs.bash}/bin/sh ${hiveAgent.source}/run.sh";
      WorkingDirectory = "/var/lib/hive";
      Restart = "on-failure";
      # SIGUSR1 is the fence kick, never a stop.
      KillSignal = "SIGTERM";
    };
  };
}
