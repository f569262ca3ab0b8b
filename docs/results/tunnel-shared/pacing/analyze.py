#!/usr/bin/env python3
"""Tables of README.md from trials.jsonl: goodput per trial, ratios to the
best single path of the same run (the larger of the two single-path means
per configuration), per-round pairings against static, per-subflow means."""
import json, statistics as st, sys, os
from collections import defaultdict

here = os.path.dirname(os.path.abspath(__file__))
rows = [json.loads(l) for l in open(os.path.join(here, "trials.jsonl"))]
rows = [r for r in rows if r.get("status") == "ok"]
procs = ["tcp", "tcp-tunnel", "mptcp-tunnel-static", "mptcp-tunnel-static-clamp",
         "mptcp-tunnel-static-pacing", "mptcp-tunnel-static-clamp-both"]
short = {"mptcp-tunnel-static": "static", "mptcp-tunnel-static-clamp": "cwnd clamp",
         "mptcp-tunnel-static-pacing": "pacing clamp", "mptcp-tunnel-static-clamp-both": "both",
         "tcp": "TCP default path", "tcp-tunnel": "TCP via tunnel"}
g = defaultdict(dict)  # (config, proc) -> trial -> row
for r in rows:
    g[(r["configuration"], r["procedure"])][r["trial"]] = r
configs = sorted({r["configuration"] for r in rows}, key=lambda c: (c != "symmetric-loss1", c))
loads = [r["loadavg_1m"] for r in rows]
print(f"trials ok: {len(rows)}; 1-min load at trial ends: min {min(loads):.1f}, median {st.median(loads):.1f}, max {max(loads):.1f}")
print(f"builds: {sorted({r['versions']['mpdetour'] for r in rows})}")
for c in configs:
    mean = {p: st.mean(x["goodput_mbps"] for x in g[(c, p)].values()) for p in procs if g[(c, p)]}
    best_p = max(["tcp", "tcp-tunnel"], key=lambda p: mean[p])
    best = mean[best_p]
    print(f"\n## {c}: best single path {short[best_p]} {best:.2f} Mbit/s")
    print("| procedure | n | goodput per trial (Mbit/s) | mean | sd | mean / best single path | per-trial ratios | rounds above static |")
    print("|---|---:|---|---:|---:|---:|---|---:|")
    for p in procs:
        ts = g[(c, p)]
        v = [ts[t]["goodput_mbps"] for t in sorted(ts)]
        above = ""
        if p.startswith("mptcp") and p != "mptcp-tunnel-static":
            s = g[(c, "mptcp-tunnel-static")]
            pairs = [(ts[t]["goodput_mbps"], s[t]["goodput_mbps"]) for t in sorted(ts) if t in s]
            above = f"{sum(a > b for a, b in pairs)} of {len(pairs)}"
        print(f"| {short[p]} | {len(v)} | {', '.join(f'{x:.2f}' for x in v)} | {st.mean(v):.2f} | {st.stdev(v) if len(v) > 1 else 0:.2f} | "
              f"{st.mean(v)/best:.3f} | {', '.join(f'{x/best:.3f}' for x in v)} | {above} |")
    print("\nper subflow, means over trials (bytes acknowledged in the goodput window, end-of-trial smoothed RTT, retransmitted segments):")
    print("| procedure | default subflow MB | default sRTT ms | default retrans | tunnel subflow MB | tunnel sRTT ms (min) | tunnel retrans |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for p in procs[2:]:
        d, t = defaultdict(list), defaultdict(list)
        for r in g[(c, p)].values():
            for sf in r.get("subflows", []):
                dst = d if sf["path"] == "default" else t
                dst["mb"].append(sf["window_bytes"] / 1e6); dst["rtt"].append(sf["rtt_ms"]); dst["re"].append(sf["retrans"]); dst["min"].append(sf["min_rtt_ms"])
        f = lambda x: st.mean(x) if x else float("nan")
        print(f"| {short[p]} | {f(d['mb']):.2f} | {f(d['rtt']):.0f} | {f(d['re']):.1f} | {f(t['mb']):.2f} | {f(t['rtt']):.0f} ({f(t['min']):.0f}) | {f(t['re']):.1f} |")

# Paired by round (trial n of every arm ran in the same round): each arm
# against the cwnd clamp, with a bootstrap 95 % interval of the ratio of
# means (rounds resampled with replacement, seed fixed).
import random
random.seed(26)
print("\n## paired by round against the cwnd clamp")
print("| configuration | arm | rounds above the cwnd clamp | ratio of means to the cwnd clamp [95 % bootstrap over rounds] | median of per-round ratios |")
print("|---|---|---:|---|---:|")
for c in configs:
    base = g[(c, "mptcp-tunnel-static-clamp")]
    for p in ["mptcp-tunnel-static", "mptcp-tunnel-static-pacing", "mptcp-tunnel-static-clamp-both"]:
        ts = g[(c, p)]
        rounds = [t for t in sorted(ts) if t in base]
        a = [ts[t]["goodput_mbps"] for t in rounds]
        b = [base[t]["goodput_mbps"] for t in rounds]
        boots = []
        for _ in range(10000):
            idx = [random.randrange(len(rounds)) for _ in rounds]
            boots.append(sum(a[i] for i in idx) / sum(b[i] for i in idx))
        boots.sort()
        lo, hi = boots[249], boots[9749]
        print(f"| {c} | {short[p]} | {sum(x > y for x, y in zip(a, b))} of {len(rounds)} | {sum(a)/sum(b):.3f} [{lo:.3f}, {hi:.3f}] | {st.median(x/y for x, y in zip(a, b)):.3f} |")

# Each MPTCP arm over the best single path with a bootstrap 95 % interval
# (rounds resampled; the best single path recomputed in each resample as
# the larger of the two single-path means).
print("\n## over the best single path, bootstrap over rounds")
print("| configuration | arm | mean / best single path [95 %] | median / median of the best single path |")
print("|---|---|---|---:|")
for c in configs:
    sp = {p: g[(c, p)] for p in ["tcp", "tcp-tunnel"]}
    best_p = max(sp, key=lambda p: st.mean(x["goodput_mbps"] for x in sp[p].values()))
    for p in procs[2:]:
        ts = g[(c, p)]
        rounds = [t for t in sorted(ts) if all(t in sp[q] for q in sp)]
        boots = []
        for _ in range(10000):
            idx = [random.choice(rounds) for _ in rounds]
            best = max(sum(sp[q][t]["goodput_mbps"] for t in idx) for q in sp)
            boots.append(sum(ts[t]["goodput_mbps"] for t in idx) / best)
        boots.sort()
        best = max(sum(sp[q][t]["goodput_mbps"] for t in rounds) for q in sp)
        med = st.median(ts[t]["goodput_mbps"] for t in rounds) / st.median(sp[best_p][t]["goodput_mbps"] for t in rounds)
        print(f"| {c} | {short[p]} | {sum(ts[t]['goodput_mbps'] for t in rounds)/best:.3f} [{boots[249]:.3f}, {boots[9749]:.3f}] | {med:.3f} |")
