#!/usr/bin/env python3
# Would the agent's buffer sizer have changed anything? Per +buffers trial: its wanted maximum
# 2 x goodput x the largest subflow RTT (the rule of policy.Engine.BufferWanted, here from the
# trial's own goodput and end-of-trial smoothed RTTs) against the smallest original maximum in the
# client's namespace (tcp_wmem[2] = 4 MiB, the kernel default; the sizer changes nothing below it).
# Run from the repository root: python3 docs/results/design/mechanisms/sizer-check.py
import json
D = "docs/results/design/mechanisms"
least = 4194304
rows = [json.loads(l) for l in open(D + "/runs/paired/trials.jsonl")]
print("| point | trial | goodput Mbit/s | largest RTT ms | wanted (MB) | above 4 MiB |")
print("|---|---:|---:|---:|---:|---|")
for r in rows:
    if r["status"] != "ok" or not r["cell"].startswith("mptcp-static"):
        continue
    if r["cell"] != "mptcp-static+buffers":
        continue
    rtt = max(s["rtt_ms"] for s in r["subflows"])
    want = 2 * r["goodput_mbps"] * 1e6 / 8 * rtt / 1e3
    print(f"| {r['configuration']} | {r['trial']} | {r['goodput_mbps']:.2f} | {rtt:.0f} | {want/1e6:.2f} | {'yes' if want > least else 'no'} |")
