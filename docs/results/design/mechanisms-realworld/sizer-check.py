#!/usr/bin/env python3
# How far was the agent's buffer sizer from acting? Per MPTCP trial: the rule of
# policy.Engine.BufferWanted (2 x the connection's rate x its largest smoothed subflow RTT),
# estimated from the trial's goodput and the largest end-of-trial subflow RTT, against the smallest
# maximum the sizer found in the client's namespace (tcp_wmem[2] = 4 MiB, the kernel default; it
# changes nothing below that). The agents' own log lines are in sizer-log.txt.
# Run from the repository root: python3 docs/results/design/mechanisms-realworld/sizer-check.py [DIR]
import json, sys
D = sys.argv[1] if len(sys.argv) > 1 else "docs/results/design/mechanisms-realworld"
least = 4194304
rows = [json.loads(l) for l in open(D + "/runs/paired/trials.jsonl")]
best = {}
print("| point | procedure | trials | goodput Mbit/s (max) | largest RTT ms (max) | wanted, MB (max) | x 4 MiB |")
print("|---|---|---:|---:|---:|---:|---:|")
agg = {}
for r in rows:
    if r["status"] != "ok" or not r["cell"].startswith("mptcp-static"):
        continue
    rtt = max(s["rtt_ms"] for s in r["subflows"])
    want = 2 * r["goodput_mbps"] * 1e6 / 8 * rtt / 1e3
    a = agg.setdefault((r["configuration"], r["cell"]), [0, 0, 0, 0])
    a[0] += 1
    a[1], a[2], a[3] = max(a[1], r["goodput_mbps"]), max(a[2], rtt), max(a[3], want)
for (p, c), a in sorted(agg.items()):
    print(f"| {p} | {c} | {a[0]} | {a[1]:.2f} | {a[2]:.0f} | {a[3]/1e6:.2f} | {a[3]/least:.2f} |")
w = max(a[3] for a in agg.values())
print(f"\nlargest wanted over all {sum(a[0] for a in agg.values())} MPTCP trials: {w/1e6:.2f} MB = {w/least:.2f} x 4 MiB")
