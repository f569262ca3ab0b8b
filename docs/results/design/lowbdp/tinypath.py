#!/usr/bin/env python3
"""Every point of paired-main2 and lowat (63 each; static in both): TCP on the smaller path / TCP on
the best path (means), static / best, Ben, the best path's BDP (nominal capacity x RTT); grouped by
BDP class and by whether the second path is tiny (TCP small / best <= 0.2). Rounds of both runs
pooled (different builds, the same static policy)."""
import json, os, statistics, collections
D = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
P = collections.defaultdict(lambda: collections.defaultdict(list)); cls = {}; par = {}
for run in ['paired-main2', 'lowat']:
    for r in json.load(open(os.path.join(D, run, 'results.json'))):
        if r['status'] != 'ok': continue
        P[r['point']][r['procedure']].append(r['goodput_mbps']); cls[r['point']] = r['bdp']; par[r['point']] = r['params']
def ben(g, c):
    m = max(c); s = sum(c)
    return (g - m) / (s - m) if g >= m else (g - m) / m
G = collections.defaultdict(list)
for p, d in P.items():
    c = [statistics.mean(d['tcp-path1']), statistics.mean(d['tcp-path2'])]; b = max(c); i = c.index(b) + 1
    g = statistics.mean(d['mptcp-static'])
    G[(cls[p], min(c) / b <= 0.2)].append((p, min(c) / b, g / b, ben(g, c), par[p][f'bdp{i}_bytes'] / 1000))
for k in sorted(G):
    v = G[k]
    print(f"- {k[0]}-BDP, second path {'tiny (<= 0.2 of best)' if k[1] else 'not tiny'}: {len(v)} points; static / best median {statistics.median(x[2] for x in v):.2f}, "
          f"below 0.95 x best at {sum(1 for x in v if x[2] < 0.95)}; median Ben {statistics.median(x[3] for x in v):.2f}; best path's BDP median {statistics.median(x[4] for x in v):.0f} kB")
print()
print("| class | point | TCP small / best | static / best | Ben | best path's BDP kB |")
print("|---|---|---:|---:|---:|---:|")
for k in sorted(G):
    if not k[1]: continue
    for x in sorted(G[k], key=lambda x: x[2]):
        print(f"| {k[0]} | {x[0]} | {x[1]:.2f} | {x[2]:.2f} | {x[3]:.2f} | {x[4]:.0f} |")
