#!/usr/bin/env python3
# Per point: each variant's goodput over mptcp-static's (95 % bootstrap interval over the rounds,
# from report.md's per-point table) and static's Ben. Run from the repository root:
# python3 docs/results/design/mechanisms-realworld/table.py [DIR]
import re, sys
D = sys.argv[1] if len(sys.argv) > 1 else "docs/results/design/mechanisms-realworld"
rep = open(D + "/report.md").read()
sec = rep[rep.index("### Per point"):]
lines = [l for l in sec.split("\n") if l.startswith("|")]
head = [c.strip() for c in lines[0].strip("|").split("|")]
print("| point | BDP | path 1; path 2 (Mbit/s / RTT ms / loss % / buffer BDP) | best single path | mptcp-static (Ben) | +buffers / static | +stale4 / static |")
print("|---|---|---|---:|---:|---:|---:|")
for l in lines[2:]:
    if not re.match(r"\| p\d+ ", l):
        continue
    c = dict(zip(head, [x.strip() for x in l.strip("|").split("|")]))
    best = max(float(c["tcp-path1"].strip("*").split()[0]), float(c["tcp-path2"].strip("*").split()[0]))
    print(f"| {c['point']} | {c['BDP']} | {c['paths']} | {best:.2f} | {c['mptcp-static']} ({c['Ben mptcp-static'].split()[0]}) "
          f"| {c['mptcp-static+buffers / mptcp-static']} | {c['mptcp-static+stale4 / mptcp-static']} |")
