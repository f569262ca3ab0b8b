#!/usr/bin/env python3
"""Per point and procedure of OUT (diag.py's per-trial rows aggregated): mean goodput to the last
byte and over the equal window, mean window (s), median longest delivery gap; for MPTCP the
subflow on the path TCP does best on (fast) and the other (slow): mean MB, median over trials of
the median cwnd, of the share of samples with window but no data, of in flight >= cwnd - 2; the
MPTCP socket's share of samples with its send buffer full and its median send buffer (kB); and
the same for TCP and mptcp-1sf over the fast path.
usage: summary.py OUT"""
import subprocess, sys, os, collections, statistics, json, glob
out = sys.argv[1]
rows = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'diag.py'), out], capture_output=True, text=True).stdout.splitlines()[2:]
trials = []
for f in sorted(glob.glob(os.path.join(out, 'runs', '*', 'trials.jsonl'))):
    trials += [json.loads(l) for l in open(f)]
T = collections.defaultdict(list)
for t in trials:
    if t['status'] == 'ok': T[(t['configuration'], t['cell'])].append(t)
R = collections.defaultdict(list)
for l in rows:
    c = [x.strip() for x in l.strip('|').split('|')]
    if len(c) < 16 or c[9] == '': continue
    R[(c[0], c[1], c[5])].append(c)
med = lambda v: statistics.median(v) if v else float('nan')
mean = lambda v: statistics.mean(v) if v else float('nan')
print("| point | procedure | n | goodput | equal-window goodput | window s | longest gap s (median) | subflow | MB | cwnd | window, no data | in flight >= cwnd | msk sndbuf full | msk sndbuf kB |")
print("|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
for point in sorted(set(k[0] for k in T)):
    t1 = mean([t['goodput_mbps'] for t in T[(point, 'tcp-path1')]])
    t2 = mean([t['goodput_mbps'] for t in T[(point, 'tcp-path2')]])
    fast = 'default' if t1 >= t2 else 'nat:detour1'
    for cell in sorted(set(k[1] for k in T if k[0] == point)):
        ts = T[(point, cell)]
        g = mean([t['goodput_mbps'] for t in ts]); e = mean([t.get('equal_goodput_mbps') or float('nan') for t in ts])
        w = mean([t.get('window_s') or float('nan') for t in ts]); gap = med([t['max_gap_s'] for t in ts])
        paths = sorted(set(k[2] for k in R if k[0] == point and k[1] == cell), key=lambda p: p != fast)
        for i, p in enumerate(paths):
            rs = R[(point, cell, p)]
            f = lambda j: med([float(r[j]) for r in rs if r[j] not in ('', 'nan')])
            head = f"| {point} | {cell} | {len(ts)} | {g:.2f} | {e:.2f} | {w:.1f} | {gap:.2f}" if i == 0 else "| | | | | | |"
            role = 'fast' if p == fast else 'slow'
            msk = f"{f(18):.2f} | {f(19):.0f}" if cell.startswith('mptcp') and i == 0 else " | "
            print(f"{head} | {p} ({role}) | {mean([float(r[6]) for r in rs]):.1f} | {f(9):.0f} | {f(11):.2f} | {f(12):.2f} | {msk} |")
