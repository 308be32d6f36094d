"""Shared by the python parts of scripts/mutants.sh: mutant names, harmless.tsv, the per-file table."""
import os
import re

# cargo-mutants' outcome summaries, as the reports name them.
KIND = {"CaughtMutant": "caught", "MissedMutant": "missed", "Timeout": "timeout", "Unviable": "unviable"}


def strip_pos(name):
    """"src/x.rs:12:5: replace A with B in F" -> "src/x.rs: replace A with B in F" (lines move; this does not)."""
    return re.sub(r"^([^:]+):\d+:\d+:", r"\1:", name)


def load_reasons(path):
    """harmless.tsv: a mutant's name (with or without its line:col), a tab, why it survives harmlessly."""
    reasons = {}
    if os.path.exists(path):
        for line in open(path):
            if not line.strip() or line.startswith("#"):
                continue
            name, _, reason = line.rstrip("\n").partition("\t")
            reasons[name.strip()] = reason.strip()
    return reasons


def file_table(lines, rows, cols, count_header):
    """Appends to `lines` a markdown table of `rows` ((file, Counter) pairs, in order) over `cols`, with a total
    row; returns the totals."""
    import collections
    lines.append(f"| file | {count_header} | " + " | ".join(cols) + " |")
    lines.append("| --- | ---: | " + " | ".join("---:" for _ in cols) + " |")
    tot = collections.Counter()
    for f, c in rows:
        tot.update(c)
        lines.append(f"| {f} | {sum(c[k] for k in cols)} | " + " | ".join(str(c[k]) for k in cols) + " |")
    lines.append(f"| **total** | {sum(tot[k] for k in cols)} | " + " | ".join(str(tot[k]) for k in cols) + " |")
    return tot
