#!/usr/bin/env bash
# What the SQS face costs over the native API, in one run: the same server (pinned to CPU 0, one core, fsync never
# by default), the same load generator (this tree's `berth-bench` on the last CPU), the same load: 16 connections
# each doing send -> receive -> delete of 100-byte messages, natively (POST /produce, GET /consume, POST /ack) and
# through the SQS face (SendMessage, ReceiveMessage, DeleteMessage in the JSON protocol, as a current AWS SDK sends
# them). Rounds are interleaved (native, SQS, native, SQS, ...) on one server, so drift hits both alike; the table
# gives medians and the per-round ratio of the server's CPU per cycle.
#   benches/sqs_cost.sh [--rounds 5] [--duration 4s] [--fsync never|always] [--batch 1] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5
duration=4s
fsync=never
batch=1
out="benches/results/sqs-cost-$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --fsync) fsync="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
cargo build --release -q
berth=target/release/berth
berth_bench=target/release/berth-bench
last=$(( $(nproc) - 1 ))
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
port=17470
taskset -c 0 "$berth" serve --cores 1 --listen "127.0.0.1:$port" --data-dir "$tmp/data" --fsync "$fsync" \
  > "$out/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
for round in $(seq "$rounds"); do
  for protocol in berth sqs; do
    "$berth_bench" --server "http://127.0.0.1:$port" --protocol "$protocol" --server-pid "$pid" --workload cycle \
      --connections 16 --batch "$batch" --duration "$duration" --client-cpus "$last" \
      --json "$out/$protocol-$round.json" > "$out/$protocol-$round.txt" 2>&1
  done
  echo "  round $round done"
done
kill "$pid"; wait "$pid" 2>/dev/null || true

python3 - "$out" "$rounds" "$fsync" "$batch" <<'PY'
import os, re, statistics, sys
out, rounds, fsync, batch = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def read(protocol, r):
    text = open(os.path.join(out, f"{protocol}-{r}.txt")).read()
    rate = re.search(r"^all\s+cycle\s+\d+\s+(\d+)", text, re.M)
    cpu = re.search(r"server CPU: ([\d.]+) µs per cycle \(user ([\d.]+), kernel ([\d.]+)\)", text)
    p99 = re.search(r"^all\s+cycle\s+(?:\S+\s+){6}(\S+)", text, re.M)
    if not (rate and cpu):
        sys.exit(f"{protocol}-{r}.txt: no figures:\n{text}")
    return int(rate.group(1)), float(cpu.group(1)), float(cpu.group(2)), float(cpu.group(3))
runs = {p: [read(p, r) for r in range(1, rounds + 1)] for p in ("berth", "sqs")}
ratios = [s[1] / b[1] for b, s in zip(runs["berth"], runs["sqs"])]
rows = [f"fsync {fsync}, batch {batch}, {rounds} interleaved rounds, server on CPU 0 (one core), 16 connections",
        "",
        "| API | cycles/s (median) | server CPU µs per cycle (median) | user | kernel |",
        "|---|---|---|---|---|"]
for name, label in (("berth", "native"), ("sqs", "SQS face (JSON)")):
    v = runs[name]
    rows.append(f"| {label} | {statistics.median(x[0] for x in v):,.0f} | {statistics.median(x[1] for x in v):.1f} | "
                f"{statistics.median(x[2] for x in v):.1f} | {statistics.median(x[3] for x in v):.1f} |")
rows.append("")
rows.append("SQS / native server CPU per cycle, per round: " + ", ".join(f"{r:.2f}" for r in ratios)
            + f" (median {statistics.median(ratios):.2f}; target ≤ 1.5)")
table = "\n".join(rows)
open(os.path.join(out, "table.md"), "w").write(table + "\n")
print(table)
PY
