#!/usr/bin/env python3
"""The candidates oracle over every subset, from trials.jsonl: per cell the
mean goodput (from 1 s) and last-third rate (tail) over trials; the oracle
is the best static subset (every subset of detour1, 3, 4, 6, 7, 8; the
empty one is mptcp-1sf). The max of 64 noisy means is biased upward, so a
split-round oracle is given too: the subset chosen in one round, its
goodput taken from the other round (averaged over both splits)."""
import json, os, statistics as st
from collections import defaultdict

here = os.path.dirname(os.path.abspath(__file__))
rows = [json.loads(l) for l in open(os.path.join(here, "trials.jsonl"))]
ok = [r for r in rows if r.get("status") == "ok"]
by = defaultdict(dict)  # cell -> trial -> row
for r in ok:
    by[r["cell"]][r["trial"]] = r
loads = [r["loadavg_1m"] for r in ok]
print(f"trials: {len(rows)}, ok {len(ok)}; cells {len(by)}; rounds {sorted({r['trial'] for r in ok})}; "
      f"1-min load at trial ends min {min(loads):.1f}, median {st.median(loads):.1f}, max {max(loads):.1f}; "
      f"builds {sorted({r['versions']['mpdetour'] for r in ok})}")
subsets = {c: by[c] for c in by if c.startswith("mptcp-nat-static@") or c == "mptcp-1sf"}
print(f"subsets measured: {len(subsets)} (want 64)")
def mean(c, f):
    return st.mean(x[f] for x in by[c].values())
rounds = sorted({r["trial"] for r in ok})
for f, label in [("goodput_mbps", "overall (goodput from 1 s)"), ("tail_mbps", "last third")]:
    best = max(subsets, key=lambda c: mean(c, f))
    orc = mean(best, f)
    print(f"\n## {label}")
    top = sorted(subsets, key=lambda c: -mean(c, f))[:5]
    print("best subsets (mean over rounds, per round): " + "; ".join(
        f"{c.replace('mptcp-nat-static@', '')} {mean(c, f):.2f} ({', '.join(f'{by[c][t][f]:.2f}' for t in sorted(by[c]))})" for c in top))
    split = []
    if len(rounds) >= 2:
        for a in rounds:
            full = [c for c in subsets if a in by[c] and all(t in by[c] for t in rounds)]
            pick = max(full, key=lambda c: by[c][a][f])
            others = [by[pick][t][f] for t in rounds if t != a]
            split.append((pick, st.mean(others)))
    so = st.mean(v for _, v in split) if split else float("nan")
    short = lambda c: c.replace("mptcp-nat-static@", "")
    splits = "; ".join(f"{short(p)} {v:.2f}" for p, v in split)
    print(f"oracle (best subset's mean): {orc:.2f} Mbit/s ({short(best)}); split-round oracle: {so:.2f} ({splits})")
    print("| arm | per round | mean | / oracle | / split-round oracle |")
    print("|---|---|---:|---:|---:|")
    for c, name in [("mptcp-nat-static", "static, all 8 detours (the default)"), ("mptcp-nat-adaptive", "adaptive"),
                    ("mptcp-1sf", "MPTCP, default path alone"), ("tcp", "TCP, default path")]:
        if c not in by:
            continue
        m = mean(c, f)
        print(f"| {name} | {', '.join(f'{by[c][t][f]:.2f}' for t in sorted(by[c]))} | {m:.2f} | {m/orc:.3f} | {m/so:.3f} |")
