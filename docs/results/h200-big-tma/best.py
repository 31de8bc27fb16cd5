"""The index, in its set, of the variant whose paired ratio to the first is lowest with the interval's top under
0.99; nothing when none. Reads a fused_prefetch.py output file."""
import re
import sys

sys.path.insert(0, "benchmarks")
import fused_prefetch  # noqa: E402

names = [v[0] for v in fused_prefetch.SETS[sys.argv[1]]]
best = None
for line in open(sys.argv[2]):
    m = re.match(r"\| (.+?) \| .*\| ([\d.]+) \(([\d.]+)–([\d.]+)\) \|$", line.strip())
    if m and m.group(1) in names and float(m.group(4)) < 0.99:
        if best is None or float(m.group(2)) < best[1]:
            best = (names.index(m.group(1)), float(m.group(2)))
print("" if best is None else best[0])
