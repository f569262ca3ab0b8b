#!/usr/bin/env python3
"""perpoint.py REPORT.md A B: from the runner's per-point table (to the last byte), per point: the
role (harmed in docs/results/design/lowat, or control), TCP on each path, A and B (means, Mbit/s),
A / best and B / best, B / A (95 % bootstrap intervals, **H** harmed, below/above as the runner
marks them)."""
import sys

report, a, b = sys.argv[1:4]
controls = {"p064", "p067", "p161", "p176"}
lines = open(report).read().split("### Per point", 1)[1].split("\n#", 1)[0].splitlines()
head = next(l for l in lines if l.startswith("| point"))
cols = [c.strip() for c in head.strip("|").split("|")]
print(f"| point | role | tcp-path1 | tcp-path2 | {a} | {b} | {a} / best | {b} / best | {b} / {a} |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for l in lines:
    if not l.startswith("| p") or l.startswith("| point"):
        continue
    r = dict(zip(cols, (c.strip() for c in l.strip("|").split("|"))))
    role = "control" if r["point"] in controls else "harmed"
    print(f"| {r['point']} | {role} | {r['tcp-path1']} | {r['tcp-path2']} | {r[a]} | {r[b]} | {r[a + ' / best']} | {r[b + ' / best']} | {r.get(b + ' / ' + a, '-')} |")
