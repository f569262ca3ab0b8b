#!/usr/bin/env python3
"""Pools what is already measured (issue 26), from the committed records only.

  python3 docs/results/design/pooled/pooled.py > docs/results/design/pooled/tables.md

Design: the trials of docs/results/design/{paired-main2,lowat,lowatrtt}/runs/*/trials.jsonl
(the same points of seed 1's 200-point design, 3 rounds per run). Per point, run and round:
ratio = procedure / TCP on the point's best path in the SAME round of the SAME run (best path =
the single path with the higher mean over every pooled round of that measure). Static pooled over
the three runs (<= 9 rounds), the fixed limit (mptcp-static+lowat) over lowat + lowatrtt (<= 6).
Point estimate = geometric mean of the per-round ratios (gm; beside it am = their arithmetic
mean and rm = per run the ratio of the means, averaged over runs by rounds); 95 % interval =
bootstrap percentile interval resampling rounds within each run (2000 resamples, seeded from the
point); harmed = interval wholly below 0.95; near = estimate >= 0.95. Ben = Ben of the
per-round-normalised means (best path 1, the other path its ratio to the best, same estimator). Limit / static: geometric mean of the
per-round ratios (same round and run), the same stratified interval; chance per point = share of
the 2^k sign flips of its log ratios whose interval lies wholly below 1 (each way). Over points:
geometric mean with a Student t interval of the per-point log ratios (as the design's reports).
paired-main2 has no equal window (recorded from the lowat run on), so the equal window pools
lowat + lowatrtt only. mptcp-1sf ran in paired-main2 and lowat only.

candidates: docs/results/current-build/candidates-lowat (main, diag/, run3/) and
candidates-lowatrtt trials.jsonl; per round ratios within a run, geometric mean with a Student t
interval over rounds; candidates-lowat/run3/pooled.py (the three lowat runs) is called as it is.
"""
import glob, json, math, os, random, re, subprocess, sys
import statistics as st
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
DES = os.path.dirname(HERE)
CUR = os.path.join(os.path.dirname(DES), "current-build")
RUNS = ["paired-main2", "lowat", "lowatrtt"]
STATIC, LOWAT, ONE = "mptcp-static", "mptcp-static+lowat", "mptcp-1sf"
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]
B = 2000


def tq(df):  # the design's tQuantile975 (table to 30, Cornish-Fisher above)
    if df <= 30:
        return T975[df - 1]
    z, n = 1.959964, float(df)
    return z + (z ** 3 + z) / (4 * n) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * n * n)


def quantile(s, p):  # the design's quantile (linear, sorted input)
    h = p * (len(s) - 1)
    i = int(h)
    return s[-1] if i + 1 >= len(s) else s[i] + (h - i) * (s[i + 1] - s[i])


def gm_t(v):
    """Geometric mean of v with the 95 % Student t interval of the mean log."""
    l = [math.log(x) for x in v]
    m = st.mean(l)
    if len(l) < 2:
        return math.exp(m), float("nan"), float("nan")
    h = tq(len(l) - 1) * st.stdev(l) / math.sqrt(len(l))
    return math.exp(m), math.exp(m - h), math.exp(m + h)


def ben(g, caps):  # stats.Benefit
    s, c = sum(caps), max(caps)
    if c <= 0:
        return float("nan")
    if g >= c:
        return (g - c) / (s - c) if s - c > 0 else float("nan")
    return (g - c) / c


def seed(point, tag):
    h = 0xcbf29ce484222325
    for ch in (point + "/" + tag).encode():
        h = ((h ^ ch) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def boot(groups, stat, rng, b=B):
    """Percentile 95 % interval of stat over resamples of each group (run) within itself."""
    vs = []
    for _ in range(b):
        pick = [[g[rng.randrange(len(g))] for _ in g] for g in groups]
        vs.append(stat([x for g in pick for x in g]))
    vs.sort()
    return quantile(vs, 0.025), quantile(vs, 0.975)


def f2(x, p=2):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{p}f}"


def ci(e, lo, hi, p=2):
    return f"{f2(e, p)} [{f2(lo, p)}, {f2(hi, p)}]"


# ---------------------------------------------------------------- records
def load(run):
    """{point: {cell: {trial: record}}} of the run's ok trials, and the builds."""
    out, builds = defaultdict(lambda: defaultdict(dict)), defaultdict(int)
    for f in sorted(glob.glob(os.path.join(DES, run, "runs", "*", "trials.jsonl"))):
        for line in open(f):
            r = json.loads(line)
            if r.get("status") != "ok":
                continue
            out[r["configuration"]][r["cell"]][r["trial"]] = r
            builds[r["versions"]["mpdetour"].split()[0]] += 1
    return out, dict(builds)


DATA, BUILDS = {}, {}
for run in RUNS:
    DATA[run], BUILDS[run] = load(run)
POINTS = open(os.path.join(DES, "paired-main2", "only.txt")).read().strip().split(",")
BDP = {r["point"]: r["bdp"] for r in json.load(open(os.path.join(DES, "paired-main2", "results.json")))}


def one_path(run):  # the path mptcp-1sf ran over, from the run's report
    out = {}
    for line in open(os.path.join(DES, run, "report.md")):
        m = re.match(r"\| (p\d+) \|.*\((path (\d))\)", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = int(m.group(3))
    return out


ONEPATH = one_path("paired-main2")
assert all(ONEPATH[p] == k for p, k in one_path("lowat").items() if p in ONEPATH)

MEASURES = {"last": "goodput_mbps", "equal": "equal_goodput_mbps"}


def g(rec, measure):
    return rec.get(MEASURES[measure]) if rec else None


def rounds(run, point, cells, measure):
    """Trials of run at point in which every cell has an ok goodput of measure."""
    d = DATA[run].get(point, {})
    ts = set.intersection(*[set(d.get(c, {})) for c in cells]) if all(c in d for c in cells) else set()
    return [t for t in sorted(ts) if all(g(d[c][t], measure) for c in cells)]


def best_path(point, measure, runs):
    s = {1: [], 2: []}
    for run in runs:
        for t in rounds(run, point, ["tcp-path1", "tcp-path2"], measure):
            for k in (1, 2):
                s[k].append(g(DATA[run][point][f"tcp-path{k}"][t], measure))
    if not s[1]:
        return None
    return 1 if st.mean(s[1]) >= st.mean(s[2]) else 2


def run_best(run, point, measure):
    return best_path(point, measure, [run])


def per_round(point, proc, measure, runs, best, den=None):
    """{run: [(x, o, a, b)]} per round: x = proc / den (default TCP on the best path), o = other
    path / best path, a and b = proc's and den's goodputs."""
    out = {}
    den = den or f"tcp-path{best}"
    oth = f"tcp-path{3 - best}"
    for run in runs:
        d = DATA[run].get(point, {})
        ts = rounds(run, point, [proc, "tcp-path1", "tcp-path2", den], measure)
        if ts:
            out[run] = [(g(d[proc][t], measure) / g(d[den][t], measure),
                         g(d[oth][t], measure) / g(d[f"tcp-path{best}"][t], measure),
                         g(d[proc][t], measure), g(d[den][t], measure)) for t in ts]
    return out


# Estimators of a point's pooled ratio from its groups (one list of rounds per run):
# gm = geometric mean of the per-round ratios (primary), am = their arithmetic mean,
# rm = per run the ratio of the means (the reports' estimator), averaged over runs weighted by rounds.
EST = {
    "gm": lambda gr: math.exp(st.mean(math.log(r[0]) for x in gr for r in x)),
    "am": lambda gr: st.mean(r[0] for x in gr for r in x),
    "rm": lambda gr: sum(len(x) * st.mean(r[2] for r in x) / st.mean(r[3] for r in x) for x in gr) / sum(len(x) for x in gr),
}
OEST = {  # the other path / best path, the same way (for Ben)
    "gm": lambda gr: math.exp(st.mean(math.log(r[1]) for x in gr for r in x)),
    "am": lambda gr: st.mean(r[1] for x in gr for r in x),
    "rm": lambda gr: sum(len(x) * st.mean(r[1] * r[3] for r in x) / st.mean(r[3] for r in x) for x in gr) / sum(len(x) for x in gr),
}


def gboot(groups, stat, rng, b=B):
    """boot with stat over the list of resampled groups."""
    vs = []
    for _ in range(b):
        vs.append(stat([[gr[rng.randrange(len(gr))] for _ in gr] for gr in groups]))
    vs.sort()
    return quantile(vs, 0.025), quantile(vs, 0.975)


def point_stat(point, proc, measure, runs, best, est="gm", den=None):
    pr = per_round(point, proc, measure, runs, best, den) if best else None
    if not pr:
        return None
    groups = [pr[r] for r in runs if r in pr]
    e = EST[est](groups)
    lo, hi = gboot(groups, EST[est], random.Random(seed(point, proc + measure + "".join(runs) + est)))
    bn = ben(e, [1.0, OEST[est](groups)])
    return dict(est=e, lo=lo, hi=hi, harmed=hi < 0.95, near=e >= 0.95, ben=bn, n=sum(len(x) for x in groups),
                runs={r: len(pr[r]) for r in pr})


def summary(stats, label):
    s = [v for v in stats.values() if v]
    harmed = sorted(p for p, v in stats.items() if v and v["harmed"])
    near = sum(v["near"] for v in s)
    low = sorted(v["ben"] for p, v in stats.items() if v and BDP[p] == "low" and not math.isnan(v["ben"]))
    allb = sorted(v["ben"] for v in s if not math.isnan(v["ben"]))
    gmr = math.exp(st.mean(math.log(v["est"]) for v in s))
    n = len(s)
    return (f"| {label} | {n} | {len(harmed)} ({100 * len(harmed) / n:.0f} %) | {near} ({100 * near / n:.0f} %) | "
            f"{gmr:.3f} | {f2(quantile(allb, .5))} | {f2(quantile(low, .5))} ({len(low)}) |", harmed)


def ratio_stat(point, measure, runs):
    """Limit / static per round (same round and run), geometric mean, stratified interval,
    chance of below / above from all sign flips of the log ratios."""
    groups = []
    for run in runs:
        d = DATA[run].get(point, {})
        ts = rounds(run, point, [STATIC, LOWAT], measure)
        if ts:
            groups.append([math.log(g(d[LOWAT][t], measure) / g(d[STATIC][t], measure)) for t in ts])
    if not groups:
        return None
    rng = random.Random(seed(point, "vs" + measure + "".join(runs)))
    lo, hi = boot(groups, st.mean, rng)
    flat = [x for gr in groups for x in gr]
    # chance: every sign flip of the observed log ratios (exchangeable within a round under no difference)
    k = len(flat)
    below = above = 0
    frng = random.Random(seed(point, "flip" + measure))
    for mask in range(2 ** k):
        fl = [(-x if mask >> i & 1 else x) for i, x in enumerate(flat)]
        it = iter(fl)
        fg = [[next(it) for _ in gr] for gr in groups]
        a, b = boot(fg, st.mean, frng, 400)
        below += b < 0
        above += a > 0
    return dict(est=math.exp(st.mean(flat)), lo=math.exp(lo), hi=math.exp(hi), n=k,
                below=hi < 0, above=lo > 0, cb=below / 2 ** k, ca=above / 2 ** k)


# ---------------------------------------------------------------- output
P = print
P("# Pooled tables (generated by pooled.py from the committed records; do not edit)\n")
P("## Builds of the pooled design runs\n")
for run in RUNS:
    la = sorted(r["loadavg_1m"] for p in DATA[run].values() for c in p.values() for r in c.values())
    P(f"- {run}: " + ", ".join(f"{b} ({n} trials)" for b, n in sorted(BUILDS[run].items())) +
      f"; {len(DATA[run])} points; 1-min load at the trials' ends median {quantile(la, .5):.2f}, max {la[-1]:.2f}")
P()

res = {}
for measure in ("last", "equal"):
    srun = RUNS if measure == "last" else ["lowat", "lowatrtt"]
    lrun = ["lowat", "lowatrtt"]
    title = "to the last byte" if measure == "last" else "over the equal window (1-10 s; lowat + lowatrtt only)"
    P(f"## Static and the fixed limit pooled, {title}\n")
    best = {p: best_path(p, measure, srun) for p in POINTS}
    flips = [p for p in POINTS if any(run_best(r, p, measure) not in (None, best[p]) for r in srun)]
    P(f"Best path per point from the pooled TCP means; at {len(flips)} points a run's own best path differs "
      f"(there the per-round ratio uses the pooled best path in every run): {', '.join(flips) or 'none'}.\n")
    S = {p: point_stat(p, STATIC, measure, srun, best[p]) for p in POINTS}
    L = {p: point_stat(p, LOWAT, measure, lrun, best[p]) for p in POINTS}
    res[measure] = dict(best=best, S=S, L=L)
    P("Estimator (rows marked): gm = geometric mean of the per-round ratios (primary; the per-point table "
      "below uses it), am = their arithmetic mean, rm = per run the ratio of the means, averaged over the runs "
      "weighted by rounds (with one run and the run's own best path: the design report's estimator). Intervals: "
      "bootstrap over rounds within each run.\n")
    P("| procedure (runs) | estimator | points | harmed | mean >= 0.95 x best | MPTCP / best: geometric mean of the points' estimates | median Ben | median Ben, low BDP (n) |")
    P("|---|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    cfg = [(f"static pooled ({' + '.join(srun)})", STATIC, srun), ("fixed limit pooled (lowat + lowatrtt)", LOWAT, lrun)]
    cfg += [(f"static, {run} alone", STATIC, [run]) for run in srun]
    cfg += [(f"fixed limit, {run} alone", LOWAT, [run]) for run in lrun]
    if measure == "last":
        cfg.append(("static, lowat + lowatrtt only", STATIC, lrun))
    for label, proc, runs in cfg:
        for est in ("gm", "am", "rm"):
            stats = S if (proc, runs, est) == (STATIC, srun, "gm") else L if (proc, runs, est) == (LOWAT, lrun, "gm") else \
                {p: point_stat(p, proc, measure, runs, best[p], est) for p in POINTS}
            row, h = summary(stats, label + " | " + est)
            P(row)
            rows.append((f"{label}, {est}", h))
    # the reports' own figures: one run, its own best path, ratio of means
    for run in srun:
        stats = {p: point_stat(p, STATIC, measure, [run], run_best(run, p, measure), "rm") for p in POINTS}
        row, h = summary(stats, f"static, {run} alone, the run's own best path | rm")
        P(row)
        rows.append((f"static, {run} alone, own best path, rm", h))
    P()
    for label, h in rows:
        P(f"Harmed, {label}: {', '.join(h) or 'none'}.")
    P()
    R = {p: ratio_stat(p, measure, lrun) for p in POINTS}
    res[measure]["R"] = R
    rs = [v for v in R.values() if v]
    gmr, glo, ghi = gm_t([v["est"] for v in rs])
    bl = [p for p in POINTS if R[p] and R[p]["below"]]
    ab = [p for p in POINTS if R[p] and R[p]["above"]]
    P(f"**Fixed limit / static, paired per round (lowat + lowatrtt, <= 6 rounds per point), {len(rs)} points**: "
      f"geometric mean {ci(gmr, glo, ghi, 3)} (Student t over the points' log ratios); below static at {len(bl)} "
      f"({', '.join(bl) or 'none'}), above at {len(ab)} ({', '.join(ab) or 'none'}); expected by chance "
      f"{sum(v['cb'] for v in rs):.1f} below and {sum(v['ca'] for v in rs):.1f} above (sum over the points of the "
      f"share of sign flips of the point's log ratios whose interval excludes 1 that way).\n")
    hdr = "| point | BDP | best | rounds S/L | static / best | Ben static | limit / best | Ben limit | limit / static (rounds) |"
    P(hdr)
    P("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for p in POINTS:
        s, l, r = S[p], L[p], R[p]
        if not s:
            continue
        sc = ci(s["est"], s["lo"], s["hi"]) + (" **H**" if s["harmed"] else "")
        lc = (ci(l["est"], l["lo"], l["hi"]) + (" **H**" if l["harmed"] else "")) if l else "-"
        rc = (ci(r["est"], r["lo"], r["hi"]) + (" **below**" if r["below"] else " **above**" if r["above"] else "") + f" ({r['n']})") if r else "-"
        P(f"| {p} | {BDP[p]} | {best[p]} | {s['n']}/{l['n'] if l else 0} | {sc} | {f2(s['ben'])} | {lc} | {f2(l['ben']) if l else '-'} | {rc} |")
    P()

# ---------------------------------------------------------------- why static misses 0.95 x best
P("## Why static misses 0.95 x best (pooled estimate < 0.95)\n")
P("mptcp-1sf = MPTCP over the modelled best path alone (no agent), measured in paired-main2 and lowat only. "
  "1sf / TCP = per-round mptcp-1sf / TCP on the path it ran over; 1sf / best and static / 1sf per round on the "
  "same rounds (paired-main2 + lowat; equal window: lowat only). Class **kernel** = 1sf / TCP < 0.95 (MPTCP "
  "over the path alone already loses more than 5 %); **pm** = 1sf / TCP >= 0.95 and static below 0.95 x best "
  "(path management's cost).\n")
why = {}
for measure in ("last", "equal"):
    onr = ["paired-main2", "lowat"] if measure == "last" else ["lowat"]
    S, best = res[measure]["S"], res[measure]["best"]
    miss = [p for p in POINTS if S[p] and not S[p]["near"]]
    P(f"### {'to the last byte' if measure == 'last' else 'over the equal window'}: {len(miss)} of {sum(1 for p in POINTS if S[p])} points miss\n")
    P("| point | BDP | static / best (pooled) | 1sf path (best) | 1sf / TCP same path | 1sf / best | static / 1sf | class |")
    P("|---|---|---:|---|---:|---:|---:|---|")
    cls = defaultdict(list)
    for p in miss:
        k = ONEPATH[p]
        a = point_stat(p, ONE, measure, onr, k)                        # 1sf / TCP on its path
        bb = point_stat(p, ONE, measure, onr, best[p])                 # 1sf / TCP best
        c = point_stat(p, STATIC, measure, onr, best[p], den=ONE)      # static / 1sf
        if not a:
            P(f"| {p} | {BDP[p]} | {f2(S[p]['est'])} | {k} | - | - | - | no mptcp-1sf |")
            continue
        ea, eb, ec = [(v["est"], v["lo"], v["hi"]) for v in (a, bb, c)]
        kind = "kernel" if ea[0] < 0.95 else "pm"
        cls[kind].append(p)
        P(f"| {p} | {BDP[p]} | {ci(S[p]['est'], S[p]['lo'], S[p]['hi'])} | {k} ({best[p]}) | {ci(*ea)} | {ci(*eb)} | {ci(*ec)} | {kind} |")
    P()
    P(f"kernel ({len(cls['kernel'])}): {', '.join(cls['kernel']) or 'none'}; pm ({len(cls['pm'])}): {', '.join(cls['pm']) or 'none'}.\n")
    # ceiling: a path manager that at each point gets the better of static and MPTCP over the best path alone
    reach, onlyone = 0, []
    for p in POINTS:
        if not S[p]:
            continue
        if S[p]["near"]:
            reach += 1
            continue
        bb = point_stat(p, ONE, measure, onr, best[p])
        if bb and bb["est"] >= 0.95:
            reach += 1
            onlyone.append(p)
    n = sum(1 for p in POINTS if S[p])
    P(f"Better of static and mptcp-1sf (both pooled estimates, / best): >= 0.95 at {reach} of {n} points "
      f"({100 * reach / n:.0f} %); mptcp-1sf alone lifts {len(onlyone)}: {', '.join(onlyone) or 'none'}. "
      f"90 % of {n} points is {math.ceil(0.9 * n)}.\n")
    why[measure] = cls

# ---------------------------------------------------------------- candidates
P("## candidates: four runs\n")
CRUNS = [("main (candidates-lowat)", "candidates-lowat/trials.jsonl"),
         ("diag (candidates-lowat/diag)", "candidates-lowat/diag/trials.jsonl"),
         ("run3 (candidates-lowat/run3)", "candidates-lowat/run3/trials.jsonl"),
         ("rtt (candidates-lowatrtt)", "candidates-lowatrtt/trials.jsonl")]
ORC = "mptcp-nat-static@detour3+detour4+detour7"
ARMS = [("static", "mptcp-nat-static"), ("fixed limit", "mptcp-nat-static-lowat"),
        ("adaptive", "mptcp-nat-adaptive"), ("RTT-scaled limit", "mptcp-nat-static-lowatrtt")]
CD = {}
for name, f in CRUNS:
    by, bl = defaultdict(dict), set()
    for line in open(os.path.join(CUR, f)):
        r = json.loads(line)
        if r.get("status") == "ok":
            by[r["cell"]][r["trial"]] = r
            bl.add(r["versions"]["mpdetour"].split()[0])
    CD[name] = by
    la = sorted(r["loadavg_1m"] for c in by.values() for r in c.values())
    P(f"- {name}: build {', '.join(sorted(bl))}; rounds {len(by['mptcp-nat-static'])}; cells {', '.join(sorted(by))}; "
      f"1-min load at the trials' ends median {quantile(la, .5):.2f}, max {la[-1]:.2f}")
P()
W = [("goodput_mbps", "overall"), ("tail_mbps", "last third")]


def pair(by, a, b, fld, skip=()):
    return [by[a][t][fld] / by[b][t][fld] for t in sorted(by[a]) if t in by[b] and t not in skip]


P("### Fixed limit / static, paired per round (geometric mean, Student t over rounds)\n")
P("| run | rounds | overall | last third |\n|---|---:|---:|---:|")
pool = defaultdict(list)
pool_nl = defaultdict(list)
for name, _ in CRUNS:
    by = CD[name]
    cells = []
    for fld, w in W:
        r = pair(by, "mptcp-nat-static-lowat", "mptcp-nat-static", fld)
        pool[w] += r
        r2 = pair(by, "mptcp-nat-static-lowat", "mptcp-nat-static", fld, skip=range(16, 21) if name.startswith("rtt") else ())
        pool_nl[w] += r2
        cells.append(ci(*gm_t(r), 3) + f" (above 1 in {sum(x > 1 for x in r)})")
    P(f"| {name} | {len(r)} | {cells[0]} | {cells[1]} |")
P(f"| **pooled, four runs** | {len(pool['overall'])} | {ci(*gm_t(pool['overall']), 3)} (above 1 in {sum(x > 1 for x in pool['overall'])}) | {ci(*gm_t(pool['last third']), 3)} (above 1 in {sum(x > 1 for x in pool['last third'])}) |")
P(f"| pooled without candidates-lowatrtt's rounds 16-20 (CI load) | {len(pool_nl['overall'])} | {ci(*gm_t(pool_nl['overall']), 3)} | {ci(*gm_t(pool_nl['last third']), 3)} |")
runm = {w: [gm_t(pair(CD[name], "mptcp-nat-static-lowat", "mptcp-nat-static", fld))[0] for name, _ in CRUNS] for fld, w in W}
P(f"| over runs (each run's geometric mean one value, Student t over the {len(CRUNS)} runs) | {len(CRUNS)} runs | "
  f"{ci(*gm_t(runm['overall']), 3)} | {ci(*gm_t(runm['last third']), 3)} |")
P()
P("### Each arm's share of the oracle subset\n")
P("Per run: ratio of the arm's mean to the oracle's mean over the run's rounds (as the runs' READMEs) and the "
  "geometric mean of the per-round ratios with its Student t interval; pooled: every round of the runs that "
  "have the oracle (main, run3, rtt; diag ran no oracle).\n")
P("| arm | run | rounds | overall: ratio of means | overall: per round | last third: ratio of means | last third: per round |")
P("|---|---|---:|---:|---:|---:|---:|")
for arm, cell in ARMS:
    allr = defaultdict(list)
    for name, _ in CRUNS:
        by = CD[name]
        if cell not in by or ORC not in by:
            continue
        ts = [t for t in sorted(by[cell]) if t in by[ORC]]
        cells = []
        for fld, w in W:
            rm = st.mean(by[cell][t][fld] for t in ts) / st.mean(by[ORC][t][fld] for t in ts)
            r = pair(by, cell, ORC, fld)
            allr[w] += r
            cells += [f"{rm:.3f}", ci(*gm_t(r), 3)]
        P(f"| {arm} | {name} | {len(ts)} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    rr = [name for name, _ in CRUNS if cell in CD[name] and ORC in CD[name]]
    if len(rr) > 1:
        P(f"| **{arm}** | **pooled** | {len(allr['overall'])} | - | {ci(*gm_t(allr['overall']), 3)} | - | {ci(*gm_t(allr['last third']), 3)} |")
        ov = {w: [gm_t(pair(CD[name], cell, ORC, fld))[0] for name in rr] for fld, w in W}
        P(f"| {arm} | over runs (Student t over {len(rr)} runs' geometric means) | {len(rr)} runs | - | {ci(*gm_t(ov['overall']), 3)} | - | {ci(*gm_t(ov['last third']), 3)} |")
P()
P("### candidates-lowat/run3/pooled.py (the three lowat runs, called unchanged)\n")
P("```")
P(subprocess.run([sys.executable, os.path.join(CUR, "candidates-lowat", "run3", "pooled.py")],
                 capture_output=True, text=True, check=True).stdout.rstrip())
P("```")
