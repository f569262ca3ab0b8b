#!/usr/bin/env python3
"""brennan2017-lowat: issue 26's brennan2017 targets for the new default (mptcp-nat, mptcp-tunnel:
static + the per-subflow unsent limit) and the old default beside it in the same interleaved run
(mptcp-nat-static-nolowat, mptcp-tunnel-static-nolowat), from trials.jsonl in DIR (default: this
file's directory). The targets and references are ../brennan2017/analyze.py's: "best" is the
better of TCP on the default path and TCP through that detour by the run's means, "sum" their sum
in the same round; a target is met or missed on the ratio of means, with the mean of the per-round
ratios and its Student t 95 % interval beside. new / old is paired per round (geometric mean, t
interval on the logs).

    python3 analyze.py [DIR]      (markdown on stdout)
"""
import json, math, os, statistics as st, sys
from collections import defaultdict

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tools"))
from tint import tint  # noqa: E402  (docs/results/tools/tint.py)
rows = [json.loads(l) for l in open(os.path.join(here, "trials.jsonl")) if l.strip()]
ok = [r for r in rows if r.get("status") == "ok"]
g = defaultdict(dict)
for r in ok:
    g[(r["configuration"], r["procedure"])][r["trial"]] = r["goodput_mbps"]
CONFIGS = ["symmetric", "symmetric-loss1", "symmetric-delay100", "core-limited", "core-limited-delay100", "core-limited-loss1"]
PROCS = ["tcp", "tcp-nat", "tcp-tunnel", "mptcp-1sf", "mptcp-nat", "mptcp-nat-static-nolowat", "mptcp-tunnel", "mptcp-tunnel-static-nolowat"]
TARGETS = [("symmetric", "best", 0.98), ("symmetric-loss1", "best", 0.98), ("symmetric-delay100", "best", 0.98),
           ("core-limited", "sum", 0.97), ("core-limited-delay100", "sum", 0.9),
           ("core-limited-loss1", "best", 1.0), ("symmetric-loss1", "best", 1.0)]


def mean(c, p):
    v = list(g[(c, p)].values())
    return st.mean(v) if v else float("nan")



loads = [r["loadavg_1m"] for r in ok]
print(f"trials {len(rows)}, ok {len(ok)}; rounds complete {min(len(g[(c, p)]) for c in CONFIGS for p in PROCS)}; "
      f"builds {sorted({r['versions']['mpdetour'] for r in ok})}; 1-min load at trial ends: min {min(loads):.2f}, "
      f"median {st.median(loads):.2f}, max {max(loads):.2f}; first trial {min(r['start'] for r in ok)}, last {max(r['start'] for r in ok)}\n")
print("## Goodput, Mbit/s: mean (sd), n\n")
print("| configuration | " + " | ".join(PROCS) + " |")
print("|---|" + "---:|" * len(PROCS))
for c in CONFIGS:
    cells = [f"{mean(c, p):.2f} ({st.stdev(g[(c, p)].values()) if len(g[(c, p)]) > 1 else 0:.2f}) n={len(g[(c, p)])}" for p in PROCS]
    print(f"| {c} | " + " | ".join(cells) + " |")
print("\n## Issue 26 targets: new default (the limit) and old default (subflow_lowat: 0), same run\n")
print("| configuration | detour | target | reference | new: ratio of means | new: mean of rounds [95 % t] | new | old: ratio of means | old: mean of rounds [95 % t] | old | new / old paired [95 % t] |")
print("|---|---|---|---|---:|---|---|---:|---|---|---|")
for c, kind, target in TARGETS:
    for k in ("nat", "tunnel"):
        tk, new, old = f"tcp-{k}", f"mptcp-{k}", f"mptcp-{k}-static-nolowat"
        rs = sorted(set(g[(c, new)]) & set(g[(c, old)]) & set(g[(c, "tcp")]) & set(g[(c, tk)]))
        if not rs:
            continue
        if kind == "best":
            bp = max(["tcp", tk], key=lambda p: mean(c, p))
            ref, refm, refs = (lambda t: g[(c, bp)][t]), mean(c, bp), f"best = {bp} {mean(c, bp):.2f}"
        else:
            ref = lambda t: g[(c, "tcp")][t] + g[(c, tk)][t]
            refm, refs = mean(c, "tcp") + mean(c, tk), f"sum = {mean(c, 'tcp'):.2f} + {mean(c, tk):.2f}"
        cols = []
        for arm in (new, old):
            m, lo, hi = tint([g[(c, arm)][t] / ref(t) for t in rs])
            rm = mean(c, arm) / refm
            v = "met" if rm >= target else "**missed**"
            v += " (interval above)" if lo >= target else " (interval below)" if hi < target else " (interval spans)"
            if kind == "best" and target == 1.0:
                v += "; more than best: " + ("yes" if lo > 1 else "not shown")
            cols += [f"{rm:.3f}", f"{m:.3f} [{lo:.3f}, {hi:.3f}]", v]
        lm, llo, lhi = tint([math.log(g[(c, new)][t] / g[(c, old)][t]) for t in rs])
        print(f"| {c} | {k} | {target} x {kind} | {refs} | " + " | ".join(cols) + f" | {math.exp(lm):.3f} [{math.exp(llo):.3f}, {math.exp(lhi):.3f}] |")
