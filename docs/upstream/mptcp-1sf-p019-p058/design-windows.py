#!/usr/bin/env python3
"""Window lengths of the paired design's trials (no new measurement).

Usage: design-windows.py DESIGN_DIR   (e.g. docs/results/design/paired-main2)
       design-windows.py --points p174,p197 DESIGN_DIR...   (per-trial listing, below)
The bench's goodput is bytes from 1 s to the last byte over that time; the
trial records keep goodput and window_bytes, so window_s = window_bytes * 8 /
goodput. Per point: mptcp-1sf's mean window and the window of TCP on the same
path, and mptcp-1sf / TCP (ratio of the means), then the ratio against the
window difference over all points.
With --points: every trial of those points in every DESIGN_DIR (mptcp-1sf and TCP
on its path), its window, bench goodput and, where the run recorded it
(equal_goodput_mbps, seconds 1-10), the equal-window goodput; then per point
and run mptcp-1sf / TCP (ratio of the means) both ways.
"""
import glob, json, math, os, statistics, sys
from collections import defaultdict

def points_listing(pts, dirs):
    rec = defaultdict(list)  # (pt, run, cell) -> [(trial, window, goodput, equal)]
    onep = {}
    for d in dirs:
        run = os.path.basename(os.path.normpath(d))
        for f in sorted(glob.glob(os.path.join(d, 'runs', '*', 'trials.jsonl'))):
            for line in open(f):
                j = json.loads(line)
                if j['configuration'] not in pts or j.get('status') != 'ok' or not j.get('goodput_mbps'):
                    continue
                ws = j.get('window_s') or j['window_bytes'] * 8 / j['goodput_mbps'] / 1e6
                rec[(j['configuration'], run, j['cell'])].append((j['trial'], ws, j['goodput_mbps'], j.get('equal_goodput_mbps')))
                if j['cell'] == 'mptcp-1sf' and j.get('subflows'):
                    onep[j['configuration']] = 1 if j['subflows'][0].get('path') == 'default' else 2
    print('point | run | cell | trial: window s, bench Mbit/s, equal-window (1-10 s) Mbit/s')
    for pt in pts:
        tcpcell = f'tcp-path{onep.get(pt, 1)}'
        for d in dirs:
            run = os.path.basename(os.path.normpath(d))
            for cell in ('mptcp-1sf', tcpcell):
                for t, ws, g, e in sorted(rec[(pt, run, cell)]):
                    print(f'{pt} | {run} | {cell} | {t}: {ws:.1f}, {g:.2f}, ' + (f'{e:.2f}' if e else '-'))
            one, tcp = rec[(pt, run, 'mptcp-1sf')], rec[(pt, run, tcpcell)]
            if not one or not tcp:
                continue
            for k, i in (('bench', 2), ('equal', 3)):
                a, b = [x[i] for x in one], [x[i] for x in tcp]
                if None in a or None in b:
                    continue
                print(f'{pt} | {run} | mptcp-1sf / {tcpcell}, {k}: {statistics.mean(a) / statistics.mean(b):.3f} '
                      f'(windows: mptcp-1sf mean {statistics.mean(x[1] for x in one):.1f} s, TCP {statistics.mean(x[1] for x in tcp):.1f} s)')
        print()


if sys.argv[1] == '--points':
    points_listing(sys.argv[2].split(','), sys.argv[3:])
    sys.exit()
d = sys.argv[1]
w = defaultdict(list)
onepath = {}
for f in glob.glob(os.path.join(d, 'runs', '*', 'trials.jsonl')):
    for line in open(f):
        j = json.loads(line)
        if j.get('status') != 'ok' or not j.get('goodput_mbps'):
            continue
        ws = j['window_bytes'] * 8 / j['goodput_mbps'] / 1e6
        w[(j['configuration'], j['cell'])].append((ws, j['goodput_mbps']))
        if j['cell'] == 'mptcp-1sf' and j.get('subflows'):
            onepath[j['configuration']] = 1 if j['subflows'][0].get('path') == 'default' else 2
rows = []
for pt in sorted(onepath):
    one, tcp = w[(pt, 'mptcp-1sf')], w[(pt, f'tcp-path{onepath[pt]}')]
    if not one or not tcp:
        continue
    r = statistics.mean(g for _, g in one) / statistics.mean(g for _, g in tcp)
    dw = statistics.mean(x for x, _ in one) - statistics.mean(x for x, _ in tcp)
    rows.append((pt, onepath[pt], r, statistics.mean(x for x, _ in one), statistics.mean(x for x, _ in tcp), dw))
print('point | path | mptcp-1sf / TCP | mptcp-1sf window s | TCP window s | difference s')
for pt, p, r, a, b, dw in rows:
    print(f'{pt} | {p} | {r:.2f} | {a:.1f} | {b:.1f} | {dw:+.1f}')
def gm(xs):
    return math.exp(statistics.mean(math.log(x) for x in xs))
short = [x[2] for x in rows if x[5] <= 1.0]
longr = [x[2] for x in rows if x[5] > 1.0]
print(f'points: {len(rows)}; mptcp-1sf window more than 1 s longer than TCP\'s: {len(longr)} '
      f'(geometric mean of mptcp-1sf / TCP {gm(longr):.3f}); the others: {len(short)} ({gm(short):.3f})')
xs, ys = [x[5] for x in rows], [math.log(x[2]) for x in rows]
mx, my = statistics.mean(xs), statistics.mean(ys)
cov = sum((a - mx) * (b - my) for a, b in zip(xs, ys))
print(f'Pearson correlation of window difference and log(mptcp-1sf / TCP): '
      f'{cov / math.sqrt(sum((a - mx) ** 2 for a in xs) * sum((b - my) ** 2 for b in ys)):.2f}')
