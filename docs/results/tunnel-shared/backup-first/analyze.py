#!/usr/bin/env python3
"""Tables of README.md from trials.jsonl: per configuration, each arm's
goodput over the best single path of the same run (the larger of the two
single-path means), and each MPTCP arm against static paired by round
(trial n of every arm ran in round n): geometric mean of the per-round
ratios with a Student t 95 % interval on their logs, rounds above."""
import json, math, os, statistics as st
from collections import defaultdict

here = os.path.dirname(os.path.abspath(__file__))
rows = [json.loads(l) for l in open(os.path.join(here, "trials.jsonl"))]
ok = [r for r in rows if r.get("status") == "ok"]
procs = ["tcp", "tcp-tunnel", "mptcp-1sf", "mptcp-tunnel-static", "mptcp-tunnel-static-clamp-both", "mptcp-tunnel-backup-first"]
short = {"tcp": "TCP default path", "tcp-tunnel": "TCP via tunnel", "mptcp-1sf": "MPTCP, default path alone",
         "mptcp-tunnel-static": "static", "mptcp-tunnel-static-clamp-both": "static + both clamps",
         "mptcp-tunnel-backup-first": "backup-first"}
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
g = defaultdict(dict)
for r in ok:
    g[(r["configuration"], r["procedure"])][r["trial"]] = r
configs = sorted({r["configuration"] for r in ok}, key=lambda c: (c != "symmetric-loss1", c))
loads = [r["loadavg_1m"] for r in ok]
print(f"trials: {len(rows)}, ok {len(ok)}; 1-min load at trial ends: min {min(loads):.1f}, median {st.median(loads):.1f}, max {max(loads):.1f}")
print(f"builds: {sorted({r['versions']['mpdetour'] for r in ok})}")
for c in configs:
    mean = {p: st.mean(x["goodput_mbps"] for x in g[(c, p)].values()) for p in procs if g[(c, p)]}
    best_p = max(["tcp", "tcp-tunnel"], key=lambda p: mean[p])
    best = mean[best_p]
    print(f"\n## {c}: best single path {short[best_p]} {best:.2f} Mbit/s")
    print("| arm | n | goodput per trial (Mbit/s) | mean (sd) | mean / best single path | vs static, paired by round: geometric mean [95 % t] | rounds above static |")
    print("|---|---:|---|---:|---:|---|---:|")
    for p in procs:
        ts = g[(c, p)]
        if not ts:
            continue
        v = [ts[t]["goodput_mbps"] for t in sorted(ts)]
        pair = above = ""
        s = g[(c, "mptcp-tunnel-static")]
        if p.startswith("mptcp") and p != "mptcp-tunnel-static":
            lr = [math.log(ts[t]["goodput_mbps"] / s[t]["goodput_mbps"]) for t in sorted(ts) if t in s]
            if len(lr) > 1:
                m, h = st.mean(lr), T975.get(len(lr) - 1, 2.0) * st.stdev(lr) / math.sqrt(len(lr))
                pair = f"{math.exp(m):.3f} [{math.exp(m - h):.3f}, {math.exp(m + h):.3f}]"
            above = f"{sum(x > 0 for x in lr)} of {len(lr)}"
        sd = st.stdev(v) if len(v) > 1 else 0
        print(f"| {short[p]} | {len(v)} | {', '.join(f'{x:.2f}' for x in v)} | {st.mean(v):.2f} ({sd:.2f}) | {st.mean(v)/best:.3f} | {pair} | {above} |")
    print("\nper subflow, means over trials (MB acknowledged in the goodput window, end-of-trial smoothed RTT, retransmitted segments; backup: the subflow ended as backup in how many trials):")
    print("| arm | default MB | default sRTT ms | default retrans | tunnel MB | tunnel sRTT ms | tunnel retrans |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for p in procs[3:]:
        d, t = defaultdict(list), defaultdict(list)
        for r in g[(c, p)].values():
            for sf in r.get("subflows", []):
                dst = d if sf["path"] == "default" else t
                dst["mb"].append(sf["window_bytes"] / 1e6); dst["rtt"].append(sf["rtt_ms"]); dst["re"].append(sf["retrans"])
        f = lambda x: st.mean(x) if x else float("nan")
        print(f"| {short[p]} | {f(d['mb']):.2f} | {f(d['rtt']):.0f} | {f(d['re']):.1f} | {f(t['mb']):.2f} | {f(t['rtt']):.0f} | {f(t['re']):.1f} |")
