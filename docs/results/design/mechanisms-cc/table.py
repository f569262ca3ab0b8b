#!/usr/bin/env python3
# Per point: +bbr's and the no-op control's goodput over mptcp-static's (95 % bootstrap interval
# over the rounds, from report.md's per-point table), the best single path and static's Ben, and
# the detour path's loss. Run from the repository root:
#   python3 docs/results/design/mechanisms-cc/table.py
import re
D = "docs/results/design/mechanisms-cc"
rep = open(D + "/report.md").read()
sec = rep[rep.index("### Per point"):]
lines = [l for l in sec.split("\n") if l.startswith("|")]
head = [c.strip() for c in lines[0].strip("|").split("|")]
print("| point | BDP | path 1 / path 2 (Mbit/s / ms / loss %) | detour loss >= 0.5 % | best single path | mptcp-static (Ben) | +bbr (Ben) | +bbr / static | +stale4 / static (no-op) |")
print("|---|---|---|---|---:|---:|---:|---:|---:|")
for l in lines[2:]:
    if not re.match(r"\| p\d+ ", l):
        continue
    c = dict(zip(head, [x.strip() for x in l.strip("|").split("|")]))
    ps = [p.split(" / ")[:3] for p in c["paths"].split("; ")]
    paths = "; ".join(" / ".join(p) for p in ps)
    lossy = "yes" if float(ps[1][2]) >= 0.5 else "no"
    best = max(float(c["tcp-path1"].strip("*").split()[0]), float(c["tcp-path2"].strip("*").split()[0]))
    print(f"| {c['point']} | {c['BDP']} | {paths} | {lossy} | {best:.2f} | {c['mptcp-static']} ({c['Ben mptcp-static'].split()[0]}) "
          f"| {c['mptcp-static+bbr']} ({c['Ben mptcp-static+bbr'].split()[0]}) "
          f"| {c['mptcp-static+bbr / mptcp-static']} | {c['mptcp-static+stale4 / mptcp-static']} |")
