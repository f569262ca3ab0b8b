#!/usr/bin/env python3
"""mptcp-1sf / tcp-path1 per round of design-p197 (the design's own runner, p197 only), both
windows: geometric mean of per-round ratios, Student t 95 % interval over rounds."""
import glob, json, math, statistics, sys
from collections import defaultdict
T975 = {14: 2.145, 15: 2.131, 9: 2.262, 19: 2.093}
d = sys.argv[1] if len(sys.argv) > 1 else 'design-p197'
r = defaultdict(dict)
loads = []
for f in glob.glob(d + '/runs/*/trials.jsonl'):
    for line in open(f):
        j = json.loads(line)
        if j.get('status') == 'ok':
            r[j['trial']][j['cell']] = j
            loads.append(j['loadavg_1m'])
for key, lab in (('goodput_mbps', 'to the last byte'), ('equal_goodput_mbps', '1-10 s')):
    logs, a, b = [], [], []
    for t in sorted(r):
        if 'mptcp-1sf' in r[t] and 'tcp-path1' in r[t]:
            m, c = r[t]['mptcp-1sf'][key], r[t]['tcp-path1'][key]
            a.append(m); b.append(c); logs.append(math.log(m / c))
    n = len(logs); mu, sd = statistics.mean(logs), statistics.stdev(logs)
    h = T975[n - 1] * sd / math.sqrt(n)
    print(f'{lab}: rounds {n}, tcp-path1 mean {statistics.mean(b):.2f}, mptcp-1sf mean {statistics.mean(a):.2f}, '
          f'mptcp-1sf / TCP {math.exp(mu):.3f} [{math.exp(mu - h):.3f}, {math.exp(mu + h):.3f}] (sd of log ratio {sd:.3f})')
print('per round mptcp-1sf / TCP (1-10 s):', ' '.join(f"{r[t]['mptcp-1sf']['equal_goodput_mbps'] / r[t]['tcp-path1']['equal_goodput_mbps']:.2f}" for t in sorted(r)))
print('retrans per trial, tcp-path1:', [r[t]['tcp-path1']['subflows'][0]['retrans'] for t in sorted(r)], 'mptcp-1sf:', [r[t]['mptcp-1sf']['subflows'][0]['retrans'] for t in sorted(r)])
loads.sort(); print(f'load (1-min) at trials: min {loads[0]:.2f} median {statistics.median(loads):.2f} max {loads[-1]:.2f} ({len(loads)} trials)')
