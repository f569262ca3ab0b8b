#!/usr/bin/env python3
# Pooled per-round ratios X / static at a point over several paired runs (rounds of different
# runs are different rounds): geometric mean with a Student t 95 % interval over the rounds,
# and how many rounds are below 1; both goodput windows.
# usage (from docs/results/design): python3 lowatrtt-points/pooled.py
# (lowatrtt-points' copy: this directory's rounds (p149: runs 1 and 2) added last; the earlier runs are builds b4e790c and 795e880a)
import json, math, statistics
T = {29: 2.045, 30: 2.042, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160}
RUNS = {"p149": ["lowat/runs/paired/trials.jsonl", "lowat-p149/runs/paired/trials.jsonl", "lowat-p149/gains/runs/paired/trials.jsonl", "lowat-p149/rerun/runs/paired/trials.jsonl", "lowatrtt-points/runs/paired/trials.jsonl", "lowatrtt-points/p149-more/runs/paired/trials.jsonl"]}
for p in ("p019", "p025", "p139"):
    RUNS[p] = ["lowat/runs/paired/trials.jsonl", "lowat-p149/gains/runs/paired/trials.jsonl", "lowatrtt-points/runs/paired/trials.jsonl"]
def load(fn, pt):
    d = {}
    for l in open(fn):
        t = json.loads(l)
        if t["configuration"] == pt and t["status"] == "ok":
            d[(t["cell"], t["trial"])] = (t["goodput_mbps"], t["equal_goodput_mbps"])
    return d
print("| point | X | runs | window | rounds (runs) | X / static, geometric mean [95 %] | rounds below 1 |")
print("|---|---|---|---|---:|---:|---:|")
for pt, allfiles in RUNS.items():
  for which, files in (("earlier builds", [f for f in allfiles if not f.startswith("lowatrtt-points")]), ("earlier + this dir", allfiles)):
    for cell in ("mptcp-static+lowat",):
        for w, wn in ((0, "last byte"), (1, "equal")):
            r, runs = [], 0
            for fn in files:
                try:
                    d = load(fn, pt)
                except FileNotFoundError:
                    continue
                rr = [d[(cell, k)][w] / d[("mptcp-static", k)][w] for k in range(1, 10) if (cell, k) in d and ("mptcp-static", k) in d]
                runs += bool(rr); r += rr
            if len(r) < 3:
                continue
            lr = [math.log(x) for x in r]
            m, s = statistics.mean(lr), statistics.stdev(lr) / math.sqrt(len(lr))
            t = T[len(lr) - 1]
            print(f"| {pt} | {cell} | {which} | {wn} | {len(r)} ({runs}) | {math.exp(m):.2f} [{math.exp(m - t * s):.2f}, {math.exp(m + t * s):.2f}] | {sum(x < 1 for x in r)} |")
