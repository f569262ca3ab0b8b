#!/usr/bin/env python3
"""compare.py DIR [GROUPS.json]: per point, the means of every procedure (ok trials) and the ratios
guard/static, guard/mptcp-1sf, static/mptcp-1sf and X/best single path; over points,
geometric means with a Student t 95 % interval of the log ratios (as the runner's report)."""
import csv, json, sys, math, statistics as st, collections
d = sys.argv[1]
# compare.py DIR GROUPS.json: another run's point groups ({name: [points]}).
groups = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else {'diagnosed harmed': ['p197', 'p105'], 'harmed in paired-main, not diagnosed': ['p025'],
          'diagnosed helped': ['p087', 'p010'], 'seen while building (v1 failed there)': ['p095'],
          'held out (first unselected of seed 1, not harmed in paired-main)': ['p047', 'p059', 'p114', 'p119', 'p109']}
g = collections.defaultdict(lambda: collections.defaultdict(list))
for r in csv.DictReader(open(d + '/results.csv')):
    if r['status'] == 'ok':
        g[r['point']][r['procedure']].append(float(r['goodput_mbps']))
T = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179}
def gm(xs):
    ls = [math.log(x) for x in xs if x > 0]
    if not ls: return '-'
    m = st.mean(ls)
    if len(ls) < 2: return f'{math.exp(m):.3f} (n=1)'
    h = T[len(ls) - 1] * st.stdev(ls) / math.sqrt(len(ls))
    return f'{math.exp(m):.3f} [{math.exp(m - h):.3f}, {math.exp(m + h):.3f}] (n={len(ls)})'
print('| group | point | tcp-path1 | tcp-path2 | mptcp-1sf | static | guard | static / best | guard / best | guard / static | guard / 1sf | static / 1sf | trials |')
print('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|')
agg = collections.defaultdict(lambda: collections.defaultdict(list))
for name, pts in groups.items():
    for p in pts:
        if p not in g: continue
        m = {k: st.mean(v) for k, v in g[p].items()}
        n = {k: len(v) for k, v in g[p].items()}
        if not all(k in m for k in ('tcp-path1', 'tcp-path2', 'mptcp-1sf', 'mptcp-static', 'mptcp-guard')): continue
        best = max(m['tcp-path1'], m['tcp-path2'])
        r = dict(sb=m['mptcp-static'] / best, gb=m['mptcp-guard'] / best, gs=m['mptcp-guard'] / m['mptcp-static'],
                 g1=m['mptcp-guard'] / m['mptcp-1sf'], s1=m['mptcp-static'] / m['mptcp-1sf'])
        for k, v in r.items():
            agg[name][k].append(v); agg['all'][k].append(v)
        print(f"| {name} | {p} | {m['tcp-path1']:.2f} | {m['tcp-path2']:.2f} | {m['mptcp-1sf']:.2f} | {m['mptcp-static']:.2f} | {m['mptcp-guard']:.2f} | {r['sb']:.2f} | {r['gb']:.2f} | {r['gs']:.2f} | {r['g1']:.2f} | {r['s1']:.2f} | {min(n.values())}-{max(n.values())} |")
print()
print('| group | static / best | guard / best | guard / static | guard / mptcp-1sf | static / mptcp-1sf |')
print('|---|---|---|---|---|---|')
for name in list(groups) + ['all']:
    a = agg.get(name)
    if not a: continue
    print(f"| {name} | {gm(a['sb'])} | {gm(a['gb'])} | {gm(a['gs'])} | {gm(a['g1'])} | {gm(a['s1'])} |")
