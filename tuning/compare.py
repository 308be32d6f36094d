#!/usr/bin/env python3
"""Side-by-side comparison of tuning-lab profiles: reads each PROFILE.json that `berth bench --json` wrote and
PROFILE.knobs.tsv that run.sh wrote; writes comparison.md, comparison.json and comparison.svg (an overlaid
latency-percentile plot built from the merged cycle .hgrm of each profile). Standard library only."""
import json, math, os, sys

def load(out, profile):
    with open(os.path.join(out, profile + ".json")) as f:
        bench = json.load(f)
    knobs = []
    path = os.path.join(out, profile + ".knobs.tsv")
    if os.path.exists(path):
        with open(path) as f:
            knobs = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    return bench, knobs

def unit_op(bench):
    return "produce" if bench["settings"]["workload"] == "produce" else "cycle"

def hgrm_points(out, profile, op):
    path = os.path.join(out, profile + "-hgrm", "all-%s.hgrm" % op)
    points = []
    if not os.path.exists(path):
        return points
    for line in open(path):
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            try:
                points.append((float(parts[1]), float(parts[0])))
            except ValueError:
                pass
    return points

def svg(out, series):
    W, H, L, R, T, B = 900, 520, 80, 170, 40, 60
    vals = [v for _, pts in series for _, v in pts if v > 0]
    if not vals:
        return "<svg xmlns='http://www.w3.org/2000/svg'/>"
    lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    hi = max(hi, lo + 1)
    x = lambda q: L + (W - L - R) * min(-math.log10(max(1 - q, 1e-5)) / 5, 1)
    y = lambda v: T + (H - T - B) * (1 - (math.log10(max(v, 1)) - lo) / (hi - lo))
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
    s = ["<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif' font-size='12'>" % (W, H),
         "<rect width='100%' height='100%' fill='white'/>",
         "<text x='%d' y='22' text-anchor='middle' font-size='15'>tuning lab: latency by percentile, per profile</text>" % (W / 2)]
    for i, lab in enumerate(["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"]):
        xx = L + (W - L - R) * i / 5
        s.append("<line x1='%.1f' y1='%d' x2='%.1f' y2='%d' stroke='#ddd'/><text x='%.1f' y='%d' text-anchor='middle'>%s</text>" % (xx, T, xx, H - B, xx, H - B + 18, lab))
    for d in range(lo, hi + 1):
        yy = y(10 ** d)
        s.append("<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='#ddd'/><text x='%d' y='%.1f' text-anchor='end'>%g µs</text>" % (L, yy, W - R, yy, L - 6, yy + 4, 10 ** d))
    for i, (name, pts) in enumerate(series):
        c = colors[i % len(colors)]
        s.append("<polyline fill='none' stroke='%s' stroke-width='2' points='%s'/>" % (c, " ".join("%.1f,%.1f" % (x(q), y(v)) for q, v in pts)))
        s.append("<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='%s' stroke-width='3'/><text x='%d' y='%d'>%s</text>" % (W - R + 10, T + 20 * i, W - R + 30, T + 20 * i, c, W - R + 36, T + 20 * i + 4, name))
    s.append("</svg>")
    with open(os.path.join(out, "comparison.svg"), "w") as f:
        f.write("\n".join(s) + "\n")

def rounds_of(out, profile):
    """The rounds a profile ran, as {round: file stem}: PROFILE (round 1), PROFILE.rN (round N), whichever exist."""
    found = {}
    for name in os.listdir(out):
        if not name.endswith(".json"):
            continue
        stem = name[:-5]
        if stem == profile:
            found[1] = stem
        elif stem.startswith(profile + ".r") and stem[len(profile) + 2:].isdigit():
            found[int(stem[len(profile) + 2:])] = stem
    return found

def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2

def figures(bench):
    op = unit_op(bench)
    m = bench["clients"]["all"].get(op, {})
    return op, {"per_sec": m.get("per_sec", 0.0), "p50_us": m.get("p50_us"), "p99_us": m.get("p99_us"),
                "p99.9_us": m.get("p99.9_us"), "max_us": m.get("max_us"),
                "cpu_us": bench.get("server_cpu_us_per_unit")}

def main():
    out, profiles = sys.argv[1], sys.argv[2:]
    rows, series, doc = [], [], {}
    first = None  # the first profile's figures, by round
    for p in profiles:
        runs = {}
        for r, name in sorted(rounds_of(out, p).items()):
            try:
                bench, _ = load(out, name)
            except (OSError, ValueError) as e:
                print("skipping %s: %s" % (name, e), file=sys.stderr)
                continue
            runs[r] = figures(bench)
        if not runs:
            continue
        knobs = []
        path = os.path.join(out, p + ".knobs.tsv")
        if os.path.exists(path):
            with open(path) as f:
                knobs = [line.rstrip("\n").split("\t") for line in f if line.strip()]
        op = next(iter(runs.values()))[0]
        by_round = {r: f for r, (_, f) in runs.items()}
        per_round = list(by_round.values())
        first = first or by_round
        # Ratios within a round only: a round one of the two lacks gives none.
        ratio_of = lambda key: [by_round[r][key] / first[r][key] for r in by_round
                                if r in first and first[r].get(key) and by_round[r].get(key) is not None]
        applied = sum(1 for k in knobs if len(k) > 1 and k[1] == "applied")
        skipped = ["%s (%s)" % (k[0], k[1]) for k in knobs if len(k) > 1 and k[1] in ("skipped", "refused")]
        row = {"profile": p, "op": op, "rounds": len(per_round),
               "per_sec": median([f["per_sec"] for f in per_round]),
               "per_sec_per_round": [f["per_sec"] for f in per_round],
               "ratio_to_first": median(ratio_of("per_sec")),
               "p50_us": median([f["p50_us"] for f in per_round]), "p99_us": median([f["p99_us"] for f in per_round]),
               "p99.9_us": median([f["p99.9_us"] for f in per_round]), "max_us": median([f["max_us"] for f in per_round]),
               "p99_ratio_to_first": median(ratio_of("p99_us")),
               "server_cpu_us_per_unit": median([f["cpu_us"] for f in per_round]),
               "cpu_ratio_to_first": median(ratio_of("cpu_us")),
               "knobs_applied": applied, "knobs_skipped": skipped}
        rows.append(row)
        doc[p] = row
        series.append((p, hgrm_points(out, p, op)))
    with open(os.path.join(out, "comparison.json"), "w") as f:
        json.dump(doc, f, indent=2)
    op = rows[0]["op"] if rows else "op"
    fmt = lambda v, f="%s": (f % v) if v is not None else "n/a"
    lines = ["Medians over the rounds; \"× first\" is the median of the per-round ratios to the first profile (%s), "
             "each round's profiles run back to back." % (rows[0]["profile"] if rows else "none"), "",
             "| profile | rounds | %s/s | × first | p50 µs | p99 µs | p99 × first | p99.9 µs | server CPU µs/%s | CPU × first | knobs applied | skipped or refused |" % (op, op),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |" % (
            r["profile"], r["rounds"], fmt(r["per_sec"], "%.0f"), fmt(r["ratio_to_first"], "%.2f×"),
            fmt(r["p50_us"], "%.0f"), fmt(r["p99_us"], "%.0f"), fmt(r["p99_ratio_to_first"], "%.2f×"),
            fmt(r["p99.9_us"], "%.0f"), fmt(r["server_cpu_us_per_unit"], "%.1f"), fmt(r["cpu_ratio_to_first"], "%.2f×"),
            r["knobs_applied"], "; ".join(r["knobs_skipped"]) or "none"))
    with open(os.path.join(out, "comparison.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    svg(out, series)

if __name__ == "__main__":
    main()
