#!/bin/sh
# The hello agent: prints a greeting every few seconds, with a tiny harness that honours
# hive's graceful-stop fence. hive sets HIVE_AGENT (the agent's name) and HIVE_FENCE
# (the fence file); on SIGUSR1 the agent checkpoints and clears the fence, then hive
# stops it with SIGTERM.
name="${HIVE_AGENT:-hello}"
checkpoint() {
  echo "$name: checkpoint before stopping"
  rm -f "$HIVE_FENCE"
}
trap checkpoint USR1
trap 'echo "$name: bye"; exit 0' TERM
echo "$name: hello, built $(cat build-info.txt 2>/dev/null || echo 'without a build step')"
i=0
while true; do
  i=$((i + 1))
  if [ $((i % 50)) -eq 0 ]; then echo "$name: still here ($i)"; fi
  sleep 0.1
done
