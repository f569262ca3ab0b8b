#!/usr/bin/env python3
"""p005 and p010 (the main run's harmed points): static / best single path over the
main run's 3 rounds, the repeat's 3 rounds (repeat/, same build, run right after)
and the 6 rounds pooled, both windows. Best = the single path with the highest mean
over the rounds used. Interval: bootstrap percentile over 2000 resamples of the
rounds (a round's procedures together), as the design report computes it; pooled
rounds come from two lab builds of the same point (a round is paired within itself).
Run from the repository root:
python3 docs/results/design/paired-paths3-current/repeat-pool.py"""
import collections, json, random, statistics as st

D = "docs/results/design/paired-paths3-current"
rounds = collections.defaultdict(list)  # point -> [{cell: record}]
for run, f in (("main", D + "/runs/paired/trials.jsonl"), ("repeat", D + "/repeat/runs/paired/trials.jsonl")):
    by = collections.defaultdict(dict)
    for l in open(f):
        x = json.loads(l)
        if x["status"] == "ok" and x["configuration"] in ("p005", "p010"):
            by[(x["configuration"], x["trial"])][x["cell"]] = x
    for (p, t), cells in sorted(by.items()):
        rounds[p].append((run, cells))
tcps = ["tcp-path1", "tcp-path2", "tcp-path3"]
random.seed(26)

def ratio(rs, key):
    m = {c: st.mean(r[c][key] for r in rs) for c in tcps + ["mptcp-static"]}
    return m["mptcp-static"] / max(m[c] for c in tcps)

print("| point | rounds | window | static / best [95 %] | harmed |")
print("|---|---|---|---|---|")
for p in sorted(rounds):
    for which in ("main", "repeat", "pooled"):
        rs = [c for run, c in rounds[p] if which in ("pooled", run)]
        for key, w in (("goodput_mbps", "last byte"), ("equal_goodput_mbps", "equal")):
            bs = sorted(ratio([random.choice(rs) for _ in rs], key) for _ in range(2000))
            lo, hi = bs[50], bs[1949]
            print(f"| {p} | {which} ({len(rs)}) | {w} | {ratio(rs, key):.3f} [{lo:.2f}, {hi:.2f}] | {'yes' if hi < 0.95 else 'no'} |")
