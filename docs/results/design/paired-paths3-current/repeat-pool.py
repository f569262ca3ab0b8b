#!/usr/bin/env python3
"""The main run's points below 0.95 x best (p004, p005, p010; p005 and p010 harmed):
static / best single path over the main run's 3 rounds, each repeat's 3 rounds
(repeat/: p005, p010; repeat2/: p004, p005, p010; same build, run after the main
run) and all rounds pooled, both windows. Best = the single path with the highest mean
over the rounds used. Interval: bootstrap percentile over 2000 resamples of the
rounds (a round's procedures together), as the design report computes it; pooled
rounds come from two lab builds of the same point (a round is paired within itself).
Run from the repository root:
python3 docs/results/design/paired-paths3-current/repeat-pool.py"""
import collections, json, os, random, statistics as st, zlib

D = "docs/results/design/paired-paths3-current"
rounds = collections.defaultdict(list)  # point -> [{cell: record}]
for run, f in (("main", D + "/runs/paired/trials.jsonl"), ("repeat", D + "/repeat/runs/paired/trials.jsonl"),
               ("repeat2", D + "/repeat2/runs/paired/trials.jsonl")):
    if not os.path.exists(f):
        continue
    by = collections.defaultdict(dict)
    for l in open(f):
        x = json.loads(l)
        if x["status"] == "ok" and x["configuration"] in ("p004", "p005", "p010"):
            by[(x["configuration"], x["trial"])][x["cell"]] = x
    for (p, t), cells in sorted(by.items()):
        rounds[p].append((run, cells))
tcps = ["tcp-path1", "tcp-path2", "tcp-path3"]

def ratio(rs, key):
    m = {c: st.mean(r[c][key] for r in rs) for c in tcps + ["mptcp-static"]}
    return m["mptcp-static"] / max(m[c] for c in tcps)

print("| point | rounds | window | static / best [95 %] | harmed |")
print("|---|---|---|---|---|")
for p in sorted(rounds):
    runs = sorted({run for run, _ in rounds[p]}, key=["main", "repeat", "repeat2"].index)
    for which in runs + ["pooled"]:
        rs = [c for run, c in rounds[p] if which in ("pooled", run) and all(k in c for k in tcps + ["mptcp-static"])]
        if not rs:
            continue
        for key, w in (("goodput_mbps", "last byte"), ("equal_goodput_mbps", "equal")):
            random.seed(zlib.crc32(f"{p} {which} {key}".encode()))  # each row its own stream
            bs = sorted(ratio([random.choice(rs) for _ in rs], key) for _ in range(2000))
            lo, hi = bs[50], bs[1949]
            print(f"| {p} | {which} ({len(rs)}) | {w} | {ratio(rs, key):.3f} [{lo:.2f}, {hi:.2f}] | {'yes' if hi < 0.95 else 'no'} |")
