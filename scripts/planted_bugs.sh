#!/usr/bin/env bash
# Plants each durability bug of scripts/planted_bugs.py (reply before the journal's sync, a failed sync ignored, a
# dead letter settled before its copy, a rename before its sync, the nonce check removed, a replay that skips its
# last entry) in a scratch copy of this tree, one at a time, runs the library tests against it, and prints which
# tests failed: each bug must fail at least one (exit 1 if one survives).
#
#   scripts/planted_bugs.sh [NAME...]       (default: every bug; scratch in $SCRATCH, default /tmp/berth-planted)
#
# Costs an incremental release build per bug (~1-3 min on 2 cores) plus the library tests (~20 s).
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=${SCRATCH:-/tmp/berth-planted}
names=("$@")
[ ${#names[@]} -gt 0 ] || mapfile -t names < <(python3 scripts/planted_bugs.py --list)
survived=0
for name in "${names[@]}"; do
  rm -rf "$scratch/src" && mkdir -p "$scratch/src"
  tar --exclude=./target --exclude=./.git -cf - . | tar -C "$scratch/src" -xf -
  python3 scripts/planted_bugs.py "$scratch/src" "$name" >/dev/null
  log="$scratch/$name.log"
  (cd "$scratch/src" && CARGO_TARGET_DIR="$scratch/target" cargo test --release --lib 2>&1) >"$log" || true
  failed=$(grep -E '^    [a-z_:]+$' "$log" | sed 's/^ *//' || true)
  if [ -z "$failed" ]; then
    echo "SURVIVED $name (no test failed; log: $log)"
    survived=1
  else
    echo "caught $name by:"
    echo "$failed" | sed 's/^/  /'
  fi
done
exit $survived
