#!/usr/bin/env python3
"""Per procedure and goodput window, over this run's complete points (and beside it
paired-paths3-current's static over the same points; another run): mean >= 0.95 x best,
MPTCP / best geometric mean with a 95 % Student t interval over the points' log ratios
(the design report's geoMeanCI), median Ben, and limit / static paired per point (geometric
mean of the ratios of the means with the t interval). Means of the ok trials per point; the
harmed verdicts and per-point intervals (paired bootstrap) are report.md's. Copied from
docs/results/design/paired-paths3-current/summary.py and adapted. Run from the repository
root: python3 docs/results/design/paired-paths3-lowat/summary.py"""
import collections, glob, json, math, statistics as st

T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179]
TCPS = ["tcp-path1", "tcp-path2", "tcp-path3"]
HERE = "docs/results/design/paired-paths3-lowat"
CUR = "docs/results/design/paired-paths3-current"

def load(d, key, procs):
    g = collections.defaultdict(list)
    for f in sorted(glob.glob(d + "/runs/paired*/trials.jsonl")):
        for l in open(f):
            x = json.loads(l)
            if x["status"] == "ok" and x.get(key) is not None:
                g[(x["configuration"], x["cell"])].append(x[key])
    return {p: {c: st.mean(g[(p, c)]) for c in procs}
            for p in sorted({p for p, _ in g}) if all(len(g[(p, c)]) >= 3 for c in procs)}

def gm(v):
    lv = [math.log(x) for x in v]
    m = st.mean(lv)
    if len(v) < 2:
        return f"{math.exp(m):.3f}"
    h = T975[len(v) - 2] * st.stdev(lv) / math.sqrt(len(v))
    return f"{math.exp(m):.3f} [{math.exp(m - h):.3f}, {math.exp(m + h):.3f}]"

def row(name, pts, proc, only):
    r, ben = [], []
    for p in only:
        m = pts[p]
        c = [m[t] for t in TCPS]
        cmax, g = max(c), m[proc]
        r.append(g / cmax)
        ben.append((g - cmax) / (sum(c) - cmax) if g >= cmax else (g - cmax) / cmax)
    n = len(r)
    ge = sum(x >= 0.95 for x in r)
    below = ", ".join(f"{p} {x:.3f}" for p, x in zip(only, r) if x < 0.95) or "none"
    print(f"| {name} | {n} | {ge} ({100 * ge / n:.0f} %) | {gm(r)} | {st.median(ben):.2f} | {below} |")

P = TCPS + ["mptcp-1sf", "mptcp-static", "mptcp-static+lowat"]
here = {w: load(HERE, k, P) for w, k in [("last byte", "goodput_mbps"), ("equal window", "equal_goodput_mbps")]}
cur = {w: load(CUR, k, TCPS + ["mptcp-static"]) for w, k in [("last byte", "goodput_mbps"), ("equal window", "equal_goodput_mbps")]}
pts = sorted(here["last byte"])
print(f"Points complete in this run ({len(pts)}): {','.join(pts)}\n")
print("| run, procedure, window | points | mean >= 0.95 x best | MPTCP / best: geometric mean [t 95 %] | median Ben | points below 0.95 x best (mean ratio) |")
print("|---|---:|---:|---|---:|---|")
for w in here:
    row(f"this run, static, {w}", here[w], "mptcp-static", pts)
    row(f"this run, static + limit, {w}", here[w], "mptcp-static+lowat", pts)
    cp = [p for p in pts if p in cur[w]]
    row(f"paired-paths3-current (other run), static, {w}", cur[w], "mptcp-static", cp)
print("\n| window | points | limit / static: geometric mean [t 95 %] | ratio of means > 1 | < 1 |")
print("|---|---:|---|---:|---:|")
for w in here:
    v = [here[w][p]["mptcp-static+lowat"] / here[w][p]["mptcp-static"] for p in pts]
    print(f"| {w} | {len(v)} | {gm(v)} | {sum(x > 1 for x in v)} | {sum(x < 1 for x in v)} |")

# Per point beside paired-paths3-current (another run: other hour, load and build; context).
print("\n| point | best path (this run) | best TCP, this run | best TCP, paired-paths3-current | static / best, this run | static / best, paired-paths3-current | static + limit / best, this run |")
print("|---|---|---:|---:|---:|---:|---:|")
for p in pts:
    m, c = here["last byte"][p], cur["last byte"].get(p)
    b = max(TCPS, key=lambda t: m[t])
    bc = max(c[t] for t in TCPS) if c else None
    print(f"| {p} | {b} | {m[b]:.2f} | {bc:.2f} | {m['mptcp-static'] / m[b]:.3f} | {c['mptcp-static'] / bc:.3f} | {m['mptcp-static+lowat'] / m[b]:.3f} |")
