#!/usr/bin/env python3
"""Subflows' unsent bytes per procedure (after ../lowat/notsent.py). ss-notsent.txt holds the
client namespaces' TCP sockets sampled once a second with `ss -tin`: time, namespace, local, peer,
notsent bytes, cwnd (packets), unacked (packets). A trial's samples are those of its subflows
(runs/paired.shardK/trials.jsonl: local and remote address:port; shard K ran in namespace
rttdK-client) taken from its start to its start + window_s + 2 s (so a reused port of another
trial is not joined). "Idle with window": a sample in the writing (start + 1 s to start + 10 s)
whose subflow had nothing unsent and fewer packets in flight than its cwnd (one sample a second:
a coarse look, not a measure of the time). A trial "above 0.2 MB": one of its subflows was seen
with more unsent than the 128 KiB floor allows (the fixed limit's samples stay at or below 0.16 MB).
Usage: notsent.py [DIR]"""
import collections, datetime, glob, json, os, re, statistics, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))


def ts(s):
    s = s.rstrip("Z")
    if "." in s:
        a, b = s.split(".")
        s = a + "." + (b + "000000")[:6]
    return datetime.datetime.fromisoformat(s).replace(tzinfo=datetime.timezone.utc).timestamp()


samples = collections.defaultdict(list)  # (ns, local, peer) -> [(t, notsent, cwnd, unacked)]
with open(os.path.join(d, "ss-notsent.txt")) as f:
    for line in f:
        p = line.split()
        if len(p) == 7:
            samples[(p[1], p[2], p[3])].append((ts(p[0]), int(p[4]), int(p[5]), int(p[6])))

per = collections.defaultdict(lambda: {"trials": 0, "sampled": 0, "max": [], "med": [], "over": 0, "n": 0,
                                       "writing": 0, "idle": 0, "window": []})
for tf in sorted(glob.glob(os.path.join(d, "runs", "paired.shard*", "trials.jsonl"))):
    ns = "rttd%s-client" % re.search(r"shard(\d+)", tf).group(1)
    for line in open(tf):
        r = json.loads(line)
        if r.get("status") != "ok":
            continue
        proc = r["cell"]
        st = per[proc]
        st["trials"] += 1
        if r.get("window_s"):
            st["window"].append(r["window_s"])
        if not proc.startswith("mptcp"):
            continue
        t0 = ts(r["start"])
        t1 = t0 + (r.get("window_s") or 10) + 2
        vals = []
        for sf in r.get("subflows") or []:
            for (t, nb, cw, un) in samples.get((ns, sf["local"], sf["remote"]), []):
                if t0 <= t <= t1:
                    vals.append(nb)
                    if t0 + 1 <= t <= t0 + 10:
                        st["writing"] += 1
                        if nb == 0 and un < cw:
                            st["idle"] += 1
        if not vals:
            continue
        st["sampled"] += 1
        st["max"].append(max(vals))
        st["med"].append(statistics.median(vals))
        st["over"] += sum(v > 256 << 10 for v in vals)
        st["n"] += len(vals)

MB = 1e6
print("| procedure | ok trials | trials sampled | subflow samples | per-trial max unsent, MB: median (max) "
      "| per-trial median unsent, MB: median | samples above 256 KiB | trials with a sample above 0.2 MB | in the writing: samples, idle with window "
      "| window to the last byte, s: median (max) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for proc in sorted(per):
    st = per[proc]
    w = "%.1f (%.1f)" % (statistics.median(st["window"]), max(st["window"])) if st["window"] else "-"
    if st["sampled"]:
        big = sum(m > 0.2 * MB for m in st["max"])
        print("| %s | %d | %d | %d | %.2f (%.2f) | %.2f | %d (%.0f %%) | %d | %d, %d (%.0f %%) | %s |" % (
            proc, st["trials"], st["sampled"], st["n"], statistics.median(st["max"]) / MB, max(st["max"]) / MB,
            statistics.median(st["med"]) / MB, st["over"], 100 * st["over"] / st["n"], big, st["writing"], st["idle"],
            100 * st["idle"] / max(st["writing"], 1), w))
    else:
        print("| %s | %d | %d | 0 | - | - | - | - | - | %s |" % (proc, st["trials"], st["sampled"], w))
