#!/bin/sh
# Three etcd members and three hive replicas on a private Docker network: the
# "three hosts" example of deploy/ha.md on one machine. Docker CLI only (no compose).
#
#   deploy/ha-docker.sh up       # network, etcd members, replicas; waits until one leads
#   deploy/ha-docker.sh status   # each replica's container state and who it says leads
#   deploy/ha-docker.sh down     # removes the containers, their volumes and the network
#
# Environment (defaults in brackets):
#   NAME        prefix of every container and volume, and the network's name [hive-ha]
#   HIVE_IMAGE  the hive image, built as deploy/Containerfile says [hive:dev]
#   ETCD_IMAGE  an etcd 3.4+ image with `etcd` on its PATH
#               [gcr.io/etcd-development/etcd:v3.5.17]
#   PORT_BASE   replica N's API is published on 127.0.0.1:PORT_BASE+N-1 [7443]
#
# Containers: $NAME-etcd-1..3 (client port 2379, peer port 2380, data in the volume of
# the same name) and $NAME-1..3 (`hive serve --store etcd://…`, state in the volume of
# the same name). Only the replicas' APIs leave the network, and only on loopback: etcd
# holds the CA's key and the token hashes, so it stays on the private network.
set -eu

NAME="${NAME:-hive-ha}"
HIVE_IMAGE="${HIVE_IMAGE:-hive:dev}"
ETCD_IMAGE="${ETCD_IMAGE:-gcr.io/etcd-development/etcd:v3.5.17}"
PORT_BASE="${PORT_BASE:-7443}"
WAIT=120 # seconds `up` waits for the etcd cluster, then again for a leader

usage() {
  sed -n '2,/^set -eu/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

die() {
  echo "ha-docker.sh: $*" >&2
  exit 1
}

members() { echo "$NAME-etcd-1 $NAME-etcd-2 $NAME-etcd-3"; }
replicas() { echo "$NAME-1 $NAME-2 $NAME-3"; }
# A container's state (running, exited, restarting …), or "absent".
state() { docker inspect -f '{{.State.Status}}' "$1" 2>/dev/null | grep . || echo absent; }

# Waits until every container in $2… has logged the text $1; fails naming the ones
# that have not after $WAIT seconds.
wait_for_logs() {
  text="$1"
  shift
  waited=0
  while :; do
    missing=""
    for c in "$@"; do
      docker logs "$c" 2>&1 | grep -q "$text" || missing="$missing $c"
    done
    [ -z "$missing" ] && return 0
    [ "$waited" -ge "$WAIT" ] && die "after ${WAIT}s,$missing have not logged \"$text\" (docker logs NAME; down removes everything)"
    sleep 1
    waited=$((waited + 1))
  done
}

# The replica whose log says it leads now (its last leadership line is `hive: leading`,
# and it is running), or nothing.
leader() {
  for c in $(replicas); do
    [ "$(state "$c")" = running ] || continue
    last=$(docker logs "$c" 2>&1 | grep -E '^hive: (leading|following)' | tail -n 1)
    case "$last" in "hive: leading"*) echo "$c" && return 0 ;; esac
  done
}

up() {
  docker image inspect "$HIVE_IMAGE" >/dev/null 2>&1 ||
    die "no image $HIVE_IMAGE: build it (or set HIVE_IMAGE):
  cargo build --release
  deploy/rootfs.sh target/release/hive /tmp/hive-rootfs
  docker build -f deploy/Containerfile -t $HIVE_IMAGE /tmp/hive-rootfs"
  docker image inspect "$ETCD_IMAGE" >/dev/null 2>&1 || docker pull "$ETCD_IMAGE" ||
    die "no image $ETCD_IMAGE and it cannot be pulled: set ETCD_IMAGE to an etcd 3.4+ image"
  if docker network inspect "$NAME" >/dev/null 2>&1; then
    die "network $NAME exists: it is up already (status shows it; down removes it)"
  fi
  docker network create "$NAME" >/dev/null

  cluster=""
  for m in $(members); do cluster="${cluster:+$cluster,}$m=http://$m:2380"; done
  for m in $(members); do
    # The data dir is a directory inside the volume, so etcd creates it 0700.
    docker run -d --name "$m" --hostname "$m" --network "$NAME" --restart unless-stopped \
      -v "$m:/var/lib/etcd" "$ETCD_IMAGE" \
      etcd --name "$m" --data-dir /var/lib/etcd/data \
      --listen-client-urls http://0.0.0.0:2379 --advertise-client-urls "http://$m:2379" \
      --listen-peer-urls http://0.0.0.0:2380 --initial-advertise-peer-urls "http://$m:2380" \
      --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$NAME" \
      >/dev/null
  done
  # A member says so once the cluster has a quorum and has taken it in.
  wait_for_logs "ready to serve client requests" $(members)
  echo "etcd: $(members) are up"

  store="etcd://$NAME-etcd-1:2379,$NAME-etcd-2:2379,$NAME-etcd-3:2379"
  n=1
  for r in $(replicas); do
    # The host name is in the replica's name and in its serving certificate, beside
    # the advertised host other replicas forward to.
    docker run -d --name "$r" --hostname "$r" --network "$NAME" \
      --init --restart unless-stopped --stop-timeout 210 \
      -v "$r:/var/lib/hive" -p "127.0.0.1:$((PORT_BASE + n - 1)):7443" "$HIVE_IMAGE" \
      --store "$store" --advertise-url "https://$r:7443" >/dev/null
    n=$((n + 1))
  done
  waited=0
  until lead=$(leader) && [ -n "$lead" ]; do
    [ "$waited" -ge "$WAIT" ] && die "no replica leads after ${WAIT}s (docker logs $NAME-1; down removes everything)"
    sleep 1
    waited=$((waited + 1))
  done
  cat <<EOF
hive: $NAME-1, -2 and -3 serve on https://127.0.0.1:$PORT_BASE, :$((PORT_BASE + 1)) and :$((PORT_BASE + 2))
hive: $lead leads
Each replica wrote an admin kubeconfig; any of them works against every replica (one CA,
one token store):
  docker cp $NAME-1:/var/lib/hive/kubeconfig.yaml .
Its server is https://127.0.0.1:7443; every replica's port above answers it.
EOF
}

status() {
  docker network inspect "$NAME" >/dev/null 2>&1 || echo "network $NAME: absent"
  for m in $(members); do
    echo "$m: $(state "$m")"
  done
  n=1
  for r in $(replicas); do
    port=$((PORT_BASE + n - 1))
    n=$((n + 1))
    [ "$(state "$r")" = running ] || { echo "$r: $(state "$r")" && continue; }
    # /readyz is open to anyone; -k since this only asks our own loopback port who
    # leads (the CA that would verify it is in the kubeconfig). Without curl, the
    # replica's last word on it in its log.
    said=""
    command -v curl >/dev/null &&
      said=$(curl -sk --max-time 5 "https://127.0.0.1:$port/readyz?verbose" 2>/dev/null | grep leader || true)
    [ -n "$said" ] || said=$(docker logs "$r" 2>&1 | grep -E '^hive: (leading|following)' | tail -n 1)
    echo "$r: running on https://127.0.0.1:$port: $said"
  done
}

down() {
  for c in $(replicas) $(members); do docker rm -f -v "$c" >/dev/null 2>&1 || true; done
  for v in $(replicas) $(members); do docker volume rm "$v" >/dev/null 2>&1 || true; done
  docker network rm "$NAME" >/dev/null 2>&1 || true
  left=""
  for c in $(replicas) $(members); do
    docker container inspect "$c" >/dev/null 2>&1 && left="$left container:$c"
    docker volume inspect "$c" >/dev/null 2>&1 && left="$left volume:$c"
  done
  docker network inspect "$NAME" >/dev/null 2>&1 && left="$left network:$NAME"
  [ -z "$left" ] || die "could not remove$left"
  echo "$NAME: removed"
}

case "${1:-}" in
  up) up ;;
  status) status ;;
  down) down ;;
  -h | --help | help) usage ;;
  *) usage >&2 && exit 2 ;;
esac
