#!/usr/bin/env python3
"""Per point: this paired run's means beside paths3's single unpaired trial
(same seed 3, same 12 points; other build, other day, so context, not a
paired comparison). Run from the repository root:
python3 docs/results/design/paired-paths3/compare.py"""
import collections, glob, json, math, statistics as st

here = [json.loads(l) for f in sorted(glob.glob("docs/results/design/paired-paths3/runs/paired*/trials.jsonl")) for l in open(f)]
mean = collections.defaultdict(list)
for x in here:
    if x["status"] == "ok":
        mean[(x["configuration"], x["cell"])].append(x["goodput_mbps"])
old = {}
for x in json.load(open("docs/results/design/paths3/results.json")):
    if x["status"] == "ok":
        old[(x["point"], x["procedure"])] = x["goodput_mbps"]
procs = ["tcp-path1", "tcp-path2", "tcp-path3", "mptcp-static"]
points = sorted({p for p, _ in mean})
print("| point | " + " | ".join(f"{c} here | {c} paths3" for c in procs) + " |")
print("|---|" + "---:|" * (2 * len(procs)))
ratios = collections.defaultdict(list)
for p in points:
    cells = []
    for c in procs:
        h = st.mean(mean[(p, c)]) if mean[(p, c)] else None
        o = old.get((p, c))
        cells += [f"{h:.2f}" if h is not None else "-", f"{o:.2f}" if o is not None else "-"]
        if h and o:
            ratios[c].append(math.log(h / o))
    print(f"| {p} | " + " | ".join(cells) + " |")
print()
for c in procs:
    if ratios[c]:
        print(f"- {c}: here / paths3 geometric mean {math.exp(st.mean(ratios[c])):.3f} over {len(ratios[c])} points")
