#!/usr/bin/env python3
"""Low-BDP points of paired-main2, lowat, lowatrtt from their committed results.json:
per point and run the mean goodput of every procedure (to the last byte; equal window in
brackets where recorded), Ben from the means with a 95 % bootstrap interval over rounds
(2000 resamples, a round's procedures drawn together), the subflows' byte shares."""
import json, random, statistics, collections, sys, os
D = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
RUNS = ['paired-main2', 'lowat', 'lowatrtt']
KEY = sys.argv[1] if len(sys.argv) > 1 else 'goodput_mbps'

def ben(g, c):
    cmax = max(c); s = sum(c)
    if g >= cmax:
        return (g - cmax) / (s - cmax) if s > cmax else float('nan')
    return (g - cmax) / cmax

def boot(rounds, proc, n=2000, seed=1):
    rnd = random.Random(seed); out = []
    ks = list(rounds)
    for _ in range(n):
        pick = [rounds[rnd.choice(ks)] for _ in ks]
        try:
            g = statistics.mean(p[proc] for p in pick)
            c = [statistics.mean(p['tcp-path1'] for p in pick), statistics.mean(p['tcp-path2'] for p in pick)]
            out.append(ben(g, c))
        except KeyError:
            continue
    out.sort()
    return out[int(0.025 * len(out))], out[int(0.975 * len(out)) - 1]

allrows = {}
for run in RUNS:
    rows = [r for r in json.load(open(os.path.join(D, run, 'results.json'))) if r['bdp'] == 'low' and r['status'] == 'ok']
    allrows[run] = rows
points = sorted(set(r['point'] for run in RUNS for r in allrows[run]))
par = {}
for run in RUNS:
    for r in allrows[run]:
        par[r['point']] = r['params']
print('## Low-BDP points (parameters)\n')
print('| point | C1 Mbit/s | RTT1 ms | loss1 % | buf1 BDP (pkts) | BDP1 kB | C2 Mbit/s | RTT2 ms | loss2 % | buf2 BDP (pkts) | BDP2 kB | Mathis1 Mbit/s | Mathis2 Mbit/s |')
print('|---|---|---|---|---|---|---|---|---|---|---|---|---|')
def mathis(rtt, loss):
    if loss <= 0: return float('inf')
    return 1448 * 8 / (rtt / 1000) * 1.22 / (loss / 100) ** 0.5 / 1e6
for p in points:
    q = par[p]
    print(f"| {p} | {q['capacity1_mbps']:.2f} | {q['rtt1_ms']:.1f} | {q['loss1_pct']:.3f} | {q['buffer1_bdp']:.2f} ({q['queue1_pkts']}) | {q['bdp1_bytes']/1000:.0f} | "
          f"{q['capacity2_mbps']:.2f} | {q['rtt2_ms']:.1f} | {q['loss2_pct']:.3f} | {q['buffer2_bdp']:.2f} ({q['queue2_pkts']}) | {q['bdp2_bytes']/1000:.0f} | "
          f"{mathis(q['rtt1_ms'], q['loss1_pct']):.1f} | {mathis(q['rtt2_ms'], q['loss2_pct']):.1f} |")

print(f'\n## Per point and run ({KEY}; Mbit/s means over ok rounds; Ben [95 % bootstrap over rounds])\n')
print('| point | run | n | TCP1 | TCP2 | sum-best | 1sf | static | static Ben | static/best | default-path share static | limit | limit Ben | limit share | rtt-limit | rtt-limit Ben |')
print('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|')
summary = collections.defaultdict(list)
for p in points:
    for run in RUNS:
        rows = [r for r in allrows[run] if r['point'] == p]
        if not rows: continue
        rounds = collections.defaultdict(dict); shares = collections.defaultdict(list)
        for r in rows:
            v = r.get(KEY)
            if v is None: continue
            rounds[r['trial']][r['procedure']] = v
            sf = r.get('subflows') or []
            tot = sum(s['bytes'] for s in sf)
            if len(sf) > 1 and tot:
                shares[r['procedure']].append(sum(s['bytes'] for s in sf if s['path'] == 'default') / tot)
        def m(proc):
            v = [rd[proc] for rd in rounds.values() if proc in rd]
            return statistics.mean(v) if v else None
        t1, t2 = m('tcp-path1'), m('tcp-path2')
        if t1 is None or t2 is None: continue
        c = [t1, t2]; best = max(c)
        cells = [p, run, str(len(rounds)), f'{t1:.2f}', f'{t2:.2f}', f'{sum(c)-best:.2f}']
        o = m('mptcp-1sf'); cells.append(f'{o:.2f}' if o is not None else '')
        for proc in ['mptcp-static', 'mptcp-static+lowat', 'mptcp-static+lowatrtt']:
            g = m(proc)
            if g is None:
                cells += ['', ''] + ([''] if proc != 'mptcp-static+lowatrtt' else [])
                if proc == 'mptcp-static': cells += ['']
                continue
            b = ben(g, c); lo, hi = boot(rounds, proc, seed=int(p[1:]))
            summary[(run, proc)].append(b)
            cells += [f'{g:.2f}', f'{b:.2f} [{lo:.2f}, {hi:.2f}]']
            if proc == 'mptcp-static': cells.append(f'{g/best:.2f}')
            if proc != 'mptcp-static+lowatrtt':
                sh = shares.get(proc)
                cells.append(f'{statistics.mean(sh):.2f}' if sh else '')
        print('| ' + ' | '.join(cells) + ' |')
print('\n## Static pooled over the runs (every round of every run, rounds resampled within their run)\n')
print('Different builds (6c580aa, b4e790c/8b20a64/e7b3859, 2a4aed7), static the same policy in each.\n')
print('| point | rounds | TCP small / TCP best | mptcp-1sf / TCP on its path (the modelled best) | static / best | static Ben [95 %] | sum - best, Mbit/s |')
print('|---|---|---|---|---|---|---|')
pooled = []
for p in points:
    R = {}
    for run in RUNS:
        for r in allrows[run]:
            if r['point'] == p and r.get(KEY) is not None:
                R.setdefault((run, r['trial']), {})[r['procedure']] = r[KEY]
    R = {k: v for k, v in R.items() if 'tcp-path1' in v and 'tcp-path2' in v}
    if not R: continue
    def mm(proc):
        v = [x[proc] for x in R.values() if proc in x]
        return statistics.mean(v) if v else None
    c = [mm('tcp-path1'), mm('tcp-path2')]; best = max(c); bi = c.index(best)
    g = mm('mptcp-static'); b = ben(g, c); pooled.append(b)
    q = par[p]; mp = max((1, 2), key=lambda k: min(q[f'capacity{k}_mbps'], mathis(q[f'rtt{k}_ms'], q[f'loss{k}_pct'])))
    one = [(x['mptcp-1sf'], x['tcp-path%d' % mp]) for x in R.values() if 'mptcp-1sf' in x]
    lo, hi = boot(R, 'mptcp-static', seed=int(p[1:]))
    print(f"| {p} | {len(R)} | {min(c)/best:.2f} | {statistics.mean(a for a, _ in one)/statistics.mean(t for _, t in one):.2f} | {g/best:.2f} | {b:.2f} [{lo:.2f}, {hi:.2f}] | {sum(c)-best:.2f} |")
print(f'\nPooled static: median Ben {statistics.median(pooled):.2f} over {len(pooled)} points.')
print('\n## Median Ben over the low-BDP points\n')
for (run, proc), v in sorted(summary.items()):
    print(f'- {run} {proc}: median {statistics.median(v):.2f} (n={len(v)})')
