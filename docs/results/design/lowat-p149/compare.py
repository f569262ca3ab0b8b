#!/usr/bin/env python3
# Per point and procedure from trials.jsonl: goodput mean with a bootstrap 95 % interval of the
# mean, and the ratio of its mean to mptcp-static's mean with a paired bootstrap interval
# (rounds resampled together: trial k of every procedure ran in the same round), plus each
# round's ratio; both goodput windows (to the last byte, equal window 1-10 s).
# usage: [BASE=CELL] compare.py TRIALS.jsonl [TRIALS.jsonl ...]
# BASE (default mptcp-static) is the procedure the ratios are taken to.
import collections, json, os, random, statistics, sys
BASE = os.environ.get("BASE", "mptcp-static")
g = collections.defaultdict(dict)  # (point, window) -> {(cell, trial): goodput}
for fn in sys.argv[1:]:
    for l in open(fn):
        t = json.loads(l)
        if t.get("status") != "ok":
            continue
        for w, k in (("last byte", "goodput_mbps"), ("equal window", "equal_goodput_mbps")):
            g[(t["configuration"], w)][(t["cell"], t["trial"])] = t[k]
rng = random.Random(1)
B = 4000
def q(v):
    v = sorted(v)
    return v[int(0.025 * len(v))], v[int(0.975 * len(v)) - 1]
for (pt, w) in sorted(g):
    d = g[(pt, w)]
    cells = sorted({c for c, _ in d}, key=lambda c: (not c.startswith("tcp"), c != "mptcp-static", len(c), c))
    rounds = sorted({k for _, k in d})
    print(f"\n{pt}, {w}: {len(rounds)} rounds\n")
    base = "static" if BASE == "mptcp-static" else BASE
    print("| procedure | n | mean, Mbit/s [95 %] | / " + base + ", ratio of means [95 %, paired] | per round / " + base + " |")
    print("|---|---:|---:|---:|---|")
    for c in cells:
        v = [d[(c, k)] for k in rounds if (c, k) in d]
        mean = statistics.mean(v)
        bs = [statistics.mean(rng.choices(v, k=len(v))) for _ in range(B)]
        lo, hi = q(bs)
        rs = "-"; per = "-"
        if c != BASE and not c.startswith("tcp"):
            ks = [k for k in rounds if (c, k) in d and (BASE, k) in d]
            if not ks:
                print(f"| {c} | {len(v)} | {mean:.2f} [{lo:.2f}, {hi:.2f}] | - | - |")
                continue
            ratio = statistics.mean(d[(c, k)] for k in ks) / statistics.mean(d[(BASE, k)] for k in ks)
            bb = []
            for _ in range(B):
                s = rng.choices(ks, k=len(ks))
                bb.append(sum(d[(c, k)] for k in s) / sum(d[(BASE, k)] for k in s))
            a, b = q(bb)
            mark = " **below**" if b < 1 else (" **above**" if a > 1 else "")
            rs = f"{ratio:.2f} [{a:.2f}, {b:.2f}]{mark}"
            per = ", ".join(f"{d[(c, k)] / d[(BASE, k)]:.2f}" for k in ks)
        print(f"| {c} | {len(v)} | {mean:.2f} [{lo:.2f}, {hi:.2f}] | {rs} | {per} |")
