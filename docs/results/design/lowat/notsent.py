#!/usr/bin/env python3
"""Subflows' unsent bytes per procedure: joins ss-notsent*.txt (the client node's MPTCP
subflows sampled once a second with `ss -tin`: time, local, peer, notsent) with the
trials' subflows (runs/paired*/trials.jsonl: local and remote address:port of each
subflow), and the windows to the last byte. Usage: notsent.py [DIR]"""
import collections, glob, json, os, statistics, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
samples = collections.defaultdict(list)  # (local, peer) -> [notsent]
for name in sorted(glob.glob(os.path.join(d, "ss-notsent*.txt"))):
  with open(name) as f:
    for line in f:
        p = line.split()
        if len(p) == 4:
            samples[(p[1], p[2])].append(int(p[3]))

per = collections.defaultdict(lambda: {"trials": 0, "sampled": 0, "max": [], "med": [], "over": 0, "n": 0, "window": []})
for tf in glob.glob(os.path.join(d, "runs", "paired*", "trials.jsonl")):
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
        vals = []
        for sf in r.get("subflows") or []:
            vals += samples.get((sf["local"], sf["remote"]), [])
        if not vals:
            continue
        st["sampled"] += 1
        st["max"].append(max(vals))
        st["med"].append(statistics.median(vals))
        st["over"] += sum(v > 256 << 10 for v in vals)
        st["n"] += len(vals)

print("| procedure | ok trials | trials sampled | subflow samples | per-trial max unsent, MB: median (max) | per-trial median unsent, MB: median | samples above 256 KiB | window to the last byte, s: median (max) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for proc in sorted(per):
    st = per[proc]
    w = st["window"]
    ws = f"{statistics.median(w):.1f} ({max(w):.1f})" if w else "-"
    if st["sampled"]:
        mx = f"{statistics.median(st['max'])/1e6:.2f} ({max(st['max'])/1e6:.2f})"
        md = f"{statistics.median(st['med'])/1e6:.2f}"
        ov = f"{st['over']} ({100*st['over']/st['n']:.0f} %)"
    else:
        mx = md = ov = "-"
    print(f"| {proc} | {st['trials']} | {st['sampled']} | {st['n']} | {mx} | {md} | {ov} | {ws} |")
