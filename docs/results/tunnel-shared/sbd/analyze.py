#!/usr/bin/env python3
"""Tables of README.md from trials.jsonl: per configuration, each arm's
goodput over the best single path and over the sum of the two single
paths of the same run, and static+sbd against static paired by round
(trial n of every arm ran in round n): geometric mean of the per-round
ratios with a Student t 95 % interval on their logs, rounds above. Per
subflow: MB acknowledged in the goodput window, and in how many trials
a subflow carried less than 5 % of the connection's bytes (the rule took
it out, or it starved)."""
import json, math, os, statistics as st
from collections import defaultdict

here = os.path.dirname(os.path.abspath(__file__))
rows = [json.loads(l) for l in open(os.path.join(here, "trials.jsonl"))]
ok = [r for r in rows if r.get("status") == "ok"]
procs = ["tcp", "tcp-tunnel", "mptcp-1sf", "mptcp-tunnel-static", "mptcp-tunnel-static-sbd"]
short = {"tcp": "TCP default path", "tcp-tunnel": "TCP via tunnel", "mptcp-1sf": "MPTCP, default path alone",
         "mptcp-tunnel-static": "static", "mptcp-tunnel-static-sbd": "static + sbd"}
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
g = defaultdict(dict)
for r in ok:
    g[(r["configuration"], r["procedure"])][r["trial"]] = r
order = ["symmetric-loss1", "symmetric-delay100", "core-limited", "core-limited-delay100"]
configs = [c for c in order if any(k[0] == c for k in g)]
loads = [r["loadavg_1m"] for r in ok]
print(f"trials: {len(rows)}, ok {len(ok)}; 1-min load at trial ends: min {min(loads):.1f}, median {st.median(loads):.1f}, max {max(loads):.1f}")
print(f"builds: {sorted({r['versions']['mpdetour'] for r in ok})}")
for c in configs:
    mean = {p: st.mean(x["goodput_mbps"] for x in g[(c, p)].values()) for p in procs if g[(c, p)]}
    best_p = max(["tcp", "tcp-tunnel"], key=lambda p: mean[p])
    best, total = mean[best_p], mean["tcp"] + mean["tcp-tunnel"]
    print(f"\n## {c}: best single path {short[best_p]} {best:.2f} Mbit/s, sum of single paths {total:.2f}")
    print("| arm | n | goodput per trial (Mbit/s) | mean (sd) | mean / best single path | mean / sum | vs static, paired by round: geometric mean [95 % t] | rounds above static |")
    print("|---|---:|---|---:|---:|---:|---|---:|")
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
        print(f"| {short[p]} | {len(v)} | {', '.join(f'{x:.2f}' for x in v)} | {st.mean(v):.2f} ({sd:.2f}) | {st.mean(v)/best:.3f} | {st.mean(v)/total:.3f} | {pair} | {above} |")
    print("\nper path, means over trials (MB acknowledged in the goodput window by its subflows, end-of-trial smoothed RTT and retransmitted segments per subflow) and the trials in which it carried under 5 % of the connection's bytes:")
    print("| arm | default MB | default sRTT ms | default retrans | default < 5 % | tunnel MB | tunnel sRTT ms | tunnel retrans | tunnel < 5 % |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in procs[3:]:
        mb = {"d": [], "t": []}
        rtt, re = {"d": [], "t": []}, {"d": [], "t": []}
        low = {"d": 0, "t": 0}
        for r in g[(c, p)].values():
            sfs = r.get("subflows", [])
            tot = sum(sf["window_bytes"] for sf in sfs) or 1
            per = {"d": 0, "t": 0}
            for sf in sfs:
                k = "d" if sf["path"] == "default" else "t"
                per[k] += sf["window_bytes"]
                rtt[k].append(sf["rtt_ms"]); re[k].append(sf["retrans"])
            for k in "dt":
                mb[k].append(per[k] / 1e6)
                low[k] += per[k] < 0.05 * tot
        f = lambda x: st.mean(x) if x else float("nan")
        n = len(g[(c, p)])
        print(f"| {short[p]} | {f(mb['d']):.2f} | {f(rtt['d']):.0f} | {f(re['d']):.1f} | {low['d']} of {n} | {f(mb['t']):.2f} | {f(rtt['t']):.0f} | {f(re['t']):.1f} | {low['t']} of {n} |")
