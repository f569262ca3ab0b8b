#!/usr/bin/env python3
"""The secondary figure of PLAN.md: per point, the default (the limit) / the old default (static
without it) pooled over lowat-fresh's 3 rounds (build 3b0109f4: mptcp-static+lowat / mptcp-static)
and this run's 8 (build b0866b88: mptcp-static / mptcp-static+nolowat), to the last byte and over
the equal window: ratio of the means with a 95 % percentile bootstrap over the rounds (a round's two
arms resampled together, 2000 resamples, seed 1), as the design report computes its per-point
intervals. Run from the repository root."""
import glob, json, random, statistics as st

RUNS = [("docs/results/design/lowat-fresh", "mptcp-static+lowat", "mptcp-static"),
        ("docs/results/design/lowat-fresh-below", "mptcp-static", "mptcp-static+nolowat")]
POINTS = ["p115", "p127", "p189"]

def rounds(key):
    out = {p: [] for p in POINTS}
    for d, new, old in RUNS:
        tr = {}
        for f in glob.glob(d + "/runs/paired*/trials.jsonl"):
            for l in open(f):
                x = json.loads(l)
                if x["configuration"] in POINTS and x["status"] == "ok" and x["cell"] in (new, old):
                    tr[(x["configuration"], x["trial"], x["cell"] == new)] = x[key]
        for (p, t, isnew), v in tr.items():
            if isnew and (p, t, False) in tr:
                out[p].append((v, tr[(p, t, False)], d.rsplit("/", 1)[1]))
    return out

rng = random.Random(1)
for name, key in [("to the last byte", "goodput_mbps"), ("equal window", "equal_goodput_mbps")]:
    print(f"{name}:")
    for p, rs in rounds(key).items():
        r = st.mean(a for a, _, _ in rs) / st.mean(b for _, b, _ in rs)
        bs = []
        for _ in range(2000):
            s = [rng.choice(rs) for _ in rs]
            bs.append(st.mean(a for a, _, _ in s) / st.mean(b for _, b, _ in s))
        bs.sort()
        n = {d: sum(1 for *_, e in rs if e == d) for d in ("lowat-fresh", "lowat-fresh-below")}
        print(f"  {p}: default / old default {r:.3f} [{bs[49]:.3f}, {bs[1949]:.3f}] over {len(rs)} rounds ({n['lowat-fresh']} + {n['lowat-fresh-below']})")
