#!/usr/bin/env python3
# The detour subflow's retransmitted segments per MB it carried, and its share of the bytes, per
# procedure (all ok trials), from runs/paired/trials.jsonl. Run from the repository root:
#   python3 docs/results/design/mechanisms-cc/retrans.py
import json, collections
D = "docs/results/design/mechanisms-cc"
agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0])  # retrans, detour bytes, all bytes, trials
for line in open(D + "/runs/paired/trials.jsonl"):
    t = json.loads(line)
    if t.get("status") != "ok" or not t["cell"].startswith("mptcp"):
        continue
    a = agg[t["cell"]]
    a[3] += 1
    for s in t.get("subflows", []):
        a[2] += s["bytes"]
        if s["path"].startswith("nat:"):
            a[0] += s["retrans"]
            a[1] += s["bytes"]
print("| procedure | trials | detour subflow: retransmitted segments per MB carried | detour share of the bytes |")
print("|---|---:|---:|---:|")
for cell in sorted(agg):
    r, b, tot, n = agg[cell]
    print(f"| {cell} | {n} | {r / (b / 1e6):.1f} | {100 * b / tot:.0f} % |")
