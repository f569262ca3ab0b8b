#!/usr/bin/env python3
"""Per procedure and goodput window, over this run's complete points: mean >= 0.95 x best,
MPTCP / best geometric mean with a 95 % Student t interval over the points' log ratios (the
design report's geoMeanCI), median Ben over all points and over the low-BDP points (design.json),
and the default / old default paired per point (geometric mean of the ratios of the means with the
t interval). Means of the ok trials per point; the harmed verdicts and per-point intervals are
report.md's. Adapted from docs/results/design/paired-paths3-lowat/summary.py. Run from the
repository root: python3 docs/results/design/paired-paths3-fresh/summary.py"""
import collections, glob, json, math, os, statistics as st, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tools"))
from tint import tint

TCPS = ["tcp-path1", "tcp-path2", "tcp-path3"]
HERE = "docs/results/design/paired-paths3-fresh"
NEW, OLD = "mptcp-static", "mptcp-static+nolowat"
P = TCPS + ["mptcp-1sf", NEW, OLD]

def load(key):
    g = collections.defaultdict(list)
    for f in sorted(glob.glob(HERE + "/runs/paired*/trials.jsonl")):
        for l in open(f):
            x = json.loads(l)
            if x["status"] == "ok" and x.get(key) is not None:
                g[(x["configuration"], x["cell"])].append(x[key])
    return {p: {c: st.mean(g[(p, c)]) for c in P}
            for p in sorted({p for p, _ in g}) if all(len(g[(p, c)]) >= 3 for c in P)}

def gm(v):
    """Geometric mean with the Student t 95 % interval of the mean log (docs/results/tools/tint.py)."""
    m, lo, hi = tint([math.log(x) for x in v])
    if len(v) < 2:
        return f"{math.exp(m):.3f}"
    return f"{math.exp(m):.3f} [{math.exp(lo):.3f}, {math.exp(hi):.3f}]"

def low_points():
    """Low-BDP as the design defines it: every path's BDP (capacity x RTT) at most low_bdp_bytes."""
    d = json.load(open(HERE + "/design.json"))
    lim = d["low_bdp_bytes"]
    return {p["id"] for p in d["points"]
            if all(q["capacity_mbps"] * 1e6 / 8 * q["rtt_ms"] / 1000 <= lim for q in p["paths"])}

LOW = low_points()

def row(name, pts, proc):
    r, ben, benlow = [], [], []
    for p in sorted(pts):
        m = pts[p]
        c = [m[t] for t in TCPS]
        cmax, g = max(c), m[proc]
        r.append((p, g / cmax))
        b = (g - cmax) / (sum(c) - cmax) if g >= cmax else (g - cmax) / cmax
        ben.append(b)
        if p in LOW:
            benlow.append(b)
    n = len(r)
    ge = sum(x >= 0.95 for _, x in r)
    below = ", ".join(f"{p} {x:.3f}" for p, x in r if x < 0.95) or "none"
    bl = f"{st.median(benlow):.2f} (n = {len(benlow)})" if benlow else "no low-BDP point"
    print(f"| {name} | {n} | {ge} ({100 * ge / n:.0f} %) | {gm([x for _, x in r])} | {st.median(ben):.2f} | {bl} | {below} |")

wins = [("last byte", "goodput_mbps"), ("equal window", "equal_goodput_mbps")]
data = {w: load(k) for w, k in wins}
print(f"Points complete in this run ({len(data['last byte'])}): {','.join(sorted(data['last byte']))}")
print(f"Low-BDP points (design.json): {', '.join(sorted(LOW)) or 'none found'}\n")
print("| procedure, window | points | mean >= 0.95 x best | MPTCP / best: geometric mean [t 95 %] | median Ben | median Ben, low-BDP | points below 0.95 x best (mean ratio) |")
print("|---|---:|---:|---|---:|---:|---|")
for w, _ in wins:
    for proc, name in [(NEW, "default (static + limit)"), (OLD, "old default (static)")]:
        row(f"{name}, {w}", data[w], proc)
    r = [data[w][p]["mptcp-1sf"] / max(data[w][p][t] for t in TCPS) for p in sorted(data[w])]
    print(f"| MPTCP over the best path alone / best TCP, {w} | {len(r)} | | {gm(r)} | | | |")
print()
print("| window | points | default / old default: geometric mean [t 95 %] | ratio of means > 1 | < 1 |")
print("|---|---:|---|---:|---:|")
for w, _ in wins:
    r = [data[w][p][NEW] / data[w][p][OLD] for p in sorted(data[w])]
    print(f"| {w} | {len(r)} | {gm(r)} | {sum(x > 1 for x in r)} | {sum(x < 1 for x in r)} |")
