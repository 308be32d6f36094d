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

def main():
    out, profiles = sys.argv[1], sys.argv[2:]
    rows, series, doc = [], [], {}
    base = None
    for p in profiles:
        try:
            bench, knobs = load(out, p)
        except (OSError, ValueError) as e:
            print("skipping %s: %s" % (p, e), file=sys.stderr)
            continue
        op = unit_op(bench)
        m = bench["clients"]["all"].get(op, {})
        per_sec = m.get("per_sec", 0.0)
        base = base or per_sec
        applied = sum(1 for k in knobs if len(k) > 1 and k[1] == "applied")
        skipped = [k[0] for k in knobs if len(k) > 1 and k[1] in ("skipped", "refused")]
        row = {"profile": p, "op": op, "per_sec": per_sec, "ratio_to_first": per_sec / base if base else None,
               "p50_us": m.get("p50_us"), "p99_us": m.get("p99_us"), "p99.9_us": m.get("p99.9_us"), "max_us": m.get("max_us"),
               "server_cpu_us_per_unit": bench.get("server_cpu_us_per_unit"), "knobs_applied": applied, "knobs_skipped": skipped,
               "per_core": {k: v.get(op, {}) for k, v in bench["clients"].items() if k != "all"}}
        rows.append(row)
        doc[p] = row
        series.append((p, hgrm_points(out, p, op)))
    with open(os.path.join(out, "comparison.json"), "w") as f:
        json.dump(doc, f, indent=2)
    lines = ["| profile | %s/s | vs first | p50 µs | p99 µs | p99.9 µs | max µs | server CPU µs/%s | knobs applied | knobs skipped or refused |" % (rows[0]["op"] if rows else "op", rows[0]["op"] if rows else "op"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cpu = r["server_cpu_us_per_unit"]
        lines.append("| %s | %.0f | %.2f× | %s | %s | %s | %s | %s | %d | %s |" % (
            r["profile"], r["per_sec"], r["ratio_to_first"] or 0, r["p50_us"], r["p99_us"], r["p99.9_us"], r["max_us"],
            "%.1f" % cpu if cpu is not None else "n/a", r["knobs_applied"], ", ".join(r["knobs_skipped"]) or "none"))
    with open(os.path.join(out, "comparison.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    svg(out, series)

if __name__ == "__main__":
    main()
