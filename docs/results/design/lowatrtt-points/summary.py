#!/usr/bin/env python3
# Per point: lowatrtt / static, lowatrtt / lowat, lowat / static, ratio of means with the paired
# bootstrap 95 % interval over the rounds (compare.py's method: rounds resampled together, 4000
# resamples; a fresh Random(1) per cell so the table does not depend on its order), both windows;
# and the geometric mean over the points of the per-point ratios.
# usage: summary.py TRIALS.jsonl [TRIALS.jsonl ...] (several runs: their rounds are different rounds)
import collections, json, math, random, statistics, sys
g = collections.defaultdict(dict)
for i, fn in enumerate(sys.argv[1:]):
    for l in open(fn):
        t = json.loads(l)
        if t.get("status") == "ok":
            g[t["configuration"]][(t["cell"], 100 * i + t["trial"])] = (t["goodput_mbps"], t["equal_goodput_mbps"])
S, L, R = "mptcp-static", "mptcp-static+lowat", "mptcp-static+lowatrtt"
PAIRS = ((R, S, "lowatrtt / static"), (R, L, "lowatrtt / lowat"), (L, S, "lowat / static"))
def cell(d, a, b, w):
    ks = sorted(k for c, k in d if c == a and (b, k) in d)
    if len(ks) < 2:
        return None, "-"
    ratio = sum(d[(a, k)][w] for k in ks) / sum(d[(b, k)][w] for k in ks)
    rng = random.Random(1); bb = []
    for _ in range(4000):
        s = rng.choices(ks, k=len(ks))
        bb.append(sum(d[(a, k)][w] for k in s) / sum(d[(b, k)][w] for k in s))
    bb.sort(); lo, hi = bb[100], bb[3899]
    mark = " **below**" if hi < 1 else (" **above**" if lo > 1 else "")
    return ratio, f"{ratio:.2f} [{lo:.2f}, {hi:.2f}]{mark} ({len(ks)})"
for w, wn in ((0, "to the last byte"), (1, "equal window (1-10 s)")):
    print(f"\n**{wn}** (rounds in brackets at the end)\n")
    print("| point | " + " | ".join(p[2] for p in PAIRS) + " |")
    print("|---|" + "---:|" * len(PAIRS))
    logs = collections.defaultdict(list)
    for pt in sorted(g):
        cs = []
        for a, b, n in PAIRS:
            r, s = cell(g[pt], a, b, w)
            cs.append(s)
            if r:
                logs[n].append(math.log(r))
        print(f"| {pt} | " + " | ".join(cs) + " |")
    print("| geometric mean over points | " + " | ".join(f"{math.exp(statistics.mean(logs[p[2]])):.3f}" if logs[p[2]] else "-" for p in PAIRS) + " |")
