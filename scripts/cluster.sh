#!/usr/bin/env bash
# A three-node berth cluster on this machine, for trying cluster mode by hand (docs/api.md, "Cluster mode").
#
#   scripts/cluster.sh [start]   etcd on 127.0.0.1:2379 (data in a temp dir) and nodes n1..n3 from
#                                target/release/berth: client ports 7071-7073, peer ports 7171-7173, one core each
#   scripts/cluster.sh status    which processes run, and `berth cluster status`
#   scripts/cluster.sh restart N starts node nN again on its data (after a kill -9, say) if it is not running
#   scripts/cluster.sh kill9 N   kills node nN with SIGKILL (as a crash would)
#   scripts/cluster.sh leader T [P]  prints N, where nN leads partition P (default 0) of topic T
#   scripts/cluster.sh port      prints the client port of the first node that runs
#   scripts/cluster.sh stop      stops them (SIGTERM, then SIGKILL after 10 s) and removes the temp dir
#
# Environment: BERTH_BIN (default target/release/berth), ETCD_BIN (default: etcd on PATH), BERTH_CORES (cores
# per node, default 1), BERTH_CLUSTER_NAME (default: default), BERTH_CLUSTER_STATE (where the pid files and
# the temp dir's path are kept, default /tmp/berth-cluster.state), BERTH_CLUSTER_KEEP=1 (stop keeps the data),
# BERTH_ETCD_PORT (default 2379; etcd's peer port is the next one), BERTH_PORT_BASE (default 7070: node i
# serves clients on BASE+i and node RPC on BASE+100+i), BERTH_SERVE_ARGS (more `berth serve` options for every
# node, e.g. --replication-preview), BERTH_NODES (how many nodes `start` runs, 1 to 9, default 3; the other
# commands use the running cluster's count).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BERTH=${BERTH_BIN:-$ROOT/target/release/berth}
ETCD=${ETCD_BIN:-$(command -v etcd || true)}
CORES=${BERTH_CORES:-1}
NAME=${BERTH_CLUSTER_NAME:-default}
STATE=${BERTH_CLUSTER_STATE:-/tmp/berth-cluster.state}
# The node count: BERTH_NODES, else the one the running cluster was started with, else 3.
COUNT=${BERTH_NODES:-$(cat "$STATE/nodes" 2>/dev/null || echo 3)}
[[ $COUNT =~ ^[1-9]$ ]] || { echo "cluster.sh: BERTH_NODES must be 1 to 9, not '$COUNT'" >&2; exit 2; }
mapfile -t NODES < <(seq 1 "$COUNT")
ETCD_PORT=${BERTH_ETCD_PORT:-2379}
BASE=${BERTH_PORT_BASE:-7070}
EXTRA_ARGS=${BERTH_SERVE_ARGS:-}
ETCD_URL=http://127.0.0.1:$ETCD_PORT

die() { echo "cluster.sh: $*" >&2; exit 1; }

running() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Waits up to $2 seconds for `curl $1` to succeed; fails early when the process of pid file $3 is gone.
wait_up() {
  local url=$1 secs=$2 pidfile=$3 i
  for ((i = 0; i < secs * 10; i++)); do
    if curl -fs -o /dev/null --max-time 1 "${@:4}" "$url"; then return 0; fi
    running "$pidfile" || return 1
    sleep 0.1
  done
  return 1
}

# Starts node n$2 on its data directory under $1 (its log appended to), in the background.
launch() {
  local dir=$1 i=$2
  "$BERTH" serve --listen 127.0.0.1:$((BASE + i)) --data-dir "$dir/n$i" --cores "$CORES" \
    --cluster "$ETCD_URL" --cluster-name "$NAME" --node-id n$i \
    --advertise 127.0.0.1:$((BASE + i)) --peer-listen 127.0.0.1:$((BASE + 100 + i)) $EXTRA_ARGS >>"$dir/n$i.log" 2>&1 &
  echo $! >"$STATE/n$i.pid"
}

healthy() {
  local dir=$1 i=$2
  wait_up http://127.0.0.1:$((BASE + i))/health 30 "$STATE/n$i.pid" ||
    { tail -20 "$dir/n$i.log" >&2; die "node n$i did not become healthy; log: $dir/n$i.log"; }
}

restart() {
  local i=${1:-}
  [[ $i =~ ^[0-9]+$ && -n ${NODES[i - 1]:-} && $i -ge 1 ]] || die "usage: $0 restart N (N in ${NODES[*]})"
  [[ -f $STATE/dir ]] || die "not running: $0 start first"
  local t
  # A node just killed may take a moment to be gone (its io_uring rings are torn down on exit).
  for ((t = 0; t < 50; t++)); do running "$STATE/n$i.pid" || break; sleep 0.1; done
  running "$STATE/n$i.pid" && die "n$i is running (pid $(cat "$STATE/n$i.pid"))"
  local dir
  dir=$(cat "$STATE/dir")
  launch "$dir" "$i"
  healthy "$dir" "$i"
  echo "n$i is up again on its data (log: $dir/n$i.log)"
}

start() {
  [[ -x $BERTH ]] || die "no $BERTH: run cargo build --release first (or set BERTH_BIN)"
  [[ -n $ETCD && -x $ETCD ]] || die "etcd not found: apt-get install -y etcd-server (or set ETCD_BIN)"
  command -v curl >/dev/null || die "curl is needed to check that the processes came up"
  if [[ -f $STATE/dir ]]; then
    for f in "$STATE"/*.pid; do
      running "$f" && die "already running (pid files in $STATE): scripts/cluster.sh stop first"
    done
    local old
    old=$(cat "$STATE/dir")
    [[ $old == /tmp/berth-cluster.* ]] && rm -rf "$old"
    rm -rf "$STATE"
  fi
  mkdir -p "$STATE"
  local dir
  dir=$(mktemp -d /tmp/berth-cluster.XXXXXX)
  echo "$dir" >"$STATE/dir"
  echo "$COUNT" >"$STATE/nodes"

  "$ETCD" --name=berth-dev --data-dir="$dir/etcd" \
    --listen-client-urls=$ETCD_URL --advertise-client-urls=$ETCD_URL \
    --listen-peer-urls=http://127.0.0.1:$((ETCD_PORT + 1)) \
    --initial-advertise-peer-urls=http://127.0.0.1:$((ETCD_PORT + 1)) \
    --initial-cluster=berth-dev=http://127.0.0.1:$((ETCD_PORT + 1)) >"$dir/etcd.log" 2>&1 &
  echo $! >"$STATE/etcd.pid"
  wait_up "$ETCD_URL/v3/kv/range" 20 "$STATE/etcd.pid" -X POST -d '{"key":"AA=="}' ||
    { tail -20 "$dir/etcd.log" >&2; die "etcd did not come up (port $ETCD_PORT or $((ETCD_PORT + 1)) taken?); log: $dir/etcd.log"; }

  local i
  for i in "${NODES[@]}"; do
    launch "$dir" "$i"
  done
  for i in "${NODES[@]}"; do
    healthy "$dir" "$i"
  done

  local n1=$((BASE + 1)) n2=$((BASE + 2)) n3=$((BASE + 3))
  cat <<EOF
berth cluster "$NAME" is up: etcd $ETCD_URL, nodes n1..n3 on http://127.0.0.1:$n1-$n3 (logs and data in $dir)

Try:
  $BERTH cluster status --server http://127.0.0.1:$n1
  curl -s localhost:$n1/cluster
  curl -s -X PUT 'localhost:$n1/topics/demo?partitions=6'
  curl -s localhost:$n2/topics/demo                 # served by every node; "node" per partition
  curl -s -X POST 'localhost:$n3/produce?topic=demo' -d hello
  curl -si 'localhost:$n1/consume?topic=demo&wait=5s'  # then ack its Receipt-Handle through any node:
  curl -s -X POST 'localhost:$n2/ack?topic=demo&receipt_handle=P:O:N'
  kill -9 \$(cat $STATE/n3.pid)                     # then, with P a partition whose "node" is n3:
  curl -si -X POST 'localhost:$n1/produce?topic=demo&partition=P' -d x   # 503 partition_unavailable
  curl -s -X POST 'localhost:$n1/produce?topic=demo' -d y                # keyless: a live partition
  curl -s localhost:$n1/cluster                     # n3 "alive": false once its lease (5 s) expires
  $0 restart 3                      # n3 back on its own data: its partitions are served again
  ETCDCTL_API=3 etcdctl --endpoints=$ETCD_URL get --prefix /berth/$NAME/   # if etcdctl is installed

Stop: $0 stop
EOF
}

# Sends SIGTERM to the process of each pid file given, waits up to 10 s for each, then SIGKILL.
term() {
  local f pid i pids=()
  for f in "$@"; do
    [[ -f $f ]] || continue
    if running "$f"; then
      pid=$(cat "$f")
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  for pid in "${pids[@]}"; do
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "pid $pid ignored SIGTERM for 10 s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

stop() {
  [[ -d $STATE ]] || { echo "not running"; return 0; }
  # Nodes first (a clean stop revokes their leases, which needs etcd), etcd last.
  term "$STATE"/n*.pid
  term "$STATE/etcd.pid"
  local dir
  dir=$(cat "$STATE/dir" 2>/dev/null || true)
  if [[ ${BERTH_CLUSTER_KEEP:-0} == 1 ]]; then
    echo "stopped; data and logs kept in $dir"
    rm -rf "$STATE"
  else
    [[ -n $dir && $dir == /tmp/berth-cluster.* ]] && rm -rf "$dir"
    rm -rf "$STATE"
    echo "stopped"
  fi
}

status() {
  [[ -f $STATE/dir ]] || { echo "not running"; return 0; }
  local f state
  for f in "$STATE/etcd.pid" "$STATE"/n*.pid; do
    [[ -f $f ]] || continue
    if running "$f"; then state=running; else state=gone; fi
    printf '%-5s pid %-8s %s\n' "$(basename "$f" .pid)" "$(cat "$f")" "$state"
  done
  echo "logs and data: $(cat "$STATE/dir")"
  "$BERTH" cluster status --server http://127.0.0.1:$((BASE + 1)) || true
}

kill9() {
  local i=${1:-}
  [[ $i =~ ^[0-9]+$ && -n ${NODES[i - 1]:-} && $i -ge 1 ]] || die "usage: $0 kill9 N (N in ${NODES[*]})"
  running "$STATE/n$i.pid" || die "n$i is not running"
  kill -KILL "$(cat "$STATE/n$i.pid")"
  # Gone before this returns (its io_uring rings are torn down on exit), so `port` never names it.
  local t
  for ((t = 0; t < 100; t++)); do running "$STATE/n$i.pid" || break; sleep 0.1; done
  echo "n$i killed (kill -9)"
}

# The client port of the first node that runs.
port() {
  local i
  for i in "${NODES[@]}"; do
    if running "$STATE/n$i.pid"; then
      echo $((BASE + i))
      return 0
    fi
  done
  die "no node runs"
}

# N where nN leads partition $2 (default 0) of topic $1, as a running node describes it.
leader() {
  local topic=${1:-} p=${2:-0} json id
  [[ -n $topic ]] || die "usage: $0 leader TOPIC [PARTITION]"
  json=$(curl -fs "localhost:$(port)/topics/$topic") || die "no topic $topic"
  # The partitions' objects in order; each names its leader ("leader":"nN").
  id=$(printf '%s' "$json" | grep -o '"leader":"[^"]*"' | sed -n "$((p + 1))p" | sed 's/.*"n\([0-9]*\)"/\1/')
  [[ $id =~ ^[0-9]+$ ]] || die "no leader for partition $p of $topic in: $json"
  echo "$id"
}

case ${1:-start} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  restart) restart "${2:-}" ;;
  kill9) kill9 "${2:-}" ;;
  port) port ;;
  leader) leader "${2:-}" "${3:-}" ;;
  *) die "usage: $0 [start|stop|status|restart N|kill9 N|leader TOPIC [P]|port]" ;;
esac
