#!/usr/bin/env bash
# The unbatched cycle's server CPU, before and after, in one run: produce -> consume -> ack of 100-byte messages,
# 16 connections, fsync never (in memory), every server pinned to CPU 0 and driven by the same load generator (this
# tree's `berth-bench`) on the last CPU: beanstalkd (the peer), an earlier berth build (BEFORE) and this build.
# Rounds are interleaved so that the machine's drift hits every server alike; the table gives medians, with the
# server's CPU split into user and kernel time as /proc/PID/stat counts them.
# A fourth server, `floor` (benches/floor/floor.c, built here with cc when one is installed), answers the same requests
# with canned replies and does nothing but epoll_wait, recv and send: its CPU per cycle is the kernel's share that
# any server pays for the cycle's six loopback segments, so berth's distance to it is what berth itself costs.
#   benches/unbatched_cpu.sh --before PATH/TO/OLD/berth [--rounds 3] [--duration 5s] [--out DIR]
# Build an earlier release to compare with, e.g.:
#   git worktree add /tmp/berth-before fc5e9c6 && (cd /tmp/berth-before && cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
before=""
rounds=3
duration=5s
out="benches/results/unbatched-cpu-$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --before) before="$2"; shift 2 ;;
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
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
floor=""
if command -v cc >/dev/null && cc -O2 -o "$tmp/floor" benches/floor/floor.c; then
  floor="$tmp/floor"
else
  echo "no C compiler: the floor row is skipped" >&2
fi

wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

run() {  # run NAME ROUND PROTOCOL PORT PID
  local name="$1" round="$2" protocol="$3" port="$4" pid="$5" server
  if [ "$protocol" = berth ]; then server="http://127.0.0.1:$port"; else server="127.0.0.1:$port"; fi
  "$berth_bench" --server "$server" --protocol "$protocol" --server-pid "$pid" --workload cycle --connections 16 \
    --duration "$duration" --client-cpus "$last" --json "$out/$name-$round.json" > "$out/$name-$round.txt" 2>&1
}

berth_server() {  # berth_server BINARY PORT -> pid on stdout
  local bin="$1" port="$2"
  taskset -c 0 "$bin" serve --cores 1 --listen "127.0.0.1:$port" --data-dir "$tmp/d$port" --fsync never \
    > "$tmp/s$port.log" 2>&1 &
  echo $!
}

for round in $(seq "$rounds"); do
  if [ -n "$floor" ]; then
    taskset -c 0 "$floor" 17398 & fpid=$!
    wait_port 17398
    run floor "$round" berth 17398 "$fpid"
    kill "$fpid"; wait "$fpid" 2>/dev/null || true
  fi
  if command -v beanstalkd >/dev/null; then
    taskset -c 0 beanstalkd -l 127.0.0.1 -p 11399 & bpid=$!
    wait_port 11399
    run beanstalkd "$round" beanstalkd 11399 "$bpid"
    kill "$bpid"; wait "$bpid" 2>/dev/null || true
  fi
  if [ -n "$before" ]; then
    pid=$(berth_server "$before" 17401); wait_port 17401
    run berth-before "$round" berth 17401 "$pid"
    kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$tmp/d17401"
  fi
  pid=$(berth_server "$berth" 17402); wait_port 17402
  run berth-now "$round" berth 17402 "$pid"
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$tmp/d17402"
  echo "  round $round done"
done

python3 - "$out" <<'PY'
import json, os, re, statistics, sys
out = sys.argv[1]
runs = {}
for name in sorted(os.listdir(out)):
    m = re.match(r"(.+)-(\d+)\.txt$", name)
    if not m:
        continue
    text = open(os.path.join(out, name)).read()
    rate = re.search(r"^all\s+cycle\s+\d+\s+(\d+)", text, re.M)
    cpu = re.search(r"server CPU: ([\d.]+) µs per cycle \(user ([\d.]+), kernel ([\d.]+)\)", text)
    if rate and cpu:
        runs.setdefault(m.group(1), []).append(
            (int(rate.group(1)), float(cpu.group(1)), float(cpu.group(2)), float(cpu.group(3))))
rows = ["| server | rounds | cycles/s (median) | server CPU µs per cycle (median) | of which user | of which kernel |",
        "|---|---|---|---|---|---|"]
for name, values in runs.items():
    rows.append(f"| {name} | {len(values)} | {statistics.median(v[0] for v in values):,.0f} | "
                f"{statistics.median(v[1] for v in values):.1f} | {statistics.median(v[2] for v in values):.1f} | "
                f"{statistics.median(v[3] for v in values):.1f} |")
table = "\n".join(rows)
open(os.path.join(out, "table.md"), "w").write(table + "\n")
print(table)
PY
