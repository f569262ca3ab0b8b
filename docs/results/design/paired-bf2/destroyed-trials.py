#!/usr/bin/env python3
"""Backup-first trials that ended without their detour subflow, from a paired
design's per-trial records: python3 destroyed-trials.py DESIGN_DIR
(e.g. docs/results/design/paired-bf). Prints a Markdown table and counts."""
import collections, glob, json, statistics as st, sys

d = sys.argv[1] if len(sys.argv) > 1 else "."
r = [json.loads(l) for f in sorted(glob.glob(d + "/runs/paired*/trials.jsonl")) for l in open(f)]
by = collections.defaultdict(list)
for x in r:
    if x["status"] == "ok":
        by[(x["configuration"], x["cell"])].append(x)

def mean(p, c):
    v = [x["goodput_mbps"] for x in by.get((p, c), [])]
    return st.mean(v) if v else float("nan")

def par(x, k):
    for s in x["params"]:
        if s.startswith(k + "="):
            return s.split("=")[1]

def rtt(x, c):
    return 2 * int(par(x, c + ".delay")[:-2]) // 1000

bf = [x for (p, c), xs in by.items() if c == "mptcp-backup-first" for x in xs]
D = sorted((x for x in bf if len(x["subflows"]) < 2), key=lambda x: (x["configuration"], x["trial"]))
K = [x for x in bf if len(x["subflows"]) >= 2]
print("| point/trial | backup-first | static (mean) | mptcp-1sf (mean) | detour helps static | longest gap, ends at (s) | path 1 RTT ms, loss | detour RTT ms, loss |")
print("|---|---:|---:|---:|---|---|---|---|")
for x in D:
    p = x["configuration"]
    s, o = mean(p, "mptcp-static"), mean(p, "mptcp-1sf")
    print(f"| {p}/{x['trial']} | {x['goodput_mbps']:.2f} | {s:.2f} | {o:.2f} | {'yes' if s > o else 'no'} | {x['max_gap_s']:.1f}, {x['max_gap_end_s']:.1f} | {rtt(x, 'C0')}, {par(x, 'C0.loss')} | {rtt(x, 'C1')}, {par(x, 'C1.loss')} |")
W = [x for x in D if mean(x["configuration"], "mptcp-static") > mean(x["configuration"], "mptcp-1sf")]
g = lambda xs: [x["max_gap_s"] for x in xs]
print()
print(f"ended without the detour: {len(D)} of {len(bf)} trials, {len({x['configuration'] for x in D})} points")
print(f"  at points where static > mptcp-1sf (the detour helps): {len(W)} trials, {len({x['configuration'] for x in W})} points")
print(f"  below the point's mptcp-1sf mean: {sum(x['goodput_mbps'] < mean(x['configuration'], 'mptcp-1sf') for x in D)}")
print(f"  detour RTT above path 1's: {sum(rtt(x, 'C1') > rtt(x, 'C0') for x in D)}; median detour RTT {st.median(rtt(x, 'C1') for x in D)} ms (trials that kept it: {st.median(rtt(x, 'C1') for x in K)} ms)")
print(f"longest gap > 3 s: {sum(v > 3 for v in g(D))} of these, {sum(v > 3 for v in g(K))} of the {len(K)} that kept the detour")
print(f"longest gap > 1 s: {sum(v > 1 for v in g(D))} of {len(D)}; {sum(v > 1 for v in g(K))} of {len(K)}; other procedures {sum(x['max_gap_s'] > 1 for x in r if x['status'] == 'ok' and x['cell'] != 'mptcp-backup-first')} of {sum(1 for x in r if x['status'] == 'ok' and x['cell'] != 'mptcp-backup-first')}")
print("gap start (s from transfer start), gaps > 1 s:", sorted(round(x["max_gap_end_s"] - x["max_gap_s"], 1) for x in D if x["max_gap_s"] > 1))
print()
print("| procedure | ok trials | ended with fewer subflows than opened | longest gap > 3 s | > 1 s |")
print("|---|---:|---:|---:|---:|")
cells = sorted({x["cell"] for x in r})
for c in cells:
    xs = [x for x in r if x["status"] == "ok" and x["cell"] == c]
    two = c.startswith("mptcp-") and c != "mptcp-1sf"
    fewer = sum(len(x["subflows"]) < 2 for x in xs) if two else "-"
    print(f"| {c} | {len(xs)} | {fewer} | {sum(x['max_gap_s'] > 3 for x in xs)} | {sum(x['max_gap_s'] > 1 for x in xs)} |")
