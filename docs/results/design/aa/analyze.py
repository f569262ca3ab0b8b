#!/usr/bin/env python3
"""A/A analysis of paired design runs (docs/results/design/aa).

For each run directory given: the no-op ratio B / A (default
mptcp-static+stale4 / mptcp-static), per point as the ratio of the means,
its geometric mean over points, and the mean log ratio over all (point,
round) pairs with a bootstrap 95 % interval over those pairs (seeded);
then the carry-over check: every ok trial's goodput divided by the mean of
its procedure at its point, grouped by the procedure that ran directly
before it at that point (reconstructed from the trials' start times).

usage: analyze.py [--a mptcp-static] [--b mptcp-static+stale4] RUN_DIR...
"""
import argparse, collections, json, math, os, random, statistics


def load(d):
    p = os.path.join(d, "runs", "paired", "trials.jsonl")
    if not os.path.exists(p):
        p = os.path.join(d, "trials.jsonl")
    recs = [json.loads(l) for l in open(p) if l.strip()]
    return [r for r in recs if r.get("status") == "ok"]


def boot(v, f, n=10000, seed=1):
    rng = random.Random(seed)
    s = sorted(f([rng.choice(v) for _ in v]) for _ in range(n))
    return s[int(0.025 * n)], s[int(0.975 * n) - 1]


T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131]


def tci(logs):
    """95 % Student t interval of the mean of logs, as ratios."""
    n = len(logs)
    if n < 2:
        return float("nan"), float("nan")
    m, se = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(n)
    t = T975[n - 2] if n - 2 < len(T975) else 1.96
    return math.exp(m - t * se), math.exp(m + t * se)


def gm(v):
    return math.exp(statistics.fmean(math.log(x) for x in v))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", default="mptcp-static")
    ap.add_argument("--b", default="mptcp-static+stale4")
    ap.add_argument("dirs", nargs="+")
    o = ap.parse_args()
    for d in o.dirs:
        recs = load(d)
        by = collections.defaultdict(list)
        for r in recs:
            by[(r["configuration"], r["cell"])].append(r)
        pts = sorted({r["configuration"] for r in recs})
        print(f"## {d}: {len(recs)} ok trials, {len(pts)} points, load (1-min) "
              f"min {min(r['loadavg_1m'] for r in recs):.2f} median {statistics.median(r['loadavg_1m'] for r in recs):.2f} "
              f"max {max(r['loadavg_1m'] for r in recs):.2f}, build {recs[0]['versions'].get('mpdetour-lab', '?')}")
        per_point, pairs = [], []
        for p in pts:
            a = {r["trial"]: r["goodput_mbps"] for r in by[(p, o.a)]}
            b = {r["trial"]: r["goodput_mbps"] for r in by[(p, o.b)]}
            if not a or not b:
                continue
            ratio = statistics.fmean(b.values()) / statistics.fmean(a.values())
            rounds = [b[t] / a[t] for t in sorted(a) if t in b]
            pairs += [math.log(x) for x in rounds]
            per_point.append(ratio)
            print(f"  {p}: {o.b} / {o.a} = {ratio:.3f} (rounds: {', '.join(f'{x:.3f}' for x in rounds)})")
        if per_point:
            lo, hi = boot(per_point, gm)
            tl, th = tci([math.log(x) for x in per_point])
            print(f"  geometric mean over points: {gm(per_point):.3f}, 95 % t interval [{tl:.3f}, {th:.3f}] "
                  f"(the report's since this check); percentile bootstrap over points [{lo:.3f}, {hi:.3f}] (the report's before)")
        if pairs:
            m = statistics.fmean(pairs)
            tl, th = tci(pairs)
            sd = statistics.stdev(pairs) if len(pairs) > 1 else float("nan")
            print(f"  over {len(pairs)} (point, round) pairs: {math.exp(m):.3f}, 95 % t interval [{tl:.3f}, {th:.3f}]; "
                  f"sd of the log ratio {sd:.3f}")
        # Carry-over: normalised goodput by predecessor.
        mean = {k: statistics.fmean(r["goodput_mbps"] for r in v) for k, v in by.items() if v}
        seq = collections.defaultdict(list)
        for r in recs:
            seq[r["configuration"]].append(r)
        groups = collections.defaultdict(list)
        for p, v in seq.items():
            v.sort(key=lambda r: r["start"])
            prev = "(first)"
            for r in v:
                groups[(r["cell"], prev)].append(r["goodput_mbps"] / mean[(p, r["cell"])])
                prev = r["cell"]
        print(f"  carry-over: goodput / its procedure's mean at the point, by the procedure run just before")
        for cell in sorted({k[0] for k in groups}):
            row = [f"after {prev}: {gm(v):.3f} (n={len(v)})" for (c, prev), v in sorted(groups.items()) if c == cell]
            print(f"    {cell}: " + "; ".join(row))
        print()


if __name__ == "__main__":
    main()
