#!/usr/bin/env bash
# Durable throughput in one run on this machine (the group-commit issue's figures), servers on CPU 0, load on the
# last CPU, 100-byte messages, every produce fsynced:
#   - cycle (produce -> consume -> ack), 16 connections: Redis Streams with `appendfsync always` (XADD, XREADGROUP,
#     XACK, driven by the same `berth-bench --protocol redis`), then berth at 1, 16 and 256 partitions;
#   - the same cycle batched, 100 messages per request, and batched produce alone;
#   - fsynced produce at 64 connections with wrk (epoll client, keyless POST /produce) on 1 and 16 partitions, and
#     two references beside it: berth with --fsync never, and the floor server of benches/floor/floor.c (canned
#     replies, nothing but epoll_wait, recv and send), whose rate is the most this client drives from one core;
#   - the sync floor (benches/floor/syncfloor.c): a pwrite and an fdatasync in a C loop on the data directory's
#     disk, the CPU and wall time any server pays per group commit here.
#   benches/group_commit.sh [--duration 10s] [--rounds 3] [--wrk-rounds N] [--out DIR]
# The Redis and berth cycles run --rounds times, interleaved (Redis, then berth at each partition count, per round),
# and so do the wrk runs, --wrk-rounds times (default: --rounds; fsynced on 1 and 16 partitions, in memory, floor);
# the summary quotes each one's median: on a shared, noisy machine one run of each says little.
# Needs redis-server and wrk (apt-get install redis-server wrk); a missing one is skipped with a note.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=10s
rounds=3
wrk_rounds=
out="benches/results/group-commit-$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --wrk-rounds) wrk_rounds="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
wrk_rounds=${wrk_rounds:-$rounds}
mkdir -p "$out"
cargo build --release -q
berth=target/release/berth
# The load generator, a binary of its own (bench/), built beside the server.
berth_bench="${berth%/*}/berth-bench"
last=$(( $(nproc) - 1 ))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT

run() {  # run NAME bench-args...
  local name="$1"; shift
  "$berth_bench" --duration "$duration" --client-cpus "$last" --json "$out/$name.json" "$@" > "$out/$name.txt" 2>&1
  echo "  $name done"
}

for r in $(seq "$rounds"); do
  if command -v redis-server >/dev/null; then
    rm -rf "$tmp/redis"; mkdir -p "$tmp/redis"
    taskset -c 0 redis-server --port 16399 --bind 127.0.0.1 --dir "$tmp/redis" --save "" \
      --appendonly yes --appendfsync always > "$tmp/redis.log" 2>&1 & rpid=$!
    for _ in $(seq 50); do redis-cli -p 16399 ping >/dev/null 2>&1 && break; sleep 0.1; done
    "$berth_bench" --server 127.0.0.1:16399 --protocol redis --server-pid "$rpid" --workload cycle --connections 16 \
      --duration "$duration" --client-cpus "$last" --json "$out/redis-always-cycle-r$r.json" > "$out/redis-always-cycle-r$r.txt" 2>&1
    echo "  redis-always-cycle-r$r done"
    kill "$rpid"; wait "$rpid" 2>/dev/null || true
  elif [ "$r" = 1 ]; then
    echo "redis-server not installed: no Redis baseline" >&2
  fi
  for p in 1 16 256 1000; do
    run "berth-always-cycle-p$p-r$r" --workload cycle --connections 16 --partitions "$p" --fsync always --server-cpus 0
  done
done
run "berth-always-cycle-batch100" --workload cycle --connections 16 --batch 100 --fsync always --server-cpus 0
run "berth-always-produce-batch100" --workload produce --connections 16 --batch 100 --fsync always --server-cpus 0

if command -v wrk >/dev/null; then
  port=17171
  cat > "$tmp/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = string.rep("x", 100)
LUA
  floor_built=
  if command -v cc >/dev/null && cc -O2 -o "$tmp/floor" benches/floor/floor.c; then floor_built=1; fi
  # Interleaved rounds too (a fresh server and data directory each): fsynced on 1 and 16 partitions, then the same
  # produce kept in memory, then the floor server (the client's ceiling on this machine).
  for r in $(seq "$wrk_rounds"); do
    rm -rf "$tmp/wrk" "$tmp/wrk-never"
    taskset -c 0 "$berth" serve --cores 1 --listen "127.0.0.1:$port" --data-dir "$tmp/wrk" > "$tmp/wrk-server.log" 2>&1 &
    spid=$!
    for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
    for p in 1 16; do
      curl -fs -X PUT "http://127.0.0.1:$port/topics/w$p?partitions=$p" >/dev/null
      taskset -c "$last" wrk -t1 -c64 -d"$duration" -s "$tmp/post.lua" "http://127.0.0.1:$port/produce?topic=w$p" \
        > "$out/wrk-always-produce-c64-p$p-r$r.txt"
      echo "  wrk-always-produce-c64-p$p-r$r done"
    done
    curl -fs "http://127.0.0.1:$port/metrics" > "$out/wrk-server-metrics-r$r.txt"
    kill "$spid"; wait "$spid" 2>/dev/null || true
    taskset -c 0 "$berth" serve --cores 1 --listen "127.0.0.1:$port" --data-dir "$tmp/wrk-never" --fsync never \
      > "$tmp/wrk-never-server.log" 2>&1 &
    spid=$!
    for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
    curl -fs -X PUT "http://127.0.0.1:$port/topics/w1?partitions=1" >/dev/null
    taskset -c "$last" wrk -t1 -c64 -d"$duration" -s "$tmp/post.lua" "http://127.0.0.1:$port/produce?topic=w1" \
      > "$out/wrk-never-produce-c64-p1-r$r.txt"
    echo "  wrk-never-produce-c64-p1-r$r done"
    kill "$spid"; wait "$spid" 2>/dev/null || true
    if [ -n "$floor_built" ]; then
      taskset -c 0 "$tmp/floor" "$port" & spid=$!
      for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
      taskset -c "$last" wrk -t1 -c64 -d"$duration" -s "$tmp/post.lua" "http://127.0.0.1:$port/produce?topic=w1" \
        > "$out/wrk-floor-produce-c64-r$r.txt"
      echo "  wrk-floor-produce-c64-r$r done"
      kill "$spid"; wait "$spid" 2>/dev/null || true
    fi
  done
else
  echo "wrk not installed: no epoll-client produce figures" >&2
fi

if command -v cc >/dev/null && cc -O2 -o "$tmp/syncfloor" benches/floor/syncfloor.c; then
  taskset -c 0 "$tmp/syncfloor" "$tmp" > "$out/sync-floor.txt" && cat "$out/sync-floor.txt"
fi

python3 - "$out" <<'PY'
import json, os, re, sys
out = sys.argv[1]
rows = []
for name in sorted(os.listdir(out)):
    path = os.path.join(out, name)
    if name.endswith(".json"):
        d = json.load(open(path))
        op = "produce" if d["settings"]["workload"] == "produce" else "cycle"
        m = d["clients"]["all"].get(op, {})
        per_sec = m.get("per_sec", 0)
        msgs = per_sec * d["settings"].get("batch", 1)
        rows.append((name[:-5], op, per_sec, msgs, m.get("p50_us"), m.get("p99_us"), d.get("server_cpu_us_per_unit")))
    elif name.startswith("wrk-") and name.endswith(".txt") and "metrics" not in name:
        text = open(path).read()
        rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
        lat = re.search(r"Latency\s+(\S+)", text)
        rows.append((name[:-4], "produce", float(rps.group(1)) if rps else 0, float(rps.group(1)) if rps else 0, lat.group(1) if lat else None, None, None))
# Rounds of one configuration (NAME-rK) are summarised by their median.
import statistics
groups = {}
for r in rows:
    base = re.sub(r"-r\d+$", "", r[0])
    groups.setdefault(base, []).append(r)
lines = ["| run | op | requests/s (median) | rounds | messages/s | p50 µs (wrk: mean) | p99 µs | server CPU µs/op |", "|---|---|---|---|---|---|---|---|"]
med = {}
for base, rs in groups.items():
    rs.sort(key=lambda r: r[2])
    med[base] = statistics.median(r[2] for r in rs)
    # Latency and CPU columns: the round nearest the median.
    m = min(rs, key=lambda r: abs(r[2] - med[base]))
    each = ", ".join("%.0f" % r[2] for r in rs) if len(rs) > 1 else "1"
    lines.append("| %s | %s | %.0f | %s | %.0f | %s | %s | %s |" % (base, m[1], med[base], each, med[base] * (m[3] / m[2] if m[2] else 1), m[4], m[5], "%.1f" % m[6] if m[6] else "n/a"))
get = lambda n: med.get(n, 0)
redis = get("redis-always-cycle")
one = get("berth-always-cycle-p1")
# The same ratios taken within each round (its runs are minutes apart at most), whose median drifts less with the
# machine's load than the ratio of two medians taken over the whole run.
by_name = {r[0]: r for r in rows}
def per_round(num, den):
    out = []
    for r in range(1, 100):
        a, b = by_name.get("%s-r%d" % (num, r)), by_name.get("%s-r%d" % (den, r))
        if a and b and a[2] and b[2]:
            out.append(a[2] / b[2])
    return out
lines.append("")
for p in (1, 16, 256, 1000):
    b = get("berth-always-cycle-p%d" % p)
    parts = ["berth cycle at %d partitions: %.0f/s (median)" % (p, b)]
    if one:
        parts.append("%.2f× the 1-partition figure" % (b / one))
    if redis:
        parts.append("%.2f× Redis appendfsync always (%.0f/s, median)" % (b / redis, redis))
    name = "berth-always-cycle-p%d" % p
    rounds = [("the 1-partition run", per_round(name, "berth-always-cycle-p1"))] if p != 1 else []
    rounds.append(("Redis", per_round(name, "redis-always-cycle")))
    for what, ratios in rounds:
        if len(ratios) > 1:
            parts.append("per round against %s: %s (median %.2f×)" % (what, ", ".join("%.2f" % x for x in ratios), statistics.median(ratios)))
    lines.append("- " + ", ".join(parts))
for name in ("wrk-always-produce-c64-p1", "wrk-always-produce-c64-p16", "wrk-never-produce-c64-p1"):
    if name not in med:
        continue
    parts = ["%s: %.0f/s (median)" % (name, med[name])]
    for ref in ("wrk-never-produce-c64-p1", "wrk-floor-produce-c64"):
        ratios = per_round(name, ref) if ref != name else []
        if len(ratios) > 1:
            parts.append("per round against %s: %s (median %.2f×)" % (ref, ", ".join("%.2f" % x for x in ratios), statistics.median(ratios)))
    lines.append("- " + ", ".join(parts))
floor = os.path.join(out, "sync-floor.txt")
if os.path.exists(floor):
    lines.append("- " + open(floor).read().strip())
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "results in $out"
