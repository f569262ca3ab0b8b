#!/usr/bin/env python3
"""G5 (guard share 0.05, no starvation condition) against static on seed 7's 12 3-path points:
per point the ratio of means (to the last byte and over the equal window), the geometric mean with
its Student t interval over the points (all 12, and the 11 other than p006, which chose the
threshold), and the sheds G5's agent logged (policy_log). Per-point intervals and harmed verdicts
are report.md's. Run from the repository root."""
import collections, glob, json, math, os, re, statistics as st, sys

HERE = "docs/results/design/paired-paths3-g5"
sys.path.insert(0, os.path.join(HERE, "../../tools"))
from tint import tint

G5, S = "mptcp-guard+share5+starveoff", "mptcp-static"
tr = collections.defaultdict(list)
for f in sorted(glob.glob(HERE + "/runs/paired*/trials.jsonl")):
    for l in open(f):
        x = json.loads(l)
        if x["status"] == "ok":
            tr[(x["configuration"], x["cell"])].append(x)
points = sorted({p for p, c in tr if len(tr[(p, G5)]) >= 3 and len(tr[(p, S)]) >= 3})

def gm(v):
    m, lo, hi = tint([math.log(x) for x in v])
    return f"{math.exp(m):.3f} [{math.exp(lo):.3f}, {math.exp(hi):.3f}]" if len(v) > 1 else f"{math.exp(m):.3f}"

print(f"points with 3 rounds of both: {len(points)}: {', '.join(points)}\n")
print("| point | static Mbit/s | G5 Mbit/s | G5 / static (last byte) | equal window | G5 trials with a shed | what was shed |")
print("|---|---:|---:|---:|---:|---:|---|")
for p in points:
    s = st.mean(x["goodput_mbps"] for x in tr[(p, S)]); g = st.mean(x["goodput_mbps"] for x in tr[(p, G5)])
    se = st.mean(x["equal_goodput_mbps"] for x in tr[(p, S)]); ge = st.mean(x["equal_goodput_mbps"] for x in tr[(p, G5)])
    sheds = [re.findall(r'path=(\S+)', l)[0] for x in tr[(p, G5)] for l in (x.get("policy_log") or []) if "shed" in l and "rejoin" not in l]
    n = sum(1 for x in tr[(p, G5)] if any("shed" in l and "rejoin" not in l for l in (x.get("policy_log") or [])))
    print(f"| {p} | {s:.2f} | {g:.2f} | {g / s:.3f} | {ge / se:.3f} | {n} of {len(tr[(p, G5)])} | {', '.join(sorted(set(sheds))) or '-'} |")
for name, key in [("last byte", "goodput_mbps"), ("equal window", "equal_goodput_mbps")]:
    r = {p: st.mean(x[key] for x in tr[(p, G5)]) / st.mean(x[key] for x in tr[(p, S)]) for p in points}
    rest = [v for p, v in r.items() if p != "p006"]
    print(f"\n{name}: G5 / static over all {len(r)}: {gm(list(r.values()))}; over the {len(rest)} other than p006: {gm(rest) if rest else '-'}")
