#!/usr/bin/env bash
# The unbatched cycle's tail, in one run: produce -> consume -> ack of 100-byte messages, 16 connections, every
# server pinned to CPU 0 and driven by the same load generator (this tree's `berth-bench`) on the last CPU:
# beanstalkd (the peer, in memory), berth in memory (`--fsync never`), and berth fsynced (`--fsync always`) on a
# topic of 1 and of 16 partitions. Rounds are interleaved so that the machine's drift hits every server alike; the
# table gives medians of cycles/s, p50, p99 and p99.9 (at the client) and the server's CPU per cycle, and the median
# of each berth row's per-round p99 ratio to beanstalkd's. The berth runs' per-stage breakdown (queue, service,
# journal queue, write and sync, reply, housekeeping) is in each round's .txt. Issue 28's targets: in-memory p99 at
# most beanstalkd's, fsynced p99 at most 1.5 ms at 1 and 16 partitions.
#   benches/tail.sh [--rounds 3] [--duration 8s] [--out DIR]
# Needs beanstalkd (apt-get install beanstalkd); without it, its row is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
duration=8s
out="benches/results/tail-$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
cargo build --release -q
berth=target/release/berth
# The load generator, a binary of its own (bench/), built beside the server.
berth_bench="${berth%/*}/berth-bench"
last=$(( $(nproc) - 1 ))
mkdir -p "$out"
tmp=$(mktemp -d)
server_pids=()
cleanup() {
  local pid
  for pid in "${server_pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

run() {  # run NAME ROUND PROTOCOL PORT PID [BENCH ARGS...]
  local name="$1" round="$2" protocol="$3" port="$4" pid="$5" server
  shift 5
  if [ "$protocol" = berth ]; then server="http://127.0.0.1:$port"; else server="127.0.0.1:$port"; fi
  "$berth_bench" --server "$server" --protocol "$protocol" --server-pid "$pid" --workload cycle --connections 16 \
    --duration "$duration" --client-cpus "$last" --messages 0 --json "$out/$name-$round.json" "$@" \
    > "$out/$name-$round.txt" 2>&1
}

stop() {  # stop PID
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  server_pids=()
}

berth_run() {  # berth_run NAME ROUND PORT FSYNC PARTITIONS
  local name="$1" round="$2" port="$3" fsync="$4" partitions="$5" pid
  taskset -c 0 "$berth" serve --cores 1 --listen "127.0.0.1:$port" --data-dir "$tmp/d$port" --fsync "$fsync" \
    > "$tmp/s$port.log" 2>&1 &
  pid=$!
  server_pids=("$pid")
  wait_port "$port"
  kill -0 "$pid" || { echo "berth did not start on port $port (taken?):" >&2; cat "$tmp/s$port.log" >&2; exit 1; }
  run "$name" "$round" berth "$port" "$pid" --partitions "$partitions"
  stop "$pid"
  rm -rf "$tmp/d$port"
}

for round in $(seq "$rounds"); do
  if command -v beanstalkd >/dev/null; then
    taskset -c 0 beanstalkd -l 127.0.0.1 -p 11398 &
    bpid=$!
    server_pids=("$bpid")
    wait_port 11398
    kill -0 "$bpid" || { echo "beanstalkd did not start on port 11398 (taken?)" >&2; exit 1; }
    run beanstalkd "$round" beanstalkd 11398 "$bpid"
    stop "$bpid"
  fi
  berth_run berth-memory "$round" 17411 never 1
  berth_run berth-fsync-1p "$round" 17412 always 1
  berth_run berth-fsync-16p "$round" 17413 always 16
  echo "  round $round done"
done

python3 - "$out" <<'PY'
import os, re, statistics, sys
out = sys.argv[1]
runs = {}
for name in sorted(os.listdir(out)):
    m = re.match(r"(.+)-(\d+)\.txt$", name)
    if not m:
        continue
    text = open(os.path.join(out, name)).read()
    row = re.search(r"^all\s+cycle\s+\d+\s+(\d+)\s+(\d+)\s+\d+\s+(\d+)\s+(\d+)", text, re.M)
    cpu = re.search(r"server CPU: ([\d.]+) µs per cycle", text)
    if row and cpu:
        rate, p50, p99, p999 = (int(g) for g in row.groups())
        runs.setdefault(m.group(1), {})[int(m.group(2))] = (rate, p50, p99, p999, float(cpu.group(1)))
order = [n for n in ["beanstalkd", "berth-memory", "berth-fsync-1p", "berth-fsync-16p"] if n in runs]
peer = runs.get("beanstalkd", {})
rows = ["| server | rounds | cycles/s | p50 µs | p99 µs | p99.9 µs | server CPU µs per cycle | p99 / beanstalkd's (per round; median) |",
        "|---|---|---|---|---|---|---|---|"]
for name in order:
    values = list(runs[name].values())
    med = lambda i: statistics.median(v[i] for v in values)
    ratios = [v[2] / peer[r][2] for r, v in sorted(runs[name].items()) if r in peer and name != "beanstalkd"]
    ratio = (", ".join(f"{x:.2f}" for x in ratios) + f"; **{statistics.median(ratios):.2f}×**") if ratios else ""
    rows.append(f"| {name} | {len(values)} | {med(0):,.0f} | {med(1):,.0f} | {med(2):,.0f} | {med(3):,.0f} | "
                f"{med(4):.1f} | {ratio} |")
table = "\n".join(rows)
open(os.path.join(out, "table.md"), "w").write(table + "\n")
print(table)
PY
echo "results: $out"
