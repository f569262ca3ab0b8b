#!/usr/bin/env python3
# chrono.py per trial: for each MPTCP trial the long-RTT subflow's busy and sndbuf-limited time
# (last ss sample within 30 s of the trial's start), its bytes, and the trial's goodput and longest
# delivery gap, so that a share can be traced to the trials it came from.
# usage: chronotrials.py TRIALS.jsonl SS.txt
import collections, datetime, json, re, sys
S = collections.defaultdict(list)
for l in open(sys.argv[2]):
    p = l.split(" ", 4)
    if len(p) == 5:
        S[p[2]].append((datetime.datetime.fromisoformat(p[0].replace("Z", "+00:00")), p[4]))
def ms(rx, s):
    m = re.search(rx, s)
    return float(m.group(1)) if m else 0.0
print("| point | procedure | round | goodput, Mbit/s | longest gap, s | long subflow | MB | busy, s | sndbuf-limited, s |")
print("|---|---|---:|---:|---:|---|---:|---:|---:|")
rows = []
for l in open(sys.argv[1]):
    t = json.loads(l)
    if not t["cell"].startswith("mptcp"):
        continue
    st = datetime.datetime.fromisoformat(t["start"][:26] + "+00:00")
    sf = max(t["subflows"], key=lambda s: s["min_rtt_ms"])
    ss = [x for x in S[sf["local"]] if 0 <= (x[0] - st).total_seconds() <= 30]
    if not ss:
        continue
    last = ss[-1][1]
    busy, sb = ms(r"busy:(\d+)ms", last) / 1000, ms(r"sndbuf_limited:(\d+)ms", last) / 1000
    rows.append((t["configuration"], t["cell"], t["trial"], f"| {t['configuration']} | {t['cell']} | {t['trial']} | {t['goodput_mbps']:.2f} | {t['max_gap_s']:.2f} | {sf['path']} | {sf['bytes']/1e6:.2f} | {busy:.1f} | {sb:.2f} |"))
for r in sorted(rows):
    print(r[3])
