#!/usr/bin/env python3
"""Head-of-line evidence per MPTCP trial from the 200 ms samples: at each client sample time, the
fast subflow (the path TCP does best on) is 'starved' when it has window but no data (in flight <
cwnd - 2, nothing unsent); the MPTCP socket's send buffer is 'full' when sk_wmem_queued >= 0.9
sk_sndbuf; the data-level backlog is write_seq - snd_una of the client's MPTCP socket (bytes the
application wrote that the receiver has not acknowledged at the data level) and the server's
MPTCP socket's rmem (r, bytes held at the receiver: in order but unread, or out of order).
Prints per trial: samples, starved share, P(send buffer full | starved), P(full | not starved),
median backlog kB and median of backlog / (fast subflow's in flight bytes), server r median/max kB,
the median of the client MPTCP socket's sk_wmem_queued / sk_sndbuf over the starved samples, the
slow subflow's queue (unsent + in flight bytes) over its delivery rate (s: how long what it holds
takes to arrive) and the MPTCP send buffer divided by that: the rate at which the fast subflow can
run ahead of the slow one's oldest data (Mbit/s, a ceiling on what the fast path adds).
usage: hol.py OUT"""
import collections, datetime, json, re, statistics, sys, glob, os
out = sys.argv[1]
def ts(s): return datetime.datetime.fromisoformat(s.replace('Z', '+00:00'))
def num(rx, s, d=None):
    m = re.search(rx, s); return float(m.group(1)) if m else d
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sslog
SF, MC, MS = (collections.defaultdict(dict, {k: dict(v) for k, v in d.items()}) for d in sslog.samples(out))
trials = []
for f in glob.glob(os.path.join(out, 'runs', '*', 'trials.jsonl')):
    trials += [json.loads(l) for l in open(f) if json.loads(l)['status'] == 'ok']
G = collections.defaultdict(list)
for t in trials: G[(t['configuration'], t['cell'])].append(t['goodput_mbps'])
med = lambda v: statistics.median(v) if v else float('nan')
print('| point | procedure | round | goodput | samples | fast starved | P(sndbuf full given starved) | P(full given not starved) | backlog kB (median) | backlog / fast in flight | server held kB med/max | sndbuf use when starved | slow subflow queue, s of its delivery rate | msk sndbuf kB / that, Mbit/s |')
print('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|')
for t in sorted(trials, key=lambda t: (t['configuration'], t['cell'], t['trial'])):
    if not t['cell'].startswith('mptcp'): continue
    p = t['configuration']
    fastpath = 'default' if statistics.mean(G[(p, 'tcp-path1')]) >= statistics.mean(G[(p, 'tcp-path2')]) else 'nat:detour1'
    fast = [s for s in t['subflows'] if s['path'] == fastpath]
    if not fast: continue
    first = t['subflows'][0]['local']
    st = ts(t['start'][:26] + 'Z'); w = (t.get('window_s') or 10) + 1
    times = [x for x in SF[fast[0]['local']] if 0 <= (ts(x) - st).total_seconds() <= w]
    n = st_ = fs = fn = 0; bl = []; ratio = []; held = []; wtb = []; lg = []; tbs = []
    slow = [s for s in t['subflows'] if s['path'] != fastpath]
    for x in times:
        s = SF[fast[0]['local']][x]
        cw, un, ns = num(r'cwnd:(\d+)', s, 0), num(r'unacked:(\d+)', s, 0), num(r'notsent:(\d+)', s, 0)
        starved = un < cw - 2 and ns == 0
        m = MC[first].get(x)
        full = None
        if m:
            full = num(r'w(\d+),', m, 0) >= 0.9 * num(r'tb(\d+),', m, 1)
            ws, su = re.search(r'write_seq:([0-9a-f]+)', m), re.search(r'snd_una:([0-9a-f]+)', m)
            if ws and su:
                b = (int(ws.group(1), 16) - int(su.group(1), 16)) % (1 << 64)
                bl.append(b / 1000)
                if un: ratio.append(b / (un * 1448))
        if m and starved: wtb.append(num(r'w(\d+),', m, 0) / num(r'tb(\d+),', m, 1))
        if m: tbs.append(num(r'tb(\d+),', m, 0))
        if slow:
            q = SF[slow[0]['local']].get(x)
            if q:
                dr = num(r'delivery_rate (\d+)bps', q, 0)
                qb = num(r'notsent:(\d+)', q, 0) + num(r'unacked:(\d+)', q, 0) * 1448
                if dr: lg.append(qb * 8 / dr)
        ms = MS[first].get(x)
        if ms: held.append(num(r'\(r(\d+),', ms, 0) / 1000)
        n += 1
        if starved:
            st_ += 1; fs += 1 if full else 0
        else:
            fn += 1 if full else 0
    if not n: continue
    print(f"| {p} | {t['cell']} | {t['trial']} | {t['goodput_mbps']:.2f} | {n} | {st_/n:.2f} | {(fs/st_ if st_ else float('nan')):.2f} | {(fn/(n-st_) if n > st_ else float('nan')):.2f} | {med(bl):.0f} | {med(ratio):.1f} | {med(held):.0f}/{(max(held) if held else float('nan')):.0f} | {med(wtb):.2f} | {med(lg):.2f} | {(med(tbs) * 8 / 1e6 / med(lg) if lg and tbs else float('nan')):.1f} |")
