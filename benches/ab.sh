#!/usr/bin/env bash
# A/B of two berth builds (or two configurations of one), interleaved, on this machine: each round starts build A's
# server, drives it, stops it, then does the same for B, so slow and fast phases of a shared machine hit both alike;
# the summary quotes medians. Servers run `serve --cores 1` on CPU 0 with a fresh data directory; the load generator
# (build B's `berth-bench --server`, the binary beside BIN_B; an older build's `berth bench` when it has no
# berth-bench) runs on the last CPU.
#
#   benches/ab.sh --a BIN_A --b BIN_B [--a-config A.toml] [--b-config B.toml] [--rounds 5] [--duration 4s]
#                 [--partitions 1] [--fsync always|never|interval:MS] [--workload cycle|produce|consume]
#                 [--batch 1] [--connections 16] [--out DIR]
#
# Prints, per side, each round's ops/s (an op: a cycle, a produce or a consume request) and the medians of ops/s,
# server CPU µs per op (from /proc/PID/stat over the measured run) with its user and kernel parts, client p50 and
# p99; writes the same table and the raw outputs to --out. The user part is the steadier one on a noisy machine.
# Before every measured run a 1 s warm-up run fills the page cache and the connection pools.
set -euo pipefail
cd "$(dirname "$0")/.."
a="" b="" a_config="" b_config="" rounds=5 duration=4s partitions=1 fsync=always workload=cycle batch=1
connections=16
out="benches/results/ab-$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --a) a="$2"; shift 2 ;;
    --b) b="$2"; shift 2 ;;
    --a-config) a_config="$2"; shift 2 ;;
    --b-config) b_config="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --partitions) partitions="$2"; shift 2 ;;
    --fsync) fsync="$2"; shift 2 ;;
    --workload) workload="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --connections) connections="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [ -z "$a" ] || [ -z "$b" ]; then
  echo "usage: benches/ab.sh --a BIN_A --b BIN_B [options]: see the header of this script" >&2
  exit 2
fi
for bin in "$a" "$b"; do
  [ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 2; }
done
last=$(( $(nproc) - 1 ))
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

side() {  # side NAME BIN CONFIG ROUND
  local name="$1" bin="$2" config="$3" round="$4" port pid data t0 t1
  port=$(free_port)
  data="$tmp/$name-$round"
  local args=(serve --cores 1 --listen "127.0.0.1:$port" --data-dir "$data" --fsync "$fsync")
  [ -n "$config" ] && args+=(--config "$config")
  taskset -c 0 "$bin" "${args[@]}" > "$out/$name-r$round.server.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -fs "127.0.0.1:$port/health" > /dev/null 2>&1 && break; sleep 0.1; done
  curl -fs -XPUT "127.0.0.1:$port/topics/ab?partitions=$partitions&max_in_flight=100000&max_acked_ahead=100000" \
    > /dev/null
  local bench=("$(dirname "$b")/berth-bench" --server "http://127.0.0.1:$port")
  if [ ! -x "${bench[0]}" ]; then
    # An older build: the load generator was its `berth bench`.
    "$b" bench --help > /dev/null 2>&1 || { echo "no berth-bench beside $b, and $b has no bench subcommand" >&2; exit 2; }
    bench=("$b" --server "http://127.0.0.1:$port" bench)
  fi
  bench+=(--topic ab --workload "$workload" --batch "$batch" --connections "$connections" --client-cpus "$last")
  "${bench[@]}" --duration 1s > /dev/null 2>&1
  t0=$(awk '{print $14, $15}' "/proc/$pid/stat")
  "${bench[@]}" --duration "$duration" > "$out/$name-r$round.txt" 2>&1
  t1=$(awk '{print $14, $15}' "/proc/$pid/stat")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -rf "$data"
  # user and kernel clock ticks over the measured run
  echo "$t0 $t1" | awk '{print $3 - $1, $4 - $2}' > "$out/$name-r$round.cpu_ticks"
}

for round in $(seq "$rounds"); do
  side a "$a" "$a_config" "$round"
  side b "$b" "$b_config" "$round"
  echo "  round $round done" >&2
done

python3 - "$out" "$rounds" "$workload" "$(getconf CLK_TCK)" <<'PY' | tee "$out/summary.md"
import statistics, sys
out, rounds, workload, hz = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
print("| side | ops/s per round | ops/s (median) | server CPU µs per op (median) | of which user | of which kernel "
      "| p50 µs (median) | p99 µs (median) |")
print("|---|---|---|---|---|---|---|---|")
medians = {}
for side in ("a", "b"):
    rates, cpus, users, kernels, p50s, p99s = [], [], [], [], [], []
    for r in range(1, rounds + 1):
        row = None
        for line in open(f"{out}/{side}-r{r}.txt"):
            f = line.split()
            if len(f) > 7 and f[0] == "all" and f[1] == workload:
                row = f
        if row is None:
            sys.exit(f"no '{workload}' row in {out}/{side}-r{r}.txt")
        count, rate = int(row[2]), float(row[3])
        user, kernel = (int(t) for t in open(f"{out}/{side}-r{r}.cpu_ticks").read().split())
        per_op = lambda ticks: ticks / hz / count * 1e6 if count else float("nan")
        rates.append(rate)
        cpus.append(per_op(user + kernel))
        users.append(per_op(user))
        kernels.append(per_op(kernel))
        p50s.append(float(row[4]))
        p99s.append(float(row[6]))
    medians[side] = statistics.median(rates)
    print(f"| {side} | {' / '.join(f'{x:,.0f}' for x in rates)} | {statistics.median(rates):,.0f} | "
          f"{statistics.median(cpus):.1f} | {statistics.median(users):.1f} | {statistics.median(kernels):.1f} | "
          f"{statistics.median(p50s):,.0f} | {statistics.median(p99s):,.0f} |")
print()
print(f"b / a (medians of ops/s): {medians['b'] / medians['a']:.3f}")
PY
echo "results in $out" >&2
