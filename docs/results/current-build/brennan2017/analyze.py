#!/usr/bin/env python3
"""Tables of README.md from trials.jsonl (this directory) and the 2026-11-22
run (../../brennan2017/trials.jsonl).

Per configuration and detour kind (NAT, tunnel), MPTCP with the default
policy (mptcp-nat, mptcp-tunnel) against the issue-26 target of that
configuration, paired by round (--interleave: round n ran trial n of every
cell): the per-round ratio, the ratio of the run's means, and the mean of
the per-round ratios with a Student t 95 % interval over rounds.

- best: the better single path of the pair (TCP on the default path, TCP
  through that detour), chosen by the run's means; each round's ratio uses
  that procedure's trial of the same round.
- sum: TCP on the default path + TCP through that detour, same round.
mptcp-1sf (MPTCP over the default path alone, no agent) is given against
the same reference, so that MPTCP's own cost on the default path is beside
the detour's effect."""
import sys, json, math, os, statistics as st
from collections import defaultdict

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tools"))
from tint import tint  # noqa: E402  (docs/results/tools/tint.py)


def load(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return rows, [r for r in rows if r.get("status") == "ok"]


rows, ok = load(os.path.join(here, "trials.jsonl"))
_, old = load(os.path.join(here, "../../brennan2017/trials.jsonl"))
g = defaultdict(dict)
for r in ok:
    g[(r["configuration"], r["procedure"])][r["trial"]] = r["goodput_mbps"]
og = defaultdict(list)
for r in old:
    og[(r["configuration"], r["procedure"])].append(r["goodput_mbps"])

CONFIGS = ["symmetric", "symmetric-loss1", "symmetric-delay100", "core-limited", "core-limited-delay100", "core-limited-loss1"]
LABEL = {"symmetric": "Symmetric", "symmetric-loss1": "Symmetric, 1 % loss", "symmetric-delay100": "Symmetric, 100 ms",
         "core-limited": "Core-limited", "core-limited-loss1": "Core-limited, 1 % loss", "core-limited-delay100": "Core-limited, 100 ms"}
PROCS = ["tcp", "tcp-nat", "tcp-tunnel", "mptcp-1sf", "mptcp-nat", "mptcp-tunnel"]
TARGETS = [  # (title, configurations, ratio, min, strict-above check)
    ("MPTCP >= 0.98 x the best single path where the detour cannot add capacity (symmetric: the default path and the detour share the client's 10 Mbit/s access link)",
     ["symmetric", "symmetric-loss1", "symmetric-delay100"], "best", 0.98),
    ("MPTCP >= 0.97 of the single-path sum, core-limited", ["core-limited"], "sum", 0.97),
    ("One of two disjoint paths long but clean (core-limited, 100 ms each way on L2: default-path RTT 230 ms): MPTCP >= 0.9 of the sum",
     ["core-limited-delay100"], "sum", 0.9),
    ("One path lossy (1 % on L2, the default path): MPTCP >= the best single path, and more than it when the lossy path carries anything alone",
     ["core-limited-loss1", "symmetric-loss1"], "best", 1.0),
]


def mean(c, p, src=g):
    v = list(src[(c, p)].values()) if src is g else src[(c, p)]
    return st.mean(v) if v else float("nan")



loads = [r["loadavg_1m"] for r in ok]
print(f"trials: {len(rows)}, ok {len(ok)}; rounds complete: "
      f"{min(len(g[(c, p)]) for c in CONFIGS for p in PROCS)}; 1-min load at trial ends: "
      f"min {min(loads):.2f}, median {st.median(loads):.2f}, max {max(loads):.2f}")
print(f"builds: {sorted({r['versions']['mpdetour'] for r in ok})}; kernel {sorted({r['versions']['kernel'] for r in ok})}")
print(f"first trial {min(r['start'] for r in ok)}, last {max(r['start'] for r in ok)}")

# 1-min load sampled every 30 s (load.txt) while a chunk held the lock (run-log.txt)
import re
wins, t0 = [], None
for l in open(os.path.join(here, "run-log.txt")):
    m = re.match(r"measure: slot \d, (\d\d:\d\d:\d\d)", l)
    if m:
        t0 = m.group(1)
    m = re.match(r"measure: slot \d released (\d\d:\d\d:\d\d) rc=0", l)
    if m and t0:
        wins.append((t0, m.group(1)))
samples = []
for l in open(os.path.join(here, "load.txt")):
    ts, l1 = l.split()[0][11:19], float(l.split()[1])
    if any(a <= ts <= b for a, b in wins):
        samples.append(l1)
print(f"chunks: {len(wins)} ({', '.join(f'{a}-{b}' for a, b in wins)} UTC); 1-min load sampled every 30 s while measuring: "
      f"n {len(samples)}, median {st.median(samples):.2f}, max {max(samples):.2f}")

print("\n## Goodput, Mbit/s: mean (sd), n; 2026-11-22 run (10 trials, not interleaved) in brackets\n")
print("| configuration | " + " | ".join(PROCS) + " |")
print("|---|" + "---:|" * len(PROCS))
for c in CONFIGS:
    cells = []
    for p in PROCS:
        v = list(g[(c, p)].values())
        sd = st.stdev(v) if len(v) > 1 else 0
        cells.append(f"{st.mean(v):.2f} ({sd:.2f}) n={len(v)} [{mean(c, p, og):.2f}]" if v else "-")
    print(f"| {LABEL[c]} | " + " | ".join(cells) + " |")

print("\n## mptcp-1sf: MPTCP over the default path alone / TCP on the default path, paired by round\n")
print("| configuration | per round | ratio of means | mean of rounds [95 % t] | 2026-11-22 |")
print("|---|---|---:|---|---:|")
for c in CONFIGS:
    rs = sorted(set(g[(c, "mptcp-1sf")]) & set(g[(c, "tcp")]))
    x = [g[(c, "mptcp-1sf")][t] / g[(c, "tcp")][t] for t in rs]
    if not x:
        continue
    m, lo, hi = tint(x)
    print(f"| {LABEL[c]} | {', '.join(f'{v:.3f}' for v in x)} | {mean(c, 'mptcp-1sf') / mean(c, 'tcp'):.3f} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {mean(c, 'mptcp-1sf', og) / mean(c, 'tcp', og):.3f} |")

for title, cs, kind, target in TARGETS:
    print(f"\n## {title}\n")
    print("| configuration | detour | reference (this run's means) | MPTCP / reference per round | ratio of means | mean of rounds [95 % t] | met? | mptcp-1sf / reference (ratio of means) | MPTCP / mptcp-1sf [95 % t] | 2026-11-22 ratio of means |")
    print("|---|---|---|---|---:|---|---|---:|---|---:|")
    for c in cs:
        for k in ["nat", "tunnel"]:
            mp, tk = f"mptcp-{k}", f"tcp-{k}"
            if not g[(c, mp)]:
                continue
            rs = sorted(set(g[(c, mp)]) & set(g[(c, "tcp")]) & set(g[(c, tk)]) & set(g[(c, "mptcp-1sf")]))
            if kind == "best":
                bp = max(["tcp", tk], key=lambda p: mean(c, p))
                ref = lambda t, src=g: src[(c, bp)][t]
                refm = mean(c, bp)
                refs = f"best = {bp} {refm:.2f}"
                obp = max(["tcp", tk], key=lambda p: mean(c, p, og))
                oldr = mean(c, mp, og) / mean(c, obp, og)
            else:
                ref = lambda t: g[(c, "tcp")][t] + g[(c, tk)][t]
                refm = mean(c, "tcp") + mean(c, tk)
                refs = f"sum = {mean(c, 'tcp'):.2f} + {mean(c, tk):.2f}"
                oldr = mean(c, mp, og) / (mean(c, "tcp", og) + mean(c, tk, og))
            x = [g[(c, mp)][t] / ref(t) for t in rs]
            m, lo, hi = tint(x)
            rm = mean(c, mp) / refm
            met = "met" if rm >= target else "**missed**"
            if lo >= target:
                met += " (interval above)"
            elif hi < target:
                met += " (interval below)"
            else:
                met += " (interval spans target)"
            if kind == "best" and target == 1.0:
                met += "; more than best: " + ("yes (interval above 1)" if lo > 1 else "not shown")
            l1 = [math.log(g[(c, mp)][t] / g[(c, "mptcp-1sf")][t]) for t in rs]
            lm, llo, lhi = tint(l1)
            print(f"| {LABEL[c]} | {k} | {refs} | {', '.join(f'{v:.3f}' for v in x)} | {rm:.3f} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {met} | "
                  f"{mean(c, 'mptcp-1sf') / refm:.3f} | {math.exp(lm):.3f} [{math.exp(llo):.3f}, {math.exp(lhi):.3f}] | {oldr:.3f} |")

print("\n## Per subflow: means over trials (MB acknowledged in the goodput window, smoothed RTT ms at the end, retransmitted segments)\n")
print("| configuration | procedure | default MB | default sRTT | default retrans | detour MB | detour sRTT | detour retrans |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
sub = defaultdict(lambda: defaultdict(list))
for r in ok:
    if r["procedure"] not in ("mptcp-1sf", "mptcp-nat", "mptcp-tunnel"):
        continue
    for sf in r.get("subflows", []):
        w = "d" if sf["path"] == "default" else "x"
        s = sub[(r["configuration"], r["procedure"])]
        s[w + "mb"].append(sf["window_bytes"] / 1e6); s[w + "rtt"].append(sf["rtt_ms"]); s[w + "re"].append(sf["retrans"])
f = lambda v: f"{st.mean(v):.2f}" if v else "-"
for c in CONFIGS:
    for p in ("mptcp-1sf", "mptcp-nat", "mptcp-tunnel"):
        s = sub[(c, p)]
        print(f"| {LABEL[c]} | {p} | {f(s['dmb'])} | {f(s['drtt'])} | {f(s['dre'])} | {f(s['xmb'])} | {f(s['xrtt'])} | {f(s['xre'])} |")
