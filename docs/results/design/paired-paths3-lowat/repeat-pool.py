#!/usr/bin/env python3
"""p004 and p010 (the main run's harmed points: p004 with the limit, p010 with both): static / best,
limit / best and limit / static over the main run's 3 rounds, the repeat's 3 rounds (repeat/, same
build, run right after) and all 6 pooled, both windows. Best = the single path with the highest
mean over the rounds used. Interval: bootstrap percentile over 2000 resamples of the rounds (a
round's procedures together), as the design report computes it; the pooled rounds come from two lab
builds of the same point (a round is paired within itself). Copied from
paired-paths3-current/repeat-pool.py and adapted (two MPTCP procedures, limit / static).
Run from the repository root: python3 docs/results/design/paired-paths3-lowat/repeat-pool.py"""
import collections, json, os, random, statistics as st, zlib

D = "docs/results/design/paired-paths3-lowat"
PTS = ("p004", "p010")
S, L = "mptcp-static", "mptcp-static+lowat"
tcps = ["tcp-path1", "tcp-path2", "tcp-path3"]
need = tcps + [S, L]
rounds = collections.defaultdict(list)  # point -> [(run, {cell: record})]
for run, f in (("main", D + "/runs/paired/trials.jsonl"), ("repeat", D + "/repeat/runs/paired/trials.jsonl")):
    if not os.path.exists(f):
        continue
    by = collections.defaultdict(dict)
    for l in open(f):
        x = json.loads(l)
        if x["status"] == "ok" and x["configuration"] in PTS:
            by[(x["configuration"], x["trial"])][x["cell"]] = x
    for (p, t), cells in sorted(by.items()):
        rounds[p].append((run, cells))

def ratios(rs, key):
    m = {c: st.mean(r[c][key] for r in rs) for c in need}
    b = max(m[c] for c in tcps)
    return m[S] / b, m[L] / b, m[L] / m[S]

def fmt(v, lo, hi):
    return f"{v:.3f} [{lo:.2f}, {hi:.2f}]"

print("| point | rounds | window | static / best [95 %] | limit / best [95 %] | limit / static [95 %] | harmed: static, limit |")
print("|---|---|---|---|---|---|---|")
for p in sorted(rounds):
    for which in ("main", "repeat", "pooled"):
        rs = [c for run, c in rounds[p] if which in ("pooled", run) and all(k in c for k in need)]
        if not rs:
            continue
        for key, w in (("goodput_mbps", "last byte"), ("equal_goodput_mbps", "equal")):
            random.seed(zlib.crc32(f"{p} {which} {key}".encode()))  # each row its own stream
            bs = [ratios([random.choice(rs) for _ in rs], key) for _ in range(2000)]
            est = ratios(rs, key)
            cells = []
            for i in range(3):
                s = sorted(b[i] for b in bs)
                cells.append((est[i], s[50], s[1949]))
            h = ["yes" if c[2] < 0.95 else "no" for c in cells[:2]]
            print(f"| {p} | {which} ({len(rs)}) | {w} | " + " | ".join(fmt(*c) for c in cells) + f" | {h[0]}, {h[1]} |")
