# Shared by the benchmark scripts that start servers of their own (benches/cluster.sh, replicated.sh, nats.sh):
# sourced, after the script set `out` (its results directory) and `tmp` (a temp directory it owns).
#
#   pin CPU                      a `taskset -c CPU` prefix when taskset exists (it execs: $! stays the command's pid)
#   wait_up URL SECONDS PID [curl args]   until `curl URL` succeeds; fails early when PID is gone
#   stop_pids PID...             SIGTERM each in turn, SIGKILL after 10 s
#   pids+=(PID)                  processes the EXIT trap stops, last started first
#   start_etcd BIN PORT CPU      etcd on 127.0.0.1:PORT (peers on PORT+1), data and log in $tmp; sets etcd_url
#   start_berth_nodes N BASE CPU_OF ARGS...  berth nodes n1..nN on 127.0.0.1:BASE+i (node RPC on BASE+100+i), each
#                                `--cores 1` on CPU $(CPU_OF i), joined to $etcd_url, with ARGS; waits until each
#                                is healthy and sees N live nodes; sets urls, node_pids and all_pids (comma list)

pin() { if command -v taskset >/dev/null; then echo "taskset -c $1"; fi; }

wait_up() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    curl -fs -o /dev/null --max-time 1 "${@:4}" "$1" && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

stop_pids() {
  local pid
  for pid in "$@"; do
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

pids=()
# On exit: a failed run keeps its servers' logs in $out/logs-failed; servers stop last started first (berth nodes
# before etcd: a clean stop revokes their leases); the temp directory goes.
bench_cleanup() {
  local status=$? k reversed=()
  if ((status != 0)); then
    mkdir -p "$out/logs-failed" && cp "$tmp"/*.log "$tmp"/*.err "$out/logs-failed/" 2>/dev/null || true
  fi
  for ((k = ${#pids[@]} - 1; k >= 0; k--)); do reversed+=("${pids[k]}"); done
  ((${#reversed[@]} == 0)) || stop_pids "${reversed[@]}"
  rm -rf "$tmp"
}
trap bench_cleanup EXIT

start_etcd() {
  local bin=$1 port=$2 cpu=$3
  etcd_url=http://127.0.0.1:$port
  $(pin "$cpu") "$bin" --name=berth-bench --data-dir="$tmp/etcd" \
    --listen-client-urls="$etcd_url" --advertise-client-urls="$etcd_url" \
    --listen-peer-urls=http://127.0.0.1:$((port + 1)) \
    --initial-advertise-peer-urls=http://127.0.0.1:$((port + 1)) \
    --initial-cluster=berth-bench=http://127.0.0.1:$((port + 1)) >"$tmp/etcd.log" 2>&1 &
  local etcd_pid=$!
  pids+=("$etcd_pid")
  wait_up "$etcd_url/v3/kv/range" 20 "$etcd_pid" -X POST -d '{"key":"AA=="}' ||
    { tail -20 "$tmp/etcd.log" >&2; die "etcd did not come up (port $port taken?)"; }
}

start_berth_nodes() {
  local n=$1 base=$2 cpu_of=$3 i cpu u
  shift 3
  urls=()
  node_pids=()
  for i in $(seq "$n"); do
    cpu=$($cpu_of "$i")
    BERTH_LOG=info NO_COLOR=1 $(pin "$cpu") "$berth" serve --listen 127.0.0.1:$((base + i)) --data-dir "$tmp/n$i" \
      --cores 1 --cpus "$cpu" --cluster "$etcd_url" --cluster-name bench --node-id "n$i" \
      --advertise 127.0.0.1:$((base + i)) --peer-listen 127.0.0.1:$((base + 100 + i)) "$@" >"$tmp/n$i.log" 2>&1 &
    pids+=($!)
    node_pids+=($!)
    urls+=("http://127.0.0.1:$((base + i))")
  done
  for i in $(seq "$n"); do
    wait_up "${urls[i - 1]}/health" 30 "${node_pids[i - 1]}" ||
      { tail -20 "$tmp/n$i.log" >&2; die "node n$i did not become healthy"; }
  done
  for u in "${urls[@]}"; do
    for _ in $(seq 100); do [[ $(live_nodes "$u" 2>/dev/null || echo 0) == "$n" ]] && break; sleep 0.1; done
    [[ $(live_nodes "$u") == "$n" ]] || die "$u does not see $n live nodes"
  done
  all_pids=$(IFS=,; echo "${node_pids[*]}")
}

live_nodes() {  # live_nodes URL: how many nodes URL's /cluster shows alive
  curl -fs "$1/cluster" | python3 -c 'import json,sys; print(sum(n["alive"] for n in json.load(sys.stdin)["nodes"]))'
}
