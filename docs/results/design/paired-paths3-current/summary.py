#!/usr/bin/env python3
"""Per run and goodput window, over the points complete in BOTH runs (and over
all of this run's complete points): static mean >= 0.95 x best, MPTCP / best
geometric mean with a 95 % Student t interval over the points' log ratios (the
method of the design report's geoMeanCI), median Ben, and mptcp-1sf / TCP on
the same path with the same interval. Means of the ok trials per point. Harmed
verdicts need the paired bootstrap: they are in report.md. Run from the
repository root: python3 docs/results/design/paired-paths3-current/summary.py"""
import collections, glob, json, math, statistics as st

T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179]
PATH = {"default": "tcp-path1", "nat:detour1": "tcp-path2", "nat:detour2": "tcp-path3"}
TCPS = ["tcp-path1", "tcp-path2", "tcp-path3"]
PROCS = TCPS + ["mptcp-1sf", "mptcp-static"]

def load(d, key):
    g = collections.defaultdict(list)
    sf = {}
    for f in sorted(glob.glob(d + "/runs/paired*/trials.jsonl")):
        for l in open(f):
            x = json.loads(l)
            if x["status"] != "ok" or key not in x:
                continue
            g[(x["configuration"], x["cell"])].append(x[key])
            if x["cell"] == "mptcp-1sf":
                sf[x["configuration"]] = PATH[x["subflows"][0]["path"]]
    pts = {}
    for p in sorted({p for p, _ in g}):
        if all(len(g[(p, c)]) >= 3 for c in PROCS):
            pts[p] = ({c: st.mean(g[(p, c)]) for c in PROCS}, sf[p])
    return pts

def gm(v):
    m = st.mean(math.log(x) for x in v)
    if len(v) < 2:
        return f"{math.exp(m):.3f}"
    h = T975[len(v) - 2] * st.stdev([math.log(x) for x in v]) / math.sqrt(len(v))
    return f"{math.exp(m):.3f} [{math.exp(m - h):.3f}, {math.exp(m + h):.3f}]"

def row(name, pts, only):
    r, ben, k = [], [], []
    for p in only:
        m, sfp = pts[p]
        c = [m[t] for t in TCPS]
        cmax, g = max(c), m["mptcp-static"]
        r.append(g / cmax)
        ben.append((g - cmax) / (sum(c) - cmax) if g >= cmax else (g - cmax) / cmax)
        k.append(m["mptcp-1sf"] / m[sfp])
    n = len(r)
    ge = sum(x >= 0.95 for x in r)
    print(f"| {name} | {n} | {ge} ({100 * ge / n:.0f} %) | {gm(r)} | {st.median(ben):.2f} | {gm(k)} |")

runs = {
    "paired-paths3 (e9fba1b), to the last byte": load("docs/results/design/paired-paths3", "goodput_mbps"),
    "now, to the last byte": load("docs/results/design/paired-paths3-current", "goodput_mbps"),
    "now, equal window": load("docs/results/design/paired-paths3-current", "equal_goodput_mbps"),
}
both = sorted(set.intersection(*(set(v) for v in runs.values())))
hdr = "| run, window | points | mean >= 0.95 x best | static / best: geometric mean [t 95 %] | median Ben | mptcp-1sf / TCP same path: geometric mean [t 95 %] |\n|---|---:|---:|---|---:|---|"
print(f"Points complete in both runs ({len(both)}): {','.join(both)}\n")
print(hdr)
for name, pts in runs.items():
    if both:
        row(name, pts, both)
allnew = sorted(runs["now, to the last byte"])
if allnew != both:
    print(f"\nAll of this run's complete points ({len(allnew)}):\n")
    print(hdr)
    for name in ["now, to the last byte", "now, equal window"]:
        row(name, runs[name], allnew)
