#!/usr/bin/env python3
"""lowat-p149/nstatdiff.py for a run of several points (each point's lab is new, so its namespace
counters restart at 0): the series of each namespace is cut where the counters' sum falls (a new
lab), and a trial's change is its last sample within window + 1 s minus the last sample before its
start in the same lab (0 if the lab is newer). Per point and procedure: the sums over trials, and
per trial with --trials.
usage: nstatpt.py OUT [--trials]"""
import collections, datetime, json, sys, glob, os
out = sys.argv[1]; per = '--trials' in sys.argv
S = collections.defaultdict(list)
for l in open(os.path.join(out, 'nstat.txt')):
    p = l.split()
    if len(p) < 2: continue
    c = {k: int(v) for k, v in (kv.split('=') for kv in p[2:])}
    S[p[1].rsplit('-', 1)[1]].append((datetime.datetime.fromisoformat(p[0].replace('Z', '+00:00')), c))
seg = {}
for ns, L in S.items():
    k, prev, out_ = 0, -1, []
    for tm, c in L:
        s = sum(c.values())
        if s < prev / 2: k += 1  # a new lab (gauges such as MPTcpExtMPCurrEstab fall by 1 within one)
        prev = s; out_.append((tm, k, c))
    seg[ns] = out_
want = ["server:MPTcpExtOFOQueue", "server:MPTcpExtRcvWndShared", "server:MPTcpExtRcvPruned", "server:TcpExtTCPOFODrop",
        "client:TcpRetransSegs", "client:MPTcpExtMPTCPRetrans", "client:MPTcpExtSubflowStale", "client:MPTcpExtSubflowRecover",
        "client:MPTcpExtDuplicateData", "server:MPTcpExtDuplicateData"]
trials = []
for f in glob.glob(os.path.join(out, 'runs', '*', 'trials.jsonl')):
    trials += [json.loads(l) for l in open(f)]
tot = collections.defaultdict(collections.Counter); n = collections.Counter()
for t in sorted(trials, key=lambda t: t['start']):
    if t.get('status') != 'ok': continue
    st = datetime.datetime.fromisoformat(t['start'][:26] + '+00:00'); end = (t.get('window_s') or 10) + 1
    key = (t['configuration'], t['cell']); n[key] += 1; row = {}
    for w in want:
        ns, name = w.split(':')
        L = seg.get(ns, [])
        during = [(k, c) for tm, k, c in L if 0 < (tm - st).total_seconds() <= end]
        if not during: continue
        k, last = during[-1]
        before = [c for tm, kk, c in L if tm <= st and kk == k]
        v = last.get(name, 0) - (before[-1].get(name, 0) if before else 0)
        tot[key][w] += v; row[w] = v
    if per:
        print(t['configuration'], t['cell'], t['trial'], round(t['goodput_mbps'], 2), ' '.join(f"{w.split(':')[1]}={v}" for w, v in row.items() if v))
print("| point | procedure (trials) | " + " | ".join(f"{w.split(':')[1].replace('MPTcpExt', '').replace('TcpExt', '')} ({w.split(':')[0]})" for w in want) + " |")
print("|---|---|" + "---:|" * len(want))
for key in sorted(n):
    print(f"| {key[0]} | {key[1]} ({n[key]}) | " + " | ".join(str(tot[key][w]) for w in want) + " |")
