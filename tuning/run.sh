#!/usr/bin/env bash
# The tuning lab runner: for each profile, record the host's current settings, apply the profile's knobs (skipping
# and reporting every one the host refuses), run the same `berth-bench` workload, revert everything, and finally
# write a side-by-side comparison (markdown + JSON) and an overlaid latency plot.
#
#   tuning/run.sh [--profiles "baseline low-latency throughput io-uring-sync"] [--duration 10s] [--rounds 1]
#                 [--out target/tuning/DATE] [--bench-args "--workload cycle --connections 16"] [--dry-run] [--help]
#
# With --rounds N every profile runs N times, interleaved (round 1: each profile in turn, then round 2...), so a
# drift of the machine's speed falls on all of them; the comparison gives medians and, per profile, the median of
# its per-round ratios to the first profile (the baseline).
#
# Needs root for kernel knobs (without it every kernel knob is reported as skipped). Safe to interrupt: an EXIT trap
# reverts whatever was applied. --dry-run changes nothing and runs no bench: it prints, per profile, each knob's
# current value and what the profile would set it to.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
profiles="baseline low-latency throughput io-uring-sync"
duration="10s"
rounds=1
out="$root/target/tuning/$(date -u +%Y-%m-%dT%H%M%SZ)"
bench_args="--workload cycle --connections 16 --message-bytes 100"
dry=0
usage() {
  cat <<USAGE
usage: tuning/run.sh [options]

Applies each profile's kernel and engine knobs (tuning/profiles/NAME.profile), runs the same berth-bench workload,
reverts every change (also on Ctrl-C), and writes a comparison of the profiles.

  --profiles "A B"     profiles to run, in order (default: $profiles)
  --duration D         bench duration per profile (default: $duration)
  --rounds N           run every profile N times, interleaved (default: $rounds); the comparison quotes medians
                       and per-round ratios to the first profile
  --out DIR            results directory (default: target/tuning/<UTC time>, outside git; pass
                       --out tuning/results/NAME to keep a run in the repository)
  --bench-args "ARGS"  berth-bench workload arguments (default: $bench_args)
  --dry-run            change nothing, run nothing: show each knob's current value and what would be set
  --help               this text

Needs root for the kernel knobs: it changes sysctls, the CPU governor, transparent hugepages and every IRQ's
affinity while a profile runs, and restores each one afterwards.
USAGE
}
while [ $# -gt 0 ]; do
  case "$1" in
    --profiles) profiles="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --bench-args) bench_args="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1 (tuning/run.sh --help lists them)" >&2; exit 2 ;;
  esac
done
for profile in $profiles; do
  [ -f "$here/profiles/$profile.profile" ] || { echo "no profile $here/profiles/$profile.profile" >&2; exit 2; }
done
if [ "$dry" = 1 ]; then
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
  echo "dry run: nothing is changed and no bench runs"
  for profile in $profiles; do
    DESCRIPTION=""; SYSCTLS=""; GOVERNOR=""; THP=""; IRQ_CPUS=""; ENGINE_TOML=""
    RPS_CPUS=""; ISOLATE_TO=""; PM_QOS_US=""; HALT_POLL_NS=""
    # shellcheck disable=SC1090
    . "$here/profiles/$profile.profile"
    echo "== $profile: $DESCRIPTION"
    [ -n "$RPS_CPUS" ] && printf '    %-34s %s -> cpus %s\n' "rps (lo)" "$(cat /sys/class/net/lo/queues/rx-0/rps_cpus 2>/dev/null || echo absent)" "$RPS_CPUS"
    [ -n "$ISOLATE_TO" ] && printf '    %-34s %s\n' "isolation" "every other task moved to cpus $ISOLATE_TO"
    [ -n "$PM_QOS_US" ] && printf '    %-34s %s\n' "cpu_dma_latency" "$( [ -w /dev/cpu_dma_latency ] && echo "held at $PM_QOS_US us" || echo absent)"
    [ -n "$HALT_POLL_NS" ] && printf '    %-34s %s -> %s (cpuidle driver: %s)\n' "guest_halt_poll_ns" "$(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null || echo absent)" "$HALT_POLL_NS" "$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)"
    for kv in $SYSCTLS; do
      key="${kv%%=*}"
      printf '    %-34s %s -> %s\n' "$key" "$(sysctl -n "$key" 2>/dev/null || echo absent)" "${kv#*=}"
    done
    if [ -n "$GOVERNOR" ]; then
      f=/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor
      printf '    %-34s %s -> %s\n' "cpu governor" "$(cat "$f" 2>/dev/null || echo "absent (no cpufreq)")" "$GOVERNOR"
    fi
    if [ -n "$THP" ]; then
      printf '    %-34s %s -> %s\n' "transparent_hugepage" \
        "$(sed -n 's/.*\[\(.*\)\].*/\1/p' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo absent)" "$THP"
    fi
    [ -n "$IRQ_CPUS" ] && printf '    %-34s %s -> cpus %s\n' "irq affinity" "$(ls -d /proc/irq/[0-9]* 2>/dev/null | wc -l) IRQs" "$IRQ_CPUS"
    [ -n "$ENGINE_TOML" ] && printf '    %-34s %s\n' "engine" "$(echo "$ENGINE_TOML" | tr '\n' ' ')"
  done
  exit 0
fi
mkdir -p "$out"
berth="$root/target/release/berth"
# The load generator, a binary of its own (bench/), built beside the server.
berth_bench="${berth%/*}/berth-bench"
{ [ -x "$berth" ] && [ -x "$berth_bench" ]; } || (cd "$root" && cargo build --release) || exit 1

# ---- revert journal: every change is recorded as a command that undoes it, run in reverse order at the end ----
journal="$out/.revert"
: > "$journal"
revert_all() {
  if [ -s "$journal" ]; then
    tac "$journal" | while IFS= read -r cmd; do eval "$cmd" >/dev/null 2>&1 || echo "  revert failed: $cmd" >&2; done
    : > "$journal"
  fi
}

report=""   # per-profile lines "knob<TAB>status<TAB>detail"
note() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$out/$profile.knobs.tsv"; printf '    %-34s %-8s %s\n' "$1" "$2" "$3"; }

apply_sysctl() {
  local kv="$1" key="${1%%=*}" value="${1#*=}" old
  if ! old=$(sysctl -n "$key" 2>/dev/null); then note "$key" skipped "not present on this kernel"; return; fi
  if [ "$old" = "$value" ]; then note "$key" same "already $value"; return; fi
  if sysctl -w "$kv" >/dev/null 2>&1 && [ "$(sysctl -n "$key")" = "$value" ]; then
    echo "sysctl -w '$key=$old'" >> "$journal"; note "$key" applied "$old -> $value"
  else
    note "$key" refused "host refused (was $old)"
  fi
}

apply_file() {  # apply_file NAME PATH VALUE: write VALUE to a sysfs file, remembering the old selection
  local name="$1" path="$2" value="$3" old
  if [ ! -w "$path" ]; then note "$name" skipped "$path not writable or absent"; return; fi
  old=$(cat "$path" 2>/dev/null); old=$(echo "$old" | sed -n 's/.*\[\(.*\)\].*/\1/p;t;p' | head -1)
  if echo "$value" > "$path" 2>/dev/null; then
    echo "echo '$old' > '$path'" >> "$journal"; note "$name" applied "$old -> $value"
  else
    note "$name" refused "write refused (was $old)"
  fi
}

apply_governor() {
  local gov="$1" n=0 f
  for f in /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor; do
    [ -e "$f" ] || continue
    apply_file "governor($(basename "$(dirname "$(dirname "$f")")"))" "$f" "$gov"; n=$((n + 1))
  done
  [ "$n" -gt 0 ] || note "cpu governor" skipped "no cpufreq on this host (VMs rarely expose it)"
}

apply_irqs() {
  local cpus="$1" mask=0 c n=0 irq f old
  for c in ${cpus//,/ }; do mask=$((mask | (1 << c))); done
  mask=$(printf '%x' "$mask")
  for f in /proc/irq/[0-9]*/smp_affinity; do
    irq=$(basename "$(dirname "$f")")
    old=$(cat "$f" 2>/dev/null) || continue
    if echo "$mask" > "$f" 2>/dev/null; then echo "echo '$old' > '$f'" >> "$journal"; n=$((n + 1)); fi
  done
  if [ "$n" -gt 0 ]; then note "irq affinity" applied "$n IRQs -> cpus $cpus"; else note "irq affinity" refused "no IRQ accepted a new affinity"; fi
}

apply_rps() {  # the loopback device's receive packet steering: which CPUs run its receive processing
  local cpus="$1" mask=0 c
  for c in ${cpus//,/ }; do mask=$((mask | (1 << c))); done
  apply_file "rps_cpus(lo)" /sys/class/net/lo/queues/rx-0/rps_cpus "$(printf '%x' "$mask")"
}

apply_isolation() {  # every thread that accepts it moves to CPUs $1 (so the server's CPU runs the server alone)
  local to="$1" n=0 refused=0 task tid old
  for task in /proc/[0-9]*/task/[0-9]*; do
    tid=${task##*/}
    [ "$tid" = "$$" ] && continue
    # Each thread's own mask (a process may pin its threads one by one), restored thread by thread.
    old=$(taskset -p "$tid" 2>/dev/null | sed -n 's/.*: //p')
    [ -n "$old" ] || continue
    if taskset -p -c "$to" "$tid" >/dev/null 2>&1; then
      echo "taskset -p '$old' '$tid'" >> "$journal"; n=$((n + 1))
    else
      refused=$((refused + 1))
    fi
  done
  # Threads started during the run inherit the narrowed mask: at the revert, any thread left on exactly these CPUs
  # that was not moved here gets every online CPU back (the mask a new task has on a host that pins nothing).
  echo "unisolate_strays '$to'" >> "$journal"
  if [ "$n" -gt 0 ]; then note "isolation" applied "$n threads -> cpus $to ($refused refused: kernel threads, exited)";
  else note "isolation" refused "no thread accepted a new affinity"; fi
}

unisolate_strays() {
  local to="$1" mask=0 c want task tid
  for c in ${to//,/ }; do mask=$((mask | (1 << c))); done
  want=$(printf '%x' "$mask")
  for task in /proc/[0-9]*/task/[0-9]*; do
    tid=${task##*/}
    grep -q "^taskset -p '[^']*' '$tid'\$" "$journal" 2>/dev/null && continue
    if [ "$(taskset -p "$tid" 2>/dev/null | sed -n 's/.*: //p')" = "$want" ]; then
      taskset -p -c "0-$(($(nproc) - 1))" "$tid" >/dev/null 2>&1 || true
    fi
  done
}

# /dev/cpu_dma_latency, held open on fd 9 while the bench runs (the bench is started with fd 9 closed, so only this
# shell holds the request and closing it ends it).
pm_qos_held=0
apply_pm_qos() {  # no CPU idles in a state slower to leave than $1 µs while the bench runs
  if [ ! -w /dev/cpu_dma_latency ]; then note "cpu_dma_latency" skipped "/dev/cpu_dma_latency absent or not writable"; return; fi
  local v="$1"
  # The kernel takes a 4-byte write as a binary s32 (other lengths as a hex string).
  if exec 9>/dev/cpu_dma_latency &&
    printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $((v & 255)) $((v >> 8 & 255)) $((v >> 16 & 255)) $((v >> 24 & 255)))" >&9; then
    pm_qos_held=1
    note "cpu_dma_latency" applied "held at $v us during the run (idle driver: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none))"
  else
    note "cpu_dma_latency" refused "the kernel refused the request"
  fi
}
release_pm_qos() { if [ "$pm_qos_held" = 1 ]; then exec 9>&-; pm_qos_held=0; fi; }

apply_halt_poll() {
  local driver
  driver=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)
  if [ "$driver" != "haltpoll" ]; then
    note "guest_halt_poll_ns" skipped "the cpuidle driver is $driver, not haltpoll: the parameter would change nothing"
    return
  fi
  apply_file "guest_halt_poll_ns" /sys/module/haltpoll/parameters/guest_halt_poll_ns "$1"
}
trap 'release_pm_qos; revert_all' EXIT
trap 'echo "interrupted: reverting" >&2; exit 130' INT TERM

echo "tuning lab: profiles [$profiles], $rounds round(s), bench: $bench_args --duration $duration; results in $out"
echo "host: $(uname -sr), $(nproc) CPUs, memlock $(ulimit -l), user $(id -un)" | tee "$out/host.txt"
for round in $(seq "$rounds"); do
for profile in $profiles; do
  file="$here/profiles/$profile.profile"
  DESCRIPTION=""; SYSCTLS=""; GOVERNOR=""; THP=""; IRQ_CPUS=""; ENGINE_TOML=""
  RPS_CPUS=""; ISOLATE_TO=""; PM_QOS_US=""; HALT_POLL_NS=""
  # shellcheck disable=SC1090
  . "$file"
  # Round 1's file names are the profile's (as a one-round run writes them); later rounds add `.rN`.
  name="$profile"; [ "$round" -gt 1 ] && name="$profile.r$round"
  : > "$out/$profile.knobs.tsv"
  echo "== round $round/$rounds: $profile: $DESCRIPTION"
  for kv in $SYSCTLS; do apply_sysctl "$kv"; done
  [ -n "$GOVERNOR" ] && apply_governor "$GOVERNOR"
  if [ -n "$THP" ]; then
    apply_file "transparent_hugepage" /sys/kernel/mm/transparent_hugepage/enabled "$THP"
  fi
  [ -n "$IRQ_CPUS" ] && apply_irqs "$IRQ_CPUS"
  [ -n "$RPS_CPUS" ] && apply_rps "$RPS_CPUS"
  [ -n "$ISOLATE_TO" ] && apply_isolation "$ISOLATE_TO"
  [ -n "$HALT_POLL_NS" ] && apply_halt_poll "$HALT_POLL_NS"
  [ -n "$PM_QOS_US" ] && apply_pm_qos "$PM_QOS_US"
  printf '%s\n' "$ENGINE_TOML" > "$out/$profile.engine.toml"
  if [ -n "$ENGINE_TOML" ]; then note "engine" applied "$(echo "$ENGINE_TOML" | tr '\n' ' ')"; fi
  # shellcheck disable=SC2086
  "$berth_bench" $bench_args --duration "$duration" --server-config "$out/$profile.engine.toml" \
      --json "$out/$name.json" --hgrm-dir "$out/$name-hgrm" --svg "$out/$name.svg" \
      > "$out/$name.txt" 2> "$out/$name.stderr" 9>&- || echo "  bench failed for $profile (see $out/$name.stderr)"
  sed -n '1,40p' "$out/$name.txt" | sed 's/^/    /'
  release_pm_qos
  revert_all
  echo "  reverted"
done
done
python3 "$here/compare.py" "$out" $profiles && echo "comparison: $out/comparison.md, $out/comparison.json, $out/comparison.svg"
