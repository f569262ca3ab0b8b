#!/usr/bin/env python3
# Per trial and subflow, from the last ss sample of the subflow within 30 s of the trial's start:
# the kernel's send-time accounting (tcp_info chrono: busy = time with data in flight or queued,
# rwnd_limited = time stalled by the peer's receive window, sndbuf_limited = time stalled by the
# send buffer), and the age of the subflow at that sample; then per procedure and path the sums.
# usage: chrono.py TRIALS.jsonl SS.txt [POINT]
import collections, datetime, json, re, sys
S = collections.defaultdict(list)
for l in open(sys.argv[2]):
    p = l.split(" ", 4)
    if len(p) < 5:
        continue
    S[p[2]].append((datetime.datetime.fromisoformat(p[0].replace("Z", "+00:00")), p[4]))
def ms(rx, s):
    m = re.search(rx, s)
    return float(m.group(1)) if m else 0.0
tot = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
point = sys.argv[3] if len(sys.argv) > 3 else None
for l in open(sys.argv[1]):
    t = json.loads(l)
    if not t["cell"].startswith("mptcp") or (point and t["configuration"] != point):
        continue
    st = datetime.datetime.fromisoformat(t["start"][:26] + "+00:00")
    for sf in t["subflows"]:
        ss = [x for x in S[sf["local"]] if 0 <= (x[0] - st).total_seconds() <= 30]
        if not ss:
            continue
        last = ss[-1][1]
        b, rw, sb = ms(r"busy:(\d+)ms", last), ms(r"rwnd_limited:(\d+)ms", last), ms(r"sndbuf_limited:(\d+)ms", last)
        k = (t["configuration"], t["cell"], sf["path"])
        tot[k][0] += 1; tot[k][1] += b; tot[k][2] += rw; tot[k][3] += sb
print("| point | procedure | path | trials | busy, s (sum) | rwnd-limited, s (share of busy) | sndbuf-limited, s (share of busy) |")
print("|---|---|---|---:|---:|---:|---:|")
for k in sorted(tot):
    n, b, rw, sb = tot[k]
    print(f"| {k[0]} | {k[1]} | {k[2]} | {n} | {b/1000:.1f} | {rw/1000:.1f} ({100*rw/b if b else 0:.0f} %) | {sb/1000:.1f} ({100*sb/b if b else 0:.0f} %) |")
