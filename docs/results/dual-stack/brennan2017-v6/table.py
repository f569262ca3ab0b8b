#!/usr/bin/env python3
"""Per-configuration table of brennan2017-v6 (trials.jsonl): mean goodput per
procedure, the IPv6/IPv4 ratio of each pair, and the aggregation ratio
("sum") of each MPTCP procedure against its own family's single paths.
Noise of a pair of sum ratios (e.g. mptcp-nat6/(tcp6+tcp-nat6) against
mptcp-nat/(tcp+tcp-nat)): the largest trial-to-trial spread |t1 - t2| / mean
among the six cells the two ratios use, in that configuration; the IPv6
ratio is "within noise" of the IPv4 one when |r6/r4 - 1| <= that noise, and
the verdict is "undetermined" when one of the six cells has one trial."""
import json, statistics, sys, os
here = os.path.dirname(os.path.abspath(__file__))
recs = [json.loads(l) for l in open(os.path.join(here, 'trials.jsonl'))]
cfgs = []
g = {}
for r in recs:
    if r['status'] != 'ok':
        continue
    c = r['configuration']
    if c not in cfgs:
        cfgs.append(c)
    g.setdefault((c, r['cell']), []).append(r['goodput_mbps'])
spread = [abs(v[0] - v[1]) / statistics.mean(v) for v in g.values() if len(v) == 2]
noise = statistics.median(spread) if spread else float('nan')
def m(c, p):
    v = g.get((c, p))
    return (statistics.mean(v), len(v)) if v else (float('nan'), 0)
procs = ['tcp', 'tcp6', 'tcp-nat', 'tcp-nat6', 'mptcp-nat', 'mptcp-nat6', 'tcp-tunnel', 'tcp-tunnel6', 'mptcp-tunnel', 'mptcp-tunnel6']
print('| configuration | ' + ' | '.join(procs) + ' |')
print('|---|' + '---|' * len(procs))
for c in cfgs:
    print(f'| {c} | ' + ' | '.join(f'{m(c,p)[0]:.2f} (n={m(c,p)[1]})' for p in procs) + ' |')
print()
print('| configuration | sum mptcp-nat | sum mptcp-nat6 | nat6/nat | within noise | sum mptcp-tunnel | sum mptcp-tunnel6 | tunnel6/tunnel | within noise | mptcp-nat6/mptcp-nat | mptcp-tunnel6/mptcp-tunnel | tcp6/tcp | tcp-nat6/tcp-nat | tcp-tunnel6/tcp-tunnel |')
print('|---|' + '---|' * 13)
for c in cfgs:
    def s(mp, base, single):
        return m(c, mp)[0] / (m(c, base)[0] + m(c, single)[0])
    sn4, sn6 = s('mptcp-nat', 'tcp', 'tcp-nat'), s('mptcp-nat6', 'tcp6', 'tcp-nat6')
    st4, st6 = s('mptcp-tunnel', 'tcp', 'tcp-tunnel'), s('mptcp-tunnel6', 'tcp6', 'tcp-tunnel6')
    def r(a, b):
        return m(c, a)[0] / m(c, b)[0]
    def w(x, cells):
        sp = [abs(g[(c, p)][0] - g[(c, p)][1]) / statistics.mean(g[(c, p)]) if len(g.get((c, p), [])) >= 2 else None for p in cells]
        if None in sp:
            return f'undetermined (1 trial)'
        return f"{'yes' if abs(x - 1) <= max(sp) else 'no'} (noise {max(sp):.3f})"
    nat = ['tcp', 'tcp6', 'tcp-nat', 'tcp-nat6', 'mptcp-nat', 'mptcp-nat6']
    tun = ['tcp', 'tcp6', 'tcp-tunnel', 'tcp-tunnel6', 'mptcp-tunnel', 'mptcp-tunnel6']
    print(f'| {c} | {sn4:.3f} | {sn6:.3f} | {sn6/sn4:.3f} | {w(sn6/sn4, nat)} | {st4:.3f} | {st6:.3f} | {st6/st4:.3f} | {w(st6/st4, tun)} | '
          f'{r("mptcp-nat6","mptcp-nat"):.3f} | {r("mptcp-tunnel6","mptcp-tunnel"):.3f} | {r("tcp6","tcp"):.3f} | {r("tcp-nat6","tcp-nat"):.3f} | {r("tcp-tunnel6","tcp-tunnel"):.3f} |')
print()
print(f'cells with two trials: {len(spread)}; median trial-to-trial spread {noise:.3f}')
loads = [r['loadavg_1m'] for r in recs]
print(f'load (1-min average over {len(loads)} trials): min {min(loads):.1f}, median {statistics.median(loads):.1f}, max {max(loads):.1f}')
