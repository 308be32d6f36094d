#!/usr/bin/env bash
# The cost of cluster routing, in one run on this machine: etcd and 2 (or 3) berth nodes on loopback, each
# `--cores 1 --fsync never` (no disk wait, so what differs is the routing), pinned with taskset: one CPU per node
# when there are enough, else every node on CPU 0; the load generator, etcd and the wake client on the last CPU.
# Every topic has one partition, so it lives on one node (its owner, read from GET /topics/T), and each figure is
# taken through the owner (local) and through another node (remote), with the same load generator:
#   - probe: `berth-bench --workload consume` draining a pre-filled topic (consume, then ack), and the
#     produce -> consume -> ack cycle, at 1 and 16 connections. Through a non-owner every consume is a probe of the
#     owner over node RPC (and every ack and produce is forwarded to it). CPU per operation is that of all nodes.
#     Each pair is run --repeat times (local and remote in turn; the order alternates), and the table gives the
#     median over the repeats with their range: the machine may be shared and noisy.
#   - mixed: the 16-connection cycle with `--server OWNER,OTHER`, half the connections on each, in the same run
#     (per-node histograms).
#   - wake: a consumer parked in a long poll, woken by a produce to the owner; latency from the produce's answer to
#     the consume's answer, consumer on the owner (local wake) vs on another node (remote wake: a signal over node
#     RPC, then a probe), rounds alternating between the two (benches/cluster_wake.py).
# Results (.txt, .json per run, wake.json, summary.md with the table, setup.txt, topics.txt: each topic's owner) go
# to benches/results/cluster-<timestamp>/.
#
#   benches/cluster.sh [--duration 10s] [--out DIR] [--nodes 2|3] [--rounds 500] [--repeat 3]
#
# Needs etcd (apt-get install etcd-server, or ETCD_BIN), python3 and curl. Ports: etcd on BERTH_BENCH_ETCD_PORT
# (default 23790, and the next one), node i on BERTH_BENCH_PORT_BASE+i (default 17470) and node RPC on +100.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=10s
nodes=2
rounds=500
repeat=3
out="benches/results/cluster-$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --nodes) nodes="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
die() { echo "cluster.sh: $*" >&2; exit 1; }
[[ $nodes == 2 || $nodes == 3 ]] || die "--nodes must be 2 or 3"
etcd_bin=${ETCD_BIN:-$(command -v etcd || true)}
[[ -n $etcd_bin && -x $etcd_bin ]] || die "etcd not found: apt-get install -y etcd-server (or set ETCD_BIN)"
command -v curl >/dev/null || die "curl is needed"
command -v python3 >/dev/null || die "python3 is needed"
cargo build --release -q
berth=target/release/berth
# The load generator, a binary of its own (bench/), built beside the server.
berth_bench="${berth%/*}/berth-bench"
mkdir -p "$out"
: >"$out/topics.txt"

ncpu=$(nproc)
client_cpu=$((ncpu - 1))
node_cpu() {  # node_cpu I: the CPU of node I (1-based)
  if ((ncpu >= nodes + 1)); then echo $(($1 - 1)); else echo 0; fi
}
etcd_port=${BERTH_BENCH_ETCD_PORT:-23790}
base=${BERTH_BENCH_PORT_BASE:-17470}
tmp=$(mktemp -d /tmp/berth-cluster-bench.XXXXXX)
# pin, wait_up, the EXIT trap, start_etcd, start_berth_nodes
source benches/lib/common.sh
start_etcd "$etcd_bin" "$etcd_port" "$client_cpu"
start_berth_nodes "$nodes" "$base" node_cpu --fsync never

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "berth: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (modified)')"
  echo "etcd: $("$etcd_bin" --version | head -1)"
  echo "cpus: $ncpu; client, etcd and wake client on cpu $client_cpu"
  for i in $(seq "$nodes"); do
    echo "node n$i: ${urls[i - 1]} cpu $(node_cpu "$i"), --cores 1 --fsync never"
  done
  echo "duration per bench run: $duration; repeats: $repeat; wake rounds per side: $rounds"
  uname -sr
} >"$out/setup.txt"
cat "$out/setup.txt"

owner=""
other=""
make_topic() {  # make_topic NAME: one partition; sets owner and other (a node that does not own it)
  local a node i
  a=$(curl -fs -X PUT "${urls[0]}/topics/$1?partitions=1") || die "cannot create topic $1"
  node=$(curl -fs "${urls[0]}/topics/$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["partitions"][0]["node"])')
  i=${node#n}
  owner=${urls[i - 1]}
  other=${urls[i % nodes]}
  for u in "${urls[@]}"; do
    for _ in $(seq 100); do curl -fs -o /dev/null "$u/topics/$1" && break; sleep 0.1; done
  done
  echo "  topic $1 on $node ($owner); other node: $other"
  echo "$1 $owner $other" >>"$out/topics.txt"
}
drop_topic() { curl -fs -o /dev/null -X DELETE "${urls[0]}/topics/$1" || true; }

bench() {  # bench NAME SERVERS bench-args...
  local name=$1 servers=$2
  shift 2
  if ! "$berth_bench" --server "$servers" --client-cpus "$client_cpu" --server-pid "$all_pids" \
    --duration "$duration" --json "$out/$name.json" "$@" >"$out/$name.txt" 2>"$tmp/$name.err"; then
    cat "$tmp/$name.err" >&2
    die "bench $name failed"
  fi
  echo "  $name done"
}

fill() {  # fill TOPIC: pre-fill through the owner for as long as a run lasts, 100k messages/s in batches of 100
  # (more than a drain takes, and not the several times more an unpaced fill would write)
  if ! "$berth_bench" --server "$owner" --topic "$1" --workload produce --batch 100 --connections 4 --rate 1000 \
    --client-cpus "$client_cpu" --duration "$duration" >"$tmp/$1-fill.log" 2>&1; then
    tail -20 "$tmp/$1-fill.log" >&2
    die "pre-fill of $1 failed"
  fi
  grep -E '^all +produce' "$tmp/$1-fill.log" | awk '{print "  pre-filled " $12 " messages"}'
}

echo "probe: consume (drain of a pre-filled topic) and cycle, through the owner vs another node, $repeat times"
for r in $(seq "$repeat"); do
  # Odd rounds take local first, even ones remote first, so a drift of the machine's speed falls on both.
  sides="local remote"
  ((r % 2 == 0)) && sides="remote local"
  for c in 1 16; do
    for workload in consume cycle; do
      for side in $sides; do
        name=$workload-c$c-$side-r$r
        make_topic "$name"
        [[ $workload == consume ]] && fill "$name"
        url=$owner
        [[ $side == remote ]] && url=$other
        bench "$name" "$url" --topic "$name" --workload "$workload" --messages 0 --connections "$c"
        drop_topic "$name"
      done
    done
  done
done

echo "mixed: the 16-connection cycle over owner and other node in one run"
make_topic mixed
bench cycle-c16-mixed "$owner,$other" --topic mixed --workload cycle --connections 16
drop_topic mixed

echo "wake: a parked consumer woken by a produce, on the owner vs on another node ($rounds rounds each)"
make_topic wake
$(pin "$client_cpu") python3 benches/cluster_wake.py --owner "$owner" --other "$other" --topic wake \
  --rounds "$rounds" --json "$out/wake.json" | tee "$out/wake.txt"
drop_topic wake

python3 - "$out" "$repeat" <<'PY'
import json, os, statistics, sys
out, repeat = sys.argv[1], int(sys.argv[2])
load = lambda name: json.load(open(os.path.join(out, name + ".json")))
ratio = lambda l, r: "%.2f×" % (r / l) if l else "n/a"
lines = [
    "| run | figure | local (owner) | remote (other node) | remote / local |",
    "|---|---|---|---|---|",
]
summary = {"repeats": repeat}
def cell(values, fmt):
    med = statistics.median(values)
    if len(values) == 1:
        return fmt % med, med
    return f"{fmt % med} [{fmt % min(values)}–{fmt % max(values)}]", med
for workload, op, unit in [("consume", "consume", "consume+ack"), ("cycle", "cycle", "cycle")]:
    for c in (1, 16):
        runs = {side: [load(f"{workload}-c{c}-{side}-r{r}") for r in range(1, repeat + 1)] for side in ("local", "remote")}
        what = "drain (consume, ack)" if workload == "consume" else "cycle (produce, consume, ack)"
        figures = [
            (f"{op}/s", lambda d: d["clients"]["all"][op]["per_sec"], "%.0f"),
            (f"{op} p50 µs", lambda d: d["clients"]["all"][op]["p50_us"], "%d"),
            (f"{op} p99 µs", lambda d: d["clients"]["all"][op]["p99_us"], "%d"),
        ]
        if workload == "cycle":
            figures.append(("its consume p50 µs", lambda d: d["clients"]["all"]["consume"]["p50_us"], "%d"))
        figures.append((f"nodes' CPU µs per {unit}", lambda d: d["server_cpu_us_per_unit"] or 0, "%.1f"))
        for k, (fig, get, fmt) in enumerate(figures):
            lt, lv = cell([get(d) for d in runs["local"]], fmt)
            rt, rv = cell([get(d) for d in runs["remote"]], fmt)
            label = (f"{what}, {c} conn" + ("" if c == 1 else "s")) if k == 0 else ""
            lines.append(f"| {label} | {fig} | {lt} | {rt} | {ratio(lv, rv)} |")
            summary[f"{workload}-c{c}/{fig}"] = {
                "local": lv, "remote": rv,
                "local_runs": [get(d) for d in runs["local"]], "remote_runs": [get(d) for d in runs["remote"]],
            }
        errors = sum(m[o]["errors"] for ds in runs.values() for d in ds for m in [d["clients"]["all"]] for o in m)
        if errors:
            lines.append(f"| | errors | {errors} | | |")
w = load("wake")
wl, wr = w["sides"]["local"], w["sides"]["remote"]
for k, (q, name) in enumerate([("p50", "median"), ("p90", "p90"), ("p99", "p99")]):
    lv, rv = wl["answer_to_answer_us"][q], wr["answer_to_answer_us"][q]
    label = f"wake, {w['rounds_per_side']} rounds each" if k == 0 else ""
    lines.append(f"| {label} | produce answer → consume answer, {name} µs | {lv:.0f} | {rv:.0f} | {ratio(lv, rv)} |")
    summary[f"wake/{q}"] = {"local": lv, "remote": rv}
lv, rv = wl["send_to_answer_us"]["p50"], wr["send_to_answer_us"]["p50"]
lines.append(f"| | produce sent → consume answer, median µs | {lv:.0f} | {rv:.0f} | {ratio(lv, rv)} |")
lv, rv = wl["produce_rtt_us"]["p50"], wr["produce_rtt_us"]["p50"]
lines.append(f"| | (the produce's own round trip, median µs) | {lv:.0f} | {rv:.0f} | |")
late = wl["over_400ms"] + wr["over_400ms"]
if late:
    lines.append(f"| | wakes over 400 ms (lost signal, recheck) | {wl['over_400ms']} | {wr['over_400ms']} | |")
lines.append("")
lines.append(f"Cells: median over {repeat} runs [min–max]; wake: percentiles over all rounds.")
owners = dict(line.split()[:2] for line in open(os.path.join(out, "topics.txt")))
m = load("cycle-c16-mixed")
mixed = ["", "Mixed run (`--server OWNER,OTHER`, 8 of the 16 connections on each, same run): per node", ""]
for url, ops in m["nodes"].items():
    role = "owner" if url == owners["mixed"] else "other node"
    cy, co = ops["cycle"], ops["consume"]
    mixed.append(f"- {role} {url}: {cy['per_sec']:.0f} cycles/s, cycle p50 {cy['p50_us']} µs, p99 {cy['p99_us']} µs; "
                 f"consume p50 {co['p50_us']} µs")
text = "\n".join(lines + mixed) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
print(text)
PY
echo "results in $out"
