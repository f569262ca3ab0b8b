#!/usr/bin/env python3
"""compare.py DIR: guard with the starvation condition (mptcp-guard, guard.starve 0.5) beside the
rule before (mptcp-guard+starveoff) and static, per point and per group (groups.json): means of
the ok trials, ratios of means, geometric means over points with a Student t 95 % interval of the
log ratios (as the runner's report), and per procedure the trials in which the detour subflow is
missing from the trial record (shed: the bench records a shed detour's subflow only if it was
still open at the end) and the default path's mean bytes (a shed default path carries little)."""
import csv, json, sys, math, glob, statistics as st, collections
d = sys.argv[1]
groups = json.load(open(d + '/groups.json'))
OLD, NEW, STA = 'mptcp-guard+starveoff', 'mptcp-guard', 'mptcp-static'
g = collections.defaultdict(lambda: collections.defaultdict(list))
for r in csv.DictReader(open(d + '/results.csv')):
    if r['status'] == 'ok':
        g[r['point']][r['procedure']].append(float(r['goodput_mbps']))
shed = collections.defaultdict(lambda: collections.defaultdict(int))
defb = collections.defaultdict(lambda: collections.defaultdict(list))
for f in glob.glob(d + '/runs/*/trials.jsonl'):
    for line in open(f):
        t = json.loads(line)
        if t.get('status') != 'ok' or t['cell'] not in (OLD, NEW, STA):
            continue
        paths = {s['path']: s for s in t.get('subflows') or []}
        if not any(p.startswith('nat:') for p in paths):
            shed[t['configuration']][t['cell']] += 1
        if 'default' in paths:
            defb[t['configuration']][t['cell']].append(paths['default']['bytes'] / 1e6)
T = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145}
def gm(xs):
    ls = [math.log(x) for x in xs if x > 0]
    if not ls: return '-'
    m = st.mean(ls)
    if len(ls) < 2: return f'{math.exp(m):.3f} (n=1)'
    h = T[len(ls) - 1] * st.stdev(ls) / math.sqrt(len(ls))
    return f'{math.exp(m):.3f} [{math.exp(m - h):.3f}, {math.exp(m + h):.3f}] (n={len(ls)})'
print('| group | point | tcp-path1 | tcp-path2 | mptcp-1sf | static | guard-old | guard-new | new / static | new / old | old / static | new / best | detour missing (static/old/new) | default MB (static/old/new) | trials |')
print('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|')
agg = collections.defaultdict(lambda: collections.defaultdict(list))
for name, pts in groups.items():
    for p in pts:
        if p not in g: continue
        m = {k: st.mean(v) for k, v in g[p].items()}
        n = {k: len(v) for k, v in g[p].items()}
        if not all(k in m for k in ('tcp-path1', 'tcp-path2', 'mptcp-1sf', STA, OLD, NEW)): continue
        best = max(m['tcp-path1'], m['tcp-path2'])
        r = dict(ns=m[NEW] / m[STA], no=m[NEW] / m[OLD], os=m[OLD] / m[STA], nb=m[NEW] / best, sb=m[STA] / best, ob=m[OLD] / best,
                 n1=m[NEW] / m['mptcp-1sf'], s1=m[STA] / m['mptcp-1sf'])
        for k, v in r.items():
            agg[name][k].append(v); agg['all'][k].append(v)
        miss = '/'.join(str(shed[p][c]) for c in (STA, OLD, NEW))
        db = '/'.join(f"{st.mean(defb[p][c]):.1f}" if defb[p][c] else '-' for c in (STA, OLD, NEW))
        print(f"| {name} | {p} | {m['tcp-path1']:.2f} | {m['tcp-path2']:.2f} | {m['mptcp-1sf']:.2f} | {m[STA]:.2f} | {m[OLD]:.2f} | {m[NEW]:.2f} | {r['ns']:.2f} | {r['no']:.2f} | {r['os']:.2f} | {r['nb']:.2f} | {miss} | {db} | {min(n.values())}-{max(n.values())} |")
print()
print('| group | new / static | new / old | old / static | static / best | old / best | new / best | new / mptcp-1sf | static / mptcp-1sf |')
print('|---|---|---|---|---|---|---|---|---|')
for name in list(groups) + ['all']:
    a = agg.get(name)
    if not a: continue
    print(f"| {name} | {gm(a['ns'])} | {gm(a['no'])} | {gm(a['os'])} | {gm(a['sb'])} | {gm(a['ob'])} | {gm(a['nb'])} | {gm(a['n1'])} | {gm(a['s1'])} |")

# Per point guard-new / guard-old with the runner's interval: a percentile bootstrap over 2000
# resamples of the rounds (a round's procedures resampled together), ratio of the means.
import random
rnd = random.Random(1)
rounds = collections.defaultdict(dict)
for r in csv.DictReader(open(d + '/results.csv')):
    if r['status'] == 'ok':
        rounds[(r['point'], int(r['trial']))][r['procedure']] = float(r['goodput_mbps'])
print()
print('guard-new / guard-old per point, bootstrap over rounds (below/above = interval wholly below/above 1):')
below, above = [], []
for name, pts in groups.items():
    for p in pts:
        rs = [v for (pt, k), v in sorted(rounds.items()) if pt == p and NEW in v and OLD in v]
        if len(rs) < 2: continue
        def ratio(sample):
            return st.mean(x[NEW] for x in sample) / st.mean(x[OLD] for x in sample)
        bs = sorted(ratio([rnd.choice(rs) for _ in rs]) for _ in range(2000))
        lo, hi = bs[49], bs[1950]
        tag = ' below' if hi < 1 else ' above' if lo > 1 else ''
        (below if hi < 1 else above if lo > 1 else []).append(p)
        print(f'  {p}: {ratio(rs):.2f} [{lo:.2f}, {hi:.2f}]{tag}')
print(f'below at {len(below)}: {below}; above at {len(above)}: {above}')
