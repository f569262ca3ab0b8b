#!/usr/bin/env python3
"""static + limit / static, paired per round, in each of the three runs of
candidates-lowat's static arms (main run ../trials.jsonl, 18 rounds; diagnostic
run ../diag/trials.jsonl, 12 rounds; this run trials.jsonl) and pooled over all
their rounds (geometric mean of the per-round ratios, 95 % Student t interval
on the logs; pooling treats every round as one sample and ignores any
difference between runs). Only rounds in which both cells are ok."""
import json, math, os, statistics as st
from collections import defaultdict
here = os.path.dirname(os.path.abspath(__file__))
RUNS = [("main run (6 cells, 18 rounds)", "../trials.jsonl"),
        ("diagnostic run (2 cells, 12 rounds)", "../diag/trials.jsonl"),
        ("run3 (6 cells, this run)", "trials.jsonl")]
def tq(df):  # two-sided 95 % Student t quantile
    T = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 50: 2.009}
    k = max(x for x in T if x <= df)
    return T[k]
def interval(r):
    l = [math.log(x) for x in r]
    g = math.exp(st.mean(l))
    if len(l) < 2:
        return g, float("nan"), float("nan")
    h = tq(len(l) - 1) * st.stdev(l) / math.sqrt(len(l))
    return g, math.exp(st.mean(l) - h), math.exp(st.mean(l) + h)
pool = defaultdict(list)
for name, f in RUNS:
    by = defaultdict(dict)
    for l in open(os.path.join(here, f)):
        r = json.loads(l)
        if r.get("status") == "ok":
            by[r["cell"]][r["trial"]] = r
    common = sorted(t for t in by["mptcp-nat-static-lowat"] if t in by["mptcp-nat-static"])
    for fld, w in [("goodput_mbps", "overall"), ("tail_mbps", "last third")]:
        rat = [by["mptcp-nat-static-lowat"][t][fld] / by["mptcp-nat-static"][t][fld] for t in common]
        pool[w] += rat
        g, lo, hi = interval(rat)
        print(f"{name}, {w}: {len(rat)} rounds, geo. mean {g:.3f} [{lo:.3f}, {hi:.3f}], above 1 in {sum(x > 1 for x in rat)}")
for w, rat in pool.items():
    g, lo, hi = interval(rat)
    print(f"pooled, {w}: {len(rat)} rounds, geo. mean {g:.3f} [{lo:.3f}, {hi:.3f}] (t quantile for df {len(rat)-1} rounded down to the table's {max(x for x in [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,25,30,40,50] if x <= len(rat)-1)}), above 1 in {sum(x > 1 for x in rat)}")
