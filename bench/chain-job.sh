#!/bin/sh
# bench/chain-job.sh HIVE N [independent]: an N-node Job of SetWanted nodes of one
# Offline agent, each after the previous one (or none after any), through a fresh
# `hive serve` in a temp dir. Prints the time from `kubectl create` until the Job is
# Done, the daemon's CPU time and the bytes it wrote (wchar: the WAL, redb, sockets)
# meanwhile, and its store commits since it started. Issue 28, item 4; see
# docs/benchmarks.md. Needs kubectl, jq and bc. SERVE_ARGS adds flags to `hive serve`
# (a build from a tarball needs --hive-rev).
set -eu
HIVE=$1 N=$2 SHAPE=${3:-chain}
S=$(mktemp -d)
"$HIVE" serve --listen 127.0.0.1:0 --state-dir "$S" --fleet-listen 127.0.0.1:0 \
  --agent-controller=false --log warn ${SERVE_ARGS:-} >"$S/out" 2>"$S/log" &
PID=$!
until grep -qs serving "$S/out"; do kill -0 "$PID" || { cat "$S/log"; exit 1; }; sleep 0.1; done
K="kubectl --kubeconfig $S/kubeconfig.yaml"
$K create -f - >/dev/null <<EOF
{"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": "a"},
 "spec": {"wanted": "Offline", "config": {"repo": "/nonexistent", "rev": "v1"},
          "runtime": {"type": "process", "process": {"command": ["true"]}}}}
EOF
jq -n --argjson n "$N" --arg shape "$SHAPE" '{apiVersion: "hive.dev/v1", kind: "Job",
  metadata: {name: "chain"}, spec: {template: "Reconcile", nodes: [range($n) as $i |
  {id: "n\($i)", kind: "SetWanted", agent: "a", params: {wanted: "Offline"}}
  + (if $i > 0 and $shape == "chain" then {deps: [{node: "n\($i - 1)"}]} else {} end)]}}' >"$S/job.json"
cpu() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
wrote() { awk '/^wchar/ {print $2}' "/proc/$PID/io"; }
c0=$(cpu) w0=$(wrote) t0=$(date +%s.%N)
$K create -f "$S/job.json" >/dev/null
$K wait --for=jsonpath='{.status.phase}'=Done job/chain --timeout=1h >/dev/null
t1=$(date +%s.%N) c1=$(cpu) w1=$(wrote)
commits=$($K get --raw /metrics | awk '/^hive_store_commit_batch_size_count/ {print $2}')
ms=$(( (c1 - c0) * 1000 / $(getconf CLK_TCK) ))
echo "$N $SHAPE: $(printf %.2f "$(echo "$t1 - $t0" | bc)") s, $ms ms CPU," \
  "$(( (w1 - w0) / 1000000 )) MB written, $commits commits"
kill "$PID"; wait "$PID" 2>/dev/null || true
rm -rf "$S"
