#!/usr/bin/env python3
# Per MPTCP trial: each subflow's largest send buffer (skmem tb = sk_sndbuf) over its ss samples,
# their sum (the MPTCP socket's send buffer is tcp_wmem[0] plus the subflows' sk_sndbuf,
# __mptcp_sync_sndbuf), the default subflow's samples with nothing in flight, the goodput and
# the longest delivery gap.
# usage: sndbuf.py TRIALS.jsonl SS.txt [POINT]
import collections, datetime, json, re, statistics, sys
S = collections.defaultdict(list)
for l in open(sys.argv[2]):
    p = l.split(" ", 4)
    if len(p) < 5:
        continue
    tb = re.search(r",tb(\d+),", p[4]); un = re.search(r"unacked:(\d+)", p[4])
    S[p[2]].append((datetime.datetime.fromisoformat(p[0].replace("Z", "+00:00")), int(tb.group(1)) if tb else None, int(un.group(1)) if un else 0))
point = sys.argv[3] if len(sys.argv) > 3 else None
agg = collections.defaultdict(list)
print("| trial | procedure | goodput | longest gap, s | sndbuf max default / detour, KB | sum, KB | default idle samples |")
print("|---:|---|---:|---:|---:|---:|---:|")
rows = []
for l in open(sys.argv[1]):
    t = json.loads(l)
    if not t["cell"].startswith("mptcp-static") or (point and t["configuration"] != point):
        continue
    st = datetime.datetime.fromisoformat(t["start"][:26] + "+00:00")
    tbs, idle = {}, "-"
    for sf in t["subflows"]:
        ss = [x for x in S[sf["local"]] if 0 <= (x[0] - st).total_seconds() <= 30]
        v = [x[1] for x in ss if x[1]]
        tbs[sf["path"]] = max(v) if v else None
        if sf["path"] == "default":
            idle = f"{sum(1 for x in ss if x[2] == 0)}/{len(ss)}"
    d, n = tbs.get("default"), tbs.get("nat:detour1")
    rows.append((t["cell"], t["trial"], f"| {t['trial']} | {t['cell']} | {t['goodput_mbps']:.2f} | {t['max_gap_s']:.2f} | {d//1000 if d else '-'} / {n//1000 if n else '-'} | {(d+n)//1000 if d and n else '-'} | {idle} |"))
    if d and n:
        agg[t["cell"]].append((d + n, t["goodput_mbps"]))
for r in sorted(rows):
    print(r[2])
print()
for c in sorted(agg):
    print(f"{c}: sum of send buffers, median {statistics.median(x for x, _ in agg[c])//1000} KB over {len(agg[c])} trials")
