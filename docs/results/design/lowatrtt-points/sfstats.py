#!/usr/bin/env python3
# Joins the ss samples (ss-sampler.py output) with each trial's subflows (by local address and
# port, within 30 s of the trial's start) and prints per procedure and path the medians over
# trials of the per-trial medians: unsent bytes, cwnd, packets in flight (unacked), in flight /
# cwnd, pacing rate, delivery rate, sk_wmem_queued (skmem w) and the linger time the MPTCP
# scheduler computes from them (w / pacing rate, ms; the kernel uses a smoothed pacing rate), and
# the mean share of samples with nothing in flight (the subflow idle).
# usage: sfstats.py TRIALS.jsonl SS.txt [POINT]
import collections, datetime, json, re, statistics, sys

def ts(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")[:26] + "+00:00" if "." in s else s.replace("Z", "+00:00"))

def num(rx, line, conv=float):
    m = re.search(rx, line)
    return conv(m.group(1)) if m else None

samples = collections.defaultdict(list)  # local -> [(time, fields)]
for l in open(sys.argv[2]):
    p = l.split(" ", 4)
    if len(p) < 5:
        continue
    t = datetime.datetime.fromisoformat(p[0].replace("Z", "+00:00"))
    rest = p[4]
    f = {
        "notsent": num(r"notsent:(\d+)", rest) or 0.0,
        "cwnd": num(r"cwnd:(\d+)", rest),
        "unacked": num(r"unacked:(\d+)", rest) or 0.0,
        "pacing": num(r"pacing_rate (\d+)bps", rest),
        "delivery": num(r"delivery_rate (\d+)bps", rest),
        "rtt": num(r"rtt:([\d.]+)/", rest),
        "w": num(r"skmem:\([^)]*,w(\d+),", rest),
    }
    samples[p[2]].append((t, f))

point = sys.argv[3] if len(sys.argv) > 3 else None
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for l in open(sys.argv[1]):
    tr = json.loads(l)
    if point and tr["configuration"] != point:
        continue
    start = datetime.datetime.fromisoformat(tr["start"][:26].replace("Z", "") + "+00:00")
    for sf in tr.get("subflows") or []:
        ss = [f for t, f in samples.get(sf["local"], []) if 0 <= (t - start).total_seconds() <= 30]
        if not ss:
            continue
        key = (tr["configuration"], tr.get("cell", tr["procedure"]), sf["path"])
        r = rows[key]
        r["n"].append(len(ss))
        for k in ("notsent", "cwnd", "unacked", "pacing", "delivery", "w"):
            v = [f[k] for f in ss if f[k] is not None]
            if v:
                r[k].append(statistics.median(v))
        fr = [f["unacked"] / f["cwnd"] for f in ss if f["cwnd"]]
        r["fill"].append(statistics.median(fr))
        r["full"].append(sum(1 for x in fr if x >= 0.9) / len(fr))
        r["idle"].append(sum(1 for f in ss if not f["unacked"]) / len(ss))
        lg = [f["w"] * 8 / f["pacing"] * 1000 for f in ss if f["w"] is not None and f["pacing"]]
        if lg:
            r["linger"].append(statistics.median(lg))
        r["bytes"].append(sf["bytes"])

def med(v, scale=1.0, fmt="%.0f"):
    return fmt % (statistics.median(v) / scale) if v else "-"

print("| point | procedure | path | trials (samples) | MB carried | unsent, KB | cwnd, pkts | in flight / cwnd | samples with in flight >= 0.9 cwnd | pacing, Mbit/s | delivery, Mbit/s | wmem queued, KB | linger (w / pacing), ms | samples with nothing in flight |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for key in sorted(rows):
    r = rows[key]
    print("| %s | %s | %s | %d (%d) | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        key[0], key[1], key[2], len(r["n"]), sum(r["n"]), med(r["bytes"], 1e6, "%.2f"), med(r["notsent"], 1e3),
        med(r["cwnd"]), med(r["fill"], 1, "%.2f"), med(r["full"], 0.01, "%.0f %%"), med(r["pacing"], 1e6, "%.1f"),
        med(r["delivery"], 1e6, "%.1f"), med(r["w"], 1e3), med(r["linger"], 1, "%.0f"), "%.0f %%" % (100 * sum(r["idle"]) / len(r["idle"]))))
