#!/usr/bin/env bash
# The headline comparison, in one run on this machine: berth (fsync always) and beanstalkd (in memory), both driven
# by the same load generator (`berth-bench`) on the last CPU, servers on CPU 0; cycle = produce -> consume -> ack
# (put -> reserve -> delete), 100-byte messages; then fsynced produce at 1, 16 and 64 connections.
#   benches/compare.sh [--duration 10s] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
duration=10s
out="benches/results/$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
cargo build --release -q
berth=target/release/berth
# The load generator, a binary of its own (bench/), built beside the server.
berth_bench="${berth%/*}/berth-bench"
last=$(( $(nproc) - 1 ))
bench() {  # bench NAME [global args --] bench args...
  local name="$1"; shift
  "$berth_bench" --duration "$duration" --client-cpus "$last" --json "$out/$name.json" "$@" > "$out/$name.txt" 2>/dev/null
  echo "  $name done"
}
if command -v beanstalkd >/dev/null; then
  taskset -c 0 beanstalkd -l 127.0.0.1 -p 11399 & bpid=$!
  sleep 0.5
  for c in 1 16; do
    for p in "" "--pipeline"; do
      name="beanstalkd-cycle-c$c${p:+-pipelined}"
      "$berth_bench" --server http://127.0.0.1:11399 --protocol beanstalkd --server-pid "$bpid" --workload cycle \
        --connections "$c" $p --duration "$duration" --client-cpus "$last" --json "$out/$name.json" > "$out/$name.txt" 2>/dev/null
      echo "  $name done"
    done
  done
  kill "$bpid"
else
  echo "beanstalkd not installed (apt-get install beanstalkd): no baseline" >&2
fi
for c in 1 16; do
  for p in "" "--pipeline"; do
    bench "berth-cycle-c$c${p:+-pipelined}" --workload cycle --connections "$c" --server-cpus 0 $p
  done
done
for c in 1 16 64; do
  bench "berth-produce-c$c" --workload produce --connections "$c" --server-cpus 0
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = []
for name in sorted(os.listdir(out)):
    if not name.endswith(".json"):
        continue
    d = json.load(open(os.path.join(out, name)))
    op = "produce" if d["settings"]["workload"] == "produce" else "cycle"
    m = d["clients"]["all"].get(op, {})
    rows.append((name[:-5], op, m.get("per_sec", 0), m.get("p50_us"), m.get("p99_us"), m.get("p99.9_us"), d.get("server_cpu_us_per_unit")))
lines = ["| run | op | per second | p50 µs | p99 µs | p99.9 µs | server CPU µs/op |", "|---|---|---|---|---|---|---|"]
for r in rows:
    lines.append("| %s | %s | %.0f | %s | %s | %s | %s |" % (r[0], r[1], r[2], r[3], r[4], r[5], "%.1f" % r[6] if r[6] else "n/a"))
best = lambda prefix: max([r[2] for r in rows if r[0].startswith(prefix)] or [0])
b, s = best("berth-cycle-c16"), best("beanstalkd-cycle-c16")
if s:
    lines.append("")
    lines.append("best berth cycles/s at 16 connections / best beanstalkd: %.0f / %.0f = %.2f×" % (b, s, b / s))
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "results in $out"
