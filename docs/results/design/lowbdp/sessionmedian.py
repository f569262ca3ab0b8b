#!/usr/bin/env python3
"""Static's low-BDP Ben on build 3b0109f4, this session: per point from each of runs 1, 1b, 2, 3
(diag, diag-mid, fix, guard-rest; each point's Ben from its own run's paired TCP means) and pooled
over the runs that measured it (rounds resampled within their run); the median over the 13 points
with a bootstrap interval (2000 resamples of every point's rounds), to the last byte and over the
equal window.
usage: sessionmedian.py [equal_goodput_mbps]"""
import json, os, statistics, collections, random, sys
H = os.path.dirname(os.path.abspath(__file__))
KEY = sys.argv[1] if len(sys.argv) > 1 else 'goodput_mbps'
RUNS = ['diag', 'diag-mid', 'fix', 'guard-rest']
def ben(g, c):
    m = max(c); s = sum(c)
    return (g - m) / (s - m) if g >= m else (g - m) / m
P = collections.defaultdict(lambda: collections.defaultdict(dict))
for run in RUNS:
    for l in open(os.path.join(H, run, 'runs', 'paired', 'trials.jsonl')):
        t = json.loads(l)
        if t['status'] == 'ok' and t.get(KEY) is not None:
            P[t['configuration']][(run, t['trial'])][t['cell']] = t[KEY]
def pb(rounds):
    m = lambda q: statistics.mean(r[q] for r in rounds if q in r)
    return ben(m('mptcp-static'), [m('tcp-path1'), m('tcp-path2')])
print('| point | ' + ' | '.join(RUNS) + ' | pooled (rounds) |')
print('|---|' + '---:|' * (len(RUNS) + 1))
pts = {}
for p in sorted(P):
    R = [r for r in P[p].values() if all(k in r for k in ('tcp-path1', 'tcp-path2', 'mptcp-static'))]
    pts[p] = R
    cells = []
    for run in RUNS:
        rr = [r for k, r in P[p].items() if k[0] == run and r in R]
        cells.append(f'{pb(rr):.2f}' if rr else '')
    print(f'| {p} | ' + ' | '.join(cells) + f' | {pb(R):.2f} ({len(R)}) |')
rnd = random.Random(26)
est = statistics.median(pb(R) for R in pts.values())
meds = []
for _ in range(2000):
    meds.append(statistics.median(pb([rnd.choice(R) for _ in R]) for R in pts.values()))
meds.sort()
print(f'\n- static ({KEY}), pooled over this session\'s runs: median Ben over {len(pts)} points {est:.2f} [{meds[49]:.2f}, {meds[1949]:.2f}]; points >= 0.7: {sum(1 for R in pts.values() if pb(R) >= 0.7)}')
