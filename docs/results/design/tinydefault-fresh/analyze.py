#!/usr/bin/env python3
"""tinydefault-fresh: the plan's decision rule (PLAN.md), from this directory's results.json and
report.md, through ../tinypath-fresh/analyze.py (the same subset figures, sheds from the agents'
policy_log).

    python3 analyze.py [DIR]     (markdown on stdout)

T (tiny-default): the points whose mean tcp-path1 is <= 0.2 x their mean tcp-path2 in this run; N:
the other points. Then the secondary comparison on the plan's 29 model candidates."""
import collections, json, os, statistics as st, subprocess, sys

here = os.path.dirname(os.path.abspath(__file__))
d = sys.argv[1] if len(sys.argv) > 1 else here
G = "mptcp-guard+share15+starveoff+rttoff"
CAND = ("p003 p020 p022 p024 p036 p037 p040 p071 p072 p073 p074 p090 p109 p115 p118 p119 p132 p133 "
        "p134 p135 p136 p140 p141 p143 p172 p177 p181 p182 p200").split()
g = collections.defaultdict(list)
for r in json.load(open(os.path.join(d, "results.json"))):
    if r["status"] == "ok":
        g[(r["point"], r["procedure"])].append(r["goodput_mbps"])
pts = sorted({p for p, _ in g})
ratio = {p: st.mean(g[(p, "tcp-path1")]) / st.mean(g[(p, "tcp-path2")]) for p in pts if g[(p, "tcp-path1")] and g[(p, "tcp-path2")]}
T = [p for p in sorted(ratio) if ratio[p] <= 0.2]
print("## Tiny-default points of this run (mean tcp-path1 <= 0.2 x mean tcp-path2)\n")
print(f"T: {len(T)} points: {' '.join(T) or '-'}; N: {len(ratio) - len(T)}; model candidates that are not in T: "
      f"{' '.join(p for p in CAND if p in ratio and p not in T) or '-'}; others in T: {' '.join(p for p in T if p not in CAND) or '-'}\n")
py = os.path.join(here, "..", "tinypath-fresh", "analyze.py")
for name, first in (("tiny-default", T), ("candidates", CAND)):
    print(f"## {'Decision rule: T against N' if name == 'tiny-default' else 'Secondary: the 29 model candidates against the 11 drawn'}\n")
    out = subprocess.run([sys.executable, py, d, "--arms", G, "--first", f"{name}={','.join(first)}", "--policy-log"],
                         capture_output=True, text=True, check=True).stdout
    print(out)
