#!/usr/bin/env bash
# The etcd side of issue 13's side-by-side table: starts Debian's etcd (one member, on
# 127.0.0.1, plaintext, its data in a new temporary directory), runs the load generator
# against it, then stops etcd and removes the directory (also on error and on Ctrl-C).
#
#   bench/etcd/run.sh                       # the issue's rows: puts at 1/16/64 clients for 5s, 1000x10 and 100x1000 watches
#   bench/etcd/run.sh --duration 2s --watch-duration 2s   # a short smoke run
#   bench/etcd/run.sh --markdown            # also the rows as Markdown
#
# Every argument goes to the load generator (`run.sh --help` lists them). Needs
# `etcd` (Debian: etcd-server), python3 (to ask etcd's JSON gateway whether it is up) and, to build the generator, `protoc` with the well-known types (protobuf-compiler, libprotobuf-dev).
# ETCD_DIR sets the parent of the data directory (its disk is the one fsynced; default:
# the system's temporary directory), like `hive bench --dir`.
#
# etcd's restart with a million keys as large as hive's Agents (issue 34's side by side):
#   ETCD_RESTART=1 bench/etcd/run.sh --fill 1000000 --value-bytes 724
#
# Hive on etcd against raw etcd, on the same etcd in the same run (issue 30's measure):
#   HIVE_BIN=target/release/hive bench/etcd/run.sh --creates --no-watches --markdown
# first runs `$HIVE_BIN bench --phases creates` with the daemon on this etcd (`hive serve
# --store etcd://…/hive-bench`; HIVE_BENCH_ARGS adds flags, e.g. "--clients 1,16,64
# --duration 5s"), then sizes the value of one object hive stored there, and runs the
# generator's puts with values of that size (--creates: each put the create transaction
# hive sends) after it, so both sides write the same bytes to the same etcd. --gateway runs
# each level again through etcd's JSON gateway, the way hive's store sends it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

for tool in etcd protoc cargo python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "run.sh: $tool is missing (apt-get install etcd-server protobuf-compiler libprotobuf-dev; cargo from rustup)" >&2
    exit 1
  fi
done

case " $* " in
  *" --help "*|*" -h "*)
    cargo run --quiet --release --manifest-path "$here/Cargo.toml" -- --help
    exit 0 ;;
esac

cargo build --quiet --release --manifest-path "$here/Cargo.toml"
generator="${CARGO_TARGET_DIR:-$here/target}/release/hive-bench-etcd"

dir="$(mktemp -d "${ETCD_DIR:-${TMPDIR:-/tmp}}/hive-bench-etcd.XXXXXX")"
etcd_pid=""
cleanup() {
  if [ -n "$etcd_pid" ] && kill -0 "$etcd_pid" 2>/dev/null; then
    kill -TERM "$etcd_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$etcd_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$etcd_pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Free ports on 127.0.0.1 for the client and peer URLs.
read -r client_port peer_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
endpoint="http://127.0.0.1:$client_port"

# The defaults of etcd 3.4 otherwise: fsync on every commit (--unsafe-no-fsync is off),
# 512-byte values fit its request limit; quotas and snapshots as shipped.
start_etcd() {
  etcd --name bench --data-dir "$dir/data" \
    --listen-client-urls "$endpoint" --advertise-client-urls "$endpoint" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "bench=http://127.0.0.1:$peer_port" \
    --log-level warn >>"$dir/etcd.log" 2>&1 &
  etcd_pid=$!
}

# Waits until etcd answers /health (etcd's JSON gateway: etcdctl is another package).
wait_healthy() {
  for _ in $(seq 3000); do
    if python3 -c 'import json, sys, urllib.request
sys.exit(0 if json.load(urllib.request.urlopen(sys.argv[1] + "/health", timeout=1)).get("health") == "true" else 1)' "$endpoint" 2>/dev/null; then return 0; fi
    if ! kill -0 "$etcd_pid" 2>/dev/null; then
      echo "run.sh: etcd exited; its log:" >&2; cat "$dir/etcd.log" >&2; exit 1
    fi
    sleep 0.01
  done
  echo "run.sh: etcd did not become healthy" >&2
  exit 1
}

start_etcd
wait_healthy
echo "run.sh: etcd $(etcd --version | head -1 | awk '{print $3}') pid $etcd_pid at $endpoint, data in $dir" >&2

size=()
if [ -n "${HIVE_BIN:-}" ]; then
  [ -x "$HIVE_BIN" ] || { echo "run.sh: HIVE_BIN=$HIVE_BIN is not an executable" >&2; exit 1; }
  # shellcheck disable=SC2086 # HIVE_BENCH_ARGS is a list of flags
  "$HIVE_BIN" bench --phases creates ${HIVE_BENCH_ARGS:-} \
    --serve-arg=--store --serve-arg="etcd://127.0.0.1:$client_port/hive-bench"
  # The bytes of one Agent as hive stored it: the generator's values are made as large.
  bytes=$(python3 -c 'import base64, json, sys, urllib.request
b64 = lambda b: base64.b64encode(b).decode()
body = json.dumps({"key": b64(b"/hive-bench/"), "range_end": b64(b"/hive-bench0"), "limit": 200}).encode()
kvs = json.load(urllib.request.urlopen(sys.argv[1] + "/v3/kv/range", body, timeout=10)).get("kvs", [])
values = [base64.b64decode(kv["value"]) for kv in kvs]
print(next((len(v) for v in values if b"\"kind\":\"Agent\"" in v), 0))' "$endpoint")
  [ "$bytes" -gt 0 ] || { echo "run.sh: found no Agent hive stored under /hive-bench/" >&2; exit 1; }
  echo "run.sh: hive stored each Agent in $bytes bytes; the generator's values are as large" >&2
  size=(--value-bytes "$bytes")
fi

"$generator" --endpoint "$endpoint" --etcd-pid "$etcd_pid" "${size[@]}" "$@"

# ETCD_RESTART=1 (after `--fill N`): a graceful restart on the same data, timed from the
# new process's spawn to /health answering, and to a count of every key under
# /bench/fill/ (a range read with count_only) answering.
if [ -n "${ETCD_RESTART:-}" ]; then
  kill -TERM "$etcd_pid"
  for _ in $(seq 600); do kill -0 "$etcd_pid" 2>/dev/null || break; sleep 0.1; done
  spawned=$(date +%s.%N)
  start_etcd
  wait_healthy
  healthy=$(date +%s.%N)
  count=$(python3 -c 'import base64, json, sys, urllib.request
b64 = lambda b: base64.b64encode(b).decode()
body = json.dumps({"key": b64(b"/bench/fill/"), "range_end": b64(b"/bench/fill0"), "count_only": True}).encode()
print(json.load(urllib.request.urlopen(sys.argv[1] + "/v3/kv/range", body, timeout=60)).get("count", 0))' "$endpoint")
  counted=$(date +%s.%N)
  awk -v s="$spawned" -v h="$healthy" -v c="$counted" -v n="$count" 'BEGIN {
    printf "etcd restart with %s keys: healthy after %.2f s, the count answered after %.2f s\n", n, h - s, c - s }'
fi
