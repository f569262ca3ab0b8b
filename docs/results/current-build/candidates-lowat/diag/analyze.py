#!/usr/bin/env python3
"""Diagnostic run beside candidates-lowat: static and static + limit only, alternating order,
with the client's subflows sampled every 0.5 s (acked.txt: bytes_acked, notsent). Per trial and
window (1-8 s, 8-10 s, 10-15 s after the trial's start; detour8 dies at 8 s), the Mbit/s each
path's subflows got acknowledged (the sender's view; sample times are the sampler's, +-0.5 s)."""
import bisect, json, math, os, statistics as st
from collections import defaultdict
from datetime import datetime, timedelta

here = os.path.dirname(os.path.abspath(__file__))
rows = [json.loads(l) for l in open(os.path.join(here, "trials.jsonl")) if json.loads(l).get("status") == "ok"]
samp = defaultdict(list)  # local -> [(time, acked, notsent)]
remote = {}  # local -> path, from the peer address: 10.1.N.2 is detourN's relay, 10.0.3.2 the server
for l in open(os.path.join(here, "acked.txt")):
    p = l.split()
    if len(p) == 5:
        samp[p[1]].append((datetime.fromisoformat(p[0].rstrip("Z")), int(p[3]), int(p[4])))
        ip = p[2].rsplit(":", 1)[0]
        remote[p[1]] = "default" if ip == "10.0.3.2" else ("detour" + ip.split(".")[2] if ip.startswith("10.1.") else ip)
def subflows_of(r):
    # every subflow sampled during the trial (the records list only the subflows present at the
    # end: detour8's first subflow, closed after it dies at 8 s, is not in them)
    t0 = datetime.fromisoformat(r["start"][:26].rstrip("Z"))
    return [(loc, remote[loc]) for loc, v in samp.items()
            if any(t0 <= x[0] <= t0 + timedelta(seconds=16) for x in v) and remote.get(loc, "").startswith(("default", "detour"))]
for v in samp.values():
    v.sort()
def acked_at(local, t):
    v = samp.get(local, [])
    i = bisect.bisect_right([x[0] for x in v], t) - 1
    return v[i][1] if i >= 0 else 0
T95 = {5: 2.571, 7: 2.365, 9: 2.262, 11: 2.201, 13: 2.160, 15: 2.131}
WIN = [(1, 8), (8, 10), (10, 15)]
paths = ["default"] + [f"detour{i}" for i in range(1, 9)]
res = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))  # cell -> window -> path -> [Mbit/s]
tot = defaultdict(lambda: defaultdict(dict))  # cell -> window -> round -> Mbit/s
rows.sort(key=lambda r: r["trial"])
for r in rows:
    t0 = datetime.fromisoformat(r["start"][:26].rstrip("Z"))
    per = defaultdict(lambda: [0.0] * len(WIN))
    for loc, p in subflows_of(r):
        for k, (a, b) in enumerate(WIN):
            d = acked_at(loc, t0 + timedelta(seconds=b)) - acked_at(loc, t0 + timedelta(seconds=a))
            per[p][k] += d * 8 / 1e6 / (b - a)
    for k in range(len(WIN)):
        for p in paths:
            res[r["cell"]][k][p].append(per[p][k] if p in per else 0.0)
        tot[r["cell"]][k][r["trial"]] = sum(per[p][k] for p in per)
print(f"trials ok: {len(rows)}; rounds {sorted({r['trial'] for r in rows})}; load at trial ends "
      + ", ".join(f"{r['loadavg_1m']:.2f}" for r in rows))
for k, (a, b) in enumerate(WIN):
    print(f"\n## {a}-{b} s: acknowledged Mbit/s per path, mean over rounds")
    print("| cell | total | " + " | ".join(paths) + " |")
    print("|---|---:|" + "---:|" * len(paths))
    for c in sorted(res):
        print(f"| {c} | {st.mean(tot[c][k].values()):.2f} | " + " | ".join(f"{st.mean(res[c][k][p]):.2f}" for p in paths) + " |")
    common = sorted(set(tot["mptcp-nat-static"][k]) & set(tot["mptcp-nat-static-lowat"][k]))
    rat = [tot["mptcp-nat-static-lowat"][k][t] / tot["mptcp-nat-static"][k][t] for t in common]
    lg = [math.log(x) for x in rat]
    h = T95[len(lg) - 1] * st.stdev(lg) / math.sqrt(len(lg))
    print("static + limit / static per round: " + ", ".join(f"{x:.3f}" for x in rat)
          + f"; geo. mean {math.exp(st.mean(lg)):.3f} [{math.exp(st.mean(lg) - h):.3f}, {math.exp(st.mean(lg) + h):.3f}]")
    for p in ("default", "detour3", "detour4", "detour7"):
        rs = sorted({r["trial"] for r in rows})
        d = [res["mptcp-nat-static-lowat"][k][p][i] - res["mptcp-nat-static"][k][p][i] for i in range(min(len(res["mptcp-nat-static-lowat"][k][p]), len(res["mptcp-nat-static"][k][p])))]
        h = T95[len(d) - 1] * st.stdev(d) / math.sqrt(len(d))
        print(f"  {p}: static + limit minus static {st.mean(d):+.2f} [{st.mean(d) - h:+.2f}, {st.mean(d) + h:+.2f}] Mbit/s")
for c in ["mptcp-nat-static", "mptcp-nat-static-lowat"]:
    print(f"\n{c}: goodput overall / last third per round: " + ", ".join(
        f"r{r['trial']} {r['goodput_mbps']:.2f}/{r['tail_mbps']:.2f}" for r in sorted(rows, key=lambda r: r['trial']) if r['cell'] == c))

# How often a path's subflow had nothing unsent (notsent 0 in a 0.5 s sample) and its median
# unsent, per window: a subflow with nothing unsent can send only what the MPTCP socket pushes next.
print("\n## share of samples with nothing unsent / median unsent (KB), per path and window")
dry = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
for r in rows:
    t0 = datetime.fromisoformat(r["start"][:26].rstrip("Z"))
    for loc, p in subflows_of(r):
        for (t, a, n) in samp.get(loc, []):
            sec = (t - t0).total_seconds()
            for k, (a0, b0) in enumerate(WIN):
                if a0 <= sec < b0:
                    dry[r["cell"]][k][p].append(n)
for k, (a, b) in enumerate(WIN):
    print(f"{a}-{b} s:")
    for c in sorted(dry):
        print(f"  {c}: " + ", ".join(f"{p} {sum(x == 0 for x in v)/len(v):.2f}/{st.median(v)/1e3:.0f}" for p, v in sorted(dry[c][k].items()) if p in ("default", "detour3", "detour4", "detour7")))

print("\n## receiver's goodput (the bench's windows): static + limit / static, paired per round")
for f in ("goodput_mbps", "tail_mbps"):
    a = {r["trial"]: r[f] for r in rows if r["cell"] == "mptcp-nat-static-lowat"}
    b = {r["trial"]: r[f] for r in rows if r["cell"] == "mptcp-nat-static"}
    lg = [math.log(a[t] / b[t]) for t in sorted(a) if t in b]
    h = T95[len(lg) - 1] * st.stdev(lg) / math.sqrt(len(lg))
    print(f"  {f}: means {st.mean(a.values()):.2f} / {st.mean(b.values()):.2f} Mbit/s; geo. mean {math.exp(st.mean(lg)):.3f} "
          f"[{math.exp(st.mean(lg) - h):.3f}, {math.exp(st.mean(lg) + h):.3f}] ({len(lg)} rounds)")
