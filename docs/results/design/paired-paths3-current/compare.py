#!/usr/bin/env python3
"""Per point: this run (current build) beside paired-paths3 (build e9fba1b), the
same 12 points of seed 3, the same procedures and instrument, paired within each
run (other build, other hour and load between the runs: context, not a paired
comparison). Means of the ok trials, Mbit/s, to the last byte (the only window
paired-paths3 recorded); this run's equal-window (1-10 s) figures beside.
Run from the repository root:
python3 docs/results/design/paired-paths3-current/compare.py"""
import collections, glob, json, math, statistics as st

def load(d):
    m = collections.defaultdict(lambda: collections.defaultdict(list))
    for f in sorted(glob.glob(d + "/runs/paired*/trials.jsonl")):
        for l in open(f):
            x = json.loads(l)
            if x["status"] != "ok":
                continue
            m[(x["configuration"], x["cell"])]["last"].append(x["goodput_mbps"])
            if "equal_goodput_mbps" in x:
                m[(x["configuration"], x["cell"])]["equal"].append(x["equal_goodput_mbps"])
    return m

new = load("docs/results/design/paired-paths3-current")
old = load("docs/results/design/paired-paths3")
tcps = ["tcp-path1", "tcp-path2", "tcp-path3"]

def fig(m, p, w):
    if any(len(m[(p, c)][w]) < 3 for c in tcps + ["mptcp-1sf", "mptcp-static"]):
        return None  # point not complete (3 ok trials of every procedure)
    means = {c: st.mean(m[(p, c)][w]) for c in tcps + ["mptcp-1sf", "mptcp-static"]}
    best = max(tcps, key=lambda c: means[c])
    return best, means[best], means["mptcp-static"], means["mptcp-static"] / means[best]

points = sorted({p for p, _ in new} & {p for p, _ in old})
print("| point | best path (e9fba1b) | best TCP e9fba1b | best TCP now | static e9fba1b | static now | static / best e9fba1b | static / best now | static / best now, equal window |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
ratio = collections.defaultdict(list)
for p in points:
    o, n, e = fig(old, p, "last"), fig(new, p, "last"), fig(new, p, "equal")
    if not o or not n:
        continue
    bo = f"{o[0]}" + ("" if o[0] == n[0] else f" (now {n[0]})")
    print(f"| {p} | {bo} | {o[1]:.2f} | {n[1]:.2f} | {o[2]:.2f} | {n[2]:.2f} | {o[3]:.3f} | {n[3]:.3f} | {e[3]:.3f} |" if e else
          f"| {p} | {bo} | {o[1]:.2f} | {n[1]:.2f} | {o[2]:.2f} | {n[2]:.2f} | {o[3]:.3f} | {n[3]:.3f} | - |")
    ratio["best TCP"].append(math.log(n[1] / o[1]))
    ratio["static"].append(math.log(n[2] / o[2]))
    ratio["static / best"].append(math.log(n[3] / o[3]))
    ratio["old static / best"].append(math.log(o[3]))
    ratio["new static / best"].append(math.log(n[3]))
    ratio["old >= 0.95"].append(o[3] >= 0.95)
    ratio["new >= 0.95"].append(n[3] >= 0.95)
print()
k = len(ratio["static"])
print(f"points in both runs: {k}")
for c in ["best TCP", "static", "static / best"]:
    if ratio[c]:
        print(f"- {c}: now / e9fba1b, geometric mean {math.exp(st.mean(ratio[c])):.3f}")
if k:
    print(f"- static / best, geometric mean: e9fba1b {math.exp(st.mean(ratio['old static / best'])):.3f}, now {math.exp(st.mean(ratio['new static / best'])):.3f}")
    print(f"- static mean >= 0.95 x best: e9fba1b {sum(ratio['old >= 0.95'])} of {k}, now {sum(ratio['new >= 0.95'])} of {k}")
