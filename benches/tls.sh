#!/usr/bin/env bash
# What TLS costs per request: the same build served over plain HTTP and over HTTPS (--tls-cert-file), driven by
# this tree's `berth-bench` (with --cacert for HTTPS) through the unbatched cycle (produce -> consume -> ack of
# 100-byte messages, 16 keep-alive connections), server pinned to CPU 0 and the load generator to the last CPU.
# Rounds interleave plain and TLS so the machine's drift hits both alike; the table gives medians and the per-round
# TLS/plain ratios. Connections are opened once per run, so this is the per-request cost (record encryption and
# decryption, the extra copies), not the handshake's.
#   benches/tls.sh [--rounds 5] [--duration 5s] [--fsync never|always] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5
duration=5s
fsync=never
out="benches/results/tls-$(date -u +%Y-%m-%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --fsync) fsync="$2"; shift 2 ;;
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

# A self-signed server certificate for 127.0.0.1 (not a CA: rustls refuses a CA certificate as a server's).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -days 1 -nodes -subj /CN=localhost \
  -addext subjectAltName=IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE \
  -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>/dev/null

wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

serve() {  # serve PORT [FLAGS...] -> pid on stdout
  local port="$1"; shift
  taskset -c 0 "$berth" serve --cores 1 --listen "127.0.0.1:$port" --data-dir "$tmp/d$port" --fsync "$fsync" "$@" \
    > "$tmp/s$port.log" 2>&1 &
  echo $!
}

for round in $(seq "$rounds"); do
  pid=$(serve 17501); wait_port 17501
  "$berth_bench" --server "http://127.0.0.1:17501" --server-pid "$pid" --workload cycle --connections 16 \
    --duration "$duration" --client-cpus "$last" --json "$out/plain-$round.json" > "$out/plain-$round.txt" 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$tmp/d17501"

  pid=$(serve 17502 --tls-cert-file "$tmp/cert.pem" --tls-key-file "$tmp/key.pem"); wait_port 17502
  "$berth_bench" --server "https://127.0.0.1:17502" --cacert "$tmp/cert.pem" --server-pid "$pid" --workload cycle \
    --connections 16 --duration "$duration" --client-cpus "$last" --json "$out/tls-$round.json" \
    > "$out/tls-$round.txt" 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$tmp/d17502"
  echo "  round $round done"
done

python3 - "$out" "$fsync" <<'PY'
import os, re, statistics, sys
out, fsync = sys.argv[1], sys.argv[2]
runs = {}
for name in sorted(os.listdir(out)):
    m = re.match(r"(plain|tls)-(\d+)\.txt$", name)
    if not m:
        continue
    text = open(os.path.join(out, name)).read()
    row = re.search(r"^all\s+cycle\s+\d+\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", text, re.M)
    cpu = re.search(r"server CPU: ([\d.]+) µs per cycle \(user ([\d.]+), kernel ([\d.]+)\)", text)
    if not (row and cpu):
        sys.exit(f"{name}: no result line:\n{text}")
    runs.setdefault(m.group(1), {})[int(m.group(2))] = {
        "rate": int(row.group(1)), "p50": int(row.group(2)), "p99": int(row.group(4)),
        "cpu": float(cpu.group(1)), "user": float(cpu.group(2)), "kernel": float(cpu.group(3))}
med = lambda kind, key: statistics.median(r[key] for r in runs[kind].values())
rows = [f"fsync {fsync}; unbatched cycle, 16 connections, server on CPU 0; {len(runs['plain'])} interleaved rounds", "",
        "| listener | cycles/s | cycle p50 µs | cycle p99 µs | server CPU µs/cycle | user | kernel |",
        "|---|---|---|---|---|---|---|"]
for kind in ("plain", "tls"):
    rows.append(f"| {kind} | {med(kind, 'rate'):,.0f} | {med(kind, 'p50'):.0f} | {med(kind, 'p99'):.0f} | "
                f"{med(kind, 'cpu'):.1f} | {med(kind, 'user'):.1f} | {med(kind, 'kernel'):.1f} |")
ratios = {k: [runs["tls"][r][k] / runs["plain"][r][k] for r in sorted(runs["plain"]) if r in runs["tls"]]
          for k in ("rate", "p99", "cpu")}
rows += ["", "TLS / plain per round: " + "; ".join(
    f"{k} " + " ".join(f"{v:.2f}" for v in vals) + f" (median {statistics.median(vals):.2f})"
    for k, vals in ratios.items())]
extra = [runs["tls"][r]["cpu"] - runs["plain"][r]["cpu"] for r in sorted(runs["plain"]) if r in runs["tls"]]
rows.append(f"TLS's server CPU per cycle (3 requests) minus plain's, per round: "
            + " ".join(f"{v:.1f}" for v in extra) + f" µs (median {statistics.median(extra):.1f} µs, "
            f"{statistics.median(extra) / 3:.1f} µs per request)")
table = "\n".join(rows)
open(os.path.join(out, "table.md"), "w").write(table + "\n")
print(table)
PY
