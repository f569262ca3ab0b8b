#!/usr/bin/env python3
"""Per point, from report.md: static / best, limit / best and limit / static with their
intervals to the last byte, and the same three ratios of the means over the equal window
(1-10 s) from the trial records. Copied from docs/results/design/lowat/perpoint.py and adapted
to 3 paths (best = the highest mean of tcp-path1..3); the equal window's columns are ratios of the means
(report.md has no per-point table for that window; its harmed lists are under "Over the equal
window"). Run: python3 perpoint.py [DIR]"""
import collections, glob, json, os, statistics, sys
d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
tables, cur, hdr = [], None, None
for line in open(os.path.join(d, "report.md")):
    if line.startswith("| point | BDP | paths"):
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
# "Harmed points, PROC: ..." lines: the first per procedure is to the last byte, the second over
# the equal window.
harmed = collections.defaultdict(list)
for line in open(os.path.join(d, "report.md")):
    if line.startswith("Harmed points, "):
        proc, pts = line[len("Harmed points, "):].split(":", 1)
        harmed[proc].append({x.strip().rstrip(".") for x in pts.split(",")})
def side(cell):
    # mark a ratio whose interval lies wholly above or below 1
    try:
        lo, hi = (float(x) for x in cell.split("[")[1].rstrip("]").split(","))
    except (IndexError, ValueError):
        return cell
    return cell + (" **above**" if lo > 1 else " **below**" if hi < 1 else "")
eqt = tables[1][1] if len(tables) > 1 else {}
eqg = collections.defaultdict(list)
for tf in glob.glob(os.path.join(d, "runs", "paired*", "trials.jsonl")):
    for line in open(tf):
        r = json.loads(line)
        if r.get("status") == "ok" and r.get("equal_goodput_mbps") is not None:
            eqg[(r["configuration"], r["cell"])].append(r["equal_goodput_mbps"])
def m(p, c):
    v = eqg.get((p, c))
    return statistics.mean(v) if v else None
S, L = "mptcp-static", "mptcp-static+lowat"
cols = [f"{S} / best", f"{L} / best", f"{L} / {S}"]
print("| point | BDP | static / best | limit / best | **limit / static** | equal window: static / best | limit / best | **limit / static** |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for p in sorted(last):
    a = last[p]
    if p in eqt:
        e = [eqt[p].get(c, "-") for c in cols]
    else:
        best = max(m(p, f"tcp-path{i}") or 0 for i in (1, 2, 3))
        st, lw = m(p, S), m(p, L)
        e = [f"{st/best:.2f}", f"{lw/best:.2f}", f"{lw/st:.2f}"] if st and lw and best else ["-"] * 3
        for i, proc in ((0, S), (1, L)):
            if len(harmed[proc]) > 1 and p in harmed[proc][1]:
                e[i] += " **H**"
    lb = [a.get(c, "-") for c in cols]
    lb[2] = side(lb[2])
    print("| " + " | ".join([p, a["BDP"]] + lb + e) + " |")
