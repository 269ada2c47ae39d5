#!/usr/bin/env bash
# Assembles a minimal root filesystem holding the hive binary and the shared libraries
# it links, for `docker build -f deploy/Containerfile` or `docker import`.
# Usage: deploy/rootfs.sh PATH/TO/hive OUT_DIR
set -euo pipefail
bin="${1:?usage: rootfs.sh PATH/TO/hive OUT_DIR}"
out="${2:?usage: rootfs.sh PATH/TO/hive OUT_DIR}"
mkdir -p "$out/usr/local/bin" "$out/var/lib/hive" "$out/tmp"
install -m 0755 "$bin" "$out/usr/local/bin/hive"
# Copy every library the dynamic loader resolves, plus the loader itself.
ldd "$bin" | awk '/=>/ { print $3 } /^\s*\/.*ld-linux/ { print $1 }' | sort -u | while read -r lib; do
  [ -n "$lib" ] && [ -e "$lib" ] || continue
  mkdir -p "$out$(dirname "$lib")"
  cp -L "$lib" "$out$lib"
done
echo "root filesystem ready in $out"
