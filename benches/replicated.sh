#!/usr/bin/env bash
# The cost of replication, in one run on this machine: etcd and 3 berth nodes on loopback (`--cores 1 --fsync
# always --replication-preview`), all three nodes pinned to CPU 0 ("three nodes on one core", as the targets table
# measures it), the load generator and etcd on the last CPU. Each round creates a one-partition topic with
# `replicas=1` and one with `replicas=3` on the same nodes, and loads each through its leader with the same load
# generator: fsynced produce, and the produce -> consume -> ack cycle, 16 connections, 100-byte messages. R = 1 and
# R = 3 alternate their order from round to round, so a drift of the machine's speed falls on both; the table gives
# the median over the rounds, each round's R3/R1 ratio, and the median of those ratios. CPU per operation is that of
# all three nodes (a follower's work is part of a replicated produce).
#
#   benches/replicated.sh [--duration 10s] [--repeat 3] [--connections 16] [--config FILE] [--out DIR]
#
# `--config FILE` starts every node with `--config FILE` (e.g. `sync_via = "inline"`: docs/configuration.md).
# `BERTH_BIN=PATH` runs that berth build (and the berth-bench beside it) instead of building this tree: an A/B of two
# builds alternates runs of this script, one per build, each on a fresh cluster.
#
# Results (.txt, .json per run, summary.md, summary.json, setup.txt) go to benches/results/replicated-<timestamp>/.
# Needs etcd (apt-get install etcd-server, or ETCD_BIN), python3 and curl. Ports: etcd on BERTH_BENCH_ETCD_PORT
# (default 23790, and the next one), node i on BERTH_BENCH_PORT_BASE+i (default 17470) and node RPC on +100.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=10s
repeat=3
connections=16
node_config=()
out="benches/results/replicated-$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --connections) connections="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --config) node_config=(--config "$2"); shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
die() { echo "replicated.sh: $*" >&2; exit 1; }
etcd_bin=${ETCD_BIN:-$(command -v etcd || true)}
[[ -n $etcd_bin && -x $etcd_bin ]] || die "etcd not found: apt-get install -y etcd-server (or set ETCD_BIN)"
command -v curl >/dev/null || die "curl is needed"
command -v python3 >/dev/null || die "python3 is needed"
if [[ -n ${BERTH_BIN:-} ]]; then
  berth=$BERTH_BIN
  [[ -x $berth && -x ${berth%/*}/berth-bench ]] || die "BERTH_BIN=$berth: no berth and berth-bench there"
else
  cargo build --release -q
  berth=target/release/berth
fi
berth_bench="${berth%/*}/berth-bench"
mkdir -p "$out"

nodes=3
ncpu=$(nproc)
client_cpu=$((ncpu - 1))
node_cpu=0
node_cpu_of() { echo "$node_cpu"; }
etcd_port=${BERTH_BENCH_ETCD_PORT:-23790}
base=${BERTH_BENCH_PORT_BASE:-17470}
tmp=$(mktemp -d /tmp/berth-replicated-bench.XXXXXX)
# pin, wait_up, the EXIT trap, start_etcd, start_berth_nodes
source benches/lib/common.sh
start_etcd "$etcd_bin" "$etcd_port" "$client_cpu"
start_berth_nodes "$nodes" "$base" node_cpu_of --fsync always --replication-preview "${node_config[@]}"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "berth: ${BERTH_BIN:-$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src vendor || echo ' (modified)')}"
  echo "etcd: $("$etcd_bin" --version | head -1)"
  echo "cpus: $ncpu; the 3 nodes on cpu $node_cpu; load generator and etcd on cpu $client_cpu"
  echo "nodes: --cores 1 --fsync always --replication-preview ${node_config[*]}"
  echo "load: $connections connections, 100-byte messages, $duration per run, $repeat rounds"
  uname -sr
} >"$out/setup.txt"
cat "$out/setup.txt"

leader=""
make_topic() {  # make_topic NAME R: one partition, R replicas; sets leader (the URL of the node that leads it)
  local node i
  curl -fs -o /dev/null -X PUT "${urls[0]}/topics/$1?partitions=1&replicas=$2" || die "cannot create topic $1"
  for u in "${urls[@]}"; do
    for _ in $(seq 100); do curl -fs -o /dev/null "$u/topics/$1" && break; sleep 0.1; done
  done
  node=$(curl -fs "${urls[0]}/topics/$1" | python3 -c '
import json, sys
p = json.load(sys.stdin)["partitions"][0]
print(p.get("leader") or p["node"])')
  i=${node#n}
  leader=${urls[i - 1]}
  echo "  topic $1 (replicas=$2) led by $node ($leader)"
}
drop_topic() { curl -fs -o /dev/null -X DELETE "${urls[0]}/topics/$1" || true; }

bench() {  # bench NAME URL bench-args...
  local name=$1 url=$2
  shift 2
  if ! "$berth_bench" --server "$url" --client-cpus "$client_cpu" --server-pid "$all_pids" \
    --duration "$duration" --json "$out/$name.json" "$@" >"$out/$name.txt" 2>"$tmp/$name.err"; then
    cat "$tmp/$name.err" >&2
    die "bench $name failed"
  fi
  echo "  $name done"
}

for r in $(seq "$repeat"); do
  order="1 3"
  ((r % 2 == 0)) && order="3 1"
  for workload in produce cycle; do
    for replicas in $order; do
      name=$workload-r$replicas-round$r
      make_topic "$name" "$replicas"
      bench "$name" "$leader" --topic "$name" --workload "$workload" --messages 0 --connections "$connections"
      drop_topic "$name"
    done
  done
done

python3 - "$out" "$repeat" <<'PY'
import json, os, statistics, sys
out, repeat = sys.argv[1], int(sys.argv[2])
load = lambda name: json.load(open(os.path.join(out, name + ".json")))
lines = [
    "| workload | figure | R = 1 | R = 3 | R3 / R1 per round | median of the ratios |",
    "|---|---|---|---|---|---|",
]
summary = {"rounds": repeat}
for workload, op in [("produce", "produce"), ("cycle", "cycle")]:
    runs = {r: [load(f"{workload}-r{r}-round{k}") for k in range(1, repeat + 1)] for r in (1, 3)}
    figures = [
        (f"{op}/s", lambda d: d["clients"]["all"][op]["per_sec"], "%.0f"),
        (f"{op} p50 µs", lambda d: d["clients"]["all"][op]["p50_us"], "%d"),
        (f"{op} p99 µs", lambda d: d["clients"]["all"][op]["p99_us"], "%d"),
        (f"nodes' CPU µs per {op}", lambda d: d["server_cpu_us_per_unit"] or 0, "%.1f"),
    ]
    for k, (fig, get, fmt) in enumerate(figures):
        one = [get(d) for d in runs[1]]
        three = [get(d) for d in runs[3]]
        ratios = [t / o if o else float("nan") for o, t in zip(one, three)]
        label = f"{workload}, 16 conns" if k == 0 else ""
        cell = lambda v: f"{fmt % statistics.median(v)} [{fmt % min(v)}–{fmt % max(v)}]"
        lines.append(f"| {label} | {fig} | {cell(one)} | {cell(three)} | "
                     f"{', '.join('%.2f' % x for x in ratios)} | **{statistics.median(ratios):.2f}×** |")
        summary[f"{workload}/{fig}"] = {"r1": one, "r3": three, "ratios": ratios,
                                        "median_ratio": statistics.median(ratios)}
    errors = {r: sum(m[o]["errors"] for d in runs[r] for m in [d["clients"]["all"]] for o in m) for r in (1, 3)}
    if any(errors.values()):
        lines.append(f"| | errors | {errors[1]} | {errors[3]} | | |")
lines.append("")
lines.append(f"Cells: median over {repeat} rounds [min–max]; R = 1 and R = 3 alternate their order each round.")
text = "\n".join(lines) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
print(text)
PY
echo "results in $out"
