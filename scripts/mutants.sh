#!/usr/bin/env bash
# Mutation testing of the durability- and lease-critical code with cargo-mutants (https://mutants.rs/): each mutant
# (one small change to the source: a function body replaced by a default value, an operator swapped, a condition
# negated, a struct field left to its default) is built and the library tests are run against it; a mutant no test
# fails is "missed", and must either be killed by a new or stronger test or listed with the reason it is harmless.
#
#   scripts/mutants.sh [--list] [--subset all|durability|core] [--file GLOB]... [--re REGEX]... [--exclude-re REGEX]...
#                      [--budget MIN] [--timeout S] [--build-timeout S] [--jobs N] [--shard K/N] [--rev REV]
#                      [--opt-level N] [--target-dir DIR] [--out DIR] [--keep-logs] [--skip-tested]
#                      [--summarize DIR] [--report]
#                      [-- CARGO-MUTANTS-ARGS...]
#
# What is mutated: --subset all (the default; ~1,580 mutants) takes src/storage/** (log, journal, frontier, backend,
# frame, runs, behind, atomic_file), src/partition/** (partition, inflight leases), src/ops/**, src/front/consume.rs
# (consume and dead-letter diversion) and src/front/redrive.rs; --subset durability (~735) only the functions where a
# surviving mutant could lose, resurrect or duplicate an acknowledged message (the journal's pass loop, syncs and
# replay, the log's append path, frontier files, the backend's atomic replacement, in-flight leases, settling,
# dead letters, redrive); --subset core (~75, what fits in a 90-minute run) the most critical of those (listed
# below). --file GLOB (repeatable) replaces the file list, --re/--exclude-re REGEX narrow it by mutant name as
# --list prints it. .cargo/mutants.toml excludes the test code (src/storage/sim.rs, *tests.rs, src/sim/) and pure
# reporting (Display impls, metric counters and getters, describe).
#
# The tests run for each mutant: `cargo test --lib` (unit and property tests plus the seeded 1,000-run simulation)
# without the etcd client's and the metastore's tests (cluster::etcd::, cluster::metastore::: most run etcd, with
# leases and watches timed in seconds, and they test only cluster-layer code; they run when --file names a
# src/cluster file), in a `mutants` cargo profile defined here by CARGO_PROFILE_MUTANTS_*
# variables, no Cargo.toml change: the release profile (no debug assertions or overflow checks, as CI's `cargo test
# --release`) without debug info, with incremental compilation, and the crate itself at --opt-level (default 0; the
# dependencies stay at 3). Measured on 2026-12-04 (idle 2-core machine, one function of src/storage/log/mod.rs
# changed): the incremental build takes 7 s at opt-level 0 against 69 s at 1 (61 s with 256 codegen units), and
# the tests 17 s against ~15 s, so a mutant costs ~30 s instead of ~90-125 s. The integration tests in tests/ start
# the real binary and take minutes; they are left out (run them yourself on anything this reports).
#
# Time: cargo-mutants copies the tree (without target/ and .git) to a scratch directory and builds there; with one
# job the build goes to a persistent target directory (--target-dir, default target/mutants-cache), so only the
# first run builds the dependencies (~5 min). Each run starts with an unmutated baseline (~1 min), then each mutant
# costs an incremental build of the crate plus the tests: ~30 s on an idle 2-core machine (see above). --budget
# (minutes, default 90, 0 = none) stops the run when it is used up: what was tested is reported and the rest is
# listed as not reached (run it later with --shard K/N, or a narrower --file/--re). Several jobs (-j) only pay on a
# machine with cores to spare: each job builds in its own scratch target/ from nothing (one shared target directory
# would serialise them on cargo's lock).
#
# Output (--out, default benches/results/mutants/<UTC time>/): mutants.out/ (cargo-mutants' own: outcomes.json,
# mutants.json, caught.txt, missed.txt, timeout.txt, unviable.txt, and the logs and diffs of the missed and timed-out
# mutants; --keep-logs keeps every log), console.log, run.env, and summary.md: counts per file (caught / missed /
# timeout / unviable / not reached) and every missed mutant (file:line, function, replacement). A missed mutant's
# reason is taken from benches/results/mutants/harmless.tsv when it lists it (tab-separated: the mutant's name as
# cargo-mutants prints it, with or without its line:col, then the reason: equivalent, unreachable or performance
# only, and why); otherwise the row says TODO.
#
#   --list            list the mutants in scope (counts per file, then every name) and stop: builds nothing.
#   --summarize DIR   only (re)write DIR/summary.md from DIR/mutants.out (e.g. after editing harmless.tsv), and
#                     drop the logs of caught mutants as the end of a run does (a run stopped early never got there).
#   --report          write benches/results/mutants/REPORT.md: every mutant in scope now (e.g. --subset durability)
#                     with its latest outcome in the committed runs (matched by file, function and replacement, not
#                     by line), the survivors with their reasons from harmless.tsv, and what no run has tested yet.
#                     Builds nothing.
#   --rev REV         mutate the tree of commit REV (git archive) instead of the working tree.
#   --skip-tested     leave out every mutant a committed run under benches/results/mutants/ already built and tested
#                     (any outcome; matched by file, function and replacement, not by line, which moves): continues
#                     a large subset across runs without --shard, whose slices move whenever the filters change.
#   --timeout S       the test phase's limit per mutant (default: cargo-mutants derives it from the baseline's test
#                     time; the run slows 3-20x while other builds share the machine, the run being niced: pass a
#                     generous one then, e.g. 400, or hanging mutants and slow passes both read as timeouts).
#   --                everything after is passed to cargo mutants as is (e.g. -- --iterate, -- --in-diff FILE).
#
# Caveat (cargo-mutants 27.1): --re, --exclude-re and exclude_re do not filter the "delete field X from struct Y
# expression" mutants; only the file list does. The subsets therefore also narrow the file list.
#
# Runs under `nice -n 10` (NICE=0 to run at normal priority).
set -euo pipefail
orig_args=("$@")
cd "$(dirname "$0")/.."
repo=$(pwd)

files=()
default_files=('src/storage/**' 'src/partition/**' 'src/ops/**' 'src/front/consume.rs' 'src/front/redrive.rs')
res=()
exclude_res=()
subset=all
budget=90
test_timeout=""
build_timeout=900
jobs=1
shard=""
rev=""
opt_level=0
target_dir=""
out=""
keep_logs=0
skip_tested=0
list=0
summarize=""
report=0
extra=()

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --list) list=1; shift ;;
    --subset) subset="$2"; shift 2 ;;
    -f|--file) files+=("$2"); shift 2 ;;
    --re) res+=("$2"); shift 2 ;;
    --exclude-re) exclude_res+=("$2"); shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --timeout) test_timeout="$2"; shift 2 ;;
    --build-timeout) build_timeout="$2"; shift 2 ;;
    -j|--jobs) jobs="$2"; shift 2 ;;
    --shard) shard="$2"; shift 2 ;;
    --rev) rev="$2"; shift 2 ;;
    --opt-level) opt_level="$2"; shift 2 ;;
    --target-dir) target_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --keep-logs) keep_logs=1; shift ;;
    --skip-tested) skip_tested=1; shift ;;
    --summarize) summarize="$2"; shift 2 ;;
    --report) report=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

[[ "$budget" =~ ^[0-9]+$ ]] || { echo "--budget takes whole minutes (0: none)" >&2; exit 2; }

# The functions of `--subset durability`, as regexes over the names cargo-mutants prints
# ("src/storage/journal/mod.rs:751:5: replace Journal::write_pass with ()", "... replace < with > in replay").
durability_res=(
  # journal: the pass loop, write_pass, syncs, rotation and checkpoints, and the replay at start with its scanner
  'Journal::(enqueue|take_pass|run_committer|write_pass|refuse|sync_current|sync_now|run_interval_sync|rotate|run_checkpoints|checkpoint|write_back|close|open|create_file|next_pass|commit_delay_us)\b'
  '^src/storage/journal/(mod|entry|replay)\.rs:.* (in|replace) (replay|scan|header_at|parse_body|parse_frontiers|frames_start|seal_entry|begin_entry|frontier_entry|zero_ahead|wait_for_company)\b'
  # log: the append path (writer task, batches, write and sync, roll, interval sync, close) and reopening
  'Log::(append|append_batch|run_writer|take_batch|write_batch|write_and_sync|roll|sync_if_dirty|final_sync|close|open_with|skip_to)\b'
  # write-behind buffer that holds frames the segment lacks
  'Behind::(flush|push|take_back|continues|unwritten_from)\b'
  # frontier files: every function
  '^src/storage/frontier\.rs:'
  # backend: the atomic replacement of small files (frontier files) and the data syncs
  '\b(replace_batch|Disk::queue_replacement|Replacements::run|fdatasync)\b'
  '<impl SegmentFile for DiskFile>::(write_at|sync)\b'
  '^src/storage/atomic_file\.rs:'
  # in-flight leases: reserve, lease, ack/nack/extend (live checks, nonces), expiry, frontier advance
  'InFlight::(reserve|reserve_batch|lease_next|next_deliverable|ack|ack_batch|ack_dead_letter|nack|nack_batch|nack_live|extend|extend_batch|extend_live|give_back_batch|purge_expired|release|make_deliverable|is_live|issue_nonce|settle_at_frontier|advance_frontier|catch_up_frontier|skip_corrupt|skip_corrupt_run|advance_to)\b'
  # partition: settling, dead letters, frontier flushes and journaling, replay, taking leases
  'Partition::(take|settle|dead_lettered|give_back|purge|flush_frontiers|flush_group|frontier_file_behind|write_frontier_files|frontiers_journaled|moved_frontiers|replay|append|load_shards|write_start)\b'
  'FrontierState::(durable|wait_flush)\b'
  # settle ops, dead-letter diversion and redrive
  '^src/ops/settle\.rs:.* (in|replace) apply\b'
  'Front::(divert_dead_letters|settle_dead_letter|redrive)\b'
)

# `--subset core`: the part of those a 90-minute run covers (~75 mutants at 60-90 s each): the frontier file's
# encoding, read and write; the journal pass's write and sync handling; the atomic replacement of frontier files;
# the lease checks and frontier advance under acks; the diversion of a message to its dead-letter topic.
core_res=(
  '^src/storage/frontier\.rs:'
  'Journal::(write_pass|sync_current|sync_now)\b'
  '\breplace_batch\b'
  'InFlight::(is_live|settle_at_frontier|advance_frontier)\b'
  'Front::divert_dead_letters\b'
)
core_files=('src/storage/frontier.rs' 'src/storage/journal/mod.rs' 'src/storage/backend.rs' 'src/partition/inflight.rs'
  'src/front/consume.rs')

# The files those functions live in (see the caveat above: the file list also holds out the struct-field mutants of
# other files).
durability_files=('src/storage/journal/mod.rs' 'src/storage/journal/entry.rs'
  'src/storage/journal/replay.rs' 'src/storage/log/mod.rs' 'src/storage/log/read.rs' 'src/storage/behind.rs' 'src/storage/frontier.rs'
  'src/storage/backend.rs' 'src/storage/atomic_file.rs' 'src/partition/inflight.rs' 'src/partition/mod.rs'
  'src/partition/frontier.rs'
  'src/ops/settle.rs' 'src/front/consume.rs' 'src/front/redrive.rs')

case "$subset" in
  all) [ ${#files[@]} -gt 0 ] || files=("${default_files[@]}") ;;
  durability)
    res+=("${durability_res[@]}")
    [ ${#files[@]} -gt 0 ] || files=("${durability_files[@]}") ;;
  core)
    res+=("${core_res[@]}")
    [ ${#files[@]} -gt 0 ] || files=("${core_files[@]}") ;;
  *) echo "--subset is all, durability or core" >&2; exit 2 ;;
esac

# ---------------------------------------------------------------------------------------------------------------
# summary.md from a mutants.out directory
# Keeps the logs and diffs of the mutants worth reading (missed, timed out) and the baseline's; drops the rest
# (unless --keep-logs). Also run by --summarize, for a run that was stopped before it got here.
prune_logs() {  # prune_logs OUT_DIR
  local out=$1
  if [ "$keep_logs" = 0 ] && [ -f "$out/mutants.out/outcomes.json" ]; then
    python3 - "$out/mutants.out" <<'PY'
import json, os, sys
mo = sys.argv[1]
keep = set()
for o in json.load(open(os.path.join(mo, "outcomes.json")))["outcomes"]:
    if o["summary"] in ("MissedMutant", "Timeout") or o["scenario"] == "Baseline" or o["summary"] == "Failure":
        for k in ("log_path", "diff_path"):
            if o.get(k):
                keep.add(os.path.normpath(o[k]))
for sub in ("log", "diff"):
    d = os.path.join(mo, sub)
    if os.path.isdir(d):
        for f in os.listdir(d):
            if os.path.join(sub, f) not in keep:
                os.remove(os.path.join(d, f))
for f in ("lock.json",):
    p = os.path.join(mo, f)
    if os.path.exists(p):
        os.remove(p)
PY
  fi
}

summarize() {  # summarize OUT_DIR
  MUTANTS_LIB="$repo/scripts" python3 - "$1" "$repo/benches/results/mutants/harmless.tsv" <<'PY'
import json, os, re, sys, collections
out, harmless_path = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.environ["MUTANTS_LIB"])
from mutants_common import KIND, file_table, load_reasons, strip_pos
mo = os.path.join(out, "mutants.out")
outcomes = json.load(open(os.path.join(mo, "outcomes.json")))
try:
    in_scope = json.load(open(os.path.join(mo, "mutants.json")))
except FileNotFoundError:
    in_scope = []
meta = {}
try:
    for line in open(os.path.join(out, "run.env")):
        k, _, v = line.rstrip("\n").partition("=")
        meta[k] = v
except FileNotFoundError:
    pass

reasons = load_reasons(harmless_path)

def reason_for(name):
    return reasons.get(name) or reasons.get(strip_pos(name)) or "TODO: kill with a test, or say why it is harmless"

per_file = collections.OrderedDict()
def row(f):
    return per_file.setdefault(f, collections.Counter())
for m in in_scope:
    row(m["file"])
tested, missed, timeouts, baseline = set(), [], [], None
build_s, test_s, n_timed = 0.0, 0.0, 0
for o in outcomes["outcomes"]:
    sc = o["scenario"]
    if sc == "Baseline":
        baseline = o
        continue
    m = sc["Mutant"]
    kind = KIND.get(o["summary"], o["summary"])
    row(m["file"])[kind] += 1
    tested.add(m["name"])
    for pr in o.get("phase_results") or []:
        if pr["phase"] == "Build":
            build_s += pr["duration"]
        elif pr["phase"] == "Test":
            test_s += pr["duration"]
    n_timed += 1
    fn = (m.get("function") or {}).get("function_name", "?")
    line = m["span"]["start"]["line"]
    entry = (m["file"], line, fn, m.get("replacement", ""), m.get("genre", ""), m["name"], o.get("log_path"), o.get("diff_path"))
    if kind == "missed":
        missed.append(entry)
    elif kind == "timeout":
        timeouts.append(entry)
not_reached = [m for m in in_scope if m["name"] not in tested]
for m in not_reached:
    row(m["file"])["not reached"] += 1

cols = ["caught", "missed", "timeout", "unviable", "not reached"]
L = []
L.append(f"# Mutation testing: {meta.get('scope', 'durability- and lease-critical code')}")
L.append("")
L.append(f"- commit: `{meta.get('commit', '?')}`{' (working tree with uncommitted changes)' if meta.get('dirty') == '1' else ''}")
L.append(f"- cargo-mutants {outcomes.get('cargo_mutants_version', '?')}; started {outcomes.get('start_time', '?')}, ended {outcomes.get('end_time') or 'not recorded (stopped by the budget or interrupted)'}")
if meta.get("command"):
    L.append(f"- command: `{meta['command']}`")
if meta.get("cargo_mutants_argv"):
    L.append(f"- cargo-mutants invocation: `{meta['cargo_mutants_argv']}`")
if meta.get("profile_env"):
    L.append(f"- profile: `{meta['profile_env']}`")
if meta.get("host"):
    L.append(f"- host: {meta['host']}")
if baseline:
    b = {pr['phase']: pr['duration'] for pr in baseline.get('phase_results') or []}
    L.append(f"- baseline (unmutated): {b.get('Build', 0):.0f} s build, {b.get('Test', 0):.0f} s test: {baseline['summary']}")
if n_timed:
    L.append(f"- mutants tested: {n_timed} in {build_s + test_s:.0f} s of build and test ({build_s / n_timed:.0f} s build + {test_s / n_timed:.0f} s test per mutant on average)")
if meta.get("stopped_by_budget") == "1":
    L.append(f"- **stopped by the budget** ({meta.get('budget_min')} min): {len(not_reached)} mutants not reached, listed at the end")
elif not_reached:
    L.append(f"- {len(not_reached)} mutants in scope were not reached (interrupted run)")
L.append("")
L.append("## Per file")
L.append("")
tot = file_table(L, sorted(per_file.items()), cols, "in scope")
L.append("")
L.append(f"## Missed mutants ({len(missed)})")
L.append("")
L.append("Each must be killed by a new or stronger test, or carry the reason it is harmless (equivalent, unreachable,")
L.append("performance only) in benches/results/mutants/harmless.tsv; then rerun `scripts/mutants.sh --summarize DIR`.")
L.append("")
if missed:
    L.append("| file:line | function | replacement | reason |")
    L.append("| --- | --- | --- | --- |")
    for f, line, fn, rep, genre, name, log, diff in sorted(missed):
        what = name.split(": ", 1)[1] if ": " in name else rep
        L.append(f"| {f}:{line} | `{fn}` | `{what}` | {reason_for(name)} |")
L.append("")
if timeouts:
    L.append(f"## Timed out ({len(timeouts)})")
    L.append("")
    L.append("A mutant whose tests ran past the timeout (usually an endless loop or a wait that never ends): counted as")
    L.append("detected by cargo-mutants, but worth a look if the hang is not what a test would notice.")
    L.append("")
    for f, line, fn, rep, genre, name, log, diff in sorted(timeouts):
        L.append(f"- {name}")
    L.append("")
if not_reached:
    L.append(f"## Not reached ({len(not_reached)})")
    L.append("")
    for m in not_reached:
        L.append(f"- {m['name']}")
    L.append("")
open(os.path.join(out, "summary.md"), "w").write("\n".join(L))
print(f"{out}/summary.md: " + ", ".join(f"{tot[k]} {k}" for k in cols))
PY
}

if [ -n "$summarize" ]; then
  prune_logs "$summarize"
  summarize "$summarize"
  exit 0
fi

command -v cargo-mutants >/dev/null 2>&1 || {
  echo "cargo-mutants is not installed: cargo install --locked cargo-mutants" >&2; exit 2; }

# The tree to mutate: the working tree, or a snapshot of --rev.
src_dir="$repo"
tmp=""
cleanup() { [ -z "$tmp" ] || rm -rf "$tmp"; }
trap cleanup EXIT
if [ -n "$rev" ]; then
  commit=$(git rev-parse --verify "$rev^{commit}")
  tmp=$(mktemp -d)
  git archive "$commit" | tar -x -C "$tmp"
  src_dir="$tmp"
  dirty=0
else
  commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  if git diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null \
      && [ -z "$(git ls-files --others --exclude-standard -- src)" ]; then dirty=0; else dirty=1; fi
fi

args=(--dir "$src_dir" --config "$repo/.cargo/mutants.toml")
for f in "${files[@]}"; do args+=(--file "$f"); done
for r in "${res[@]}"; do args+=(--re "$r"); done
if [ "$skip_tested" = 1 ]; then
  # One anchored regex per mutant already tested: "src/x.rs:LINE:COL: replace A with B" with the position wildcarded.
  while IFS= read -r r; do exclude_res+=("$r"); done < <(python3 - "$repo/benches/results/mutants" <<'PY'
import glob, json, os, re, sys
seen = set()
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "mutants.out", "outcomes.json"))):
    for o in json.load(open(path)).get("outcomes", []):
        s = o.get("scenario")
        if isinstance(s, dict) and "Mutant" in s:
            m = re.match(r"^([^:]+):\d+:\d+: (.*)$", s["Mutant"]["name"])
            if m:
                seen.add("^" + re.escape(m.group(1)) + r":\d+:\d+: " + re.escape(m.group(2)) + "$")
print("\n".join(sorted(seen)))
PY
  )
fi
for r in "${exclude_res[@]}"; do args+=(--exclude-re "$r"); done
[ -z "$shard" ] || args+=(--shard "$shard")

if [ "$report" = 1 ]; then
  names_file=$(mktemp)
  cargo mutants "${args[@]}" --list "${extra[@]}" > "$names_file"
  MUTANTS_LIB="$repo/scripts" python3 - "$repo/benches/results/mutants" "$subset" "$(git rev-parse --short HEAD)" "$names_file" <<'PY'
import collections, glob, json, os, re, sys
root, subset, head = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.environ["MUTANTS_LIB"])
from mutants_common import KIND, file_table, load_reasons, strip_pos as key
now = [l.strip() for l in open(sys.argv[4]) if l.strip()]
reasons = load_reasons(os.path.join(root, "harmless.tsv"))
# The latest run that tested a key decides its outcomes (a later run reflects later code and tests); a key can name
# several mutants (the same replacement twice in one function): they are paired in line order.
# A mutant tested under its exact current name (file, line, column, replacement, function) takes the latest run
# that did so; the others are paired by key with the latest run's outcomes that no current name claims exactly (a
# run that tested some of a key's mutants by name, e.g. with --re, leaves the older outcomes of the rest in place).
latest = {}
exact = {}
runs = sorted(glob.glob(os.path.join(root, "*", "mutants.out", "outcomes.json")))
for path in runs:
    run = path.split(os.sep)[-3]
    per = collections.defaultdict(list)
    for o in json.load(open(path)).get("outcomes", []):
        s = o.get("scenario")
        if isinstance(s, dict) and "Mutant" in s:
            m = s["Mutant"]
            kind = KIND.get(o["summary"], o["summary"])
            per[key(m["name"])].append((m["span"]["start"]["line"], kind, m["name"]))
            exact[m["name"]] = (run, kind)
    for k, v in per.items():
        latest.setdefault(k, []).append((run, sorted(v)))
now_set = set(now)
by_key = collections.defaultdict(list)
for n in now:
    by_key[key(n)].append(n)
rows = []  # (file, name, outcome, run, tested name)
for k, names in by_key.items():
    # The outcomes no current name claims exactly, the latest run's first, each run's in line order.
    outs = [(run, o) for run, v in reversed(latest.get(k, [])) for o in v if o[2] not in now_set]
    names = sorted(names, key=lambda n: int(n.split(":")[1]))
    rest = []
    for n in names:
        if n in exact:
            rows.append((n.split(":")[0], n, exact[n][1], exact[n][0], n))
        else:
            rest.append(n)
    for i, n in enumerate(rest):
        if i < len(outs):
            run, o = outs[i]
            rows.append((n.split(":")[0], n, o[1], run, o[2]))
        else:
            rows.append((n.split(":")[0], n, "untested", None, None))
def reason(tested, n):
    return reasons.get(tested) or reasons.get(key(tested)) or reasons.get(n) or reasons.get(key(n))
cols = ["caught", "killed since", "harmless", "TODO", "timeout", "unviable", "untested"]
per_file = collections.OrderedDict()
survivors, todo, timeouts, untested = [], [], [], []
for f, n, out, run, tested in sorted(rows, key=lambda r: (r[0], int(r[1].split(":")[1]))):
    c = per_file.setdefault(f, collections.Counter())
    if out == "missed":
        r = reason(tested, n)
        if r is None:
            c["TODO"] += 1; todo.append((n, run))
        elif "killed since" in r or "fixed since" in r:
            c["killed since"] += 1
        else:
            c["harmless"] += 1; survivors.append((n, run, r))
    elif out == "timeout":
        c["timeout"] += 1; timeouts.append((n, run))
    elif out == "untested":
        c["untested"] += 1; untested.append(n)
    else:
        c[out] += 1
L = [f"# Mutation testing: every mutant of `--subset {subset}` at {head}, with its latest outcome", ""]
L.append(f"Written by `scripts/mutants.sh --subset {subset} --report` from the {len(runs)} committed runs in this directory")
L.append("(each run's own summary.md says what it ran, on which commit, and how long it took). A mutant is matched to")
L.append("the latest run that tested it at the same line and column, or else to an outcome of the same file, function")
L.append("and replacement at a line no current mutant has (it moved since), the latest run's first, in line order.")
L.append("")
L.append("- **caught**: a library test failed against it. **killed since**: it survived its run, and a test written")
L.append("  afterwards fails against it (named in harmless.tsv; each was applied by hand and seen failing).")
L.append("- **harmless**: it survives, and harmless.tsv says why (equivalent, unreachable, performance, logging or")
L.append("  metrics only). **timeout**: the tests did not finish in time (a hang a test would notice, or a slow machine).")
L.append("")
tot = file_table(L, per_file.items(), cols, "mutants")
L.append("")
L.append(f"## Surviving mutants ({len(survivors)}), each with the reason it is harmless")
L.append("")
if survivors:
    L.append("| mutant | run | reason |")
    L.append("| --- | --- | --- |")
    for n, run, r in survivors:
        L.append(f"| `{n}` | {run} | {r.replace('|', '/')} |")
    L.append("")
for title, items in (("Survivors without a reason (TODO)", todo), ("Timed out", timeouts)):
    if items:
        L += [f"## {title} ({len(items)})", ""] + [f"- `{n}` ({run})" for n, run in items] + [""]
if untested:
    L += [f"## Not tested by any committed run ({len(untested)})", ""] + [f"- `{n}`" for n in untested] + [""]
open(os.path.join(root, "REPORT.md"), "w").write("\n".join(L))
print(f"{root}/REPORT.md: " + ", ".join(f"{tot[k]} {k}" for k in cols))
PY
  rm -f "$names_file"
  exit 0
fi

if [ "$list" = 1 ]; then
  names=$(cargo mutants "${args[@]}" --list "${extra[@]}")
  echo "$(echo "$names" | grep -c . || true) mutants in scope"
  echo "$names" | cut -d: -f1 | sort | uniq -c | sort -rn
  echo
  echo "$names"
  exit 0
fi

out=${out:-"benches/results/mutants/$(date -u +%Y-%m-%dT%H%M%SZ)"}
mkdir -p "$out"
out=$(cd "$out" && pwd)

export CARGO_PROFILE_MUTANTS_INHERITS=release
export CARGO_PROFILE_MUTANTS_DEBUG=0
export CARGO_PROFILE_MUTANTS_INCREMENTAL=true
export CARGO_PROFILE_MUTANTS_CODEGEN_UNITS=16
# --opt-level N: the crate itself at opt-level N (its dependencies stay at release's 3 and stay cached).
[ -z "$opt_level" ] || args+=("--cargo-arg=--config=profile.mutants.package.berth.opt-level=$opt_level")
if [ "$jobs" = 1 ]; then
  # One job: a persistent target directory keeps the dependencies (and the crate's incremental state) across runs.
  target_dir=${target_dir:-"$repo/target/mutants-cache"}
fi
if [ -n "$target_dir" ]; then
  mkdir -p "$target_dir"
  export CARGO_TARGET_DIR
  CARGO_TARGET_DIR=$(cd "$target_dir" && pwd)
fi
# (With several jobs each scratch copy builds in its own target/ from scratch: one shared directory would
# serialise them on cargo's lock.)

# The etcd client's and the metastore's tests are skipped (see the top) unless cluster code is mutated; everything
# else in the library runs.
if ! printf '%s\n' "${files[@]}" | grep -q '^src/cluster'; then
  args+=(--cargo-test-arg=-- --cargo-test-arg=--skip --cargo-test-arg=cluster::etcd::
         --cargo-test-arg=--skip --cargo-test-arg=cluster::metastore::)
fi
# No --timeout: cargo-mutants derives the test timeout from the unmutated baseline's test time.
[ -z "$test_timeout" ] || args+=(--timeout "$test_timeout")
args+=(--profile mutants --jobs "$jobs" --build-timeout "$build_timeout" --output "$out"
       --colors never)

quote() {  # the arguments as a shell would read them, quoted only where needed
  local a q=()
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then q+=("$a"); else q+=("'${a//\'/\'\\\'\'}'"); fi
  done
  echo "${q[*]}"
}
{
  echo "commit=$commit"
  echo "dirty=$dirty"
  echo "scope=$(printf '%s ' "${files[@]}")(subset: $subset)"
  echo "command=scripts/mutants.sh $(quote "${orig_args[@]}")"
  echo "cargo_mutants_argv=cargo mutants $(quote "${args[@]}" "${extra[@]}" | sed "s#$src_dir#SRC#g; s#$repo/##g")"
  echo "profile_env=mutants = release + debug 0, incremental, codegen-units 16${opt_level:+, the berth crate at opt-level $opt_level}; CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-per copy}"
  echo "host=$(nproc) CPUs, $(uname -r), $(cargo mutants --version), $(rustc --version)"
  echo "budget_min=$budget"
} > "$out/run.env"

echo "cargo mutants -> $out (budget ${budget} min, test timeout ${test_timeout:-from the baseline} s)"
rc=0
if [ "$budget" -gt 0 ]; then
  nice -n "${NICE:-10}" timeout --signal=INT --kill-after=120 "${budget}m" \
    cargo mutants "${args[@]}" "${extra[@]}" 2>&1 | tee "$out/console.log" || rc=${PIPESTATUS[0]}
else
  nice -n "${NICE:-10}" cargo mutants "${args[@]}" "${extra[@]}" 2>&1 | tee "$out/console.log" || rc=${PIPESTATUS[0]}
fi
# cargo mutants: 0 all caught, 2 some missed, 3 some timed out, 4 the baseline failed; timeout(1): 124 budget used.
if [ "$rc" = 124 ]; then echo "stopped_by_budget=1" >> "$out/run.env"; fi
echo "exit_code=$rc" >> "$out/run.env"

prune_logs "$out"

if [ -f "$out/mutants.out/outcomes.json" ]; then
  summarize "$out"
else
  echo "no outcomes.json in $out/mutants.out: see $out/console.log" >&2
fi
exit "$rc"
