#!/usr/bin/env bash
# Instructions per unbatched cycle, counted by valgrind's callgrind: the user-space work a server does for one
# produce -> consume -> ack of a 100-byte message (16 connections, fsync never, one core), the same on any machine
# and in any weather, where CPU time on this shared VM drifts by 15 % between runs. Kernel work (the sockets) is not
# counted. Each build given is run under callgrind in turn; the load is this tree's berth-bench; counters are zeroed
# after a warm-up and dumped after the measured run, and the count is divided by the cycles completed. With
# --beanstalkd, beanstalkd is counted the same way. The top functions by self count are printed for each.
#   benches/instructions.sh [--beanstalkd] [--duration 10s] [--top 25] BINARY [BINARY ...]
# Needs valgrind (apt-get install valgrind). A run under callgrind serves ~1,500 cycles/s.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=10s top=25 beanstalkd="" bins=()
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --top) top="$2"; shift 2 ;;
    --beanstalkd) beanstalkd=1; shift ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) bins+=("$1"); shift ;;
  esac
done
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
cargo build --release -q
bench=target/release/berth-bench
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

count() {  # count NAME PROTOCOL ADDRESS COMMAND...
  local name=$1 protocol=$2 address=$3 pid cycles dump
  shift 3
  valgrind --tool=callgrind --callgrind-out-file="$tmp/$name.cg" "$@" > "$tmp/$name.log" 2>&1 &
  pid=$!
  local url=$address
  [ "$protocol" = berth ] && url="http://$address"
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/${address%:*}/${address#*:}") 2>/dev/null && break; sleep 0.2; done
  "$bench" --server "$url" --protocol "$protocol" --workload cycle --connections 16 --duration 3s \
    --client-cpus "$(( $(nproc) - 1 ))" > "$tmp/$name.warm" 2>&1
  callgrind_control -z "$pid" > /dev/null
  "$bench" --server "$url" --protocol "$protocol" --workload cycle --connections 16 --duration "$duration" \
    --client-cpus "$(( $(nproc) - 1 ))" > "$tmp/$name.run" 2>&1
  callgrind_control -d "$pid" > /dev/null
  sleep 1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  cycles=$(awk '$1 == "all" && $2 == "cycle" {print $3}' "$tmp/$name.run")
  dump=$(ls "$tmp/$name.cg".* | head -1)
  echo "== $name: $cycles cycles"
  python3 benches/lib/callgrind_self.py "$dump" "$cycles" "$top"
}

if [ -n "$beanstalkd" ]; then
  count beanstalkd beanstalkd 127.0.0.1:11421 beanstalkd -l 127.0.0.1 -p 11421
fi
i=0
for bin in "${bins[@]}"; do
  i=$((i + 1))
  count "berth-$i" berth 127.0.0.1:17521 "$bin" serve --cores 1 --listen 127.0.0.1:17521 \
    --data-dir "$tmp/data-$i" --fsync never
  echo "   ($bin)"
done
