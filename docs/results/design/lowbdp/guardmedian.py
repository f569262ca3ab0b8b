#!/usr/bin/env python3
"""Static and guard over the 13 low-BDP points, each point from its own paired run (fix/ for
p044, p071, p114, p184; guard-rest/ for the other nine): per point the means, Ben of each (from
the means), guard / static; then the median Ben of each over the points measured, with a bootstrap
interval (each point's rounds resampled, 2000 times), to the last byte and over the equal window."""
import json, os, statistics, collections, random, sys
H = os.path.dirname(os.path.abspath(__file__))
KEY = sys.argv[1] if len(sys.argv) > 1 else 'goodput_mbps'
def ben(g, c):
    m = max(c); s = sum(c)
    return (g - m) / (s - m) if g >= m else (g - m) / m
P = collections.defaultdict(lambda: collections.defaultdict(dict))
for run in ['fix', 'guard-rest']:
    f = os.path.join(H, run, 'runs', 'paired', 'trials.jsonl')
    if not os.path.exists(f): continue
    for l in open(f):
        t = json.loads(l)
        if t['status'] != 'ok' or t.get(KEY) is None: continue
        P[t['configuration']][t['trial']][t['cell']] = t[KEY]
def pb(rounds, proc):
    m = lambda q: statistics.mean(r[q] for r in rounds if q in r)
    return ben(m(proc), [m('tcp-path1'), m('tcp-path2')]), m(proc) / max(m('tcp-path1'), m('tcp-path2'))
print(f"| point | rounds | static / best | guard / best | guard / static | Ben static | Ben guard |")
print("|---|---:|---:|---:|---:|---:|---:|")
pts = {}
for p in sorted(P):
    R = [r for r in P[p].values() if all(k in r for k in ('tcp-path1', 'tcp-path2', 'mptcp-static', 'mptcp-guard'))]
    if len(R) < 2: continue
    pts[p] = R
    bs, rs = pb(R, 'mptcp-static'); bg, rg = pb(R, 'mptcp-guard')
    print(f"| {p} | {len(R)} | {rs:.2f} | {rg:.2f} | {rg/rs:.2f} | {bs:.2f} | {bg:.2f} |")
rnd = random.Random(26)
for proc in ['mptcp-static', 'mptcp-guard']:
    est = statistics.median(pb(R, proc)[0] for R in pts.values())
    meds = sorted(statistics.median(pb([rnd.choice(R) for _ in R], proc)[0] for R in pts.values()) for _ in range(2000))
    print(f"\n- {proc} ({KEY}): median Ben over {len(pts)} points {est:.2f} [{meds[49]:.2f}, {meds[1949]:.2f}]; points >= 0.7: {sum(1 for R in pts.values() if pb(R, proc)[0] >= 0.7)}")
