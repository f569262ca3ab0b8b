#!/usr/bin/env python3
# The unsent limit the scaled program would set, estimated from the ss samples, beside the unsent
# bytes the subflows held. TCP_NOTSENT_LOWAT is not in tcp_info (so not in ss); per sample of an
# MPTCP trial's subflow: est = clamp(cwnd x mss x (T - srtt) / srtt, FLOOR, CEIL) with T the largest
# smoothed RTT among the trial's subflows sampled in the same second (docs/agent.md "Scaled to the
# subflows' RTTs"; the program uses the RTT at each RTT callback and T from the agent's probe
# rounds, so this is an estimate), FLOOR = 131072, CEIL = 4194304 (tcp_wmem max in rttpts-client).
# Prints per point, procedure and path (long/short by RTT): samples, median RTT, median cwnd, the
# median estimate (with +lowatrtt; 128 KiB with +lowat; none with static), notsent median / p90 /
# max, and the share of samples whose notsent exceeds 1.25 x the limit (the estimate with +lowatrtt,
# 128 KiB with +lowat and, for comparison, with static: what a fixed limit would have cut; the
# kernel lets notsent pass the lowat by up to one write, hence the margin).
# usage: lowatest.py TRIALS.jsonl SS.txt
import collections, datetime, json, re, statistics, sys
FLOOR, CEIL = 131072, 4194304
S = collections.defaultdict(list)
for l in open(sys.argv[2]):
    p = l.split(" ", 4)
    if len(p) < 5:
        continue
    r = p[4]
    def g(rx, conv=float, d=None):
        m = re.search(rx, r)
        return conv(m.group(1)) if m else d
    S[p[2]].append((p[0], datetime.datetime.fromisoformat(p[0].replace("Z", "+00:00")), {
        "notsent": g(r"notsent:(\d+)", int, 0), "cwnd": g(r"cwnd:(\d+)", int), "mss": g(r" mss:(\d+)", int),
        "rtt": g(r"rtt:([\d.]+)/")}))
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for l in open(sys.argv[1]):
    t = json.loads(l)
    if not t["cell"].startswith("mptcp") or t.get("status") != "ok":
        continue
    st = datetime.datetime.fromisoformat(t["start"][:26] + "+00:00")
    per = {}
    for sf in t["subflows"]:
        per[sf["path"]] = [x for x in S[sf["local"]] if 0 <= (x[1] - st).total_seconds() <= 30]
    if len(per) < 2:
        continue
    med = {p: statistics.median([x[2]["rtt"] for x in v if x[2]["rtt"]] or [0]) for p, v in per.items()}
    longp = max(med, key=med.get)
    bytime = collections.defaultdict(dict)
    for p, v in per.items():
        for ts, _, f in v:
            bytime[ts][p] = f
    for ts, fs in bytime.items():
        T = max(f["rtt"] for f in fs.values() if f["rtt"])
        for p, f in fs.items():
            if not (f["rtt"] and f["cwnd"] and f["mss"]):
                continue
            est = FLOOR if f["rtt"] >= T else min(CEIL, max(FLOOR, f["cwnd"] * f["mss"] * (T - f["rtt"]) / f["rtt"]))
            if len(fs) < 2:
                est = FLOOR
            k = (t["configuration"], t["cell"], "long" if p == longp else "short", p)
            r = rows[k]
            r["rtt"].append(f["rtt"]); r["cwnd"].append(f["cwnd"]); r["est"].append(est); r["notsent"].append(f["notsent"])
            lim = est if t["cell"].endswith("+lowatrtt") else FLOOR
            r["over"].append(f["notsent"] > lim * 1.25)
print("| point | procedure | subflow | samples | RTT, ms | cwnd, pkts | limit (est.), KB | notsent median / p90 / max, KB | samples with notsent > 1.25 x limit (static: 1.25 x 128 KiB) |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
for k in sorted(rows, key=lambda k: (k[0], k[2], k[1])):
    r = rows[k]
    lim = {"mptcp-static": "-", "mptcp-static+lowat": "131"}.get(k[1], f"{statistics.median(r['est'])/1000:.0f}")
    ns = r["notsent"]
    print(f"| {k[0]} | {k[1]} | {k[2]} ({k[3]}) | {len(ns)} | {statistics.median(r['rtt']):.0f} | {statistics.median(r['cwnd']):.0f} | {lim} | "
          f"{statistics.median(ns)/1000:.0f} / {pct(ns, .9)/1000:.0f} / {max(ns)/1000:.0f} | {100*sum(r['over'])/len(ns):.0f} % |")
