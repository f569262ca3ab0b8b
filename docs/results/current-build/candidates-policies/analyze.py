#!/usr/bin/env python3
"""Issue 26 candidates: the policies against the oracle subset, from
trials.jsonl (one interleaved run; round = the record's trial number) and the
agents' logs (agent-logs/roundR/CELL.agent.log).

Oracle = static on the subset detour3 + detour4 + detour7, the best of all 64
subsets in candidates-oracle, forced here and measured in the same rounds.
Per arm and window (goodput from 1 s; the last third, 10-15 s): per-round
values, the mean, the ratio of means to the oracle's mean (the headline, as
candidates-oracle gave it) and, over rounds, the geometric mean of the paired
per-round ratios arm_r / oracle_r with a 95 % t interval (on the logs)."""
import glob, json, math, os, re, statistics as st
from collections import defaultdict
from datetime import datetime

here = os.path.dirname(os.path.abspath(__file__))
rows = [json.loads(l) for l in open(os.path.join(here, "trials.jsonl"))]
ok = [r for r in rows if r.get("status") == "ok"]
by = defaultdict(dict)  # cell -> round -> record
for r in ok:
    by[r["cell"]][r["trial"]] = r
loads = [r["loadavg_1m"] for r in rows if "loadavg_1m" in r]
rounds = sorted({r["trial"] for r in rows})
print(f"trials: {len(rows)}, ok {len(ok)}; cells {len({r['cell'] for r in rows})}; rounds {rounds}; "
      f"1-min load at trial ends min {min(loads):.2f}, median {st.median(loads):.2f}, max {max(loads):.2f}; "
      f"builds {sorted({r['versions']['mpdetour'] for r in rows if 'versions' in r})}")
for r in rows:
    if r.get("status") != "ok" or r.get("reason"):
        print(f"  {r['cell']} round {r['trial']}: {r.get('status')} {r.get('reason', '')[:160]}")

ORACLE = "mptcp-nat-static@detour3+detour4+detour7"
ARMS = [("mptcp-nat-static", "static, all 8 detours (the default)"),
        ("mptcp-nat-adaptive", "adaptive"),
        ("mptcp-nat-guard", "guard (starve 0.5, the default)"),
        ("mptcp-nat-guard-starveoff", "guard, starve 1 (the old rule)"),
        ("mptcp-nat-static-sbd", "static + shared-bottleneck detection"),
        ("mptcp-1sf", "MPTCP, default path alone"),
        ("tcp", "TCP, default path")]
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145}

def interval(ratios):
    logs = [math.log(x) for x in ratios]
    g = math.exp(st.mean(logs))
    if len(logs) < 2:
        return g, float("nan"), float("nan")
    h = T95[len(logs) - 1] * st.stdev(logs) / math.sqrt(len(logs))
    return g, math.exp(st.mean(logs) - h), math.exp(st.mean(logs) + h)

for f, label in [("goodput_mbps", "overall (goodput from 1 s)"), ("tail_mbps", "last third (10-15 s)")]:
    o = by[ORACLE]
    orc = st.mean(x[f] for x in o.values())
    print(f"\n## {label}")
    print(f"oracle (detour3+detour4+detour7 forced): per round {', '.join(f'{o[t][f]:.2f}' for t in sorted(o))}; mean {orc:.2f} Mbit/s")
    print("| arm | per round | mean | mean / oracle mean | paired per-round ratio: geo. mean [95 % interval] | min-max | rounds >= 0.9 |")
    print("|---|---|---:|---:|---|---|---:|")
    for c, name in ARMS:
        if c not in by:
            continue
        m = st.mean(x[f] for x in by[c].values())
        common = [t for t in sorted(by[c]) if t in o]
        rat = [by[c][t][f] / o[t][f] for t in common]
        g, lo, hi = interval(rat)
        print(f"| {name} | {', '.join(f'{by[c][t][f]:.2f}' for t in sorted(by[c]))} | {m:.2f} | {m/orc:.3f} | "
              f"{g:.3f} [{lo:.3f}, {hi:.3f}] | {min(rat):.3f}-{max(rat):.3f} | {sum(x >= 0.9 for x in rat)} of {len(rat)} |")
    singles = [c for c in sorted(by) if c.startswith("tcp-nat@")]
    print("single paths (TCP through each detour), mean: " + ", ".join(
        f"{c.split('@')[1]} {st.mean(x[f] for x in by[c].values()):.2f}" for c in singles))

# Per-subflow bytes at the end of each trial (the sender's kernel).
print("\n## subflows at the end of the transfer (MB acknowledged; paths absent were closed)")
for c, name in ARMS[:5] + [(ORACLE, "oracle subset")]:
    if c not in by:
        continue
    for t in sorted(by[c]):
        sf = by[c][t].get("subflows") or []
        print(f"{c} r{t}: " + ", ".join(f"{s['path'].replace('nat:', '')} {s['bytes']/1e6:.1f}" for s in sf))

# What the agents did: guard's sheds and the shared-bottleneck rule, from
# their logs, in seconds after the trial's start.
print("\n## agent decisions (agent logs)")
addr = {}  # relay NAT address -> detour, from the records' subflow remotes
for r in ok:
    for s in r.get("subflows") or []:
        if s["path"].startswith("nat:"):
            addr[s["remote"].rsplit(":", 1)[0]] = s["path"][4:]
def name(p):
    for a, d in addr.items():
        if a in p:
            return d
    return p
tally = defaultdict(lambda: defaultdict(list))
logged = defaultdict(int)
for c, _ in ARMS[:5]:
    for t in rounds:
        lp = os.path.join(here, "agent-logs", f"round{t}", f"{c}.agent.log")
        if not os.path.exists(lp):
            print(f"{c} r{t}: no log")
            continue
        start = by[c][t]["start"] if t in by[c] else None
        t0 = datetime.fromisoformat(start[:26].rstrip("Z")) if start else None
        evs = []
        for line in open(lp):
            m = re.search(r'time=(\S+) level=(\w+) msg="([^"]*)"', line)
            if not m or not ("shed" in m.group(3) or "shared bottleneck" in m.group(3) or m.group(2) in ("WARN", "ERROR")):
                continue
            ts = datetime.fromisoformat(m.group(1)[:23].rstrip("Z"))
            at = f"{(ts - t0).total_seconds():.1f} s" if t0 else "?"
            p = re.search(r' path="?([^"]*?)"? (?:why|kept|top)=', line)
            extra = ""
            if "shed" in m.group(3):
                w = re.search(r'why="([^"]*)"', line)
                extra = f" ({w.group(1)})" if w else ""
            elif "shared" in m.group(3):
                k = re.search(r' kept="?([^" ]*)', line)
                extra = f" (kept {name(k.group(1)) if k else '?'})"
            evs.append(f"{at} {m.group(2)} {m.group(3)}: {name(p.group(1)) if p else ''}{extra}")
            if t0 and p:
                # the transfer lasts 15 s from the trial's start; later
                # decisions come while the connection closes
                sec = (ts - t0).total_seconds()
                tally[c][name(p.group(1)) + ("" if sec <= 15 else " (after the transfer)")].append(sec)
        print(f"{c} r{t}: " + ("; ".join(evs) if evs else "nothing shed or taken out"))
        logged[c] += 1

print("\n## per arm: how often each path was shed / taken out (rounds with a log), seconds after the start")
for c, _ in ARMS[:5]:
    if not tally[c]:
        print(f"{c}: nothing in {logged[c]} logged rounds")
        continue
    print(f"{c} ({logged[c]} logged rounds): " + "; ".join(
        f"{p} {len(v)}x (at {min(v):.1f}-{max(v):.1f} s)" for p, v in sorted(tally[c].items())))
