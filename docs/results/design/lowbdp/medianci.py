#!/usr/bin/env python3
"""The low-BDP median Ben's own spread: per run (and pooled over the three runs), resample each
point's rounds (a round's procedures together, within their run), recompute every point's Ben
from the resampled means and take the median over the points; 2000 resamples, 95 % percentile.
Also: how many points would have to move for the median to reach 0.7."""
import json, random, statistics, collections, os, sys
D = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
RUNS = ['paired-main2', 'lowat', 'lowatrtt']
KEY = sys.argv[1] if len(sys.argv) > 1 else 'goodput_mbps'
def ben(g, c):
    cmax = max(c); s = sum(c)
    return (g - cmax) / (s - cmax) if g >= cmax else (g - cmax) / cmax
def load(runs):
    P = collections.defaultdict(dict)
    for run in runs:
        for r in json.load(open(os.path.join(D, run, 'results.json'))):
            if r['bdp'] == 'low' and r['status'] == 'ok' and r.get(KEY) is not None:
                P[r['point']].setdefault((run, r['trial']), {})[r['procedure']] = r[KEY]
    return P
def pben(rounds, proc):
    m = lambda q: statistics.mean(x[q] for x in rounds if q in x)
    return ben(m(proc), [m('tcp-path1'), m('tcp-path2')])
rnd = random.Random(26)
for label, runs, proc in [(r, [r], 'mptcp-static') for r in RUNS] + [('lowat', ['lowat'], 'mptcp-static+lowat'), ('lowatrtt', ['lowatrtt'], 'mptcp-static+lowat'), ('lowatrtt', ['lowatrtt'], 'mptcp-static+lowatrtt'), ('pooled 3 runs', RUNS, 'mptcp-static')]:
    P = load(runs)
    if not any(proc in x for p in P.values() for x in p.values()): continue
    pts = {p: list(v.values()) for p, v in P.items()}
    pts = {p: [x for x in v if proc in x and 'tcp-path1' in x and 'tcp-path2' in x] for p, v in pts.items()}
    est = statistics.median(pben(v, proc) for v in pts.values())
    meds = []
    for _ in range(2000):
        meds.append(statistics.median(pben([rnd.choice(v) for _ in v], proc) for v in pts.values()))
    meds.sort()
    bens = sorted(pben(v, proc) for v in pts.values())
    need = sum(1 for b in bens if b < 0.7) - (len(bens) - (len(bens) + 1) // 2)
    print(f"- {label} {proc} ({KEY}): median Ben {est:.2f} [{meds[49]:.2f}, {meds[1949]:.2f}] over {len(pts)} points; "
          f"P(median >= 0.7) over resamples {sum(1 for m in meds if m >= 0.7)/len(meds):.2f}; points >= 0.7: {sum(1 for b in bens if b >= 0.7)} of {len(bens)}; sorted: {' '.join(f'{b:.2f}' for b in bens)}")
