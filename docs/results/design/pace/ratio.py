#!/usr/bin/env python3
"""ratio.py RESULTS.csv A B: per point the ratio B / A of the mean goodputs (ok trials, to the last
byte, or the column given as 4th argument, e.g. equal_goodput_mbps) with each round's B / A, then their geometric mean over the points with a Student t 95 %
interval over the points' log ratios (the runner's method for its "Against mptcp-static" table,
which it does not make when mptcp-static is not in the run)."""
import collections, csv, math, statistics, sys

path, a, b = sys.argv[1:4]
COL = sys.argv[4] if len(sys.argv) > 4 else "goodput_mbps"
g = collections.defaultdict(dict)
for r in csv.DictReader(open(path)):
    if r["status"] == "ok" and r["procedure"] in (a, b):
        g[r["point"]].setdefault(r["procedure"], {})[int(r["trial"])] = float(r[COL])
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145}
print(f"| point | {a} | {b} | {b} / {a} | per round |")
print("|---|---:|---:|---:|---|")
logs = []
for p in sorted(g):
    x, y = g[p].get(a, {}), g[p].get(b, {})
    if not x or not y:
        continue
    ma, mb = statistics.mean(x.values()), statistics.mean(y.values())
    rounds = ", ".join(f"{y[k] / x[k]:.2f}" if x.get(k) else "-" for k in sorted(set(x) | set(y)) if k in y)
    logs.append(math.log(mb / ma))
    print(f"| {p} | {ma:.2f} | {mb:.2f} | {mb / ma:.2f} | {rounds} |")
n = len(logs)
m, s = statistics.mean(logs), statistics.stdev(logs)
h = T975[n - 1] * s / math.sqrt(n)
print(f"\n{b} / {a} over {n} points: geometric mean {math.exp(m):.3f} [{math.exp(m - h):.3f}, {math.exp(m + h):.3f}]")
