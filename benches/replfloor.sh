#!/usr/bin/env bash
# The replication floor of this machine: how close R = 3 can come to R = 1 at all, when a server does nothing but
# the syscalls of replicated group commit. `benches/floor/replfloor.c` (built here with cc) answers berth-bench's
# fsynced produce with canned replies: per epoll round one pwrite and one fdatasync of the round's produces, and at
# R = 3 the batch shipped to two followers (each: one pwrite, one fdatasync, one ack per pass), the produces answered
# once one follower (a majority with the leader) has acked. All nodes on CPU 0, the load generator on the last CPU,
# 16 connections, 100-byte messages, as benches/replicated.sh measures berth. Rounds are interleaved and alternate
# their order; the summary gives each round's R3/R1 ratios and their medians. CPU per produce is that of all the
# nodes (/proc/PID/stat, via berth-bench --server-pid); "CPU0 busy" is /proc/stat's busy time of CPU 0 (ticks, steal
# included) from just before berth-bench starts to just after it ends (so over its setup too), which also counts the
# block layer's kernel workers and interrupts that no process is charged for.
#
#   benches/replfloor.sh [--rounds 3] [--duration 6s] [--variants "r1 r3 r3-all r3-early"] [--berth] [--out DIR]
#
# Variants: r1 (one node), r3 (leader + 2 followers, majority: 1 follower ack), r3-all (both followers' acks),
# r3-early (majority, the batch shipped before the leader's fdatasync so the syncs overlap). --berth also runs the
# real berth at R = 1 and R = 3 in each round (etcd on the last CPU, 3 nodes on CPU 0, `--fsync always
# --replication-preview`, as benches/replicated.sh, with a fresh cluster per round; needs etcd, curl).
# No cargo: it runs the release binaries already in target/release (copied first, so a rebuild meanwhile changes
# nothing). Results (.txt, .json, the nodes' counters in .err, summary.txt, summary.json) go to
# benches/results/replfloor-<timestamp>/. Ports 17500-17502 (floor), 17503 and up (berth, etcd on 23795).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
duration=6s
variants="r1 r3 r3-all r3-early"
with_berth=0
out="benches/results/replfloor-$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --variants) variants="$2"; shift 2 ;;
    --berth) with_berth=1; shift ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
die() { echo "replfloor.sh: $*" >&2; exit 1; }
command -v cc >/dev/null || die "a C compiler (cc) is needed"
command -v python3 >/dev/null || die "python3 is needed"
[[ -x target/release/berth-bench ]] || die "target/release/berth-bench is missing (cargo build --release)"
tmp=$(mktemp -d /tmp/replfloor-bench.XXXXXX)
mkdir -p "$out"
# pin, wait_up, stop_pids, pids+=() stopped by the EXIT trap, start_etcd, start_berth_nodes
source benches/lib/common.sh
cp target/release/berth-bench "$tmp/berth-bench"
berth_bench="$tmp/berth-bench"
berth="$tmp/berth"
if ((with_berth)); then
  cp target/release/berth "$berth"
  etcd_bin=${ETCD_BIN:-$(command -v etcd || true)}
  [[ -n $etcd_bin && -x $etcd_bin ]] || die "--berth needs etcd"
  command -v curl >/dev/null || die "--berth needs curl"
fi
cc -O2 -o "$tmp/replfloor" benches/floor/replfloor.c
cc -O2 -o "$tmp/syncfloor" benches/floor/syncfloor.c
client_cpu=$(( $(nproc) - 1 ))
node_cpu=0
leader_port=17500

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "tree: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (src modified)')"
  echo "binaries: $(ls -l --time-style=+%Y-%m-%dT%H:%M:%S target/release/berth-bench target/release/berth 2>/dev/null |
    awk '{print $7, $6}' | tr '\n' ' ')"
  echo "cpus: $(nproc); every node on cpu $node_cpu; load generator on cpu $client_cpu"
  echo "load: berth-bench --workload produce --connections 16 --messages 0, 100-byte messages, $duration per run, $rounds rounds"
  echo "variants: $variants$( ((with_berth)) && echo ' berth-r1 berth-r3')"
  echo "data: $(findmnt -no FSTYPE,OPTIONS -T "$tmp")"
  uname -sr
} >"$out/setup.txt"
cat "$out/setup.txt"

wait_port() { for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }
forget() {  # forget PID...: no longer ours to stop on exit
  local p keep=() k
  for k in "${pids[@]}"; do
    for p in "$@"; do [[ $k == "$p" ]] && continue 2; done
    keep+=("$k")
  done
  pids=("${keep[@]}")
}
# Another engineer's build or profile on this machine makes a round worthless: before each run, wait until none of
# these runs; a round that one of them overlapped (seen right after a run) is run again.
heavy="rustc|cargo|berth-bench|cc1|cc1plus|ld|ld.lld|mold|valgrind|callgrind-amd64|perf|stress|stress-ng|fio"
foreign() { pgrep -x "$heavy" >/dev/null 2>&1; }
wait_quiet() {
  local n=0
  while foreign; do
    disturbed=1
    ((n++ % 6 == 0)) && echo "  waiting for a quiet machine: $(pgrep -lx "$heavy" | tr '\n' ' ')" >&2
    sleep 10
  done
}
disturbed=0
busy0() { awk '$1 == "cpu0" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

bench() {  # bench NAME URL PIDS [berth-bench args]: one run, plus CPU 0's busy ticks and the wall time around it
  local name=$1 url=$2 server_pids=$3 b0 b1 t0 t1
  shift 3
  wait_quiet
  t0=$(date +%s.%N)
  b0=$(busy0)
  if ! "$berth_bench" --server "$url" --workload produce --connections 16 --client-cpus "$client_cpu" \
    --server-pid "$server_pids" --messages 0 --duration "$duration" --json "$out/$name.json" "$@" \
    >"$out/$name.txt" 2>"$tmp/$name.err"; then
    cat "$tmp/$name.err" >&2
    die "bench $name failed"
  fi
  b1=$(busy0)
  t1=$(date +%s.%N)
  if foreign; then disturbed=1; fi
  echo "$b0 $b1 $(getconf CLK_TCK) $t0 $t1" >"$out/$name.cpu0"
}

# The three nodes' journals, zero-filled and synced once (the servers reuse them): no run pays for writing them or
# for the discards of deleting them, and the disk has settled before the first run.
data="$tmp/data"
for n in l f1 f2; do
  mkdir -p "$data/$n"
  dd if=/dev/zero of="$data/$n/journal" bs=1M count=64 conv=fsync status=none
done
sleep 2

floor_run() {  # floor_run VARIANT ROUND
  local variant=$1 round=$2 name="floor-$1-round$2" d="$data" lpid f1 f2 args=()
  if [[ $variant != r1 ]]; then
    taskset -c "$node_cpu" "$tmp/replfloor" follow $((leader_port + 1)) "$d/f1" --prealloc-mb 64 \
      2>"$out/$name.f1.err" & f1=$!; pids+=("$f1")
    taskset -c "$node_cpu" "$tmp/replfloor" follow $((leader_port + 2)) "$d/f2" --prealloc-mb 64 \
      2>"$out/$name.f2.err" & f2=$!; pids+=("$f2")
    args=(--followers "$((leader_port + 1)),$((leader_port + 2))")
    [[ $variant == r3-all ]] && args+=(--majority 2)
    [[ $variant == r3-early ]] && args+=(--ship-early)
  fi
  taskset -c "$node_cpu" "$tmp/replfloor" serve "$leader_port" "$d/l" --prealloc-mb 64 "${args[@]}" \
    2>"$out/$name.leader.err" & lpid=$!; pids+=("$lpid")
  wait_port "$leader_port" || die "replfloor did not come up on $leader_port"
  if [[ $variant == r1 ]]; then
    bench "$name" "http://127.0.0.1:$leader_port" "$lpid"
  else
    bench "$name" "http://127.0.0.1:$leader_port" "$lpid,$f1,$f2"
  fi
  # The leader first (it prints its counters at SIGTERM), then the followers (they print theirs when it is gone).
  kill -TERM "$lpid"; wait "$lpid" || true
  if [[ $variant != r1 ]]; then
    kill -TERM "$f1" "$f2" 2>/dev/null || true; wait "$f1" || true; wait "$f2" || true
    forget "$f1" "$f2"
  fi
  forget "$lpid"
  echo "  $name: $(grep '^all' "$out/$name.txt" | awk '{print $4 " produce/s, p50 " $5 ", p99 " $7}')"
}

berth_round() {  # berth_round ROUND ORDER: a fresh etcd + 3-node cluster, R = 1 and R = 3 topics in ORDER
  local round=$1 order=$2 r node i leader name
  start_etcd "$etcd_bin" 23795 "$client_cpu"
  start_berth_nodes 3 17503 node_cpu_of --fsync always --replication-preview
  for r in $order; do
    name=berth-r$r-round$round
    curl -fs -o /dev/null -X PUT "${urls[0]}/topics/$name?partitions=1&replicas=$r" || die "cannot create topic $name"
    for u in "${urls[@]}"; do
      for _ in $(seq 100); do curl -fs -o /dev/null "$u/topics/$name" && break; sleep 0.1; done
    done
    node=$(curl -fs "${urls[0]}/topics/$name" | python3 -c '
import json, sys
p = json.load(sys.stdin)["partitions"][0]
print(p.get("leader") or p["node"])')
    i=${node#n}
    leader=${urls[i - 1]}
    bench "$name" "$leader" "$all_pids" --topic "$name"
    curl -fs -o /dev/null -X DELETE "${urls[0]}/topics/$name" || true
    echo "  $name: $(grep '^all' "$out/$name.txt" | awk '{print $4 " produce/s, p50 " $5 ", p99 " $7}')"
  done
  # Nodes before etcd (a clean stop revokes their leases), last started first.
  local k stop_list=()
  for ((k = ${#pids[@]} - 1; k >= 0; k--)); do stop_list+=("${pids[k]}"); done
  stop_pids "${stop_list[@]}"
  for k in "${stop_list[@]}"; do wait "$k" 2>/dev/null || true; done
  pids=()
  rm -rf "$tmp"/n? "$tmp/etcd"
}
node_cpu_of() { echo "$node_cpu"; }

round=1
tries=0
while ((round <= rounds)); do
  wait_quiet
  disturbed=0
  # The disk's state this round: one 116-byte (a produce's record) and one 6 KiB pwrite + fdatasync loop on CPU 0.
  { taskset -c "$node_cpu" "$tmp/syncfloor" "$tmp" 116 3000; taskset -c "$node_cpu" "$tmp/syncfloor" "$tmp" 6144 3000; } \
    >"$out/syncfloor-round$round.txt"
  sed 's/^/  /' "$out/syncfloor-round$round.txt"
  order="$variants"
  # Alternate the order from round to round, so that a drift of the machine falls on every variant alike.
  ((round % 2 == 0)) && order=$(echo "$variants" | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do floor_run "$v" "$round"; done
  if ((with_berth)); then
    if ((round % 2 == 0)); then berth_round "$round" "3 1"; else berth_round "$round" "1 3"; fi
  fi
  if ((disturbed)) || foreign; then
    ((++tries <= 5)) || die "the machine is never quiet: giving up"
    echo "round $round overlapped another heavy process: run again"
    mkdir -p "$out/disturbed-$tries"; mv "$out"/*round"$round"* "$out/disturbed-$tries/" 2>/dev/null || true
    continue
  fi
  echo "round $round done"
  round=$((round + 1))
done

python3 - "$out" "$rounds" "$variants $( ((with_berth)) && echo berth-r1 berth-r3)" <<'PY'
import json, os, re, statistics, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
med = statistics.median

def run(name, k):
    base = f"{name}-round{k}" if name.startswith("berth") else f"floor-{name}-round{k}"
    d = json.load(open(os.path.join(out, base + ".json")))
    p = d["clients"]["all"]["produce"]
    b0, b1, hz, t0, t1 = map(float, open(os.path.join(out, base + ".cpu0")).read().split())
    busy_s = (b1 - b0) / hz
    r = {"produce/s": p["per_sec"], "p50 us": p["p50_us"], "p99 us": p["p99_us"],
         "nodes' CPU us/produce": d["server_cpu_us_per_unit"] or 0.0,
         "CPU0 busy (cores)": busy_s / (t1 - t0),
         "CPU0 us/produce": busy_s * 1e6 / max(p["count"], 1),
         "errors": p["errors"]}
    pat = re.compile(r"(\d+) passes, (\d+) fdatasyncs, (\d+) records, .*?([\d.]+) s from first to last sync: "
                     r"(\d+) fdatasyncs/s, ([\d.]+) records per sync")
    for node in ("leader", "f1", "f2"):
        path = os.path.join(out, f"{base}.{node}.err")
        if not os.path.exists(path):
            continue
        m = pat.search(open(path).read())
        if m:
            r[f"{node} fdatasyncs/s"] = float(m.group(5))
            r[f"{node} records/sync"] = float(m.group(6))
    m = re.search(r"([\d.]+) batches awaiting acks per pass", open(os.path.join(out, f"{base}.leader.err")).read()) \
        if os.path.exists(os.path.join(out, f"{base}.leader.err")) else None
    if m:
        r["leader batches awaiting acks/pass"] = float(m.group(1))
    return r

runs = {n: [run(n, k) for k in range(1, rounds + 1)] for n in names}
figures = ["produce/s", "p50 us", "p99 us", "nodes' CPU us/produce", "CPU0 busy (cores)", "CPU0 us/produce",
           "leader fdatasyncs/s", "leader records/sync", "f1 fdatasyncs/s", "f1 records/sync", "f2 fdatasyncs/s",
           "leader batches awaiting acks/pass", "errors"]
fmt = lambda v: f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"
lines = [f"Medians of {rounds} rounds [per round]; every node on CPU 0, berth-bench on the last CPU, 16 connections."]
lines.append("")
lines.append("| figure | " + " | ".join(names) + " |")
lines.append("|---|" + "---|" * len(names))
for f in figures:
    if not any(f in r for n in names for r in runs[n]):
        continue
    cells = []
    for n in names:
        vals = [r[f] for r in runs[n] if f in r]
        cells.append(f"{fmt(med(vals))} [{', '.join(fmt(v) for v in vals)}]" if vals else "-")
    lines.append(f"| {f} | " + " | ".join(cells) + " |")
summary = {"rounds": rounds, "runs": runs, "ratios": {}}
lines.append("")
lines.append("| R3 / R1 (per round; median) | produce/s | p99 | nodes' CPU per produce | CPU0 per produce |")
lines.append("|---|---|---|---|---|")
pairs = [(n, "r1") for n in names if n.startswith("r3")]
if "berth-r3" in names:
    pairs.append(("berth-r3", "berth-r1"))
for three, one in pairs:
    cells, summary["ratios"][three] = [], {}
    for f in ("produce/s", "p99 us", "nodes' CPU us/produce", "CPU0 us/produce"):
        ratios = [b[f] / a[f] if a[f] else float("nan") for a, b in zip(runs[one], runs[three])]
        summary["ratios"][three][f] = {"per_round": ratios, "median": med(ratios)}
        cells.append(f"{', '.join('%.2f' % x for x in ratios)}; **{med(ratios):.2f}x**")
    label = f"floor {three} / r1" if not three.startswith("berth") else "berth r3 / r1"
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
lines.append("")
lines.append("Sync floor per round (benches/floor/syncfloor.c on CPU 0: pwrite + fdatasync, CPU and wall time per sync):")
sync_pat = re.compile(r"(\d+) bytes per write, \d+ syncs: ([\d.]+) us of CPU per sync .*?, ([\d.]+) us wall")
for k in range(1, rounds + 1):
    got = sync_pat.findall(open(os.path.join(out, f"syncfloor-round{k}.txt")).read())
    lines.append(f"  round {k}: " + "; ".join(f"{b} B: {c} us CPU, {w} us wall" for b, c, w in got))
    summary.setdefault("syncfloor", {})[k] = [{"bytes": int(b), "cpu_us": float(c), "wall_us": float(w)}
                                             for b, c, w in got]
text = "\n".join(lines) + "\n"
open(os.path.join(out, "summary.txt"), "w").write(text)
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
print(text)
PY
echo "results in $out"
