#!/bin/sh
# Assembles the root filesystem of the hive container image: the binary as
# /usr/local/bin/hive, git (the meta repo and config mirrors are git repositories: the
# binary at its host path and its exec-path helpers), every shared library they link
# (as `ldd` resolves them, at the same paths), the dynamic loader, and the empty
# directories the daemon uses. No CA certificates, no shell: the daemon serves its own
# TLS.
#
#   cargo build --release
#   deploy/rootfs.sh target/release/hive /tmp/hive-rootfs
#   docker build -f deploy/Containerfile -t hive:dev /tmp/hive-rootfs
#
# Usage: deploy/rootfs.sh PATH/TO/hive OUT_DIR   (OUT_DIR must be empty or absent)
# POSIX sh; needs ldd (glibc) and awk. A static binary (musl) gets no libraries.
set -eu
usage="usage: rootfs.sh PATH/TO/hive OUT_DIR"
bin="${1:?$usage}"
out="${2:?$usage}"
[ -x "$bin" ] || { echo "rootfs.sh: $bin is not an executable file" >&2; exit 1; }
if [ -d "$out" ] && [ -n "$(ls -A "$out")" ]; then
  echo "rootfs.sh: $out is not empty" >&2
  exit 1
fi

mkdir -p "$out/usr/local/bin" "$out/var/lib/hive" "$out/tmp"
chmod 1777 "$out/tmp"
chmod 0700 "$out/var/lib/hive"
cp "$bin" "$out/usr/local/bin/hive"
chmod 0755 "$out/usr/local/bin/hive"

# ldd prints `name => /path (addr)` for libraries and `/path/ld-linux… (addr)` for the
# loader (at the path the binary's PT_INTERP names); `linux-vdso.so.1 (addr)` has no
# file. ldd fails for a static binary or a script: then there is nothing to copy.
copy_libs() {
  libs=$(ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)
  for lib in $libs; do
    [ -e "$lib" ] || { echo "rootfs.sh: ldd names $lib, which does not exist" >&2; exit 1; }
    [ -e "$out$lib" ] && continue
    mkdir -p "$out$(dirname "$lib")"
    cp -L "$lib" "$out$lib"
  done
}
copy_libs "$bin"

# git, at the path it was built for (its exec-path is compiled in), with its helpers.
git=$(command -v git) || { echo "rootfs.sh: git is required (the daemon's meta repo is a git repository)" >&2; exit 1; }
exec_path=$(git --exec-path)
mkdir -p "$out$(dirname "$git")" "$out$exec_path"
cp -L "$git" "$out$git"
copy_libs "$git"
# Its builtins are hard links to one binary: kept links (GNU cp's --preserve=links), or
# the image would hold ~140 copies of git. A cp without that option copies them.
cp -RL --preserve=links "$exec_path/." "$out$exec_path/" 2>/dev/null ||
  cp -RL "$exec_path/." "$out$exec_path/"
for helper in "$out$exec_path"/*; do
  [ -f "$helper" ] && copy_libs "$helper"
done

echo "root filesystem ready in $out"
