#!/usr/bin/env bash
# The tuning lab runner: for each profile, record the host's current settings, apply the profile's knobs (skipping
# and reporting every one the host refuses), run the same `berth-bench` workload, revert everything, and finally
# write a side-by-side comparison (markdown + JSON) and an overlaid latency plot.
#
#   tuning/run.sh [--profiles "baseline low-latency throughput io-uring-sync"] [--duration 10s]
#                 [--out target/tuning/DATE] [--bench-args "--workload cycle --connections 16"] [--dry-run] [--help]
#
# Needs root for kernel knobs (without it every kernel knob is reported as skipped). Safe to interrupt: an EXIT trap
# reverts whatever was applied. --dry-run changes nothing and runs no bench: it prints, per profile, each knob's
# current value and what the profile would set it to.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
profiles="baseline low-latency throughput io-uring-sync"
duration="10s"
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
    # shellcheck disable=SC1090
    . "$here/profiles/$profile.profile"
    echo "== $profile: $DESCRIPTION"
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
trap revert_all EXIT INT TERM

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

echo "tuning lab: profiles [$profiles], bench: $bench_args --duration $duration; results in $out"
echo "host: $(uname -sr), $(nproc) CPUs, memlock $(ulimit -l), user $(id -un)" | tee "$out/host.txt"
for profile in $profiles; do
  file="$here/profiles/$profile.profile"
  DESCRIPTION=""; SYSCTLS=""; GOVERNOR=""; THP=""; IRQ_CPUS=""; ENGINE_TOML=""
  # shellcheck disable=SC1090
  . "$file"
  : > "$out/$profile.knobs.tsv"
  echo "== $profile: $DESCRIPTION"
  for kv in $SYSCTLS; do apply_sysctl "$kv"; done
  [ -n "$GOVERNOR" ] && apply_governor "$GOVERNOR"
  if [ -n "$THP" ]; then
    apply_file "transparent_hugepage" /sys/kernel/mm/transparent_hugepage/enabled "$THP"
  fi
  [ -n "$IRQ_CPUS" ] && apply_irqs "$IRQ_CPUS"
  printf '%s\n' "$ENGINE_TOML" > "$out/$profile.engine.toml"
  if [ -n "$ENGINE_TOML" ]; then note "engine" applied "$(echo "$ENGINE_TOML" | tr '\n' ' ')"; fi
  # shellcheck disable=SC2086
  "$berth_bench" $bench_args --duration "$duration" --server-config "$out/$profile.engine.toml" \
      --json "$out/$profile.json" --hgrm-dir "$out/$profile-hgrm" --svg "$out/$profile.svg" \
      > "$out/$profile.txt" 2> "$out/$profile.stderr" || echo "  bench failed for $profile (see $out/$profile.stderr)"
  sed -n '1,40p' "$out/$profile.txt" | sed 's/^/    /'
  revert_all
  echo "  reverted"
done
python3 "$here/compare.py" "$out" $profiles && echo "comparison: $out/comparison.md, $out/comparison.json, $out/comparison.svg"
