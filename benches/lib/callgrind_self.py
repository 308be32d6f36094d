"""Self instruction counts per function from a callgrind output file, divided by a number of cycles.

    python3 callgrind_self.py FILE CYCLES [TOP]

Prints the total per cycle, then the TOP functions by their own count (their callees' not included)."""
import collections
import re
import sys

names = {}
current = None
counts = collections.Counter()
call_line = False
for line in open(sys.argv[1], errors="replace"):
    line = line.rstrip("\n")
    if line.startswith(("fn=", "cfn=")):
        m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line)
        if m and m.group(2):
            names[m.group(1)] = m.group(2)
        if line.startswith("fn="):
            current = names.get(m.group(1)) if m else line[3:]
        continue
    if line.startswith("calls="):
        call_line = True  # the next cost line is the callee's inclusive cost
        continue
    if line and (line[0].isdigit() or line[0] in "+-*"):
        parts = line.split()
        if call_line:
            call_line = False
        elif len(parts) >= 2 and current:
            counts[current] += int(parts[1])
total = sum(counts.values())
cycles = float(sys.argv[2])
print(f"instructions per cycle: {total / cycles:,.0f}")
for name, n in counts.most_common(int(sys.argv[3]) if len(sys.argv) > 3 else 25):
    print(f"  {n / cycles:8,.0f}  {100 * n / total:5.1f} %  {name[:120]}")
