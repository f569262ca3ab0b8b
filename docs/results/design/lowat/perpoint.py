#!/usr/bin/env python3
"""Per point, from report.md: static / best, lowat / best and lowat / static with their
intervals, to the last byte and over the equal window (the report's two per-point tables)."""
import os, sys
d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
tables, cur, hdr = [], None, None
for line in open(os.path.join(d, "report.md")):
    if line.startswith("| point |"):
        hdr = [c.strip() for c in line.strip().strip("|").split("|")]
        cur = {}
        tables.append((hdr, cur))
        continue
    if cur is not None and line.startswith("| p"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        cur[cells[0]] = dict(zip(hdr, cells))
    elif cur is not None and not line.startswith("|"):
        cur = None
last = tables[0][1]
import collections, glob, json, statistics
eqg = collections.defaultdict(list)
for tf in glob.glob(os.path.join(d, "runs", "paired*", "trials.jsonl")):
    for line in open(tf):
        r = json.loads(line)
        if r.get("status") == "ok" and r.get("equal_goodput_mbps") is not None:
            eqg[(r["configuration"], r["cell"])].append(r["equal_goodput_mbps"])
def m(p, c):
    v = eqg.get((p, c))
    return statistics.mean(v) if v else None
cols = ["mptcp-static / best", "mptcp-static+lowat / best", "mptcp-static+lowat / mptcp-static"]
print("| point | BDP | static / best | lowat / best | **lowat / static** | equal window (1-10 s): static / best, lowat / best, lowat / static (means) |")
print("|---|---|---:|---:|---:|---:|")
for p in sorted(last):
    a = last[p]
    best = max(m(p, "tcp-path1") or 0, m(p, "tcp-path2") or 0)
    st, lw = m(p, "mptcp-static"), m(p, "mptcp-static+lowat")
    e = f"{st/best:.2f}, {lw/best:.2f}, {lw/st:.2f}" if st and lw and best else "-"
    print("| " + " | ".join([p, a["BDP"]] + [a.get(c, "-") for c in cols] + [e]) + " |")
