#!/usr/bin/env python3
"""Issue 26 candidates with the RTT-scaled per-subflow unsent limit (adapted
from ../candidates-lowat/analyze.py): every arm against the oracle subset, from trials.jsonl (one interleaved run, one --resume run per
round; round = the record's trial number), notsent.txt (ss samples of the
client namespaces, 1 s) and the agents' logs (agent-logs/roundR/).

Oracle = static on the subset detour3 + detour4 + detour7 (the best of all 64
subsets in candidates-oracle), forced here and measured in the same rounds.
Per arm and window (goodput from 1 s; the last third, 10-15 s): per-round
values, the mean, the ratio of means to the oracle's mean (the headline, as
candidates-oracle and candidates-policies gave it) and, over rounds, the
geometric mean of the paired per-round ratios arm_r / oracle_r with a 95 %
Student t interval (on the logs). Then, paired per round the same way,
lowatrtt / static, lowatrtt / lowat and lowat / static, and the per-path byte
shares."""
import sys
import glob, json, math, os, re, statistics as st
from collections import defaultdict
from datetime import datetime, timedelta

# analyze.py [DIR] [--rounds A-B] [--tcp-min MBPS]: DIR the run's directory (default: this
# file's); --rounds keeps rounds A..B only; --tcp-min keeps only the rounds in which the tcp
# cell's overall goodput is at least MBPS (its line rate: a lower TCP says the lab was short of
# CPU in that round), whatever the other cells did.
args = sys.argv[1:]
here = args[0] if args and not args[0].startswith("--") else os.path.dirname(os.path.abspath(__file__))
rsel = args[args.index("--rounds") + 1] if "--rounds" in args else None
tcpmin = float(args[args.index("--tcp-min") + 1]) if "--tcp-min" in args else None
rows = [json.loads(l) for l in open(os.path.join(here, "trials.jsonl"))]
if rsel:
    a, b = map(int, rsel.split("-"))
    rows = [r for r in rows if a <= r["trial"] <= b]
if tcpmin is not None:
    low = {r["trial"] for r in rows if r["cell"] == "tcp" and r.get("status") == "ok" and r["goodput_mbps"] < tcpmin}
    print(f"rounds left out (tcp overall goodput below {tcpmin} Mbit/s): {sorted(low)}")
    rows = [r for r in rows if r["trial"] not in low]
ok = [r for r in rows if r.get("status") == "ok"]
by = defaultdict(dict)  # cell -> round -> record
for r in ok:
    by[r["cell"]][r["trial"]] = r
# Only complete rounds (every cell ok in that round): a round still running or
# cut short is left out of every number below.
cells = {r["cell"] for r in rows}
complete = sorted(t for t in {r["trial"] for r in rows} if all(t in by[c] for c in cells))
for c in list(by):
    by[c] = {t: r for t, r in by[c].items() if t in complete}
rows = [r for r in rows if r["trial"] in complete]
ok = [r for r in ok if r["trial"] in complete]
loads = [r["loadavg_1m"] for r in rows if "loadavg_1m" in r]
rounds = sorted({r["trial"] for r in rows})
print(f"trials: {len(rows)}, ok {len(ok)}; cells {len({r['cell'] for r in rows})}; rounds {rounds}; "
      f"1-min load at trial ends min {min(loads):.2f}, median {st.median(loads):.2f}, max {max(loads):.2f}; "
      f"builds {sorted({r['versions']['mpdetour'] for r in rows if 'versions' in r})}")
lf = os.path.join(here, "load.txt")
if os.path.exists(lf):
    ls = [float(l.split()[1]) for l in open(lf) if len(l.split()) >= 2]
    print(f"1-min load sampled every 30 s over the session ({len(ls)} samples): min {min(ls):.2f}, "
          f"median {st.median(ls):.2f}, max {max(ls):.2f}")
for r in rows:
    if r.get("status") != "ok" or r.get("reason"):
        print(f"  {r['cell']} round {r['trial']}: {r.get('status')} {r.get('reason', '')[:160]}")

ORACLE = "mptcp-nat-static@detour3+detour4+detour7"
STATIC, LOWAT, RTT = "mptcp-nat-static", "mptcp-nat-static-lowat", "mptcp-nat-static-lowatrtt"
ARMS = [(STATIC, "static, all 8 detours (the default)"),
        (LOWAT, "static + fixed limit (subflow_lowat 131072)"),
        (RTT, "static + RTT-scaled limit (131072 floor, scale rtt)"),
        ("tcp", "TCP, default path")]
PAIRS = [(RTT, STATIC, "lowatrtt / static"), (RTT, LOWAT, "lowatrtt / lowat"), (LOWAT, STATIC, "lowat / static")]
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
       20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045}

def interval(ratios):
    logs = [math.log(x) for x in ratios]
    g = math.exp(st.mean(logs))
    if len(logs) < 2:
        return g, float("nan"), float("nan")
    h = T95[len(logs) - 1] * st.stdev(logs) / math.sqrt(len(logs))
    return g, math.exp(st.mean(logs) - h), math.exp(st.mean(logs) + h)

def mean_ci(xs):
    m = st.mean(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    h = T95[len(xs) - 1] * st.stdev(xs) / math.sqrt(len(xs))
    return m, m - h, m + h

for f, label in [("goodput_mbps", "overall (goodput from 1 s)"), ("tail_mbps", "last third (10-15 s)")]:
    o = by[ORACLE]
    orc, olo, ohi = mean_ci([x[f] for x in o.values()])
    print(f"\n## {label}")
    print(f"oracle (detour3+detour4+detour7 forced): per round {', '.join(f'{o[t][f]:.2f}' for t in sorted(o))}; "
          f"mean {orc:.2f} [{olo:.2f}, {ohi:.2f}] Mbit/s")
    print("| arm | per round | mean [95 %] | mean / oracle mean | paired per-round ratio: geo. mean [95 % interval] | min-max | rounds >= 0.9 |")
    print("|---|---|---|---:|---|---|---:|")
    for c, name in ARMS:
        if c not in by:
            continue
        m, lo, hi = mean_ci([x[f] for x in by[c].values()])
        common = [t for t in sorted(by[c]) if t in o]
        rat = [by[c][t][f] / o[t][f] for t in common]
        g, glo, ghi = interval(rat)
        print(f"| {name} | {', '.join(f'{by[c][t][f]:.2f}' for t in sorted(by[c]))} | {m:.2f} [{lo:.2f}, {hi:.2f}] | {m/orc:.3f} | "
              f"{g:.3f} [{glo:.3f}, {ghi:.3f}] | {min(rat):.3f}-{max(rat):.3f} | {sum(x >= 0.9 for x in rat)} of {len(rat)} |")
    for a, b, name in PAIRS:
        common = [t for t in sorted(by[a]) if t in by[b]]
        rat = [by[a][t][f] / by[b][t][f] for t in common]
        g, glo, ghi = interval(rat)
        print(f"\n{name}, paired per round ({len(rat)} rounds): {', '.join(f'{x:.3f}' for x in rat)}; "
              f"geo. mean {g:.3f} [{glo:.3f}, {ghi:.3f}]; above 1 in {sum(x > 1 for x in rat)} of {len(rat)}")

# Per-path byte shares at the end of each trial (the sender's kernel's bytes
# acknowledged per subflow; a path with two subflows, e.g. detour8's
# replacement, summed).
print("\n## per-path share of the bytes (mean over rounds of each round's share; MB mean in brackets)")
paths = ["default"] + [f"detour{i}" for i in range(1, 9)]
print("| arm | " + " | ".join(paths) + " |")
print("|---|" + "---:|" * len(paths))
for c, name in [(ORACLE, "oracle subset")] + ARMS[:3]:
    if c not in by:
        continue
    shares, mb = defaultdict(list), defaultdict(list)
    for t, r in by[c].items():
        per = defaultdict(float)
        for s in r.get("subflows") or []:
            per[s["path"].replace("nat:", "")] += s["bytes"]
        tot = sum(per.values())
        for p in paths:
            shares[p].append(per.get(p, 0) / tot if tot else 0)
            mb[p].append(per.get(p, 0) / 1e6)
    print(f"| {name} | " + " | ".join(f"{st.mean(shares[p]):.3f} ({st.mean(mb[p]):.1f})" for p in paths) + " |")
print("\nshare of the bytes on the oracle's paths (default + detour3 + detour4 + detour7), per round:")
for c, name in [(ORACLE, "oracle subset")] + ARMS[:3]:
    if c not in by:
        continue
    v = []
    for t in sorted(by[c]):
        per = defaultdict(float)
        for s in by[c][t].get("subflows") or []:
            per[s["path"].replace("nat:", "")] += s["bytes"]
        tot = sum(per.values())
        v.append(sum(per.get(p, 0) for p in ("default", "detour3", "detour4", "detour7")) / tot)
    m, lo, hi = mean_ci(v)
    print(f"  {name}: {', '.join(f'{x:.3f}' for x in v)}; mean {m:.3f} [{lo:.3f}, {hi:.3f}]")
sl = [t for t in sorted(by[LOWAT]) if t in by[STATIC]]
def oshare(r):
    per = defaultdict(float)
    for s in r.get("subflows") or []:
        per[s["path"].replace("nat:", "")] += s["bytes"]
    return sum(per.get(p, 0) for p in ("default", "detour3", "detour4", "detour7")) / sum(per.values())
for a, b, name in PAIRS:
    sl = [t for t in sorted(by[a]) if t in by[b]]
    d = [oshare(by[a][t]) - oshare(by[b][t]) for t in sl]
    m, lo, hi = mean_ci(d)
    print(f"  {name.replace(' / ', ' minus ')}, paired per round: mean {m:+.3f} [{lo:+.3f}, {hi:+.3f}]")

# Unsent bytes per subflow (ss samples, 1 s) during each trial's transfer:
# the limit's check (no subflow of a limited trial should hold more than
# ~0.16 MB unsent).
nf = os.path.join(here, "notsent.txt")
if os.path.exists(nf):
    samples = []
    for l in open(nf):
        p = l.split()
        if len(p) == 4:
            samples.append((datetime.fromisoformat(p[0].rstrip("Z")), p[1], int(p[3])))
    samples.sort()
    print("\n## unsent bytes per subflow during the transfer (ss, 1 s samples, client namespace; MB)")
    print("| arm | rounds with samples | samples | median | 99th pct | max | max per round |")
    print("|---|---:|---:|---:|---:|---:|---|")
    import bisect
    times = [s[0] for s in samples]
    for c, name in [(ORACLE, "oracle subset")] + ARMS[:3]:
        if c not in by:
            continue
        vals, per = [], []
        for t in sorted(by[c]):
            r = by[c][t]
            t0 = datetime.fromisoformat(r["start"][:26].rstrip("Z"))
            locs = {s["local"] for s in r.get("subflows") or []}
            i, j = bisect.bisect_left(times, t0), bisect.bisect_right(times, t0 + timedelta(seconds=15))
            v = [s[2] for s in samples[i:j] if s[1] in locs]
            if v:
                vals += v
                per.append(max(v))
        if vals:
            vals.sort()
            print(f"| {name} | {len(per)} | {len(vals)} | {st.median(vals)/1e6:.3f} | {vals[int(0.99*(len(vals)-1))]/1e6:.3f} | "
                  f"{max(vals)/1e6:.3f} | {', '.join(f'{x/1e6:.2f}' for x in per)} |")

    print("\nunsent per path (MB): median / max over the samples of all rounds")
    for c, name in [(ORACLE, "oracle subset")] + ARMS[:3]:
        per = defaultdict(list)
        for t in sorted(by[c]):
            r = by[c][t]
            t0 = datetime.fromisoformat(r["start"][:26].rstrip("Z"))
            path = {s["local"]: s["path"].replace("nat:", "") for s in r.get("subflows") or []}
            i, j = bisect.bisect_left(times, t0), bisect.bisect_right(times, t0 + timedelta(seconds=15))
            for s in samples[i:j]:
                if s[1] in path:
                    per[path[s[1]]].append(s[2])
        print(f"  {name}: " + ", ".join(f"{p} {st.median(v)/1e6:.2f}/{max(v)/1e6:.2f}" for p, v in sorted(per.items())))

# The limits in the agents' logs: the "subflow lowat on" line (the scaled one
# says "scaled to the subflows' RTTs"), and no "off"/"refused"/"not set"/"not
# rescaled" warning.
print("\n## the limits in the agent logs")
for c in (LOWAT, RTT):
    on = scaled = warn = 0
    n = 0
    for t in rounds:
        lp = os.path.join(here, "agent-logs", f"round{t}", f"{c}.agent.log")
        if not os.path.isfile(lp):
            continue
        n += 1
        txt = open(lp, errors="replace").read()
        on += "subflow lowat on" in txt
        scaled += "scaled to the subflows' RTTs" in txt
        warn += len(re.findall(r"subflow lowat (off|refused|not set|not removed|not rescaled)", txt))
    print(f"{c}: {n} agent logs; {on} with 'subflow lowat on', {scaled} of them scaled to the RTTs; "
          f"{warn} off/refused/not-set/not-rescaled warnings")

# Before the last third, derived (approximate): bytes of the goodput window
# minus the last third's (rate x 5 s), over the rest of the window. Not a bench
# output; only to locate where static + limit and static differ.
print("\n## before the last third (derived: (window bytes - tail rate x 5 s) / (window_s - 5 s); approximate)")
def early(r):
    return (r["window_bytes"] * 8 / 1e6 - r["tail_mbps"] * 5) / (r["window_s"] - 5)
o = by[ORACLE]
for c, name in ARMS[:3]:
    rat = [early(by[c][t]) / early(o[t]) for t in sorted(by[c])]
    g, lo, hi = interval(rat)
    print(f"  {name} / oracle: mean {st.mean(early(x) for x in by[c].values()):.2f} Mbit/s; paired {g:.3f} [{lo:.3f}, {hi:.3f}]")
for a, b, name in PAIRS:
    rat = [early(by[a][t]) / early(by[b][t]) for t in sorted(by[a]) if t in by[b]]
    g, lo, hi = interval(rat)
    print(f"  {name}: paired {g:.3f} [{lo:.3f}, {hi:.3f}]; above 1 in {sum(x > 1 for x in rat)} of {len(rat)}")
