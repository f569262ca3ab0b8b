#!/usr/bin/env python3
"""Per guard trial (agent.log at debug level): at each shed, the top and
the shed subflow's probe-level state, and over the 2 s before the shed the
share of probes at which the top was starved (nothing queued, window not
full) or idle (nothing in flight)."""
import re, sys, glob, os
kv = re.compile(r'(\w+)=("[^"]*"|\S+)')
def parse(line):
    return {k: v.strip('"') for k, v in kv.findall(line)}
def secs(t):  # time=2026-11-27T14:45:52.825Z
    h, m, s = t.split('T')[1].rstrip('Z').split(':')
    return int(h)*3600 + int(m)*60 + float(s)
for f in sys.argv[1:]:
    probes = []
    for line in open(f):
        if 'msg="guard probe"' in line:
            d = parse(line); d['t'] = secs(d['time']); probes.append(d)
        elif 'subflow shed' in line:
            d = parse(line); t = secs(d['time'])
            top = d['top']
            win = [p for p in probes if p['path'] == top and t - 2.0 <= p['t'] <= t]
            starved = sum(1 for p in win if int(p['notsent']) == 0 and int(p['unacked']) < int(p['cwnd']))
            idle = sum(1 for p in win if int(p['unacked']) == 0)
            slow = [p for p in probes if p['path'] == d['path'] and p['t'] <= t]
            sl = slow[-1] if slow else {}
            print(f"{f}: shed {d['path']} up={d['up']} top={top} top_send_limited={d['top_send_limited']} top_loss={d['top_loss']} "
                  f"top_starved_2s={starved}/{len(win)} top_idle_2s={idle}/{len(win)} slow_loss={sl.get('loss')} slow_send_limited={d['send_limited']} "
                  f"rate_ratio={float(d['rate_kBps'])/max(float(d['top_rate_kBps']),1e-9):.2f} why={d['why'][:40]}")
    if not any('subflow shed' in l for l in open(f)) and 'guard' in f:
        # no shed: the top's starvation over the whole trial
        tops = {}
        for p in probes:
            tops.setdefault(p['path'], []).append(p)
        s = ' '.join(f"{k}: starved {sum(1 for p in v if int(p['notsent'])==0 and int(p['unacked'])<int(p['cwnd']))}/{len(v)} send_limited_last={v[-1]['send_limited']}" for k, v in tops.items())
        print(f"{f}: no shed; {s}")
